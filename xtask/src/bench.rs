//! `cargo xtask bench`: firn against `perf record -g -a` on the same busy
//! workload, side by side in one run. Prints figures; asserts nothing.
//! `--unwind dwarf`: the workload is built without frame pointers and perf
//! unwinds with `--call-graph dwarf`; the share of complete stacks of each
//! and firn's unwinding rate are reported too (`bench_unwind`). `--python`:
//! a Python workload, firn against py-spy (`bench_python`). `--ruby`: a
//! Ruby workload, firn against rbspy (`bench_ruby`). `--java`: a
//! Java workload, firn against async-profiler (`bench_java`). `--node`: a
//! Node.js workload, firn against V8's own profiler (`bench_node`).
//! `--off-cpu`: off-CPU profiling's cost and error on a pipe ping-pong
//! (`bench_offcpu`).

use std::{
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    bench_java, bench_node, bench_offcpu, bench_python, bench_ruby, bench_unwind,
    util::{self, cargo, is_root},
};

#[derive(Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("agent_like").args(["agent", "deep"]).multiple(true)))]
pub struct BenchArgs {
    /// Seconds the workload runs in each measurement.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Rounds of (baseline, firn, perf); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Sampling frequency for both profilers.
    #[arg(long, default_value_t = 100)]
    pub frequency: u64,
    /// `fp`: a frame-pointer workload, perf with `-g`. `dwarf`: a workload
    /// built without frame pointers, perf with `--call-graph dwarf`.
    #[arg(long, value_enum, default_value_t = Unwind::Fp)]
    unwind: Unwind,
    /// The Python case instead: a Python workload under Debian's
    /// python3.11 and a pyenv 3.12, firn (with and without its Python
    /// walker) against py-spy.
    #[arg(long, conflicts_with = "unwind")]
    pub python: bool,
    /// The Ruby case instead: a Ruby workload (a chain of methods, blocks
    /// and C functions) under Debian's ruby3.1, firn (with and without its
    /// Ruby walker) against rbspy.
    #[arg(long, conflicts_with_all = ["unwind", "python"])]
    pub ruby: bool,
    /// The Java case instead: a Java workload (the chain, C2 with
    /// inlining) under JDK 17 and Java 25, firn against async-profiler.
    #[arg(long, conflicts_with_all = ["unwind", "python", "ruby"])]
    pub java: bool,
    /// The Node.js case instead: a JavaScript workload (the chain,
    /// TurboFan with inlining) under Node 22 and Debian's Node 20, firn
    /// against V8's own profiler (`--cpu-prof`) and `--perf-basic-prof`.
    #[arg(long, conflicts_with_all = ["unwind", "python", "ruby", "java"])]
    pub node: bool,
    /// The off-CPU case instead: a pipe ping-pong at 10k, 100k and 200k
    /// context switches a second under `firn record --off-cpu=1ms`: firn's
    /// CPU, BPF time per switch, samples a second and the estimate's error
    /// (`bench_offcpu`).
    #[arg(long, conflicts_with_all = ["unwind", "python", "ruby", "java", "node"])]
    pub off_cpu: bool,
    /// firn as an agent pushing to a real Parca server, debug information
    /// upload on: CPU per sample by stage, ready time, RSS, losses and
    /// truncated stacks (`bench_agent`). Without `--workload`, every
    /// workload at 100 and 1000 Hz (or `--frequency`) for 90 s (or
    /// `--seconds`), then the deep-stack case.
    #[arg(long, conflicts_with_all = ["python", "ruby", "java", "node", "off_cpu", "unwind", "rounds"])]
    pub agent: bool,
    /// With `--agent`: only this workload (repeatable).
    #[arg(long = "workload", value_enum, requires = "agent")]
    pub workloads: Vec<crate::bench_agent::AgentWorkload>,
    /// The deep-stack case: complete and truncated stacks of a recursive
    /// program without frame pointers at several depths (implies `--agent`).
    #[arg(long, conflicts_with_all = ["python", "ruby", "java", "node", "off_cpu", "unwind", "rounds"])]
    pub deep: bool,
    /// With `--agent` or `--deep`: also bench this firn binary
    /// (repeatable), e.g. one built from an older commit, beside the one
    /// built from this tree.
    #[arg(long = "firn", value_name = "PATH", requires = "agent_like")]
    pub firns: Vec<PathBuf>,
    /// With `--agent`: the mixed host also starts this many short-lived
    /// processes a second (a small C program without frame pointers that
    /// runs about a millisecond, and `sh -c` pipelines), on top of its few
    /// compilers and Python runs: firn's cost per new process.
    #[arg(long, value_name = "PER_SECOND", requires = "agent")]
    pub exec_rate: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwind {
    Fp,
    Dwarf,
}

/// The program whose throughput is measured: `binary ARGS.. SECONDS ..`.
pub struct Workload {
    pub binary: PathBuf,
    pub before_seconds: Vec<String>,
}

/// What one profiler run cost.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    cpu_seconds: f64,
    peak_rss_mb: f64,
    workload_ops: f64,
}

