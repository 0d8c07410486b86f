//! End to end: off-CPU profiles (`--off-cpu`) from the real BPF programs,
//! against a workload that says how long it really waited.

mod common;
mod parca_support;
#[allow(dead_code)]
mod pyroscope_support;

use std::{
    cell::RefCell,
    collections::HashMap,
    path::Path,
    process::{Command, Output},
    time::{Duration, SystemTime},
};

use agent_pprof::{Reader, proto::Profile};
use common::*;
use parca_support::harness::ParcaServer;
use pyroscope_support::PyroscopeServer;

/// Parca Agent's off-CPU profile type, "Off-CPU" in Parca's UI.
const PARCA_OFF_CPU: &str = "parca_agent:wallclock:nanoseconds:samples:count:delta";
/// Grafana Alloy's off-CPU profile type in Pyroscope.
const PYROSCOPE_OFF_CPU: &str = "offcpu:offcpu:nanoseconds::";

/// Builds the off-CPU workload (`tests/workloads/offcpu.c`).
fn workload(dir: &Path) -> std::path::PathBuf {
    build_c(
        dir,
        "offcpu.c",
        "offcpu",
        &[&FP_FLAGS[..], &["-pthread"]].concat(),
    )
}

/// `firn record ARGS -- COMMAND`; the output, the CPU profile and the
/// off-CPU one.
fn record_off_cpu(dir: &Path, args: &[&str], command: &[&str]) -> (Output, Profile, Profile) {
    let (output, cpu) = record(dir, &[args, &["--"], command].concat());
    let path = dir.join("profile.offcpu.pb.gz");
    let bytes = std::fs::read(&path).expect("firn wrote the off-CPU profile");
    let off_cpu = agent_pprof::decode(&bytes).expect("the off-CPU profile decodes as pprof");
    (output, cpu, off_cpu)
}

/// `NAME VALUE` lines of the workload's output.
fn truths(output: &Output) -> HashMap<String, u64> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Nanoseconds waited per sample, with its function names (root first)
/// and labels.
fn waits(profile: &Profile) -> Vec<(Vec<String>, i64, HashMap<String, String>)> {
    let reader = Reader::new(profile);
    assert_eq!(
        reader.sample_types(),
        vec![("samples", "count"), ("off_cpu", "nanoseconds")],
        "the off-CPU profile's values"
    );
    reader
        .samples()
        .map(|sample| {
            let mut names = sample.function_names();
            names.reverse();
            let labels = sample
                .labels()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            (names, sample.sample.value[1], labels)
        })
        .collect()
}

fn waited_in(
    waits: &[(Vec<String>, i64, HashMap<String, String>)],
    function: &str,
) -> (i64, Vec<String>) {
    let mut reasons = Vec::new();
    let total = waits
        .iter()
        .filter(|(names, _, _)| names.iter().any(|n| n == function))
        .inspect(|(_, _, labels)| reasons.extend(labels.get("off_cpu_reason").cloned()))
        .map(|(_, ns, _)| ns)
        .sum();
    reasons.sort();
    reasons.dedup();
    (total, reasons)
}

