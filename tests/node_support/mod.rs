//! Support for the Node.js tests: the Node binaries they run, the chain
//! workload (`tests/workloads/node/chain.js`) under each of V8's tiers,
//! and the samples of a profile read as JavaScript frames.

// Each test uses its own part of the support code.
#![allow(dead_code)]

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use agent_pprof::proto::Profile;

use crate::common::*;

/// The mapping of every JavaScript frame's location.
pub const JS_MAPPING: &str = "[javascript]";

/// The mapping of functions TurboFan or Maglev inlined into the frame
/// below.
pub const INLINED_MAPPING: &str = "[javascript:inlined]";

/// Share of the main thread's samples that must hold the whole chain.
pub const MOST: f64 = 0.9;

/// Least samples of the main thread a check needs to say anything.
pub const ENOUGH: i64 = 40;

/// The Node binaries to check, with a name for messages.
pub fn nodes() -> Vec<(String, PathBuf)> {
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

pub fn script() -> PathBuf {
    workloads_dir().join("node/chain.js")
}

/// Whether `node` knows the V8 flag `flag` (without its `--`).
pub fn knows_flag(node: &Path, flag: &str) -> bool {
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
pub enum Tier {
    /// Interpreted and baseline code only.
    Unoptimized,
    /// TurboFan code for the whole chain, each function its own frame.
    Optimized,
    /// TurboFan code with its inlining, no on-stack replacement (the
    /// chain's caller stays unoptimized), inlining decisions traced.
    Inlined,
}

impl Tier {
    pub fn flags(self, node: &Path) -> Vec<&'static str> {
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
pub struct NodeProcess {
    child: Child,
    stdout: PathBuf,
}

impl NodeProcess {
    /// `node FLAGS chain.js 0 MODE`, once it has run a while and, for an
    /// optimized run, once TurboFan compiled `functions`.
    pub fn start(dir: &Path, node: &Path, tier: Tier, mode: &str, functions: &[&str]) -> Self {
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn trace(&self) -> String {
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
pub fn optimized(trace: &str, function: &str) -> bool {
    let object = format!("<JSFunction {function} ");
    trace.lines().any(|line| {
        line.contains(&object)
            && line.contains("TURBOFAN")
            && (line.starts_with("[optimizing") || line.starts_with("[completed optimizing"))
    })
}

/// Whether V8's `--trace-turbo-inlining` output says TurboFan inlined
/// `callee` into `caller`.
pub fn inlined(trace: &str, callee: &str, caller: &str) -> bool {
    let callee = format!("<SharedFunctionInfo {callee}>");
    let caller = format!("<SharedFunctionInfo {caller}>");
    trace.lines().any(|line| {
        line.starts_with("Inlining ")
            && line
                .split_once(" into ")
                .is_some_and(|(inlined, into)| inlined.contains(&callee) && into.contains(&caller))
    })
}

pub type Frame = SampleFrame;

impl SampleFrame {
    /// In either JavaScript mapping.
    pub fn javascript(&self) -> bool {
        self.mapping == JS_MAPPING || self.mapping == INLINED_MAPPING
    }

    /// Inlined into the frame below it.
    pub fn inlined(&self) -> bool {
        self.mapping == INLINED_MAPPING
    }
}

/// The samples of `pid`'s main thread (those under `node::Start`), leaf
/// first, with their counts.
pub fn main_thread(profile: &Profile, pid: u32) -> Vec<(Vec<Frame>, i64)> {
    all_threads(profile, pid)
        .into_iter()
        .filter(|(frames, _)| frames.iter().any(|frame| frame.name == "node::Start"))
        .collect()
}

/// The line of `chain.js` marked `// line: NAME`.
pub fn marked_line(name: &str) -> i64 {
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
pub fn function_lines(marker: &str) -> std::ops::RangeInclusive<i64> {
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
pub fn holds(frames: &[Frame], chain: &[(&[&str], &str)]) -> bool {
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
pub fn runs_marked_lines(frames: &[Frame], chain: &[(&[&str], &str)]) -> bool {
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

pub fn describe_frames(samples: &[(Vec<Frame>, i64)]) -> String {
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
pub const CHAIN: &[(&[&str], &str)] = &[
    (&["accumulate"], "accumulate"),
    (&["reconcile"], "reconcile"),
    (&["settle"], "settle"),
    (&["main"], "main"),
];

/// A closure calling a class method: `tally -> Ledger.post -> accumulate`
/// (the method named by its class, as V8's stack traces name it).
pub const METHOD_CHAIN: &[(&[&str], &str)] = &[
    (&["accumulate"], "accumulate"),
    (&["Ledger.post"], "post"),
    (&["tally"], "tally"),
];

/// An async function resumed after `await`, from the microtask queue:
/// `pump -> accumulate` on the resumed stack.
pub const ASYNC_CHAIN: &[(&[&str], &str)] = &[(&["accumulate"], "accumulate"), (&["pump"], "pump")];

/// The function TurboFan inlines in mode `inline`, and its caller.
pub const INLINED: (&str, &str) = ("blend", "mix");

pub const INLINE_CHAIN: &[(&[&str], &str)] = &[
    (&["blend"], "blend"),
    (&["mix"], "mix"),
    (&["main"], "main"),
];

/// V8's major version of `node`, as it reports it.
pub fn v8_major(node: &Path) -> String {
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

/// Samples of `pid` (all threads), leaf first, as frames.
pub fn all_threads(profile: &Profile, pid: u32) -> Vec<(Vec<Frame>, i64)> {
    process_samples(profile, pid)
        .into_iter()
        .map(|sample| (sample.frames, sample.count))
        .collect()
}
