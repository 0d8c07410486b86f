//! End to end: symbols like a debugger. The real BPF program and `firn`
//! binary against workloads built here: DWARF lines and inline frames,
//! separate debug files, JIT perf maps, other mount namespaces, processes
//! that exit (and whose files vanish) before the profile is built.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use agent_pprof::{FrameView, Reader, proto::Profile};
use common::*;

/// The chain of `inline_chain.c`, leaf first, with the inlined function.
const INLINE_CHAIN: [&str; 6] = [
    "mix_step",
    "burn_leaf",
    "level_three",
    "level_two",
    "level_one",
    "main",
];
/// CPU time a workload spends before it exits under a recording: some
/// 200 samples at 100 Hz.
const SAMPLED_FOR: Duration = Duration::from_secs(2);
/// Complete stacks need frame pointers until the DWARF unwinder lands.
const FLAGS: [&str; 3] = ["-O2", "-g", "-fno-omit-frame-pointer"];

/// One source-level frame as the profile holds it.
#[derive(Clone, Debug)]
struct Frame {
    name: String,
    file: String,
    line: i64,
}

impl Frame {
    /// `None` for a location nobody named.
    fn of(frame: &FrameView<'_>) -> Option<Self> {
        Some(Self {
            name: frame.name?.to_owned(),
            file: frame.file.to_owned(),
            line: frame.line,
        })
    }
}

/// Named frames and counts of every sample of `pid`: leaf first, inlined
/// functions before their caller.
fn samples_of(profile: &Profile, pid: u32) -> Vec<(Vec<Frame>, i64)> {
    let pid = pid.to_string();
    Reader::new(profile)
        .samples()
        .filter(|s| s.label("pid") == Some(pid.as_str()))
        .map(|s| (s.frames().iter().filter_map(Frame::of).collect(), s.count()))
        .collect()
}

fn names(samples: &[(Vec<Frame>, i64)]) -> Vec<(Vec<String>, i64)> {
    samples
        .iter()
        .map(|(frames, count)| (frames.iter().map(|f| f.name.clone()).collect(), *count))
        .collect()
}

/// The 1-based line of `inline_chain.c` holding `marker`.
fn line_of(marker: &str) -> i64 {
    let source = std::fs::read_to_string(workloads_dir().join("inline_chain.c")).expect("source");
    source
        .lines()
        .position(|line| line.contains(marker))
        .map(|index| index as i64 + 1)
        .unwrap_or_else(|| panic!("no `{marker}` in inline_chain.c"))
}

/// Checks names, files and lines of the samples of `pid`: the whole chain
/// in at least `chain_min` of them, with the inline frame in at least
/// `inline_min`, and file:line right for every frame of the chain.
fn assert_debugger_quality(profile: &Profile, pid: u32, chain_min: f64, inline_min: f64) {
    let samples = samples_of(profile, pid);
    let named = names(&samples);
    let (share, total) = chain_share(&named, &CHAIN);
    // ~300 on an idle machine; the shares below are what is checked.
    assert!(total >= 60, "too few samples of the workload: {total}");
    assert!(
        share >= chain_min,
        "only {:.1}% of {total} samples hold the chain:\n{}",
        share * 100.0,
        describe(&named)
    );
    let (inline_share, _) = chain_share(&named, &INLINE_CHAIN);
    assert!(
        inline_share >= inline_min,
        "the inlined mix_step shows in only {:.1}% of samples:\n{}",
        inline_share * 100.0,
        describe(&named)
    );

    let mix_body = line_of("begin:mix_step")..=line_of("end:mix_step");
    let leaf_body = line_of("line:burn_leaf") - 3..=line_of("line:burn_leaf") + 3;
    for (frames, _) in &samples {
        let Some(at) = frames.iter().position(|f| f.name == "burn_leaf") else {
            continue;
        };
        if frames.len() < at + 5 || frames[at + 1].name != "level_three" {
            continue;
        }
        for frame in &frames[at..at + 5] {
            assert!(
                frame.file.ends_with("tests/workloads/inline_chain.c"),
                "{frame:?} names its source file"
            );
        }
        let inlined = at > 0 && frames[at - 1].name == "mix_step";
        if inlined {
            let mix = &frames[at - 1];
            assert!(mix_body.contains(&mix.line), "{mix:?} lies in mix_step");
            assert!(mix.file.ends_with("inline_chain.c"), "{mix:?}");
            assert_eq!(
                frames[at].line,
                line_of("line:burn_leaf"),
                "burn_leaf's frame is the call site of mix_step: {frames:?}"
            );
        } else {
            assert!(
                leaf_body.contains(&frames[at].line),
                "burn_leaf's own line: {frames:?}"
            );
        }
        for (offset, caller) in ["level_three", "level_two", "level_one"].iter().enumerate() {
            let frame = &frames[at + 1 + offset];
            assert_eq!(
                (frame.name.as_str(), frame.line),
                (*caller, line_of(&format!("line:{caller}"))),
                "{caller} is at its call line: {frames:?}"
            );
        }
    }

    let mapping = Reader::new(profile)
        .mappings()
        .find(|m| m.filename.ends_with("/inline_chain") || m.filename.ends_with("/app"))
        .expect("the workload's mapping")
        .mapping;
    assert!(
        mapping.has_functions
            && mapping.has_filenames
            && mapping.has_line_numbers
            && mapping.has_inline_frames,
        "the mapping says what its locations hold: {mapping:?}"
    );
    agent_pprof::validate(profile).expect("the profile follows the Parca rules");
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|error| panic!("{program} is needed: {error}"));
    assert!(status.success(), "{program} {args:?} failed");
}

