//! End to end: the real `firn` agent pushing to a real Pyroscope server
//! (v1.19.3, built from source by `cargo xtask setup`), alone, behind a
//! basic auth proxy, with multitenancy, and beside a real Parca server;
//! read back through Pyroscope's own query API and checked by function
//! names in stack order.

mod common;
mod parca_support;
mod pyroscope_support;

use std::{
    cell::{Cell, RefCell},
    time::{Duration, Instant, SystemTime},
};

use agent_pprof::Reader;
use common::*;
use parca_support::harness::{ParcaServer, all_stacks};
use parca_support::tls_server::Authority;
use pyroscope_support::{AuthProxy, CPU_TYPE, PyroscopeServer, SAMPLES_TYPE};

const MINUTE: Duration = Duration::from_secs(60);

/// Samples of the workload's whole chain Pyroscope holds for `tenant`.
fn chain_samples(
    server: &PyroscopeServer,
    tenant: Option<&str>,
    pid: u32,
    since: SystemTime,
) -> (i64, Vec<(Vec<String>, i64)>) {
    let Ok(profile) = server.merged(
        tenant,
        SAMPLES_TYPE,
        &format!("{{pid=\"{pid}\"}}"),
        since - MINUTE,
        SystemTime::now() + MINUTE,
    ) else {
        return (0, Vec::new());
    };
    let stacks: Vec<(Vec<String>, i64)> = Reader::new(&profile)
        .samples()
        .map(|sample| (sample.function_names(), sample.count()))
        .collect();
    let complete = stacks
        .iter()
        .filter(|(names, _)| holds_chain(names, &CHAIN))
        .map(|(_, count)| count)
        .sum();
    (complete, stacks)
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story: workload, agent, server, then the chain, types, services and tenants Pyroscope answers with"
)]
fn profiles_reach_a_real_pyroscope_server_with_the_chain_service_and_tenant() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = PyroscopeServer::start(&dir.path().join("pyroscope"), true);
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let start = SystemTime::now();
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--pyroscope-url",
            &server.url(),
            "--pyroscope-tenant-id",
            "team-firn",
            "--profiling-duration",
            "5s",
            "--node",
            "firn-e2e-node",
        ],
        &[],
    );
    let pid = workload.pid();
    let tenant = Some("team-firn");
    let held = RefCell::new((0, Vec::new()));
    wait_for(
        "300 samples of the workload's chain in Pyroscope",
        Duration::from_secs(120),
        || {
            agent.assert_running();
            *held.borrow_mut() = chain_samples(&server, tenant, pid, start);
            std::thread::sleep(Duration::from_millis(500));
            held.borrow().0 >= 300
        },
        || {
            format!(
                "{} samples held\n{}\n{}",
                held.borrow().0,
                agent.log(),
                server.log()
            )
        },
    );
    let held = held.into_inner();
    let (share, total) = chain_share(&held.1, &CHAIN);
    assert!(
        share >= 0.9,
        "{share:.2} of {total} samples hold main > level_one > level_two > level_three > burn_leaf:\n{}",
        describe(&held.1)
    );
    let end = SystemTime::now() + MINUTE;
    let types = server.profile_types(tenant, start - MINUTE, end);
    for wanted in [CPU_TYPE, SAMPLES_TYPE] {
        assert!(types.iter().any(|t| t == wanted), "{wanted} in {types:?}");
    }
    let services = server.label_values(tenant, "service_name", start - MINUTE, end);
    assert!(
        services.iter().any(|s| s == "chain"),
        "the workload's service is its executable's name: {services:?}"
    );
    let nodes = server.label_values(tenant, "node", start - MINUTE, end);
    assert_eq!(nodes, ["firn-e2e-node"]);
    // The CPU time type holds the same stacks, weighted by the period.
    let cpu = server
        .merged(
            tenant,
            CPU_TYPE,
            &format!("{{service_name=\"chain\",pid=\"{pid}\"}}"),
            start - MINUTE,
            end,
        )
        .expect("the cpu type answers");
    let cpu_stacks = all_stacks(&cpu);
    assert!(
        chain_share(&cpu_stacks, &CHAIN).0 >= 0.9,
        "{}",
        describe(&cpu_stacks)
    );
    // Another tenant sees none of it.
    let others = server.label_values(Some("someone-else"), "service_name", start - MINUTE, end);
    assert!(others.is_empty(), "tenants are apart: {others:?}");
    let stopped = agent.stop();
    assert!(stopped.status.success(), "firn failed:\n{}", stopped.log);
    assert!(
        !stopped.log.contains("level=error"),
        "no errors:\n{}",
        stopped.log
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "three agents against one server and proxy: right credentials, wrong ones, no tenant, then their logs"
)]
fn credentials_and_the_tenant_are_checked_and_never_logged() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = PyroscopeServer::start(&dir.path().join("pyroscope"), true);
    let proxy = AuthProxy::start(server.port, "stack-123", "right-horse-battery", None);
    let url = format!("http://127.0.0.1:{}", proxy.port);
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let start = SystemTime::now();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "right-horse-battery\n").expect("password file");
    let common = [
        "--profiling-duration",
        "3s",
        "--pid",
        &workload.pid().to_string(),
    ];
    let right = Agent::start(
        &dir.path().join("right.log"),
        &[
            &["--pyroscope-url", &url, "--pyroscope-tenant-id", "team-a"][..],
            &[
                "--pyroscope-basic-auth-username",
                "stack-123",
                "--pyroscope-basic-auth-password-file",
                password_file.to_str().expect("utf-8"),
            ],
            &common,
        ]
        .concat(),
        &[],
    );
    let wrong = Agent::start(
        &dir.path().join("wrong.log"),
        &[
            &["--pyroscope-url", &url, "--pyroscope-tenant-id", "team-a"][..],
            &common,
        ]
        .concat(),
        &[
            ("PYROSCOPE_BASIC_AUTH_USERNAME", "stack-123"),
            ("PYROSCOPE_BASIC_AUTH_PASSWORD", "wrong-horse-staple"),
        ],
    );
    let no_tenant = Agent::start(
        &dir.path().join("no-tenant.log"),
        &[
            "--pyroscope-url",
            &server.url(),
            "--profiling-duration",
            "3s",
            "--pid",
            &workload.pid().to_string(),
        ],
        &[],
    );
    let held = Cell::new(0);
    wait_for(
        "the chain through the proxy, for tenant team-a",
        Duration::from_secs(120),
        || {
            right.assert_running();
            held.set(chain_samples(&server, Some("team-a"), workload.pid(), start).0);
            std::thread::sleep(Duration::from_millis(500));
            held.get() >= 100
        },
        || format!("{} samples\n{}", held.get(), right.log()),
    );
    assert!(proxy.passed.load(std::sync::atomic::Ordering::Relaxed) > 0);
    let rejected = |agent: &Agent| {
        metric(
            agent.http_address(),
            "firn_destination_profiles_rejected_total{destination=\"pyroscope\"}",
        )
        .unwrap_or(0.0)
    };
    wrong.wait_until(
        "the wrong password refused",
        Duration::from_secs(60),
        || rejected(&wrong) > 0.0,
    );
    no_tenant.wait_until(
        "a push without a tenant refused",
        Duration::from_secs(60),
        || rejected(&no_tenant) > 0.0,
    );
    assert_eq!(
        rejected(&right),
        0.0,
        "the right credentials are never refused"
    );
    assert!(proxy.refused.load(std::sync::atomic::Ordering::Relaxed) > 0);
    let wrong_log = wrong.stop().log;
    let refusal = wrong_log
        .lines()
        .find(|line| line.contains("the server rejected the profiles"))
        .unwrap_or_else(|| panic!("a refusal line:\n{wrong_log}"));
    assert!(
        refusal.contains("Unauthenticated") && refusal.contains("HTTP 401"),
        "{refusal}"
    );
    assert!(
        refusal.contains("--pyroscope-basic-auth-username"),
        "the line names the flags: {refusal}"
    );
    let no_tenant_log = no_tenant.stop().log;
    let refusal = no_tenant_log
        .lines()
        .find(|line| line.contains("the server rejected the profiles"))
        .unwrap_or_else(|| panic!("a refusal line:\n{no_tenant_log}"));
    assert!(
        refusal.contains("Unauthenticated") && refusal.contains("--pyroscope-tenant-id"),
        "{refusal}"
    );
    let right_log = right.stop().log;
    for (log, secret) in [
        (&wrong_log, "wrong-horse-staple"),
        (&right_log, "right-horse-battery"),
    ] {
        assert!(!log.contains(secret), "a password in the log:\n{log}");
        use base64::Engine as _;
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("stack-123:{secret}"));
        assert!(
            !log.contains(&encoded),
            "the encoded credentials in the log:\n{log}"
        );
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one agent, two real servers, then the same samples read back from each"
)]
fn parca_and_pyroscope_get_the_same_samples() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let pyroscope = PyroscopeServer::start(&dir.path().join("pyroscope"), false);
    let parca = ParcaServer::start(&dir.path().join("parca"), pyroscope_support::free_port());
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid();
    let start = SystemTime::now();
    let both = Agent::start(
        &dir.path().join("both.log"),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--pyroscope-url",
            &pyroscope.url(),
            "--profiling-duration",
            "4s",
            "--pid",
            &pid.to_string(),
        ],
        &[],
    );
    let mut query = parca.query();
    let in_parca = Cell::new(0);
    let in_pyroscope = Cell::new(0);
    wait_for(
        "the chain in both servers",
        Duration::from_secs(120),
        || {
            both.assert_running();
            in_pyroscope.set(chain_samples(&pyroscope, None, pid, start).0);
            in_parca.set(
                query
                    .try_merged(
                        &format!("{{pid=\"{pid}\"}}"),
                        start - MINUTE,
                        SystemTime::now() + MINUTE,
                    )
                    .map_or(0, |profile| {
                        let stacks = all_stacks(&profile);
                        stacks
                            .iter()
                            .filter(|(n, _)| holds_chain(n, &CHAIN))
                            .map(|(_, c)| c)
                            .sum()
                    }),
            );
            std::thread::sleep(Duration::from_millis(500));
            in_parca.get() >= 200 && in_pyroscope.get() >= 200
        },
        || {
            format!(
                "parca {}, pyroscope {}\n{}",
                in_parca.get(),
                in_pyroscope.get(),
                both.log()
            )
        },
    );
    let stopped = both.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
    // Every interval went to both: once both have taken in what was
    // flushed at shutdown, they hold the same samples of the workload.
    let totals = Cell::new((0, 0));
    wait_for(
        "the same samples in both servers",
        Duration::from_secs(60),
        || {
            let end = SystemTime::now() + MINUTE;
            let parca_total = query
                .try_merged(&format!("{{pid=\"{pid}\"}}"), start - MINUTE, end)
                .map_or(0, |profile| {
                    all_stacks(&profile).iter().map(|(_, c)| c).sum()
                });
            let pyroscope_total = chain_samples(&pyroscope, None, pid, start)
                .1
                .iter()
                .map(|(_, c)| c)
                .sum();
            totals.set((parca_total, pyroscope_total));
            std::thread::sleep(Duration::from_millis(500));
            parca_total > 0 && parca_total == pyroscope_total
        },
        || format!("parca {:?} vs pyroscope\n{}", totals.get(), stopped.log),
    );
}

