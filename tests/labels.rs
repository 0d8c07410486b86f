//! End to end: the labels of real processes. Workloads the test builds are
//! moved into real cgroups it makes (named as Docker, containerd, CRI-O,
//! Podman and systemd name theirs, in the v1 and the v2 hierarchy);
//! relabeling is checked in what reaches a real Parca server.

mod common;
mod labels_support;
mod parca_support;

use std::{
    path::Path,
    process::Command,
    time::{Duration, SystemTime},
};

use agent_pprof::{self as pprof, Reader};
use common::*;
use labels_support::*;
use parca_support::harness::{Agent, ParcaServer, all_stacks, free_port, log_field};

const MINUTE: Duration = Duration::from_secs(60);

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of cgroup layouts (one row per runtime, driver and version), each then checked in turn"
)]
fn containers_and_units_are_named_from_real_cgroups_v1_and_v2() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let h = hierarchies();
    let uid = pod_uid();
    let uid_ = uid.replace('-', "_");
    let ids: Vec<String> = (0..6).map(|_| random_hex(64)).collect();
    let unit = format!("firn-test-{}.service", random_hex(8));
    // (hierarchy, cgroup path, container id, systemd unit)
    let layouts: Vec<(&Path, String, Option<&str>, Option<String>)> = vec![
        // Docker with cgroupfs, v1.
        (&h.cpu, format!("docker/{}", ids[0]), Some(&ids[0]), None),
        // Kubernetes with cgroupfs (containerd, Docker or CRI-O), v1.
        (
            &h.cpu,
            format!("kubepods/burstable/pod{uid}/{}", ids[1]),
            Some(&ids[1]),
            None,
        ),
        // containerd (CRI) with the systemd driver, v2.
        (
            &h.unified,
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{}.scope",
                ids[2]
            ),
            Some(&ids[2]),
            Some(format!("cri-containerd-{}.scope", ids[2])),
        ),
        // CRI-O with the systemd driver, v2.
        (
            &h.unified,
            format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{}.scope",
                ids[3]
            ),
            Some(&ids[3]),
            Some(format!("crio-{}.scope", ids[3])),
        ),
        // Podman (rootful, systemd), its container in a child cgroup, v2.
        (
            &h.unified,
            format!("machine.slice/libpod-{}.scope/container", ids[4]),
            Some(&ids[4]),
            Some(format!("libpod-{}.scope", ids[4])),
        ),
        // Docker with the systemd driver, v2.
        (
            &h.unified,
            format!("system.slice/docker-{}.scope", ids[5]),
            Some(&ids[5]),
            Some(format!("docker-{}.scope", ids[5])),
        ),
        // A systemd service in systemd's own v1 hierarchy.
        (
            &h.systemd,
            format!("system.slice/{unit}"),
            None,
            Some(unit.clone()),
        ),
    ];
    let mut cgroups = TestCgroups(Vec::new());
    let mut workloads = Vec::new();
    for (root, path, _, _) in &layouts {
        let cgroup = TestCgroup::create(root, path);
        let workload = start_chain(dir.path(), &FP_FLAGS);
        cgroup.add(workload.pid());
        cgroups.0.push(cgroup);
        workloads.push(workload);
    }
    let mut args = vec!["--duration".to_owned(), "4s".to_owned()];
    for workload in &workloads {
        args.extend(["--pid".to_owned(), workload.pid().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, profile) = record(dir.path(), &args);
    // On any failure the workloads (declared after the cgroups) are killed
    // first, so the cgroups are empty when they are removed.
    let release = kernel_release();
    for (workload, (_, path, id, unit)) in workloads.iter().zip(&layouts) {
        let (labels, samples) = labels_of(&profile, workload.pid());
        assert!(
            samples > 0,
            "no samples of the workload in /{path}; labels seen: {labels:?}"
        );
        let get = |name: &str| labels.get(name).map(String::as_str);
        assert_eq!(get("container_id"), *id, "/{path}: {labels:?}");
        assert_eq!(get("systemd_unit"), unit.as_deref(), "/{path}: {labels:?}");
        assert_eq!(
            get("cgroup"),
            Some(format!("/{path}").as_str()),
            "{labels:?}"
        );
        assert_eq!(get("executable"), Some("chain"), "{labels:?}");
        assert_eq!(get("comm"), Some("chain"), "{labels:?}");
        // A systemd service names the service; a container outside
        // Kubernetes (no runtime socket here) and a plain process go by
        // the executable's name.
        let service = unit
            .as_deref()
            .and_then(|unit| unit.strip_suffix(".service"))
            .unwrap_or("chain");
        assert_eq!(get("service_name"), Some(service), "/{path}: {labels:?}");
        assert_eq!(get("kernel_release"), Some(release.as_str()));
        assert!(get("node").is_some_and(|n| !n.is_empty()), "{labels:?}");
        assert!(
            labels.keys().all(|name| !name.starts_with("__")),
            "{labels:?}"
        );
    }
}

/// Processes of a few milliseconds have exited before firn labels their
/// samples (held for the mappings captured at their exit), so their /proc
/// tells nothing; the v2 cgroup id their samples carry does, once firn
/// read a live process of that cgroup: here the unit's main process, as a
/// service's (or a pod's) short-lived helpers have one beside them.
#[test]
fn short_lived_processes_are_labelled_by_their_cgroup_id() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let burst = build_c(dir.path(), "burst.c", "burst", &FP_FLAGS);
    let unit = format!("firn-test-{}.service", random_hex(8));
    // Declared before the processes: removed after they are killed, even
    // when an assertion fails.
    let cgroup = TestCgroup::create(&unified_hierarchy(), &unit);
    // Each process joins the unit before it executes `burst`, as a
    // service's processes do.
    let in_unit = |args: &str| {
        format!(
            "echo $$ > {} && exec {} {args}",
            cgroup.procs().display(),
            burst.display()
        )
    };
    let mut recording = Recording::start(dir.path(), &["--duration", "300s", "--frequency", "400"]);
    recording.wait_until_sampling();
    let main = TestProcess::spawn(Command::new("sh").args(["-c", &in_unit("5 20")]));
    // Sampled (so read alive) some 50 times.
    wait_for_cpu_time(main.pid(), Duration::from_millis(150), MINUTE);
    let runs = format!("for i in $(seq 200); do sh -c '{}'; done", in_unit("5"));
    let status = Command::new("sh")
        .args(["-c", &runs])
        .status()
        .expect("sh runs");
    assert!(status.success(), "the short runs failed");
    let (log, profile) = recording.interrupt();
    let main_pid = main.pid().to_string();
    let cgroup_path = format!("/{unit}");
    let (mut total, mut named_unit, mut in_cgroup, mut read_alive) = (0, 0, 0, 0);
    let mut others = std::collections::BTreeMap::<String, i64>::new();
    for sample in Reader::new(&profile).samples() {
        if sample.label("comm") != Some("burst") || sample.label("pid") == Some(main_pid.as_str()) {
            continue;
        }
        let count = sample.count();
        total += count;
        match sample.label("systemd_unit") {
            Some(name) if name == unit => named_unit += count,
            name => *others.entry(format!("{name:?}")).or_default() += count,
        }
        in_cgroup += count * i64::from(sample.label("cgroup") == Some(cgroup_path.as_str()));
        read_alive += count * i64::from(sample.label("executable").is_some());
    }
    let share = |part: i64| part as f64 * 100.0 / total.max(1) as f64;
    eprintln!(
        "short-lived runs: {total} samples, {:.1}% with systemd_unit {unit}, {:.1}% with \
         cgroup {cgroup_path}, {:.1}% read alive (an executable known)",
        share(named_unit),
        share(in_cgroup),
        share(read_alive)
    );
    let summary = log
        .lines()
        .find(|line| line.contains("profile written"))
        .unwrap_or_default();
    assert!(total >= 100, "{total} samples of the runs:\n{summary}");
    assert!(
        share(named_unit) >= SHORT_LIVED_LABELLED && share(in_cgroup) >= SHORT_LIVED_LABELLED,
        "{:.1}% of {total} samples of the unit's short-lived processes name it, {:.1}% its \
         cgroup; the unit label of the others: {others:?}\n{summary}",
        share(named_unit),
        share(in_cgroup)
    );
}