fn build_inline_chain(dir: &Path) -> PathBuf {
    build_c(dir, "inline_chain.c", "inline_chain", &FLAGS)
}

fn build_id_hex(binary: &Path) -> String {
    let bytes = std::fs::read(binary).expect("binary");
    agent_elf::read_layout(&bytes)
        .expect("ELF")
        .build_id
        .expect("gcc writes a build id")
        .to_hex()
}

/// Removes a file when the test ends, however it ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        // The `.build-id/xx` directory, if the test made it and it is empty.
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Built as release code usually is, without frame pointers: DWARF
/// unwinding gives the whole chain, DWARF lines and inline trees name it.
#[test]
fn dwarf_gives_inline_frames_and_lines_for_the_whole_chain() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_c(
        dir.path(),
        "inline_chain.c",
        "inline_chain",
        &["-O2", "-fomit-frame-pointer", "-g"],
    );
    let workload = TestProcess::spawn(Command::new(&binary).arg("100000"));
    workload.wait_until_running();
    let (_, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    assert_debugger_quality(&profile, workload.pid(), 0.95, 0.95);
}

/// The debug file installed where distributions put it,
/// /usr/lib/debug/.build-id/xx/rest.debug, found with no flag at all.
#[test]
fn stripped_binary_finds_its_debug_file_by_build_id() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_inline_chain(dir.path());
    let hex = build_id_hex(&binary);
    let debug_dir = Path::new("/usr/lib/debug/.build-id").join(&hex[..2]);
    std::fs::create_dir_all(&debug_dir).expect("/usr/lib/debug/.build-id");
    let debug_file = RemoveOnDrop(debug_dir.join(format!("{}.debug", &hex[2..])));
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            binary.to_str().expect("utf-8"),
            debug_file.0.to_str().expect("utf-8"),
        ],
    );
    // No debuglink: only the build id can lead to the debug file.
    run("strip", &["--strip-all", binary.to_str().expect("utf-8")]);

    let workload = TestProcess::spawn(Command::new(&binary).arg("100000"));
    workload.wait_until_running();
    let (log, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(3), &[]);
    assert_debugger_quality(&profile, workload.pid(), 0.90, 0.90);
    assert!(!log.contains("panicked"), "{log}");
}

/// `.gnu_debuglink` resolved under a debug directory given with
/// `--debuginfo-directories` (GDB's `<dir>/<object's dir>/<link name>`).
#[test]
fn stripped_binary_finds_its_debug_file_by_debuglink() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_inline_chain(dir.path());
    let debug_root = dir.path().join("debug-root");
    let relative = dir.path().strip_prefix("/").expect("absolute tempdir");
    let linked_dir = debug_root.join(relative);
    std::fs::create_dir_all(&linked_dir).expect("debug dir");
    let debug_file = linked_dir.join("inline_chain.dbg");
    let path = |p: &Path| p.to_str().expect("utf-8").to_owned();
    run(
        "objcopy",
        &["--only-keep-debug", &path(&binary), &path(&debug_file)],
    );
    // objcopy reads the debug file for the link's CRC, named by its base name.
    run(
        "objcopy",
        &[
            "--strip-all",
            "--remove-section=.note.gnu.build-id",
            &format!("--add-gnu-debuglink={}", path(&debug_file)),
            &path(&binary),
        ],
    );
    let workload = TestProcess::spawn(Command::new(&binary).arg("100000"));
    workload.wait_until_running();
    let pid = workload.pid().to_string();
    let (_, profile) = record(
        dir.path(),
        &[
            "--duration",
            "3s",
            "--pid",
            &pid,
            "--debuginfo-directories",
            &path(&debug_root),
        ],
    );
    assert_debugger_quality(&profile, workload.pid(), 0.90, 0.90);
}

