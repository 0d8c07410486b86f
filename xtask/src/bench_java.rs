//! `cargo xtask bench --java`: firn against async-profiler on a Java
//! workload (`tests/workloads/java/ChainBench.java`: Chain's chain in a
//! loop, warmed up until C2 has compiled and inlined it) under Debian's
//! JDK 17 and a Java 25, side by side: the share of the Java main thread's
//! samples holding the whole chain by name (inlined frames included), what
//! each profiler costs in CPU, how much it slows the workload, and firn's
//! CPU per sample of the JVM. Prints figures; asserts nothing.
//!
//! async-profiler runs inside the JVM: it is loaded at start
//! (`-agentpath`, so that it can ask for debug information at every pc
//! before C2 compiles) and started and stopped by `jcmd JVMTI.agent_load`
//! around the window, as its own launcher does; its CPU is the JVM's CPU
//! beyond what the JVM spends alone.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    bench::{BenchArgs, median, wait_with_usage},
    bench_python::probes::cpu_seconds,
    util::{self, cargo},
};

/// The chain's frames, innermost first.
const CHAIN: [&str; 4] = [
    "Chain.accumulate",
    "Chain.reconcile",
    "Chain.settle",
    "ChainBench.main",
];

/// Seconds the workload runs before it says it is ready (C2 compiles the
/// chain within 2 s of start).
const WARMUP_SECONDS: u64 = 5;
/// How long a profiler gets to settle before the window opens.
const SETTLE: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profiler {
    Firn,
    AsyncProfiler,
}

const PROFILERS: [Profiler; 2] = [Profiler::Firn, Profiler::AsyncProfiler];

impl Profiler {
    fn title(self) -> &'static str {
        match self {
            Self::Firn => "firn",
            Self::AsyncProfiler => "async-profiler",
        }
    }
}

/// What one run measured, over its window.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    rate: f64,
    /// The JVM's CPU seconds.
    jvm_cpu: f64,
    /// firn's CPU seconds (its threads' schedstat); 0 for the others.
    firn_cpu: f64,
    /// (complete, total) samples of the Java main thread.
    complete: (u64, u64),
    slowdown: f64,
}

pub(crate) struct Tools {
    pub root: PathBuf,
    pub firn: PathBuf,
    pub library: PathBuf,
    pub classes: PathBuf,
    pub work: PathBuf,
    /// JDK 17's jcmd: it attaches to a JDK 25 too.
    pub jcmd: PathBuf,
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
    let jdk17 = PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64");
    if !jdk17.join("bin/javac").exists() {
        bail!(
            "no JDK 17 at {}: `cargo xtask setup --packages-only` installs it",
            jdk17.display()
        );
    }
    let classes = work.join("java-classes");
    fs::create_dir_all(&classes)?;
    let sources = root.join("tests/workloads/java");
    util::run(
        Command::new(jdk17.join("bin/javac"))
            .arg("-d")
            .arg(&classes)
            .arg(sources.join("Chain.java"))
            .arg(sources.join("ChainBench.java"))
            .arg(sources.join("ChainWork.java")),
    )?;
    let tools = Tools {
        root: root.to_path_buf(),
        firn: firn.to_path_buf(),
        library: crate::setup::async_profiler()?,
        classes,
        work: work.to_path_buf(),
        jcmd: jdk17.join("bin/jcmd"),
    };
    let jvms = [
        ("JDK 17".to_owned(), jdk17.join("bin/java")),
        (
            "Java 25".to_owned(),
            crate::setup::jdk25_home()?.join("bin/java"),
        ),
    ];
    let mut per_sample = Vec::new();
    for (name, java) in &jvms {
        let firn = bench_jvm(&tools, name, java, args)?;
        let cost = crate::bench_java_cost::run(&tools, name, java, args)?;
        per_sample.push((name.clone(), firn, cost));
    }
    crate::bench_java_cost::print_summary(&per_sample);
    println!(
        "\nasync-profiler {}: loaded with -agentpath, started and stopped with jcmd around the\n\
         window (event=cpu, interval=1/frequency); its CPU is the JVM's beyond the JVM's alone\n\
         (median of the runs without a profiler), so it carries their noise. When the workload\n\
         keeps its threads busy, async-profiler's signal handler runs in their time and shows as\n\
         slowdown, not as CPU: its CPU column is then a lower bound, not its cost. firn's BPF time\n\
         is charged to the JVM too. Samples of the JVM: its CPU in the window x the frequency.",
        crate::setup::ASYNC_PROFILER_VERSION
    );
    Ok(())
}