#[test]
fn a_destination_that_hangs_holds_back_no_other() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let pyroscope = PyroscopeServer::start(&dir.path().join("pyroscope"), false);
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid();
    // Parca answers nothing: a listener that accepts and never replies.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("silent port");
    let silent_address = silent.local_addr().expect("bound").to_string();
    let since = SystemTime::now();
    let began = Instant::now();
    // This time as the config file lists them, each with its name.
    let config = dir.path().join("firn.yaml");
    std::fs::write(
        &config,
        format!(
            "destinations:\n\
             - name: parca-silent\n  remote-store-address: {silent_address}\n  remote-store-insecure: true\n  remote-store-rpc-unary-timeout: 60s\n\
             - name: pyroscope-main\n  pyroscope-url: {}\n",
            pyroscope.url()
        ),
    )
    .expect("config file");
    let stuck = Agent::start(
        &dir.path().join("stuck.log"),
        &[
            "--config-path",
            config.to_str().expect("utf-8"),
            "--profiling-duration",
            "3s",
            "--pid",
            &pid.to_string(),
        ],
        &[],
    );
    let first = chain_samples(&pyroscope, None, pid, since).0;
    let now_held = Cell::new(first);
    wait_for(
        "new samples in Pyroscope while Parca hangs",
        Duration::from_secs(45),
        || {
            stuck.assert_running();
            now_held.set(chain_samples(&pyroscope, None, pid, since).0);
            std::thread::sleep(Duration::from_millis(300));
            now_held.get() >= first + 150
        },
        || format!("{first} -> {}\n{}", now_held.get(), stuck.log()),
    );
    let waited = began.elapsed();
    let address = stuck.http_address();
    let value = |name: &str| metric(address, name).unwrap_or(-1.0);
    assert!(value("firn_destination_profiles_sent_total{destination=\"pyroscope-main\"}") > 0.0);
    assert_eq!(
        value("firn_destination_profiles_sent_total{destination=\"parca-silent\"}"),
        0.0
    );
    assert!(
        value("firn_destination_queue_profiles{destination=\"parca-silent\"}") > 0.0,
        "Parca's profiles wait in its own queue"
    );
    assert!(
        waited < Duration::from_secs(45),
        "Pyroscope got its profiles in {waited:?} while every push to Parca hangs for 60 s"
    );
    drop(silent);
    let stopped = stuck.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
}

