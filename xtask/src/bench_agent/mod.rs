//! `cargo xtask bench --agent`: where firn's own cost goes when it runs as
//! an agent. Per workload (`fp`, `dwarf`, `mixed`) and frequency, a fresh
//! Parca server, the workload on every CPU, then firn (release build)
//! pushing to that server with debug information upload on; once a second
//! its memory and CPU from `/proc`, every 10 s its counters from
//! `/metrics` (`soak::monitor`). Prints the ready time, CPU per sample over the first
//! minute and the steady state after it, split by stage (the BPF program's
//! run time, `firn_cpu_seconds_total{stage}`), peak and steady RSS, losses
//! and truncated stacks, and the targets met or missed. `--deep`: the share
//! of complete stacks of a recursive program at several depths (`deep`).
//! Prints figures; asserts nothing.

mod deep;
mod measure;
mod report;
mod workloads;

use std::{
    fs,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub use self::workloads::AgentWorkload;
use self::{measure::Measurement, workloads::Prepared};
use crate::{
    bench::BenchArgs,
    soak::{
        fixtures::{Firn, Parca, free_port},
        monitor::Monitor,
    },
    util::{self, cargo, is_root},
};

/// Which of the shared bench flags were given on the command line (their
/// defaults are the classic bench's, not this one's).
pub struct Given {
    pub frequency: bool,
    pub seconds: bool,
}

/// The frequencies the agent bench runs at unless `--frequency` picks one:
/// 1000 Hz against 100 Hz separates what each sample costs from what each
/// interval costs.
const FREQUENCIES: [u64; 2] = [100, 1000];
/// The default run: the first minute and 30 s of steady state.
const DEFAULT_SECONDS: u64 = 90;
/// `/metrics` is read this often (memory and CPU from `/proc` every
/// second): Prometheus scrapes every 15–60 s, and a scrape a second would
/// add its ~0.3 ms to firn's CPU in every window. The first window's end
/// (60 s) and the default run's (90 s) fall on a scrape.
const SCRAPE_EVERY_SECONDS: u32 = 10;
/// The first window ends here; the steady window is what follows.
pub const FIRST_WINDOW_SECONDS: f64 = 60.0;

/// One firn binary under test and how the tables call it.
pub struct Binary {
    pub path: PathBuf,
    pub name: String,
}

/// What runs, as the flags chose it.
struct Plan {
    workloads: Vec<AgentWorkload>,
    frequencies: Vec<u64>,
    seconds: u64,
    deep: bool,
    binaries: Vec<Binary>,
    exec_rate: Option<u32>,
}

impl Plan {
    fn new(root: &Path, args: &BenchArgs, given: &Given) -> Result<Self> {
        let only_deep = args.deep && !args.agent;
        let workloads = match (args.workloads.is_empty(), only_deep) {
            (_, true) => Vec::new(),
            (true, false) => AgentWorkload::ALL.to_vec(),
            (false, false) => args.workloads.clone(),
        };
        let frequencies = match given.frequency {
            true => vec![args.frequency],
            false => FREQUENCIES.to_vec(),
        };
        let seconds = match given.seconds {
            true => args.seconds,
            false => DEFAULT_SECONDS,
        };
        if seconds == 0 || frequencies.contains(&0) {
            bail!("--seconds and --frequency must be at least 1");
        }
        let mut binaries = vec![Binary {
            path: root.join("target/release/firn"),
            name: "this tree".to_owned(),
        }];
        for path in &args.firns {
            let path = fs::canonicalize(path)
                .with_context(|| format!("--firn {}: no such file", path.display()))?;
            binaries.push(Binary {
                name: path.display().to_string(),
                path,
            });
        }
        Ok(Self {
            workloads,
            frequencies,
            seconds,
            // The default run ends with the deep-stack case.
            deep: args.deep || args.workloads.is_empty(),
            binaries,
            exec_rate: args.exec_rate,
        })
    }
}

pub fn run(root: &Path, args: &BenchArgs, given: Given) -> Result<()> {
    if !is_root() {
        bail!("the agent bench loads BPF programs and samples every CPU: run it as root");
    }
    let plan = Plan::new(root, args, &given)?;
    util::run(cargo(root).args(["build", "--release", "--package", "firn"]))?;
    let work = root.join("target/bench/agent");
    fs::create_dir_all(&work)?;
    let prepared = Prepared::new(root, &work, &plan.workloads)?;
    for &workload in &plan.workloads {
        for &frequency in &plan.frequencies {
            let mut results = Vec::new();
            for binary in &plan.binaries {
                eprintln!(
                    "bench --agent: {} at {frequency} Hz, {} s, {}",
                    workload.name(),
                    plan.seconds,
                    binary.name
                );
                let cell = Cell {
                    workload,
                    frequency,
                    seconds: plan.seconds,
                    exec_rate: plan.exec_rate,
                };
                results.push(measure_one(&prepared, &work, &cell, binary)?);
            }
            let cell = Cell {
                workload,
                frequency,
                seconds: plan.seconds,
                exec_rate: plan.exec_rate,
            };
            report::print_cell(&cell, &plan.binaries, &results);
        }
    }
    if plan.deep {
        deep::run(&work, &plan.binaries)?;
    }
    Ok(())
}

/// One workload at one frequency.
#[derive(Clone, Copy)]
pub struct Cell {
    pub workload: AgentWorkload,
    pub frequency: u64,
    pub seconds: u64,
    /// `--exec-rate`: extra short processes a second on the mixed host.
    pub exec_rate: Option<u32>,
}

/// A fresh Parca, the workload, then firn for `cell.seconds`, watched.
fn measure_one(
    prepared: &Prepared,
    work: &Path,
    cell: &Cell,
    binary: &Binary,
) -> Result<Measurement> {
    let scratch = Scratch::new(&work.join("run"))?;
    let mut parca = Parca::new(&scratch.dir.join("parca"), free_port()?)?;
    parca.start()?;
    // Longer than the run: the guard kills it when the run is over.
    let running = prepared.start(cell.workload, cell.seconds + 120, cell.exec_rate)?;
    let args = vec![
        "--remote-store-address".to_owned(),
        parca.address(),
        "--remote-store-insecure".to_owned(),
        "--frequency".to_owned(),
        cell.frequency.to_string(),
    ];
    let mut firn = Firn::start(&binary.path, &scratch.dir.join("firn"), &args)?;
    let monitor = Monitor::start_scraping_every(firn.pid(), firn.metrics, SCRAPE_EVERY_SECONDS);
    // Past the last whole second, so the look due at the end (a scrape
    // when `seconds` is a multiple of the scrape period) is taken.
    let deadline = monitor.started + Duration::from_secs(cell.seconds) + Duration::from_millis(500);
    while Instant::now() < deadline {
        if firn.exited() {
            bail!(
                "firn exited during the run:\n{}",
                fs::read_to_string(&firn.log).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
    let series = monitor.finish();
    let ready_seconds = firn.ready_seconds;
    let exit = firn.terminate();
    let churn = running.finish();
    parca.stop();
    let mut measurement = Measurement::from_series(&series, ready_seconds);
    measurement.exit = exit.describe();
    measurement.churn = churn;
    Ok(measurement)
}

/// A directory for one run's files (Parca's data, firn's log), removed
/// when dropped.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(dir: &Path) -> Result<Self> {
        if dir.exists() {
            fs::remove_dir_all(dir)
                .with_context(|| format!("could not clear {}", dir.display()))?;
        }
        fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
