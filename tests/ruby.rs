//! End to end: Ruby frames named by the real BPF walker and `firn` binary,
//! in processes of every CRuby the tests have: Debian 12's 3.1
//! (`ruby3.1`) and the others in the chroots `cargo xtask setup` makes
//! (Debian 11's 2.7, 13's 3.3, experimental's 3.4), running the scripts in
//! `tests/workloads/ruby/`: methods, singleton methods, blocks and C
//! functions in order with file and line, a C extension's native frames
//! above its Ruby caller, every thread its own stack, and `--ruby=false`.

mod common;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use common::*;

/// The host's interpreter, and the newer ones with the Debian suites of
/// their chroots (as `xtask/src/setup/ruby.rs` pins them).
const HOST_RUBY: &str = "3.1";
const CHROOTED_RUBIES: [(&str, &str); 3] = [("2.7", "bullseye"), ("3.3", "trixie"), ("3.4", "sid")];
/// The mapping firn puts Ruby frames in.
const RUBY_MAPPING: &str = "[ruby]";
/// Share of samples a check asks for.
const MOST: f64 = 0.90;
/// Samples a check needs at least to mean anything.
const MIN_SAMPLES: i64 = 30;

/// chain.rb's Ruby frames, innermost first (`Integer#times` and
/// `Kernel#loop` are C functions until 3.1, Ruby code of `<internal:...>`
/// files since 3.3: named the same).
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
const CORE_METHODS: [&str; 2] = ["Integer#times", "Kernel#loop"];

/// A CRuby the tests run: `/usr/bin/rubyX.Y` on the host or in a chroot.
struct Ruby {
    version: &'static str,
    root: Option<PathBuf>,
}

impl Ruby {
    fn interpreter(&self) -> String {
        format!("/usr/bin/ruby{}", self.version)
    }
}

/// The host's CRuby.
fn host_ruby() -> Ruby {
    let host = Ruby {
        version: HOST_RUBY,
        root: None,
    };
    assert!(
        Path::new(&host.interpreter()).exists(),
        "{} is missing: `cargo xtask setup` installs Debian's ruby{HOST_RUBY}",
        host.interpreter()
    );
    host
}

/// Every CRuby the tests run; a missing one fails the test (it is never
/// skipped).
fn rubies() -> Vec<Ruby> {
    let chroots = std::env::var_os("FIRN_RUBY_CHROOTS").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/firn/ruby-chroots")
        },
        PathBuf::from,
    );
    let mut rubies = vec![host_ruby()];
    for (version, suite) in CHROOTED_RUBIES {
        let root = chroots.join(suite);
        let ruby = Ruby {
            version,
            root: Some(root.clone()),
        };
        assert!(
            root.join(ruby.interpreter().trim_start_matches('/'))
                .is_file(),
            "the chroot of Ruby {version} ({}) has no {}: run `cargo xtask setup` (or `cargo \
             xtask test`) as root, which makes it with mmdebstrap from Debian {suite}",
            root.display(),
            ruby.interpreter()
        );
        rubies.push(ruby);
    }
    rubies
}

/// A Ruby script's process, killed when dropped.
struct RubyProcess {
    child: Child,
    /// The script's path as Ruby was given it (in the chroot, if any).
    script: String,
    /// The script's copy inside the chroot, removed after the process.
    _copy: Option<tempfile::TempDir>,
}