/// Percent of the samples of short-lived processes that carry their
/// unit's labels: 100% measured; 0.2% (those read alive) before firn
/// labelled them by their cgroup id.
const SHORT_LIVED_LABELLED: f64 = 90.0;

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story against one server: workloads, relabel rules, the agent, then what Parca holds and what it must not"
)]
fn dropped_processes_never_reach_parca_and_relabeled_labels_do() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let parca = ParcaServer::start(&dir.path().join("parca"), free_port());
    // Two copies of the workload, told apart by their names.
    let built = build_c(dir.path(), "chain.c", "chain", &FP_FLAGS);
    let copy = |name: &str| {
        let path = dir.path().join(name);
        std::fs::copy(&built, &path).expect("copy");
        TestProcess::spawn(std::process::Command::new(path).arg("100000"))
    };
    let keep = copy("keepme");
    let drop = copy("dropme");
    keep.wait_until_running();
    drop.wait_until_running();
    let config = dir.path().join("firn.yaml");
    std::fs::write(
        &config,
        "relabel_configs:\n\
         - source_labels: [comm]\n  regex: drop.*\n  action: drop\n\
         - target_label: team\n  replacement: profiling\n\
         - action: labeldrop\n  regex: cgroup\n\
         - source_labels: [__meta_process_executable_name]\n  target_label: binary\n  action: uppercase\n",
    )
    .expect("config file");
    let start = SystemTime::now();
    let (keep_pid, drop_pid) = (keep.pid().to_string(), drop.pid().to_string());
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--profiling-duration",
            "3s",
            "--config-path",
            config.to_str().expect("utf-8"),
            "--pid",
            &keep_pid,
            "--pid",
            &drop_pid,
        ],
        &[],
    );
    // Intervals pushed, and the dropped process left out from its first
    // sample on (in the kernel after that).
    let address = agent.http_address();
    wait_for(
        "two intervals sent and relabeling's drops counted",
        Duration::from_secs(90),
        || {
            agent.assert_running();
            metric(address, "firn_profiles_sent_total").is_some_and(|n| n >= 2.0)
                && metric(address, "firn_samples_excluded_total{at=\"bpf\"}")
                    .is_some_and(|n| n > 0.0)
        },
        || agent.log(),
    );
    let stopped = agent.stop();
    let log = &stopped.log;
    assert!(stopped.status.success(), "{log}");
    assert!(
        log_field(log, "firn agent stopped", "remote_profiles_sent").unwrap_or(0) > 0,
        "{log}"
    );
    assert_eq!(
        log_field(log, "firn agent stopped", "processes_excluded"),
        Some(1),
        "the dropped process is counted, once:\n{log}"
    );

    let (start, end) = (start - MINUTE, SystemTime::now() + MINUTE);
    let mut query = parca.query();
    let comms = query.values("comm", start, end);
    assert!(comms.iter().any(|c| c == "keepme"), "comm values {comms:?}");
    assert!(
        !comms.iter().any(|c| c == "dropme"),
        "the dropped process reached Parca: {comms:?}"
    );
    let pids = query.values("pid", start, end);
    assert_eq!(pids, [keep_pid], "only the kept process");
    let dropped = query.merged("{comm=\"dropme\"}", start, end);
    assert!(dropped.sample.is_empty(), "samples of the dropped process");
    let kept = all_stacks(&query.merged("{comm=\"keepme\"}", start, end));
    let (share, total) = chain_share(&kept, &CHAIN);
    assert!(
        total > 0 && share >= 0.85,
        "{total} samples, {:.0}% chain:\n{}",
        share * 100.0,
        describe(&kept)
    );
    assert_eq!(query.values("team", start, end), ["profiling"]);
    assert_eq!(query.values("binary", start, end), ["KEEPME"]);
    assert!(query.values("cgroup", start, end).is_empty(), "labeldrop");
    assert_eq!(query.values("executable", start, end), ["keepme"]);
    assert_eq!(
        query.values("kernel_release", start, end),
        [kernel_release()]
    );
    assert!(
        query
            .values("__meta_process_cmdline", start, end)
            .is_empty(),
        "discovery labels are removed"
    );
}

