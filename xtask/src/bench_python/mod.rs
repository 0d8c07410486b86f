//! `cargo xtask bench --python`: firn against py-spy on a Python workload
//! (`tests/workloads/python/chain.py`) under Debian's python3.11 and a
//! pyenv 3.12, side by side: what each profiler costs in CPU, how much it
//! slows the workload, how many of its samples hold the whole Python chain,
//! and what firn's BPF program spends per sample with its Python walker and
//! without (`--python=false`). Prints figures; asserts nothing.

pub(crate) mod probes;

use std::{
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use probes::{Snapshot, Workload, sampling_programs};

use crate::{
    bench::{BenchArgs, median, wait_with_usage},
    util::{self, cargo},
};

/// chain.py's Python frames, innermost first.
const CHAIN: [&str; 5] = ["crunch", "stage_c", "stage_b", "stage_a", "<module>"];

/// The profilers compared, in the order each round runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profiler {
    Firn,
    FirnNoPython,
    PySpy,
}

const PROFILERS: [Profiler; 3] = [Profiler::Firn, Profiler::FirnNoPython, Profiler::PySpy];

impl Profiler {
    /// Its log's name in the bench's directory.
    fn log_name(self) -> &'static str {
        match self {
            Self::Firn => "python-firn.log",
            Self::FirnNoPython => "python-firn-no-python.log",
            Self::PySpy => "python-py-spy.log",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::Firn => "firn",
            Self::FirnNoPython => "--python=false",
            Self::PySpy => "py-spy",
        }
    }
}

/// What one profiled run measured.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    /// The workload's iterations per second over the measured window.
    rate: f64,
    /// The profiler's CPU seconds over the window (its threads' schedstat).
    window_cpu: f64,
    /// The profiler's CPU seconds from start to exit, start-up and output
    /// included.
    total_cpu: f64,
    /// Samples whose Python stack is the whole chain, of all samples.
    complete: (u64, u64),
    /// firn only: BPF run time over the window per sample of the workload.
    bpf_ns_per_sample: Option<f64>,
    /// firn only: BPF run time over the window per run of the program, on
    /// every tick of every CPU (most of them for other processes, which it
    /// leaves at once).
    bpf_ns_per_run: Option<f64>,
    /// Throughput lost against the runs alone just before and after, in
    /// percent.
    slowdown: f64,
}

/// One interpreter the bench runs the workload under.
struct Interpreter {
    name: String,
    path: PathBuf,
}

pub fn run(root: &Path, firn: &Path, work: &Path, args: &BenchArgs) -> Result<()> {
    util::run(cargo(root).args([
        "build",
        "--release",
        "--package",
        "firn",
        "--example",
        "unwind_bench",
    ]))?;
    let py_spy = crate::setup::tools_venv().join("bin/py-spy");
    if !py_spy.exists() {
        bail!(
            "{} is missing: `cargo xtask setup` installs it",
            py_spy.display()
        );
    }
    let tools = Tools {
        root: root.to_path_buf(),
        firn: firn.to_path_buf(),
        py_spy,
        script: root.join("tests/workloads/python/chain.py"),
        work: work.to_path_buf(),
    };
    for interpreter in interpreters()? {
        bench_interpreter(&tools, &interpreter, args)?;
    }
    println!(
        "\nCPU in the window: the profilers' steady cost while sampling; the whole run adds\n\
         start-up (firn: BPF verification, kallsyms) and output (symbolizing, writing).\n\
         py-spy pauses the process for each sample (its default, blocking mode): that shows\n\
         in the slowdown. firn's BPF time is charged to the workload and shows there too."
    );
    Ok(())
}

/// What every measurement needs.
struct Tools {
    root: PathBuf,
    firn: PathBuf,
    py_spy: PathBuf,
    script: PathBuf,
    work: PathBuf,
}

/// Debian's python3.11 and pyenv's newest 3.12, those present.
fn interpreters() -> Result<Vec<Interpreter>> {
    let mut found = Vec::new();
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.exists() {
        found.push(Interpreter {
            name: "Debian 3.11".into(),
            path: debian,
        });
    } else {
        println!("note: no Debian python3.11 (`cargo xtask setup` installs it)");
    }
    let pyenv = std::env::var_os("PYENV_ROOT").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".pyenv")
        },
        PathBuf::from,
    );
    let mut builds: Vec<(u32, PathBuf)> = fs::read_dir(pyenv.join("versions"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let patch = entry
                .file_name()
                .to_str()?
                .strip_prefix("3.12.")?
                .parse()
                .ok()?;
            let binary = entry.path().join("bin/python3.12");
            binary.exists().then_some((patch, binary))
        })
        .collect();
    builds.sort();
    match builds.pop() {
        Some((patch, path)) => found.push(Interpreter {
            name: format!("pyenv 3.12.{patch}"),
            path,
        }),
        None => println!("note: no pyenv 3.12 under {}", pyenv.display()),
    }
    if found.is_empty() {
        bail!("no Python to run the workload under");
    }
    Ok(found)
}