pub fn run(root: &Path, args: &BenchArgs) -> Result<()> {
    if !is_root() {
        bail!("the benchmark loads BPF programs and samples every CPU: run it as root");
    }
    if args.rounds == 0 || args.seconds == 0 {
        bail!("--rounds and --seconds must be at least 1");
    }
    util::run(cargo(root).args(["build", "--release", "--package", "firn"]))?;
    let firn_path = root.join("target/release/firn");
    let work = root.join("target/bench");
    fs::create_dir_all(&work)?;
    if args.python {
        return bench_python::run(root, &firn_path, &work, args);
    }
    if args.ruby {
        return bench_ruby::run(root, &firn_path, &work, args);
    }
    if args.java {
        return bench_java::run(root, &firn_path, &work, args);
    }
    if args.node {
        return bench_node::run(root, &firn_path, &work, args);
    }
    if args.off_cpu {
        return bench_offcpu::run(root, &firn_path, &work, args);
    }
    let workload = prepare_workload(root, &work, args.unwind)?;
    Command::new("perf")
        .arg("--version")
        .output()
        .context("`perf` is missing: `cargo xtask setup --packages-only` installs linux-perf")?;
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());

    println!(
        "firn bench: {cpus} CPUs busy ({}), {} Hz, {} rounds x {} s; each profiler run sits \
         between two baseline runs and is compared with their mean",
        workload.binary.display(),
        args.frequency,
        args.rounds,
        args.seconds
    );
    let rounds = run_rounds(root, &firn_path, &workload, &work, args)?;
    let firn = summarize(&rounds.firn_costs);
    let perf = summarize(&rounds.perf_costs);
    print_comparison(&rounds, args, (&firn, &perf));
    print_cpu_accounting(&rounds, args, cpus, (&firn, &perf));
    if args.seconds > SHORT_SECONDS {
        fixed_and_marginal(&firn_path, &workload, &work, args, (&firn, &perf))?;
    }
    println!(
        "\nfirn's CPU includes symbolizing and writing pprof; perf's excludes `perf report`.\n\
         Sampling cost in the kernel (BPF program, perf callchains) is charged to the\n\
         workload and shows in its throughput loss."
    );
    if args.unwind == Unwind::Dwarf {
        bench_unwind::unwinding_rate(root, &workload)?;
    }
    Ok(())
}

pub fn prepare_workload(root: &Path, work: &Path, unwind: Unwind) -> Result<Workload> {
    Ok(match unwind {
        Unwind::Fp => {
            let busy = work.join("busy");
            util::run(
                Command::new("gcc")
                    .args(["-O2", "-fno-omit-frame-pointer", "-pthread", "-o"])
                    .arg(&busy)
                    .arg(root.join("tests/workloads/busy.c")),
            )?;
            Workload {
                binary: busy,
                before_seconds: Vec::new(),
            }
        }
        Unwind::Dwarf => bench_unwind::prepare(root, work)?,
    })
}

/// What the rounds measured, in round order.
struct Rounds {
    firn_costs: Vec<Cost>,
    perf_costs: Vec<Cost>,
    /// The BPF program's mean run time per sample, of the firn runs that
    /// logged it.
    bpf_ns: Vec<u64>,
    firn_loss: Vec<f64>,
    perf_loss: Vec<f64>,
    /// How far each baseline run was from the one before, in percent.
    drift: Vec<f64>,
    /// (complete, total) stacks, with `--unwind dwarf` only.
    firn_complete: Vec<(u64, u64)>,
    perf_complete: Vec<(u64, u64)>,
    /// CPU seconds of `perf script`, with `--unwind dwarf` only.
    perf_script_cpu: Vec<f64>,
}