/// The wall-clock view `record --off-cpu` writes beside the profiles: the
/// workload's main thread a root holding its waits (off-CPU) and `burn`
/// (on-CPU), each as long as the two profiles say, and its split in the
/// summary.
fn check_wall_clock(dir: &Path, output: &Output, truth: &HashMap<String, u64>, cpu: &Profile) {
    let bytes = std::fs::read(dir.join("profile.wall.pb.gz")).expect("the wall-clock profile");
    let wall = agent_pprof::decode(&bytes).expect("pprof");
    let reader = Reader::new(&wall);
    assert_eq!(reader.sample_types(), vec![("wall", "nanoseconds")]);
    let main_thread = reader
        .samples()
        .find(|s| s.function_names().iter().any(|n| n == "sleep_wait"))
        .and_then(|s| s.function_names().last().cloned())
        .expect("a root frame over sleep_wait");
    assert!(main_thread.starts_with("offcpu "), "{main_thread}");
    let (mut on, mut off) = (0i64, 0i64);
    for sample in reader.samples() {
        let mut names = sample.function_names();
        names.reverse();
        if names.first() != Some(&main_thread) {
            continue;
        }
        match sample.label("state") {
            Some("on-cpu") => on += sample.sample.value[0],
            Some("off-cpu") => off += sample.sample.value[0],
            other => panic!("state {other:?}"),
        }
        if names.iter().any(|n| n == "burn") {
            assert_eq!(sample.label("state"), Some("on-cpu"), "{names:?}");
        }
        // A wait is off the CPU, but for the system call that goes into
        // it or comes out of it (a woken thread runs the kernel's return
        // path, where a CPU sample may land): only there may it be on-CPU.
        if names.iter().any(|n| n.ends_with("_wait")) && sample.label("state") == Some("on-cpu") {
            assert!(
                names.iter().any(|n| n.starts_with("entry_SYSCALL")),
                "an on-CPU sample in a wait outside its system call: {names:?}"
            );
        }
    }
    // Off-CPU: the three waits (and nothing much else), as measured.
    let waited: u64 = ["sleep_wait", "pipe_wait", "lock_wait"]
        .iter()
        .map(|f| truth[*f])
        .sum();
    let error = (off as f64 - waited as f64).abs() / waited as f64;
    assert!(
        error < 0.10,
        "main thread off the CPU {off} ns, waited {waited} ns"
    );
    // On-CPU: the thread's CPU samples, a period each.
    let cpu_ns: i64 = Reader::new(cpu)
        .samples()
        .filter(|s| s.function_names().iter().any(|n| n == "burn"))
        .map(|s| s.sample.value[1])
        .sum();
    assert!(
        on >= cpu_ns && cpu_ns > 0,
        "on the CPU {on} ns, burn {cpu_ns} ns"
    );
    let summary = String::from_utf8_lossy(&output.stdout);
    assert!(
        summary.contains("wall-clock per thread")
            && summary
                .lines()
                .any(|l| l.contains("% on") && l.ends_with(&main_thread)),
        "the summary splits each thread's time:\n{summary}"
    );
}

#[test]
fn each_wait_is_attributed_to_its_function_within_ten_percent() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = workload(dir.path());
    let binary = binary.to_str().expect("utf-8 path");
    let (output, cpu, off_cpu) =
        record_off_cpu(dir.path(), &["--off-cpu"], &[binary, "waits", "5"]);
    let truth = truths(&output);
    let waits = waits(&off_cpu);
    let describe_waits = || {
        waits
            .iter()
            .map(|(names, ns, labels)| format!("{} {ns} {labels:?}", names.join(";")))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (function, path, reason) in [
        ("sleep_wait", &["main", "sleep_wait"][..], "sleep"),
        ("pipe_wait", &["main", "pipe_wait"][..], "io"),
        (
            "lock_wait",
            &["main", "lock_wait", "pthread_mutex_lock"][..],
            "futex",
        ),
    ] {
        let real = truth[function] as f64;
        let (estimated, reasons) = waited_in(&waits, function);
        let error = (estimated as f64 - real).abs() / real;
        assert!(
            error < 0.10,
            "{function}: {estimated} ns estimated, {real} ns waited ({:.1}% off):\n{}",
            error * 100.0,
            describe_waits()
        );
        assert!(
            waits.iter().any(|(names, _, _)| holds_chain(names, path)
                && names.last().is_some_and(|leaf| leaf == "__schedule")),
            "{function}: named in order from main to the scheduler:\n{}",
            describe_waits()
        );
        assert_eq!(
            reasons,
            vec![reason.to_owned()],
            "{function}'s off_cpu_reason"
        );
    }
    check_wall_clock(dir.path(), &output, &truth, &cpu);
    // The CPU profile is where the CPU went: burn, and no wait.
    let cpu_names: Vec<String> = Reader::new(&cpu)
        .samples()
        .flat_map(|sample| sample.function_names())
        .collect();
    assert!(
        cpu_names.iter().any(|n| n == "burn"),
        "burn on the CPU: {cpu_names:?}"
    );
    assert!(
        !cpu_names.iter().any(|n| n == "sleep_wait"),
        "no sleep in the CPU profile"
    );
}

