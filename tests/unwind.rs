//! End to end: stacks of code built without frame pointers, unwound with
//! DWARF CFI over the stack copies the real BPF program takes. Workloads
//! are built here (gcc, rustc, go) and checked by function names and their
//! order.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use agent_pprof::{Reader, proto::Profile};
use common::*;

/// An optimized C build without frame pointers: the case the DWARF unwinder
/// exists for.
const NO_FP_FLAGS: [&str; 4] = ["-O2", "-fomit-frame-pointer", "-g", "-pthread"];

/// The chain of chain_inline's benchmark threads.
const WORKER_CHAIN: [&str; 5] = [
    "burn_leaf",
    "level_three",
    "level_two",
    "level_one",
    "worker",
];

const RUST_CHAIN: [&str; 5] = [
    "rust_chain::burn_leaf",
    "rust_chain::level_three",
    "rust_chain::level_two",
    "rust_chain::level_one",
    "rust_chain::main",
];

const GO_CHAIN: [&str; 5] = [
    "main.burn_leaf",
    "main.level_three",
    "main.level_two",
    "main.level_one",
    "main.main",
];

/// A counter from firn's summary line (`name=value`).
fn summary_value(log: &str, name: &str) -> u64 {
    let prefix = format!("{name}=");
    log.lines()
        .filter(|line| line.contains("profile written"))
        .flat_map(str::split_whitespace)
        .find_map(|field| field.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in firn's summary:\n{log}"))
}

fn build_no_fp_chain(dir: &Path) -> PathBuf {
    build_c(dir, "chain_inline.c", "chain_inline", &NO_FP_FLAGS)
}

fn spawn_spinning(binary: &Path) -> TestProcess {
    let process = TestProcess::spawn(Command::new(binary).arg("100000"));
    process.wait_until_running();
    process
}

fn assert_complete(stacks: &[(Vec<String>, i64)], chain: &[&str], wanted: f64) {
    let (share, total) = chain_share(stacks, chain);
    assert!(total >= 150, "too few samples of the workload: {total}");
    assert!(
        share >= wanted,
        "only {:.1}% of {total} samples hold the whole chain {chain:?}:\n{}",
        share * 100.0,
        describe(stacks)
    );
}

#[test]
fn c_without_frame_pointers_has_complete_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = spawn_spinning(&build_no_fp_chain(dir.path()));
    let pid = workload.pid().to_string();

    let (log, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    let stacks = stacks_of(&profile, workload.pid());
    assert_complete(&stacks, &CHAIN, 0.95);
    assert!(
        summary_value(&log, "dwarf_stacks") > 0,
        "`auto` unwinds a binary without frame pointers with DWARF"
    );

    // The kernel's frame-pointer walk alone cannot follow this code: the
    // completeness above is the CFI's doing.
    let (_, walked) = record(
        dir.path(),
        &[
            "--duration",
            "2s",
            "--pid",
            &pid,
            "--unwind",
            "fp",
            "--leaf-stack-copy-bytes",
            "0",
        ],
    );
    let (share, _) = chain_share(&stacks_of(&walked, workload.pid()), &CHAIN);
    assert!(
        share < 0.5,
        "frame pointers alone should lose the chain, yet {:.1}% were complete",
        share * 100.0
    );
}

/// Frame names of every sample of processes named `comm`.
fn stacks_of_comm(profile: &Profile, comm: &str) -> Vec<(Vec<String>, i64)> {
    Reader::new(profile)
        .samples()
        .filter(|sample| sample.label("comm") == Some(comm))
        .map(|sample| (sample.function_names(), sample.count()))
        .collect()
}

/// Of the samples the runs' CPU time should give at 100 Hz, the share firn
/// keeps reliably today, measured on a loaded machine (65–99%).
const SHORT_LIVED_KEPT: f64 = 0.5;
/// Of those samples, the share that holds the whole chain: 72–91% when
/// firn read a new program's maps from /proc, 96–98% measured with the
/// mappings captured at exit (Linux 6.16+); the rest are a run starting
/// or ending. Where maps are never read, none is whole.
const SHORT_LIVED_COMPLETE: f64 = 0.6;

#[test]
fn short_lived_processes_are_complete_from_their_first_sample() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_no_fp_chain(dir.path());
    // Whole system: firn learns of each run only from its exec, and each
    // run is over about when firn first drains the ring buffer. Ended once
    // the runs are (the duration only bounds it).
    let mut recording = Recording::start(dir.path(), &["--duration", "120s"]);
    recording.wait_until_sampling();
    let script = format!(
        "for i in $(seq 24); do {} 100000 0.15 2 >/dev/null; done",
        binary.display()
    );
    let before = reaped_children_cpu_time();
    let status = Command::new("sh")
        .args(["-c", &script])
        .status()
        .expect("sh runs");
    assert!(status.success(), "the short runs failed");
    // What the runs got of the CPUs (about 7 s on an idle machine, 1 s on
    // one eight times overloaded): the samples firn should take of them at
    // 100 Hz.
    let spent = reaped_children_cpu_time() - before;
    let expected = (spent.as_secs_f64() * 100.0) as i64;
    let (log, profile) = recording.interrupt();
    // Its counts of samples kept and lost (`lost=`: the ring buffer was
    // full), for the messages.
    let summary = log
        .lines()
        .find(|line| line.contains("profile written"))
        .unwrap_or_default()
        .to_owned();
    // Every sample of the runs, named or not: a run whose maps firn never
    // read has only addresses (`0x…`) and counts against the share. The
    // few samples of a run starting up (the dynamic loader, before its
    // threads) hold no chain either.
    let stacks = stacks_of_comm(&profile, "chain_inline");
    let (share, total) = chain_share(&stacks, &WORKER_CHAIN);
    let kept = total as f64 / expected.max(1) as f64;
    eprintln!(
        "short-lived runs: {total} samples of ~{expected} for {spent:?} of CPU ({:.1}% kept), {:.1}% with the whole chain",
        kept * 100.0,
        share * 100.0
    );
    // The runs' pids tell their samples apart; the names say what is wrong.
    let mut incomplete = std::collections::BTreeMap::<Vec<String>, i64>::new();
    for (names, count) in &stacks {
        if !holds_chain(names, &WORKER_CHAIN) {
            *incomplete.entry(names.clone()).or_default() += count;
        }
    }
    let incomplete: Vec<_> = incomplete.into_iter().collect();
    assert!(
        expected >= 50 && kept >= SHORT_LIVED_KEPT,
        "{total} samples of the runs, of ~{expected} for {spent:?} of CPU time:\n{summary}"
    );
    assert!(
        share >= SHORT_LIVED_COMPLETE,
        "{:.1}% of {total} samples of short-lived processes are complete; the others:\n{}",
        share * 100.0,
        describe(&incomplete)
    );
}

