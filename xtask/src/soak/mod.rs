//! `cargo xtask soak`: firn under faults, as a benchmark. Each scenario
//! starts a fresh firn (release build) next to a busy workload, drives it
//! through phases (warm-up, the fault, recovery), samples its memory, CPU
//! and `/metrics` every second, and prints a table per scenario and one
//! over all of them. Asserts nothing but reports what it saw: RSS over
//! time, CPU per sample, samples lost, profiles sent, dropped and queued,
//! whether delivery resumed after the fault, whether firn stalled, and how
//! long it took to exit on SIGTERM.

pub mod fixtures;
pub mod monitor;
mod report;
mod scenarios;
pub mod workloads;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Result, bail};

use crate::util::{self, cargo, is_root};

#[derive(Clone, clap::Args)]
pub struct SoakArgs {
    /// Multiply every phase's default length by this (0.05 for a run of a
    /// few minutes); profiles are shortened too (10 s x F, at least 2 s).
    #[arg(long, conflicts_with = "minutes")]
    scale: Option<f64>,
    /// The length of each scenario's fault phase in minutes, the other
    /// phases in proportion (e.g. `--minutes 30 --scenario big-binary` for
    /// the full-length run).
    #[arg(long)]
    minutes: Option<f64>,
    /// Run only this scenario (repeatable); all of them by default.
    #[arg(long = "scenario", value_enum)]
    scenarios: Vec<Scenario>,
    /// Execs per second the churn scenario aims at.
    #[arg(long, default_value_t = 400)]
    exec_rate: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Exec churn (at least 300 execs/s) for 10 minutes, pushing to Parca.
    Churn,
    /// The Parca server stopped for 5 minutes, then started again.
    ServerDown,
    /// The Parca server SIGKILLed and restarted.
    ServerKill,
    /// A server that accepts and never answers for 5 minutes, then Parca
    /// on the same port.
    Blackhole,
    /// The local store on a full tmpfs for 5 minutes, then space again.
    StoreFull,
    /// A container with an absolute symlink, then a FIFO, where firn looks
    /// for debug files and perf maps.
    HostileFiles,
    /// A binary of over 200 MB busy while the server is down for 10
    /// minutes, then the server back (and the binary uploaded).
    BigBinary,
}

impl Scenario {
    const ALL: [Scenario; 7] = [
        Scenario::Churn,
        Scenario::ServerDown,
        Scenario::ServerKill,
        Scenario::Blackhole,
        Scenario::StoreFull,
        Scenario::HostileFiles,
        Scenario::BigBinary,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Churn => "churn",
            Scenario::ServerDown => "server-down",
            Scenario::ServerKill => "server-kill",
            Scenario::Blackhole => "blackhole",
            Scenario::StoreFull => "store-full",
            Scenario::HostileFiles => "hostile-files",
            Scenario::BigBinary => "big-binary",
        }
    }
}

/// What every scenario needs.
pub struct Ctx {
    pub root: PathBuf,
    pub work: PathBuf,
    pub cache: PathBuf,
    pub firn: PathBuf,
    pub chain: PathBuf,
    pub exec_rate: u32,
    scale: Option<f64>,
    minutes: Option<f64>,
}

impl Ctx {
    /// A phase whose full length is `seconds`, in a scenario whose fault
    /// phase is `fault_seconds` long at full length.
    pub fn phase(&self, seconds: f64, fault_seconds: f64) -> Duration {
        let factor = match (self.scale, self.minutes) {
            (_, Some(minutes)) => minutes * 60.0 / fault_seconds,
            (Some(scale), None) => scale,
            (None, None) => 1.0,
        };
        Duration::from_secs_f64((seconds * factor).max(1.0))
    }

    /// `--profiling-duration`, in seconds.
    pub fn profile_seconds(&self) -> u64 {
        match self.scale {
            Some(scale) if self.minutes.is_none() => ((10.0 * scale).round() as u64).clamp(2, 10),
            _ => 10,
        }
    }

    pub fn dir(&self, scenario: Scenario) -> PathBuf {
        self.work.join(scenario.name())
    }
}

pub fn run(root: &Path, args: &SoakArgs) -> Result<()> {
    if !is_root() {
        bail!("the soak loads BPF programs, mounts a tmpfs and makes namespaces: run it as root");
    }
    if args.scale.is_some_and(|s| s <= 0.0) || args.minutes.is_some_and(|m| m <= 0.0) {
        bail!("--scale and --minutes must be positive");
    }
    util::run(cargo(root).args(["build", "--release", "--package", "firn"]))?;
    let work = root.join("target/soak");
    std::fs::create_dir_all(&work)?;
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let ctx = Ctx {
        root: root.to_path_buf(),
        chain: workloads::chain(root, &work)?,
        work,
        cache: home.join(".cache/firn/soak"),
        firn: root.join("target/release/firn"),
        exec_rate: args.exec_rate,
        scale: args.scale,
        minutes: args.minutes,
    };
    let selected = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios.clone()
    };
    let mut outcomes = Vec::new();
    for scenario in selected {
        eprintln!("soak: scenario {}", scenario.name());
        match scenarios::run(&ctx, scenario) {
            Ok(outcome) => {
                report::print_scenario(&outcome);
                outcomes.push(outcome);
            }
            Err(error) => {
                eprintln!(
                    "soak: scenario {} could not run: {error:#}",
                    scenario.name()
                );
                outcomes.push(report::Outcome::failed(scenario, format!("{error:#}")));
            }
        }
    }
    report::print_summary(&outcomes);
    Ok(())
}
