//! Processes that plant traps where firn looks for their files: FIFOs
//! (which block whoever opens them for reading) and absolute symlinks
//! pointing at host files the container cannot see. firn keeps sampling,
//! reads only what the process itself could, counts what it refused, and
//! still stops on SIGTERM.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use agent_pprof as pprof;
use common::{
    Agent, CHAIN, TestProcess, build_c, chain_share, describe, get, metric, record, require_root,
    serial, stacks_of, wait_for,
};

/// The workload, built with frame pointers; `strip`ped when asked.
fn build_workload(dir: &Path, strip: bool) -> PathBuf {
    let binary = build_c(
        dir,
        "jit_chain.c",
        "app",
        &["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"],
    );
    if strip {
        let debug = dir.join("app.debug");
        run(
            "objcopy",
            &[
                "--only-keep-debug".as_ref(),
                binary.as_os_str(),
                debug.as_os_str(),
            ],
        );
        run("strip", &["--strip-all".as_ref(), binary.as_os_str()]);
    } else {
        // Symbols but no DWARF: firn goes looking for a debug file.
        run("strip", &["--strip-debug".as_ref(), binary.as_os_str()]);
    }
    binary
}

fn run(program: &str, args: &[impl AsRef<std::ffi::OsStr>]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(status.success(), "{program} failed");
}

fn build_id(binary: &Path) -> String {
    let object = std::fs::read(binary).expect("the workload");
    let layout = agent_elf::read_layout(&object).expect("an ELF");
    layout.build_id.expect("gcc writes a build id").to_hex()
}

/// Runs `setup` (shell) in a private mount namespace, then execs the
/// workload copied to `/usr/lib/debug/app` inside it. `/usr/lib/debug` and
/// `/tmp` are fresh tmpfs mounts there, so the test's own directory (under
/// the host's /tmp) is invisible to the process.
fn start_in_namespace(binary: &Path, setup: &str) -> TestProcess {
    let script = format!(
        "set -e
         mount -t tmpfs firn-hostile /usr/lib/debug
         cp {binary} /usr/lib/debug/app
         {setup}
         mount -t tmpfs firn-hostile-tmp /tmp
         PERF_MAP=/tmp/perf-$$.map
         {tmp_setup}
         exec /usr/lib/debug/app",
        binary = binary.display(),
        setup = setup.split("---").next().unwrap_or_default(),
        tmp_setup = setup.split("---").nth(1).unwrap_or_default(),
    );
    std::fs::create_dir_all("/usr/lib/debug").expect("/usr/lib/debug");
    let process = TestProcess::spawn(Command::new("unshare").args(["-m", "sh", "-c", &script]));
    let pid = process.pid();
    wait_until_app(pid);
    process
}

/// Waits until `pid` runs the workload (after the shell's set-up).
fn wait_until_app(pid: u32) {
    wait_for(
        "the workload to start",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "app")
        },
        String::new,
    );
}

/// Starts the agent on `pid`, writing a profile a second into `store`.
fn start_agent(dir: &Path, pid: u32, store: &Path) -> Agent {
    Agent::start(
        &dir.join("firn.log"),
        &[
            "--pid",
            &pid.to_string(),
            "--profiling-duration",
            "1s",
            "--local-store-directory",
            &store.display().to_string(),
        ],
        &[],
    )
}

/// Waits until `/metrics` counts `count` files refused for `reason`;
/// returns where `/metrics` is.
fn wait_for_refusals(agent: &Agent, reason: &str, count: f64) -> std::net::SocketAddr {
    let address = agent.http_address();
    let series = format!("firn_untrusted_files_refused_total{{reason=\"{reason}\"}}");
    agent.wait_until(
        &format!("{count} files refused as {reason}"),
        Duration::from_secs(30),
        || metric(address, &series).unwrap_or(0.0) >= count,
    );
    address
}