#[test]
fn frames_beyond_the_copy_are_kept_and_counted_as_truncated() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = spawn_spinning(&build_no_fp_chain(dir.path()));
    // level_two's frame alone is larger than this copy.
    let (log, profile) = record_busy(
        dir.path(),
        workload.pid(),
        Duration::from_secs(3),
        &["--unwind", "dwarf", "--stack-copy-bytes", "1KiB"],
    );
    let stacks = stacks_of(&profile, workload.pid());
    let (kept, total) = chain_share(&stacks, &CHAIN[..3]);
    let (complete, _) = chain_share(&stacks, &CHAIN);
    assert!(total >= 100, "too few samples: {total}");
    assert!(
        kept >= 0.95 && complete < 0.05,
        "the frames within the copy are kept ({:.1}%), the rest is cut ({:.1}% complete):\n{}",
        kept * 100.0,
        complete * 100.0,
        describe(&stacks)
    );
    let (truncated, unwound) = (
        summary_value(&log, "dwarf_truncated"),
        summary_value(&log, "dwarf_stacks"),
    );
    // Every sample is unwound with DWARF (`--unwind dwarf`), and cut.
    assert!(
        unwound * 10 >= total.unsigned_abs() * 9 && truncated * 100 >= unwound * 95,
        "truncated stacks are counted: {truncated} of {unwound} DWARF stacks, {total} samples"
    );
}

