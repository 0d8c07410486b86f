//! The programs the soak runs next to firn: the busy chain, exec churn, a
//! binary of more than 200 MB, and containers with hostile files.

use std::{
    fs::{self, File},
    io::{BufWriter, Write},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::fixtures::Guard;
use crate::util;

const CHURN_C: &str = include_str!("churn.c");
const JIT_C: &str = include_str!("jit.c");

/// Size of the big binary's ballast section: with the code, over 200 MB.
const BALLAST_BYTES: u64 = 224 << 20;

fn gcc(source: &Path, output: &Path, flags: &[&str]) -> Result<()> {
    util::run(
        Command::new("gcc")
            .args(flags)
            .arg("-o")
            .arg(output)
            .arg(source),
    )
}

/// The chain workload (`tests/workloads/chain.c`), frame pointers, DWARF.
pub fn chain(root: &Path, work: &Path) -> Result<PathBuf> {
    let binary = work.join("chain");
    gcc(
        &root.join("tests/workloads/chain.c"),
        &binary,
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    )?;
    Ok(binary)
}

/// Spins the chain on one CPU.
pub fn busy(binary: &Path) -> Result<Guard> {
    Guard::spawn(
        Command::new(binary)
            .arg("100000")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

pub fn churn(work: &Path) -> Result<PathBuf> {
    let source = work.join("churn.c");
    fs::write(&source, CHURN_C)?;
    let binary = work.join("churn");
    gcc(&source, &binary, &["-O2"])?;
    Ok(binary)
}

/// The chain with a 224 MiB incompressible section of its own: over 200 MB
/// on disk, what firn reads for symbols and uploads. Kept in `cache`.
pub fn big_binary(root: &Path, cache: &Path) -> Result<PathBuf> {
    let binary = cache.join("big-chain");
    if fs::metadata(&binary).is_ok_and(|meta| meta.len() > 200_000_000) {
        return Ok(binary);
    }
    fs::create_dir_all(cache)?;
    eprintln!(
        "soak: making a binary of over 200 MB at {}",
        binary.display()
    );
    let small = cache.join("big-chain.small");
    gcc(
        &root.join("tests/workloads/chain.c"),
        &small,
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    )?;
    let ballast = cache.join("ballast.bin");
    {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&ballast)?);
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..BALLAST_BYTES / 8 {
            // xorshift64*: fast, and gzip cannot shrink it.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            out.write_all(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes())?;
        }
        out.flush()?;
    }
    let partial = cache.join("big-chain.partial");
    util::run(
        Command::new("objcopy")
            .arg("--add-section")
            .arg(format!(".firn_ballast={}", ballast.display()))
            .args(["--set-section-flags", ".firn_ballast=readonly,data"])
            .arg(&small)
            .arg(&partial),
    )?;
    fs::rename(&partial, &binary)?;
    let _ = fs::remove_file(&ballast);
    let _ = fs::remove_file(&small);
    Ok(binary)
}

/// A process in a mount and pid namespace of its own, chrooted to `root`:
/// it is pid 1 there. Killed with the `unshare` that started it.
pub fn in_container(root: &Path, program: &str) -> Result<Guard> {
    Guard::spawn(
        Command::new("unshare")
            .args(["--mount", "--pid", "--fork", "--kill-child", "chroot"])
            .arg(root)
            .arg(program)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// A container root with two static workloads: `/app`, the chain without
/// DWARF (firn looks for its debug file by build id), and `/jit`, spinning
/// in anonymous executable memory (firn looks for `/tmp/perf-1.map`).
/// `hostile` is planted at both paths: a FIFO or a symlink.
pub struct Container {
    pub root: PathBuf,
    /// The host files the symlinks point at, when they are symlinks.
    pub host_targets: Vec<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    Fifo,
    Symlink,
}

pub fn container(root: &Path, work: &Path, plant: Plant, variant: u32) -> Result<Container> {
    let dir = work.join(match plant {
        Plant::Fifo => "fifo-root",
        Plant::Symlink => "symlink-root",
    });
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(dir.join("tmp"))?;
    // Different -D per container: different build ids.
    let with_debug = work.join(format!("app-{variant}.full"));
    gcc(
        &root.join("tests/workloads/chain.c"),
        &with_debug,
        &[
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-static",
            &format!("-DFIRN_SOAK_VARIANT={variant}"),
        ],
    )?;
    util::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&with_debug)
            .arg(dir.join("app")),
    )?;
    let jit_source = work.join("jit.c");
    fs::write(&jit_source, JIT_C)?;
    gcc(&jit_source, &dir.join("jit"), &["-O2", "-static"])?;

    let id = build_id(&dir.join("app"))?;
    let debug_dir = dir.join("usr/lib/debug/.build-id").join(&id[..2]);
    fs::create_dir_all(&debug_dir)?;
    let debug_path = debug_dir.join(format!("{}.debug", &id[2..]));
    let perf_map = dir.join("tmp/perf-1.map");
    let mut host_targets = Vec::new();
    match plant {
        Plant::Fifo => {
            for path in [&debug_path, &perf_map] {
                mkfifo(path)?;
            }
        }
        Plant::Symlink => {
            // Host files the container's absolute symlinks name: the real
            // debug file of /app, and a perf map. Followed from the host,
            // they leave the container.
            let host_debug = work.join("host-only-app.debug");
            util::run(
                Command::new("objcopy")
                    .arg("--only-keep-debug")
                    .arg(&with_debug)
                    .arg(&host_debug),
            )?;
            let host_map = work.join("host-only-perf.map");
            fs::write(&host_map, "0 1 host_secret_symbol\n")?;
            symlink(&host_debug, &debug_path)?;
            symlink(&host_map, &perf_map)?;
            host_targets = vec![host_debug, host_map];
        }
    }
    Ok(Container {
        root: dir,
        host_targets,
    })
}

fn mkfifo(path: &Path) -> Result<()> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mkfifo {}", path.display()));
    }
    Ok(())
}

/// The GNU build id of an ELF file, in hex, from `readelf -n`.
fn build_id(path: &Path) -> Result<String> {
    let output = Command::new("readelf").arg("-n").arg(path).output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let id = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: "))
        .map(str::to_owned)
        .with_context(|| format!("{} has no build id", path.display()))?;
    if id.len() < 4 {
        bail!("{} has a build id too short: {id}", path.display());
    }
    Ok(id)
}
