//! The OpenTelemetry Collector the OTLP tests export to: `xtask/otelcol/`
//! (a `main.go` with the OTLP receiver, the file exporter and the bearer
//! token extension, and the `go.mod`/`go.sum` that pin them) built with Go
//! from the module proxy, once per version, into
//! `~/.cache/firn/otelcol-VERSION/`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::util::run;

/// The Collector release: the newest whose contrib file exporter the
/// module proxy serves whole. Its profiles messages are
/// opentelemetry-proto v1.10's.
pub const OTELCOL_VERSION: &str = "v0.161.0";

/// Where the Collector binary is kept between runs; the tests look there
/// too (or at `FIRN_OTELCOL_BIN`).
pub fn otelcol_path() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(format!(".cache/firn/otelcol-{OTELCOL_VERSION}/bin/otelcol"))
}

/// Builds the Collector unless the one there reports this version (about
/// 3 minutes on two cores the first time, modules from the Go proxy).
pub fn otelcol(root: &Path) -> Result<()> {
    let binary = otelcol_path();
    if otelcol_works(&binary) {
        return Ok(());
    }
    let go = super::go_command()?;
    let build_dir = binary
        .parent()
        .and_then(|bin| bin.parent())
        .context("the Collector path has no parent")?
        .join("src");
    if build_dir.exists() {
        fs::remove_dir_all(&build_dir)
            .with_context(|| format!("could not clear {}", build_dir.display()))?;
    }
    fs::create_dir_all(&build_dir)
        .with_context(|| format!("could not create {}", build_dir.display()))?;
    for file in ["main.go", "go.mod", "go.sum"] {
        let source = root.join("xtask/otelcol").join(file);
        fs::copy(&source, build_dir.join(file))
            .with_context(|| format!("could not copy {}", source.display()))?;
    }
    eprintln!(
        "xtask: building the OpenTelemetry Collector {OTELCOL_VERSION} with Go (a few minutes the first time)"
    );
    run(Command::new(&go)
        .current_dir(&build_dir)
        .env("GOWORK", "off")
        .env("GOFLAGS", "-mod=readonly")
        .args(["build", "-buildvcs=false", "-trimpath", "-o"])
        .arg(&binary)
        .arg("."))?;
    if !otelcol_works(&binary) {
        bail!(
            "the Collector was built at {} but `otelcol --version` does not report {OTELCOL_VERSION}",
            binary.display()
        );
    }
    Ok(())
}

fn otelcol_works(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .is_ok_and(|output| {
            output.status.success()
                && String::from_utf8_lossy(&output.stdout).contains(OTELCOL_VERSION)
        })
}