/// Samples of `stacks` whose stack is `spin_at_bottom`, `depth + 1`
/// frames of `descend`, then `main`: the whole recursion.
fn deep_share(stacks: &[(Vec<String>, i64)], depth: usize) -> (f64, i64) {
    let total: i64 = stacks.iter().map(|(_, count)| count).sum();
    let complete: i64 = stacks
        .iter()
        .filter(|(frames, _)| {
            let user: Vec<&str> = frames
                .iter()
                .map(String::as_str)
                .skip_while(|name| *name != "spin_at_bottom")
                .collect();
            user.len() > depth + 2
                && user[1..=depth + 1].iter().all(|name| *name == "descend")
                && user[depth + 2] == "main"
        })
        .map(|(_, count)| count)
        .sum();
    (complete as f64 / total.max(1) as f64, total)
}

/// 100 frames of ~0.5 KiB: some 50 KiB of stack. `auto` copies the most
/// the BPF program can (64 KiB) until a process's unwinds say how much it
/// needs, so the recursion is whole from the first sample; a fixed 16 KiB
/// copy cuts every stack.
#[test]
fn deep_stacks_are_complete_from_the_first_sample() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_c(
        dir.path(),
        "deep_recursion.c",
        "deep_recursion",
        &NO_FP_FLAGS,
    );
    let depth = 100;
    let workload = TestProcess::spawn(Command::new(&binary).arg(depth.to_string()));
    let maps = format!("/proc/{}/maps", workload.pid());
    wait_for(
        "the workload to map libc",
        Duration::from_secs(10),
        || std::fs::read_to_string(&maps).is_ok_and(|maps| maps.contains("libc")),
        String::new,
    );
    let pid = workload.pid().to_string();

    let (log, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    // A first copy smaller than the stack would cut the first samples.
    assert_eq!(
        summary_value(&log, "dwarf_truncated"),
        0,
        "stacks cut beyond the copy"
    );
    let stacks = stacks_of(&profile, workload.pid());
    let (share, total) = deep_share(&stacks, depth);
    assert!(total >= 150, "too few samples of the workload: {total}");
    assert!(
        share >= 0.95,
        "only {:.1}% of {total} samples hold the whole recursion:\n{}",
        share * 100.0,
        describe(&stacks)
    );

    let (_, fixed) = record(
        dir.path(),
        &[
            "--duration",
            "2s",
            "--pid",
            &pid,
            "--unwind",
            "dwarf",
            "--stack-copy-bytes",
            "16KiB",
        ],
    );
    let (share, _) = deep_share(&stacks_of(&fixed, workload.pid()), depth);
    assert!(
        share < 0.05,
        "a fixed 16 KiB copy should cut these stacks, yet {:.1}% were whole",
        share * 100.0
    );
}

#[test]
fn signal_handler_stacks_continue_into_the_interrupted_code() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_c(dir.path(), "signal_chain.c", "signal_chain", &NO_FP_FLAGS);
    let workload = TestProcess::spawn(&mut Command::new(binary));
    workload.wait_until_running();
    let (_, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    let stacks = stacks_of(&profile, workload.pid());
    let in_handler: Vec<_> = stacks
        .iter()
        .filter(|(names, _)| holds_chain(names, &["handler_burn", "on_alarm"]))
        .cloned()
        .collect();
    let (share, total) = chain_share(&in_handler, &["spin_loop", "level_one", "main"]);
    assert!(
        total >= 50,
        "the handler runs about half the time, got {total} samples in it:\n{}",
        describe(&stacks)
    );
    assert!(
        share >= 0.95,
        "{:.1}% of the handler's samples continue past the signal frame:\n{}",
        share * 100.0,
        describe(&in_handler)
    );
    // The signal frame sits between the handler and the interrupted code.
    let (names, _) = &in_handler[0];
    let handler = names.iter().position(|n| n == "on_alarm");
    let interrupted = names.iter().position(|n| n == "spin_loop");
    assert!(
        matches!((handler, interrupted), (Some(h), Some(i)) if i == h + 2),
        "handler, trampoline, interrupted code: {names:?}"
    );
}

