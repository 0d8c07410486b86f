//! `cargo xtask bench --node`: firn against V8's own profiler on a Node
//! workload (`tests/workloads/node/chain.js` in its `bench` mode: the
//! chain `main → settle → reconcile → accumulate` in a loop, default
//! flags, so TurboFan compiles and inlines it) under Node 22 and Debian's
//! Node 20, side by side with `--perf-basic-prof` + firn (`--nodejs=false`,
//! V8's perf map naming the code): the share of the main thread's samples
//! holding the whole chain, each function's self share (the innermost
//! JavaScript frame) for V8's ten hottest, what each profiler costs in CPU
//! and how much it slows the workload. Prints figures; asserts nothing.
//!
//! The shares are compared on one process profiled by both firn and V8's
//! profiler (a run of its own each round), V8's samples kept within the
//! span firn recorded: TurboFan's
//! choices (what it inlines, when) differ from one process to the next and
//! move the self shares by more than the profilers differ. The costs come
//! from runs with one profiler each.
//!
//! V8's profiler (`--cpu-prof --cpu-prof-interval`) runs inside the
//! process from its start and writes its `.cpuprofile` when the process
//! exits, so that run lives for a set time; its samples are kept within the
//! window by their timestamps (CLOCK_MONOTONIC, which the workload's
//! progress lines carry too). Its CPU is the process's beyond the process's
//! alone (median of the runs without a profiler), so it carries their
//! noise.

use std::{
    collections::{BTreeMap, HashMap},
    fs::{self, File},
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use agent_pprof::Reader;
use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{
    bench::{BenchArgs, median, start_firn, wait_with_usage},
    bench_python::probes::cpu_seconds,
};

/// The chain's JavaScript frames, innermost first.
const CHAIN: [&str; 4] = ["accumulate", "reconcile", "settle", "main"];

/// How long the workload runs before a profiler attaches (TurboFan has
/// compiled the chain within a second of start).
const WARMUP: Duration = Duration::from_secs(3);
/// How long a profiler gets to settle before the window opens.
const SETTLE: Duration = Duration::from_secs(1);
/// Self shares listed: V8's hottest functions.
const TOP: usize = 10;
/// The self share's key of a sample without a JavaScript frame.
const NO_JAVASCRIPT: &str = "(no JavaScript)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profiler {
    Firn,
    CpuProf,
    PerfMap,
    /// firn and V8's profiler on one process, for the shares.
    Both,
}

/// Each round's runs, in order; the first three are the cost columns.
const PROFILERS: [Profiler; 4] = [
    Profiler::Firn,
    Profiler::CpuProf,
    Profiler::PerfMap,
    Profiler::Both,
];

impl Profiler {
    fn title(self) -> &'static str {
        match self {
            Self::Firn => "firn",
            Self::CpuProf => "--cpu-prof",
            Self::PerfMap => "perf map + firn",
            Self::Both => "firn & --cpu-prof",
        }
    }
}

/// Samples of the main thread: how many, how many hold the whole chain,
/// and by innermost JavaScript function.
#[derive(Clone, Debug, Default)]
struct Tally {
    total: u64,
    complete: u64,
    selves: BTreeMap<String, u64>,
}

impl Tally {
    /// One sample (`count` of them) whose JavaScript frames, innermost
    /// first, are `js`; `outside`: what it ran outside JavaScript, when
    /// it holds no JavaScript frame.
    fn add(&mut self, js: &[String], outside: &str, count: u64) {
        self.total += count;
        if holds_chain(js) {
            self.complete += count;
        }
        let key = js.first().map_or(outside, String::as_str);
        *self.selves.entry(key.to_owned()).or_default() += count;
    }

    fn merge(&mut self, other: &Tally) {
        self.total += other.total;
        self.complete += other.complete;
        for (name, count) in &other.selves {
            *self.selves.entry(name.clone()).or_default() += count;
        }
    }

    /// The share holding the chain, and of how many.
    fn chain(&self) -> String {
        format!(
            "{:.1}% of {}",
            self.complete as f64 * 100.0 / self.total.max(1) as f64,
            self.total
        )
    }

    fn share(&self, name: &str) -> f64 {
        self.selves.get(name).copied().unwrap_or(0) as f64 * 100.0 / self.total.max(1) as f64
    }
}

