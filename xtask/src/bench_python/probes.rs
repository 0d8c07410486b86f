//! What the Python bench reads at each edge of its window: the workload's
//! progress (it reports on SIGUSR1), CPU time from the threads'
//! schedstat, and the run time and count of firn's BPF sampling program
//! from bpftool.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

/// Counters read at one edge of the measured window.
pub struct Snapshot {
    pub iterations: f64,
    pub seconds: f64,
    pub profiler_cpu: f64,
    pub workload_cpu: f64,
    /// The sampling program's run time (ns) and runs so far.
    pub bpf: Option<(u64, u64)>,
}

impl Snapshot {
    /// Of the workload, the profiler process `profiler_pid` and the BPF
    /// program `program`.
    pub fn take(
        workload: &Workload,
        profiler_pid: Option<u32>,
        program: Option<u64>,
    ) -> Result<Self> {
        let (iterations, seconds) = workload.progress()?;
        let bpf = program.and_then(|id| sampling_programs().get(&id).copied());
        Ok(Self {
            iterations,
            seconds,
            profiler_cpu: profiler_pid.map_or(Ok(0.0), cpu_seconds)?,
            workload_cpu: cpu_seconds(workload.pid())?,
            bpf,
        })
    }
}

/// CPU seconds of `pid`'s threads so far, from each one's
/// /proc/PID/task/TID/schedstat (nanoseconds on a CPU): /proc/PID/stat
/// counts in clock ticks, too coarse for what a profiler spends in a few
/// seconds. Threads that have exited are not counted; the profilers keep
/// theirs while they sample.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let mut nanoseconds = 0u64;
    let tasks = format!("/proc/{pid}/task");
    for task in fs::read_dir(&tasks).with_context(|| format!("could not list {tasks}"))? {
        let path = task?.path().join("schedstat");
        // A thread may exit between the listing and the read.
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let on_cpu = text
            .split_whitespace()
            .next()
            .context("an empty schedstat")?;
        nanoseconds += on_cpu.parse::<u64>()?;
    }
    Ok(nanoseconds as f64 / 1e9)
}

/// The run time so far (ns) of each of firn's sampling programs loaded,
/// by program id, from bpftool: 0 unless a firn is running (it turns the
/// kernel's statistics on while it runs).
pub fn sampling_programs() -> BTreeMap<u64, (u64, u64)> {
    let programs: Option<serde_json::Value> = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .ok()
        .and_then(|output| serde_json::from_slice(&output.stdout).ok());
    programs
        .as_ref()
        .and_then(|programs| programs.as_array())
        .into_iter()
        .flatten()
        .filter(|program| program["name"] == "sample_cpu")
        .filter_map(|program| {
            let id = program["id"].as_u64()?;
            let runs = program["run_cnt"].as_u64().unwrap_or(0);
            Some((id, (program["run_time_ns"].as_u64().unwrap_or(0), runs)))
        })
        .collect()
}

/// chain.py running until stopped, its output read line by line.
pub struct Workload {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Workload {
    pub fn start(python: &Path, script: &Path) -> Result<Self> {
        let mut child = Command::new(python)
            .arg(script)
            .arg("0")
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start {}", python.display()))?;
        let stdout = child.stdout.take().context("the workload's stdout")?;
        let (sender, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let workload = Self { child, lines };
        match workload.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line == "ready" => Ok(workload),
            other => bail!("the workload did not start: {other:?}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Iterations done and seconds run so far (SIGUSR1 makes it say).
    fn progress(&self) -> Result<(f64, f64)> {
        self.signal(libc::SIGUSR1);
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(10))
            .context("the workload did not report its progress")?;
        parse_progress(&line).with_context(|| format!("unexpected progress line `{line}`"))
    }

    pub fn stop(mut self) -> Result<()> {
        self.signal(libc::SIGTERM);
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the workload failed: {status}");
        }
        Ok(())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `iterations=N seconds=S`.
fn parse_progress(line: &str) -> Option<(f64, f64)> {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(name)?.parse::<f64>().ok())
    };
    Some((field("iterations=")?, field("seconds=")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_read() {
        assert_eq!(
            parse_progress("iterations=714 seconds=0.868"),
            Some((714.0, 0.868))
        );
        assert_eq!(parse_progress("ready"), None);
    }
}