/// Samples of `pid`'s main thread (without a thread id of their own, or
/// with the pid's): frame names and counts. The other thread spins in its
/// generated code.
fn main_thread_stacks(profile: &pprof::proto::Profile, pid: u32) -> Vec<(Vec<String>, i64)> {
    let pid = pid.to_string();
    pprof::Reader::new(profile)
        .samples()
        .filter(|sample| sample.label("pid") == Some(pid.as_str()))
        .filter(|sample| sample.label("thread_id").is_none_or(|tid| tid == pid))
        .map(|sample| (sample.function_names(), sample.count()))
        .collect()
}

/// Samples of the main thread a test takes as proof that firn names the
/// chain: the most a loaded machine's 3 s gave it reliably (an idle one
/// gives some 300).
const PROOF_SAMPLES: i64 = 30;

/// Waits until the profiles written after `after` hold at least
/// [`PROOF_SAMPLES`] samples of `pid`'s main thread, most of them with the
/// chain.
fn wait_for_named_chain(agent: &Agent, store: &Path, pid: u32, after: Instant) {
    let last = std::cell::RefCell::new(String::new());
    wait_for(
        "profiles with the chain",
        Duration::from_secs(60),
        || {
            agent.assert_running();
            let stacks: Vec<_> = profiles_since(store, after)
                .iter()
                .flat_map(|profile| main_thread_stacks(profile, pid))
                .collect();
            let (share, total) = chain_share(&stacks, &CHAIN);
            *last.borrow_mut() = format!(
                "{total} samples of the main thread, {:.1}% with the chain:\n{}",
                share * 100.0,
                describe(&stacks)
            );
            total >= PROOF_SAMPLES && share > 0.8
        },
        || format!("{}\n{}", last.borrow(), agent.log()),
    );
}

/// A FIFO where firn looks for the debug file and another as the perf map:
/// reading either would wait forever for a writer.
#[test]
fn planted_fifos_are_refused_and_the_agent_keeps_sampling() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_workload(dir.path(), false);
    let hex = build_id(&binary);
    let workload = start_in_namespace(
        &binary,
        &format!(
            "mkdir -p /usr/lib/debug/.build-id/{head}
             mkfifo /usr/lib/debug/.build-id/{head}/{tail}.debug
             --- mkfifo $PERF_MAP",
            head = &hex[..2],
            tail = &hex[2..],
        ),
    );
    let pid = workload.pid();
    let store = dir.path().join("profiles");
    let agent = start_agent(dir.path(), pid, &store);
    let address = wait_for_refusals(&agent, "not_regular", 2.0);
    // Profiles keep coming after the refusals, with the chain named from
    // the symbol table.
    wait_for_named_chain(&agent, &store, pid, Instant::now());
    let (status, body) = get(address, "/ready").expect("/ready answers");
    assert_eq!(status, 200, "{body}");
    assert!(
        agent.log().contains("not a regular file"),
        "the refusal is logged:\n{}",
        agent.log()
    );
    agent.terminate_cleanly();
}

/// The profiles in `store` written after `after` (those that decode).
fn profiles_since(store: &Path, after: Instant) -> Vec<pprof::proto::Profile> {
    let cutoff = std::time::SystemTime::now() - after.elapsed();
    let Ok(entries) = std::fs::read_dir(store) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let modified = entry.metadata().ok()?.modified().ok()?;
            let name = entry.file_name();
            (name.to_str()?.ends_with(".pb.gz") && modified > cutoff).then(|| entry.path())
        })
        .filter_map(|path| pprof::decode(&std::fs::read(path).ok()?).ok())
        .collect()
}

