//! Generates Parca's gRPC services (profile store, debuginfo, query),
//! Pyroscope's push messages and OpenTelemetry's profiles service (at two
//! releases of its messages) from `proto/` with protox (pure Rust) and
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

/// OTLP profiles as opentelemetry-proto v1.10.0 defines them (the
/// OpenTelemetry Collector's), under `proto/opentelemetry/`.
const OTLP: [&str; 1] =
    ["opentelemetry/proto/collector/profiles/v1development/profiles_service.proto"];
const OTLP_FILES: [&str; 4] = [
    "opentelemetry/proto/common/v1/common.proto",
    "opentelemetry/proto/resource/v1/resource.proto",
    "opentelemetry/proto/profiles/v1development/profiles.proto",
    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
];
/// Where v1.9.0 differs (the order of `Sample`'s fields), under
/// `proto/opentelemetry-v1.9/`: only the messages that hold a `Sample`
/// are generated again, the others are those of v1.10.0.
const OTLP_V1_9_FILES: [&str; 2] = [
    "opentelemetry/proto/profiles/v1development/profiles.proto",
    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
];
const OTLP_V1_10_MODULE: &str = "crate::output::otlp::proto::v1_10::opentelemetry::proto";
const OTLP_SHARED: [&str; 10] = [
    "profiles.v1development.ProfilesDictionary",
    "profiles.v1development.Mapping",
    "profiles.v1development.Location",
    "profiles.v1development.Line",
    "profiles.v1development.Function",
    "profiles.v1development.Link",
    "profiles.v1development.ValueType",
    "profiles.v1development.KeyValueAndUnit",
    "profiles.v1development.Stack",
    "collector.profiles.v1development.ExportProfilesServiceResponse",
];

fn main() -> Result<()> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let otlp_root = proto_root.join("opentelemetry");
    let otlp_v1_9_root = proto_root.join("opentelemetry-v1.9");
    for file in PARCA.iter().chain(&PYROSCOPE) {
        println!("cargo:rerun-if-changed={}", proto_root.join(file).display());
    }
    for file in OTLP_FILES {
        println!("cargo:rerun-if-changed={}", otlp_root.join(file).display());
    }
    for file in OTLP_V1_9_FILES {
        println!(
            "cargo:rerun-if-changed={}",
            otlp_v1_9_root.join(file).display()
        );
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
    otlp(&otlp_root, &otlp_v1_9_root)
}

fn otlp(root: &std::path::Path, v1_9_root: &std::path::Path) -> Result<()> {
    let out = PathBuf::from(std::env::var("OUT_DIR").context("OUT_DIR is not set")?);
    let descriptors =
        protox::compile(OTLP, [root]).context("could not compile OpenTelemetry's .proto files")?;
    let v1_10 = out.join("otlp-v1.10");
    std::fs::create_dir_all(&v1_10).context("could not create the OTLP output directory")?;
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir(&v1_10)
        .compile_fds(descriptors)
        .context("could not generate the gRPC code from OpenTelemetry's .proto files")?;
    // v1.9's files first, so they win over v1.10's of the same name; the
    // common and resource messages did not change.
    let descriptors = protox::compile(OTLP, [v1_9_root, root])
        .context("could not compile OpenTelemetry's v1.9 .proto files")?;
    let v1_9 = out.join("otlp-v1.9");
    std::fs::create_dir_all(&v1_9).context("could not create the OTLP output directory")?;
    let mut config = tonic_prost_build::configure()
        .build_server(false)
        .out_dir(&v1_9)
        .extern_path(
            ".opentelemetry.proto.common",
            format!("{OTLP_V1_10_MODULE}::common"),
        )
        .extern_path(
            ".opentelemetry.proto.resource",
            format!("{OTLP_V1_10_MODULE}::resource"),
        );
    for message in OTLP_SHARED {
        let rust = message.replace('.', "::");
        config = config.extern_path(
            format!(".opentelemetry.proto.{message}"),
            format!("{OTLP_V1_10_MODULE}::{rust}"),
        );
    }
    config
        .compile_fds(descriptors)
        .context("could not generate the gRPC code from OpenTelemetry's v1.9 .proto files")?;
    Ok(())
}