/// A process a keep rule leaves out costs no more than the BPF check:
/// its first sample finds it left out, the BPF program is told its tgid,
/// and nothing of it is unwound or symbolized; the counters say so, and
/// no profile holds it while the kept process's stacks are whole.
#[test]
fn a_process_a_keep_rule_leaves_out_is_never_symbolized() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let built = build_c(dir.path(), "chain.c", "chain", &FP_FLAGS);
    let copy = |name: &str| {
        let path = dir.path().join(name);
        std::fs::copy(&built, &path).expect("copy");
        TestProcess::spawn(std::process::Command::new(path).arg("100000"))
    };
    let kept = copy("keepme");
    let left_out = copy("leftout");
    kept.wait_until_running();
    left_out.wait_until_running();
    let config = dir.path().join("firn.yaml");
    std::fs::write(
        &config,
        "relabel_configs:\n- source_labels: [comm]\n  regex: keep.*\n  action: keep\n",
    )
    .expect("config file");
    let store = dir.path().join("store");
    let (kept_pid, left_out_pid) = (kept.pid().to_string(), left_out.pid().to_string());
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--local-store-directory",
            store.to_str().expect("utf-8"),
            "--profiling-duration",
            "2s",
            "--config-path",
            config.to_str().expect("utf-8"),
            "--pid",
            &kept_pid,
            "--pid",
            &left_out_pid,
        ],
        &[],
    );
    let address = agent.http_address();
    let excluded = |at: &str| {
        metric(
            address,
            &format!("firn_samples_excluded_total{{at=\"{at}\"}}"),
        )
        .unwrap_or(0.0)
    };
    wait_for(
        "profiles written and the left-out process's samples stopped in the kernel",
        Duration::from_secs(60),
        || {
            agent.assert_running();
            metric(address, "firn_profiles_written_total").is_some_and(|n| n >= 2.0)
                && excluded("bpf") >= 50.0
        },
        || agent.log(),
    );
    let (in_kernel, in_userspace) = (excluded("bpf"), excluded("userspace"));
    assert_eq!(
        metric(address, "firn_processes_excluded_total"),
        Some(1.0),
        "the left-out process, once"
    );
    // Its samples reach userspace only until the BPF program is told:
    // those in the ring buffer at that moment, a few (a drain's worth on a
    // loaded host), against every later one in the kernel.
    assert!(
        (1.0..=50.0).contains(&in_userspace),
        "{in_userspace} samples left out in userspace, {in_kernel} in the kernel"
    );
    assert_eq!(
        metric(address, "firn_samples_dropped_by_relabeling_total"),
        Some(0.0),
        "nothing of it reached the output stage"
    );
    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
    assert_only_kept_profiled(&store, kept.pid(), left_out.pid());
}

