//! A Docker daemon of the test's own (Debian's docker.io, installed by
//! `cargo xtask setup`), on its own socket and directories, beside
//! whatever else runs on the machine.

// Each test file uses its own part of the support code.
#![allow(dead_code)]

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

const MINUTE: Duration = Duration::from_secs(60);

/// A Docker daemon of the test's own: its socket, state and (by default)
/// data under `dir`, no networking set up (`--bridge=none`, no iptables;
/// a container gets none or the host's). Its containers are removed and
/// it is stopped (by PID) when dropped.
pub struct Dockerd {
    child: Child,
    pub socket: PathBuf,
    exec_root: PathBuf,
    log: PathBuf,
    /// Removed (forcibly) when the daemon is dropped.
    pub containers: Vec<String>,
    /// Held while the daemon runs on a data root kept between runs.
    _data_root_lock: Option<File>,
}

impl Dockerd {
    /// A daemon whose images and build cache go when `dir` does.
    pub fn start(dir: &Path) -> Self {
        Self::spawn(dir, &dir.join("data"), None)
    }

    /// A daemon on `data_root`, kept between runs (its images and BuildKit
    /// cache with it). One daemon at a time uses it: this waits for a lock
    /// beside it, and dockerd's pid file there refuses a second daemon
    /// left over from a killed run.
    pub fn start_on(dir: &Path, data_root: &Path) -> Self {
        std::fs::create_dir_all(data_root).expect("dockerd data root");
        let lock_path = data_root.with_extension("lock");
        let lock = File::create(&lock_path)
            .unwrap_or_else(|error| panic!("{}: {error}", lock_path.display()));
        // SAFETY: flock on a descriptor this function owns.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(locked, 0, "could not lock {}", lock_path.display());
        Self::spawn(dir, data_root, Some(lock))
    }

    fn spawn(dir: &Path, data_root: &Path, lock: Option<File>) -> Self {
        std::fs::create_dir_all(dir).expect("dockerd directory");
        let socket = dir.join("docker.sock");
        let log = dir.join("dockerd.log");
        let pidfile = match lock {
            Some(_) => data_root.with_extension("pid"),
            None => dir.join("dockerd.pid"),
        };
        let child = Command::new("dockerd")
            .arg(format!("--data-root={}", data_root.display()))
            .arg(format!("--exec-root={}", dir.join("exec").display()))
            .arg(format!("--pidfile={}", pidfile.display()))
            .arg(format!("--host=unix://{}", socket.display()))
            .args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("dockerd log"))
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "dockerd is needed for the real container tests (Debian's docker.io, \
                     installed by `cargo xtask setup`): {error}"
                )
            });
        let mut daemon = Self {
            child,
            socket,
            exec_root: dir.join("exec"),
            log,
            containers: Vec::new(),
            _data_root_lock: lock,
        };
        let deadline = Instant::now() + MINUTE;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("dockerd exited ({status}):\n{}", daemon.log());
            }
            if daemon.docker(&["version"]).status.success() {
                return daemon;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("dockerd did not answer within a minute:\n{}", daemon.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The socket of the containerd this daemon started and runs its
    /// containers with.
    pub fn containerd_socket(&self) -> PathBuf {
        self.exec_root.join("containerd/containerd.sock")
    }

    /// The client, talking to this daemon; `docker build` with BuildKit.
    pub fn command(&self) -> Command {
        // Debian's client, matched to its daemon.
        let client = if Path::new("/usr/bin/docker").exists() {
            "/usr/bin/docker"
        } else {
            "docker"
        };
        let mut command = Command::new(client);
        command
            .env("DOCKER_HOST", format!("unix://{}", self.socket.display()))
            .env("DOCKER_BUILDKIT", "1");
        command
    }

    pub fn docker(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .output()
            .expect("the docker client runs")
    }

    pub fn docker_ok(&self, args: &[&str]) -> String {
        let output = self.docker(args);
        assert!(
            output.status.success(),
            "docker {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        for container in std::mem::take(&mut self.containers) {
            let _ = self.docker(&["rm", "-f", &container]);
        }
        // SIGTERM, so the daemon unmounts its layers before the directory
        // is removed; SIGKILL if it does not stop in time.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: a plain signal to the daemon this guard started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
