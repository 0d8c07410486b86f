//! End to end: the agent as a service. `/metrics` read by the Prometheus
//! client's own OpenMetrics parser, `/ready` watched from the first moment,
//! SIGTERM delivering the last profile (to a local store and to a real
//! Parca), the config file under the command line, bad config files.

mod common;
mod parca_support;

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant, SystemTime},
};

use agent_pprof::{self as pprof, Reader};
use common::*;
use parca_support::harness::{ParcaServer, all_stacks, free_port};

/// How long firn may take from SIGTERM to exit.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// The perf_event BPF links `pid` holds: one per CPU the sampler runs on.
fn perf_event_links(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .filter(|info| {
            info.lines().any(|line| {
                line.strip_prefix("link_type:")
                    .is_some_and(|kind| kind.trim().starts_with("perf"))
            })
        })
        .count()
}

/// One sample of a parsed exposition.
#[derive(Debug, serde::Deserialize)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

#[derive(Debug, serde::Deserialize)]
struct Family {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    samples: Vec<Sample>,
}

#[derive(Debug, serde::Deserialize)]
struct Scrape {
    content_type: String,
    families: Vec<Family>,
}

/// `/metrics` fetched by Python's HTTP client and parsed by the Prometheus
/// client library's OpenMetrics parser, which rejects malformed text.
fn scrape(address: SocketAddr) -> Scrape {
    const SCRIPT: &str = r#"
import json, sys, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
with urllib.request.urlopen(sys.argv[1], timeout=10) as response:
    content_type = response.headers.get("Content-Type")
    text = response.read().decode("utf-8")
families = [
    {"name": f.name, "type": f.type,
     "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples]}
    for f in text_string_to_metric_families(text)
]
print(json.dumps({"content_type": content_type, "families": families}))
"#;
    let output = Command::new(python_tool("python"))
        .args(["-c", SCRIPT, &format!("http://{address}/metrics")])
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "the OpenMetrics parser refused /metrics:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script's JSON")
}