#[test]
fn rust_release_binary_without_frame_pointers_is_complete_and_demangled() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = dir.path().join("rust_chain");
    let status = Command::new("rustc")
        .args(["-C", "opt-level=2", "-C", "force-frame-pointers=no", "-o"])
        .arg(&binary)
        .arg(workloads_dir().join("rust_chain.rs"))
        .status()
        .unwrap_or_else(|error| panic!("rustc is needed to build the Rust workload: {error}"));
    assert!(status.success(), "rustc failed to build rust_chain.rs");
    let workload = spawn_spinning(&binary);
    let (_, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    let stacks = stacks_of(&profile, workload.pid());
    assert_complete(&stacks, &RUST_CHAIN, 0.95);
}

/// The samples of the Go workload taken in the chain's leaf. The runtime's
/// own threads (`sysmon`, preemption through `mcall`) take a share of the
/// process's samples that varies from run to run (10-17%); their stacks
/// are whole but are not the chain.
fn chain_samples(profile: &Profile, pid: u32) -> Vec<(Vec<String>, i64)> {
    stacks_of(profile, pid)
        .into_iter()
        .filter(|(names, _)| names.iter().any(|name| name == GO_CHAIN[0]))
        .collect()
}

/// `tests/workloads/go_chain` built into `dir/name` with `flags`.
fn build_go_chain(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let binary = dir.join(name);
    let status = Command::new("go")
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg("main.go")
        .current_dir(workloads_dir().join("go_chain"))
        .env("GOFLAGS", "-buildvcs=false")
        .status()
        .unwrap_or_else(|error| {
            panic!("Go is needed to build the Go workload (cargo xtask setup installs it): {error}")
        });
    assert!(status.success(), "go build failed for {name}");
    binary
}

#[test]
fn go_program_has_complete_stacks_with_go_names() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_go_chain(dir.path(), "go_chain", &[]);
    let workload = spawn_spinning(&binary);
    // Go keeps frame pointers: `auto` walks them; DWARF (.debug_frame)
    // must agree.
    for unwind in ["auto", "dwarf"] {
        let (_, profile) = record_busy(
            dir.path(),
            workload.pid(),
            Duration::from_secs(3),
            &["--unwind", unwind],
        );
        assert_complete(&chain_samples(&profile, workload.pid()), &GO_CHAIN, 0.95);
    }
}

/// A Go binary stripped of its symbol table and DWARF (`-ldflags=-s -w`,
/// common in containers) is named from its `.gopclntab`, with the file and
/// line of each frame of the chain.
#[test]
fn stripped_go_program_is_named_from_its_own_table() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_go_chain(dir.path(), "go_chain_stripped", &["-ldflags=-s -w"]);
    let sections = Command::new("readelf")
        .args(["-S", "-W"])
        .arg(&binary)
        .output()
        .expect("readelf (binutils) runs");
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(
        !sections.contains(".symtab") && !sections.contains(".debug_info"),
        "the binary is stripped:\n{sections}"
    );
    let workload = spawn_spinning(&binary);
    let (_, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(3), &[]);
    assert_complete(&chain_samples(&profile, workload.pid()), &GO_CHAIN, 0.95);
    // Each function of the chain has its file and a line in it.
    let pid = workload.pid().to_string();
    let placed = Reader::new(&profile)
        .samples()
        .filter(|sample| sample.label("pid") == Some(pid.as_str()))
        .flat_map(|sample| sample.frames())
        .filter(|frame| frame.name.is_some_and(|name| GO_CHAIN.contains(&name)))
        .filter(|frame| frame.file.ends_with("go_chain/main.go") && frame.line > 0)
        .filter_map(|frame| frame.name)
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(
        placed,
        GO_CHAIN.iter().copied().collect(),
        "functions of the chain with their file and line"
    );
}

#[test]
fn frame_pointer_processes_pay_nothing_extra_in_auto() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let (log, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(3), &[]);
    assert_complete(&stacks_of(&profile, workload.pid()), &CHAIN, 0.90);
    assert_eq!(
        summary_value(&log, "dwarf_stacks"),
        0,
        "a frame-pointer binary is walked with frame pointers"
    );

    // Forced DWARF unwinds the same code just as completely.
    let (log, profile) = record_busy(
        dir.path(),
        workload.pid(),
        Duration::from_secs(3),
        &["--unwind", "dwarf"],
    );
    assert_complete(&stacks_of(&profile, workload.pid()), &CHAIN, 0.90);
    let stacks = summary_value(&log, "dwarf_stacks");
    let complete = summary_value(&log, "dwarf_complete");
    assert!(
        stacks > 0 && complete * 100 >= stacks * 95,
        "{complete} of {stacks} DWARF stacks reached the outermost frame"
    );
}

