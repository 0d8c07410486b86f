//! `cargo xtask build-ebpf [--check]`.
//!
//! The compiled object is committed at `agent/bpf/firn.bpf.o` and embedded in
//! the daemon, so `firn` builds on stable Rust alone. `--check` rebuilds it
//! from source and fails when the committed object is stale.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::{
    setup::{bpf_linker_path, cargo_home, pinned_nightly},
    util::run,
};

pub const OBJECT_PATH: &str = "agent/bpf/firn.bpf.o";

pub fn build(root: &Path, check: bool) -> Result<()> {
    let nightly = pinned_nightly()?;
    if !bpf_linker_path().exists() {
        bail!("bpf-linker is missing: run `cargo xtask setup` first");
    }
    let crate_dir = root.join("agent-ebpf");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![cargo_home().join("bin")];
    paths.extend(std::env::split_paths(&path));
    run(Command::new("rustup")
        .args(["run", &nightly, "cargo", "build", "--release", "--locked"])
        .current_dir(&crate_dir)
        // Variables the outer stable cargo set must not leak into the
        // nightly build.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("PATH", std::env::join_paths(paths)?))?;
    let built = crate_dir.join("target/bpfel-unknown-none/release/firn");
    let fresh = fs::read(&built).with_context(|| format!("could not read {}", built.display()))?;
    let committed_path = root.join(OBJECT_PATH);
    if check {
        let committed = fs::read(&committed_path)
            .with_context(|| format!("could not read {}", committed_path.display()))?;
        if committed != fresh {
            bail!(
                "{OBJECT_PATH} is stale: it differs from a fresh build of agent-ebpf/ \
                 ({} bytes committed, {} bytes built). Run `cargo xtask build-ebpf` and commit it.",
                committed.len(),
                fresh.len()
            );
        }
        eprintln!(
            "xtask: {OBJECT_PATH} matches a fresh build ({} bytes)",
            fresh.len()
        );
        return Ok(());
    }
    if let Some(parent) = committed_path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(&committed_path, &fresh)
        .with_context(|| format!("could not write {}", committed_path.display()))?;
    eprintln!("xtask: wrote {OBJECT_PATH} ({} bytes)", fresh.len());
    Ok(())
}
