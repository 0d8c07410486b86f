//! `cargo xtask fuzz --seconds N [--target NAME]`: builds the fuzz targets
//! in `fuzz/` once (cargo-fuzz, libFuzzer, AddressSanitizer, the pinned
//! nightly) and runs each for N seconds from its committed seed corpus.
//! Allocations are capped, so a header claiming gigabytes is a finding,
//! not a slow run. A crash, leak, timeout or allocation bomb is copied into
//! `fuzz/regressions/<target>/`, where the unit tests of the library crate
//! the target calls replay it (`agent_fixtures::fuzz::replay`), and the
//! task fails naming it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{
    setup::{self, pinned_nightly},
    util::{describe, run, status},
};

/// What one input may take before it counts as a finding.
const RSS_LIMIT_MB: u32 = 2048;
/// A single allocation above this is an allocation bomb: nothing firn
/// parses legitimately needs a gigabyte at once.
const MALLOC_LIMIT_MB: u32 = 1024;
/// Seconds one input may run; real inputs take milliseconds.
const INPUT_TIMEOUT_SECONDS: u32 = 10;

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Only these targets (repeatable); all by default.
    #[arg(long = "target")]
    targets: Vec<String>,
}

pub fn run_targets(root: &Path, args: &FuzzArgs) -> Result<()> {
    let nightly = pinned_nightly()?;
    setup::fuzz_toolchain(&nightly)?;
    let fuzz_dir = root.join("fuzz");
    let all = target_names(&fuzz_dir)?;
    let targets: Vec<String> = if args.targets.is_empty() {
        all
    } else {
        for wanted in &args.targets {
            if !all.contains(wanted) {
                bail!(
                    "no fuzz target {wanted}; the targets are {}",
                    all.join(", ")
                );
            }
        }
        args.targets.clone()
    };

    let started = Instant::now();
    eprintln!("xtask: building {} fuzz targets", targets.len());
    run(cargo_fuzz(root, &nightly).arg("build").args(BUILD_FLAGS))?;
    eprintln!("xtask: fuzz targets built in {:.0?}", started.elapsed());

    let mut findings = Vec::new();
    for target in &targets {
        if let Some(finding) = run_target(root, &nightly, target, args.seconds)? {
            findings.push(finding);
        }
    }
    eprintln!("xtask: fuzzing took {:.0?} in all", started.elapsed());
    if !findings.is_empty() {
        bail!(
            "fuzzing found {} failing input(s); each is now a regression fixture the unit \
             tests replay (fix the parser, then commit the fixture):\n{}",
            findings.len(),
            findings.join("\n")
        );
    }
    Ok(())
}

/// Release code (what ships) with its arithmetic checked: an overflow the
/// daemon would wrap silently is a finding too.
const BUILD_FLAGS: &[&str] = &["--release", "--debug-assertions"];

/// The targets are the files in `fuzz/fuzz_targets/`.
fn target_names(fuzz_dir: &Path) -> Result<Vec<String>> {
    let dir = fuzz_dir.join("fuzz_targets");
    let mut names: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("could not list {}", dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.strip_suffix(".rs").map(str::to_owned))
        .collect();
    names.sort();
    Ok(names)
}

/// `cargo fuzz` on the pinned nightly, free of what the outer stable cargo
/// set for itself.
fn cargo_fuzz(root: &Path, nightly: &str) -> Command {
    let mut command = Command::new("rustup");
    command
        .args(["run", nightly, "cargo", "fuzz"])
        .current_dir(root)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    command
}

/// Runs one target; returns a description of what it found, if anything.
fn run_target(root: &Path, nightly: &str, target: &str, seconds: u64) -> Result<Option<String>> {
    let seeds = root.join("fuzz/corpus").join(target);
    // New inputs go to a scratch corpus (kept between local runs), so the
    // committed seeds stay the small set of real files they are.
    let scratch = root.join("target/fuzz/corpus").join(target);
    let artifacts = root.join("target/fuzz/artifacts").join(target);
    if artifacts.exists() {
        fs::remove_dir_all(&artifacts)
            .with_context(|| format!("could not clear {}", artifacts.display()))?;
    }
    for dir in [&scratch, &artifacts] {
        fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    }
    let mut command = cargo_fuzz(root, nightly);
    command
        .args(["run", target])
        .args(BUILD_FLAGS)
        .arg(&scratch)
        .arg(&seeds);
    // Inputs that once failed run first thing, every time.
    let regressions = root.join("fuzz/regressions").join(target);
    if regressions.is_dir() {
        command.arg(&regressions);
    }
    command
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-malloc_limit_mb={MALLOC_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECONDS}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1");
    eprintln!("xtask: fuzzing {target} for {seconds} s");
    let outcome = status(&mut command)?;
    let found = fs::read_dir(&artifacts)
        .with_context(|| format!("could not list {}", artifacts.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file())
        .collect::<Vec<_>>();
    if outcome.success() && found.is_empty() {
        return Ok(None);
    }
    if found.is_empty() {
        bail!(
            "{} failed ({outcome}) without leaving a failing input",
            describe(&command)
        );
    }
    fs::create_dir_all(&regressions)
        .with_context(|| format!("could not create {}", regressions.display()))?;
    let mut kept = Vec::new();
    for artifact in found {
        let stored: PathBuf = regressions.join(artifact.file_name().context("artifact name")?);
        fs::copy(&artifact, &stored)
            .with_context(|| format!("could not copy {}", artifact.display()))?;
        kept.push(format!("  {target}: {}", stored.display()));
    }
    Ok(Some(kept.join("\n")))
}
