//! firn started by a test: the agent, or `firn record`; each killed when
//! dropped, so a failed assertion leaves nothing running.

use super::*;

/// The longest an agent may take from SIGTERM to its exit (what
/// orchestrators allow before they kill it).
pub const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// A running `firn` agent, its log in a file (a pipe nobody reads could
/// fill and stall it). The one guard every test starts the agent through:
/// killed when dropped, so a failed assertion leaves no agent running.
/// Stop it with a signal and read the log with [`Agent::stop`].
pub struct Agent {
    // A cell so the polling closures can look at it while others read the log.
    child: std::cell::RefCell<Option<Child>>,
    log: PathBuf,
}

/// How an agent ended.
pub struct Stopped {
    pub status: ExitStatus,
    pub log: String,
    /// From the signal to the exit.
    pub took: Duration,
}

impl Agent {
    /// Starts `firn ARGS` with `env` (and without the caller's
    /// `PARCA_BEARER_TOKEN`, `PYROSCOPE_*` credentials and `NODE_NAME`), on a free port for /metrics
    /// unless `args` name one.
    pub fn start(log: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = firn();
        // Several agents run at once: each takes a free port for /metrics.
        if !args.iter().any(|arg| arg.starts_with("--http-address")) {
            command.arg("--http-address=127.0.0.1:0");
        }
        command
            .args(args)
            .env_remove("PARCA_BEARER_TOKEN")
            .env_remove("PYROSCOPE_BASIC_AUTH_USERNAME")
            .env_remove("PYROSCOPE_BASIC_AUTH_PASSWORD")
            .env_remove("PYROSCOPE_BEARER_TOKEN")
            .env_remove("NODE_NAME")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("agent log"));
        Self {
            child: Some(command.spawn().expect("the firn agent starts")).into(),
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.borrow().as_ref().expect("running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics (with the log) if the agent has exited.
    pub fn assert_running(&self) {
        let status = self
            .child
            .borrow_mut()
            .as_mut()
            .expect("running")
            .try_wait()
            .expect("waits");
        if let Some(status) = status {
            panic!("firn exited ({status}):\n{}", self.log());
        }
    }

    /// Waits until the log holds `text`, at most `timeout`.
    pub fn wait_for_log(&self, text: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log().contains(text) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Where /metrics is served, from the agent's log line saying so
    /// (waits for it, at most 60 s): logfmt or JSON.
    pub fn http_address(&self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.log();
            let address = log
                .lines()
                .find(|line| line.contains("serving /metrics"))
                .and_then(|line| {
                    let start = line
                        .find("address=")
                        .map(|at| at + "address=".len())
                        .or_else(|| line.find("\"address\":\"").map(|at| at + 11))?;
                    line[start..]
                        .split(|c: char| c == '"' || c.is_whitespace())
                        .next()?
                        .parse()
                        .ok()
                });
            if let Some(address) = address {
                return address;
            }
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "no /metrics address logged:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `/metrics` shows `firn_samples_total` of at least
    /// `samples`: the agent has attached and sampled (at most 60 s).
    pub fn wait_for_samples(&self, samples: f64) {
        let address = self.http_address();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.assert_running();
            if metric(address, "firn_samples_total").is_some_and(|seen| seen >= samples) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "fewer than {samples} samples after 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls `done` until it holds, failing (with the log) after
    /// `timeout` or as soon as the agent exits.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
        wait_for(
            what,
            timeout,
            || {
                self.assert_running();
                done()
            },
            || self.log(),
        );
    }

    /// SIGTERM: the agent must exit 0 within [`EXIT_DEADLINE`].
    pub fn terminate_cleanly(self) -> Stopped {
        let stopped = self.stop_with(libc::SIGTERM);
        assert!(
            stopped.status.success() && stopped.took < EXIT_DEADLINE,
            "{} after {:?}:\n{}",
            stopped.status,
            stopped.took,
            stopped.log
        );
        stopped
    }

    /// SIGINT, then waits (at most 30 s) for the agent to flush and exit.
    pub fn stop(self) -> Stopped {
        self.stop_with(libc::SIGINT)
    }

    /// `signal`, then waits (at most 30 s) for the agent to exit.
    pub fn stop_with(self, signal: i32) -> Stopped {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let sent = Instant::now();
        let Some(status) = wait_or_kill(&mut child, sent + Duration::from_secs(30)) else {
            panic!(
                "firn did not exit within 30 s of signal {signal}:\n{}",
                self.log()
            );
        };
        Stopped {
            status,
            took: sent.elapsed(),
            log: self.log(),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.get_mut().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `firn record` with `args`, asserting success; returns its output and
/// the decoded profile.
pub fn record(dir: &Path, args: &[&str]) -> (Output, Profile) {
    let output_path = dir.join("profile.pb.gz");
    let output = firn()
        .arg("record")
        .arg("--output")
        .arg(&output_path)
        .args(args)
        .output()
        .expect("firn runs");
    assert!(
        output.status.success(),
        "firn record failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let bytes = std::fs::read(&output_path).expect("firn wrote the profile");
    let profile = pprof::decode(&bytes).expect("the profile decodes as pprof");
    (output, profile)
}

/// Runs `firn record --pid PID ARGS` until process `pid` has spent `cpu` of
/// CPU time since firn began sampling, then ends it with SIGINT; returns
/// firn's log and the profile. A workload's samples then number about
/// `cpu` times the frequency however loaded the machine is, where a fixed
/// `--duration` gives a loaded machine's workload a fraction of them.
pub fn record_busy(dir: &Path, pid: u32, cpu: Duration, args: &[&str]) -> (String, Profile) {
    let pid_arg = pid.to_string();
    let mut all = vec!["--pid", pid_arg.as_str(), "--duration", "600s"];
    all.extend_from_slice(args);
    let mut recording = Recording::start(dir, &all);
    recording.wait_until_sampling();
    let before = cpu_time(pid).unwrap_or_else(|| panic!("process {pid} is gone"));
    wait_for_cpu_time(pid, before + cpu, cpu * 30 + Duration::from_secs(60));
    recording.interrupt()
}

/// `firn record` in the background, its log in a file; killed when
/// dropped. For tests that start workloads once firn samples.
pub struct Recording {
    child: Option<Child>,
    log: PathBuf,
    output: PathBuf,
}

impl Recording {
    /// `firn record --output DIR/profile.pb.gz ARGS`.
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        let output = dir.join("profile.pb.gz");
        let log = dir.join("record.log");
        let child = firn()
            .arg("record")
            .arg("--output")
            .arg(&output)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("record log"))
            .spawn()
            .expect("firn record starts");
        Self {
            child: Some(child),
            log,
            output,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until firn logs that it records: the sampler is attached.
    pub fn wait_until_sampling(&mut self) {
        // Generous: loading and verifying the BPF program on a busy
        // machine has taken tens of seconds.
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.log().contains("recording") {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok())
                .flatten()
            {
                panic!("firn record exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "firn record did not start sampling within 120 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends the recording now with SIGINT (firn writes what it sampled),
    /// then as [`Self::finish`]: for tests that end it on an event rather
    /// than after a fixed time.
    pub fn interrupt(self) -> (String, Profile) {
        if let Some(child) = &self.child {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        }
        self.finish(Duration::ZERO)
    }

    /// Waits for the recording to end (its duration plus at most 60 s),
    /// asserting success; returns the log and the decoded profile.
    pub fn finish(mut self, duration: Duration) -> (String, Profile) {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + duration + Duration::from_secs(60);
        let Some(status) = wait_or_kill(&mut child, deadline) else {
            panic!("firn record did not end in time:\n{}", self.log());
        };
        let log = self.log();
        assert!(status.success(), "firn record failed ({status}):\n{log}");
        let bytes = std::fs::read(&self.output).expect("firn wrote the profile");
        let profile = pprof::decode(&bytes).expect("the profile decodes as pprof");
        (log, profile)
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
