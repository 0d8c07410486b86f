//! What the soak runs firn against: a real Parca server it can stop, kill
//! and restart, a server that accepts and never answers, a small tmpfs,
//! and the firn agent itself. Everything is stopped when dropped; every
//! wait has a deadline.

use std::{
    fs::{self, File},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::monitor;
use crate::util;

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Guard(pub Child);

impl Guard {
    pub fn spawn(command: &mut Command) -> Result<Self> {
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("could not start {}", util::describe(command)))?;
        Ok(Self(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Signals the child and waits at most `deadline` for it to exit.
    /// Returns its status and how long it took, or None (then killed).
    pub fn signal_and_wait(
        &mut self,
        signal: i32,
        deadline: Duration,
    ) -> (Option<ExitStatus>, Duration) {
        self.signal_and_wait_then(signal, deadline, || {})
    }

    /// As [`Guard::signal_and_wait`], calling `before_kill` when the
    /// deadline passed, before SIGKILL.
    pub fn signal_and_wait_then(
        &mut self,
        signal: i32,
        deadline: Duration,
        before_kill: impl FnOnce(),
    ) -> (Option<ExitStatus>, Duration) {
        // SAFETY: signalling our own child, which has not been reaped.
        unsafe { libc::kill(self.0.id() as i32, signal) };
        let sent = Instant::now();
        while sent.elapsed() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return (Some(status), sent.elapsed());
            }
            thread::sleep(Duration::from_millis(20));
        }
        before_kill();
        self.kill_and_reap(KILL_DEADLINE);
        (None, sent.elapsed())
    }

    /// SIGKILL, then waits at most `deadline`: a process blocked in the
    /// kernel (state D) dies only once that call returns. Returns whether
    /// it was reaped.
    pub fn kill_and_reap(&mut self, deadline: Duration) -> bool {
        let _ = self.0.kill();
        let sent = Instant::now();
        while sent.elapsed() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "soak: pid {} still not gone {deadline:?} after SIGKILL (blocked in the kernel); left behind",
            self.0.id()
        );
        false
    }

    pub fn exited(&mut self) -> bool {
        !matches!(self.0.try_wait(), Ok(None))
    }
}

/// How long a SIGKILLed child may take to go.
const KILL_DEADLINE: Duration = Duration::from_secs(30);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.kill_and_reap(KILL_DEADLINE);
        }
    }
}

/// Where the threads of `pid` sleep in the kernel (`/proc/PID/task/*/wchan`),
/// e.g. `d_alloc_parallel` behind a hung file system.
pub fn wait_channels(pid: u32) -> String {
    let mut channels: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|task| fs::read_to_string(task.path().join("wchan")).ok())
        .filter(|channel| !channel.is_empty() && channel != "0")
        .collect();
    channels.sort();
    channels.dedup();
    channels.join(", ")
}

/// A loopback port nothing listens on (yet).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("no free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// A Parca server on a loopback port, its FILESYSTEM bucket in `dir`
/// (kept across restarts).
pub struct Parca {
    child: Option<Guard>,
    dir: PathBuf,
    pub port: u16,
}

impl Parca {
    pub fn new(dir: &Path, port: u16) -> Result<Self> {
        fs::create_dir_all(dir.join("symbolizer-cache"))?;
        let config = dir.join("parca.yaml");
        fs::write(
            &config,
            format!(
                "object_storage:\n  bucket:\n    type: \"FILESYSTEM\"\n    config:\n      directory: \"{}\"\n",
                dir.join("data").display()
            ),
        )?;
        Ok(Self {
            child: None,
            dir: dir.to_path_buf(),
            port,
        })
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the server and waits (at most 60 s) until it listens.
    pub fn start(&mut self) -> Result<()> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("parca.log"))?;
        let mut child = Guard::spawn(
            Command::new(crate::setup::parca_path())
                .current_dir(&self.dir)
                .arg(format!(
                    "--config-path={}",
                    self.dir.join("parca.yaml").display()
                ))
                .arg(format!("--http-address=127.0.0.1:{}", self.port))
                .arg("--debuginfod-upstream-servers=")
                .arg("--debuginfod-http-request-timeout=1s")
                .arg(format!(
                    "--debuginfo-cache-dir={}",
                    self.dir.join("symbolizer-cache").display()
                ))
                .arg("--storage-active-memory=268435456")
                .stdout(Stdio::null())
                .stderr(log),
        )?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if child.exited() {
                bail!(
                    "the Parca server exited at start; see {}",
                    self.dir.join("parca.log").display()
                );
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("the Parca server did not listen within 60 s");
            }
            thread::sleep(Duration::from_millis(200));
        }
        self.child = Some(child);
        Ok(())
    }

    /// SIGTERM (at most 10 s, then SIGKILL).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.signal_and_wait(libc::SIGTERM, Duration::from_secs(10));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.signal_and_wait(libc::SIGKILL, Duration::from_secs(10));
        }
    }
}