/// The binary and its debug file exist only inside a private mount
/// namespace, and the process exits (taking the namespace with it) before
/// the profile is built: both were opened while it ran.
#[test]
fn binary_only_inside_another_mount_namespace_is_symbolized() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_inline_chain(dir.path());
    let hex = build_id_hex(&binary);
    let staged_debug = dir.path().join("staged.debug");
    let path = |p: &Path| p.to_str().expect("utf-8").to_owned();
    run(
        "objcopy",
        &["--only-keep-debug", &path(&binary), &path(&staged_debug)],
    );
    run("strip", &["--strip-all", &path(&binary)]);
    // Empty on the host; a private tmpfs inside the namespace.
    let mount_point = dir.path().join("private");
    std::fs::create_dir_all(&mount_point).expect("mount point");
    std::fs::create_dir_all("/usr/lib/debug").expect("/usr/lib/debug");
    let script = format!(
        "set -e
         mount -t tmpfs firn-test {mnt}
         cp {binary} {mnt}/app
         mount -t tmpfs firn-test-debug /usr/lib/debug
         mkdir -p /usr/lib/debug/.build-id/{dir}
         cp {debug} /usr/lib/debug/.build-id/{dir}/{rest}.debug
         exec {mnt}/app 100000",
        mnt = path(&mount_point),
        binary = path(&binary),
        debug = path(&staged_debug),
        dir = &hex[..2],
        rest = &hex[2..],
    );
    let workload = TestProcess::spawn(Command::new("unshare").args(["-m", "sh", "-c", &script]));
    // The script has mounted, copied and exec'd the app.
    let exe = format!("/proc/{}/exe", workload.pid());
    wait_for(
        "the namespaced app to run",
        Duration::from_secs(30),
        || std::fs::read_link(&exe).is_ok_and(|path| path.ends_with("app")),
        || format!("{exe}: {:?}", std::fs::read_link(&exe)),
    );
    assert!(
        std::fs::read_dir(&mount_point)
            .expect("mount point")
            .next()
            .is_none(),
        "the host must not see the namespace's files"
    );
    let pid = workload.pid().to_string();
    // Ended once the workload is gone (the duration only bounds it).
    let mut recording = Recording::start(dir.path(), &["--duration", "60s", "--pid", &pid]);
    recording.wait_until_sampling();
    // Sampled for a while, then gone before the recording ends.
    let pid = workload.pid();
    wait_for_cpu_time(pid, SAMPLED_FOR, Duration::from_secs(50));
    drop(workload);
    let (_, profile) = recording.interrupt();
    let comms: Vec<&str> = Reader::new(&profile)
        .samples()
        .filter_map(|s| s.label("comm"))
        .collect();
    assert!(
        comms.contains(&"app"),
        "the exec'd app was sampled: {comms:?}"
    );
    assert_debugger_quality(&profile, pid, 0.90, 0.90);
}

/// A process that exits, and whose binary is deleted, before the profile
/// is built still gets names and lines (the grace period and the objects
/// kept open).
#[test]
fn exited_process_with_deleted_binary_is_symbolized() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_inline_chain(dir.path());
    // Ended once the workload and its binary are gone (the duration only
    // bounds it).
    let mut recording = Recording::start(dir.path(), &["--duration", "60s"]);
    recording.wait_until_sampling();
    // Started after firn: its maps are read on the first sample.
    let workload = TestProcess::spawn(Command::new(&binary).arg("100000"));
    let pid = workload.pid();
    wait_for_cpu_time(pid, SAMPLED_FOR, Duration::from_secs(50));
    drop(workload);
    std::fs::remove_file(&binary).expect("delete the binary");
    let (_, profile) = recording.interrupt();
    assert_debugger_quality(&profile, pid, 0.90, 0.90);
}

