//! `cargo xtask bench --ruby`: firn against rbspy on a Ruby workload
//! (`tests/workloads/ruby/chain.rb`) under Debian's ruby3.1, side by side
//! in one run at the same frequency: what each profiler costs in CPU per
//! sample, how much it slows the workload, and how many of its samples
//! hold the whole Ruby chain; firn also with `--ruby=false`, for the
//! walker's own cost. Prints figures; asserts nothing. rbspy is built from
//! crates.io the first time (`cargo install rbspy`, a few minutes).

use std::{
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    bench::{BenchArgs, median, wait_with_usage},
    bench_python::probes::{Snapshot, Workload, sampling_programs},
    setup::cargo_home,
    util::{self, cargo},
};

/// The rbspy release compared against.
const RBSPY_VERSION: &str = "0.55.0";
/// The interpreter the workload runs under.
const RUBY: &str = "/usr/bin/ruby3.1";

/// chain.rb's Ruby frames, innermost first, as firn names them.
const CHAIN: [&str; 8] = [
    "Chain#work",
    "block in Chain#inner",
    "Integer#times",
    "Chain#inner",
    "Chain.middle",
    "block in <main>",
    "Kernel#loop",
    "<main>",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profiler {
    Firn,
    FirnNoRuby,
    Rbspy,
}

const PROFILERS: [Profiler; 3] = [Profiler::Firn, Profiler::FirnNoRuby, Profiler::Rbspy];

impl Profiler {
    fn log_name(self) -> &'static str {
        match self {
            Self::Firn => "ruby-firn.log",
            Self::FirnNoRuby => "ruby-firn-no-ruby.log",
            Self::Rbspy => "ruby-rbspy.log",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::Firn => "firn",
            Self::FirnNoRuby => "--ruby=false",
            Self::Rbspy => "rbspy",
        }
    }
}

/// What one profiled run measured.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    /// The workload's iterations per second over the measured window.
    rate: f64,
    /// The profiler's CPU seconds over the window.
    window_cpu: f64,
    /// The workload's CPU seconds over the window: its samples follow.
    workload_cpu: f64,
    /// The profiler's CPU seconds from start to exit.
    total_cpu: f64,
    /// Samples holding the whole chain, of all the workload's samples.
    complete: (u64, u64),
    /// firn only: BPF run time over the window per sample of the workload.
    bpf_ns_per_sample: Option<f64>,
    /// Throughput lost against the runs alone before and after, percent.
    slowdown: f64,
}

struct Tools {
    root: PathBuf,
    firn: PathBuf,
    rbspy: PathBuf,
    script: PathBuf,
    work: PathBuf,
}

pub fn run(root: &Path, firn: &Path, work: &Path, args: &BenchArgs) -> Result<()> {
    if !Path::new(RUBY).exists() {
        bail!("{RUBY} is missing: `cargo xtask setup` installs Debian's ruby3.1");
    }
    util::run(cargo(root).args([
        "build",
        "--release",
        "--package",
        "firn",
        "--example",
        "unwind_bench",
    ]))?;
    let tools = Tools {
        root: root.to_path_buf(),
        firn: firn.to_path_buf(),
        rbspy: rbspy()?,
        script: root.join("tests/workloads/ruby/chain.rb"),
        work: work.to_path_buf(),
    };
    println!(
        "\nRuby bench: chain.rb under {RUBY}, {} Hz, {} rounds x {} s; each profiler run sits \
         between two runs of the workload alone",
        args.frequency, args.rounds, args.seconds
    );
    let mut baselines = vec![measure(&tools, None, args)?.rate];
    let mut runs: Vec<(Profiler, Run)> = Vec::new();
    for round in 1..=args.rounds {
        let mut line = format!("  round {round}:");
        for profiler in PROFILERS {
            let mut run = measure(&tools, Some(profiler), args)?;
            let after = measure(&tools, None, args)?.rate;
            let before = *baselines.last().context("a baseline ran first")?;
            baselines.push(after);
            run.slowdown = (1.0 - run.rate / ((before + after) / 2.0)) * 100.0;
            line.push_str(&format!(
                " {} {:.3} CPU s, {:+.2}% |",
                profiler.title(),
                run.window_cpu,
                run.slowdown
            ));
            runs.push((profiler, run));
        }
        println!("{}", line.trim_end_matches(" |"));
    }
    print_table(&runs, median(baselines.iter().copied()), args.frequency);
    println!(
        "\nCPU per sample: the profiler's CPU over the window divided by the workload's \
         samples in it\n(its CPU times the frequency). rbspy reads the process from outside \
         and pauses it for each\nsample (its default); firn's BPF time is charged to the \
         workload and shows in its slowdown."
    );
    Ok(())
}