#[test]
fn a_200k_switches_a_second_ping_pong_stays_bounded_and_estimated() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = workload(dir.path());
    let binary = binary.to_str().expect("utf-8 path");
    let seconds = 5;
    let period = Duration::from_millis(1);
    // Both threads on one CPU: a bounce across CPUs waits for the other
    // CPU to wake, which on a virtual machine whose idle CPUs exit to the
    // host can take tens of microseconds (20-30k bounces a second on 2
    // vCPUs here, 250k+ on one).
    let (output, _, off_cpu) = record_off_cpu(
        dir.path(),
        &["--off-cpu=1ms"],
        &[
            "taskset",
            "-c",
            "0",
            binary,
            "pingpong",
            &seconds.to_string(),
        ],
    );
    let truth = truths(&output);
    let log = String::from_utf8_lossy(&output.stderr);
    let switches_per_second = truth["trips"] / seconds;
    eprintln!("{switches_per_second} reads a second");
    assert!(
        switches_per_second >= 100_000,
        "the ping-pong is fast enough to mean something: {switches_per_second}/s"
    );
    let written = log_field(&log, "off-CPU profile written", "samples_written")
        .expect("the off-CPU line counts the samples written");
    let followed = log_field(&log, "off-CPU profile written", "waits_followed").expect("waits");
    // Two threads each waiting at most a second a second: at most two
    // seconds' worth of periods a second, whatever the switch rate.
    let bound = 2 * Duration::from_secs(1).as_nanos() as u64 / period.as_nanos() as u64;
    let rate = written / seconds;
    assert!(
        rate <= bound,
        "{rate} off-CPU samples a second, over the bound of {bound} ({followed} waits)"
    );
    assert!(
        followed > 20 * written,
        "most waits are not kept: {followed} waits, {written} samples"
    );
    let waits = waits(&off_cpu);
    let (estimated, reasons) = waited_in(&waits, "bounce");
    let real = truth["off_cpu_ns"] as f64;
    let error = (estimated as f64 - real).abs() / real;
    eprintln!(
        "ping-pong: {estimated} ns estimated, {real} ns blocked ({:.1}% off), {rate} samples/s, {followed} waits",
        error * 100.0
    );
    assert!(
        error < 0.10,
        "ping-pong: {estimated} ns estimated, {real} ns off the CPU ({:.1}% off)",
        error * 100.0
    );
    assert_eq!(reasons, vec!["io".to_owned()]);
}

#[test]
fn off_by_default_nothing_is_attached_to_the_scheduler() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let programs = || {
        let output = Command::new("bpftool")
            .args(["prog", "show"])
            .output()
            .expect("bpftool lists the loaded BPF programs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    for (args, attached) in [
        (&["--duration", "30s"][..], false),
        (&["--duration", "30s", "--off-cpu"][..], true),
    ] {
        let mut recording = Recording::start(dir.path(), args);
        recording.wait_until_sampling();
        let loaded = programs();
        assert!(
            loaded.contains("sample_cpu"),
            "firn's sampler is loaded:\n{loaded}"
        );
        assert_eq!(
            loaded.contains("offcpu_switch"),
            attached,
            "sched_switch program loaded with {args:?}:\n{loaded}"
        );
        let (_, profile) = recording.interrupt();
        assert!(!Reader::new(&profile).sample_types().is_empty());
        assert_eq!(
            dir.path().join("profile.offcpu.pb.gz").exists(),
            attached,
            "an off-CPU profile only with --off-cpu"
        );
        let _ = std::fs::remove_file(dir.path().join("profile.offcpu.pb.gz"));
    }
}