/// Baseline, firn, baseline, perf, baseline… for each round.
fn run_rounds(
    root: &Path,
    firn_path: &Path,
    workload: &Workload,
    work: &Path,
    args: &BenchArgs,
) -> Result<Rounds> {
    let mut baseline = vec![run_workload(workload, args.seconds)?];
    let (mut firn_costs, mut perf_costs, mut bpf_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut firn_loss, mut perf_loss, mut drift) = (Vec::new(), Vec::new(), Vec::new());
    let (mut firn_complete, mut perf_complete) = (Vec::new(), Vec::new());
    let mut perf_script_cpu = Vec::new();
    // Loss against the mean of the baselines just before and after.
    let mut bracket = |ops: f64, baseline: &mut Vec<f64>| -> Result<f64> {
        let before = *baseline.last().context("a baseline ran first")?;
        let after = run_workload(workload, args.seconds)?;
        baseline.push(after);
        drift.push((after - before).abs() / before * 100.0);
        Ok((1.0 - ops / ((before + after) / 2.0)) * 100.0)
    };
    for round in 1..=args.rounds {
        let (firn_cost, mean_ns) = measure_firn(firn_path, workload, work, args)?;
        firn_loss.push(bracket(firn_cost.workload_ops, &mut baseline)?);
        bpf_ns.extend(mean_ns);
        if args.unwind == Unwind::Dwarf {
            firn_complete.push(bench_unwind::firn_complete_share(
                root,
                &work.join("firn.pb.gz"),
            )?);
        }
        let perf_cost = measure_perf(workload, work, args)?;
        perf_loss.push(bracket(perf_cost.workload_ops, &mut baseline)?);
        if args.unwind == Unwind::Dwarf {
            let (complete, cpu) = bench_unwind::perf_script(&work.join("perf.data"))?;
            perf_complete.push(complete);
            perf_script_cpu.push(cpu);
        }
        println!(
            "  round {round}: firn {:.3} CPU s, {:.1} MB, loss {:+.2}% | perf {:.3} CPU s, {:.1} MB, loss {:+.2}%",
            firn_cost.cpu_seconds,
            firn_cost.peak_rss_mb,
            firn_loss[round - 1],
            perf_cost.cpu_seconds,
            perf_cost.peak_rss_mb,
            perf_loss[round - 1],
        );
        firn_costs.push(firn_cost);
        perf_costs.push(perf_cost);
    }

    Ok(Rounds {
        firn_costs,
        perf_costs,
        bpf_ns,
        firn_loss,
        perf_loss,
        drift,
        firn_complete,
        perf_complete,
        perf_script_cpu,
    })
}

/// The table's rows that compare the two profilers side by side.
fn print_comparison(rounds: &Rounds, args: &BenchArgs, (firn, perf): (&Cost, &Cost)) {
    let (firn_loss, perf_loss, drift) = (&rounds.firn_loss, &rounds.perf_loss, &rounds.drift);
    let (firn_complete, perf_complete) = (&rounds.firn_complete, &rounds.perf_complete);
    let perf_script_cpu = &rounds.perf_script_cpu;
    let peer = match args.unwind {
        Unwind::Fp => "perf record -g",
        Unwind::Dwarf => "perf (dwarf)",
    };
    println!();
    println!("{:<36}{:>12}{:>18}", "", "firn", peer);
    if args.unwind == Unwind::Dwarf {
        let show = |shares: &[(u64, u64)]| {
            let (complete, total) = shares.iter().fold((0, 0), |(c, t), &(complete, total)| {
                (c + complete, t + total)
            });
            format!(
                "{:.1}% of {total}",
                complete as f64 * 100.0 / total.max(1) as f64
            )
        };
        println!(
            "{:<36}{:>12}{:>18}",
            "complete stacks (all rounds)",
            show(firn_complete),
            show(perf_complete)
        );
    }
    println!(
        "{:<36}{:>12.3}{:>18.3}",
        "CPU seconds (median)", firn.cpu_seconds, perf.cpu_seconds
    );
    if args.unwind == Unwind::Dwarf {
        let script = median(perf_script_cpu.iter().copied());
        println!(
            "{:<36}{:>12}{:>18.3}",
            "  + perf script --no-inline", "", script
        );
        println!(
            "{:<36}{:>12.3}{:>18.3}",
            "  = CPU seconds to stacks (median)",
            firn.cpu_seconds,
            perf.cpu_seconds + script
        );
        println!(
            "{:<36}{:>12.2}",
            "  CPU ratio firn / (record + script)",
            firn.cpu_seconds / (perf.cpu_seconds + script).max(f64::EPSILON)
        );
    }
    println!(
        "{:<36}{:>12.1}{:>18.1}",
        "peak RSS, MB (median)", firn.peak_rss_mb, perf.peak_rss_mb
    );
    println!(
        "{:<36}{:>11.2}%{:>17.2}%",
        "workload throughput loss (median)",
        median(firn_loss.iter().copied()),
        median(perf_loss.iter().copied())
    );
    println!(
        "{:<36}{:>12}{:>18}",
        "  mean +- standard error",
        mean_and_error(firn_loss),
        mean_and_error(perf_loss)
    );
    println!(
        "{:<36}{:>11.2}%",
        "baseline drift between runs (median)",
        median(drift.iter().copied())
    );
}

