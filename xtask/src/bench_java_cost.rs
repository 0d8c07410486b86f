//! What each profiler's sample costs, measured on fixed work
//! (`tests/workloads/java/ChainWork.java`): the same number of iterations of
//! the chain on one thread, run alone, under async-profiler and under firn
//! in turn, rounds after rounds in one JVM (the order rotating each round).
//!
//! async-profiler's signal handler runs in the sampled threads, so its work
//! is CPU time of the JVM: the same work takes more of it. Its cost per
//! sample is (the JVM's CPU for the work with it − without) / the samples
//! it recorded. firn's cost per sample is its own CPU over the work (and a
//! moment after, as it drains what was sampled) plus what the JVM took
//! beyond working alone (the BPF program and the kernel's sampling run in
//! the sampled thread too), over the samples it recorded of the JVM.
//! firn's BPF time is also read from the kernel's statistics of its
//! program (`run_time_ns` in the fdinfo of firn's program descriptors),
//! which no noise of the JVM's touches. Both sample at 10 kHz (a hundred
//! times the main bench's rate): the JVM's CPU for the same work varies
//! between rounds by some 5% on a busy machine, 50 µs per sample at
//! 1 kHz, as much as the costs measured; at 10 kHz that is 5 µs, and the
//! medians of paired rounds take most of the rest. The workload is one
//! thread: the other CPU is free for firn, so neither profiler's cost
//! turns into lost throughput instead of CPU time.
//!
//! A fourth measurement, `perf record` of the JVM at the same rate without
//! stacks, gives the floor of any sampler that the kernel interrupts for:
//! the timer's interrupt and one sample record, in the JVM's time. firn's
//! time in the JVM is that floor plus its BPF program; async-profiler's is
//! that floor plus its signal and its walk.

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    path::Path,
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    bench::{BenchArgs, median},
    bench_java::{Tools, async_profiler_command, spawn_talking},
    bench_python::probes::cpu_seconds,
};

/// At least this many rounds, whatever `--rounds` says: the spread is
/// reported.
const MIN_ROUNDS: usize = 7;
/// Seconds of work in each measurement.
const WORK_SECONDS: f64 = 3.0;
/// Sampling rate of both profilers here: firn's most, async-profiler's
/// `interval=100us`.
const RATE_HZ: u64 = 10_000;
/// How long firn is given after the work to drain what it sampled.
const DRAIN: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Alone,
    AsyncProfiler,
    Firn,
    /// `perf record` without stacks: the kernel's sampling alone.
    Floor,
}

/// One measurement of the fixed work.
#[derive(Clone, Copy, Debug, Default)]
struct Work {
    /// The JVM's CPU seconds for the work.
    jvm_cpu: f64,
    /// firn's own CPU seconds over it; 0 for the others.
    firn_cpu: f64,
    /// Nanoseconds firn's BPF programs ran over it, by the kernel's
    /// statistics; 0 for the others.
    bpf_ns: f64,
    /// Samples the profiler recorded.
    samples: u64,
}

/// µs per sample of each profiler under one JVM, each round's.
#[derive(Clone, Debug, Default)]
pub struct Costs {
    async_profiler: Vec<f64>,
    firn: Vec<f64>,
    /// firn over async-profiler, round by round.
    ratio: Vec<f64>,
    /// firn's BPF time per sample, by the kernel's statistics.
    bpf: Vec<f64>,
    /// The kernel's sampling alone, per sample in the JVM.
    floor: Vec<f64>,
}

/// The fixed-work JVM: its stdin takes a batch size, its stdout says when
/// a batch is done.
struct Jvm {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Jvm {
    fn start(tools: &Tools, java: &Path) -> Result<Self> {
        let (child, stdin, lines) = spawn_talking(
            Command::new(java)
                .arg(format!("-agentpath:{}", tools.library.display()))
                .arg("-cp")
                .arg(&tools.classes)
                .args(["ChainWork", "5"]),
            java,
        )?;
        let jvm = Self {
            child,
            stdin,
            lines,
        };
        jvm.wait_for("ready", Duration::from_secs(70))?;
        Ok(jvm)
    }

    fn wait_for(&self, word: &str, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line == word => return Ok(()),
                // async-profiler says hello on stdout.
                Ok(_) => {}
                Err(error) => bail!("the fixed-work JVM did not say {word}: {error}"),
            }
        }
    }

    /// Runs `iterations`.
    fn work(&mut self, iterations: u64) -> Result<()> {
        writeln!(self.stdin, "{iterations}")?;
        self.stdin.flush()?;
        self.wait_for("done", Duration::from_secs(300))
    }
}

