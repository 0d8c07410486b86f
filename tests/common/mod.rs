//! Helpers for firn's end-to-end tests: they run the real `firn` binary as
//! root, against workloads the tests build, and read back what a user would.

#![allow(dead_code)]

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use agent_pprof::{self as pprof, Reader, proto::Profile};

mod run;
mod samples;
// Each test binary compiles this module and uses only part of it.
#[allow(unused_imports)]
pub use run::*;
#[allow(unused_imports)]
pub use samples::*;

/// The chain every workload test looks for, leaf first.
pub const CHAIN: [&str; 5] = ["burn_leaf", "level_three", "level_two", "level_one", "main"];

/// CPU time of this test's children that have exited and been waited for,
/// and of theirs.
pub fn reaped_children_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Tests that burn CPU and sample the whole machine run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Fails (never skips) when not root: these tests load BPF programs.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the end-to-end tests load BPF programs and must run as root (sudo -E cargo xtask test)"
    );
}

pub fn firn() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_firn"));
    command.env("FIRN_LOG_LEVEL", "info");
    command
}

pub fn workloads_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads")
}

/// Compiles `tests/workloads/<source>` with gcc into `dir`.
pub fn build_c(dir: &Path, source: &str, output: &str, flags: &[&str]) -> PathBuf {
    let binary = dir.join(output);
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(workloads_dir().join(source))
        .status()
        .unwrap_or_else(|error| panic!("gcc is needed to build the test workloads: {error}"));
    assert!(status.success(), "gcc failed to build {source}");
    binary
}

/// An optimized C build without frame pointers: the case the DWARF unwinder
/// exists for.
pub const NO_FP_FLAGS: [&str; 4] = ["-O2", "-fomit-frame-pointer", "-g", "-pthread"];

/// `chain_inline.c` built without frame pointers.
pub fn build_no_fp_chain(dir: &Path) -> PathBuf {
    build_c(dir, "chain_inline.c", "chain_inline", &NO_FP_FLAGS)
}