/// Whether a sample's JavaScript frames (innermost first) up to `main` are
/// the chain's outer part in order: `[settle, main]`, `[reconcile,
/// settle, main]` or the whole. A callee TurboFan inlined has no frame in
/// V8's profile (it shows `settle` at the top of most samples busy in
/// accumulate's loop), nor among firn's frames compared (its inlined
/// frames are left out): a frame missing at the top is not wrong; a
/// frame missing or wrong in the middle, or a wrong leaf, is.
fn holds_chain(js: &[String]) -> bool {
    let Some(main) = js.iter().position(|name| name == "main") else {
        return false;
    };
    main < CHAIN.len()
        && js[..=main]
            .iter()
            .zip(&CHAIN[CHAIN.len() - 1 - main..])
            .all(|(name, want)| name == want)
}

/// What one run measured, over its window.
#[derive(Clone, Debug, Default)]
struct Run {
    rate: f64,
    /// The Node process's CPU seconds.
    node_cpu: f64,
    /// firn's CPU seconds (its threads' schedstat); 0 for V8's profiler.
    firn_cpu: f64,
    slowdown: f64,
    tally: Tally,
    /// V8's own, in a run with both profilers.
    v8_tally: Tally,
}

struct Tools {
    firn: PathBuf,
    script: PathBuf,
    work: PathBuf,
}

pub fn run(root: &Path, firn: &Path, work: &Path, args: &BenchArgs) -> Result<()> {
    let tools = Tools {
        firn: firn.to_path_buf(),
        script: root.join("tests/workloads/node/chain.js"),
        work: work.to_path_buf(),
    };
    let mut nodes = Vec::new();
    if let Some((_, version)) = crate::setup::NODE_RELEASES
        .iter()
        .find(|(var, _)| *var == "FIRN_NODE_22")
    {
        nodes.push((format!("Node {version}"), crate::setup::node_path(version)));
    }
    nodes.push((
        "Debian's Node 20".to_owned(),
        PathBuf::from("/usr/bin/node"),
    ));
    for (name, node) in &nodes {
        if !node.is_file() {
            bail!(
                "no {name} at {}: `cargo xtask setup` installs it",
                node.display()
            );
        }
        bench_node(&tools, name, node, args)?;
    }
    println!(
        "\nWhole chain: the sample's JavaScript frames up to main are settle <- main,\n\
         reconcile <- settle <- main or the whole chain (TurboFan inlines accumulate, often\n\
         reconcile too; V8's --cpu-prof does not show inlined frames, firn shows them in its\n\
         [javascript:inlined] mapping, left out here to compare the same). Self share: the\n\
         sample's innermost JavaScript function; firn's main thread is its samples under\n\
         node::Start. --cpu-prof's CPU is the process's beyond the process's alone, so it\n\
         carries their noise; firn's BPF time is charged to the workload and shows as slowdown."
    );
    Ok(())
}

fn bench_node(tools: &Tools, name: &str, node: &Path, args: &BenchArgs) -> Result<()> {
    println!(
        "\nNode bench: chain.js under {name} ({}), default flags, {} Hz, {} rounds x {} s; each \
         profiler run sits between two runs of the workload alone",
        node.display(),
        args.frequency,
        args.rounds,
        args.seconds
    );
    let first = measure(tools, node, None, args)?;
    let mut baselines = vec![first];
    let mut runs: Vec<(Profiler, Run)> = Vec::new();
    for round in 1..=args.rounds {
        let mut line = format!("  round {round}:");
        for profiler in PROFILERS {
            let mut run = measure(tools, node, Some(profiler), args)?;
            let after = measure(tools, node, None, args)?;
            let before = baselines.last().context("a baseline ran first")?;
            run.slowdown = (1.0 - run.rate / ((before.rate + after.rate) / 2.0)) * 100.0;
            baselines.push(after);
            line.push_str(&format!(
                " {} {:+.2}%, chain {}/{} |",
                profiler.title(),
                run.slowdown,
                run.tally.complete,
                run.tally.total
            ));
            runs.push((profiler, run));
        }
        println!("{}", line.trim_end_matches(" |"));
    }
    print_table(&runs, &baselines);
    Ok(())
}