impl RubyProcess {
    /// Starts `ruby tests/workloads/ruby/<script>` (in a chroot, a copy
    /// of it in the chroot's /tmp, run as `chroot ROOT /usr/bin/rubyX.Y
    /// /tmp/...`: chroot execs, so the pid is the interpreter's) and
    /// waits until it prints `ready`.
    fn start(ruby: &Ruby, script: &str) -> Self {
        let (mut command, script_arg, copy) = match &ruby.root {
            None => {
                let path = script_path(script).to_string_lossy().into_owned();
                let mut command = Command::new(ruby.interpreter());
                command.arg(&path);
                (command, path, None)
            }
            Some(root) => {
                let copy = tempfile::Builder::new()
                    .prefix("firn-ruby-")
                    .tempdir_in(root.join("tmp"))
                    .expect("a directory in the chroot's /tmp");
                std::fs::copy(script_path(script), copy.path().join(script))
                    .expect("the script copied into the chroot");
                let inside = Path::new("/tmp")
                    .join(copy.path().file_name().expect("a name"))
                    .join(script)
                    .to_string_lossy()
                    .into_owned();
                let mut command = Command::new("/usr/sbin/chroot");
                command.arg(root).arg(ruby.interpreter()).arg(&inside);
                (command, inside, Some(copy))
            }
        };
        let mut child = command
            .env_remove("RUBYOPT")
            .env_remove("RUBYLIB")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start Ruby {}: {error}", ruby.version));
        let stdout = child.stdout.take().expect("piped stdout");
        let process = Self {
            child,
            script: script_arg,
            _copy: copy,
        };
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
            other => panic!(
                "{script} under Ruby {} did not print `ready` within 60 s: {other:?}",
                ruby.version
            ),
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

/// Started before firn, chain.rb, under every Ruby: its samples name the
/// chain in order, with the script's file (the path Ruby was given, inside
/// the chroot for a chrooted one) and the lines of the spinning loop, and
/// the interpreter's native frames below the Ruby ones.
#[test]
fn chain_is_named_with_files_and_lines() {
    require_root();
    let _serial = serial();
    for ruby in rubies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = RubyProcess::start(&ruby, "chain.rb");
        let samples = record_ruby(dir.path(), &process, Duration::from_secs(3), &[]);
        chain_is_named(&ruby, &process, &samples);
    }
}

fn chain_is_named(ruby: &Ruby, process: &RubyProcess, samples: &[ProcessSample]) {
    let version = ruby.version;
    let spin = lines_with("chain.rb", "# spin");
    let (names, total) = share(samples, |sample| ruby_names(sample) == RUBY_CHAIN);
    assert!(
        total >= MIN_SAMPLES,
        "Ruby {version}: only {total} samples:\n{}",
        render(samples)
    );
    assert!(
        names >= MOST,
        "Ruby {version}: {:.1}% of {total} samples hold the chain {RUBY_CHAIN:?}:\n{}",
        names * 100.0,
        render(samples)
    );
    let (lines, _) = share(samples, |sample| {
        let frames = ruby_frames(sample);
        ruby_names(sample) == RUBY_CHAIN
            && frames
                .iter()
                .filter(|frame| !CORE_METHODS.contains(&frame.name.as_str()))
                .all(|frame| frame.file == process.script && frame.line > 0)
            && spin.contains(&frames[0].line)
    });
    assert!(
        lines >= MOST,
        "Ruby {version}: {:.1}% of {total} samples hold {} with its lines (the loop at \
         {spin:?}):\n{}",
        lines * 100.0,
        process.script,
        render(samples)
    );
    // The interpreter's own frames stay where they ran: below <main>.
    let (native, _) = share(samples, |sample| {
        let main = sample.position("<main>");
        let run_node = sample.position("ruby_run_node");
        matches!((main, run_node), (Some(main), Some(run_node)) if main < run_node)
    });
    assert!(
        native >= MOST,
        "Ruby {version}: {:.1}% of samples have ruby_run_node below <main>:\n{}",
        native * 100.0,
        render(samples)
    );
    println!(
        "Ruby {version} chain: {:.1}% named, {:.1}% with lines, {total} samples",
        names * 100.0,
        lines * 100.0
    );
}

/// chain.rb started under every Ruby once firn samples the whole host:
/// named as one started before it (firn finds the interpreter once the
/// loader mapped it, on the samples whose addresses the exec's maps
/// lacked).
#[test]
fn a_ruby_started_after_firn_is_named() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut recording = Recording::start(dir.path(), &["--duration", "600s"]);
    recording.wait_until_sampling();
    let processes: Vec<(Ruby, RubyProcess)> = rubies()
        .into_iter()
        .map(|ruby| {
            let process = RubyProcess::start(&ruby, "chain.rb");
            (ruby, process)
        })
        .collect();
    for (_, process) in &processes {
        let before = cpu_time(process.pid()).expect("the process runs");
        wait_for_cpu_time(
            process.pid(),
            before + Duration::from_secs(2),
            Duration::from_secs(120),
        );
    }
    let (_, profile) = recording.interrupt();
    for (ruby, process) in &processes {
        chain_is_named(ruby, process, &process_samples(&profile, process.pid()));
    }
}

