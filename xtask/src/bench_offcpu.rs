//! `cargo xtask bench --off-cpu`: what off-CPU profiling (`--off-cpu=1ms`)
//! costs and how well it estimates, on two threads bouncing a byte over two
//! pipes (`tests/workloads/offcpu.c pingpong`) at about 10k, 100k and 200k
//! context switches a second (the rate is set by a spin between bounces,
//! calibrated first; the rate reached under firn is printed). For each:
//! firn's CPU per second over a window while it records, the run time per
//! call of each off-CPU BPF program and their sum per switch of the
//! workload (from the kernel's BPF statistics, `kernel.bpf_stats_enabled`
//! turned on for the bench and restored after), the off-CPU samples
//! written per second, and the estimate of the time the two threads were
//! blocked against what they measured themselves (wall time minus CPU time
//! minus run-queue time, from schedstat). Prints figures; asserts nothing.
//! Parca Agent's off-CPU mode is not run: the bench says whether a
//! `parca-agent` binary was given (`FIRN_PARCA_AGENT`) to compare by hand.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use agent_pprof::Reader;
use anyhow::{Context, Result, bail};

use crate::{
    bench::{BenchArgs, wait_with_usage},
    bench_python::probes::cpu_seconds,
    util,
};

/// Context switches a second the workload is set to.
const RATES: [u64; 3] = [10_000, 100_000, 200_000];
/// The off-CPU period benched (as the tests use).
const PERIOD: &str = "1ms";
const PERIOD_NS: f64 = 1e6;
/// From firn sampling to the window's start, and from its end to the
/// workload's.
const SETTLE: Duration = Duration::from_secs(1);
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
/// Runs of a second each to find the spin for a rate.
const CALIBRATION_TRIES: usize = 6;

/// What one recording at one rate measured.
#[derive(Debug, Default)]
struct Run {
    /// Switches a second the workload reached under firn (its reads).
    rate: f64,
    /// firn's CPU seconds per second of the window.
    firn_cpu: f64,
    /// Per program name: (run time ns, runs) over the window.
    programs: BTreeMap<String, (u64, u64)>,
    /// Switches of the workload over the window, estimated from its rate.
    window_switches: f64,
    samples_per_second: f64,
    /// (estimated, measured) nanoseconds blocked in `bounce`.
    blocked: (f64, f64),
}

