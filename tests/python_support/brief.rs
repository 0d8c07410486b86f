//! Short-lived Python processes: `brief.py` run again and again under one
//! interpreter while firn records the whole system, and every sample of
//! every run judged.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use agent_pprof::proto::Profile;

use crate::common::reaped_children_cpu_time;

use super::{
    Interpreter,
    frames::{Sample, describe_samples, samples_of},
};

/// brief.py's chain, innermost first.
pub const BRIEF_CHAIN: [&str; 4] = ["leaf", "middle", "outer", "<module>"];

/// The native frame under which the interpreter runs a script: a sample
/// without it is the interpreter starting or ending.
const RUNS_SCRIPT: &str = "_PyRun_AnyFileObject";

/// How long one run may take on a loaded machine before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// A run, killed if the test ends before it does.
struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The runs of `script` under one interpreter, one after the other.
pub struct BriefRuns {
    pub interpreter: Interpreter,
    pub pids: Vec<u32>,
    /// The CPU time the runs got, user and system.
    pub cpu: Duration,
}

impl BriefRuns {
    /// Runs `interpreter script SECONDS` `runs` times, each waited for.
    pub fn run(
        interpreter: &Interpreter,
        script: &std::path::Path,
        seconds: &str,
        runs: usize,
    ) -> Self {
        let before = reaped_children_cpu_time();
        let mut pids = Vec::with_capacity(runs);
        for _ in 0..runs {
            let child = Command::new(&interpreter.path)
                .arg(script)
                .arg(seconds)
                .env_remove("PYTHONPATH")
                .env_remove("PYTHONSTARTUP")
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|error| panic!("could not start {}: {error}", interpreter.name));
            let mut run = Run(child);
            pids.push(run.0.id());
            let deadline = Instant::now() + RUN_TIMEOUT;
            loop {
                if let Some(status) = run.0.try_wait().expect("waits") {
                    assert!(status.success(), "{} exited {status}", interpreter.name);
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} still ran after {RUN_TIMEOUT:?}",
                    interpreter.name
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Self {
            interpreter: interpreter.clone(),
            pids,
            cpu: reaped_children_cpu_time() - before,
        }
    }

    /// Every sample of every run.
    pub fn samples(&self, profile: &Profile) -> Vec<Sample> {
        self.pids
            .iter()
            .flat_map(|&pid| samples_of(profile, pid))
            .collect()
    }

    /// Judges every sample of the runs: those taken while the script ran
    /// must name its chain in order, with nothing else among the Python
    /// frames; only those of the interpreter starting or ending, whole
    /// down to `_start` and outside the script, are left out. Figures, or
    /// why not, for `frequency_hz`; at least `min_kept` of the samples the
    /// runs' CPU time makes must be there.
    pub fn check(
        &self,
        profile: &Profile,
        frequency_hz: f64,
        wanted: f64,
        min_kept: f64,
    ) -> Result<String, String> {
        let who = &self.interpreter.name;
        let samples = self.samples(profile);
        let total: i64 = samples.iter().map(|s| s.count).sum();
        // How the misses spread over the runs: a few runs that missed
        // much (registered late) or many that missed a little.
        let mut misses: Vec<i64> = self
            .pids
            .iter()
            .map(|&pid| {
                samples_of(profile, pid)
                    .iter()
                    .filter(|s| s.python_names() != BRIEF_CHAIN && !Self::outside(s))
                    .map(|s| s.count)
                    .sum()
            })
            .collect();
        misses.sort_unstable();
        misses.reverse();
        let outside = Self::outside;
        let named = |s: &Sample| s.python_names() == BRIEF_CHAIN;
        let (mut hits, mut counted) = (0, 0);
        for sample in &samples {
            if named(sample) {
                hits += sample.count;
                counted += sample.count;
            } else if !outside(sample) {
                counted += sample.count;
            }
        }
        let expected = self.cpu.as_secs_f64() * frequency_hz;
        let figures = format!(
            "{who}, {} runs at {frequency_hz} Hz: the chain in {hits} of {counted} samples \
             running the script ({:.1}%), {hits} of all {total} ({:.1}%); ~{expected:.0} \
             expected for {:?} of CPU; misses per run, most first: {misses:?}",
            self.pids.len(),
            hits as f64 * 100.0 / counted.max(1) as f64,
            hits as f64 * 100.0 / total.max(1) as f64,
            self.cpu
        );
        // Samples lost would flatter the share: enough must be there
        // (the ring buffer drops what a loaded daemon cannot keep up with).
        if (total as f64) < expected * min_kept || counted < 30 {
            return Err(format!(
                "{figures}: too few samples\n{}",
                describe_samples(samples.iter())
            ));
        }
        if (hits as f64) < wanted * counted as f64 {
            return Err(format!(
                "{figures}, wanted {:.0}%; the others:\n{}",
                wanted * 100.0,
                describe_samples(samples.iter().filter(|s| !named(s) && !outside(s)))
            ));
        }
        Ok(figures)
    }
}

impl BriefRuns {
    /// A sample of the interpreter starting (its own Python code included)
    /// or ending: not under the script, and either whole down to `_start`,
    /// in the dynamic loader, or in the kernel's exec or exit.
    fn outside(sample: &Sample) -> bool {
        let script = sample
            .frames
            .iter()
            .any(|f| f.python && f.file.ends_with("brief.py"));
        let whole = sample.frames.last().is_some_and(|f| f.name == "_start")
            || ["_dl_start", "do_exit", "bprm_execve"]
                .iter()
                .any(|name| sample.position(name).is_some());
        !script && sample.position(RUNS_SCRIPT).is_none() && whole
    }
}