fn value(scrape: &Scrape, sample: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .families
        .iter()
        .flat_map(|family| &family.samples)
        .find(|s| {
            s.name == sample
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one agent's start-up watched step by step: /ready refused or 503 until attached, then /metrics read as Prometheus would"
)]
fn metrics_parse_and_ready_turns_200_only_once_bpf_is_attached() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let _workload = start_chain(dir.path(), &FP_FLAGS);
    let address: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("address");
    let log = dir.path().join("firn.log");
    let store = dir.path().join("store");
    let agent = Agent::start(
        &log,
        &[
            "--http-address",
            &address.to_string(),
            "--profiling-duration",
            "2s",
            "--local-store-directory",
            store.to_str().expect("utf-8"),
        ],
        &[],
    );

    // Watch /ready from the start: refused (not listening yet) or 503
    // until the sampler is attached on every CPU, then 200.
    let mut before = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "/ready never turned 200");
        agent.assert_running();
        match get(address, "/ready") {
            Ok((200, _)) => break,
            Ok((status, body)) => before.push(format!("{status} {}", body.trim())),
            Err(error) => before.push(format!("{:?}", error.kind())),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let links = perf_event_links(agent.pid());
    let log_at_ready = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        links,
        online_cpus(),
        "at the first 200 the sampler is attached on every CPU"
    );
    assert!(
        log_at_ready.contains("firn agent started"),
        "ready before the start was logged:\n{log_at_ready}"
    );
    assert!(
        !before.is_empty(),
        "the first look at /ready came before firn listened"
    );
    for answer in &before {
        assert!(
            answer == "ConnectionRefused" || answer.starts_with("503 "),
            "before ready: {answer} (all: {before:?})"
        );
    }
    eprintln!(
        "/ready before 200: {} refused, {} x 503",
        before.iter().filter(|a| *a == "ConnectionRefused").count(),
        before.iter().filter(|a| a.starts_with("503")).count()
    );
    assert_eq!(get(address, "/healthy").expect("answers").0, 200);

    // Until the first interval is written (2 s, longer on a loaded
    // machine), then read the metrics as Prometheus would.
    wait_for(
        "the first profile",
        Duration::from_secs(60),
        || metric(address, "firn_profiles_written_total").is_some_and(|n| n >= 1.0),
        || agent.log(),
    );
    let scrape = scrape(address);
    assert!(
        scrape
            .content_type
            .starts_with("application/openmetrics-text"),
        "{}",
        scrape.content_type
    );
    let families: HashMap<&str, &str> = scrape
        .families
        .iter()
        .map(|f| (f.name.as_str(), f.kind.as_str()))
        .collect();
    for (family, kind) in [
        ("firn_samples", "counter"),
        ("firn_samples_lost", "counter"),
        ("firn_stacks_truncated", "counter"),
        ("firn_unwind_failures", "counter"),
        ("firn_symbolizer_cache_hits", "counter"),
        ("firn_symbolizer_cache_misses", "counter"),
        ("firn_symbolizer_cache_evictions", "counter"),
        ("firn_profiles_sent", "counter"),
        ("firn_profiles_dropped", "counter"),
        ("firn_push_duration_seconds", "histogram"),
        ("firn_queue_bytes", "gauge"),
        ("firn_processes_tracked", "gauge"),
        ("firn_bpf_samples_seen", "counter"),
        ("firn_build_info", "gauge"),
    ] {
        assert_eq!(
            families.get(family),
            Some(&kind),
            "{family} in {families:?}"
        );
    }
    let samples = value(&scrape, "firn_samples_total", &[]).unwrap_or(0.0);
    assert!(samples > 0.0, "no samples counted: {scrape:?}");
    let seen = value(&scrape, "firn_bpf_samples_seen_total", &[]).unwrap_or(0.0);
    assert!(
        seen >= samples,
        "the BPF side saw {seen}, firn handled {samples}"
    );
    assert!(value(&scrape, "firn_processes_tracked", &[]).unwrap_or(0.0) > 0.0);
    assert!(value(&scrape, "firn_profiles_written_total", &[]).unwrap_or(0.0) >= 1.0);
    for reason in [
        "ring_buffer_full",
        "scratch_unavailable",
        "max_stacks_per_profile",
    ] {
        assert!(
            value(&scrape, "firn_samples_lost_total", &[("reason", reason)]).is_some(),
            "firn_samples_lost_total{{reason=\"{reason}\"}}"
        );
    }
    // Root turns the kernel's BPF statistics on.
    assert!(value(&scrape, "firn_bpf_run_time_seconds_total", &[]).unwrap_or(0.0) > 0.0);
    // firn's own CPU time by stage: the drain ran, and so did the builder.
    for stage in ["sample", "symbolize", "encode"] {
        let seconds = value(&scrape, "firn_cpu_seconds_total", &[("stage", stage)]);
        assert!(
            seconds.is_some_and(|seconds| seconds > 0.0),
            "firn_cpu_seconds_total{{stage=\"{stage}\"}} = {seconds:?}"
        );
    }

    let Stopped { status, log, took } = agent.stop_with(libc::SIGTERM);
    assert!(status.success(), "exit status {status}:\n{log}");
    assert!(took < EXIT_DEADLINE, "took {took:?} to exit:\n{log}");
    assert!(
        get(address, "/ready").is_err(),
        "nothing listens after exit"
    );
}

#[test]
fn sigterm_writes_the_last_profile_and_the_config_file_sits_under_flags_and_env() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let store = dir.path().join("store");
    let config = dir.path().join("firn.yaml");
    // No interval ends in this run: the one profile is the last, partial
    // one written at SIGTERM.
    std::fs::write(
        &config,
        format!(
            "profiling-duration: 10m\nlocal-store-directory: {}\nfrequency: 49\n\
             node: from-file\nlog-format: json\nhttp-address: 127.0.0.1:0\n\
             metadata-external-labels: {{suite: service}}\n",
            store.display()
        ),
    )
    .expect("config file");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--config-path",
            config.to_str().expect("utf-8"),
            "--frequency",
            "99",
        ],
        &[("NODE_NAME", "from-env")],
    );
    // Enough of the workload's samples for the share below.
    agent.wait_for_samples(200.0);
    let Stopped { status, log, took } = agent.stop_with(libc::SIGTERM);
    assert!(status.success(), "exit status {status}:\n{log}");
    assert!(took < EXIT_DEADLINE, "took {took:?} to exit:\n{log}");

    // log-format from the file: every line is a JSON object.
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        lines.iter().any(|line| line["message"]
            == "shutting down: BPF detached, writing the last profile"
            && line["signal"] == "SIGTERM"),
        "{log}"
    );

    let files: Vec<_> = std::fs::read_dir(&store)
        .expect("the store of the config file")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "gz"))
        .collect();
    assert_eq!(files.len(), 1, "one profile, written at SIGTERM: {files:?}");
    let profile = pprof::decode(&std::fs::read(&files[0]).expect("readable")).expect("pprof");
    assert_eq!(
        profile.period,
        1_000_000_000 / 99,
        "--frequency on the command line wins over the file"
    );
    let stacks = stacks_of(&profile, workload.pid());
    let (share, total) = chain_share(&stacks, &CHAIN);
    assert!(
        total > 0 && share >= 0.85,
        "{total} samples, {:.0}% with the chain:\n{}",
        share * 100.0,
        describe(&stacks)
    );
    let reader = Reader::new(&profile);
    let sample = reader.samples().next().expect("samples");
    assert_eq!(
        sample.label("node"),
        Some("from-env"),
        "NODE_NAME wins over the file"
    );
    assert_eq!(sample.label("suite"), Some("service"));
}

