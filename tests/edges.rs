//! End to end: what firn does at the edges. SIGHUP, a full local store,
//! log levels and flags out of range, `firn record` pointed at a path or
//! pid that cannot work, the profile counters reconciling against a real
//! Parca, and the BPF program saying why a read failed only when asked.

mod common;
mod parca_support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::*;
use parca_support::harness::{ParcaServer, free_port};

/// Every `.gz` and `.tmp` file in `dir`.
fn store_files(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the store exists")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .collect();
    let with = |extension: &str| {
        paths
            .iter()
            .filter(|path| path.extension().is_some_and(|e| e == extension))
            .cloned()
            .collect()
    };
    (with("gz"), with("tmp"))
}

#[test]
fn sighup_writes_the_last_profile_and_exits_0() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let _workload = start_chain(dir.path(), &FP_FLAGS);
    let store = dir.path().join("store");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--profiling-duration",
            "10m",
            "--local-store-directory",
            store.to_str().expect("utf-8"),
        ],
        &[],
    );
    agent.wait_for_samples(50.0);
    let Stopped { status, log, took } = agent.stop_with(libc::SIGHUP);
    assert!(status.success(), "exit status {status}:\n{log}");
    assert!(took < Duration::from_secs(10), "took {took:?}:\n{log}");
    assert!(log.contains("signal=SIGHUP"), "{log}");
    let (profiles, _) = store_files(&store);
    assert_eq!(
        profiles.len(),
        1,
        "the partial profile: {profiles:?}\n{log}"
    );
}

#[test]
fn a_full_store_logs_the_os_error_and_leaves_no_temporary_files() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let _workload = start_chain(dir.path(), &FP_FLAGS);
    let store = dir.path().join("store");
    let tmpfs = Tmpfs::mount(&store, 64 << 10);
    // Fill it: every profile write fails for want of space.
    tmpfs.fill("filler");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--profiling-duration",
            "1s",
            "--local-store-directory",
            store.to_str().expect("utf-8"),
        ],
        &[],
    );
    wait_for(
        "two failed writes",
        Duration::from_secs(60),
        || {
            agent.assert_running();
            agent.log().matches("profile dropped").count() >= 2
        },
        || agent.log(),
    );
    let address = agent.http_address();
    let dropped =
        metric(address, "firn_profiles_dropped_total{reason=\"pipeline\"}").unwrap_or(0.0);
    let Stopped { status, log, .. } = agent.stop();
    assert!(status.success(), "{log}");
    assert!(dropped >= 2.0, "{dropped} counted as dropped:\n{log}");
    assert!(
        log.lines().any(
            |line| line.contains("profile dropped") && line.contains("No space left on device")
        ),
        "the OS error is in the log line:\n{log}"
    );
    let (_, temporary) = store_files(&store);
    assert!(temporary.is_empty(), "left behind: {temporary:?}");
}

/// `firn ARGS` (with `env`) refused as a usage error, stderr holding `wanted`.
fn refused(args: &[&str], env: &[(&str, &str)], wanted: &[&str]) {
    let output = firn()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("firn runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}:\n{stderr}");
    for part in wanted {
        assert!(
            stderr.contains(part),
            "`{part}` missing for {args:?}:\n{stderr}"
        );
    }
}

