//! End to end: the agent under faults, short versions of `cargo xtask
//! soak`. A real Parca server SIGKILLed and restarted (delivery resumes), a
//! server that accepts and never answers (firn keeps sampling, counts what
//! it drops, exits within 10 s of SIGTERM), a local store on a full tmpfs
//! (failed writes counted, writing resumes once there is space). Every wait
//! polls `/metrics` with a deadline.

mod common;
mod parca_support;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use common::*;
use parca_support::harness::{CPU_PROFILE_TYPE, ParcaServer, free_port};

/// The deadline from SIGTERM to exit.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// The firn agent with `/metrics` on a port of its own; killed on drop.
struct Firn {
    child: Option<Child>,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Firn {
    fn start(dir: &Path, args: &[&str]) -> Self {
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let log = dir.join("firn.log");
        let child = firn()
            .arg("--http-address")
            .arg(metrics.to_string())
            .args(args)
            .env_remove("NODE_NAME")
            .env_remove("PARCA_BEARER_TOKEN")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("the firn agent starts");
        let firn = Self {
            child: Some(child),
            metrics,
            log,
        };
        firn.wait_until("/ready answers 200", Duration::from_secs(60), || {
            matches!(get(metrics, "/ready"), Some((200, _)))
        });
        firn
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sum of the series of `/metrics` named `series` exactly (with
    /// its labels, `name{label="value"}`), or of every series of a family
    /// when `series` has no labels.
    fn metric(&self, series: &str) -> f64 {
        let Some((200, text)) = get(self.metrics, "/metrics") else {
            return f64::NAN;
        };
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' '))
            .filter(|(name, _)| {
                *name == series
                    || (!series.contains('{')
                        && name
                            .strip_prefix(series)
                            .is_some_and(|l| l.starts_with('{')))
            })
            .filter_map(|(_, value)| value.parse::<f64>().ok())
            .sum()
    }

    /// Polls `ready` every 200 ms; fails the test with firn's log when it
    /// is not true by `timeout`, or when firn exits.
    fn wait_until(&self, what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return;
            }
            // A zombie: firn exited (Drop reaps it).
            let exited = self.child.as_ref().is_some_and(|child| {
                std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
                    .ok()
                    .and_then(|stat| Some(stat.rsplit_once(')')?.1.trim_start().starts_with('Z')))
                    .unwrap_or(true)
            });
            assert!(
                !exited,
                "firn exited while waiting for {what}:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}:\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether firn keeps handling samples: `firn_samples_total` grows
    /// within 10 s.
    fn assert_sampling(&self) {
        let before = self.metric("firn_samples_total");
        self.wait_until("more samples handled", Duration::from_secs(10), || {
            self.metric("firn_samples_total") > before
        });
    }

    /// SIGTERM; asserts a clean exit within [`EXIT_DEADLINE`].
    fn terminate(mut self) {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let sent = Instant::now();
        let status: Option<ExitStatus> = loop {
            if let Some(status) = child.try_wait().expect("waits") {
                break Some(status);
            }
            if sent.elapsed() > EXIT_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(20));
        };
        let log = self.log();
        let status = status.unwrap_or_else(|| {
            panic!("firn did not exit within {EXIT_DEADLINE:?} of SIGTERM:\n{log}")
        });
        assert!(status.success(), "firn failed ({status}):\n{log}");
    }
}

impl Drop for Firn {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A GET over plain HTTP/1.1 with short deadlines: status and body.
fn get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    Some((status, response.split_once("\r\n\r\n")?.1.to_owned()))
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

/// A tmpfs of `bytes` at `dir`, lazily unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Self {
        std::fs::create_dir_all(dir).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "firn-test"])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(status.success(), "could not mount a tmpfs at {dir:?}");
        Self(dir.to_path_buf())
    }

    /// Writes `name` until no space is left.
    fn fill(&self, name: &str) {
        let mut file = std::fs::File::create(self.0.join(name)).expect("filler");
        let block = [0u8; 4096];
        loop {
            match file.write(&block) {
                Ok(0) => return,
                Ok(_) => {}
                Err(error) => {
                    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
                    return;
                }
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
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
    let firn = Firn::start(
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
        firn.metric("firn_profiles_sent_total") >= 1.0
    });

    // SIGKILL: no goodbye on the connection.
    drop(parca);
    let failures = firn.metric("firn_push_failures_total");
    firn.wait_until(
        "a failed push to the killed server",
        Duration::from_secs(30),
        || firn.metric("firn_push_failures_total") > failures,
    );
    firn.assert_sampling();
    let sent = firn.metric("firn_profiles_sent_total");

    let restarted = ParcaServer::start(&dir.path().join("parca"), port);
    firn.wait_until(
        "profiles sent to the restarted server",
        Duration::from_secs(45),
        || firn.metric("firn_profiles_sent_total") > sent,
    );
    // The new server process holds profiles: they came after the restart.
    let mut query = restarted.query();
    firn.wait_until(
        "the restarted Parca lists firn's profile type",
        Duration::from_secs(20),
        || query.profile_types().iter().any(|t| t == CPU_PROFILE_TYPE),
    );
    assert_eq!(
        firn.metric("firn_profiles_dropped_total{reason=\"rejected\"}"),
        0.0,
        "{}",
        firn.log()
    );
    firn.terminate();
}

#[test]
fn a_server_that_never_answers_costs_drops_not_sampling_or_exit() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hole = Blackhole::start();
    let _workload = start_chain(dir.path(), &FP_FLAGS);
    let firn = Firn::start(
        dir.path(),
        &[
            "--remote-store-address",
            &hole.address.to_string(),
            "--remote-store-insecure",
            "--profiling-duration",
            "1s",
            "--remote-store-rpc-unary-timeout",
            "2s",
            "--remote-store-queue-bytes",
            "16KiB",
        ],
    );
    firn.wait_until("profiles queued", Duration::from_secs(30), || {
        firn.metric("firn_profiles_written_total") >= 3.0
    });
    firn.wait_until(
        "profiles dropped from the full queue, counted",
        Duration::from_secs(40),
        || firn.metric("firn_profiles_dropped_total{reason=\"queue\"}") >= 1.0,
    );
    let queued = firn.metric("firn_queue_bytes");
    assert!(
        queued <= 16.0 * 1024.0,
        "queue bytes {queued} with a 16 KiB queue:\n{}",
        firn.log()
    );
    firn.assert_sampling();
    assert_eq!(firn.metric("firn_profiles_sent_total"), 0.0);
    // The push in flight to the silent server does not hold up the exit.
    firn.terminate();
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
    let firn = Firn::start(
        dir.path(),
        &[
            "--local-store-directory",
            store.0.to_str().expect("utf-8"),
            "--profiling-duration",
            "1s",
        ],
    );
    firn.wait_until(
        "failed writes counted as dropped profiles",
        Duration::from_secs(30),
        || firn.metric("firn_profiles_dropped_total{reason=\"pipeline\"}") >= 2.0,
    );
    firn.assert_sampling();
    assert_eq!(firn.metric("firn_profiles_written_total"), 0.0);

    std::fs::remove_file(store.0.join("filler")).expect("filler removed");
    firn.wait_until(
        "profiles written once there is space",
        Duration::from_secs(30),
        || firn.metric("firn_profiles_written_total") >= 1.0,
    );
    let profiles = std::fs::read_dir(&store.0)
        .expect("store")
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".pb.gz"))
        .count();
    assert!(profiles >= 1, "no profile in the store:\n{}", firn.log());
    firn.terminate();
}