/// Where a whole user stack ends: the process's or a thread's entry, in
/// the program, libc or the dynamic loader.
const ROOT_FRAMES: [&str; 8] = [
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "start_thread",
    "clone3",
    "__clone3",
    "_dl_start",
    "_dl_start_user",
];

/// Entries without a symbol in Debian's stripped libc and loader: the
/// frame after these is libc's `start_thread` or the loader's `_start`,
/// placed in their object but unnamed (`object+0x…`).
const CALLED_FROM_UNNAMED_ENTRY: [&str; 2] = ["worker", "_dl_start"];

/// The samples of processes named `comm`, each frame by its name, an
/// unnamed one placed in an object as `object+0xADDRESS` (a stripped
/// program's static functions), an unplaced one as `0xADDRESS`.
fn placed_stacks_of_comm(profile: &Profile, comm: &str) -> Vec<(Vec<String>, i64)> {
    Reader::new(profile)
        .samples()
        .filter(|sample| sample.label("comm") == Some(comm))
        .map(|sample| {
            let names = sample
                .frames()
                .iter()
                .map(|frame| match (frame.name, frame.mapping) {
                    (Some(name), _) => name.to_owned(),
                    (None, Some(mapping)) => {
                        let object = mapping.filename.rsplit('/').next().unwrap_or_default();
                        format!("{object}+0x{:x}", frame.address)
                    }
                    (None, None) => format!("0x{:x}", frame.address),
                })
                .collect();
            (names, sample.count())
        })
        .collect()
}

/// A sample is complete when every frame is placed (an unplaced address
/// is `0x…`) and its outermost frame is an entry ([`ROOT_FRAMES`], or the
/// unnamed one after [`CALLED_FROM_UNNAMED_ENTRY`]); a sample of the
/// kernel alone (the process tearing its memory down) has nothing to place.
fn is_complete(names: &[String]) -> bool {
    let (root, rest) = match names.split_last() {
        Some((root, rest)) if root.contains("+0x") => match rest.last() {
            Some(caller) if CALLED_FROM_UNNAMED_ENTRY.contains(&caller.as_str()) => {
                (caller, &rest[..rest.len() - 1])
            }
            _ => return false,
        },
        Some(split) => split,
        None => return false,
    };
    !rest.iter().any(|name| name.starts_with("0x"))
        && (ROOT_FRAMES.contains(&root.as_str())
            || CALLED_FROM_UNNAMED_ENTRY.contains(&root.as_str())
            || root == "entry_SYSCALL_64_after_hwframe")
}

fn complete_share(stacks: &[(Vec<String>, i64)]) -> (f64, i64) {
    let total: i64 = stacks.iter().map(|(_, count)| count).sum();
    let complete: i64 = stacks
        .iter()
        .filter(|(names, _)| is_complete(names))
        .map(|(_, count)| count)
        .sum();
    (complete as f64 / total.max(1) as f64, total)
}

/// Issue 28's target is 97% at 100 and 1000 Hz. Measured on a 2-CPU VM
/// shared with other builds: 98.5-100% at 100 Hz, 97.2-98.2% at 1000 Hz,
/// 99% for subshells (the figures are printed); the rest are mostly a
/// run's first instructions (a lone unplaced frame) and threads being
/// created.
const LIFETIME_COMPLETE: f64 = 0.9;

/// Of the runs, the share whose exec found their executable's preset in
/// `EXEC_PRESETS` (counted system-wide): 94-98% measured; the others are
/// each program's runs before firn has decided its first.
const EXEC_PRESETS_APPLIED_PERCENT: u64 = 50;