fn print_table(runs: &[(Profiler, Run)], baselines: &[Run]) {
    let of = |profiler: Profiler| -> Vec<&Run> {
        runs.iter()
            .filter(|(p, _)| *p == profiler)
            .map(|(_, run)| run)
            .collect()
    };
    let columns: Vec<Vec<&Run>> = PROFILERS.iter().map(|p| of(*p)).collect();
    let med = |runs: &[&Run], value: &dyn Fn(&Run) -> f64| median(runs.iter().map(|r| value(r)));
    let alone_cpu = median(baselines.iter().map(|run| run.node_cpu));
    let merged = |runs: &[&Run], tally: &dyn Fn(&Run) -> &Tally| {
        runs.iter().fold(Tally::default(), |mut all, run| {
            all.merge(tally(run));
            all
        })
    };
    let tallies: Vec<Tally> = columns
        .iter()
        .map(|runs| merged(runs, &|run| &run.tally))
        .collect();
    let row = |title: &str, cells: [String; 3]| {
        println!(
            "{title:<40}{:>14}{:>14}{:>18}",
            cells[0], cells[1], cells[2]
        );
    };
    let each = |cell: &dyn Fn(usize) -> String| [cell(0), cell(1), cell(2)];
    println!();
    row("", each(&|at| PROFILERS[at].title().to_owned()));
    println!(
        "{:<40}{:>14.1}",
        "iterations/s alone (median)",
        median(baselines.iter().map(|run| run.rate))
    );
    row(
        "iterations/s profiled (median)",
        each(&|at| format!("{:.1}", med(&columns[at], &|run| run.rate))),
    );
    row(
        "workload slowdown (median)",
        each(&|at| format!("{:.2}%", med(&columns[at], &|run| run.slowdown))),
    );
    row(
        "whole chain, main thread (all rounds)",
        each(&|at| tallies[at].chain()),
    );
    println!("{:<40}{alone_cpu:>14.3}", "node CPU s alone (median)");
    row(
        "node CPU s profiled (median)",
        each(&|at| format!("{:.3}", med(&columns[at], &|run| run.node_cpu))),
    );
    row(
        "profiler CPU s in the window (median)",
        each(&|at| {
            let cpu = match PROFILERS[at] {
                Profiler::CpuProf => med(&columns[at], &|run| run.node_cpu) - alone_cpu,
                _ => med(&columns[at], &|run| run.firn_cpu),
            };
            format!("{cpu:.3}")
        }),
    );
    print_shares(&columns[3], &tallies[2]);
}

/// The shares, firn's and V8's from the same processes and windows (the
/// runs with both), beside the perf map's from its own runs.
fn print_shares(both: &[&Run], perf_map: &Tally) {
    let merged = |tally: &dyn Fn(&Run) -> &Tally| {
        both.iter().fold(Tally::default(), |mut all, run| {
            all.merge(tally(run));
            all
        })
    };
    let (firn, v8) = (merged(&|run| &run.tally), merged(&|run| &run.v8_tally));
    println!(
        "\none process under firn and --cpu-prof at once (all rounds), perf map + firn from its own runs"
    );
    println!(
        "{:<40}{:>14}{:>14}{:>18}",
        "whole chain, main thread",
        firn.chain(),
        v8.chain(),
        perf_map.chain()
    );
    let mut hottest: Vec<(&String, &u64)> = v8.selves.iter().collect();
    hottest.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    println!(
        "self share, V8's {TOP} hottest\n{:<40}{:>14}{:>14}{:>18}{:>12}",
        "function", "firn", "--cpu-prof", "perf map + firn", "firn - V8"
    );
    for (name, _) in hottest.into_iter().take(TOP) {
        let [firn, v8, perf_map] = [&firn, &v8, perf_map].map(|tally| tally.share(name));
        println!(
            "{:<40}{firn:>13.1}%{v8:>13.1}%{perf_map:>17.1}%{:>+12.1}",
            name.chars().take(39).collect::<String>(),
            firn - v8
        );
    }
}

/// The workload's progress: iterations of the chain so far, at a time of
/// CLOCK_MONOTONIC in microseconds.
#[derive(Clone, Copy, Debug)]
struct Progress {
    iterations: f64,
    clock_us: f64,
}

impl Progress {
    fn parse(line: &str) -> Option<Self> {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|field| field.strip_prefix(name)?.parse::<f64>().ok())
        };
        Some(Self {
            iterations: field("iterations=")?,
            clock_us: field("clock_us=")?,
        })
    }
}

/// chain.js in its bench mode, its progress lines read as they come.
struct Workload {
    child: Child,
    progress: mpsc::Receiver<Progress>,
    perf_map: bool,
}