/// Every profile in `store` holds whole chains of `kept` and nothing of
/// `left_out`, not even its name.
fn assert_only_kept_profiled(store: &Path, kept: u32, left_out: u32) {
    let mut kept_samples = 0;
    for entry in std::fs::read_dir(store).expect("store") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".pb.gz") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("profile");
        let profile = pprof::decode(&bytes).expect("a pprof profile");
        assert!(
            stacks_of(&profile, left_out).is_empty(),
            "the left-out process is in {}",
            path.display()
        );
        assert!(
            !profile.string_table.iter().any(|s| s.contains("leftout")),
            "its name or binary is in {}",
            path.display()
        );
        let stacks = stacks_of(&profile, kept);
        kept_samples += stacks.iter().map(|(_, count)| count).sum::<i64>();
        let (share, total) = chain_share(&stacks, &CHAIN);
        assert!(
            total == 0 || share >= 0.85,
            "{total} samples, {:.0}% chain:\n{}",
            share * 100.0,
            describe(&stacks)
        );
    }
    assert!(kept_samples > 0, "the kept process was profiled");
}

#[test]
fn an_invalid_relabel_config_stops_firn_at_start_naming_the_rule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("firn.yaml");
    for (text, expected) in [
        (
            "relabel_configs:\n- action: keep\n  source_labels: [comm]\n- action: replace\n  source_labels: [comm]\n",
            "relabel_configs[1]",
        ),
        (
            "relabel_configs:\n- action: drop\n  regex: \"(unclosed\"\n",
            "relabel_configs[0]",
        ),
        ("relabel_configs:\n- action: dropp\n", "dropp"),
        ("relabel_configs:\n- sourcelabels: [comm]\n", "sourcelabels"),
        ("relabel_config: []\n", "relabel_config"),
    ] {
        std::fs::write(&config, text).expect("config file");
        for command in [&[][..], &["record"][..]] {
            let output = firn()
                .args(command)
                .arg("--config-path")
                .arg(&config)
                .output()
                .expect("firn runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{text}\n{stderr}");
            assert!(stderr.contains(expected), "{text}\nstderr: {stderr}");
        }
    }
    let output = firn()
        .args(["--config-path", "/nonexistent/firn.yaml"])
        .output()
        .expect("firn runs");
    assert_eq!(output.status.code(), Some(2));
}
