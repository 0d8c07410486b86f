//! End to end: the agent under faults, short versions of `cargo xtask
//! soak`. A real Parca server SIGKILLed and restarted (delivery resumes), a
//! server that accepts and never answers (firn keeps sampling, counts what
//! it drops, exits within 10 s of SIGTERM), a local store on a full tmpfs
//! (failed writes counted, writing resumes once there is space). Every wait
//! polls `/metrics` with a deadline.

mod common;
mod parca_support;

use std::{
    net::{SocketAddr, TcpListener},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use common::*;
use parca_support::harness::{CPU_PROFILE_TYPE, ParcaServer, free_port};

/// The agent with these arguments, once `/ready` answers 200; and where
/// its `/metrics` are.
fn start_agent(dir: &Path, args: &[&str]) -> (Agent, SocketAddr) {
    let agent = Agent::start(&dir.join("firn.log"), args, &[]);
    let address = agent.http_address();
    agent.wait_until("/ready answers 200", Duration::from_secs(60), || {
        matches!(get(address, "/ready"), Ok((200, _)))
    });
    (agent, address)
}

/// One series of `/metrics` (NaN while it cannot be read).
fn value(address: SocketAddr, series: &str) -> f64 {
    metric(address, series).unwrap_or(f64::NAN)
}

/// Whether the agent keeps handling samples: `firn_samples_total` grows
/// within 10 s.
fn assert_sampling(agent: &Agent, address: SocketAddr) {
    let before = value(address, "firn_samples_total");
    agent.wait_until("more samples handled", Duration::from_secs(10), || {
        value(address, "firn_samples_total") > before
    });
}

/// A TCP server that accepts every connection and never answers; closed
/// (with what it holds) when dropped.
struct Blackhole {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<usize>>,
}

impl Blackhole {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).expect("non-blocking");
        let address = listener.local_addr().expect("bound");
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => held.push(stream),
                        Err(_) => thread::sleep(Duration::from_millis(20)),
                    }
                }
                held.len()
            })
        };
        Self {
            address,
            stop,
            thread: Some(thread),
        }
    }

    /// Closes it; returns how many connections it accepted.
    fn close(&mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map_or(0, |thread| thread.join().unwrap_or(0))
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.close();
    }
}

#[test]
fn delivery_resumes_after_the_server_is_killed_and_restarted() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let parca = ParcaServer::start(&dir.path().join("parca"), port);
    let _workload = start_chain(dir.path(), &FP_FLAGS);
    let (firn, metrics) = start_agent(
        dir.path(),
        &[
            "--remote-store-address",
            &parca.address(),
            "--remote-store-insecure",
            "--profiling-duration",
            "1s",
        ],
    );
    firn.wait_until("profiles sent", Duration::from_secs(30), || {
        value(metrics, "firn_profiles_sent_total") >= 1.0
    });

    // SIGKILL: no goodbye on the connection.
    drop(parca);
    let failures = value(metrics, "firn_push_failures_total");
    firn.wait_until(
        "a failed push to the killed server",
        Duration::from_secs(30),
        || value(metrics, "firn_push_failures_total") > failures,
    );
    assert_sampling(&firn, metrics);
    let sent = value(metrics, "firn_profiles_sent_total");

    let restarted = ParcaServer::start(&dir.path().join("parca"), port);
    firn.wait_until(
        "profiles sent to the restarted server",
        Duration::from_secs(45),
        || value(metrics, "firn_profiles_sent_total") > sent,
    );
    // The new server process holds profiles: they came after the restart.
    let mut query = restarted.query();
    firn.wait_until(
        "the restarted Parca lists firn's profile type",
        Duration::from_secs(20),
        || query.profile_types().iter().any(|t| t == CPU_PROFILE_TYPE),
    );
    assert_eq!(
        value(metrics, "firn_profiles_dropped_total{reason=\"rejected\"}"),
        0.0,
        "{}",
        firn.log()
    );
    firn.terminate_cleanly();
}

#[test]
fn a_server_that_never_answers_costs_drops_not_sampling_or_exit() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hole = Blackhole::start();
    let _workload = start_chain(dir.path(), &FP_FLAGS);
    let (firn, metrics) = start_agent(
        dir.path(),
        &[
            "--remote-store-address",
            &hole.address.to_string(),
            "--remote-store-insecure",
            "--profiling-duration",
            "1s",
            "--remote-store-rpc-unary-timeout",
            "2s",
            // Room for a few of the host's one-second requests (tens of
            // KB each), so one is pushed (and hangs) while the next ones
            // fill the queue.
            "--remote-store-queue-bytes",
            "256KiB",
        ],
    );
    firn.wait_until("profiles queued", Duration::from_secs(30), || {
        value(metrics, "firn_profiles_written_total") >= 3.0
    });
    firn.wait_until(
        "profiles dropped from the full queue, counted",
        Duration::from_secs(40),
        || value(metrics, "firn_profiles_dropped_total{reason=\"queue\"}") >= 1.0,
    );
    let queued = value(metrics, "firn_queue_bytes");
    assert!(
        queued <= 256.0 * 1024.0,
        "queue bytes {queued} with a 256 KiB queue:\n{}",
        firn.log()
    );
    assert_sampling(&firn, metrics);
    assert_eq!(value(metrics, "firn_profiles_sent_total"), 0.0);
    // The push in flight to the silent server does not hold up the exit.
    firn.terminate_cleanly();
    assert!(hole.close() >= 1, "firn never connected to the server");
}

#[test]
fn a_full_local_store_counts_failed_writes_and_writes_again_once_there_is_space() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Tmpfs::mount(&dir.path().join("store"), 256 << 10);
    store.fill("filler");
    let _workload = start_chain(dir.path(), &FP_FLAGS);
    let (firn, metrics) = start_agent(
        dir.path(),
        &[
            "--local-store-directory",
            store.path().to_str().expect("utf-8"),
            "--profiling-duration",
            "1s",
        ],
    );
    firn.wait_until(
        "failed writes counted as dropped profiles",
        Duration::from_secs(30),
        || value(metrics, "firn_profiles_dropped_total{reason=\"pipeline\"}") >= 2.0,
    );
    assert_sampling(&firn, metrics);
    assert_eq!(value(metrics, "firn_profiles_written_total"), 0.0);

    std::fs::remove_file(store.path().join("filler")).expect("filler removed");
    firn.wait_until(
        "profiles written once there is space",
        Duration::from_secs(30),
        || value(metrics, "firn_profiles_written_total") >= 1.0,
    );
    let profiles = std::fs::read_dir(store.path())
        .expect("store")
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".pb.gz"))
        .count();
    assert!(profiles >= 1, "no profile in the store:\n{}", firn.log());
    firn.terminate_cleanly();
}