#[test]
fn https_is_the_default_and_the_server_certificate_is_checked() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = PyroscopeServer::start(&dir.path().join("pyroscope"), false);
    let authority = Authority::new(dir.path(), "gateway-ca");
    let proxy = AuthProxy::start(
        server.port,
        "stack-9",
        "tls-secret",
        Some(std::sync::Arc::new(authority.https_config())),
    );
    // No scheme: https:// is assumed.
    let address = format!("127.0.0.1:{}", proxy.port);
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid().to_string();
    let start = SystemTime::now();
    let common = [
        "--pyroscope-url",
        &address,
        "--pyroscope-basic-auth-username",
        "stack-9",
        "--profiling-duration",
        "3s",
        "--pid",
        &pid,
    ];
    let password = [("PYROSCOPE_BASIC_AUTH_PASSWORD", "tls-secret")];
    let trusted = Agent::start(
        &dir.path().join("trusted.log"),
        &[
            &common[..],
            &[
                "--pyroscope-ca-file",
                authority.pem_path.to_str().expect("utf-8"),
            ],
        ]
        .concat(),
        &password,
    );
    let untrusted = Agent::start(&dir.path().join("untrusted.log"), &common, &password);
    let held = Cell::new(0);
    wait_for(
        "the chain over TLS",
        Duration::from_secs(120),
        || {
            trusted.assert_running();
            held.set(chain_samples(&server, None, workload.pid(), start).0);
            std::thread::sleep(Duration::from_millis(500));
            held.get() >= 100
        },
        || format!("{} samples\n{}", held.get(), trusted.log()),
    );
    let failures = |agent: &Agent, name: &str| {
        metric(
            agent.http_address(),
            &format!("firn_destination_{name}{{destination=\"pyroscope\"}}"),
        )
        .unwrap_or(-1.0)
    };
    untrusted.wait_until("a refused certificate", MINUTE, || {
        failures(&untrusted, "push_failures_total") > 0.0
    });
    assert_eq!(failures(&untrusted, "profiles_sent_total"), 0.0);
    let log = untrusted.stop().log;
    assert!(
        log.contains("could not push profiles") && log.contains("UnknownIssuer"),
        "the log names the certificate problem:\n{log}"
    );
    let log = trusted.stop().log;
    assert!(!log.contains("tls-secret"), "{log}");
}