/// The table's rows on firn's own cost.
fn print_cpu_accounting(
    rounds: &Rounds,
    args: &BenchArgs,
    cpus: usize,
    (firn, perf): (&Cost, &Cost),
) {
    let bpf_ns = &rounds.bpf_ns;
    // An upper bound from CPU accounting: all of firn's CPU (including the
    // symbolizing at the end) plus the BPF program's time, as a share of
    // the CPU time the workload could have used.
    let samples = (args.frequency * cpus as u64 * args.seconds) as f64;
    let bpf_share = median(bpf_ns.iter().map(|&ns| ns as f64)) * samples / 1e9;
    let capacity = (args.seconds * cpus as u64) as f64;
    println!(
        "{:<36}{:>11.2}%",
        "firn cost by CPU accounting",
        (firn.cpu_seconds + bpf_share) / capacity * 100.0
    );
    match bpf_ns.is_empty() {
        true => println!("{:<36}{:>12}", "BPF run time per sample", "n/a"),
        false => println!(
            "{:<36}{:>9.2} us",
            "BPF run time per sample (median)",
            median(bpf_ns.iter().map(|&ns| ns as f64)) / 1000.0
        ),
    }
    println!(
        "{:<36}{:>12.2}",
        "CPU ratio firn / perf",
        firn.cpu_seconds / perf.cpu_seconds.max(f64::EPSILON)
    );
}

/// Workload seconds of the short runs that measure what a recording costs
/// regardless of its length.
const SHORT_SECONDS: u64 = 1;
const SHORT_RUNS: usize = 3;

/// Splits each profiler's CPU into what any recording costs (start-up:
/// for firn kallsyms, BPF verification, BTF; shut-down: symbolizing and
/// writing, for perf its build-id pass) and what each further second of
/// recording costs, from short runs against the long ones just measured.
/// A continuous profiler pays the first once and the second forever.
fn fixed_and_marginal(
    firn: &Path,
    workload: &Workload,
    work: &Path,
    args: &BenchArgs,
    (firn_long, perf_long): (&Cost, &Cost),
) -> Result<()> {
    let short = BenchArgs {
        seconds: SHORT_SECONDS,
        ..args.clone()
    };
    let (mut firn_short, mut perf_short) = (Vec::new(), Vec::new());
    for _ in 0..SHORT_RUNS {
        firn_short.push(measure_firn(firn, workload, work, &short)?.0);
        perf_short.push(measure_perf(workload, work, &short)?);
    }
    let firn_fixed = summarize(&firn_short).cpu_seconds;
    let perf_fixed = summarize(&perf_short).cpu_seconds;
    let extra = (args.seconds - SHORT_SECONDS) as f64;
    let firn_rate = (firn_long.cpu_seconds - firn_fixed).max(0.0) / extra;
    let perf_rate = (perf_long.cpu_seconds - perf_fixed).max(0.0) / extra;
    println!(
        "{:<36}{:>12.3}{:>18.3}",
        format!("CPU s of a {SHORT_SECONDS} s recording (median)"),
        firn_fixed,
        perf_fixed
    );
    println!(
        "{:<36}{:>9.2} ms{:>15.2} ms",
        "  CPU per further recorded second",
        firn_rate * 1e3,
        perf_rate * 1e3
    );
    // Below a microsecond per recorded second the ratio says nothing.
    if perf_rate >= 1e-6 {
        println!(
            "{:<36}{:>12.2}",
            "  ratio firn / perf per second",
            firn_rate / perf_rate
        );
    } else {
        println!("{:<36}{:>12}", "  ratio firn / perf per second", "n/a");
    }
    Ok(())
}

fn summarize(costs: &[Cost]) -> Cost {
    Cost {
        cpu_seconds: median(costs.iter().map(|c| c.cpu_seconds)),
        peak_rss_mb: median(costs.iter().map(|c| c.peak_rss_mb)),
        workload_ops: median(costs.iter().map(|c| c.workload_ops)),
    }
}