/// Runs the rounds under one JVM; returns firn's CPU µs per JVM sample.
fn bench_jvm(tools: &Tools, name: &str, java: &Path, args: &BenchArgs) -> Result<f64> {
    println!(
        "\nJava bench: ChainBench under {name} ({}), C2, {} Hz, {} rounds x {} s; each profiler \
         run sits between two runs of the workload alone",
        java.display(),
        args.frequency,
        args.rounds,
        args.seconds
    );
    let first = measure(tools, java, None, args)?;
    let mut baselines = vec![first];
    let mut runs: Vec<(Profiler, Run)> = Vec::new();
    for round in 1..=args.rounds {
        let mut line = format!("  round {round}:");
        for profiler in PROFILERS {
            let mut run = measure(tools, java, Some(profiler), args)?;
            let after = measure(tools, java, None, args)?;
            let before = *baselines.last().context("a baseline ran first")?;
            baselines.push(after);
            run.slowdown = (1.0 - run.rate / ((before.rate + after.rate) / 2.0)) * 100.0;
            line.push_str(&format!(
                " {} {:+.2}%, JVM {:.2} CPU s |",
                profiler.title(),
                run.slowdown,
                run.jvm_cpu
            ));
            runs.push((profiler, run));
        }
        println!("{}", line.trim_end_matches(" |"));
    }
    Ok(print_table(&runs, &baselines, args))
}

/// Prints the table; returns firn's CPU µs per JVM sample.
fn print_table(runs: &[(Profiler, Run)], baselines: &[Run], args: &BenchArgs) -> f64 {
    let of = |profiler: Profiler| -> Vec<Run> {
        runs.iter()
            .filter(|(p, _)| *p == profiler)
            .map(|(_, run)| *run)
            .collect()
    };
    let (firn, ap) = (of(Profiler::Firn), of(Profiler::AsyncProfiler));
    let med = |runs: &[Run], value: &dyn Fn(&Run) -> f64| median(runs.iter().map(value));
    let alone_cpu = med(baselines, &|run| run.jvm_cpu);
    let share = |runs: &[Run]| {
        let (complete, total) = runs.iter().fold((0, 0), |(c, t), run| {
            (c + run.complete.0, t + run.complete.1)
        });
        format!(
            "{:.1}% of {total}",
            complete as f64 * 100.0 / total.max(1) as f64
        )
    };
    let firn_cpu = med(&firn, &|run| run.firn_cpu);
    let ap_cpu = med(&ap, &|run| run.jvm_cpu) - alone_cpu;
    let samples = |runs: &[Run]| med(runs, &|run| run.jvm_cpu) * args.frequency as f64;
    let row = |title: &str, firn: String, ap: String| {
        println!("{title:<40}{firn:>16}{ap:>24}");
    };
    println!();
    row("", "firn".into(), "async-profiler".into());
    println!(
        "{:<40}{:>16.1}",
        "iterations/s alone (median)",
        med(baselines, &|run| run.rate)
    );
    row(
        "iterations/s profiled (median)",
        format!("{:.1}", med(&firn, &|run| run.rate)),
        format!("{:.1}", med(&ap, &|run| run.rate)),
    );
    row(
        "workload slowdown (median)",
        format!("{:.2}%", med(&firn, &|run| run.slowdown)),
        format!("{:.2}%", med(&ap, &|run| run.slowdown)),
    );
    row(
        "whole chain, main thread (all rounds)",
        share(&firn),
        share(&ap),
    );
    println!("{:<40}{alone_cpu:>16.3}", "JVM CPU s alone (median)");
    row(
        "JVM CPU s profiled (median)",
        format!("{:.3}", med(&firn, &|run| run.jvm_cpu)),
        format!("{:.3}", med(&ap, &|run| run.jvm_cpu)),
    );
    row(
        "profiler CPU s in the window",
        format!("{firn_cpu:.3}"),
        format!("{ap_cpu:.3}"),
    );
    let firn_per_sample = firn_cpu * 1e6 / samples(&firn).max(1.0);
    row(
        "profiler CPU us per JVM sample",
        format!("{firn_per_sample:.1}"),
        format!("{:.1} (lower bound)", ap_cpu * 1e6 / samples(&ap).max(1.0)),
    );
    firn_per_sample
}