impl Workload {
    /// `node FLAGS chain.js 0 bench`, once it has warmed up; it returns
    /// once `stop` exists.
    fn start(tools: &Tools, node: &Path, flags: &[String], stop: &Path) -> Result<Self> {
        let log = tools.work.join("node-workload.log");
        // V8 writes an isolate-*.log beside it with --perf-basic-prof.
        let mut child = Command::new(node)
            .current_dir(&tools.work)
            .args(flags)
            .arg(&tools.script)
            .args(["0", "bench"])
            .env("FIRN_BENCH_STOP", stop)
            .stdout(Stdio::piped())
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("could not start {}", node.display()))?;
        let stdout = child.stdout.take().context("the workload's stdout")?;
        let (sender, progress) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(progress) = Progress::parse(&line)
                    && sender.send(progress).is_err()
                {
                    return;
                }
            }
        });
        let mut workload = Self {
            child,
            progress,
            perf_map: flags.iter().any(|flag| flag == "--perf-basic-prof"),
        };
        let first = workload.progress()?;
        while workload.progress()?.clock_us - first.clock_us < WARMUP.as_micros() as f64 {}
        Ok(workload)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next progress line (at most 100 ms away), those before it
    /// dropped.
    fn progress(&mut self) -> Result<Progress> {
        while self.progress.try_recv().is_ok() {}
        self.progress
            .recv_timeout(Duration::from_secs(10))
            .context("the Node workload stopped reporting its progress (see node-workload.log)")
    }

    /// Waits for the workload to exit by itself (once told to stop).
    fn wait(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("the Node workload did not exit in time");
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let pid = self.child.id();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.perf_map {
            let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
        }
    }
}

fn measure(
    tools: &Tools,
    node: &Path,
    profiler: Option<Profiler>,
    args: &BenchArgs,
) -> Result<Run> {
    let cpu_prof = tools.work.join("node-cpuprof/bench.cpuprofile");
    let (flags, cpu_profiled) = match profiler {
        Some(Profiler::CpuProf | Profiler::Both) => {
            let _ = fs::remove_file(&cpu_prof);
            (cpu_prof_flags(&cpu_prof, args), true)
        }
        Some(Profiler::PerfMap) => (vec!["--perf-basic-prof".to_owned()], false),
        _ => (Vec::new(), false),
    };
    let stop = tools.work.join("node-bench.stop");
    let _ = fs::remove_file(&stop);
    let mut workload = Workload::start(tools, node, &flags, &stop)?;
    let pid = workload.pid();
    let (output, log) = (
        tools.work.join("node-firn.pb.gz"),
        tools.work.join("node-firn.log"),
    );
    let extra: &[&str] = match profiler {
        Some(Profiler::PerfMap) => &["--nodejs=false"],
        _ => &[],
    };
    let mut firn = match profiler {
        Some(Profiler::Firn | Profiler::PerfMap | Profiler::Both) => Some(start_firn(
            &tools.firn,
            pid,
            args,
            args.seconds + SETTLE.as_secs() + 3,
            &output,
            &log,
            extra,
        )?),
        _ => None,
    };
    // firn samples from here until it exits: with both profilers, V8's
    // samples of that span are the ones compared.
    let firn_began = workload.progress()?.clock_us;
    thread::sleep(SETTLE);
    let firn_pid = firn.as_ref().map(Child::id);
    let firn_cpu = || firn_pid.map_or(Ok(0.0), cpu_seconds);
    let start = workload.progress()?;
    let (start_node, start_firn) = (cpu_seconds(pid)?, firn_cpu()?);
    thread::sleep(Duration::from_secs(args.seconds));
    let end = workload.progress()?;
    let (end_node, end_firn) = (cpu_seconds(pid)?, firn_cpu()?);
    let mut run = Run {
        rate: (end.iterations - start.iterations) * 1e6 / (end.clock_us - start.clock_us),
        node_cpu: end_node - start_node,
        firn_cpu: end_firn - start_firn,
        ..Run::default()
    };
    let mut firn_ended = end.clock_us;
    if let Some(child) = firn.as_mut() {
        let (status, _) = wait_with_usage(child)?;
        firn_ended = workload.progress()?.clock_us;
        if !status.success() {
            bail!("firn failed ({status}); see {}", log.display());
        }
        let bytes = fs::read(&output)?;
        let profile = agent_pprof::decode(&bytes)?;
        run.tally = firn_tally(&profile, pid);
    }
    if cpu_profiled {
        File::create(&stop)?;
        workload.wait(Duration::from_secs(60))?;
        let text = fs::read_to_string(&cpu_prof)
            .with_context(|| format!("node wrote no {}", cpu_prof.display()))?;
        match profiler {
            Some(Profiler::Both) => {
                run.v8_tally = cpu_profile_tally(&text, firn_began, firn_ended)?;
            }
            _ => run.tally = cpu_profile_tally(&text, start.clock_us, end.clock_us)?,
        }
    }
    Ok(run)
}

