//! The BPF side's counters and the sampling program's run time, read by
//! the daemon and, through [`BpfProbe`], by the metrics endpoint.

use std::os::fd::{AsRawFd, OwnedFd};

use agent_common::Counter;
use aya::maps::{MapData, PerCpuArray};
use tracing::{debug, warn};

use crate::host::Host;

/// Totals of the BPF-side counters over all CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpfCounters {
    pub values: [u64; Counter::COUNT as usize],
}

impl Default for BpfCounters {
    fn default() -> Self {
        Self {
            values: [0; Counter::COUNT as usize],
        }
    }
}

impl BpfCounters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.values[counter as usize]
    }

    /// What happened since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        let mut values = self.values;
        for (value, old) in values.iter_mut().zip(earlier.values) {
            *value = value.saturating_sub(old);
        }
        Self { values }
    }
}

/// Run time of the sampling program, from the kernel's BPF statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramRunTime {
    pub run_time_ns: u64,
    pub run_count: u64,
}

/// Read-only access to the BPF side for the metrics endpoint.
pub struct BpfProbe {
    pub(super) counters: PerCpuArray<MapData, u64>,
    /// The sampling program.
    pub(super) program: OwnedFd,
    /// Whether firn turned the kernel's run-time statistics on (which
    /// needs CAP_SYS_ADMIN); else only `kernel.bpf_stats_enabled` does.
    pub(super) stats_held: bool,
}

impl std::fmt::Debug for BpfProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpfProbe")
            .field("stats_held", &self.stats_held)
            .finish_non_exhaustive()
    }
}

impl BpfProbe {
    pub fn counters(&self) -> BpfCounters {
        read_counters(&self.counters)
    }

    /// The sampling program's run time so far, from the kernel's fdinfo of
    /// the program (the same figures `bpf_prog_info` holds); `None` while
    /// the kernel does not account it.
    pub fn run_time(&self) -> Option<ProgramRunTime> {
        let accounted = self.stats_held || Host::system().bpf_stats_enabled();
        if !accounted {
            return None;
        }
        let fd = self.program.as_raw_fd();
        let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
        parse_run_time(&fdinfo)
    }
}

pub(super) fn parse_run_time(fdinfo: &str) -> Option<ProgramRunTime> {
    let field = |name: &str| {
        fdinfo
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse::<u64>().ok())
    };
    Some(ProgramRunTime {
        run_time_ns: field("run_time_ns")?,
        run_count: field("run_cnt")?,
    })
}

pub(super) fn read_counters(map: &PerCpuArray<MapData, u64>) -> BpfCounters {
    let mut totals = BpfCounters::default();
    for counter in Counter::ALL {
        match map.get(&(counter as u32), 0) {
            Ok(per_cpu) => {
                totals.values[counter as usize] = per_cpu.iter().copied().sum();
            }
            Err(error) => warn!(?counter, %error, "could not read a BPF counter"),
        }
    }
    totals
}

/// Turns the kernel's BPF run-time statistics on while the descriptor is
/// held, when it lets firn.
pub(super) fn run_time_stats() -> Option<OwnedFd> {
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(error) => {
            debug!(%error, "BPF run-time statistics unavailable");
            None
        }
    }
}
