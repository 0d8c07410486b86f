//! `firn record -- CMD` follows what the command starts on a host without
//! tracefs (a fresh VM, many containers, minimal hosts). The test makes
//! that host itself, in a mount namespace of its own, whatever the machine
//! running it has mounted: a suite run where tracefs happens to be mounted
//! must not hide a dependency on it.

mod common;

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use agent_pprof::Reader;
use common::*;

/// Each child spins this long, at this rate: about 200 samples each.
const SPIN_MS: &str = "400";
const FREQUENCY: &str = "499";

/// Run by `sh` in a new mount namespace: empty tmpfs over both places
/// tracefs is found (`/sys/kernel/debug/tracing` goes with debugfs),
/// checked gone, then the rest of the arguments are executed.
const WITHOUT_TRACEFS: &str = r#"
set -e
for dir in /sys/kernel/tracing /sys/kernel/debug; do
    if [ -d "$dir" ]; then
        mount -t tmpfs -o size=4k,mode=0555 firn-test-no-tracefs "$dir"
    fi
done
for events in /sys/kernel/tracing/events /sys/kernel/debug/tracing/events; do
    if [ -e "$events" ]; then
        echo "tracefs is still mounted: $events" >&2
        exit 97
    fi
done
exec "$@"
"#;

#[test]
fn a_commands_children_are_profiled_where_tracefs_is_not_mounted() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let program = build_c(dir.path(), "exec_target.c", "exec_target", &FP_FLAGS);
    let output_path = dir.path().join("profile.pb.gz");
    let log = dir.path().join("record.log");
    // Two children of the shell, each spinning in `target_spin` (a shell
    // may run its last command in its own process: the first one at
    // least is a child).
    let children = format!("\"$0\" {SPIN_MS}; \"$0\" {SPIN_MS}");
    let mut firn = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(WITHOUT_TRACEFS)
        .arg("without-tracefs")
        .arg(env!("CARGO_BIN_EXE_firn"))
        .arg("record")
        .arg("--output")
        .arg(&output_path)
        .args(["--frequency", FREQUENCY, "--", "sh", "-c", &children])
        .arg(&program)
        .env("FIRN_LOG_LEVEL", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .unwrap_or_else(|error| panic!("unshare (util-linux) is needed: {error}"));
    let stderr = || std::fs::read_to_string(&log).unwrap_or_default();
    // Generous: loading and verifying the BPF programs on a busy machine
    // has taken tens of seconds.
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = firn.try_wait().expect("waits") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = firn.kill();
            let _ = firn.wait();
            panic!("firn record did not finish:\n{}", stderr());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = stderr();
    assert_ne!(status.code(), Some(97), "{stderr}");
    assert!(status.success(), "firn record exited {status}:\n{stderr}");

    let bytes = std::fs::read(&output_path).expect("firn wrote the profile");
    let profile = agent_pprof::decode(&bytes).expect("the profile decodes as pprof");
    let mut spins_by_pid: BTreeMap<String, i64> = BTreeMap::new();
    for sample in Reader::new(&profile).samples() {
        let names = sample.function_names();
        if names.first().map(String::as_str) == Some("target_spin")
            && names.iter().any(|name| name == "main")
        {
            let pid = sample.label("pid").expect("every sample has a pid");
            *spins_by_pid.entry(pid.to_owned()).or_insert(0) += sample.count();
        }
    }
    assert_eq!(
        spins_by_pid.len(),
        2,
        "both programs the shell ran are in the profile, by name: {spins_by_pid:?}\n{stderr}"
    );
    for (pid, samples) in &spins_by_pid {
        assert!(
            *samples >= 20,
            "pid {pid}: {samples} samples of target_spin, expected a share of {SPIN_MS} ms at {FREQUENCY} Hz\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("will not be profiled"),
        "following children needs no tracefs:\n{stderr}"
    );
}
