//! End to end: processes of a few milliseconds, sampled whole-system
//! while they come and go, unwound without frame pointers and placed whole
//! from their first sample: the kernel captures their mappings as they
//! exit or execute another program (issue 28's lifetimes, subshells and
//! exec chains).

mod common;

use agent_pprof::{Reader, proto::Profile};
use common::*;
use std::{process::Command, time::Duration};

/// The chain of chain_inline's benchmark threads.
const WORKER_CHAIN: [&str; 5] = [
    "burn_leaf",
    "level_three",
    "level_two",
    "level_one",
    "worker",
];

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
    let _ = bash_runs_are_complete("subsh", "subshells", |shell| {
        format!(
            "{shell} -c 'for i in $(seq 150); do ( x=0; while [ $x -lt 2000 ]; do x=$((x+1)); done ); done'"
        )
    });
}

/// A shell that computes a while and then executes another program (a
/// wrapper's `exec "$@"`): the samples of its own image are placed with the
/// mappings captured as the exec began, complete down to bash's entry,
/// never with the next program's maps.
#[test]
fn programs_ending_in_an_exec_are_complete() {
    // After the exec the process is `true`: only the shell's own image
    // counts.
    let profile = bash_runs_are_complete("execsh", "shells ending in an exec", |shell| {
        format!(
            "for i in $(seq 150); do {shell} -c 'x=0; while [ $x -lt 2000 ]; do x=$((x+1)); done; exec /bin/true'; done"
        )
    });
    // Nor are they labelled as the next program, whose /proc entries
    // firn would find when it handles them.
    let labelled_true: i64 = Reader::new(&profile)
        .samples()
        .filter(|sample| {
            sample.label("comm") == Some("execsh") && sample.label("executable") == Some("true")
        })
        .map(|sample| sample.count())
        .sum();
    assert_eq!(labelled_true, 0, "samples of the shell labelled as `true`");
}

/// Records the whole system while `sh -c` runs the script `script` makes
/// of a copy of bash named `name` (so that no other shell's samples
/// count), then wants its samples complete; returns the profile.
fn bash_runs_are_complete(name: &str, what: &str, script: impl FnOnce(&str) -> String) -> Profile {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let shell = dir.path().join(name);
    std::fs::copy("/bin/bash", &shell).expect("copy bash");
    let mut recording = Recording::start(dir.path(), &["--duration", "120s"]);
    recording.wait_until_sampling();
    let status = Command::new("sh")
        .args(["-c", &script(&shell.display().to_string())])
        .status()
        .expect("sh runs");
    assert!(status.success(), "the {what} failed");
    let (log, profile) = recording.interrupt();
    let stacks = placed_stacks_of_comm(&profile, name);
    let (share, total) = complete_share(&stacks);
    eprintln!(
        "bash {what}: {:.1}% of {total} samples complete",
        share * 100.0
    );
    let incomplete: Vec<_> = stacks
        .iter()
        .filter(|(names, _)| !is_complete(names))
        .cloned()
        .collect();
    assert!(
        total >= 50 && share >= LIFETIME_COMPLETE,
        "{:.1}% of {total} samples of {what} complete; the others:\n{}\n{log}",
        share * 100.0,
        describe(&incomplete)
    );
    profile
}

/// A program 40 directories deep (43 path components, beyond the 12 the
/// exit walk once stopped at): each run's mappings are captured with their
/// whole path, none left to be found by device and inode alone, and the
/// runs' samples are placed whole.
#[test]
fn deep_paths_are_captured_whole() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let deep = (0..40).fold(dir.path().to_path_buf(), |path, level| {
        path.join(format!("d{level:02}"))
    });
    std::fs::create_dir_all(&deep).expect("the deep directories");
    let binary = build_no_fp_chain(&deep);
    // The runs wait for firn: profiled by pid (the shell and what it
    // starts), so no other process's paths count.
    let go = dir.path().join("go");
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.05; done; \
         for i in $(seq 8); do {binary} 100000 0.1 1 >/dev/null; done",
        go = go.display(),
        binary = binary.display()
    );
    let mut runs = TestProcess::spawn(Command::new("sh").args(["-c", &script]));
    let store = dir.path().join("store");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--pid",
            &runs.pid().to_string(),
            "--local-store-directory",
            store.to_str().expect("utf-8"),
        ],
        &[],
    );
    let address = agent.http_address();
    agent.wait_until("/ready", Duration::from_secs(120), || {
        get(address, "/ready").is_ok_and(|(status, _)| status == 200)
    });
    let captured = |outcome: &str| {
        metric(
            address,
            &format!("firn_process_mappings_captured_total{{outcome=\"{outcome}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let walked_before = captured("written");
    std::fs::write(&go, b"").expect("the go file");
    let status = runs.wait_for_exit(Duration::from_secs(120));
    assert!(status.success(), "the runs failed: {status}");
    // Each run maps at least the program, libc and the loader; the
    // counters are mirrored once a second.
    agent.wait_until(
        "the runs' mappings captured",
        Duration::from_secs(30),
        || captured("written") >= walked_before + 8.0 * 3.0,
    );
    let written = captured("written") - walked_before;
    let without_path = captured("no_path");
    let Stopped { log, .. } = agent.stop();
    eprintln!("deep paths: {written} mappings captured, {without_path} without their whole path");
    assert_eq!(
        without_path, 0.0,
        "{without_path} of {written} mappings captured without their whole path:\n{log}"
    );
}