pub fn run(root: &Path, firn: &Path, work: &Path, args: &BenchArgs) -> Result<()> {
    let binary = work.join("offcpu");
    util::run(
        Command::new("gcc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&binary)
            .arg(root.join("tests/workloads/offcpu.c")),
    )?;
    let seconds = args.seconds.max(2 * SETTLE.as_secs() + 2);
    let _stats = BpfStats::enable()?;
    println!(
        "firn off-CPU bench: `offcpu pingpong` (two threads, two pipes), firn record \
         --off-cpu={PERIOD}, {seconds} s per rate; the window is the middle {} s",
        seconds - 2 * SETTLE.as_secs() - 1
    );
    let mut rows = Vec::new();
    for target in RATES {
        let (pause, alone) = calibrate(&binary, target)?;
        let run = measure(firn, &binary, work, pause, seconds)?;
        rows.push((target, pause, alone, run));
    }
    print_table(&rows);
    parca_agent_note();
    Ok(())
}

/// The spin (µs) between bounces that brings the workload, alone, nearest
/// `target` switches a second, and the rate it reached with it. The rate
/// is not linear in the spin (a thread that spins long lets its partner's
/// CPU go idle or to other work, and its wakeup costs more), so the spin
/// is scaled by how far each try missed, a few times.
fn calibrate(binary: &Path, target: u64) -> Result<(u64, f64)> {
    // A round trip is two reads (two switches): 2/rate, most of it spin.
    let mut pause = 2_000_000 / target;
    let mut best = (pause, 0.0f64);
    for _ in 0..CALIBRATION_TRIES {
        let rate = alone_rate(binary, pause)?;
        let miss = |rate: f64| (rate / target as f64).ln().abs();
        if miss(rate) < miss(best.1.max(1.0)) {
            best = (pause, rate);
        }
        if miss(rate) < 0.1 {
            break;
        }
        let mut next = (pause as f64 * rate / target as f64).round() as u64;
        if next == pause && rate < target as f64 {
            // Too slow by less than the rounding: one microsecond less.
            next = pause.saturating_sub(1);
        }
        if next == pause {
            break;
        }
        pause = next;
    }
    Ok(best)
}

/// Switches a second of the workload run alone for a second.
fn alone_rate(binary: &Path, pause: u64) -> Result<f64> {
    let output = Command::new(binary)
        .args(["pingpong", "1", &pause.to_string()])
        .output()
        .context("could not run the ping-pong")?;
    let truth = truths(&String::from_utf8_lossy(&output.stdout));
    Ok(truth.get("trips").copied().unwrap_or(0) as f64)
}

/// `NAME VALUE` lines.
fn truths(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

fn measure(firn: &Path, binary: &Path, work: &Path, pause: u64, seconds: u64) -> Result<Run> {
    let log = work.join("offcpu-firn.log");
    let stdout = work.join("offcpu-workload.out");
    let output = work.join("offcpu.pb.gz");
    let mut child = Command::new(firn)
        .args(["record", "--summary=false", &format!("--off-cpu={PERIOD}")])
        .arg("--output")
        .arg(&output)
        .arg("--")
        .arg(binary)
        .args(["pingpong", &seconds.to_string(), &pause.to_string()])
        .stdout(fs::File::create(&stdout)?)
        .stderr(fs::File::create(&log)?)
        .spawn()
        .context("could not start firn")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("recording")
    {
        if Instant::now() > deadline {
            bail!("firn did not start sampling: see {}", log.display());
        }
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(SETTLE);
    let window = Duration::from_secs(seconds - 2 * SETTLE.as_secs() - 1);
    let (cpu_before, programs_before) = (cpu_seconds(child.id())?, off_cpu_programs());
    let window_start = Instant::now();
    thread::sleep(window);
    let (cpu_after, programs_after) = (cpu_seconds(child.id())?, off_cpu_programs());
    let measured = window_start.elapsed().as_secs_f64();
    let (status, _) = wait_with_usage(&mut child)?;
    if !status.success() {
        bail!("firn failed ({status}); see {}", log.display());
    }
    let truth = truths(&fs::read_to_string(&stdout)?);
    let rate = truth.get("trips").copied().unwrap_or(0) as f64 / seconds as f64;
    let programs = programs_after
        .iter()
        .map(|(name, &(time, runs))| {
            let (time_before, runs_before) = programs_before.get(name).copied().unwrap_or((0, 0));
            (
                name.clone(),
                (
                    time.saturating_sub(time_before),
                    runs.saturating_sub(runs_before),
                ),
            )
        })
        .collect();
    let log_text = fs::read_to_string(&log)?;
    let written = log_field(&log_text, "off-CPU profile written", "samples_written").unwrap_or(0);
    Ok(Run {
        rate,
        firn_cpu: (cpu_after - cpu_before) / measured,
        programs,
        window_switches: rate * measured,
        samples_per_second: written as f64 / seconds as f64,
        blocked: (
            blocked_in_bounce(&beside(&output))?,
            truth.get("off_cpu_ns").copied().unwrap_or(0) as f64,
        ),
    })
}

/// `NAME.offcpu.pb.gz` beside `NAME.pb.gz`.
fn beside(output: &Path) -> PathBuf {
    output.with_file_name("offcpu.offcpu.pb.gz")
}

/// Nanoseconds blocked the off-CPU profile holds under `bounce`.
fn blocked_in_bounce(path: &Path) -> Result<f64> {
    let bytes = fs::read(path).with_context(|| format!("firn wrote no {}", path.display()))?;
    let profile = agent_pprof::decode(&bytes)?;
    Ok(Reader::new(&profile)
        .samples()
        .filter(|sample| sample.function_names().iter().any(|name| name == "bounce"))
        .map(|sample| sample.sample.value.get(1).copied().unwrap_or(0) as f64)
        .sum())
}

/// A numeric field of the last log line holding `message`.
fn log_field(log: &str, message: &str, field: &str) -> Option<u64> {
    let line = log.lines().rev().find(|line| line.contains(message))?;
    let start = line.find(&format!("{field}="))? + field.len() + 1;
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// (run time ns, runs) so far of each loaded off-CPU program of firn's, by
/// name (the kernel keeps 15 characters of it), summed over programs of
/// that name.
fn off_cpu_programs() -> BTreeMap<String, (u64, u64)> {
    let programs: Option<serde_json::Value> = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|output| serde_json::from_slice(&output.stdout).ok());
    let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for program in programs
        .as_ref()
        .and_then(|programs| programs.as_array())
        .into_iter()
        .flatten()
    {
        let Some(name) = program["name"].as_str() else {
            continue;
        };
        if !name.starts_with("offcpu_") {
            continue;
        }
        let entry = totals.entry(name.to_owned()).or_default();
        entry.0 += program["run_time_ns"].as_u64().unwrap_or(0);
        entry.1 += program["run_cnt"].as_u64().unwrap_or(0);
    }
    totals
}

fn print_table(rows: &[(u64, u64, f64, Run)]) {
    println!();
    let mut table = vec![vec![
        "target switches/s".to_owned(),
        "spin µs".to_owned(),
        "alone /s".to_owned(),
        "under firn /s".to_owned(),
        "firn CPU".to_owned(),
        "BPF ns/switch".to_owned(),
        "samples/s".to_owned(),
        "estimate vs blocked".to_owned(),
    ]];
    for (target, pause, alone, run) in rows {
        let bpf_ns: u64 = run.programs.values().map(|(time, _)| time).sum();
        let (estimated, real) = run.blocked;
        table.push(vec![
            target.to_string(),
            pause.to_string(),
            format!("{alone:.0}"),
            format!("{:.0}", run.rate),
            format!("{:.2}%", run.firn_cpu * 100.0),
            format!("{:.0}", bpf_ns as f64 / run.window_switches.max(1.0)),
            format!("{:.0}", run.samples_per_second),
            format!(
                "{:+.1}% ({:.2} s of {:.2} s)",
                (estimated - real) / real.max(1.0) * 100.0,
                estimated / 1e9,
                real / 1e9
            ),
        ]);
    }
    print_rows(&table);
    println!("\nper program (ns per run; runs per second of the window, any task):");
    for (target, _, _, run) in rows {
        let seconds = run.window_switches / run.rate.max(1.0);
        let programs: Vec<String> = run
            .programs
            .iter()
            .map(|(name, (time, runs))| {
                format!(
                    "{name} {:.0} ns x {:.0}/s",
                    *time as f64 / (*runs).max(1) as f64,
                    *runs as f64 / seconds.max(1e-9)
                )
            })
            .collect();
        println!("  {target:>6}/s: {}", programs.join(", "));
    }
    println!(
        "\nBPF ns/switch: the off-CPU programs' run time over the window (every task's \
         switches, wakeups and system call returns) per switch of the workload. \
         Bound on samples/s: 2 threads x 1s/{PERIOD} = {:.0}.",
        2e9 / PERIOD_NS
    );
}

fn print_rows(rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:>width$}"))
            .collect();
        println!("{}", cells.join("  "));
    }
}

/// Parca Agent's off-CPU mode is compared only by hand: the bench says
/// whether a binary was given for it.
fn parca_agent_note() {
    match std::env::var_os("FIRN_PARCA_AGENT") {
        Some(path) => println!(
            "\nParca Agent ({}): not run by the bench; compare by hand with its \
             --off-cpu-threshold on the same ping-pong.",
            PathBuf::from(path).display()
        ),
        None => println!(
            "\nParca Agent's off-CPU mode: not available (no parca-agent binary; \
             FIRN_PARCA_AGENT names one)."
        ),
    }
}

/// `kernel.bpf_stats_enabled` on for the bench (firn turns the statistics
/// on while it runs too; the bench reads them between), restored after.
struct BpfStats {
    before: String,
}

impl BpfStats {
    fn enable() -> Result<Self> {
        let before = fs::read_to_string(BPF_STATS)
            .with_context(|| format!("could not read {BPF_STATS}"))?
            .trim()
            .to_owned();
        if before != "1" {
            fs::write(BPF_STATS, "1").with_context(|| format!("could not write {BPF_STATS}"))?;
        }
        Ok(Self { before })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if self.before != "1" {
            let _ = fs::write(BPF_STATS, &self.before);
        }
    }
}