/// Runs of 5, 20 and 100 ms of a C program without frame pointers,
/// dynamically linked, started one after another under whole-system
/// recording: every sample of them counts, the loader's and libc's
/// included, and must be placed whole down to an entry (issue 28).
fn lifetimes_are_complete_at(frequency: &str) {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_no_fp_chain(dir.path());
    // One name per lifetime: the comm tells their samples apart.
    let lifetimes = [
        ("life5ms", 0.005, 300),
        ("life20ms", 0.02, 100),
        ("life100ms", 0.1, 30),
    ];
    for (name, _, _) in lifetimes {
        std::fs::copy(&binary, dir.path().join(name)).expect("copy");
    }
    let mut recording = Recording::start(
        dir.path(),
        &["--duration", "120s", "--frequency", frequency],
    );
    recording.wait_until_sampling();
    for (name, seconds, runs) in lifetimes {
        let script = format!(
            "for i in $(seq {runs}); do {} 100000 {seconds} 1 >/dev/null; done",
            dir.path().join(name).display()
        );
        let status = Command::new("sh")
            .args(["-c", &script])
            .status()
            .expect("sh runs");
        assert!(status.success(), "the {name} runs failed");
    }
    let (log, profile) = recording.interrupt();
    let mut failures = Vec::new();
    // After each program's first runs, firn has written its executable's
    // preset and the BPF program finds it at the next execs: none found
    // means the two sides' keys (device and inode) differ, which only
    // costs wakeups and full first copies, invisible in the shares below.
    let runs: u64 = lifetimes.iter().map(|(_, _, runs)| runs).sum();
    let set = summary_value(&log, "exec_presets_set");
    let applied = summary_value(&log, "exec_presets_applied");
    eprintln!("{frequency} Hz: {applied} execs given a preset (of {runs} runs), {set} presets set");
    if applied < runs * EXEC_PRESETS_APPLIED_PERCENT / 100 {
        failures.push(format!(
            "{applied} execs given their executable's preset in the BPF program, of {runs} runs ({set} presets set)"
        ));
    }
    for (name, _, _) in lifetimes {
        let stacks = placed_stacks_of_comm(&profile, name);
        let (share, total) = complete_share(&stacks);
        eprintln!(
            "{frequency} Hz, {name}: {:.1}% of {total} samples complete",
            share * 100.0
        );
        if total < 20 || share < LIFETIME_COMPLETE {
            let incomplete: Vec<_> = stacks
                .iter()
                .filter(|(names, _)| !is_complete(names))
                .cloned()
                .collect();
            failures.push(format!(
                "{name}: {:.1}% of {total} samples complete; the others:\n{}",
                share * 100.0,
                describe(&incomplete)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn processes_of_5_20_and_100_ms_are_complete_at_100_hz() {
    lifetimes_are_complete_at("100");
}

#[test]
fn processes_of_5_20_and_100_ms_are_complete_at_1000_hz() {
    lifetimes_are_complete_at("1000");
}

/// `bash -c` running subshells, each a fork without exec that computes a
/// while and exits: their samples are placed with the image they forked
/// with (captured at their exit), complete down to bash's entry.
#[test]
fn bash_subshells_are_complete() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    // A name of its own, so that no other shell's samples count.
    let shell = dir.path().join("subsh");
    std::fs::copy("/bin/bash", &shell).expect("copy bash");
    let mut recording = Recording::start(dir.path(), &["--duration", "120s"]);
    recording.wait_until_sampling();
    let status = Command::new(&shell)
        .args([
            "-c",
            "for i in $(seq 150); do ( x=0; while [ $x -lt 2000 ]; do x=$((x+1)); done ); done",
        ])
        .status()
        .expect("the shell runs");
    assert!(status.success(), "the subshells failed");
    let (_, profile) = recording.interrupt();
    let stacks = placed_stacks_of_comm(&profile, "subsh");
    let (share, total) = complete_share(&stacks);
    eprintln!(
        "bash subshells: {:.1}% of {total} samples complete",
        share * 100.0
    );
    let incomplete: Vec<_> = stacks
        .iter()
        .filter(|(names, _)| !is_complete(names))
        .cloned()
        .collect();
    assert!(
        total >= 50 && share >= LIFETIME_COMPLETE,
        "{:.1}% of {total} samples of subshells complete; the others:\n{}",
        share * 100.0,
        describe(&incomplete)
    );
}