#[test]
fn log_levels_and_flags_out_of_range_exit_2_naming_the_limit() {
    let levels = "off, error, warn, info, debug, trace";
    refused(&["--log-level", "warning"], &[], &["`warning`", levels]);
    refused(&[], &[("FIRN_LOG_LEVEL", "warning")], &[levels]);
    refused(&["--log-level", "info,firn=loud"], &[], &["`firn=loud`"]);
    for (flag, value, limit) in [
        ("--profiling-duration", "1ns", "at least 1s"),
        ("--profiling-duration", "500ms", "at least 1s"),
        ("--remote-store-queue-bytes", "0", "at least 1KiB"),
        ("--local-store-max-bytes", "100", "at least 1KiB"),
        ("--remote-store-rpc-unary-timeout", "10ms", "at least 1s"),
        ("--debuginfo-upload-timeout-duration", "1ms", "at least 1s"),
        ("--profiling-duration", "1000y", "at most 366 days"),
    ] {
        refused(&[flag, value], &[], &[limit]);
    }
    refused(&["record", "--duration", "0s"], &[], &["longer than zero"]);
    // The config file goes through the same checks.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("firn.yaml");
    let path = config.to_str().expect("utf-8");
    for (text, wanted) in [
        (
            "log-level: warning\n",
            &["`log-level: warning`", levels][..],
        ),
        ("profiling-duration: 1ns\n", &["line 1", "at least 1s"]),
        ("remote-store-queue-bytes: 0\n", &["at least 1KiB"]),
    ] {
        std::fs::write(&config, text).expect("config file");
        refused(&["--config-path", path], &[], wanted);
    }
}

/// `firn record ARGS`: fails at once (before sampling), exit 1, naming
/// `wanted`.
fn record_refused(args: &[&str], wanted: &[&str]) {
    let started = Instant::now();
    let output = firn()
        .args(["record", "--duration", "60s"])
        .args(args)
        .output()
        .expect("firn runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{args:?}:\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{args:?} recorded before failing:\n{stderr}"
    );
    for part in wanted {
        assert!(
            stderr.contains(part),
            "`{part}` missing for {args:?}:\n{stderr}"
        );
    }
}

#[test]
fn record_checks_its_outputs_and_pids_before_sampling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing/p.pb.gz");
    let missing = missing.to_str().expect("utf-8");
    record_refused(&["-o", missing], &[missing, "No such file or directory"]);
    let output = dir.path().join("p.pb.gz");
    let output = output.to_str().expect("utf-8");
    record_refused(
        &["-o", output, "--flamegraph", "/nonexistent/flame.svg"],
        &["/nonexistent/flame.svg"],
    );
    assert!(
        !Path::new(output).exists(),
        "the check leaves no file behind"
    );
    record_refused(
        &["-o", output, "--pid", "4000000"],
        &["no process has the pid 4000000"],
    );
    // A thread of this test process is no process of its own: one started
    // here, since the test may run on the main thread (--test-threads=1).
    let (tid_sender, tid) = std::sync::mpsc::channel();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        // Moved in, so that a failed assertion drops it and ends the thread.
        let done = done;
        scope.spawn(move || {
            // SAFETY: gettid has no preconditions.
            let _ = tid_sender.send(unsafe { libc::gettid() } as u32);
            let _ = wait.recv();
        });
        let tid = tid.recv().expect("the thread's id");
        assert_ne!(tid, std::process::id(), "a thread other than the main one");
        record_refused(
            &["-o", output, "--pid", &tid.to_string()],
            &["is a thread of process"],
        );
        drop(done);
    });
}