impl Drop for Jvm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Measures both profilers' CPU per sample on the fixed work under `java`.
pub fn run(tools: &Tools, name: &str, java: &Path, args: &BenchArgs) -> Result<Costs> {
    let rounds = args.rounds.max(MIN_ROUNDS);
    println!(
        "\nCPU per sample on fixed work under {name}: one thread, {rounds} rounds of alone, \
         async-profiler and firn (order rotating), both at {RATE_HZ} Hz"
    );
    let mut jvm = Jvm::start(tools, java)?;
    let pid = jvm.child.id();
    // About WORK_SECONDS of the JVM's CPU, from a batch measured first (by
    // CPU, not wall time: on a loaded machine the work waits for a CPU).
    let probe = 2000;
    let before = cpu_seconds(pid)?;
    jvm.work(probe)?;
    let seconds = cpu_seconds(pid)? - before;
    let iterations = ((probe as f64 * WORK_SECONDS / seconds.max(1e-3)) as u64).max(probe);
    let order = [Mode::Alone, Mode::AsyncProfiler, Mode::Firn, Mode::Floor];
    let mut costs = Costs::default();
    let mut spread = (Vec::new(), Vec::new());
    let (mut alone_cpu, mut samples) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut measured: Vec<(Mode, Work)> = Vec::new();
        for index in 0..order.len() {
            let mode = order[(index + round) % order.len()];
            measured.push((mode, measure(tools, &mut jvm, pid, mode, iterations)?));
        }
        costs.add_round(round, &measured, &mut spread);
        alone_cpu.push(work_of(&measured, Mode::Alone).jvm_cpu);
        samples.push(work_of(&measured, Mode::AsyncProfiler).samples as f64);
    }
    println!(
        "  per sample: async-profiler {}, firn {} ({} in firn, {} in the JVM; its BPF programs \
         {} by the kernel's count); firn/async-profiler {}",
        summary(&costs.async_profiler),
        summary(&costs.firn),
        summary(&spread.0),
        summary(&spread.1),
        summary(&costs.bpf),
        ratio_summary(&costs.ratio),
    );
    let floor_ratio: Vec<f64> = costs
        .floor
        .iter()
        .zip(&costs.async_profiler)
        .map(|(floor, ap)| floor / ap)
        .collect();
    println!(
        "  the kernel's sampling alone (perf record, no stacks): {} in the JVM, {} of \
         async-profiler's cost",
        summary(&costs.floor),
        ratio_summary(&floor_ratio),
    );
    // What the JVM's CPU for the same work varies by alone, per sample:
    // a difference in the JVM's CPU below this is noise.
    let low = alone_cpu.iter().copied().fold(f64::INFINITY, f64::min);
    let high = alone_cpu.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "  the JVM alone: {:.3} CPU s ({low:.3}–{high:.3}), a spread of {:.1} us per sample",
        median(alone_cpu.iter().copied()),
        (high - low) * 1e6 / median(samples.iter().copied()).max(1.0)
    );
    Ok(costs)
}

/// The measurement of `mode` in a round.
fn work_of(measured: &[(Mode, Work)], mode: Mode) -> Work {
    measured
        .iter()
        .find(|(m, _)| *m == mode)
        .map(|(_, work)| *work)
        .unwrap_or_default()
}

impl Costs {
    /// One round's costs, printed and kept; `spread` gets firn's own and
    /// in-JVM parts.
    fn add_round(
        &mut self,
        round: usize,
        measured: &[(Mode, Work)],
        spread: &mut (Vec<f64>, Vec<f64>),
    ) {
        let get = |mode| work_of(measured, mode);
        let (alone, ap, firn) = (get(Mode::Alone), get(Mode::AsyncProfiler), get(Mode::Firn));
        let floor = get(Mode::Floor);
        let ap_cost = (ap.jvm_cpu - alone.jvm_cpu) * 1e6 / ap.samples.max(1) as f64;
        let floor_cost = (floor.jvm_cpu - alone.jvm_cpu) * 1e6 / floor.samples.max(1) as f64;
        let firn_bpf = (firn.jvm_cpu - alone.jvm_cpu) * 1e6 / firn.samples.max(1) as f64;
        let firn_own = firn.firn_cpu * 1e6 / firn.samples.max(1) as f64;
        let kernel_bpf = firn.bpf_ns / 1e3 / firn.samples.max(1) as f64;
        println!(
            "  round {}: JVM {:.3} CPU s alone, {:.3} with async-profiler ({} samples: {ap_cost:.1} \
             us each), {:.3} with firn ({} samples: {firn_own:.1} us in firn + {firn_bpf:.1} us \
             in the JVM each, BPF {kernel_bpf:.1} us by the kernel's count), {:.3} with perf \
             record and no stacks ({} samples: {floor_cost:.1} us each); firn/async-profiler \
             {:.2}",
            round + 1,
            alone.jvm_cpu,
            ap.jvm_cpu,
            ap.samples,
            firn.jvm_cpu,
            firn.samples,
            floor.jvm_cpu,
            floor.samples,
            (firn_own + firn_bpf) / ap_cost,
        );
        self.async_profiler.push(ap_cost);
        self.firn.push(firn_own + firn_bpf);
        self.ratio.push((firn_own + firn_bpf) / ap_cost);
        self.bpf.push(kernel_bpf);
        self.floor.push(floor_cost);
        spread.0.push(firn_own);
        spread.1.push(firn_bpf);
    }
}

