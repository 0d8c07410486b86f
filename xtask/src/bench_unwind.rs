//! The parts of `cargo xtask bench --unwind dwarf` that differ from the
//! frame-pointer bench: the workload built without frame pointers, the
//! share of complete stacks in each profiler's output, and firn's unwinding
//! rate on captured samples (`agent/examples/unwind_bench.rs`).

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    bench::Workload,
    util::{self, cargo},
};

/// Frames a complete stack of the workload's threads holds, leaf first.
const CHAIN: [&str; 5] = [
    "burn_leaf",
    "level_three",
    "level_two",
    "level_one",
    "worker",
];
const COMM: &str = "chain_inline";
/// Iterations of burn_leaf per call of the chain.
const ROUNDS: &str = "100000";

/// Builds the workload (and the measuring example) for the DWARF bench.
pub fn prepare(root: &Path, work: &Path) -> Result<Workload> {
    util::run(cargo(root).args([
        "build",
        "--release",
        "--package",
        "firn",
        "--example",
        "unwind_bench",
    ]))?;
    workload(root, work)
}

/// Builds the workload alone: the chain without frame pointers.
pub fn workload(root: &Path, work: &Path) -> Result<Workload> {
    let binary = work.join(COMM);
    util::run(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-g", "-pthread", "-o"])
            .arg(&binary)
            .arg(root.join("tests/workloads/chain_inline.c")),
    )?;
    Ok(Workload {
        binary,
        before_seconds: vec![ROUNDS.into()],
    })
}

fn example(root: &Path) -> PathBuf {
    root.join("target/release/examples/unwind_bench")
}

/// (complete, total) samples of the workload's chain in firn's profile.
pub fn firn_complete_share(root: &Path, profile: &Path) -> Result<(u64, u64)> {
    let chain = CHAIN.join(",");
    firn_share(
        root,
        profile,
        &["--comm", COMM, "--within", CHAIN[0], "--chain", &chain],
    )
}

/// (complete, total) samples of a firn profile, as the unwind_bench
/// example's `share ARGS` counts them.
pub fn firn_share(root: &Path, profile: &Path, args: &[&str]) -> Result<(u64, u64)> {
    let output = Command::new(example(root))
        .arg("share")
        .args(args)
        .arg("--profile")
        .arg(profile)
        .output()
        .context("could not run the unwind_bench example")?;
    if !output.status.success() {
        bail!(
            "unwind_bench share failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.parse::<u64>().ok())
            .with_context(|| format!("no {name} in `{text}`"))
    };
    Ok((field("complete=")?, field("total=")?))
}

/// What `perf script` made of perf's recording: (complete, total) samples
/// of the workload's chain, and the CPU seconds it took. Unwinding and
/// symbolizing happen there, not in `perf record`, so this is the part of
/// perf that does what firn does while recording.
pub fn perf_script(data: &Path) -> Result<((u64, u64), f64)> {
    let mut child = Command::new("perf")
        // Without inline frames (perf would run addr2line on every object),
        // as firn's profile here has none either.
        .args(["script", "--no-inline", "-F", "comm,tid,ip,sym", "-i"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("could not run perf script")?;
    let mut text = String::new();
    child
        .stdout
        .take()
        .context("perf script's output")?
        .read_to_string(&mut text)?;
    let (status, (cpu_seconds, _)) = crate::bench::wait_with_usage(&mut child)?;
    if !status.success() {
        bail!("perf script failed: {status}");
    }
    Ok((count_complete(&text), cpu_seconds))
}

fn count_complete(script: &str) -> (u64, u64) {
    let (mut complete, mut total) = (0, 0);
    for block in script.split("\n\n") {
        let mut lines = block.lines().skip_while(|line| line.is_empty());
        // `comm tid`; a comm may hold spaces.
        let comm = lines
            .next()
            .and_then(|header| header.trim().rsplit_once(' '))
            .map(|(comm, _)| comm.trim());
        if comm != Some(COMM) {
            continue;
        }
        let frames: Vec<&str> = lines
            .filter_map(|line| line.split_whitespace().nth(1))
            .collect();
        if !frames.contains(&CHAIN[0]) {
            continue;
        }
        total += 1;
        if frames.windows(CHAIN.len()).any(|window| window == CHAIN) {
            complete += 1;
        }
    }
    (complete, total)
}

/// Captures samples of a running workload and replays them through
/// firn's pipeline; prints samples per second on one core.
pub fn unwinding_rate(root: &Path, workload: &Workload) -> Result<()> {
    // One thread spinning in the chain until killed.
    let mut spinner = Command::new(&workload.binary)
        .args(&workload.before_seconds)
        .stdout(Stdio::null())
        .spawn()
        .context("could not start the workload")?;
    thread::sleep(Duration::from_millis(300));
    let output = Command::new(example(root))
        .args(["replay", "--seconds", "5", "--passes", "20", "--pid"])
        .arg(spinner.id().to_string())
        .output();
    let _ = spinner.kill();
    let _ = spinner.wait();
    let output = output.context("could not run the unwind_bench example")?;
    if !output.status.success() {
        bail!(
            "unwind_bench replay failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or("?")
            .to_owned()
    };
    println!(
        "\nunwinding rate, one core, {} captured DWARF samples replayed through decode,\n\
         process table, unwinding and aggregation (no symbolization):\n\
         {:<36}{:>12} samples/s\n{:<36}{:>12} samples/s\n{:<36}{:>12}",
        field("samples="),
        "  first pass (cold caches)",
        field("first_pass_samples_per_second="),
        "  later passes (median)",
        field("warm_samples_per_second="),
        "  unwound to the outermost frame",
        field("dwarf_complete_share="),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_script_stacks_are_counted() {
        let script = "\
chain_inline 1
\t 134b burn_leaf
\t 1364 level_three
\t 13b0 level_two
\t 13f8 level_one
\t 1433 worker
\t 891f4 start_thread

chain_inline 1
\t 134b burn_leaf
\t 1364 level_three
\t 0 [unknown]

chain_inline 1
\t 99 main

other thing 7
\t 134b burn_leaf
\t 1364 level_three
\t 13b0 level_two
\t 13f8 level_one
\t 1433 worker
";
        assert_eq!(count_complete(script), (1, 2));
    }
}
