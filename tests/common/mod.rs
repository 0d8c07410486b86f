//! Helpers for firn's end-to-end tests: they run the real `firn` binary as
//! root, against workloads the tests build, and read back what a user would.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use firn::pprof::{self, proto::Profile, sample_function_names, sample_label};

/// The chain every workload test looks for, leaf first.
pub const CHAIN: [&str; 5] = ["burn_leaf", "level_three", "level_two", "level_one", "main"];

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

/// The flags the spine issue names for the frame-pointer chain workload.
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
    wait_a_moment();
    process
}

/// A child process killed when the test ends, however it ends.
pub struct TestProcess {
    child: Child,
}

impl TestProcess {
    pub fn spawn(command: &mut Command) -> Self {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {command:?}: {error}"));
        Self { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for TestProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// Frame names of each sample of process `pid`, with its sample count.
pub fn stacks_of(profile: &Profile, pid: u32) -> Vec<(Vec<String>, i64)> {
    let pid = pid.to_string();
    profile
        .sample
        .iter()
        .filter(|sample| sample_label(profile, sample, "pid") == Some(pid.as_str()))
        .map(|sample| (sample_function_names(profile, sample), sample.value[0]))
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

pub fn wait_a_moment() {
    std::thread::sleep(Duration::from_millis(300));
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

/// A GET over plain HTTP/1.1: the status and the body, or the connection
/// error (refused while nothing listens).
pub fn http_get(address: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
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
