//! The binary's commands: orchestration over the library's stages.

pub mod agent;
pub mod record;
pub mod report;
pub mod top;

use firn::{bpf::BpfCounters, host::Host, stats::StatsSnapshot};

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

/// Why `--pid PID` cannot match anything: no such process, or a thread
/// (the kernel filter matches processes). None when it is a process.
pub fn pid_problem(host: &Host, pid: u32) -> Option<String> {
    let status = match host.process_status(pid) {
        Ok(status) => status,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!("no process has the pid {pid} (--pid)"));
        }
        // Unreadable (hidepid=): let the BPF filter decide.
        Err(_) => return None,
    };
    let tgid = agent_proc::status::tgid(&status)?;
    (tgid != pid).then(|| format!("{pid} is a thread of process {tgid}: --pid takes process ids"))
}

pub fn unknown_frames(stats: &StatsSnapshot) -> u64 {
    stats.user_frames_unknown + stats.user_frames_unsymbolized + stats.kernel_frames_unsymbolized
}