/// rbspy, built once into cargo's bin directory.
fn rbspy() -> Result<PathBuf> {
    let path = cargo_home().join("bin/rbspy");
    let works = |path: &Path| {
        Command::new(path)
            .arg("--version")
            .output()
            .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).contains(RBSPY_VERSION))
    };
    if !works(&path) {
        eprintln!("xtask: building rbspy {RBSPY_VERSION} (a few minutes, once)");
        util::run(Command::new("cargo").env_remove("RUSTUP_TOOLCHAIN").args([
            "install",
            "rbspy",
            "--locked",
            "--version",
            RBSPY_VERSION,
        ]))?;
        if !works(&path) {
            bail!("rbspy was built but `rbspy --version` does not say {RBSPY_VERSION}");
        }
    }
    Ok(path)
}

/// The rounds' runs of one profiler.
struct Column(Vec<Run>);

impl Column {
    fn median(&self, value: impl Fn(&Run) -> f64) -> f64 {
        median(self.0.iter().map(value))
    }

    fn complete(&self) -> String {
        let (complete, total) = self.0.iter().fold((0, 0), |(c, t), run| {
            (c + run.complete.0, t + run.complete.1)
        });
        format!(
            "{:.1}% of {total}",
            complete as f64 * 100.0 / total.max(1) as f64
        )
    }
}

fn print_table(runs: &[(Profiler, Run)], baseline: f64, frequency: u64) {
    let columns: Vec<Column> = PROFILERS
        .iter()
        .map(|profiler| {
            Column(
                runs.iter()
                    .filter(|(p, _)| p == profiler)
                    .map(|(_, run)| *run)
                    .collect(),
            )
        })
        .collect();
    let row = |title: &str, cell: &dyn Fn(&Column) -> String| {
        let cells: Vec<String> = columns.iter().map(cell).collect();
        println!(
            "{title:<38}{:>16}{:>17}{:>16}",
            cells[0], cells[1], cells[2]
        );
    };
    let per_sample =
        |run: &Run| run.window_cpu * 1e6 / (run.workload_cpu * frequency as f64).max(1.0);
    println!();
    row("", &|column| {
        let at = columns.iter().position(|c| std::ptr::eq(c, column));
        at.map_or("", |at| PROFILERS[at].title()).to_owned()
    });
    println!("{:<38}{baseline:>16.1}", "iterations/s alone (median)");
    row("iterations/s profiled (median)", &|c| {
        format!("{:.1}", c.median(|run| run.rate))
    });
    row("workload slowdown (median)", &|c| {
        format!("{:.2}%", c.median(|run| run.slowdown))
    });
    row("CPU s in the window (median)", &|c| {
        format!("{:.3}", c.median(|run| run.window_cpu))
    });
    row("CPU us per sample (median)", &|c| {
        format!("{:.1}", c.median(per_sample))
    });
    row("CPU s, whole run (median)", &|c| {
        format!("{:.3}", c.median(|run| run.total_cpu))
    });
    row(
        "whole Ruby chain, each's names (all rounds)",
        &Column::complete,
    );
    row("BPF ns per workload sample (median)", &|c| {
        let values: Vec<f64> = c.0.iter().filter_map(|run| run.bpf_ns_per_sample).collect();
        match values.is_empty() {
            true => "n/a".into(),
            false => format!("{:.0}", median(values.into_iter())),
        }
    });
    let cost = |column: &Column| column.median(per_sample);
    println!(
        "{:<38}{:>16.2}",
        "CPU per sample, firn / rbspy",
        cost(&columns[0]) / cost(&columns[2]).max(f64::EPSILON)
    );
}

const SETTLE: Duration = Duration::from_secs(1);
const MARGIN_SECONDS: u64 = 3;

fn measure(tools: &Tools, profiler: Option<Profiler>, args: &BenchArgs) -> Result<Run> {
    let workload = Workload::start(Path::new(RUBY), &tools.script)?;
    let programs_before = sampling_programs();
    let mut child = match profiler {
        None => None,
        Some(profiler) => Some(start_profiler(tools, profiler, workload.pid(), args)?),
    };
    let program = match profiler {
        Some(Profiler::Firn | Profiler::FirnNoRuby) => sampling_programs()
            .into_keys()
            .find(|id| !programs_before.contains_key(id)),
        _ => None,
    };
    thread::sleep(SETTLE);
    let sampled_by = child.as_ref().map(|child| child.id());
    let start = Snapshot::take(&workload, sampled_by, program)?;
    thread::sleep(Duration::from_secs(args.seconds));
    let end = Snapshot::take(&workload, sampled_by, program)?;
    let mut run = Run {
        rate: (end.iterations - start.iterations) / (end.seconds - start.seconds),
        window_cpu: end.profiler_cpu - start.profiler_cpu,
        workload_cpu: end.workload_cpu - start.workload_cpu,
        ..Run::default()
    };
    if let (Some((start_ns, _)), Some((end_ns, _))) = (start.bpf, end.bpf) {
        let samples = run.workload_cpu * args.frequency as f64;
        run.bpf_ns_per_sample = Some(end_ns.saturating_sub(start_ns) as f64 / samples.max(1.0));
    }
    if let (Some(child), Some(profiler)) = (child.as_mut(), profiler) {
        let (status, (cpu, _)) = wait_with_usage(child)?;
        if !status.success() {
            bail!(
                "{} failed ({status}); see {}",
                profiler.title(),
                tools.work.join(profiler.log_name()).display()
            );
        }
        run.total_cpu = cpu;
        run.complete = complete_share(tools, profiler)?;
    }
    workload.stop()?;
    Ok(run)
}

