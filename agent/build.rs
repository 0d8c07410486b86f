//! Generates Parca's gRPC services (profile store, debuginfo, query) from
//! `proto/` with protox (pure Rust) and tonic, so the build needs no
//! `protoc` on the machine. The pprof types come from `agent-pprof`.

use std::path::PathBuf;

use anyhow::{Context, Result};

const PARCA: [&str; 3] = [
    "parca/profilestore/v1alpha1/profilestore.proto",
    "parca/debuginfo/v1alpha1/debuginfo.proto",
    "parca/query/v1alpha1/query.proto",
];

fn main() -> Result<()> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto");
    for file in PARCA {
        println!("cargo:rerun-if-changed={}", proto_root.join(file).display());
    }
    let descriptors =
        protox::compile(PARCA, [&proto_root]).context("could not compile Parca's .proto files")?;
    tonic_prost_build::configure()
        // Profiles are cloned for every retry; shared bytes make that free.
        .bytes(".parca.profilestore.v1alpha1.RawSample.raw_profile")
        .bytes(".parca.debuginfo.v1alpha1.UploadRequest.chunk_data")
        .compile_fds(descriptors)
        .context("could not generate the gRPC code from Parca's .proto files")?;
    Ok(())
}
