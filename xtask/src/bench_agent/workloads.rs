//! The hosts the agent bench profiles: `fp` (`tests/workloads/busy.c`
//! with frame pointers on every CPU), `dwarf` (`chain_inline.c` without
//! frame pointers on every CPU) and `mixed` (a busy host with big binaries
//! and short-lived processes: the soak's 224 MiB `big-chain` spinning on
//! one CPU, and a loop starting a few short processes a second: `gcc -O2`
//! of a small C file, `python3 -c`, a shell pipeline). `--exec-rate`
//! adds a spawner starting that many shorter processes a second.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    bench::{self, Unwind, Workload},
    bench_unwind,
    soak::{fixtures::Guard, workloads as soak_workloads},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentWorkload {
    /// Every CPU busy in a C program with frame pointers.
    Fp,
    /// Every CPU busy in a C program without frame pointers (DWARF).
    Dwarf,
    /// A 224 MiB binary busy on one CPU, and short-lived compilers, Python
    /// and shell pipelines started a few times a second.
    Mixed,
}

impl AgentWorkload {
    pub const ALL: [AgentWorkload; 3] = [Self::Fp, Self::Dwarf, Self::Mixed];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fp => "fp",
            Self::Dwarf => "dwarf",
            Self::Mixed => "mixed",
        }
    }
}

/// How often the mixed host starts a short-lived process.
const CHURN_PERIOD: Duration = Duration::from_millis(250);
/// Longest one short-lived process may take before it is killed.
const CHURN_DEADLINE: Duration = Duration::from_secs(30);

/// What `--exec-rate` starts, in turn with a shell pipeline: a program
/// without frame pointers, dynamically linked, busy about a millisecond.
const SHORT_C: &str = "#include <stdio.h>\n\
    #include <stdlib.h>\n\
    __attribute__((noinline)) static unsigned long step(unsigned long x) { return x * 6364136223846793005UL + 1; }\n\
    __attribute__((noinline)) static unsigned long spin(long n) { unsigned long x = 1; for (long i = 0; i < n; i++) x = step(x); return x; }\n\
    int main(int argc, char **argv) { printf(\"%lu\\n\", spin(argc > 1 ? atol(argv[1]) : 300000)); return 0; }\n";
/// The loop count of `SHORT_C` (about a millisecond).
const SHORT_LOOPS: &str = "300000";
/// Most spawned processes alive at once: past it the spawner waits
/// (a loaded host cannot keep up with the rate asked for).
const MAX_SPAWNED: usize = 64;

const SMALL_C: &str = "#include <stdio.h>\n\
    static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }\n\
    int main(void) { printf(\"%d\\n\", fib(20)); return 0; }\n";

/// The workloads' binaries, built once per bench.
pub struct Prepared {
    fp: Option<Workload>,
    dwarf: Option<Workload>,
    mixed: Option<Mixed>,
}

struct Mixed {
    big: PathBuf,
    small_c: PathBuf,
    object: PathBuf,
    short: PathBuf,
}

impl Prepared {
    pub fn new(root: &Path, work: &Path, workloads: &[AgentWorkload]) -> Result<Self> {
        let wanted = |workload| workloads.contains(&workload);
        let fp = match wanted(AgentWorkload::Fp) {
            true => Some(bench::prepare_workload(root, work, Unwind::Fp)?),
            false => None,
        };
        let dwarf = match wanted(AgentWorkload::Dwarf) {
            true => Some(bench_unwind::workload(root, work)?),
            false => None,
        };
        let mixed = match wanted(AgentWorkload::Mixed) {
            true => {
                let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
                let big = soak_workloads::big_binary(root, &home.join(".cache/firn/soak"))?;
                let small_c = work.join("mixed-small.c");
                fs::write(&small_c, SMALL_C)?;
                let short_c = work.join("mixed-short.c");
                fs::write(&short_c, SHORT_C)?;
                let short = work.join("mixed-short");
                crate::util::run(
                    Command::new("gcc")
                        .args(["-O1", "-fomit-frame-pointer", "-o"])
                        .arg(&short)
                        .arg(&short_c),
                )?;
                Some(Mixed {
                    big,
                    small_c,
                    object: work.join("mixed-small.o"),
                    short,
                })
            }
            false => None,
        };
        Ok(Self { fp, dwarf, mixed })
    }

