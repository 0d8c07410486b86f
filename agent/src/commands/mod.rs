//! The binary's commands: orchestration over the library's stages.

pub mod agent;
pub mod record;

use firn::{bpf::BpfCounters, stats::StatsSnapshot};

/// Period of the sampling clock in nanoseconds.
pub fn period_ns(frequency_hz: u64) -> i64 {
    i64::try_from(1_000_000_000 / frequency_hz.max(1)).unwrap_or(i64::MAX)
}

/// Everything lost or unknown in an interval, for the summary line.
pub fn lost_samples(bpf: &BpfCounters) -> u64 {
    use agent_common::Counter;
    bpf.get(Counter::SamplesLostRingFull) + bpf.get(Counter::ScratchUnavailable)
}

/// Stack walks the BPF program could not do (kernel or user).
pub fn stack_failures(bpf: &BpfCounters) -> u64 {
    use agent_common::Counter;
    bpf.get(Counter::KernelStackFailed) + bpf.get(Counter::UserStackFailed)
}

pub fn unknown_frames(stats: &StatsSnapshot) -> u64 {
    stats.user_frames_unknown + stats.user_frames_unsymbolized + stats.kernel_frames_unsymbolized
}