#[test]
fn node_perf_map_names_javascript_functions() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("hot.js");
    std::fs::write(
        &script,
        "function hotLoop(n) {\n\
         \x20 let x = 0;\n\
         \x20 for (let i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; }\n\
         \x20 return x;\n\
         }\n\
         function outerCaller() {\n\
         \x20 let s = 0;\n\
         \x20 for (;;) { s += hotLoop(100000); if (s < 0) break; }\n\
         }\n\
         outerCaller();\n",
    )
    .expect("script");
    // Node also writes a v8 log into its working directory.
    let node = TestProcess::spawn(
        Command::new("node")
            .current_dir(dir.path())
            .arg("--perf-basic-prof")
            .arg(&script),
    );
    let perf_map = RemoveOnDrop(PathBuf::from(format!("/tmp/perf-{}.map", node.pid())));
    // Until V8 has compiled the hot code with its optimizer (`JS:*`), which
    // runs from then on.
    wait_for(
        "V8 to list optimized code of hot.js in its perf map",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&perf_map.0).is_ok_and(|map| {
                map.lines().any(|line| {
                    line.contains("JS:*")
                        && line.contains("hot.js")
                        && (line.contains("hotLoop") || line.contains("outerCaller"))
                })
            })
        },
        || std::fs::read_to_string(&perf_map.0).unwrap_or_default(),
    );
    let pid = node.pid().to_string();
    // Perf maps name V8's code when firn does not read V8's heap.
    let (_, profile) = record(
        dir.path(),
        &["--duration", "3s", "--pid", &pid, "--nodejs=false"],
    );
    let stacks = stacks_of(&profile, node.pid());
    let total: i64 = stacks.iter().map(|(_, count)| count).sum();
    assert!(total >= 60, "node should be busy: {total} samples");
    // V8 may inline hotLoop into outerCaller; either is the script's code.
    let from_script = |name: &String| {
        name.starts_with("JS:")
            && name.contains("hot.js")
            && (name.contains("hotLoop") || name.contains("outerCaller"))
    };
    let in_js: i64 = stacks
        .iter()
        .filter(|(names, _)| names.iter().any(from_script))
        .map(|(_, count)| count)
        .sum();
    assert!(
        in_js * 2 >= total,
        "JavaScript names from the perf map in {in_js} of {total} samples:\n{}",
        describe(&stacks)
    );
}

/// V8's `--perf-prof` writes a jitdump (`jit-PID.dump` in its working
/// directory, found by the page of it Node maps) instead of a perf map.
/// V8 buffers the file: its newest code (the hot loop's) reaches it when
/// Node exits, so Node runs for less than the recording and firn names its
/// frames from the file it kept open.
#[test]
fn node_jitdump_names_javascript_functions() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("hot.js");
    std::fs::write(
        &script,
        "function hotLoop(n) {\n\
         \x20 let x = 0;\n\
         \x20 for (let i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; }\n\
         \x20 return x;\n\
         }\n\
         function outerCaller(end) {\n\
         \x20 let s = 0;\n\
         \x20 while (Date.now() < end) { s += hotLoop(100000); }\n\
         \x20 return s;\n\
         }\n\
         outerCaller(Date.now() + 5000);\n",
    )
    .expect("script");
    let node = TestProcess::spawn(
        Command::new("node")
            .current_dir(dir.path())
            .arg("--perf-prof")
            .arg(&script),
    );
    let pid = node.pid().to_string();
    let (_, profile) = record(
        dir.path(),
        &["--duration", "7s", "--pid", &pid, "--nodejs=false"],
    );
    let stacks = stacks_of(&profile, node.pid());
    let total: i64 = stacks.iter().map(|(_, count)| count).sum();
    assert!(total >= 60, "node should be busy: {total} samples");
    let from_script = |name: &String| {
        name.starts_with("JS:")
            && name.contains("hot.js")
            && (name.contains("hotLoop") || name.contains("outerCaller"))
    };
    let in_js: i64 = stacks
        .iter()
        .filter(|(names, _)| names.iter().any(from_script))
        .map(|(_, count)| count)
        .sum();
    assert!(
        in_js * 2 >= total,
        "JavaScript names from the jitdump in {in_js} of {total} samples:\n{}",
        describe(&stacks)
    );
}
