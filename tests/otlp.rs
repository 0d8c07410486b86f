//! End to end: the real `firn` agent exporting OTLP profiles to a real
//! OpenTelemetry Collector (v0.161.0, built by `cargo xtask setup`) over
//! gRPC and HTTP, read back from what the Collector's file exporter wrote;
//! to Pyroscope's OTLP endpoint, read back through its query API; beside
//! Parca with the same totals; and to receivers that refuse.

mod common;
mod otlp_support;
mod parca_support;
#[allow(dead_code)]
mod pyroscope_support;

use std::{
    cell::{Cell, RefCell},
    time::{Duration, SystemTime},
};

use common::*;
use otlp_support::{Collector, Received};
use parca_support::{
    harness::{ParcaServer, all_stacks},
    tls_server::Authority,
};
use pyroscope_support::{CPU_TYPE, PyroscopeServer};

const MINUTE: Duration = Duration::from_secs(60);
const REJECTED: &str = "firn_profiles_dropped_total{reason=\"rejected\"}";

/// What the Collector got of process `pid` by `protocol`.
fn of_pid(collector: &Collector, protocol: &str, pid: u32) -> Vec<Received> {
    collector
        .received(protocol)
        .into_iter()
        .filter(|profile| profile.resource.get("process.pid") == Some(&pid.to_string()))
        .collect()
}

fn chain_samples(profiles: &[Received]) -> i64 {
    profiles
        .iter()
        .flat_map(Received::stacks)
        .filter(|(names, _)| holds_chain(names, &CHAIN))
        .map(|(_, count)| count)
        .sum()
}

/// The checks every protocol's profiles pass: the chain in stack order,
/// typed as native code, the resource in semantic-convention names, the
/// executable's build id, samples counted at firn's period.
fn check_profiles(profiles: &[Received], pid: u32, log: &str) {
    let stacks: Vec<(Vec<String>, i64)> = profiles.iter().flat_map(Received::stacks).collect();
    let (share, total) = chain_share(&stacks, &CHAIN);
    assert!(
        share >= 0.9,
        "{share:.2} of {total} samples hold main > level_one > level_two > level_three > burn_leaf:\n{}\n{log}",
        describe(&stacks)
    );
    for profile in profiles {
        let attribute = |key: &str| profile.resource.get(key).map(String::as_str);
        assert_eq!(attribute("service.name"), Some("chain"), "{profile:?}");
        assert_eq!(attribute("process.executable.name"), Some("chain"));
        assert_eq!(attribute("process.pid"), Some(pid.to_string().as_str()));
        assert_eq!(attribute("host.name"), Some("firn-otlp-node"));
        assert!(
            attribute("process.executable.path").is_some_and(|path| path.ends_with("/chain")),
            "{:?}",
            profile.resource
        );
        assert_eq!(profile.sample_type, ("samples".into(), "count".into()));
        assert_eq!(profile.period, 10_000_000, "100 Hz");
        for (frames, _) in &profile.samples {
            for (name, kind) in frames {
                if CHAIN.contains(&name.as_str()) {
                    assert_eq!(kind, "native", "{name} is native code");
                }
                assert!(!kind.is_empty(), "{name} has a frame type");
            }
        }
        let chain_build_id = profile
            .build_ids
            .iter()
            .find(|(file, _)| file.ends_with("/chain"))
            .map(|(_, id)| id);
        assert!(
            chain_build_id
                .is_some_and(|id| id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit())),
            "the executable's GNU build id: {:?}",
            profile.build_ids
        );
    }
}