#[test]
fn sigterm_delivers_the_last_profile_to_a_real_parca() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let parca = ParcaServer::start(&dir.path().join("parca"), free_port());
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let pid = workload.pid().to_string();
    let start = SystemTime::now() - Duration::from_secs(60);
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--profiling-duration",
            "10m",
            "--pid",
            &pid,
            "--node",
            "firn-sigterm",
            "--debuginfo-upload-disable",
        ],
        &[],
    );
    agent.wait_for_samples(200.0);
    let Stopped { status, log, took } = agent.stop_with(libc::SIGTERM);
    assert!(status.success(), "exit status {status}:\n{log}");
    assert!(took < EXIT_DEADLINE, "took {took:?} to exit:\n{log}");
    assert!(
        log.contains("remote_profiles_sent=1") && log.contains("remote_profiles_dropped=0"),
        "the one, partial profile was pushed before exit:\n{log}"
    );
    let mut query = parca.query();
    let profile = query.merged(
        "{node=\"firn-sigterm\"}",
        start,
        SystemTime::now() + Duration::from_secs(60),
    );
    let stacks = all_stacks(&profile);
    let (share, total) = chain_share(&stacks, &CHAIN);
    assert!(
        total > 0 && share >= 0.85,
        "Parca holds {total} samples, {:.0}% with the chain:\n{}\n{log}",
        share * 100.0,
        describe(&stacks)
    );
}

#[test]
fn bad_config_files_exit_2_naming_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("firn.yaml");
    let path = config.to_str().expect("utf-8");
    for (text, subcommand, wanted) in [
        (
            "frequency: 99\nno-such-flag: 1\n",
            None,
            &["line 2", "unknown key `no-such-flag`"][..],
        ),
        (
            "profiling_duration: 5s\n",
            None,
            &["`profiling_duration`", "did you mean `profiling-duration`"],
        ),
        (
            "frequency: [1, 2]\n",
            None,
            &["line 1", "`frequency`", "one value"],
        ),
        (
            "remote-store-insecure: 3\n",
            None,
            &["`remote-store-insecure`", "true or false"],
        ),
        ("frequency: 0\n", None, &["`frequency: 0`", "1..=10000"]),
        (
            "profiling-duration: soon\n",
            None,
            &["`profiling-duration: soon`", "duration"],
        ),
        ("frequency: [1\n", None, &["firn.yaml", "not valid"]),
        (
            "relabel_configs:\n  - action: dropp\n",
            None,
            &["relabel_configs[0]", "dropp"],
        ),
        (
            "duration: 0s\n",
            Some("record"),
            &["`duration: 0s`", "longer than zero"],
        ),
        (
            "profiling-duration: 5s\n",
            Some("record"),
            &["unknown key `profiling-duration`", "firn record --help"],
        ),
    ] {
        std::fs::write(&config, text).expect("config file");
        let output = firn()
            .args(subcommand)
            .args(["--config-path", path])
            .output()
            .expect("firn runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}\n{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        for part in wanted {
            assert!(
                stderr.contains(part),
                "`{part}` missing for {text:?}:\n{stderr}"
            );
        }
    }
    let output = firn()
        .args(["--config-path", "/nonexistent/firn.yaml"])
        .output()
        .expect("firn runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("could not read the config file /nonexistent/firn.yaml"),
        "{stderr}"
    );
}

#[test]
fn a_taken_http_address_stops_firn_at_start_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let address = taken.local_addr().expect("bound").to_string();
    let output = firn()
        .args(["--http-address", &address])
        .output()
        .expect("firn runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&address) && stderr.contains("--http-address"),
        "{stderr}"
    );
    let output = firn()
        .args(["--http-address", "localhost"])
        .output()
        .expect("firn runs");
    assert_eq!(
        output.status.code(),
        Some(2),
        "a malformed address is a usage error"
    );
}