    /// Starts `workload` for at most `seconds`; it stops when dropped.
    /// `exec_rate`: the mixed host's extra short processes a second.
    pub fn start(
        &self,
        workload: AgentWorkload,
        seconds: u64,
        exec_rate: Option<u32>,
    ) -> Result<Running> {
        let prepared = match workload {
            AgentWorkload::Fp => self.fp.as_ref(),
            AgentWorkload::Dwarf => self.dwarf.as_ref(),
            AgentWorkload::Mixed => None,
        };
        if let Some(prepared) = prepared {
            let guard = Guard::spawn(
                Command::new(&prepared.binary)
                    .args(&prepared.before_seconds)
                    .arg(seconds.to_string())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            )?;
            return Ok(Running {
                guards: vec![guard],
                churn: None,
                spawner: None,
            });
        }
        let mixed = self
            .mixed
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the {} workload was not built", workload.name()))?;
        let big = soak_workloads::busy(&mixed.big)?;
        let commands = vec![
            {
                let mut gcc = Command::new("gcc");
                gcc.args(["-O2", "-c", "-o"])
                    .arg(&mixed.object)
                    .arg(&mixed.small_c);
                gcc
            },
            {
                let mut python = Command::new("python3");
                python.args(["-c", "print(sum(i * i for i in range(200000)))"]);
                python
            },
            {
                let mut shell = Command::new("sh");
                shell.args(["-c", "seq 1 100000 | sort -rn | md5sum"]);
                shell
            },
        ];
        let spawner = exec_rate.filter(|&rate| rate > 0).map(|rate| {
            let mut short = Command::new(&mixed.short);
            short.arg(SHORT_LOOPS);
            let mut shell = Command::new("sh");
            shell.args(["-c", "echo short | cat >/dev/null"]);
            Spawner::start(rate, vec![short, shell])
        });
        Ok(Running {
            guards: vec![big],
            churn: Some(Churn::start(commands)),
            spawner,
        })
    }
}

/// A running workload: killed when dropped.
pub struct Running {
    guards: Vec<Guard>,
    churn: Option<Churn>,
    spawner: Option<Spawner>,
}

impl Running {
    /// Stops the workload; for the mixed host, what its loop and spawner
    /// started: (processes, seconds).
    pub fn finish(mut self) -> Option<(u64, f64)> {
        self.guards.clear();
        let spawned = self.spawner.take().map_or(0, Spawner::stop);
        self.churn
            .take()
            .map(Churn::stop)
            .map(|(started, seconds)| (started + spawned, seconds))
    }
}

/// `--exec-rate`: starts its commands in turn, `rate` a second, without
/// waiting for each (at most [`MAX_SPAWNED`] alive at once).
struct Spawner {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Spawner {
    fn start(rate: u32, mut commands: Vec<Command>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            thread::spawn(move || {
                let period = Duration::from_secs(1) / rate;
                let mut alive: Vec<std::process::Child> = Vec::new();
                let mut started = 0u64;
                let mut next = Instant::now();
                for index in (0..commands.len()).cycle() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    alive.retain_mut(|child| !matches!(child.try_wait(), Ok(Some(_)) | Err(_)));
                    if alive.len() < MAX_SPAWNED
                        && let Ok(child) = commands[index]
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .spawn()
                    {
                        started += 1;
                        alive.push(child);
                    }
                    next += period;
                    let now = Instant::now();
                    // Behind by more than a second: start again from now
                    // rather than in a burst.
                    if now.saturating_duration_since(next) > Duration::from_secs(1) {
                        next = now;
                    }
                    thread::sleep(next.saturating_duration_since(now));
                }
                for mut child in alive {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                started
            })
        };
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or(0)
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A loop starting short-lived processes, one every [`CHURN_PERIOD`], in
/// turn, each waited for (killed after [`CHURN_DEADLINE`]).
struct Churn {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
    started: Instant,
}

impl Churn {
    fn start(mut commands: Vec<Command>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut started = 0u64;
                let mut next = Instant::now();
                for index in (0..commands.len()).cycle() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let command = commands[index]
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null());
                    if let Ok(mut child) = Guard::spawn(command) {
                        started += 1;
                        let deadline = Instant::now() + CHURN_DEADLINE;
                        while !child.exited() && Instant::now() < deadline {
                            thread::sleep(Duration::from_millis(5));
                        }
                    }
                    next += CHURN_PERIOD;
                    thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                started
            })
        };
        Self {
            stop,
            thread: Some(thread),
            started: Instant::now(),
        }
    }

    fn stop(mut self) -> (u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        let started = self
            .thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or(0);
        (started, self.started.elapsed().as_secs_f64())
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