/// Nanoseconds waited in each of the workload's waits (whole stacks
/// holding the function, `main` above it), by a server's merged profile:
/// its last sample type, the time.
fn server_waits(profile: &Profile) -> (HashMap<&'static str, i64>, Vec<String>) {
    let reader = Reader::new(profile);
    let types = reader.sample_types();
    let mut waited = HashMap::new();
    let mut stacks = Vec::new();
    for sample in reader.samples() {
        let mut names = sample.function_names();
        names.reverse();
        let ns = *sample.sample.value.last().unwrap_or(&0);
        stacks.push(format!("{} {ns}", names.join(";")));
        for function in ["sleep_wait", "pipe_wait", "lock_wait"] {
            if holds_chain(&names, &["main", function]) {
                *waited.entry(function).or_default() += ns;
            }
        }
    }
    stacks.insert(0, format!("{types:?}"));
    (waited, stacks)
}

/// The `waits 5` workload, started once the file `go` exists (a shell
/// that execs it, so its pid is known before it starts), printing what it
/// measured into `truth`.
fn waits_once_told(
    dir: &Path,
    binary: &Path,
) -> (TestProcess, std::path::PathBuf, std::path::PathBuf) {
    let go = dir.join("go");
    let truth = dir.join("truth");
    let process = TestProcess::spawn_with_stdout(
        Command::new("sh").args([
            "-c",
            &format!(
                "while [ ! -e {go} ]; do sleep 0.05; done; exec {binary} waits 5",
                go = go.display(),
                binary = binary.display()
            ),
        ]),
        std::fs::File::create(&truth).expect("truth file").into(),
    );
    (process, go, truth)
}

/// `NAME NANOSECONDS` lines the workload printed so far.
fn read_truth(path: &Path) -> HashMap<String, i64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The waits both servers hold for `selector` once they hold the same,
/// each within 10% of the time the workload measured (`truth`).
fn waits_in_both_servers(
    (query, pyroscope): (&mut parca_support::harness::Query, &PyroscopeServer),
    selector: &str,
    (from, to): (SystemTime, SystemTime),
    truth: &HashMap<String, i64>,
    log: &str,
) -> HashMap<&'static str, i64> {
    let seen = RefCell::new(<(
        (HashMap<&str, i64>, Vec<String>),
        (HashMap<&str, i64>, Vec<String>),
    )>::default());
    // Within 10% of the time the workload measured, in each server.
    let close = |waited: &HashMap<&str, i64>| {
        ["sleep_wait", "pipe_wait", "lock_wait"].iter().all(|f| {
            let real = truth[*f] as f64;
            (waited.get(f).copied().unwrap_or(0) as f64 - real).abs() / real < 0.10
        })
    };
    wait_for(
        "the waits in both servers, as long as the workload measured",
        Duration::from_secs(90),
        || {
            let parca_waits = query
                .try_merged_type(PARCA_OFF_CPU, selector, from, to)
                .map(|p| server_waits(&p))
                .unwrap_or_default();
            let pyroscope_waits = pyroscope
                .merged(None, PYROSCOPE_OFF_CPU, selector, from, to)
                .map(|p| server_waits(&p))
                .unwrap_or_default();
            let done = close(&parca_waits.0) && parca_waits.0 == pyroscope_waits.0;
            *seen.borrow_mut() = (parca_waits, pyroscope_waits);
            if !done {
                std::thread::sleep(Duration::from_millis(500));
            }
            done
        },
        || {
            let ((parca_waits, parca_stacks), (pyroscope_waits, pyroscope_stacks)) =
                &*seen.borrow();
            format!(
                "truth {truth:?}\nparca {parca_waits:?}\n{}\npyroscope {pyroscope_waits:?}\n{}\n{}",
                parca_stacks.join("\n"),
                pyroscope_stacks.join("\n"),
                log
            )
        },
    );
    seen.into_inner().0.0
}