fn bench_interpreter(tools: &Tools, interpreter: &Interpreter, args: &BenchArgs) -> Result<()> {
    println!(
        "\nPython bench: chain.py under {} ({}), {} Hz, {} rounds x {} s; each profiler run \
         sits between two runs of the workload alone",
        interpreter.name,
        interpreter.path.display(),
        args.frequency,
        args.rounds,
        args.seconds
    );
    let mut baselines = vec![measure(tools, interpreter, None, args)?.rate];
    let mut runs: Vec<(Profiler, Run)> = Vec::new();
    for round in 1..=args.rounds {
        let mut line = format!("  round {round}:");
        for profiler in PROFILERS {
            let mut run = measure(tools, interpreter, Some(profiler), args)?;
            let after = measure(tools, interpreter, None, args)?.rate;
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
    print_table(&runs, median(baselines.iter().copied()));
    Ok(())
}

/// The rounds' runs of one profiler, as one column of the table.
struct Column(Vec<Run>);

impl Column {
    fn median(&self, value: impl Fn(&Run) -> f64) -> f64 {
        median(self.0.iter().map(value))
    }

    /// The median of a BPF figure, over the runs that have it (firn's).
    fn bpf_ns(&self, value: impl Fn(&Run) -> Option<f64>) -> Option<f64> {
        let values: Vec<f64> = self.0.iter().filter_map(value).collect();
        (!values.is_empty()).then(|| median(values.into_iter()))
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

fn print_table(runs: &[(Profiler, Run)], baseline: f64) {
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
    row("CPU s, whole run (median)", &|c| {
        format!("{:.3}", c.median(|run| run.total_cpu))
    });
    row("whole Python chain (all rounds)", &Column::complete);
    let per_sample = |run: &Run| run.bpf_ns_per_sample;
    row("BPF ns per run, every tick (median)", &|c| {
        c.bpf_ns(|run| run.bpf_ns_per_run)
            .map_or("n/a".into(), |ns| format!("{ns:.0}"))
    });
    row("BPF ns per workload sample (median)", &|c| {
        c.bpf_ns(per_sample)
            .map_or("n/a".into(), |ns| format!("{ns:.0}"))
    });
    if let (Some(on), Some(off)) = (columns[0].bpf_ns(per_sample), columns[1].bpf_ns(per_sample)) {
        println!("{:<38}{:>16.0}", "  of which the Python walker", on - off);
    }
    let window = |column: &Column| column.median(|run| run.window_cpu);
    println!(
        "{:<38}{:>16.2}",
        "CPU ratio firn / py-spy (window)",
        window(&columns[0]) / window(&columns[2]).max(f64::EPSILON)
    );
}

/// How long a profiler gets to attach before the window opens, and the
/// margin its own duration leaves after the window closes.
const SETTLE: Duration = Duration::from_secs(1);
const MARGIN_SECONDS: u64 = 3;

/// Runs the workload, profiled by `profiler` (or alone), and measures it
/// over a window of `args.seconds` once the profiler samples.
fn measure(
    tools: &Tools,
    interpreter: &Interpreter,
    profiler: Option<Profiler>,
    args: &BenchArgs,
) -> Result<Run> {
    let workload = Workload::start(&interpreter.path, &tools.script)?;
    let programs_before = sampling_programs();
    let mut child = match profiler {
        None => None,
        Some(profiler) => Some(start_profiler(tools, profiler, workload.pid(), args)?),
    };
    // The sampling program loaded since is firn's (bpftool here cannot say
    // which process holds a program).
    let program = match profiler {
        Some(Profiler::Firn | Profiler::FirnNoPython) => sampling_programs()
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
        ..Run::default()
    };
    if let (Some((start_ns, start_runs)), Some((end_ns, end_runs))) = (start.bpf, end.bpf) {
        // The workload is one busy thread: its samples follow from its CPU.
        let samples = (end.workload_cpu - start.workload_cpu) * args.frequency as f64;
        let nanoseconds = end_ns.saturating_sub(start_ns) as f64;
        run.bpf_ns_per_sample = Some(nanoseconds / samples.max(1.0));
        run.bpf_ns_per_run = Some(nanoseconds / end_runs.saturating_sub(start_runs).max(1) as f64);
    }
    if let (Some(child), Some(profiler)) = (child.as_mut(), profiler) {
        let (status, (cpu, _)) = wait_with_usage(child)?;
        if !status.success() {
            bail!(
                "{} failed ({status}); see {}",
                profiler.title(),
                tools.work.display()
            );
        }
        run.total_cpu = cpu;
        run.complete = complete_share(tools, profiler, interpreter)?;
    }
    workload.stop()?;
    Ok(run)
}

fn firn_output(tools: &Tools) -> PathBuf {
    tools.work.join("python-firn.pb.gz")
}

fn py_spy_output(tools: &Tools) -> PathBuf {
    tools.work.join("python-py-spy.txt")
}

/// Starts `profiler` on `pid` and waits until it samples.
fn start_profiler(tools: &Tools, profiler: Profiler, pid: u32, args: &BenchArgs) -> Result<Child> {
    let duration = args.seconds + SETTLE.as_secs() + MARGIN_SECONDS;
    let log = tools.work.join(profiler.log_name());
    let (mut command, ready) = match profiler {
        Profiler::Firn | Profiler::FirnNoPython => {
            let mut command = Command::new(&tools.firn);
            command
                .args(["record", "--pid", &pid.to_string(), "--frequency"])
                .arg(args.frequency.to_string())
                .arg("--duration")
                .arg(format!("{duration}s"))
                .arg("--output")
                .arg(firn_output(tools))
                .arg(format!("--python={}", profiler == Profiler::Firn));
            (command, "recording")
        }
        Profiler::PySpy => {
            let mut command = Command::new(&tools.py_spy);
            command
                .args(["record", "--pid", &pid.to_string(), "--rate"])
                .arg(args.frequency.to_string())
                .args(["--format", "raw", "--duration"])
                .arg(duration.to_string())
                .arg("--output")
                .arg(py_spy_output(tools));
            (command, "Sampling process")
        }
    };
    // firn logs to stderr, py-spy talks on stdout: one log for both.
    let output = File::create(&log)?;
    let child = command
        .stdout(output.try_clone()?)
        .stderr(output)
        .spawn()
        .with_context(|| format!("could not start {}", profiler.title()))?;
    // firn verifies its BPF program first: tens of seconds on a busy machine.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !fs::read_to_string(&log).unwrap_or_default().contains(ready) {
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

/// The share of samples whose Python frames are exactly [`CHAIN`].
fn complete_share(
    tools: &Tools,
    profiler: Profiler,
    interpreter: &Interpreter,
) -> Result<(u64, u64)> {
    match profiler {
        Profiler::PySpy => {
            let text = fs::read_to_string(py_spy_output(tools))?;
            Ok(py_spy_complete(&text))
        }
        Profiler::Firn | Profiler::FirnNoPython => {
            let comm = interpreter
                .path
                .file_name()
                .and_then(|name| name.to_str())
                .context("the interpreter's file name")?;
            crate::bench_unwind::firn_share(
                &tools.root,
                &firn_output(tools),
                &[
                    "--interpreted",
                    "[python]",
                    "--comm",
                    comm,
                    "--chain",
                    &CHAIN.join(","),
                ],
            )
        }
    }
}

/// (complete, total) samples of py-spy's raw output: one line per stack,
/// `outermost (file:line);…;innermost (file:line) COUNT`.
fn py_spy_complete(text: &str) -> (u64, u64) {
    collapsed_complete(text, " (", &CHAIN)
}

/// (complete, total) samples of a profiler's collapsed stacks, one line
/// per stack, `outermost;…;innermost COUNT`, each frame's name ending
/// where `name_end` starts: complete when the names, innermost first, are
/// `chain`.
pub(crate) fn collapsed_complete(text: &str, name_end: &str, chain: &[&str]) -> (u64, u64) {
    let (mut complete, mut total) = (0, 0);
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        total += count;
        let names: Vec<&str> = stack
            .split(';')
            .rev()
            .map(|frame| frame.split(name_end).next().unwrap_or(frame))
            .collect();
        if names == chain {
            complete += count;
        }
    }
    (complete, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn py_spy_stacks_are_counted() {
        let raw = "\
<module> (chain.py:59);stage_a (chain.py:36);stage_b (chain.py:32);stage_c (chain.py:28);crunch (chain.py:23) 156
<module> (chain.py:59);stage_a (chain.py:36);stage_b (chain.py:32);stage_c (chain.py:28);crunch (chain.py:22) 43
<module> (chain.py:59);stage_a (chain.py:36);stage_b (chain.py:32) 2
<module> (chain.py:59);report (chain.py:41) 1
";
        assert_eq!(py_spy_complete(raw), (199, 202));
    }
}