#[test]
fn profiles_reach_a_real_collector_over_grpc_and_http() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(&dir.path().join("otelcol"), None);
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid();
    let common = [
        "--pid",
        &pid.to_string(),
        "--profiling-duration",
        "3s",
        "--node",
        "firn-otlp-node",
    ];
    let grpc = Agent::start(
        &dir.path().join("grpc.log"),
        &[
            &["--otlp-endpoint", &collector.grpc_endpoint()][..],
            &common,
        ]
        .concat(),
        &[],
    );
    let http = Agent::start(
        &dir.path().join("http.log"),
        &[
            &[
                "--otlp-endpoint",
                &collector.http_endpoint(),
                "--otlp-protocol",
                "http",
                "--thread-labels=true",
            ][..],
            &common,
        ]
        .concat(),
        &[],
    );
    wait_for(
        "200 samples of the chain received by gRPC and by HTTP",
        Duration::from_secs(90),
        || {
            grpc.assert_running();
            http.assert_running();
            std::thread::sleep(Duration::from_millis(500));
            chain_samples(&of_pid(&collector, "grpc", pid)) >= 200
                && chain_samples(&of_pid(&collector, "http", pid)) >= 200
        },
        || format!("{}\n{}\n{}", grpc.log(), http.log(), collector.log()),
    );
    for (agent, protocol) in [(grpc, "grpc"), (http, "http")] {
        let stopped = agent.stop();
        assert!(stopped.status.success(), "firn failed:\n{}", stopped.log);
        assert!(!stopped.log.contains("level=error"), "{}", stopped.log);
        let profiles = of_pid(&collector, protocol, pid);
        check_profiles(&profiles, pid, &stopped.log);
        // With --thread-labels every sample names its thread.
        let named = profiles.iter().all(|profile| {
            profile
                .sample_attributes
                .iter()
                .any(|key| key == "thread.name")
        });
        assert_eq!(named, protocol == "http", "{protocol}");
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story: two servers, one agent, then the totals both hold"
)]
fn fan_out_to_the_collector_and_parca_gives_the_same_totals() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(&dir.path().join("otelcol"), None);
    let parca = ParcaServer::start(
        &dir.path().join("parca"),
        parca_support::harness::free_port(),
    );
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid();
    let start = SystemTime::now();
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--otlp-endpoint",
            &collector.grpc_endpoint(),
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--pid",
            &pid.to_string(),
            "--profiling-duration",
            "3s",
            "--node",
            "firn-otlp-node",
        ],
        &[],
    );
    wait_for(
        "200 samples of the chain at the Collector",
        Duration::from_secs(90),
        || {
            agent.assert_running();
            std::thread::sleep(Duration::from_millis(500));
            chain_samples(&of_pid(&collector, "grpc", pid)) >= 200
        },
        || format!("{}\n{}", agent.log(), collector.log()),
    );
    drop(workload);
    let stopped = agent.stop();
    assert!(stopped.status.success(), "firn failed:\n{}", stopped.log);
    assert_eq!(
        log_field(
            &stopped.log,
            "firn agent stopped",
            "remote_profiles_dropped"
        ),
        Some(0),
        "{}",
        stopped.log
    );
    let at_collector = Cell::new(0);
    let at_parca = Cell::new(0);
    let mut query = parca.query();
    wait_for(
        "the same sample total at the Collector and at Parca",
        Duration::from_secs(60),
        || {
            at_collector.set(
                of_pid(&collector, "grpc", pid)
                    .iter()
                    .map(Received::total)
                    .sum::<i64>(),
            );
            let selector = format!("{{pid=\"{pid}\"}}");
            at_parca.set(
                query
                    .try_merged(&selector, start - MINUTE, SystemTime::now() + MINUTE)
                    .map(|profile| all_stacks(&profile).iter().map(|(_, count)| count).sum())
                    .unwrap_or(0),
            );
            std::thread::sleep(Duration::from_millis(500));
            at_collector.get() > 0 && at_collector.get() == at_parca.get()
        },
        || {
            format!(
                "Collector {} samples, Parca {}\n{}",
                at_collector.get(),
                at_parca.get(),
                stopped.log
            )
        },
    );
    eprintln!(
        "the Collector and Parca hold {} samples of the workload each",
        at_collector.get()
    );
}