/// A TCP server that accepts every connection and never answers.
pub struct Blackhole {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Blackhole {
    pub fn start(port: u16) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .with_context(|| format!("could not listen on port {port}"))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => held.push(stream),
                        Err(_) => thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
        };
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Closes the listener and every connection it held.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A tmpfs of `bytes` mounted at `dir`, unmounted when dropped.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(dir: &Path, bytes: u64) -> Result<Self> {
        fs::create_dir_all(dir)?;
        util::run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={bytes}"))
                .arg("firn-soak")
                .arg(dir),
        )?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Writes `name` until the file system has no space left.
    pub fn fill(&self, name: &str) -> Result<()> {
        use std::io::Write;
        let mut file = File::create(self.dir.join(name))?;
        let block = [0u8; 4096];
        loop {
            match file.write(&block) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => return Ok(()),
                Err(error) => return Err(error.into()),
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// The firn agent, its log in a file, `/metrics` on a port of its own.
pub struct Firn {
    child: Guard,
    pub metrics: SocketAddr,
    pub log: PathBuf,
    /// Seconds from the spawn to the first 200 from `/ready`.
    pub ready_seconds: f64,
}

/// How firn ended after SIGTERM.
pub struct Exit {
    pub status: Option<ExitStatus>,
    pub seconds: f64,
    /// Where firn's threads slept when SIGTERM went unanswered.
    pub wait_channels: String,
}

impl Exit {
    pub fn describe(&self) -> String {
        match self.status {
            Some(status) if status.success() => format!("exited in {:.1} s", self.seconds),
            Some(status) => format!("exited in {:.1} s ({status})", self.seconds),
            None => format!(
                "STALLED: still running {:.0} s after SIGTERM; SIGKILLed, gone (or given up on) \
                 {:.0} s after SIGTERM",
                EXIT_DEADLINE.as_secs_f64(),
                self.seconds
            ),
        }
    }
}

/// How long firn may take from SIGTERM to exit.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(10);

impl Firn {
    /// Starts firn and waits (at most 60 s) until `/ready` answers 200,
    /// asking every 10 ms.
    pub fn start(binary: &Path, dir: &Path, args: &[String]) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let log = dir.join("firn.log");
        let spawned = Instant::now();
        let mut child = Guard::spawn(
            Command::new(binary)
                .arg("--http-address")
                .arg(metrics.to_string())
                .args(args)
                .env("FIRN_LOG_LEVEL", "info")
                .env_remove("NODE_NAME")
                .env_remove("PARCA_BEARER_TOKEN")
                .stdout(Stdio::null())
                .stderr(File::create(&log)?),
        )?;
        let deadline = spawned + Duration::from_secs(60);
        loop {
            if child.exited() {
                bail!(
                    "firn exited at start:\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Some((200, _)) = monitor::get(metrics, "/ready") {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "firn was not ready within 60 s (its threads wait in: {}); see {}",
                    wait_channels(child.pid()),
                    log.display()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(Self {
            child,
            metrics,
            log,
            ready_seconds: spawned.elapsed().as_secs_f64(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn exited(&mut self) -> bool {
        self.child.exited()
    }

    /// SIGTERM; killed when still running after [`EXIT_DEADLINE`].
    pub fn terminate(mut self) -> Exit {
        let pid = self.pid();
        let mut channels = String::new();
        let (status, took) = self
            .child
            .signal_and_wait_then(libc::SIGTERM, EXIT_DEADLINE, || {
                channels = wait_channels(pid)
            });
        Exit {
            status,
            seconds: took.as_secs_f64(),
            wait_channels: channels,
        }
    }

    /// Paths of the files firn holds open.
    pub fn open_files(&self) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(format!("/proc/{}/fd", self.pid())) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|entry| fs::read_link(entry.path()).ok())
            .collect()
    }
}
