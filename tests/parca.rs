//! End to end: the real `firn` agent pushing to a real Parca server (v0.28,
//! built by `cargo xtask setup`) and to a TLS server of the test's own,
//! read back through Parca's own query API and checked by function names.

mod common;
mod parca_support;

use std::{
    collections::HashSet,
    process::Command,
    time::{Duration, SystemTime},
};

use agent_pprof as pprof;
use common::*;
use parca_support::{
    harness::{Agent, CPU_PROFILE_TYPE, ParcaServer, all_stacks, free_port, log_field},
    stripped::StrippedWorkload,
    tls_server::{Authority, TlsStore},
};

const MINUTE: Duration = Duration::from_secs(60);

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story: workload, agent, server, then the stacks Parca answers with, checked frame by frame"
)]
fn profiles_reach_a_real_parca_server_with_the_whole_chain() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let parca = ParcaServer::start(&dir.path().join("parca"), free_port());
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let start = SystemTime::now();
    // The whole machine, as a DaemonSet would run it; the workload is
    // found among everything else by its pid label.
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--profiling-duration",
            "5s",
            "--node",
            "firn-e2e-node",
            "--metadata-external-labels",
            "suite=parca-e2e",
        ],
        &[],
    );
    // Until Parca holds enough of the workload (about 20 s; longer on a
    // loaded machine, where the workload gets less of a CPU).
    let mut query = parca.query();
    let pid = workload.pid();
    let held = std::cell::Cell::new(0);
    wait_for(
        "500 samples of the workload in Parca",
        Duration::from_secs(120),
        || {
            agent.assert_running();
            held.set(
                query
                    .try_merged(
                        &format!("{{pid=\"{pid}\"}}"),
                        start - MINUTE,
                        SystemTime::now() + MINUTE,
                    )
                    .map_or(0, |profile| chain_share(&all_stacks(&profile), &CHAIN).1),
            );
            std::thread::sleep(Duration::from_millis(500));
            held.get() >= 500
        },
        || format!("{} samples held\n{}", held.get(), agent.log()),
    );
    let stopped = agent.stop();
    let log = &stopped.log;
    assert!(
        stopped.status.success(),
        "firn failed ({}):\n{log}",
        stopped.status
    );
    let sent = log_field(log, "firn agent stopped", "remote_profiles_sent").unwrap_or(0);
    assert!(sent > 0, "no profiles sent:\n{log}");
    for counter in ["remote_profiles_rejected", "remote_profiles_dropped"] {
        assert_eq!(
            log_field(log, "firn agent stopped", counter),
            Some(0),
            "{counter}:\n{log}"
        );
    }

    let end = SystemTime::now() + MINUTE;
    let start = start - MINUTE;
    let mut query = parca.query();
    let types = query.profile_types();
    assert!(
        types.iter().any(|t| t == CPU_PROFILE_TYPE),
        "Parca lists {types:?}"
    );
    for (label, value) in [
        ("node", "firn-e2e-node"),
        ("suite", "parca-e2e"),
        ("comm", "chain"),
    ] {
        let values = query.values(label, start, end);
        assert!(
            values.iter().any(|v| v == value),
            "Values({label}) = {values:?}"
        );
    }
    let pid = workload.pid();
    let profile = query.merged(&format!("{{pid=\"{pid}\"}}"), start, end);
    let stacks = all_stacks(&profile);
    let (share, total) = chain_share(&stacks, &CHAIN);
    assert!(
        total >= 500,
        "Parca holds {total} samples of the workload for ~20 s at 100 Hz:\n{}",
        describe(&stacks)
    );
    assert!(
        share >= 0.85,
        "only {:.1}% of {total} samples in Parca hold the whole chain:\n{}",
        share * 100.0,
        describe(&stacks)
    );
    eprintln!(
        "Parca: {total} samples of pid {pid}, {:.1}% with the whole chain; {sent} profiles sent",
        share * 100.0
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "two agents in sequence against a server that comes up late: a roomy queue, then a cramped one"
)]
fn a_server_down_at_start_gets_the_queued_profiles_and_a_small_queue_counts_drops() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid().to_string();
    let start = SystemTime::now();
    let agent = |node: &str, extra: &[&str]| {
        let mut args = vec![
            "--remote-store-address",
            &address,
            "--remote-store-insecure",
            "--profiling-duration",
            "2s",
            "--pid",
            &pid,
            "--node",
            node,
        ];
        args.extend_from_slice(extra);
        Agent::start(&dir.path().join(format!("{node}.log")), &args, &[])
    };
    let roomy = agent("firn-roomy-queue", &[]);
    // Room for about three of these profiles (one process, ~500 bytes).
    let cramped = agent(
        "firn-cramped-queue",
        &["--remote-store-queue-bytes", "1500"],
    );
    // Intervals pile up while the server is down, until the cramped queue
    // has had to drop some.
    wait_for(
        "five intervals queued and the cramped queue full",
        Duration::from_secs(90),
        || {
            roomy.log().matches("profiles queued").count() >= 5
                && cramped.log().contains("(--remote-store-queue-bytes)")
        },
        || format!("{}\n{}", roomy.log(), cramped.log()),
    );

    // Sampling went on while nothing could be delivered.
    let log = roomy.log();
    assert!(
        log.matches("profiles queued").count() >= 5,
        "an interval every 2 s while the server is down:\n{log}"
    );
    assert!(
        log.contains("could not push profiles; will retry"),
        "failed pushes are logged:\n{log}"
    );
    let up = SystemTime::now();
    let parca = ParcaServer::start(&dir.path().join("parca"), port);
    assert!(
        roomy.wait_for_log("profiles delivered after retrying", Duration::from_secs(40)),
        "the queued profiles were not delivered once the server came up:\n{}\nParca:\n{}",
        roomy.log(),
        parca.log()
    );
    // The cramped queue gets its newer profiles through too.
    let cramped_address = cramped.http_address();
    wait_for(
        "the cramped queue to deliver",
        Duration::from_secs(40),
        || metric(cramped_address, "firn_profiles_sent_total").is_some_and(|sent| sent > 0.0),
        || cramped.log(),
    );
    let roomy = roomy.stop();
    let cramped = cramped.stop();
    for stopped in [&roomy, &cramped] {
        assert!(stopped.status.success(), "{}", stopped.log);
    }

    // The roomy queue lost nothing: every interval reached the server.
    let log = &roomy.log;
    let queued = log.matches("profiles queued").count() as u64;
    let sent = log_field(log, "firn agent stopped", "remote_profiles_sent");
    assert_eq!(sent, Some(queued), "one profile per interval:\n{log}");
    assert_eq!(
        log_field(log, "firn agent stopped", "remote_profiles_dropped"),
        Some(0)
    );
    assert!(log_field(log, "firn agent stopped", "remote_send_retries").unwrap_or(0) > 0);
    let mut query = parca.query();
    let while_down = query.merged("{node=\"firn-roomy-queue\"}", start - MINUTE, up);
    let (share, total) = chain_share(&all_stacks(&while_down), &CHAIN);
    assert!(
        total > 0 && share >= 0.85,
        "profiles sampled while the server was down are in Parca: {total} samples, {:.0}% chain",
        share * 100.0
    );

    // The cramped queue dropped its oldest and said so.
    let log = &cramped.log;
    let dropped = log_field(log, "firn agent stopped", "remote_profiles_dropped").unwrap_or(0);
    assert!(dropped > 0, "nothing counted as dropped:\n{log}");
    assert!(
        log.contains("(--remote-store-queue-bytes)"),
        "drops are logged:\n{log}"
    );
    let sent = log_field(log, "firn agent stopped", "remote_profiles_sent").unwrap_or(0);
    assert!(
        sent > 0,
        "newer profiles still go through after drops:\n{log}"
    );
    eprintln!(
        "roomy queue: {queued} intervals, all sent; cramped queue: {dropped} dropped, {sent} sent"
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "four agents against one TLS server: the right token, a wrong one, an untrusted CA, verification off; then each outcome"
)]
fn a_tls_server_demanding_a_token_accepts_the_right_one_and_refusals_are_clear() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    const TOKEN: &str = "firn-test-token-7f3a";
    const WRONG: &str = "firn-wrong-token-91c2";
    let authority = Authority::new(dir.path(), "ca");
    let stranger = Authority::new(dir.path(), "other-ca");
    let store = TlsStore::start(&authority, TOKEN);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid().to_string();
    let address = store.address.to_string();
    let ca = authority.pem_path.to_str().expect("utf-8");
    let other_ca = stranger.pem_path.to_str().expect("utf-8");
    let token_path = token_file.to_str().expect("utf-8");

    let agent = |node: &str, extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec![
            "--remote-store-address",
            &address,
            "--profiling-duration",
            "1s",
            "--pid",
            &pid,
            "--node",
            node,
            "--debuginfo-upload-disable",
        ];
        args.extend_from_slice(extra);
        Agent::start(&dir.path().join(format!("{node}.log")), &args, env)
    };
    let trusted = agent(
        "trusted",
        &[
            "--remote-store-ca-file",
            ca,
            "--remote-store-bearer-token-file",
            token_path,
        ],
        &[],
    );
    let wrong_token = agent(
        "wrong-token",
        &["--remote-store-ca-file", ca],
        &[("PARCA_BEARER_TOKEN", WRONG)],
    );
    let wrong_ca = agent(
        "wrong-ca",
        &[
            "--remote-store-ca-file",
            other_ca,
            "--remote-store-bearer-token",
            TOKEN,
        ],
        &[],
    );
    let unverified = agent(
        "unverified",
        &[
            "--remote-store-insecure-skip-verify",
            "--remote-store-bearer-token-file",
            token_path,
        ],
        &[],
    );
    // Each agent's outcome: profiles through, or its refusal logged.
    let counted = |agent: &Agent, name: &str, at_least: f64| {
        metric(agent.http_address(), name).is_some_and(|n| n >= at_least)
    };
    wait_for(
        "every agent's outcome",
        Duration::from_secs(90),
        || {
            // Enough of the workload sampled (the last interval is pushed
            // at stop), and some through already.
            counted(&trusted, "firn_samples_total", 200.0)
                && counted(&trusted, "firn_profiles_sent_total", 1.0)
                && counted(&unverified, "firn_profiles_sent_total", 1.0)
                && wrong_token
                    .log()
                    .contains("the server rejected the profiles")
                && wrong_ca.log().contains("could not push profiles")
        },
        || {
            [&trusted, &wrong_token, &wrong_ca, &unverified]
                .map(Agent::log)
                .join("\n")
        },
    );
    let trusted = trusted.stop();
    let wrong_token = wrong_token.stop();
    let wrong_ca = wrong_ca.stop();
    let unverified = unverified.stop();
    for stopped in [&trusted, &wrong_token, &wrong_ca, &unverified] {
        assert!(
            stopped.status.success(),
            "refusals must not crash firn ({}):\n{}",
            stopped.status,
            stopped.log
        );
        assert!(
            !stopped.log.contains(TOKEN) && !stopped.log.contains(WRONG),
            "a token leaked into the log:\n{}",
            stopped.log
        );
    }

    let seen = store.seen.lock().expect("lock");
    let node_of = |series: &firn::output::parca::profilestore::RawProfileSeries| {
        label(series, "node").unwrap_or_default()
    };
    let nodes: HashSet<String> = seen.series.iter().map(node_of).collect();
    assert_eq!(
        nodes,
        HashSet::from(["trusted".to_owned(), "unverified".to_owned()]),
        "only the agents with the right token that trust the server get through"
    );
    assert!(
        unverified
            .log
            .contains("TLS certificate verification is off"),
        "skipping verification is said out loud:\n{}",
        unverified.log
    );
    let mut stacks = Vec::new();
    for series in seen.series.iter().filter(|s| node_of(s) == "trusted") {
        assert_eq!(
            label(series, "__name__").as_deref(),
            Some("parca_agent_cpu")
        );
        assert_eq!(label(series, "pid").as_deref(), Some(pid.as_str()));
        assert_eq!(label(series, "comm").as_deref(), Some("chain"));
        for sample in &series.samples {
            let profile = pprof::decode(&sample.raw_profile).expect("a gzipped pprof");
            pprof::validate(&profile).expect("follows Parca's rules");
            stacks.extend(all_stacks(&profile));
        }
    }
    let (share, total) = chain_share(&stacks, &CHAIN);
    assert!(
        total > 100 && share >= 0.85,
        "{total} samples, {:.0}% with the chain:\n{}",
        share * 100.0,
        describe(&stacks)
    );
    for (stopped, node) in [(&trusted, "trusted"), (&unverified, "unverified")] {
        let sent =
            log_field(&stopped.log, "firn agent stopped", "remote_profiles_sent").unwrap_or(0);
        let received = seen.series.iter().filter(|s| node_of(s) == node).count();
        assert!(sent > 0, "{}", stopped.log);
        assert_eq!(sent as usize, received, "{}", stopped.log);
    }

    // The environment's token was sent, and refused with a clear line.
    assert!(
        seen.refused_credentials
            .iter()
            .any(|c| c == &format!("Bearer {WRONG}")),
        "PARCA_BEARER_TOKEN is used"
    );
    let log = &wrong_token.log;
    assert!(
        log.contains("the server rejected the profiles")
            && log.contains("Unauthenticated")
            && log.contains("--remote-store-bearer-token"),
        "{log}"
    );
    assert!(log_field(log, "firn agent stopped", "remote_profiles_rejected").unwrap_or(0) > 0);

    // A certificate from an unknown CA never gets as far as the token.
    let log = &wrong_ca.log;
    assert!(
        log.contains("could not push profiles") && log.contains("UnknownIssuer"),
        "{log}"
    );
    assert_eq!(
        log_field(log, "firn agent stopped", "remote_profiles_sent"),
        Some(0)
    );
    assert_eq!(
        seen.refused_credentials
            .iter()
            .filter(|c| c.contains(TOKEN))
            .count(),
        0
    );
}