fn mean_and_error(values: &[f64]) -> String {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    format!("{mean:+.2}+-{:.2}%", (variance / n).sqrt())
}

pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Runs the workload for `seconds`; returns the work it did.
fn run_workload(workload: &Workload, seconds: u64) -> Result<f64> {
    let output = Command::new(&workload.binary)
        .args(&workload.before_seconds)
        .arg(seconds.to_string())
        .output()?;
    if !output.status.success() {
        bail!("the workload failed: {}", output.status);
    }
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse::<f64>()
        .context("the workload printed no count")
}

/// Starts the profiler, lets it settle, runs the workload, then collects
/// the profiler's resource usage once it exits on its own.
fn measure(
    mut profiler: Child,
    workload: &Workload,
    seconds: u64,
) -> Result<(Cost, std::process::ExitStatus)> {
    thread::sleep(Duration::from_secs(1));
    let ops = run_workload(workload, seconds);
    let (status, usage) = wait_with_usage(&mut profiler)?;
    Ok((
        Cost {
            cpu_seconds: usage.0,
            peak_rss_mb: usage.1,
            workload_ops: ops?,
        },
        status,
    ))
}

fn measure_firn(
    firn: &Path,
    workload: &Workload,
    work: &Path,
    args: &BenchArgs,
) -> Result<(Cost, Option<u64>)> {
    let log = work.join("firn.log");
    let child = Command::new(firn)
        .args([
            "record",
            "--frequency",
            &args.frequency.to_string(),
            "--duration",
        ])
        .arg(format!("{}s", args.seconds + 2))
        .arg("--output")
        .arg(work.join("firn.pb.gz"))
        .stdout(Stdio::null())
        .stderr(File::create(&log)?)
        .spawn()
        .context("could not start firn")?;
    let (cost, status) = measure(child, workload, args.seconds)?;
    let text = fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        bail!("firn failed ({status}):\n{text}");
    }
    let mean_ns = text
        .split_whitespace()
        .find_map(|field| field.strip_prefix("bpf_mean_ns="))
        .and_then(|value| value.parse().ok());
    Ok((cost, mean_ns))
}

fn measure_perf(workload: &Workload, work: &Path, args: &BenchArgs) -> Result<Cost> {
    let data: PathBuf = work.join("perf.data");
    let call_graph: &[&str] = match args.unwind {
        Unwind::Fp => &["-g"],
        Unwind::Dwarf => &["--call-graph", "dwarf"],
    };
    let child = Command::new("perf")
        .args(["record", "-F", &args.frequency.to_string()])
        .args(call_graph)
        .args(["-a", "-q", "-o"])
        .arg(&data)
        .args(["--", "sleep", &(args.seconds + 2).to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("could not start perf record")?;
    let (cost, status) = measure(child, workload, args.seconds)?;
    if !status.success() {
        bail!("perf record failed: {status}");
    }
    Ok(cost)
}

/// Waits for `child` and returns its CPU seconds (user + system, its own
/// and its waited-for children's) and peak RSS in MB.
pub fn wait_with_usage(child: &mut Child) -> Result<(std::process::ExitStatus, (f64, f64))> {
    use std::os::unix::process::ExitStatusExt;
    let pid = i32::try_from(child.id()).context("pid out of range")?;
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with valid out-pointers.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if waited != pid {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = seconds(usage.ru_utime) + seconds(usage.ru_stime);
    let rss_mb = usage.ru_maxrss as f64 / 1024.0;
    Ok((std::process::ExitStatus::from_raw(status), (cpu, rss_mb)))
}

/// `firn record --pid PID` for `seconds` at the bench's frequency, writing
/// `output` (`extra`: more options), once it samples: its log (`log`) says
/// `recording` after the BPF program is verified and attached, which takes
/// tens of seconds on a busy machine.
pub fn start_firn(
    firn: &Path,
    pid: u32,
    args: &BenchArgs,
    seconds: u64,
    output: &Path,
    log: &Path,
    extra: &[&str],
) -> Result<Child> {
    let child = Command::new(firn)
        .args(["record", "--pid", &pid.to_string(), "--frequency"])
        .arg(args.frequency.to_string())
        .arg("--duration")
        .arg(format!("{seconds}s"))
        .arg("--output")
        .arg(output)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(File::create(log).with_context(|| format!("could not create {}", log.display()))?)
        .spawn()
        .context("could not start firn")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !fs::read_to_string(log)
        .unwrap_or_default()
        .contains("recording")
    {
        if std::time::Instant::now() > deadline {
            bail!("firn did not start sampling: see {}", log.display());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}