/// Absolute symlinks resolve as the process would resolve them: the debug
/// file's link reaches a file inside the container (used), the perf map's
/// link names a host file the container cannot see (not read).
#[test]
fn symlinks_resolve_inside_the_process_root() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_workload(dir.path(), true);
    let hex = build_id(&binary);
    let host_map = dir.path().join("host-only.map");
    std::fs::write(&host_map, "0 7fffffffffff host_only_symbol\n").expect("host perf map");
    let workload = start_in_namespace(
        &binary,
        &format!(
            "cp {debug} /usr/lib/debug/inside.debug
             mkdir -p /usr/lib/debug/.build-id/{head}
             ln -s /usr/lib/debug/inside.debug /usr/lib/debug/.build-id/{head}/{tail}.debug
             --- ln -s {host_map} $PERF_MAP",
            debug = dir.path().join("app.debug").display(),
            head = &hex[..2],
            tail = &hex[2..],
            host_map = host_map.display(),
        ),
    );
    assert!(
        !Path::new("/usr/lib/debug/inside.debug").exists(),
        "the link's target exists only inside the namespace"
    );
    let pid = workload.pid();
    let (_, profile) = record(dir.path(), &["--duration", "3s", "--pid", &pid.to_string()]);
    let stacks = stacks_of(&profile, pid);
    let main_thread = main_thread_stacks(&profile, pid);
    let (share, total) = chain_share(&main_thread, &CHAIN);
    assert!(
        total >= PROOF_SAMPLES && share > 0.8,
        "the debug file behind the in-container link names the chain in {:.1}% of {total} samples of the main thread:\n{}",
        share * 100.0,
        describe(&main_thread)
    );
    assert!(
        !stacks
            .iter()
            .any(|(names, _)| names.iter().any(|name| name == "host_only_symbol")),
        "the host file behind the perf map link was read:\n{}",
        describe(&stacks)
    );
}

/// A FUSE filesystem whose server never answers, mounted where firn looks
/// for debug files inside the process's mount namespace: every lookup
/// there blocks until the connection closes (when the workload, which
/// holds its descriptor, exits). firn sees the mount in the namespace's
/// mountinfo and never looks there, counts it, keeps sampling and naming
/// the rest, stays ready, and exits on SIGTERM.
#[test]
fn a_fuse_mount_that_never_answers_does_not_stall_the_agent() {
    require_root();
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test needs /dev/fuse (modprobe fuse)"
    );
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_workload(dir.path(), false);
    let private = dir.path().join("private");
    std::fs::create_dir_all(&private).expect("mount point");
    std::fs::create_dir_all("/usr/lib/debug").expect("/usr/lib/debug");
    // Python keeps /dev/fuse open across the exec: the workload holds the
    // connection, which nobody serves. `mount -i`: the mount system call
    // itself, not fuse3's `mount.fuse` helper (present once fuse3 is
    // installed, as docker.io pulls it in), which would take the source
    // for a program to run.
    let hang = r#"
import os, subprocess, sys
fd = os.open("/dev/fuse", os.O_RDWR)
os.set_inheritable(fd, True)
subprocess.run(["mount", "-i", "-t", "fuse", "-o",
                f"fd={fd},rootmode=40000,user_id=0,group_id=0",
                "firn-hang", "/usr/lib/debug"], pass_fds=[fd], check=True)
os.execv(sys.argv[1], [sys.argv[1]])
"#;
    let script = format!(
        "set -e
         mount -t tmpfs firn-private {private}
         cp {binary} {private}/app
         exec python3 -c '{hang}' {private}/app",
        private = private.display(),
        binary = binary.display(),
    );
    let workload = TestProcess::spawn(Command::new("unshare").args(["-m", "sh", "-c", &script]));
    let pid = workload.pid();
    wait_until_app(pid);
    let store = dir.path().join("profiles");
    let agent = start_agent(dir.path(), pid, &store);
    let address = wait_for_refusals(&agent, "fuse", 1.0);
    wait_for_named_chain(&agent, &store, pid, Instant::now());
    let (status, body) = get(address, "/ready").expect("/ready answers");
    assert_eq!(status, 200, "{body}");
    // Decided from mountinfo, without a lookup that could hang (and leave
    // a thread no signal ends, which would keep firn from exiting).
    assert_eq!(
        metric(
            address,
            "firn_untrusted_files_refused_total{reason=\"timed_out\"}"
        ),
        Some(0.0),
        "{}",
        agent.log()
    );
    assert_eq!(
        metric(address, "firn_stage_stalled{stage=\"drain\"}"),
        Some(0.0),
        "{}",
        agent.log()
    );
    agent.terminate_cleanly();
}