/// firn cannot name this workload's frames: it is stripped, and its debug
/// file holds no symbol table and more DWARF than firn's cache may index.
/// So firn sends the frames as addresses and, because they are unnamed,
/// uploads the debug file (no `--debuginfo-upload-symbolized`); the names
/// Parca then answers with can only be the server's own, from that file.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story: strip a workload, keep its debug file, profile it, then follow the upload to the names Parca shows"
)]
fn a_stripped_workload_is_named_by_parca_from_the_uploaded_debug_file() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let StrippedWorkload {
        binary,
        build_id,
        debug_dir,
        debug_file: target,
    } = StrippedWorkload::build(dir.path());
    let parca = ParcaServer::start(&dir.path().join("parca"), free_port());
    let workload = TestProcess::spawn(Command::new(&binary).arg("100000"));
    workload.wait_until_running();
    let pid = workload.pid().to_string();
    let start = SystemTime::now() - MINUTE;
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--profiling-duration",
            "3s",
            "--pid",
            &pid,
            "--debuginfo-directories",
            debug_dir.to_str().expect("utf-8"),
            "--debuginfo-cache-size",
            "1MiB",
        ],
        &[],
    );
    let address = agent.http_address();
    agent.wait_until("the debug file uploaded", MINUTE, || {
        agent.log().contains("debuginfo uploaded")
    });
    // Parca symbolizes at query time: until it names the chain in most
    // samples, while firn keeps sending.
    let mut query = parca.query();
    let last = std::cell::RefCell::new(String::new());
    let mut named = (0.0, 0);
    wait_for(
        "Parca to name the stripped workload",
        2 * MINUTE,
        || {
            agent.assert_running();
            let Ok(profile) = query.try_merged(
                &format!("{{pid=\"{pid}\"}}"),
                start,
                SystemTime::now() + MINUTE,
            ) else {
                return false;
            };
            let stacks = all_stacks(&profile);
            named = chain_share(&stacks, &CHAIN);
            *last.borrow_mut() = format!(
                "{} samples, {:.1}% with the chain:\n{}",
                named.1,
                named.0 * 100.0,
                describe(&stacks)
            );
            std::thread::sleep(Duration::from_millis(500));
            named.1 >= 200 && named.0 >= 0.85
        },
        || format!("{}\nParca:\n{}", last.borrow(), parca.log()),
    );
    eprintln!(
        "Parca named {:.1}% of {} samples of the stripped workload",
        named.0 * 100.0,
        named.1
    );
    // firn itself named none of them: their object's DWARF was too large
    // to index, and nothing else names them.
    let limited = metric(
        address,
        "firn_symbolizer_limited_total{reason=\"dwarf_too_large\"}",
    );
    let unnamed = metric(
        address,
        "firn_frames_unsymbolized_total{stack=\"user\",reason=\"no_symbol\"}",
    );
    let stopped = agent.stop();
    let log = &stopped.log;
    assert!(stopped.status.success(), "{log}");
    assert!(
        limited.is_some_and(|count| count >= 1.0) && unnamed.is_some_and(|count| count >= 1.0),
        "firn should have sent the frames unnamed (DWARF too large {limited:?}, unnamed frames {unnamed:?}):\n{log}"
    );
    let line = log
        .lines()
        .find(|line| line.contains("debuginfo uploaded"))
        .expect("upload line");
    assert!(
        line.contains(&build_id) && line.contains(target.to_str().expect("utf-8")),
        "the debug file found by build id was uploaded: {line}"
    );
    assert_eq!(
        log_field(log, "firn agent stopped", "debuginfo_uploads"),
        Some(1),
        "{log}"
    );
    assert!(
        parca.data.join("debuginfo").join(&build_id).exists(),
        "Parca stored the debug file under its build id"
    );
}

fn label(
    series: &firn::output::parca::profilestore::RawProfileSeries,
    name: &str,
) -> Option<String> {
    series
        .labels
        .as_ref()?
        .labels
        .iter()
        .find(|l| l.name == name)
        .map(|l| l.value.clone())
}