/// `median (min–max)` of ratios.
fn ratio_summary(values: &[f64]) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.2} ({min:.2}–{max:.2})", median(values.iter().copied()))
}

/// `median us (min–max)`.
fn summary(values: &[f64]) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.1} us ({min:.1}–{max:.1})",
        median(values.iter().copied())
    )
}

fn measure(tools: &Tools, jvm: &mut Jvm, pid: u32, mode: Mode, iterations: u64) -> Result<Work> {
    let output = tools.work.join("java-cost-async-profiler.txt");
    let mut firn = None;
    let mut perf = None;
    match mode {
        Mode::Alone => {}
        Mode::Floor => perf = Some(Perf::start(tools, pid)?),
        Mode::AsyncProfiler => async_profiler_command(
            tools,
            pid,
            &format!("start,event=cpu,interval={}us", 1_000_000 / RATE_HZ.max(1)),
        )?,
        Mode::Firn => firn = Some(Firn::start(tools, pid)?),
    }
    let firn_cpu = |firn: &Option<Firn>| firn.as_ref().map_or(Ok(0.0), |f| cpu_seconds(f.pid()));
    // A first batch, not measured, so that what a profiler does once per
    // process (firn reads the JVM's tables and code heaps) is not charged
    // to the samples; its samples are taken out of the count in proportion
    // to the JVM's CPU.
    let warm_start = cpu_seconds(pid)?;
    jvm.work(iterations / 10)?;
    let bpf_ns = |firn: &Option<Firn>| firn.as_ref().map_or(0, |f| bpf_run_time(f.pid()));
    let (jvm_before, firn_before) = (cpu_seconds(pid)?, firn_cpu(&firn)?);
    let bpf_before = bpf_ns(&firn);
    jvm.work(iterations)?;
    let jvm_after = cpu_seconds(pid)?;
    let bpf_after = bpf_ns(&firn);
    let mut work = Work {
        jvm_cpu: jvm_after - jvm_before,
        ..Work::default()
    };
    let samples = match mode {
        Mode::Alone => 0,
        Mode::Floor => perf.context("perf started")?.stop()?,
        Mode::AsyncProfiler => {
            async_profiler_command(
                tools,
                pid,
                &format!("stop,file={},collapsed", output.display()),
            )?;
            let text = fs::read_to_string(&output)
                .with_context(|| format!("async-profiler wrote no {}", output.display()))?;
            text.lines()
                .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
                .sum()
        }
        Mode::Firn => {
            thread::sleep(DRAIN);
            work.firn_cpu = firn_cpu(&firn)? - firn_before;
            work.bpf_ns = bpf_after.saturating_sub(bpf_before) as f64;
            firn.context("firn started")?.stop()?
        }
    };
    let share = work.jvm_cpu / (jvm_after - warm_start).max(1e-9);
    work.samples = (samples as f64 * share).round() as u64;
    Ok(work)
}

