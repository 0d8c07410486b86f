//! Generates the pprof types from `proto/google/pprof/profile.proto` with
//! protox (pure Rust), so the build needs no `protoc` on the machine.

use std::path::PathBuf;

use anyhow::{Context, Result};

const PPROF: &str = "google/pprof/profile.proto";

fn main() -> Result<()> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto");
    println!(
        "cargo:rerun-if-changed={}",
        proto_root.join(PPROF).display()
    );
    let descriptors =
        protox::compile([PPROF], [&proto_root]).context("could not compile profile.proto")?;
    prost_build::Config::new()
        .compile_fds(descriptors)
        .context("could not generate Rust code from profile.proto")?;
    Ok(())
}
