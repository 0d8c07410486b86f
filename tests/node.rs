//! End to end: JavaScript frames of Node.js processes named from V8's heap
//! by the real `firn` binary (no `--perf-basic-prof`), for
//! `tests/workloads/node/chain.js` run by the interpreter (`--max-opt=0`,
//! or `--no-opt --no-sparkplug` where V8 lacks it) and optimized (TurboFan, after warm-up,
//! inlining off so each function keeps its frame): the chain in order with
//! its script file, a class method (by its class) and a closure, an async
//! function resumed after `await`, a function TurboFan inlined into its
//! caller as a frame of its own (inlining on); with `--nodejs=false`,
//! native stacks as before. Each check runs on Debian's Node 20
//! (`/usr/bin/node`) and on every Node named by `FIRN_NODE_18`,
//! `FIRN_NODE_22` and `FIRN_NODE_24` (`cargo xtask setup` installs them,
//! `cargo xtask test` sets them).

mod common;

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use agent_pprof::{Reader, proto::Profile};
use common::*;

/// The mapping of every JavaScript frame's location.
const JS_MAPPING: &str = "[javascript]";

/// The mapping of functions TurboFan or Maglev inlined into the frame
/// below.
const INLINED_MAPPING: &str = "[javascript:inlined]";

/// Share of the main thread's samples that must hold the whole chain.
const MOST: f64 = 0.9;

/// Least samples of the main thread a check needs to say anything.
const ENOUGH: i64 = 40;

/// The Node binaries to check, with a name for messages.
fn nodes() -> Vec<(String, PathBuf)> {
    let debian = PathBuf::from("/usr/bin/node");
    assert!(
        debian.is_file(),
        "no Node at /usr/bin/node (Debian's nodejs, installed by `cargo xtask setup`)"
    );
    let mut nodes = vec![("Debian node".to_owned(), debian)];
    for version in ["18", "22", "24"] {
        let var = format!("FIRN_NODE_{version}");
        if let Some(path) = std::env::var_os(&var) {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "{var} is set to {}, which is not a file (run `cargo xtask setup`, or unset it)",
                path.display()
            );
            nodes.push((format!("Node {version}"), path));
        }
    }
    nodes
}

fn script() -> PathBuf {
    workloads_dir().join("node/chain.js")
}

/// Whether `node` knows the V8 flag `flag` (without its `--`).
fn knows_flag(node: &Path, flag: &str) -> bool {
    let output = Command::new(node)
        .arg("--v8-options")
        .output()
        .unwrap_or_else(|error| panic!("{} --v8-options: {error}", node.display()));
    let wanted = format!("--{flag} ");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .any(|line| line.trim_start().starts_with(&wanted))
}

/// How V8 is to run the chain.
#[derive(Clone, Copy, Debug)]
enum Tier {
    /// Interpreted and baseline code only.
    Unoptimized,
    /// TurboFan code for the whole chain, each function its own frame.
    Optimized,
    /// TurboFan code with its inlining, no on-stack replacement (the
    /// chain's caller stays unoptimized), inlining decisions traced.
    Inlined,
}

impl Tier {
    fn flags(self, node: &Path) -> Vec<&'static str> {
        match self {
            Self::Unoptimized if knows_flag(node, "max-opt") => vec!["--max-opt=0"],
            // `--max-opt=0` runs the interpreter alone; so do these.
            Self::Unoptimized if knows_flag(node, "sparkplug") => {
                vec!["--no-opt", "--no-sparkplug"]
            }
            Self::Unoptimized => vec!["--no-opt"],
            Self::Optimized => {
                let mut flags = vec!["--no-turbo-inlining", "--trace-opt"];
                if knows_flag(node, "maglev-inlining") {
                    flags.push("--no-maglev-inlining");
                }
                flags
            }
            Self::Inlined => vec!["--no-use-osr", "--trace-opt", "--trace-turbo-inlining"],
        }
    }
}