#[test]
fn pyroscope_reads_otlp_profiles_at_its_release_and_refuses_the_other() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = PyroscopeServer::start(&dir.path().join("pyroscope"), false);
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid().to_string();
    let start = SystemTime::now();
    let common = ["--pid", &pid, "--profiling-duration", "3s"];
    let agent = |name: &str, protocol: &str, version: &str| {
        Agent::start(
            &dir.path().join(format!("{name}.log")),
            &[
                &[
                    "--otlp-endpoint",
                    &server.url(),
                    "--otlp-protocol",
                    protocol,
                    "--otlp-profiles-version",
                    version,
                ][..],
                &common,
            ]
            .concat(),
            &[],
        )
    };
    let http = agent("http", "http", "1.9");
    let grpc = agent("grpc", "grpc", "1.9");
    let newer = agent("newer", "http", "1.10");
    let held = RefCell::new(Vec::new());
    wait_for(
        "300 samples of the chain in Pyroscope",
        Duration::from_secs(120),
        || {
            http.assert_running();
            std::thread::sleep(Duration::from_millis(500));
            *held.borrow_mut() = server
                .merged(
                    None,
                    CPU_TYPE,
                    "{service_name=\"chain\"}",
                    start - MINUTE,
                    SystemTime::now() + MINUTE,
                )
                .map(|profile| all_stacks(&profile))
                .unwrap_or_default();
            chain_share(&held.borrow(), &CHAIN).1 >= 300
                && metric(newer.http_address(), REJECTED).unwrap_or(0.0) >= 2.0
        },
        || {
            format!(
                "{}\n{}\n{}\n{}",
                describe(&held.borrow()),
                http.log(),
                newer.log(),
                server.log()
            )
        },
    );
    let (share, total) = chain_share(&held.borrow(), &CHAIN);
    assert!(
        share >= 0.9,
        "{share:.2} of {total}: {}",
        describe(&held.borrow())
    );
    let end = SystemTime::now() + MINUTE;
    let services = server.label_values(None, "service_name", start - MINUTE, end);
    assert!(services.iter().any(|s| s == "chain"), "{services:?}");
    for agent in [http, grpc] {
        let stopped = agent.stop();
        assert!(stopped.status.success(), "firn failed:\n{}", stopped.log);
        assert!(!stopped.log.contains("level=error"), "{}", stopped.log);
        assert!(
            log_field(&stopped.log, "firn agent stopped", "remote_profiles_sent").unwrap_or(0) > 0,
            "{}",
            stopped.log
        );
    }
    // The other release's samples lose their values there: refused, said
    // once with the flag to check, never retried.
    let stopped = newer.stop();
    assert_refused_once(&stopped.log, "--otlp-profiles-version");
}

/// One error line for a receiver that refuses every export, naming what
/// to check; every refusal counted, none retried.
fn assert_refused_once(log: &str, hint: &str) {
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("the server rejected the profiles"))
        .collect();
    assert_eq!(lines.len(), 1, "one line for repeated refusals:\n{log}");
    assert!(lines[0].contains(hint), "{}", lines[0]);
    assert!(
        log_field(log, "firn agent stopped", "remote_profiles_rejected").unwrap_or(0) >= 2,
        "{log}"
    );
    assert_eq!(
        log_field(log, "firn agent stopped", "remote_send_retries"),
        Some(0),
        "no retries:\n{log}"
    );
}