/// V8's profiler at the bench's frequency, writing `profile` at exit.
fn cpu_prof_flags(profile: &Path, args: &BenchArgs) -> Vec<String> {
    let interval_us = 1_000_000 / args.frequency.max(1);
    let dir = profile.parent().unwrap_or(Path::new("."));
    let name = profile.file_name().unwrap_or_default();
    vec![
        "--cpu-prof".to_owned(),
        "--cpu-prof-interval".to_owned(),
        interval_us.to_string(),
        "--cpu-prof-dir".to_owned(),
        dir.display().to_string(),
        "--cpu-prof-name".to_owned(),
        name.to_string_lossy().into_owned(),
    ]
}

/// The main thread's samples of `pid` in a firn profile: its JavaScript
/// frames are those firn named from V8's heap (the `[javascript]`
/// mapping; functions inlined into them, `[javascript:inlined]`, are left
/// out, as V8's profile leaves them out), or, with `--nodejs=false`, those
/// V8's perf map names.
fn firn_tally(profile: &agent_pprof::proto::Profile, pid: u32) -> Tally {
    let pid = pid.to_string();
    let mut tally = Tally::default();
    for sample in Reader::new(profile).samples() {
        if sample.label("pid") != Some(pid.as_str()) {
            continue;
        }
        let frames = sample.frames();
        if !frames.iter().any(|frame| frame.name == Some("node::Start")) {
            continue;
        }
        let js: Vec<String> = frames
            .iter()
            .filter_map(|frame| {
                if frame
                    .mapping
                    .is_some_and(|mapping| mapping.filename == "[javascript]")
                {
                    return Some(frame.display_name());
                }
                perf_map_function(frame.name?)
            })
            .collect();
        tally.add(
            &js,
            NO_JAVASCRIPT,
            u64::try_from(sample.count()).unwrap_or(0),
        );
    }
    tally
}

/// The function a perf map line of V8 names, if it is JavaScript:
/// `JS:*name file:line:column` (Node 20 on; `LazyCompile:` and `Function:`
/// before), the mark after the colon giving the tier (`~` interpreted, `^`
/// baseline, `+` Maglev, `*` TurboFan).
fn perf_map_function(name: &str) -> Option<String> {
    let rest = ["JS:", "LazyCompile:", "Function:"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))?;
    let rest = rest.trim_start_matches(['~', '^', '+', '*']);
    let function = rest.split(' ').next().unwrap_or_default();
    Some(match function {
        "" => "(anonymous)".to_owned(),
        function => function.to_owned(),
    })
}