/// `command` (running `program`) with its stdin piped and its stdout's
/// lines on a channel, read by a thread of their own so that a wait for
/// one can time out.
pub fn spawn_talking(
    command: &mut Command,
    program: &Path,
) -> Result<(Child, ChildStdin, mpsc::Receiver<String>)> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {}", program.display()))?;
    let stdin = child.stdin.take().context("the workload's stdin")?;
    let stdout = child.stdout.take().context("the workload's stdout")?;
    let (sender, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    Ok((child, stdin, lines))
}

/// The workload, its stdin (a line asks for its progress) and its stdout's
/// lines.
struct Workload {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Workload {
    fn start(tools: &Tools, java: &Path, agent: bool) -> Result<Self> {
        let mut command = Command::new(java);
        match agent {
            true => command.arg(format!("-agentpath:{}", tools.library.display())),
            // async-profiler loaded at start turns DebugNonSafepoints on
            // (C2 then records the scopes of every pc, not only of its
            // safepoints); the other JVMs get it too, so that both
            // profilers name frames from the same debug information.
            // Without it a pc between two safepoints takes the next one's
            // scopes, as HotSpot's own lookup does: a sample in
            // accumulate's loop may name reconcile as the leaf (firn's
            // whole-chain share about 0.15 points lower on this chain).
            false => command.args(["-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"]),
        };
        command
            .arg("-cp")
            .arg(&tools.classes)
            .args(["ChainBench", &WARMUP_SECONDS.to_string()]);
        let (child, stdin, lines) = spawn_talking(&mut command, java)?;
        let workload = Self {
            child,
            stdin,
            lines,
        };
        let wait = Duration::from_secs(WARMUP_SECONDS + 60);
        loop {
            match workload.lines.recv_timeout(wait) {
                Ok(line) if line == "ready" => return Ok(workload),
                // async-profiler says hello on stdout.
                Ok(_) => {}
                Err(error) => bail!("the Java workload did not start: {error}"),
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (iterations, seconds) so far.
    fn progress(&mut self) -> Result<(f64, f64)> {
        self.stdin.write_all(b"\n")?;
        self.stdin.flush()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|field| field.strip_prefix(name)?.parse::<f64>().ok())
            };
            if let (Some(iterations), Some(seconds)) = (field("iterations="), field("seconds=")) {
                return Ok((iterations, seconds));
            }
        }
        bail!("the Java workload did not report its progress")
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn firn_output(tools: &Tools) -> PathBuf {
    tools.work.join("java-firn.pb.gz")
}

fn async_profiler_output(tools: &Tools) -> PathBuf {
    tools.work.join("java-async-profiler.txt")
}

/// `jcmd PID JVMTI.agent_load LIBRARY "OPTIONS"`: async-profiler's
/// command (quoted, or jcmd's parser takes `start,event=cpu` for an option
/// of its own). jcmd exits 0 whatever the agent answers: the answer is in
/// its output.
pub(crate) fn async_profiler_command(tools: &Tools, pid: u32, options: &str) -> Result<()> {
    let output = Command::new(&tools.jcmd)
        .arg(pid.to_string())
        .arg("JVMTI.agent_load")
        .arg(&tools.library)
        .arg(format!("\"{options}\""))
        .output()
        .context("could not run jcmd")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || !text.contains("return code: 0") {
        bail!(
            "async-profiler's {options} failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    Ok(())
}

fn measure(
    tools: &Tools,
    java: &Path,
    profiler: Option<Profiler>,
    args: &BenchArgs,
) -> Result<Run> {
    let mut workload = Workload::start(tools, java, profiler == Some(Profiler::AsyncProfiler))?;
    let pid = workload.pid();
    let interval_ms = (1000 / args.frequency.max(1)).max(1);
    let mut firn = None;
    match profiler {
        Some(Profiler::Firn) => firn = Some(start_firn(tools, pid, args)?),
        Some(Profiler::AsyncProfiler) => async_profiler_command(
            tools,
            pid,
            &format!("start,event=cpu,interval={interval_ms}ms,threads"),
        )?,
        None => {}
    }
    thread::sleep(SETTLE);
    let firn_pid = firn.as_ref().map(Child::id);
    let firn_cpu = || firn_pid.map_or(Ok(0.0), cpu_seconds);
    let (start_iterations, start_seconds) = workload.progress()?;
    let (start_jvm, start_firn) = (cpu_seconds(pid)?, firn_cpu()?);
    thread::sleep(Duration::from_secs(args.seconds));
    let (end_iterations, end_seconds) = workload.progress()?;
    let (end_jvm, end_firn) = (cpu_seconds(pid)?, firn_cpu()?);
    let mut run = Run {
        rate: (end_iterations - start_iterations) / (end_seconds - start_seconds),
        jvm_cpu: end_jvm - start_jvm,
        firn_cpu: end_firn - start_firn,
        ..Run::default()
    };
    match profiler {
        Some(Profiler::Firn) => {
            let mut child = firn.context("firn started")?;
            let (status, _) = wait_with_usage(&mut child)?;
            if !status.success() {
                bail!("firn failed ({status}); see {}", tools.work.display());
            }
            run.complete = crate::bench_unwind::firn_share(
                &tools.root,
                &firn_output(tools),
                &[
                    "--comm",
                    "java",
                    "--within",
                    "JavaMain",
                    "--chain",
                    &CHAIN.join(","),
                ],
            )?;
        }
        Some(Profiler::AsyncProfiler) => {
            let output = async_profiler_output(tools);
            async_profiler_command(
                tools,
                pid,
                &format!("stop,file={},collapsed", output.display()),
            )?;
            let text = fs::read_to_string(&output)
                .with_context(|| format!("async-profiler wrote no {}", output.display()))?;
            run.complete = collapsed_complete(&text);
        }
        None => {}
    }
    Ok(run)
}

/// firn recording the JVM until the window has closed, once it samples.
fn start_firn(tools: &Tools, pid: u32, args: &BenchArgs) -> Result<Child> {
    crate::bench::start_firn(
        &tools.firn,
        pid,
        args,
        args.seconds + SETTLE.as_secs() + 3,
        &firn_output(tools),
        &tools.work.join("java-firn.log"),
        &[],
    )
}

/// (complete, total) samples of the Java main thread in async-profiler's
/// collapsed output with `threads`: `[main tid=N];outer;…;inner COUNT`,
/// frames annotated `_[j]`, `_[i]`, `_[0]` by kind when asked to.
fn collapsed_complete(text: &str) -> (u64, u64) {
    let (mut complete, mut total) = (0, 0);
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        let mut frames = stack.split(';');
        if !frames
            .next()
            .is_some_and(|thread| thread.starts_with("[main "))
        {
            continue;
        }
        total += count;
        let names: Vec<&str> = frames
            .rev()
            .map(|frame| {
                frame
                    .strip_suffix("_[j]")
                    .or_else(|| frame.strip_suffix("_[i]"))
                    .or_else(|| frame.strip_suffix("_[0]"))
                    .unwrap_or(frame)
            })
            .collect();
        if names.windows(CHAIN.len()).any(|window| window == CHAIN) {
            complete += count;
        }
    }
    (complete, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapsed_stacks_are_counted() {
        let text = "\
[main tid=7];ChainBench.main;Chain.settle;Chain.reconcile;Chain.accumulate 90
[main tid=7];ChainBench.main;Chain.settle;Chain.reconcile_[i];Chain.accumulate_[i] 5
[main tid=7];ChainBench.main;Chain.settle;Chain.accumulate 3
[main tid=7];ChainBench.main;Chain.settle 1
[C2 CompilerThread0 tid=9];thread_native_entry;Compile::Compile 40
";
        assert_eq!(collapsed_complete(text), (95, 99));
    }
}