/// Nanoseconds the perf event programs `pid` holds have run, from the
/// kernel's statistics in their descriptors' fdinfo (kept while
/// `kernel.bpf_stats_enabled` is on, which firn turns on while it runs);
/// programs reached by tail call count in the program that called them.
/// Every run counts, those on other processes' samples (filtered out at
/// once) too.
fn bpf_run_time(pid: u32) -> u64 {
    /// `BPF_PROG_TYPE_PERF_EVENT`.
    const PERF_EVENT: &str = "7";
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let mut total = 0;
    for fd in fds.flatten() {
        let is_program = fs::read_link(fd.path())
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:bpf-prog");
        if !is_program {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        )) else {
            continue;
        };
        let fields: BTreeMap<&str, &str> = info
            .lines()
            .filter_map(|line| {
                let (key, value) = line.split_once(':')?;
                Some((key.trim(), value.trim()))
            })
            .collect();
        if fields.get("prog_type") == Some(&PERF_EVENT) {
            total += fields
                .get("run_time_ns")
                .and_then(|ns| ns.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

/// firn recording the JVM until stopped.
struct Firn {
    child: Child,
    log: std::path::PathBuf,
}

impl Firn {
    fn start(tools: &Tools, pid: u32) -> Result<Self> {
        let log = tools.work.join("java-cost-firn.log");
        let child = Command::new(&tools.firn)
            .args(["record", "--pid", &pid.to_string(), "--frequency"])
            .arg(RATE_HZ.to_string())
            .args(["--duration", "600s", "--output"])
            .arg(tools.work.join("java-cost-firn.pb.gz"))
            .stdout(Stdio::null())
            .stderr(
                fs::File::create(&log)
                    .with_context(|| format!("could not create {}", log.display()))?,
            )
            .spawn()
            .context("could not start firn")?;
        let firn = Self { child, log };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !fs::read_to_string(&firn.log)
            .unwrap_or_default()
            .contains("recording")
        {
            if Instant::now() > deadline {
                bail!("firn did not start sampling: see {}", firn.log.display());
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(firn)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops firn (SIGINT: it writes its profile); returns the samples it
    /// recorded, from its last line.
    fn stop(mut self) -> Result<u64> {
        // SAFETY: signalling our own child, which has not been waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait()?;
        if !status.success() {
            bail!("firn failed ({status}); see {}", self.log.display());
        }
        let text = fs::read_to_string(&self.log)?;
        text.lines()
            .rev()
            .find(|line| line.contains("profile written"))
            .and_then(|line| {
                line.split_whitespace()
                    .find_map(|field| field.strip_prefix("samples=")?.parse().ok())
            })
            .with_context(|| format!("firn wrote no profile: see {}", self.log.display()))
    }
}

impl Drop for Firn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `perf record` of the JVM's threads at the same rate, samples without
/// stacks, written to a file nobody reads.
struct Perf {
    child: Child,
    log: std::path::PathBuf,
}

impl Perf {
    fn start(tools: &Tools, pid: u32) -> Result<Self> {
        let log = tools.work.join("java-cost-perf.log");
        let _ = fs::remove_file(tools.work.join("java-cost-perf.data"));
        let child = Command::new("perf")
            .args(["record", "-e", "cpu-clock", "-F"])
            .arg(RATE_HZ.to_string())
            .args(["-p", &pid.to_string(), "-o"])
            .arg(tools.work.join("java-cost-perf.data"))
            .stdout(Stdio::null())
            .stderr(
                fs::File::create(&log)
                    .with_context(|| format!("could not create {}", log.display()))?,
            )
            .spawn()
            .context("could not start perf (linux-perf)")?;
        let perf = Self { child, log };
        // perf says nothing when it samples; it writes its file's header
        // once its events are open (the unmeasured first batch follows).
        let data = tools.work.join("java-cost-perf.data");
        let deadline = Instant::now() + Duration::from_secs(60);
        while fs::metadata(&data).map(|m| m.len()).unwrap_or(0) == 0 {
            if Instant::now() > deadline {
                bail!("perf did not start: see {}", perf.log.display());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(perf)
    }

    /// Stops perf (SIGINT); returns the samples it wrote, from its last
    /// line (`… (N samples) ]`).
    fn stop(mut self) -> Result<u64> {
        // SAFETY: signalling our own child, which has not been waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        let text = fs::read_to_string(&self.log)?;
        text.rsplit_once(" samples)")
            .and_then(|(head, _)| head.rsplit_once('(')?.1.trim().parse().ok())
            .with_context(|| format!("perf wrote no sample count: see {}", self.log.display()))
    }
}

impl Drop for Perf {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last lines of the Java bench: CPU per sample side by side.
pub fn print_summary(per_jvm: &[(String, f64, Costs)]) {
    println!(
        "\nCPU per sample, fixed work at {RATE_HZ} Hz (median over rounds, min–max): \
         async-profiler's time in the JVM, firn's own CPU plus its time in the JVM; the ratio \
         firn/async-profiler round by round"
    );
    for (name, window, costs) in per_jvm {
        println!(
            "  {name:<8} async-profiler {}, firn {} (its BPF programs {} by the kernel's count); \
             firn/async-profiler {}; the kernel's sampling alone {}; firn in the main bench's \
             window: {window:.1} us",
            summary(&costs.async_profiler),
            summary(&costs.firn),
            summary(&costs.bpf),
            ratio_summary(&costs.ratio),
            summary(&costs.floor),
        );
    }
}