/// The samples of V8's `.cpuprofile` (the main thread's) taken within
/// `[from_us, to_us]` of CLOCK_MONOTONIC: `nodes` is the call tree (each
/// node a `callFrame` and its `children`), `samples` the leaf node of each
/// sample and `timeDeltas` the time since the one before (the first since
/// `startTime`).
fn cpu_profile_tally(text: &str, from_us: f64, to_us: f64) -> Result<Tally> {
    let profile: Value = serde_json::from_str(text).context("the .cpuprofile is not JSON")?;
    let nodes = profile["nodes"]
        .as_array()
        .context("the .cpuprofile has no nodes")?;
    // Node id -> (name, JavaScript or not), and child -> parent.
    let mut frames: HashMap<u64, (String, bool)> = HashMap::new();
    let mut parents: HashMap<u64, u64> = HashMap::new();
    for node in nodes {
        let id = node["id"].as_u64().context("a node without an id")?;
        let frame = &node["callFrame"];
        let name = frame["functionName"].as_str().unwrap_or_default();
        // V8's own entries, `(root)`, `(program)`, `(idle)` and `(garbage
        // collector)`, have no script.
        let javascript = !frame["url"].as_str().unwrap_or_default().is_empty()
            || frame["scriptId"]
                .as_str()
                .is_some_and(|script| !script.is_empty() && script != "0");
        let name = match (name, javascript) {
            ("", true) => "(anonymous)".to_owned(),
            (name, _) => name.to_owned(),
        };
        frames.insert(id, (name, javascript));
        for child in node["children"].as_array().into_iter().flatten() {
            if let Some(child) = child.as_u64() {
                parents.insert(child, id);
            }
        }
    }
    let samples = profile["samples"]
        .as_array()
        .context("the .cpuprofile has no samples")?;
    let deltas = profile["timeDeltas"]
        .as_array()
        .context("the .cpuprofile has no timeDeltas")?;
    let mut time = profile["startTime"]
        .as_f64()
        .context("the .cpuprofile has no startTime")?;
    let mut tally = Tally::default();
    let mut stacks: HashMap<u64, (Vec<String>, String)> = HashMap::new();
    for (sample, delta) in samples.iter().zip(deltas) {
        time += delta.as_f64().unwrap_or(0.0);
        if time < from_us || time > to_us {
            continue;
        }
        let Some(leaf) = sample.as_u64() else {
            continue;
        };
        let (js, outside) = stacks.entry(leaf).or_insert_with(|| {
            let mut js = Vec::new();
            let mut at = Some(leaf);
            let outside = frames
                .get(&leaf)
                .map_or(String::new(), |(name, _)| name.clone());
            // A tree is as deep as its nodes are many; a cycle is cut.
            for _ in 0..frames.len() {
                let Some(id) = at else { break };
                if let Some((name, true)) = frames.get(&id) {
                    js.push(name.clone());
                }
                at = parents.get(&id).copied();
            }
            (js, outside)
        });
        tally.add(js, outside, 1);
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_map_names_are_functions() {
        let name = "JS:*settle /work/tests/workloads/node/chain.js:34:16";
        assert_eq!(perf_map_function(name).as_deref(), Some("settle"));
        assert_eq!(
            perf_map_function("LazyCompile:~main /x.js:1:1").as_deref(),
            Some("main")
        );
        assert_eq!(
            perf_map_function("JS:~ node:internal/main/run_main_module:1:1").as_deref(),
            Some("(anonymous)")
        );
        assert_eq!(perf_map_function("Builtin:ArrayMap"), None);
    }

    #[test]
    fn the_chain_may_lack_inlined_callees_only() {
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert!(holds_chain(&names(&[
            "accumulate",
            "reconcile",
            "settle",
            "main",
            "(anonymous)"
        ])));
        assert!(holds_chain(&names(&["settle", "main"])));
        assert!(!holds_chain(&names(&["accumulate", "settle", "main"])));
        assert!(!holds_chain(&names(&["reconcile", "main"])));
        assert!(!holds_chain(&names(&["accumulate", "reconcile"])));
    }

    #[test]
    fn cpu_profile_samples_are_counted_within_the_window() {
        let text = r#"{
          "nodes": [
            {"id": 1, "callFrame": {"functionName": "(root)", "scriptId": "0", "url": ""}, "children": [2, 6]},
            {"id": 2, "callFrame": {"functionName": "main", "scriptId": "9", "url": "file:///c.js"}, "children": [3]},
            {"id": 3, "callFrame": {"functionName": "settle", "scriptId": "9", "url": "file:///c.js"}, "children": [4]},
            {"id": 4, "callFrame": {"functionName": "reconcile", "scriptId": "9", "url": "file:///c.js"}, "children": [5]},
            {"id": 5, "callFrame": {"functionName": "accumulate", "scriptId": "9", "url": "file:///c.js"}},
            {"id": 6, "callFrame": {"functionName": "(garbage collector)", "scriptId": "0", "url": ""}}
          ],
          "startTime": 1000, "endTime": 2000,
          "samples": [5, 5, 3, 6, 5],
          "timeDeltas": [10, 100, 100, 100, 800]
        }"#;
        let tally = cpu_profile_tally(text, 1100.0, 1400.0).expect("parses");
        assert_eq!((tally.complete, tally.total), (2, 3));
        assert_eq!(tally.selves.get("settle"), Some(&1));
        assert_eq!(tally.selves.get("(garbage collector)"), Some(&1));
    }
}