#[test]
fn profile_counters_reconcile_against_a_real_parca() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let parca = ParcaServer::start(&dir.path().join("parca"), free_port());
    let workloads = [
        start_chain(dir.path(), &FP_FLAGS),
        start_chain(dir.path(), &FP_FLAGS),
    ];
    let [first, second] = workloads
        .each_ref()
        .map(|workload| workload.pid().to_string());
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--profiling-duration",
            "1s",
            "--pid",
            &first,
            "--pid",
            &second,
            "--debuginfo-upload-disable",
        ],
        &[],
    );
    let address = agent.http_address();
    let read = |name: &str| metric(address, name).unwrap_or(0.0);
    // Each interval holds two series (the two processes): written counts
    // series, as sent, dropped and queued do.
    wait_for(
        "three intervals sent",
        Duration::from_secs(60),
        || {
            agent.assert_running();
            read("firn_profiles_sent_total") >= 6.0
        },
        || agent.log(),
    );
    let mut last = String::new();
    wait_for(
        "written = sent + dropped + queued",
        Duration::from_secs(30),
        || {
            let written = read("firn_profiles_written_total");
            let accounted = read("firn_profiles_sent_total")
                + read("firn_profiles_dropped_total{reason=\"queue\"}")
                + read("firn_profiles_dropped_total{reason=\"rejected\"}")
                + read("firn_queue_profiles");
            last = format!("written {written}, sent + dropped + queued {accounted}");
            written > 0.0 && written == accounted
        },
        || agent.log(),
    );
    eprintln!("{last}");
    let Stopped { status, log, .. } = agent.stop();
    assert!(status.success(), "{log}");
    let intervals = log.matches("profiles queued").count() as u64;
    let total = |field| log_field(&log, "firn agent stopped", field).unwrap_or(0);
    let written = total("profiles_written");
    assert!(
        written >= 2 * intervals.saturating_sub(1),
        "{written} profiles for {intervals} intervals of two processes:\n{log}"
    );
    assert_eq!(
        written,
        total("remote_profiles_sent")
            + total("remote_profiles_dropped")
            + total("remote_profiles_rejected"),
        "after exit nothing is queued:\n{log}"
    );
}

/// The error code in `returned -N` of a BPF program's log line.
fn returned_error(line: &str) -> Option<i64> {
    let (_, after) = line.split_once("returned ")?;
    let code = after
        .split(|c: char| c != '-' && !c.is_ascii_digit())
        .next()?;
    code.parse().ok().filter(|&code: &i64| code < 0)
}

/// `--unwind dwarf` copies up to 64 KiB of user stack per sample. The chain's
/// main thread, started with an empty environment, has far less above its
/// stack pointer, so every copy stops at the end of the stack mapping:
/// the BPF program counts that always, and says why only under a
/// `firn::bpf=debug` filter.
#[test]
fn bpf_failures_are_logged_with_their_reason_only_under_firn_bpf_debug() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let chain = build_c(dir.path(), "chain.c", "chain", &FP_FLAGS);
    let workload = TestProcess::spawn(Command::new(&chain).arg("100000").env_clear());
    let pid = workload.pid().to_string();
    let store = dir.path().join("store");
    let start = |log: &str, env: &[(&str, &str)]| {
        Agent::start(
            &dir.path().join(log),
            &[
                "--unwind",
                "dwarf",
                "--pid",
                &pid,
                "--profiling-duration",
                "10m",
                "--local-store-directory",
                store.to_str().expect("utf-8"),
            ],
            env,
        )
    };
    let reason = format!("user stack copy of tgid {pid} stopped short: bpf_probe_read_user");
    let is_reason = |line: &str| line.contains("target=firn::bpf") && line.contains(&reason);

    let agent = start("debug.log", &[("FIRN_LOG_LEVEL", "info,firn::bpf=debug")]);
    agent.wait_until(
        "the BPF program's debug record",
        Duration::from_secs(60),
        || agent.log().lines().any(is_reason),
    );
    let Stopped { status, log, .. } = agent.stop();
    assert!(status.success(), "{log}");
    let line = log
        .lines()
        .find(|line| is_reason(line))
        .expect("seen above");
    assert!(line.contains("level=debug"), "{line}");
    assert!(
        returned_error(line).is_some(),
        "the helper's error code is in the line: {line}"
    );

    // The default filter: the same failures, counted, and not a word.
    let agent = start("default.log", &[]);
    let address = agent.http_address();
    agent.wait_until(
        "short stack copies counted",
        Duration::from_secs(60),
        || metric(address, "firn_bpf_stack_copies_short_total").is_some_and(|short| short >= 5.0),
    );
    let Stopped { status, log, .. } = agent.stop();
    assert!(status.success(), "{log}");
    assert!(
        !log.contains("target=firn::bpf"),
        "nothing from the BPF side by default:\n{log}"
    );
}
