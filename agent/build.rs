//! Generates Parca's gRPC services (profile store, debuginfo, query) and
//! Pyroscope's push messages from `proto/` with protox (pure Rust) and
//! tonic, so the build needs no `protoc` on the machine. The pprof types
//! come from `agent-pprof`.

use std::path::PathBuf;

use anyhow::{Context, Result};

const PARCA: [&str; 3] = [
    "parca/profilestore/v1alpha1/profilestore.proto",
    "parca/debuginfo/v1alpha1/debuginfo.proto",
    "parca/query/v1alpha1/query.proto",
];

/// Sent over the Connect protocol with a plain HTTP client: messages only.
const PYROSCOPE: [&str; 1] = ["pyroscope/push/v1/push.proto"];

fn main() -> Result<()> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto");
    for file in PARCA.iter().chain(&PYROSCOPE) {
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
    let descriptors = protox::compile(PYROSCOPE, [&proto_root])
        .context("could not compile Pyroscope's .proto files")?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .bytes(".push.v1.RawSample.raw_profile")
        .compile_fds(descriptors)
        .context("could not generate the code from Pyroscope's .proto files")?;
    Ok(())
}
