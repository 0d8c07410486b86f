//! `firn record -- CMD`, `firn report` and `firn top`, run as a user would:
//! the command and what it starts profiled from their first samples, its
//! exit status firn's, the summary checked against the profile it
//! summarizes, folded stacks read back by inferno, `top` driven in tmux.

mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use agent_pprof::{Reader, proto::Profile};
use common::*;

/// Each program spins this long: far less than a poll for new processes
/// would need to notice them.
const SPIN_MS: &str = "400";
const FREQUENCY: &str = "499";

struct Workloads {
    fork_exec: PathBuf,
    exec_target: PathBuf,
}

fn workloads(dir: &Path) -> Workloads {
    Workloads {
        fork_exec: build_c(dir, "fork_exec.c", "fork_exec", &FP_FLAGS),
        exec_target: build_c(dir, "exec_target.c", "exec_target", &FP_FLAGS),
    }
}

/// `firn record --output DIR/profile.pb.gz ARGS -- CMD`, to its end.
fn record_command(dir: &Path, args: &[&str], command: &[&Path]) -> (Output, Profile) {
    let output_path = dir.join("profile.pb.gz");
    let output = firn()
        .arg("record")
        .arg("--output")
        .arg(&output_path)
        .args(args)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .output()
        .expect("firn runs");
    let bytes = std::fs::read(&output_path).unwrap_or_else(|error| {
        panic!(
            "no profile ({error}); firn exited {}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let profile = agent_pprof::decode(&bytes).expect("the profile decodes as pprof");
    (output, profile)
}

/// Samples per function at the leaf, and per pid the functions seen, read
/// from the profile without firn's summary code.
fn leaves(profile: &Profile) -> (BTreeMap<String, i64>, BTreeMap<String, Vec<String>>) {
    let mut by_leaf = BTreeMap::new();
    let mut by_pid: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for sample in Reader::new(profile).samples() {
        let names = sample.function_names();
        if let Some(leaf) = names.first() {
            *by_leaf.entry(leaf.clone()).or_insert(0) += sample.count();
        }
        let pid = sample.label("pid").unwrap_or_default().to_owned();
        by_pid.entry(pid).or_default().extend(names);
    }
    (by_leaf, by_pid)
}

fn assert_plain(what: &str, text: &str) {
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{what} holds control characters:\n{text:?}"
    );
}

#[test]
fn a_command_and_what_it_starts_are_profiled_from_their_first_samples() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let programs = workloads(dir.path());
    let (output, profile) = record_command(
        dir.path(),
        &["--frequency", FREQUENCY],
        &[
            &programs.fork_exec,
            Path::new(SPIN_MS),
            &programs.exec_target,
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(3),
        "firn exits with the command's status:\n{stderr}"
    );
    let (by_leaf, by_pid) = leaves(&profile);
    // Polling for new processes every second would see none of them; the
    // kernel's fork and exec hooks see each from its start.
    for function in ["parent_spin", "child_spin", "target_spin"] {
        let samples = by_leaf.get(function).copied().unwrap_or(0);
        assert!(
            samples >= 10,
            "{function}: {samples} samples, expected a share of {SPIN_MS} ms at {FREQUENCY} Hz; leaves: {by_leaf:?}\n{stderr}"
        );
    }
    // The child keeps its pid through the exec: before it, the parent's
    // image; after, the second program's. The parent never runs either.
    let child = by_pid
        .iter()
        .find(|(_, names)| names.iter().any(|name| name == "target_spin"))
        .map(|(pid, names)| (pid.clone(), names.clone()))
        .expect("the executed program has samples");
    assert!(
        child.1.iter().any(|name| name == "child_spin"),
        "the forked child, pid {}, is named before its exec too",
        child.0
    );
    let parent = by_pid
        .iter()
        .find(|(_, names)| names.iter().any(|name| name == "parent_spin"))
        .expect("the parent has samples");
    assert_ne!(parent.0, &child.0, "parent and child are told apart");
    assert!(!parent.1.iter().any(|name| name == "target_spin"));
    assert_plain("stderr", &stderr);
}

#[test]
fn every_sample_of_a_recording_names_its_thread() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let program = build_c(
        dir.path(),
        "named_threads.c",
        "named_threads",
        &["-O1", "-fno-omit-frame-pointer", "-pthread"],
    );
    let (output, profile) = record_command(
        dir.path(),
        &["--frequency", FREQUENCY],
        &[&program, Path::new(SPIN_MS)],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut seen = BTreeMap::new();
    for sample in Reader::new(&profile).samples() {
        let names = sample.function_names();
        let Some(spin) = names.iter().find(|name| name.ends_with("_spin")) else {
            continue;
        };
        let pid = sample.label("pid").expect("pid");
        let tid = sample
            .label("thread_id")
            .expect("every sample has thread_id");
        let thread = sample
            .label("thread_name")
            .expect("every sample has thread_name");
        let expected = match spin.as_str() {
            "alpha_spin" => "alpha",
            "beta_spin" => "beta",
            _ => "named_threads",
        };
        assert_eq!(
            thread, expected,
            "{spin} ran on thread {tid} named {thread}"
        );
        assert_eq!(
            tid == pid,
            expected == "named_threads",
            "{spin}: tid {tid}, pid {pid}"
        );
        *seen.entry(spin.clone()).or_insert(0) += sample.count();
    }
    assert_eq!(seen.len(), 3, "all three threads sampled: {seen:?}");

    // --thread-labels=false: the agent's default, only other threads' ids.
    let (_, profile) = record_command(
        dir.path(),
        &["--frequency", FREQUENCY, "--thread-labels=false"],
        &[&program, Path::new(SPIN_MS)],
    );
    let mut seen = BTreeMap::new();
    for sample in Reader::new(&profile).samples() {
        assert_eq!(sample.label("thread_name"), None);
        let names = sample.function_names();
        let Some(spin) = names.iter().find(|name| name.ends_with("_spin")) else {
            continue;
        };
        let tid = sample.label("thread_id");
        if spin == "main_spin" {
            assert_eq!(tid, None, "the main thread's samples carry no thread_id");
        } else {
            assert!(
                tid.is_some() && tid != sample.label("pid"),
                "{spin}: thread_id {tid:?} of pid {:?}",
                sample.label("pid")
            );
        }
        *seen.entry(spin.clone()).or_insert(0) += sample.count();
    }
    assert!(
        seen.len() == 3 && seen.values().all(|&count| count >= 5),
        "all three threads sampled without thread labels: {seen:?}"
    );
}

/// The summary's rows: `(total %, self %, function)`.
fn summary_rows(text: &str) -> Vec<(f64, f64, String)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| {
            let mut fields = line.split_whitespace();
            let mut percent = || {
                fields
                    .next()
                    .and_then(|field| field.strip_suffix('%'))
                    .and_then(|field| field.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("not a summary row: {line}"))
            };
            let (total, own) = (percent(), percent());
            let function = fields.next().expect("a function").to_owned();
            (total, own, function)
        })
        .collect()
}

