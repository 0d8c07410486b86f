//! End to end: Ruby frames named by the real BPF walker and `firn` binary,
//! in processes of Debian's CRuby 3.1 (`ruby3.1`, installed by `cargo xtask
//! setup`) running the scripts in `tests/workloads/ruby/`: methods,
//! singleton methods, blocks and C functions in order with file and line,
//! a C extension's native frames above its Ruby caller, every thread its
//! own stack, and `--ruby=false`.

mod common;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use common::*;

/// The interpreter the tests run.
const RUBY: &str = "/usr/bin/ruby3.1";
/// The mapping firn puts Ruby frames in.
const RUBY_MAPPING: &str = "[ruby]";
/// Share of samples a check asks for.
const MOST: f64 = 0.90;
/// Samples a check needs at least to mean anything.
const MIN_SAMPLES: i64 = 30;

/// chain.rb's Ruby frames, innermost first.
const RUBY_CHAIN: [&str; 8] = [
    "Chain#work",
    "block in Chain#inner",
    "Integer#times",
    "Chain#inner",
    "Chain.middle",
    "block in <main>",
    "Kernel#loop",
    "<main>",
];

/// A Ruby script's process, killed when dropped.
struct RubyProcess {
    child: Child,
}

impl RubyProcess {
    /// Starts `ruby3.1 tests/workloads/ruby/<script>` and waits until it
    /// prints `ready`.
    fn start(script: &str) -> Self {
        assert!(
            Path::new(RUBY).exists(),
            "{RUBY} is missing: `cargo xtask setup` installs Debian's ruby3.1"
        );
        let mut child = Command::new(RUBY)
            .arg(script_path(script))
            .env_remove("RUBYOPT")
            .env_remove("RUBYLIB")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {RUBY}: {error}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let process = Self { child };
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        match receiver.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line == "ready" => process,
            other => panic!("{script} did not print `ready` within 60 s: {other:?}"),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RubyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn script_path(script: &str) -> PathBuf {
    workloads_dir().join("ruby").join(script)
}

/// The lines of `script` holding `marker`.
fn lines_with(script: &str, marker: &str) -> Vec<i64> {
    std::fs::read_to_string(script_path(script))
        .expect("the script reads")
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(marker))
        .map(|(index, _)| index as i64 + 1)
        .collect()
}

/// Records `process` until it spent `cpu` of CPU time, with `extra`.
fn record_ruby(
    dir: &Path,
    process: &RubyProcess,
    cpu: Duration,
    extra: &[&str],
) -> Vec<ProcessSample> {
    let (_, profile) = record_busy(dir, process.pid(), cpu, extra);
    process_samples(&profile, process.pid())
}

fn ruby_frames(sample: &ProcessSample) -> Vec<&SampleFrame> {
    sample
        .frames
        .iter()
        .filter(|frame| frame.mapping == RUBY_MAPPING)
        .collect()
}

fn ruby_names(sample: &ProcessSample) -> Vec<&str> {
    ruby_frames(sample)
        .iter()
        .map(|frame| frame.name.as_str())
        .collect()
}

/// The share of `samples` (by count) for which `holds` is true.
fn share(samples: &[ProcessSample], holds: impl Fn(&ProcessSample) -> bool) -> (f64, i64) {
    let total: i64 = samples.iter().map(|sample| sample.count).sum();
    let hits: i64 = samples
        .iter()
        .filter(|sample| holds(sample))
        .map(|sample| sample.count)
        .sum();
    (hits as f64 / total.max(1) as f64, total)
}

fn render(samples: &[ProcessSample]) -> String {
    let mut stacks: Vec<(String, i64)> = samples
        .iter()
        .map(|sample| {
            let frames: Vec<String> = sample
                .frames
                .iter()
                .map(|frame| match frame.mapping.as_str() {
                    RUBY_MAPPING => format!("{}@{}:{}", frame.name, frame.file, frame.line),
                    _ => frame.name.clone(),
                })
                .collect();
            (frames.join(" < "), sample.count)
        })
        .collect();
    stacks.sort_by_key(|(_, count)| -count);
    stacks
        .iter()
        .take(8)
        .map(|(stack, count)| format!("  {count:4}  {stack}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Started before firn, chain.rb: its samples name the chain in order,
/// with the script's file and the lines of the spinning loop, and the
/// interpreter's native frames below the Ruby ones.
#[test]
fn chain_is_named_with_files_and_lines() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let process = RubyProcess::start("chain.rb");
    let samples = record_ruby(dir.path(), &process, Duration::from_secs(3), &[]);
    let spin = lines_with("chain.rb", "# spin");
    let (names, total) = share(&samples, |sample| ruby_names(sample) == RUBY_CHAIN);
    assert!(
        total >= MIN_SAMPLES,
        "only {total} samples:\n{}",
        render(&samples)
    );
    assert!(
        names >= MOST,
        "{:.1}% of {total} samples hold the chain {RUBY_CHAIN:?}:\n{}",
        names * 100.0,
        render(&samples)
    );
    let (lines, _) = share(&samples, |sample| {
        let frames = ruby_frames(sample);
        ruby_names(sample) == RUBY_CHAIN
            && frames
                .iter()
                .filter(|frame| frame.name != "Integer#times" && frame.name != "Kernel#loop")
                .all(|frame| frame.file.ends_with("chain.rb") && frame.line > 0)
            && spin.contains(&frames[0].line)
    });
    assert!(
        lines >= MOST,
        "{:.1}% of {total} samples hold chain.rb with its lines (the loop at {spin:?}):\n{}",
        lines * 100.0,
        render(&samples)
    );
    // The interpreter's own frames stay where they ran: below <main>.
    let (native, _) = share(&samples, |sample| {
        let main = sample.position("<main>");
        let run_node = sample.position("ruby_run_node");
        matches!((main, run_node), (Some(main), Some(run_node)) if main < run_node)
    });
    assert!(
        native >= MOST,
        "{:.1}% of samples have ruby_run_node below <main>:\n{}",
        native * 100.0,
        render(&samples)
    );
    println!(
        "chain: {:.1}% named, {:.1}% with lines, {total} samples",
        names * 100.0,
        lines * 100.0
    );
}

/// `--ruby=false`: native frames only, as before Ruby was named.
#[test]
fn ruby_false_leaves_native_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let process = RubyProcess::start("chain.rb");
    let samples = record_ruby(
        dir.path(),
        &process,
        Duration::from_secs(2),
        &["--ruby=false"],
    );
    let (named, total) = share(&samples, |sample| !ruby_frames(sample).is_empty());
    assert_eq!(
        named,
        0.0,
        "Ruby frames with --ruby=false:\n{}",
        render(&samples)
    );
    let (native, _) = share(&samples, |sample| sample.has("rb_vm_exec"));
    assert!(
        total >= MIN_SAMPLES && native >= MOST,
        "{:.1}% of {total} samples show the interpreter's rb_vm_exec:\n{}",
        native * 100.0,
        render(&samples)
    );
}

/// A C extension called from Ruby (zlib's deflate): its native frames
/// stand above the C function's Ruby frame and the Ruby method that
/// called it.
#[test]
fn c_extension_frames_stand_above_their_ruby_caller() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let process = RubyProcess::start("deflate.rb");
    let samples = record_ruby(dir.path(), &process, Duration::from_secs(3), &[]);
    let in_zlib = |frame: &SampleFrame| frame.mapping.contains("libz.so");
    let zlib: Vec<ProcessSample> = samples
        .iter()
        .filter(|sample| sample.frames.iter().any(in_zlib))
        .cloned()
        .collect();
    let (zlib_share, total) = share(&samples, |sample| sample.frames.iter().any(in_zlib));
    assert!(
        total >= MIN_SAMPLES && zlib_share >= 0.5,
        "{:.1}% of {total} samples in libz:\n{}",
        zlib_share * 100.0,
        render(&samples)
    );
    let (ordered, _) = share(&zlib, |sample| {
        let last_zlib = sample.frames.iter().rposition(in_zlib);
        let deflate = sample.position("Zlib::Deflate.deflate");
        let caller = sample.position("Packer#squeeze");
        matches!((last_zlib, deflate, caller), (Some(z), Some(d), Some(c)) if z < d && d < c)
    });
    assert!(
        ordered >= MOST,
        "{:.1}% of samples in libz have zlib < Zlib::Deflate.deflate < Packer#squeeze:\n{}",
        ordered * 100.0,
        render(&zlib)
    );
}

/// Three Ruby threads, each in its own method: every sample names its own
/// thread's method, never another's.
#[test]
fn each_thread_has_its_own_stack() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let process = RubyProcess::start("threads.rb");
    let samples = record_ruby(
        dir.path(),
        &process,
        Duration::from_secs(3),
        &["--thread-labels=true"],
    );
    let methods = ["Spinner#red", "Spinner#green", "Spinner#blue"];
    let method_of = |sample: &ProcessSample| -> Option<&'static str> {
        let names = ruby_names(sample);
        let found: Vec<&str> = methods
            .iter()
            .copied()
            .filter(|method| names.contains(method))
            .collect();
        (found.len() == 1).then(|| found[0])
    };
    let (named, total) = share(&samples, |sample| method_of(sample).is_some());
    assert!(
        total >= MIN_SAMPLES && named >= MOST,
        "{:.1}% of {total} samples name exactly one spinner:\n{}",
        named * 100.0,
        render(&samples)
    );
    // Each thread (by its Ruby name, which is the method's) only ever
    // shows its own method.
    let mut seen = std::collections::HashSet::new();
    for sample in &samples {
        let (Some(method), Some(thread)) = (method_of(sample), sample.thread_name.as_deref())
        else {
            continue;
        };
        assert_eq!(
            method.strip_prefix("Spinner#"),
            Some(thread),
            "thread {thread} sampled in {method}:\n{}",
            render(&samples)
        );
        seen.insert(thread.to_owned());
    }
    assert_eq!(
        seen.len(),
        3,
        "threads seen: {seen:?}\n{}",
        render(&samples)
    );
}
