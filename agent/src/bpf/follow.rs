//! Following the processes a filtered process starts: the `follow_fork`
//! program on the `task_newtask` raw tracepoint adds each child to the PID
//! filter before it runs. A raw tracepoint needs no tracefs; it hands the
//! program the new `task_struct`, whose `tgid` sits where the kernel's BTF
//! says, so the offset is looked up here and written into the program's
//! settings before it is loaded.

use std::path::Path;

use aya::{Ebpf, programs::RawTracePoint};
use tracing::{debug, warn};

use super::{btf, load_logged, program_error, program_mut};
use agent_common::names;

/// The kernel's raw tracepoint `follow_fork` runs on: `(struct task_struct
/// *task, u64 clone_flags)`, in the parent, once the child has its ids.
const TRACEPOINT: &str = "task_newtask";

/// Where `follow_fork` reads a new task's tgid, or `None` (said once) when
/// the kernel's BTF does not tell: then no child is followed.
pub(super) fn tgid_offset() -> Option<u32> {
    match btf::task_tgid_offset(Path::new(btf::VMLINUX_BTF)) {
        Ok(offset) => Some(offset),
        Err(error) => {
            unavailable(&crate::logging::error_chain(&error));
            None
        }
    }
}

/// Attaches `follow_fork`; true when children are followed. Without it
/// only the given processes are sampled, which is said once and is no
/// reason to stop.
pub(super) fn attach(ebpf: &mut Ebpf) -> bool {
    match try_attach(ebpf) {
        Ok(()) => {
            debug!("children of the profiled processes are followed");
            true
        }
        Err(reason) => {
            unavailable(&reason);
            false
        }
    }
}

fn unavailable(reason: &str) {
    warn!(
        %reason,
        "processes started by the profiled ones will not be profiled"
    );
}

fn try_attach(ebpf: &mut Ebpf) -> Result<(), String> {
    let name = names::PROG_FORK;
    let chain = |error: super::BpfError| crate::logging::error_chain(&error);
    let program: &mut RawTracePoint = program_mut(ebpf, name).map_err(chain)?;
    load_logged(program, name, RawTracePoint::load, RawTracePoint::info).map_err(chain)?;
    program
        .attach(TRACEPOINT)
        .map_err(|source| chain(program_error(name, source)))?;
    Ok(())
}