#[test]
fn the_summary_matches_the_profile_and_folded_stacks_round_trip_into_inferno() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let programs = workloads(dir.path());
    let (output, profile) = record_command(
        dir.path(),
        &["--frequency", FREQUENCY],
        &[
            &programs.fork_exec,
            Path::new(SPIN_MS),
            &programs.exec_target,
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_plain("the summary on a pipe", &stdout);
    let (by_leaf, _) = leaves(&profile);
    let total: i64 = Reader::new(&profile).samples().map(|s| s.count()).sum();
    assert!(
        stdout.starts_with(&format!("# {total} samples, 2 processes\n")),
        "{stdout}"
    );
    assert!(stdout.contains("# profile: "), "{stdout}");
    let rows = summary_rows(&stdout);
    assert!(rows.len() >= 3, "{stdout}");
    for (_, own, function) in rows.iter().take(3) {
        let expected = by_leaf.get(function).copied().unwrap_or(0) as f64 * 100.0 / total as f64;
        assert!(
            (own - expected).abs() < 0.006,
            "{function}: self {own}% in the summary, {expected:.3}% in the profile\n{stdout}"
        );
    }
    let top: Vec<&str> = rows.iter().take(3).map(|(.., f)| f.as_str()).collect();
    for function in ["parent_spin", "child_spin", "target_spin"] {
        assert!(
            top.contains(&function),
            "{function} in the top 3:\n{stdout}"
        );
    }

    // `firn report` says the same of the file.
    let profile_path = dir.path().join("profile.pb.gz");
    let report = firn_report(&profile_path, &["--top", "3"]);
    assert_eq!(
        summary_rows(&report),
        rows[..3],
        "report vs record:\n{report}\n{stdout}"
    );
    let only_target = firn_report(&profile_path, &["--comm", "exec_target", "--top", "1"]);
    let target_samples: i64 = Reader::new(&profile)
        .samples()
        .filter(|sample| sample.label("comm") == Some("exec_target"))
        .map(|sample| sample.count())
        .sum();
    assert!(
        only_target.starts_with(&format!("# {target_samples} samples, 1 process\n")),
        "{target_samples} samples of exec_target:\n{only_target}"
    );
    assert_eq!(
        summary_rows(&only_target)[0].2,
        "target_spin",
        "{only_target}"
    );

    folded_stacks_round_trip_into_inferno(&profile_path, total);
}

/// Folded stacks: what the profile holds, and what inferno draws.
fn folded_stacks_round_trip_into_inferno(profile_path: &Path, total: i64) {
    let folded = firn_report(profile_path, &["--format", "folded"]);
    let mut folded_total = 0i64;
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("`stack count`");
        folded_total += count.parse::<i64>().expect("a count");
        assert!(stack.split(';').count() >= 2, "comm and frames: {line}");
    }
    assert_eq!(folded_total, total);
    assert!(
        folded
            .lines()
            .any(|line| line.starts_with("exec_target;") && line.contains(";main;target_spin ")),
        "{folded}"
    );
    let mut svg = Vec::new();
    let mut options = inferno::flamegraph::Options::default();
    inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg)
        .expect("inferno reads the folded stacks");
    let svg = String::from_utf8(svg).expect("utf-8");
    assert!(
        svg.contains(&format!("all ({} samples", thousands(total))),
        "inferno's total is the profile's ({total})"
    );
    for function in ["parent_spin", "child_spin", "target_spin"] {
        assert!(svg.contains(function), "{function} in the flame graph");
    }
}