#[test]
fn refusing_receivers_are_told_once_counted_and_not_retried() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(&dir.path().join("otelcol"), Some("right-token"));
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid();
    let common = [
        "--pid",
        &pid.to_string(),
        "--profiling-duration",
        "2s",
        "--node",
        "firn-otlp-node",
    ];
    let agent = |name: &str, args: &[&str], env: &[(&str, &str)]| {
        Agent::start(
            &dir.path().join(format!("{name}.log")),
            &[args, &common].concat(),
            env,
        )
    };
    let grpc = collector.grpc_endpoint();
    let right = agent(
        "right",
        &["--otlp-endpoint", &grpc],
        &[("OTLP_BEARER_TOKEN", "right-token")],
    );
    let wrong = agent(
        "wrong",
        &["--otlp-endpoint", &grpc],
        &[("OTLP_BEARER_TOKEN", "wrong-token")],
    );
    let nowhere = format!("{}/nowhere", collector.http_endpoint());
    let missing = agent(
        "missing",
        &["--otlp-endpoint", &nowhere, "--otlp-protocol", "http"],
        &[],
    );
    wait_for(
        "three refused exports each, and profiles through the right token",
        Duration::from_secs(60),
        || {
            right.assert_running();
            std::thread::sleep(Duration::from_millis(300));
            [&wrong, &missing]
                .iter()
                .all(|agent| metric(agent.http_address(), REJECTED).unwrap_or(0.0) >= 3.0)
                && chain_samples(&of_pid(&collector, "grpc", pid)) >= 50
        },
        || format!("{}\n{}\n{}", wrong.log(), missing.log(), collector.log()),
    );
    let wrong = wrong.stop();
    assert_refused_once(&wrong.log, "--otlp-bearer-token");
    assert!(wrong.log.contains("Unauthenticated"), "{}", wrong.log);
    assert!(
        !wrong.log.contains("wrong-token"),
        "the token stays out of the log"
    );
    let missing = missing.stop();
    assert_refused_once(&missing.log, "--otlp-endpoint");
    assert!(missing.log.contains("HTTP 404"), "{}", missing.log);
    let right = right.stop();
    assert!(!right.log.contains("level=error"), "{}", right.log);
}

#[test]
fn tls_is_checked_against_the_given_ca() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let authority = Authority::new(dir.path(), "otlp-ca");
    let (cert, key) = authority.server_files(dir.path());
    let collector = Collector::start_tls(&dir.path().join("otelcol"), &cert, &key);
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid();
    let ca = authority.pem_path.to_str().expect("utf-8");
    let grpc = format!("https://127.0.0.1:{}", collector.grpc_port);
    let http = format!("https://127.0.0.1:{}", collector.http_port);
    let common = ["--pid", &pid.to_string(), "--profiling-duration", "2s"];
    let agent = |name: &str, args: &[&str]| {
        Agent::start(
            &dir.path().join(format!("{name}.log")),
            &[args, &common].concat(),
            &[],
        )
    };
    let trusted_grpc = agent("grpc", &["--otlp-endpoint", &grpc, "--otlp-ca-file", ca]);
    let trusted_http = agent(
        "http",
        &[
            "--otlp-endpoint",
            &http,
            "--otlp-protocol",
            "http",
            "--otlp-ca-file",
            ca,
        ],
    );
    let untrusted = agent("untrusted", &["--otlp-endpoint", &grpc]);
    wait_for(
        "profiles through TLS by both protocols, and the unknown CA refused",
        Duration::from_secs(60),
        || {
            trusted_grpc.assert_running();
            std::thread::sleep(Duration::from_millis(300));
            chain_samples(&of_pid(&collector, "grpc", pid)) >= 50
                && chain_samples(&of_pid(&collector, "http", pid)) >= 50
                && untrusted.log().contains("UnknownIssuer")
        },
        || {
            format!(
                "{}\n{}\n{}",
                trusted_http.log(),
                untrusted.log(),
                collector.log()
            )
        },
    );
    for agent in [trusted_grpc, trusted_http] {
        let stopped = agent.stop();
        assert!(!stopped.log.contains("level=error"), "{}", stopped.log);
    }
    let untrusted = untrusted.stop();
    assert_eq!(
        log_field(&untrusted.log, "firn agent stopped", "remote_profiles_sent"),
        Some(0),
        "nothing sent to a server whose certificate is not trusted:\n{}",
        untrusted.log
    );
}