/// A counter from firn's summary line (`name=value`).
pub fn summary_value(log: &str, name: &str) -> u64 {
    let prefix = format!("{name}=");
    log.lines()
        .filter(|line| line.contains("profile written"))
        .flat_map(str::split_whitespace)
        .find_map(|field| field.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in firn's summary:\n{log}"))
}

/// A lightly optimized build that keeps frame pointers: the case the
/// frame-pointer walk handles alone.
pub const FP_FLAGS: [&str; 2] = ["-O1", "-fno-omit-frame-pointer"];

/// Builds the chain workload with `flags` and starts it spinning.
pub fn start_chain(dir: &Path, flags: &[&str]) -> TestProcess {
    // One directory per flag set; the binary (and so its comm) stays `chain`.
    let variant = dir.join(flags.join("").replace(['-', '='], ""));
    let binary = variant.join("chain");
    if !binary.exists() {
        std::fs::create_dir_all(&variant).expect("workload directory");
        build_c(&variant, "chain.c", "chain", flags);
    }
    let process = TestProcess::spawn(Command::new(binary).arg("100000"));
    process.wait_until_running();
    process
}

/// A child process killed when the test ends, however it ends.
pub struct TestProcess {
    child: Child,
}

impl TestProcess {
    pub fn spawn(command: &mut Command) -> Self {
        Self::spawn_with_stdout(command, Stdio::null())
    }

    /// As [`Self::spawn`], its standard output into `stdout`.
    pub fn spawn_with_stdout(command: &mut Command, stdout: Stdio) -> Self {
        let child = command
            .stdout(stdout)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {command:?}: {error}"));
        Self { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// See [`wait_until_running`].
    pub fn wait_until_running(&self) {
        wait_until_running(self.pid());
    }

    /// Waits for it to exit, at most `timeout` (then panics; the drop
    /// kills it).
    pub fn wait_for_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let status = wait_or_kill(&mut self.child, deadline);
        status.unwrap_or_else(|| panic!("process {} still ran after {timeout:?}", self.pid()))
    }
}

impl Drop for TestProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `done` every 50 ms until it holds, panicking with `what` (and
/// `context()`, e.g. a log) after `timeout`: tests wait for the event they
/// need, never a fixed time that a loaded machine may overrun.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "gave up after {timeout:?} waiting for {what}:\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `child` to exit until `deadline`; past it, kills it and
/// returns `None`.
fn wait_or_kill(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().expect("waits") {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of `field=` in the last log line holding `message`.
pub fn log_field(log: &str, message: &str, field: &str) -> Option<u64> {
    let line = log.lines().rev().find(|line| line.contains(message))?;
    let start = line.find(&format!(" {field}="))? + field.len() + 2;
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A GET over plain HTTP/1.1: the status and the body, or the connection
/// error (refused while nothing listens).
pub fn get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// One sample of `/metrics`, `name` with its labels as written
/// (`firn_profiles_dropped_total{reason="queue"}`), read from the text
/// (for polling; the OpenMetrics parser checks the format elsewhere).
pub fn metric(address: SocketAddr, name: &str) -> Option<f64> {
    let (status, body) = get(address, "/metrics").ok()?;
    if status != 200 {
        return None;
    }
    body.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.split(' ').next()?.parse().ok()
    })
}

/// Frame names of each sample of process `pid`, with its sample count.
pub fn stacks_of(profile: &Profile, pid: u32) -> Vec<(Vec<String>, i64)> {
    let pid = pid.to_string();
    Reader::new(profile)
        .samples()
        .filter(|sample| sample.label("pid") == Some(pid.as_str()))
        .map(|sample| (sample.function_names(), sample.count()))
        .collect()
}

/// Whether `names` holds `chain` contiguously, in order.
pub fn holds_chain(names: &[String], chain: &[&str]) -> bool {
    names.windows(chain.len()).any(|window| {
        window
            .iter()
            .zip(chain)
            .all(|(name, wanted)| name == wanted)
    })
}

/// Share of `stacks` (weighted by count) that hold `chain`, and the total.
pub fn chain_share(stacks: &[(Vec<String>, i64)], chain: &[&str]) -> (f64, i64) {
    let total: i64 = stacks.iter().map(|(_, count)| count).sum();
    let complete: i64 = stacks
        .iter()
        .filter(|(names, _)| holds_chain(names, chain))
        .map(|(_, count)| count)
        .sum();
    (complete as f64 / total.max(1) as f64, total)
}

/// A readable dump of the heaviest stacks, for assertion messages.
pub fn describe(stacks: &[(Vec<String>, i64)]) -> String {
    let mut sorted: Vec<_> = stacks.iter().collect();
    sorted.sort_by_key(|(_, count)| -count);
    sorted
        .iter()
        .take(8)
        .map(|(names, count)| format!("{count:>5}  {}", names.join(" <- ")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// CPU time `pid` has spent, user and system, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may hold spaces and parentheses), the
    // fields from the third on: utime and stime are the 14th and 15th.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let ticks: u64 = fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&hz| hz > 0)?;
    Some(Duration::from_millis(ticks * 1000 / per_second))
}

/// Waits (at most 30 s) until `pid` runs a program of its own: it has
/// exec'd (its executable is no longer this test's) and been on a CPU since
/// being started. What a test needs before firn looks at a workload.
pub fn wait_until_running(pid: u32) {
    let test = std::env::current_exe().ok();
    let exe = format!("/proc/{pid}/exe");
    wait_for(
        "the workload to run",
        Duration::from_secs(30),
        || {
            std::fs::read_link(&exe).is_ok_and(|path| Some(&path) != test.as_ref())
                && cpu_time(pid).is_some_and(|spent| !spent.is_zero())
        },
        || format!("{exe}: {:?}", std::fs::read_link(&exe)),
    );
}

/// Waits until `pid` has spent `spent` of CPU time (at most `timeout`):
/// it has run long enough to be sampled that much, however loaded the
/// machine is.
pub fn wait_for_cpu_time(pid: u32, spent: Duration, timeout: Duration) {
    wait_for(
        &format!("{spent:?} of CPU time in process {pid}"),
        timeout,
        || cpu_time(pid).is_some_and(|time| time >= spent),
        || format!("{:?} so far", cpu_time(pid)),
    );
}

/// A program of the Python tools `cargo xtask setup` installs (the
/// Prometheus client's parser, a Kubernetes schema validator, hadolint) in
/// a virtualenv of firn's own.
pub fn python_tool(name: &str) -> PathBuf {
    let venv = std::env::var_os("FIRN_TOOLS_VENV").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/firn/venv")
        },
        PathBuf::from,
    );
    let path = venv.join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask setup` (or `cargo xtask test`), which installs \
         the Python tools the tests use into {}",
        path.display(),
        venv.display()
    );
    path
}

/// The number of online CPUs, as the kernel counts them.
pub fn online_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online CPUs");
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((first, last)) => {
                let first: usize = first.parse().expect("a CPU number");
                let last: usize = last.parse().expect("a CPU number");
                last - first + 1
            }
            None => 1,
        })
        .sum()
}

/// A tmpfs of `bytes` mounted at `dir` (created if missing), lazily
/// unmounted when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, bytes: u64) -> Self {
        std::fs::create_dir_all(dir).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "firn-test"])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(status.success(), "could not mount a tmpfs at {dir:?}");
        Self(dir.to_path_buf())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `name` until no space is left.
    pub fn fill(&self, name: &str) {
        use std::io::Write;
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

/// The newest profile the agent wrote into `store`, decoded; `None` while
/// there is none yet or it is still being written.
pub fn newest_profile(store: &Path) -> Option<Profile> {
    std::fs::read_dir(store)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.to_string_lossy().ends_with(".pb.gz"))
        .max()
        .and_then(|path| std::fs::read(path).ok())
        .and_then(|bytes| pprof::decode(&bytes).ok())
}