/// 1234567 as inferno writes it: 1,234,567.
fn thousands(number: i64) -> String {
    let digits = number.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn firn_report(profile: &Path, args: &[&str]) -> String {
    let output = firn()
        .arg("report")
        .arg(profile)
        .args(args)
        .output()
        .expect("firn report runs");
    assert!(
        output.status.success(),
        "firn report {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[test]
fn signals_to_firn_reach_the_command_and_its_status_is_firns() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("record.log");
    let mut child = firn()
        .arg("record")
        .arg("--output")
        .arg(dir.path().join("profile.pb.gz"))
        .args(["--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("firn starts");
    let guard = KillOnDrop(Some(child.id()));
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(
        "firn to record",
        Duration::from_secs(120),
        || read_log().contains("message=recording"),
        read_log,
    );
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut status = None;
    wait_for(
        "firn to exit after the command",
        Duration::from_secs(60),
        || {
            status = child.try_wait().expect("waits");
            status.is_some()
        },
        read_log,
    );
    drop(guard);
    assert_eq!(
        status.and_then(|status| status.code()),
        Some(128 + libc::SIGINT),
        "sleep ended by the forwarded SIGINT:\n{}",
        read_log()
    );
    assert!(
        dir.path().join("profile.pb.gz").exists(),
        "the profile is written"
    );
}

#[test]
fn under_sudo_the_command_runs_as_the_invoking_user() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let output = firn()
        .arg("record")
        .arg("--output")
        .arg(dir.path().join("profile.pb.gz"))
        .args(["--summary=false", "--", "id"])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .env("SUDO_USER", "nobody")
        .stdin(Stdio::null())
        .output()
        .expect("firn runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.starts_with("uid=65534(") && stdout.contains(" gid=65534("),
        "the command ran as nobody: {stdout}"
    );
    let missing = firn()
        .arg("record")
        .arg("--output")
        .arg(dir.path().join("never.pb.gz"))
        .args(["--", "no-such-command-anywhere"])
        .stdin(Stdio::null())
        .output()
        .expect("firn runs");
    assert_eq!(missing.status.code(), Some(1));
    assert!(!dir.path().join("never.pb.gz").exists());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("`no-such-command-anywhere`: command not found"),
        "{stderr}"
    );
}

/// Kills the pid (ours) when the test ends early.
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// A tmux session on its own server socket, killed when dropped.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn start(dir: &Path, command: &str) -> Self {
        let tmux = Self {
            socket: dir.join("tmux.sock"),
        };
        let status = tmux
            .command()
            .args(["new-session", "-d", "-x", "160", "-y", "40", command])
            .status()
            .unwrap_or_else(|error| {
                panic!(
                    "tmux is needed to drive `firn top` (cargo xtask setup installs it): {error}"
                )
            });
        assert!(status.success(), "tmux could not start a session");
        tmux
    }

    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.arg("-S").arg(&self.socket);
        command
    }

    fn screen(&self) -> String {
        let output = self
            .command()
            .args(["capture-pane", "-p"])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn alive(&self) -> bool {
        self.command()
            .arg("has-session")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .command()
            .arg("kill-server")
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn a_terminal_shows_a_status_line_while_recording_then_the_summary() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let release = dir.path().join("release");
    // The command runs until the test has seen the status line; the pane
    // stays open after firn so the end can be read.
    let command = format!(
        "{} record --output {} -- sh -c 'while [ ! -e {} ]; do sleep 0.05; done'; echo firn-exited-$?; sleep 600",
        env!("CARGO_BIN_EXE_firn"),
        dir.path().join("profile.pb.gz").display(),
        release.display()
    );
    let tmux = Tmux::start(dir.path(), &command);
    wait_for(
        "the status line",
        Duration::from_secs(120),
        || {
            let screen = tmux.screen();
            screen.contains("firn: recording ")
                && screen.contains(" samples ")
                && screen.contains(" lost")
        },
        || tmux.screen(),
    );
    std::fs::write(&release, b"").expect("release the command");
    wait_for(
        "firn to exit",
        Duration::from_secs(60),
        || tmux.screen().contains("firn-exited-0"),
        || tmux.screen(),
    );
    let screen = tmux.screen();
    assert!(
        !screen.contains("firn: recording "),
        "the status line is gone:\n{screen}"
    );
    assert!(
        screen.contains("# profile: "),
        "the summary follows:\n{screen}"
    );
}

#[test]
fn top_shows_the_busy_function_first_and_quits_on_q() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let log = dir.path().join("top.log");
    let command = format!(
        "{} top --pid {} --refresh 500ms 2>{}",
        env!("CARGO_BIN_EXE_firn"),
        workload.pid(),
        log.display()
    );
    let tmux = Tmux::start(dir.path(), &command);
    let first_row = |screen: &str| {
        screen
            .lines()
            .skip_while(|line| !line.starts_with("#   Total"))
            .nth(1)
            .map(str::to_owned)
    };
    wait_for(
        "burn_leaf at the top of firn top",
        Duration::from_secs(120),
        || first_row(&tmux.screen()).is_some_and(|row| row.contains("burn_leaf")),
        || {
            format!(
                "{}\nlog:\n{}",
                tmux.screen(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    let screen = tmux.screen();
    assert!(screen.starts_with("firn top: "), "{screen}");
    let status = tmux
        .command()
        .args(["send-keys", "q"])
        .status()
        .expect("send-keys");
    assert!(status.success());
    wait_for(
        "firn top to quit on q",
        Duration::from_secs(30),
        || !tmux.alive(),
        || tmux.screen(),
    );
}

#[test]
fn top_without_a_terminal_prints_plain_tables() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let output_path = dir.path().join("top.txt");
    let mut child = firn()
        .args(["top", "--refresh", "300ms", "--pid"])
        .arg(workload.pid().to_string())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&output_path).expect("output"))
        .stderr(Stdio::null())
        .spawn()
        .expect("firn top starts");
    let guard = KillOnDrop(Some(child.id()));
    let read = || std::fs::read_to_string(&output_path).unwrap_or_default();
    wait_for(
        "a table naming burn_leaf",
        Duration::from_secs(120),
        || read().contains("burn_leaf"),
        read,
    );
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut status = None;
    wait_for(
        "firn top to stop on SIGTERM",
        Duration::from_secs(30),
        || {
            status = child.try_wait().expect("waits");
            status.is_some()
        },
        read,
    );
    drop(guard);
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
    let text = read();
    assert!(text.starts_with("firn top: "), "{text}");
    assert_plain("firn top on a pipe", &text);
}