fn firn_output(tools: &Tools) -> PathBuf {
    tools.work.join("ruby-firn.pb.gz")
}

fn rbspy_output(tools: &Tools) -> PathBuf {
    tools.work.join("ruby-rbspy.collapsed")
}

/// Starts `profiler` on `pid` and waits until it samples.
fn start_profiler(tools: &Tools, profiler: Profiler, pid: u32, args: &BenchArgs) -> Result<Child> {
    let duration = args.seconds + SETTLE.as_secs() + MARGIN_SECONDS;
    let log = tools.work.join(profiler.log_name());
    let _ = fs::remove_file(rbspy_output(tools));
    let mut command = match profiler {
        Profiler::Firn | Profiler::FirnNoRuby => {
            let mut command = Command::new(&tools.firn);
            command
                .args(["record", "--pid", &pid.to_string(), "--frequency"])
                .arg(args.frequency.to_string())
                .arg("--duration")
                .arg(format!("{duration}s"))
                .arg("--output")
                .arg(firn_output(tools))
                .arg(format!("--ruby={}", profiler == Profiler::Firn));
            command
        }
        Profiler::Rbspy => {
            let mut command = Command::new(&tools.rbspy);
            command
                .args(["record", "--pid", &pid.to_string(), "--rate"])
                .arg(args.frequency.to_string())
                .args(["--format", "collapsed", "--duration"])
                .arg(duration.to_string())
                .arg("--file")
                .arg(rbspy_output(tools));
            command
        }
    };
    let output = File::create(&log)?;
    let child = command
        .stdout(output.try_clone()?)
        .stderr(output)
        .spawn()
        .with_context(|| format!("could not start {}", profiler.title()))?;
    // firn says when it samples; rbspy samples once it has found the
    // interpreter's globals, which its first CPU second covers.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = match profiler {
            Profiler::Rbspy => {
                crate::bench_python::probes::cpu_seconds(child.id()).unwrap_or(0.0) > 0.0
            }
            _ => fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("recording"),
        };
        if ready {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not start sampling: see {}",
                profiler.title(),
                log.display()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

fn complete_share(tools: &Tools, profiler: Profiler) -> Result<(u64, u64)> {
    match profiler {
        Profiler::Rbspy => {
            let text = fs::read_to_string(rbspy_output(tools))
                .with_context(|| format!("rbspy wrote no {}", rbspy_output(tools).display()))?;
            Ok(rbspy_complete(&text))
        }
        Profiler::Firn | Profiler::FirnNoRuby => crate::bench_unwind::firn_share(
            &tools.root,
            &firn_output(tools),
            &[
                "--interpreted",
                "[ruby]",
                "--comm",
                "ruby3.1",
                "--chain",
                &CHAIN.join(","),
            ],
        ),
    }
}

/// chain.rb's frames as rbspy names them: methods without their class,
/// C functions unnamed. A sample holding these is whole by rbspy's own
/// standard.
const RBSPY_CHAIN: [&str; 8] = [
    "work",
    "block in inner",
    "(unknown) [c function]",
    "inner",
    "middle",
    "block in <main>",
    "(unknown) [c function]",
    "<main>",
];

/// (complete, total) samples of rbspy's collapsed output: one line per
/// stack, `outermost - file:line;…;innermost - file:line COUNT`, complete
/// when it is [`RBSPY_CHAIN`].
fn rbspy_complete(text: &str) -> (u64, u64) {
    crate::bench_python::collapsed_complete(text, " - ", &RBSPY_CHAIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbspy_stacks_are_counted() {
        let collapsed = "\
<main> - chain.rb:37;(unknown) [c function] - (unknown);block in <main> - chain.rb:37;middle - chain.rb:9;inner - chain.rb:13;(unknown) [c function] - (unknown);block in inner - chain.rb:12;work - chain.rb:24 97
<main> - chain.rb:37;(unknown) [c function] - (unknown);block in <main> - chain.rb:37;middle - chain.rb:9;inner - chain.rb:13;(unknown) [c function] - (unknown) 2
";
        assert_eq!(rbspy_complete(collapsed), (97, 99));
    }
}
