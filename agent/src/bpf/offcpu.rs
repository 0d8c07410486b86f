//! Attaching the off-CPU programs (`agent-ebpf/src/offcpu.rs`), only when
//! off-CPU profiling is on: `offcpu_syscall_exit` on the `sys_exit` raw
//! tracepoint with its interpreter walker, `offcpu_wakeup` on
//! `sched_wakeup`, then `offcpu_switch` on `sched_switch`. The ends of a
//! wait go first, so no wait is stored with nothing there to end it.

use std::{path::Path, time::Duration};

use agent_common::{BpfConfig, names};
use aya::{Ebpf, maps::ProgramArray, programs::RawTracePoint};
use tracing::debug;

use super::{BpfError, btf, load_logged, program_error, program_mut};

/// Longest period the BPF side's arithmetic allows (the draw multiplies a
/// 32-bit random number by it in 64 bits).
pub(crate) const MAX_PERIOD: Duration = Duration::from_secs(4);

/// The period in nanoseconds as the BPF program takes it: at least 1, at
/// most [`MAX_PERIOD`] (the command line checks the bounds; this keeps
/// the program's arithmetic sound whatever it is handed).
pub(super) fn period_ns(period: Duration) -> u64 {
    u64::try_from(period.min(MAX_PERIOD).as_nanos())
        .unwrap_or(1)
        .max(1)
}

/// `config` with where `offcpu_wakeup` reads the id of the task woken,
/// when off-CPU profiling is on.
pub(super) fn with_pid_offset(mut config: BpfConfig) -> Result<BpfConfig, BpfError> {
    if config.off_cpu_period_ns != 0 {
        config.task_pid_offset = btf::task_pid_offset(Path::new(btf::VMLINUX_BTF))
            .map_err(|source| BpfError::OffCpuBtf { source })?;
    }
    Ok(config)
}

pub(super) fn attach(ebpf: &mut Ebpf) -> Result<(), BpfError> {
    let mut walkers = Vec::new();
    for name in names::PROG_OFFCPU_WALKERS {
        let walker: &mut RawTracePoint = program_mut(ebpf, name)?;
        load_logged(walker, name, RawTracePoint::load, RawTracePoint::info)?;
        walkers.push(
            walker
                .fd()
                .and_then(|fd| fd.try_clone().map_err(aya::programs::ProgramError::IOError))
                .map_err(|source| program_error(name, source))?,
        );
    }
    let map_name = names::OFFCPU_TAIL_CALLS;
    let map_error = |source| BpfError::Map {
        name: map_name,
        source,
    };
    let mut calls = ProgramArray::try_from(ebpf.map_mut(map_name).ok_or(BpfError::Missing {
        kind: "map",
        name: map_name,
    })?)
    .map_err(map_error)?;
    // The walkers are in `InterpreterKind` order: each one's index.
    for (kind, walker) in (0u32..).zip(&walkers) {
        calls.set(kind, walker, 0).map_err(map_error)?;
    }

    for (name, tracepoint) in [
        (names::PROG_OFFCPU_SYSCALL_EXIT, "sys_exit"),
        (names::PROG_OFFCPU_WAKEUP, "sched_wakeup"),
        (names::PROG_OFFCPU_SWITCH, "sched_switch"),
    ] {
        let program: &mut RawTracePoint = program_mut(ebpf, name)?;
        load_logged(program, name, RawTracePoint::load, RawTracePoint::info)?;
        program
            .attach(tracepoint)
            .map_err(|source| program_error(name, source))?;
    }
    debug!("off-CPU programs attached");
    Ok(())
}