#[test]
fn the_agent_pushes_off_cpu_profiles_to_parca_and_pyroscope_under_their_off_cpu_types() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = workload(dir.path());
    let pyroscope = PyroscopeServer::start(&dir.path().join("pyroscope"), false);
    let parca = ParcaServer::start(&dir.path().join("parca"), pyroscope_support::free_port());
    let (waits, go, truth_file) = waits_once_told(dir.path(), &binary);
    let pid = waits.pid();
    let start = SystemTime::now();
    let agent = Agent::start(
        &dir.path().join("agent.log"),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--pyroscope-url",
            &pyroscope.url(),
            "--profiling-duration",
            "2s",
            "--off-cpu",
            "--pid",
            &pid.to_string(),
        ],
        &[],
    );
    assert!(
        agent.wait_for_log("firn agent started", Duration::from_secs(60)),
        "the agent starts:\n{}",
        agent.log()
    );
    std::fs::write(&go, b"").expect("go");
    let truth = RefCell::new(HashMap::new());
    wait_for(
        "the workload's end",
        Duration::from_secs(60),
        || {
            agent.assert_running();
            *truth.borrow_mut() = read_truth(&truth_file);
            truth.borrow().contains_key("lock_wait")
        },
        || agent.log(),
    );
    // The last interval is flushed at the stop.
    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
    let selector = format!("{{pid=\"{pid}\"}}");
    let (from, to) = (
        start - Duration::from_secs(60),
        SystemTime::now() + Duration::from_secs(60),
    );
    let mut query = parca.query();
    let truth = truth.into_inner();
    let waited = waits_in_both_servers(
        (&mut query, &pyroscope),
        &selector,
        (from, to),
        &truth,
        &stopped.log,
    );
    eprintln!("measured {truth:?}, in both servers {waited:?}");
    let types = query.profile_types();
    assert!(
        types.iter().any(|t| t == PARCA_OFF_CPU)
            && types.iter().any(|t| t.starts_with("parca_agent_cpu:")),
        "Parca lists the off-CPU type beside the CPU one: {types:?}"
    );
    let types = pyroscope.profile_types(None, from, to);
    assert!(
        types.iter().any(|t| t == PYROSCOPE_OFF_CPU)
            && types.iter().any(|t| t.starts_with("process_cpu:")),
        "Pyroscope lists the off-CPU type beside the CPU one: {types:?}"
    );
}

#[test]
fn the_agent_writes_off_cpu_profiles_beside_the_cpu_ones_in_its_local_store() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = workload(dir.path());
    let workload = TestProcess::spawn(Command::new(&binary).args(["waits", "30"]));
    let store = dir.path().join("store");
    let agent = Agent::start(
        &dir.path().join("agent.log"),
        &[
            "--local-store-directory",
            store.to_str().expect("utf-8"),
            "--profiling-duration",
            "2s",
            "--off-cpu",
            "--pid",
            &workload.pid().to_string(),
        ],
        &[],
    );
    let files = |suffix: &str| -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(&store)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                name.is_some_and(|name| {
                    name.starts_with("profile-")
                        && name.ends_with(suffix)
                        && (suffix == ".offcpu.pb.gz") == name.ends_with(".offcpu.pb.gz")
                })
            })
            .collect();
        files.sort();
        files
    };
    let slept = RefCell::new(0i64);
    wait_for(
        "an off-CPU profile with the worker asleep, beside a CPU one",
        Duration::from_secs(60),
        || {
            agent.assert_running();
            *slept.borrow_mut() = files(".offcpu.pb.gz")
                .iter()
                .filter_map(|path| agent_pprof::decode(&std::fs::read(path).ok()?).ok())
                .flat_map(|profile| {
                    waits(&profile)
                        .into_iter()
                        .filter(|(names, _, _)| holds_chain(names, &["main", "sleep_wait"]))
                        .map(|(_, ns, _)| ns)
                        .collect::<Vec<_>>()
                })
                .sum();
            *slept.borrow() > 0 && !files(".pb.gz").is_empty()
        },
        || format!("{:?}\n{}", files(""), agent.log()),
    );
    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
}