/// `--ruby=false`: native frames only, as before Ruby was named.
#[test]
fn ruby_false_leaves_native_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let process = RubyProcess::start(&host_ruby(), "chain.rb");
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

/// A C extension called from Ruby (zlib's deflate), under every Ruby:
/// its native frames stand above the C function's Ruby frame and the Ruby
/// method that called it.
#[test]
fn c_extension_frames_stand_above_their_ruby_caller() {
    require_root();
    let _serial = serial();
    for ruby in rubies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = RubyProcess::start(&ruby, "deflate.rb");
        let samples = record_ruby(dir.path(), &process, Duration::from_secs(3), &[]);
        extension_stands_above_its_caller(&ruby, &samples);
    }
}

fn extension_stands_above_its_caller(ruby: &Ruby, samples: &[ProcessSample]) {
    let version = ruby.version;
    let in_zlib = |frame: &SampleFrame| frame.mapping.contains("libz.so");
    let zlib: Vec<ProcessSample> = samples
        .iter()
        .filter(|sample| sample.frames.iter().any(in_zlib))
        .cloned()
        .collect();
    let (zlib_share, total) = share(samples, |sample| sample.frames.iter().any(in_zlib));
    assert!(
        total >= MIN_SAMPLES && zlib_share >= 0.5,
        "Ruby {version}: {:.1}% of {total} samples in libz:\n{}",
        zlib_share * 100.0,
        render(samples)
    );
    let (ordered, _) = share(&zlib, |sample| {
        let last_zlib = sample.frames.iter().rposition(in_zlib);
        let deflate = sample.position("Zlib::Deflate.deflate");
        let caller = sample.position("Packer#squeeze");
        matches!((last_zlib, deflate, caller), (Some(z), Some(d), Some(c)) if z < d && d < c)
    });
    assert!(
        ordered >= MOST,
        "Ruby {version}: {:.1}% of samples in libz have zlib < Zlib::Deflate.deflate < \
         Packer#squeeze:\n{}",
        ordered * 100.0,
        render(&zlib)
    );
}

/// Three Ruby threads, each in its own method, under every Ruby: every
/// sample names its own thread's method, never another's.
#[test]
fn each_thread_has_its_own_stack() {
    require_root();
    let _serial = serial();
    for ruby in rubies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = RubyProcess::start(&ruby, "threads.rb");
        let samples = record_ruby(
            dir.path(),
            &process,
            Duration::from_secs(3),
            &["--thread-labels=true"],
        );
        threads_have_their_own_stacks(&ruby, &samples);
    }
}

fn threads_have_their_own_stacks(ruby: &Ruby, samples: &[ProcessSample]) {
    let version = ruby.version;
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
    let (named, total) = share(samples, |sample| method_of(sample).is_some());
    assert!(
        total >= MIN_SAMPLES && named >= MOST,
        "Ruby {version}: {:.1}% of {total} samples name exactly one spinner:\n{}",
        named * 100.0,
        render(samples)
    );
    // Each thread (by its Ruby name, which is the method's) only ever
    // shows its own method.
    let mut seen = std::collections::HashSet::new();
    for sample in samples {
        let (Some(method), Some(thread)) = (method_of(sample), sample.thread_name.as_deref())
        else {
            continue;
        };
        assert_eq!(
            method.strip_prefix("Spinner#"),
            Some(thread),
            "Ruby {version}: thread {thread} sampled in {method}:\n{}",
            render(samples)
        );
        seen.insert(thread.to_owned());
    }
    assert_eq!(
        seen.len(),
        3,
        "Ruby {version}: threads seen: {seen:?}\n{}",
        render(samples)
    );
}
