//! Generates the protobuf types from `proto/` with protox (pure Rust), so the
//! build needs no `protoc` on the machine.

use std::path::PathBuf;

use anyhow::{Context, Result};

fn main() -> Result<()> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = ["google/pprof/profile.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={}", proto_root.join(file).display());
    }
    let descriptors =
        protox::compile(files, [&proto_root]).context("could not compile the .proto files")?;
    prost_build::Config::new()
        .compile_fds(descriptors)
        .context("could not generate Rust code from the .proto files")?;
    Ok(())
}