/// A Node process running the chain, its standard output in a file;
/// killed when dropped.
struct NodeProcess {
    child: Child,
    stdout: PathBuf,
}

impl NodeProcess {
    /// `node FLAGS chain.js 0 MODE`, once it has run a while and, for an
    /// optimized run, once TurboFan compiled `functions`.
    fn start(dir: &Path, node: &Path, tier: Tier, mode: &str, functions: &[&str]) -> Self {
        let stdout = dir.join(format!("node-{mode}.out"));
        let child = Command::new(node)
            .args(tier.flags(node))
            .arg(script())
            .args(["0", mode])
            .stdout(File::create(&stdout).expect("stdout file"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {}: {error}", node.display()));
        let process = Self { child, stdout };
        wait_for_cpu_time(
            process.pid(),
            Duration::from_millis(500),
            Duration::from_secs(60),
        );
        if let Tier::Optimized | Tier::Inlined = tier {
            wait_for(
                "TurboFan to compile the chain",
                Duration::from_secs(60),
                || {
                    let trace = process.trace();
                    functions.iter().all(|function| optimized(&trace, function))
                        && (!matches!(tier, Tier::Inlined) || inlined(&trace, INLINED.0, INLINED.1))
                },
                || process.trace(),
            );
        }
        process
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn trace(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether V8's `--trace-opt` output says `function` was compiled by
/// TurboFan (`[optimizing ...]` in V8 10, `[completed optimizing ...]`
/// from 11, target `TURBOFAN` or `TURBOFAN_JS`).
fn optimized(trace: &str, function: &str) -> bool {
    let object = format!("<JSFunction {function} ");
    trace.lines().any(|line| {
        line.contains(&object)
            && line.contains("TURBOFAN")
            && (line.starts_with("[optimizing") || line.starts_with("[completed optimizing"))
    })
}

/// Whether V8's `--trace-turbo-inlining` output says TurboFan inlined
/// `callee` into `caller`.
fn inlined(trace: &str, callee: &str, caller: &str) -> bool {
    let callee = format!("<SharedFunctionInfo {callee}>");
    let caller = format!("<SharedFunctionInfo {caller}>");
    trace.lines().any(|line| {
        line.starts_with("Inlining ")
            && line
                .split_once(" into ")
                .is_some_and(|(inlined, into)| inlined.contains(&callee) && into.contains(&caller))
    })
}

type Frame = SampleFrame;

impl SampleFrame {
    /// In either JavaScript mapping.
    fn javascript(&self) -> bool {
        self.mapping == JS_MAPPING || self.mapping == INLINED_MAPPING
    }

    /// Inlined into the frame below it.
    fn inlined(&self) -> bool {
        self.mapping == INLINED_MAPPING
    }
}

/// The samples of `pid`'s main thread (those under `node::Start`), leaf
/// first, with their counts.
fn main_thread(profile: &Profile, pid: u32) -> Vec<(Vec<Frame>, i64)> {
    all_threads(profile, pid)
        .into_iter()
        .filter(|(frames, _)| frames.iter().any(|frame| frame.name == "node::Start"))
        .collect()
}

/// The line of `chain.js` marked `// line: NAME`.
fn marked_line(name: &str) -> i64 {
    let source = std::fs::read_to_string(script()).expect("chain.js");
    let marker = format!("// line: {name}");
    source
        .lines()
        .position(|line| line.trim_end().ends_with(&marker))
        .map(|index| index as i64 + 1)
        .unwrap_or_else(|| panic!("no marker {marker}"))
}

/// The lines a frame of the function holding `// line: NAME` may be
/// given: from its declaration (V8's profiler gives a function's start)
/// to a few lines past the marked one.
fn function_lines(marker: &str) -> std::ops::RangeInclusive<i64> {
    let marked = marked_line(marker);
    let source = std::fs::read_to_string(script()).expect("chain.js");
    let lines: Vec<&str> = source.lines().collect();
    let declaration = (0..marked as usize)
        .rev()
        .find(|&index| {
            let line = lines[index].trim();
            let method = line.ends_with(") {")
                && line
                    .split('(')
                    .next()
                    .is_some_and(|name| name.chars().all(|c| c.is_alphanumeric() || c == '_'));
            line.contains("function ") || method
        })
        .map_or(marked, |index| index as i64 + 1);
    declaration..=marked + 3
}

/// Whether `frames` hold `chain` (leaf first, each `(names, marker)`: the
/// frame's accepted names and the marker of a line of its function) as
/// consecutive JavaScript frames of chain.js, each at a line of its
/// function.
fn holds(frames: &[Frame], chain: &[(&[&str], &str)]) -> bool {
    let (leaf_names, _) = chain[0];
    let Some(leaf) = frames
        .iter()
        .position(|frame| leaf_names.contains(&frame.name.as_str()))
    else {
        return false;
    };
    let run = &frames[leaf..];
    run.len() >= chain.len()
        && run.iter().zip(chain).all(|(frame, (names, marker))| {
            frame.javascript()
                && names.contains(&frame.name.as_str())
                && frame.file.ends_with("node/chain.js")
                && function_lines(marker).contains(&frame.line)
        })
}

/// Whether `frames` hold `chain` with each frame but the outermost (main,
/// whose loop Sparkplug compiles) past its function's first line and at
/// most at its marked line: the line being run, not where the function
/// starts. (An interpreted leaf's offset is the one it last saved in its
/// frame, at a call or a loop's back edge: its loop's header, or the line
/// before it.)
fn runs_marked_lines(frames: &[Frame], chain: &[(&[&str], &str)]) -> bool {
    holds(frames, chain) && {
        let (leaf_names, _) = chain[0];
        let leaf = frames
            .iter()
            .position(|frame| leaf_names.contains(&frame.name.as_str()))
            .expect("held");
        let inner = &chain[..chain.len() - 1];
        frames[leaf..]
            .iter()
            .zip(inner)
            .all(|(frame, (_, marker))| {
                let declaration = *function_lines(marker).start();
                (declaration + 1..=marked_line(marker)).contains(&frame.line)
            })
    }
}

#[test]
fn function_lines_run_from_the_declaration() {
    let declared = |text: &str| {
        let source = std::fs::read_to_string(script()).expect("chain.js");
        source
            .lines()
            .position(|line| line.contains(text))
            .map(|index| index as i64 + 1)
            .expect("declaration")
    };
    assert_eq!(
        *function_lines("accumulate").start(),
        declared("function accumulate(")
    );
    assert_eq!(*function_lines("post").start(), declared("  post(seed) {"));
    assert_eq!(
        *function_lines("tally").start(),
        declared("return function tally(")
    );
}

fn describe_frames(samples: &[(Vec<Frame>, i64)]) -> String {
    let mut sorted: Vec<_> = samples.iter().collect();
    sorted.sort_by_key(|(_, count)| -count);
    sorted
        .iter()
        .take(6)
        .map(|(frames, count)| {
            let names: Vec<String> = frames
                .iter()
                .map(|frame| match frame.javascript() {
                    true if frame.inlined() => {
                        format!("{}@{}:{} (inlined)", frame.name, frame.file, frame.line)
                    }
                    true => format!("{}@{}:{}", frame.name, frame.file, frame.line),
                    false => frame.name.clone(),
                })
                .collect();
            format!("{count:>5}  {}", names.join(" <- "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The chain `settle -> reconcile -> accumulate`, leaf first.
const CHAIN: &[(&[&str], &str)] = &[
    (&["accumulate"], "accumulate"),
    (&["reconcile"], "reconcile"),
    (&["settle"], "settle"),
    (&["main"], "main"),
];

/// A closure calling a class method: `tally -> Ledger.post -> accumulate`
/// (the method named by its class, as V8's stack traces name it).
const METHOD_CHAIN: &[(&[&str], &str)] = &[
    (&["accumulate"], "accumulate"),
    (&["Ledger.post"], "post"),
    (&["tally"], "tally"),
];

/// An async function resumed after `await`, from the microtask queue:
/// `pump -> accumulate` on the resumed stack.
const ASYNC_CHAIN: &[(&[&str], &str)] = &[(&["accumulate"], "accumulate"), (&["pump"], "pump")];

/// The function TurboFan inlines in mode `inline`, and its caller.
const INLINED: (&str, &str) = ("blend", "mix");

const INLINE_CHAIN: &[(&[&str], &str)] = &[
    (&["blend"], "blend"),
    (&["mix"], "mix"),
    (&["main"], "main"),
];

/// Records each Node running chain.js in `mode` at `tier` and checks the
/// share of the main thread's samples holding `chain`, and the share of
/// those whose frames carry the lines being run (interpreted frames by
/// their bytecode offset, optimized ones by their pc).
fn chain_is_named(tier: Tier, mode: &str, chain: &[(&[&str], &str)], compiled: &[&str]) {
    require_root();
    let _serial = serial();
    let mut failures = Vec::new();
    for (name, node) in nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = NodeProcess::start(dir.path(), &node, tier, mode, compiled);
        let pid = process.pid().to_string();
        let (_, profile) = record(dir.path(), &["--duration", "4s", "--pid", &pid]);
        let samples = main_thread(&profile, process.pid());
        let total: i64 = samples.iter().map(|(_, count)| count).sum();
        // With inlining on, the leaf is the function inlined, the rest
        // frames of their own; else none is inlined.
        let inlined = |frames: &[Frame]| {
            let Some(leaf) = frames
                .iter()
                .position(|frame| chain[0].0.contains(&frame.name.as_str()))
            else {
                return false;
            };
            let inlined: Vec<&str> = frames[leaf..]
                .iter()
                .take(chain.len())
                .filter(|frame| frame.inlined())
                .map(|frame| frame.name.as_str())
                .collect();
            match tier {
                Tier::Inlined => inlined == chain[0].0[..1],
                _ => inlined.is_empty(),
            }
        };
        let named: i64 = samples
            .iter()
            .filter(|(frames, _)| holds(frames, chain) && inlined(frames))
            .map(|(_, count)| count)
            .sum();
        let share = named as f64 / total.max(1) as f64;
        println!("{name} {tier:?} {mode}: {named} of {total} samples hold the chain ({share:.3})");
        if total < ENOUGH || share < MOST {
            failures.push(format!(
                "{name} {tier:?} {mode}: {named} of {total} samples hold the chain:\n{}",
                describe_frames(&samples)
            ));
        }
        let running: i64 = samples
            .iter()
            .filter(|(frames, _)| runs_marked_lines(frames, chain))
            .map(|(_, count)| count)
            .sum();
        let running_share = running as f64 / named.max(1) as f64;
        println!(
            "{name} {tier:?} {mode}: {running} of {named} at the lines being run ({running_share:.3})"
        );
        if running_share < MOST {
            failures.push(format!(
                "{name} {tier:?} {mode}: {running} of {named} samples at the lines being run:\n{}",
                describe_frames(&samples)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn unoptimized_chain_is_named() {
    chain_is_named(Tier::Unoptimized, "chain", CHAIN, &[]);
}

#[test]
fn optimized_chain_is_named() {
    chain_is_named(
        Tier::Optimized,
        "chain",
        CHAIN,
        &["accumulate", "reconcile", "settle"],
    );
}

#[test]
fn class_method_and_closure_are_named() {
    chain_is_named(Tier::Unoptimized, "method", METHOD_CHAIN, &[]);
}

#[test]
fn optimized_class_method_and_closure_are_named() {
    chain_is_named(
        Tier::Optimized,
        "method",
        METHOD_CHAIN,
        &["accumulate", "post", "tally"],
    );
}

#[test]
fn async_function_resumed_after_await_is_named() {
    chain_is_named(Tier::Unoptimized, "async", ASYNC_CHAIN, &[]);
}

#[test]
fn optimized_async_function_resumed_after_await_is_named() {
    chain_is_named(
        Tier::Optimized,
        "async",
        ASYNC_CHAIN,
        &["accumulate", "pump"],
    );
}

/// blend, which TurboFan inlined into mix, named as a frame of its own
/// above mix, on the stack where mix runs it.
#[test]
fn function_inlined_by_turbofan_is_a_frame_of_its_own() {
    chain_is_named(Tier::Inlined, "inline", INLINE_CHAIN, &["mix"]);
}

/// `--nodejs=false`: no JavaScript frame, the JIT code's frames as the
/// native unwind finds them (`[anon]` where no perf map names them).
#[test]
fn nodejs_off_leaves_native_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let process = NodeProcess::start(
        dir.path(),
        Path::new("/usr/bin/node"),
        Tier::Unoptimized,
        "chain",
        &[],
    );
    let (_, profile) = record_busy(
        dir.path(),
        process.pid(),
        Duration::from_secs(3),
        &["--nodejs=false"],
    );
    let any_js = Reader::new(&profile)
        .mappings()
        .any(|mapping| mapping.filename == JS_MAPPING);
    let samples = stacks_of(&profile, process.pid());
    let total: i64 = samples.iter().map(|(_, count)| count).sum();
    let trampolines: i64 = samples
        .iter()
        .filter(|(names, _)| {
            names
                .iter()
                .any(|name| name == "Builtins_InterpreterEntryTrampoline")
        })
        .map(|(_, count)| count)
        .sum();
    assert!(total >= ENOUGH, "too few samples of node: {total}");
    assert!(
        !any_js
            && samples.iter().all(|(names, _)| {
                names
                    .iter()
                    .all(|name| !["settle", "reconcile", "accumulate"].contains(&name.as_str()))
            })
            && trampolines * 10 >= total * 9,
        "--nodejs=false: JavaScript frames, or native stacks not as before:\n{}",
        describe(&samples)
    );
}

/// V8's major version of `node`, as it reports it.
fn v8_major(node: &Path) -> String {
    let output = Command::new(node)
        .args(["-p", "process.versions.v8"])
        .output()
        .unwrap_or_else(|error| panic!("{} -p: {error}", node.display()));
    let version = String::from_utf8_lossy(&output.stdout);
    version
        .split('.')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The agent on the whole host, one Node started before it and the others
/// after: every one is found (`firn_node_processes_total` by V8 version)
/// and its frames named (`firn_node_frames_total`), none skipped.
#[test]
fn node_processes_before_and_after_firn_are_counted_by_v8_version() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = nodes();
    let mut wanted = std::collections::BTreeMap::<String, f64>::new();
    for (_, node) in &nodes {
        *wanted.entry(v8_major(node)).or_default() += 1.0;
    }
    let (_, first) = &nodes[0];
    let before = NodeProcess::start(dir.path(), first, Tier::Unoptimized, "chain", &[]);
    let store = dir.path().join("store");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--profiling-duration",
            "2s",
            "--local-store-directory",
            store.to_str().expect("utf-8"),
        ],
        &[],
    );
    let address = agent.http_address();
    agent.wait_until("samples", Duration::from_secs(120), || {
        metric(address, "firn_node_frames_total").is_some_and(|value| value > 0.0)
    });
    let after: Vec<NodeProcess> = nodes[1..]
        .iter()
        .map(|(_, node)| NodeProcess::start(dir.path(), node, Tier::Unoptimized, "method", &[]))
        .collect();
    let found = |major: &str| {
        metric(
            address,
            &format!("firn_node_processes_total{{v8=\"{major}\"}}"),
        )
        .unwrap_or(0.0)
    };
    agent.wait_until(
        "every Node counted by its V8 version",
        Duration::from_secs(60),
        || wanted.iter().all(|(major, count)| found(major) >= *count),
    );
    for reason in ["layout", "unreadable"] {
        let name = format!("firn_node_processes_skipped_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(address, &name), Some(0.0), "{name}");
    }
    drop(after);
    drop(before);
    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
}

/// Samples of `pid` (all threads), leaf first, as frames.
fn all_threads(profile: &Profile, pid: u32) -> Vec<(Vec<Frame>, i64)> {
    process_samples(profile, pid)
        .into_iter()
        .map(|sample| (sample.frames, sample.count))
        .collect()
}

/// A JavaScript function calling `zlib.deflateSync` in a loop: the native
/// frames of the call (Node's zlib binding, zlib's deflate) sit above the
/// JavaScript frame `compress`, which sits above `main`.
#[test]
fn native_frames_of_zlib_sit_above_their_javascript_caller() {
    require_root();
    let _serial = serial();
    let mut failures = Vec::new();
    for (name, node) in nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = NodeProcess::start(dir.path(), &node, Tier::Unoptimized, "zlib", &[]);
        let pid = process.pid().to_string();
        let (_, profile) = record(dir.path(), &["--duration", "4s", "--pid", &pid]);
        let samples = main_thread(&profile, process.pid());
        let total: i64 = samples.iter().map(|(_, count)| count).sum();
        let good: i64 = samples
            .iter()
            .filter(|(frames, _)| {
                let Some(caller) = frames.iter().position(|frame| {
                    frame.javascript()
                        && frame.name == "compress"
                        && frame.file.ends_with("node/chain.js")
                }) else {
                    return false;
                };
                frames[caller + 1].javascript()
                    && frames[caller + 1].name == "main"
                    && frames[..caller].iter().any(|frame| {
                        !frame.javascript()
                            && (frame.name.contains("deflate") || frame.name.contains("Zlib"))
                    })
            })
            .map(|(_, count)| count)
            .sum();
        let share = good as f64 / total.max(1) as f64;
        println!("{name} zlib: {good} of {total} samples hold zlib above compress ({share:.3})");
        // Some samples are in JavaScript of Node's zlib module, or in the
        // garbage collector: most are in deflate.
        if total < ENOUGH || share < 0.7 {
            failures.push(format!(
                "{name}: zlib above compress in {good} of {total} samples:\n{}",
                describe_frames(&samples)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A worker thread names its own function (`spin`, busy in `accumulate`)
/// while the main thread runs the chain.
#[test]
fn worker_thread_names_its_own_functions() {
    require_root();
    let _serial = serial();
    let mut failures = Vec::new();
    for (name, node) in nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = NodeProcess::start(dir.path(), &node, Tier::Unoptimized, "worker", &[]);
        let pid = process.pid().to_string();
        let (_, profile) = record(dir.path(), &["--duration", "4s", "--pid", &pid]);
        let worker: Vec<_> = all_threads(&profile, process.pid())
            .into_iter()
            .filter(|(frames, _)| {
                frames.iter().any(|frame| frame.name == "spin")
                    || frames.iter().all(|frame| frame.name != "node::Start")
                        && frames.iter().any(|frame| frame.javascript())
            })
            .collect();
        let total: i64 = worker.iter().map(|(_, count)| count).sum();
        let spin: &[(&[&str], &str)] = &[(&["accumulate"], "accumulate"), (&["spin"], "spin")];
        let named: i64 = worker
            .iter()
            .filter(|(frames, _)| holds(frames, spin))
            .map(|(_, count)| count)
            .sum();
        let main: i64 = main_thread(&profile, process.pid())
            .iter()
            .filter(|(frames, _)| holds(frames, CHAIN))
            .map(|(_, count)| count)
            .sum();
        let share = named as f64 / total.max(1) as f64;
        println!(
            "{name} worker: {named} of {total} worker samples in spin ({share:.3}); main chain in {main}"
        );
        if total < ENOUGH || share < MOST || main < ENOUGH {
            failures.push(format!(
                "{name}: spin in {named} of {total} worker samples, main chain in {main}:\n{}",
                describe_frames(&worker)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
