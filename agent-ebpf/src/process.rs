//! Process events: `process_exec` and `process_exit` tell the daemon when
//! an image changes or a process ends, in the ring with the samples, and
//! keep the per-process maps in step; `follow_fork` extends the pid filter
//! to the children of filtered processes.

use agent_common::{COMM_LEN, Counter, ExecutableKey, LOG_TARGET, ProcessRecord, RecordKind};
use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::bpf_ktime_get_ns,
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};

use crate::{
    EVENTS, EXCLUDED, EXEC_PRESETS, PID_FILTER, UNWIND_COPY, config, count, interpreter, maps,
    wakeup_flag, wanted,
};

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(ctx: RawTracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // The new image is judged anew by the daemon.
    let _ = EXCLUDED.remove(&tgid);
    let config = config();
    let executable = if wanted(&config, tgid) {
        maps::executable(&ctx)
    } else {
        None
    };
    // An executable the daemon has decided gets its copy now; any other
    // image is unwound as if it had no frame pointers until the daemon
    // has seen it.
    // SAFETY: `get` is unsafe because the daemon may rewrite the value
    // under the reference; the u32 is copied out at once.
    let preset = executable
        .as_ref()
        .filter(|_| config.exec_copy_bytes != 0)
        .and_then(|executable| unsafe { EXEC_PRESETS.get(executable) }.copied());
    let copy = preset.unwrap_or(config.exec_copy_bytes);
    if copy != 0
        && wanted(&config, tgid)
        && let Err(error) = UNWIND_COPY.insert(&tgid, &copy, 0)
    {
        count(Counter::UnwindCopyMapFull);
        failed!(
            &ctx,
            "new image of tgid {} gets no full stack copy: UNWIND_COPY insert returned {}",
            tgid,
            error
        );
    }
    // The new image is not the interpreter the daemon registered, if any;
    // it may be one of an executable the daemon knows.
    interpreter::forget(tgid);
    if let Some(executable) = &executable {
        interpreter::exec(tgid, executable);
    }
    if wanted(&config, tgid) {
        maps::started(tgid);
    }
    // The executable rides with the event: the daemon's choices per
    // executable need no read of the new image's maps.
    let wake = match preset {
        Some(_) => {
            count(Counter::ExecPresetsApplied);
            Wake::WhenDue
        }
        None => Wake::AtOnce,
    };
    if !process_event(RecordKind::Exec, executable.unwrap_or(NO_EXECUTABLE), wake) {
        failed!(
            &ctx,
            "exec event of tgid {} lost: ring buffer reservation failed",
            tgid
        );
    }
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // sched_process_exit fires per thread; the process ends with its leader.
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == pid_tgid as u32 {
        // Done here rather than by the daemon so that no entry outlives its
        // process even when the exit event is lost.
        let _ = UNWIND_COPY.remove(&tgid);
        interpreter::forget(tgid);
        let _ = EXCLUDED.remove(&tgid);
        let lost = !process_event(RecordKind::Exit, NO_EXECUTABLE, Wake::WhenDue);
        // After the event, which the filter decides on; a later process
        // that reuses the pid is no descendant of anything followed.
        if config().filter_pids != 0 {
            let _ = PID_FILTER.remove(&tgid);
        }
        if lost {
            failed!(
                &ctx,
                "exit event of tgid {} lost: ring buffer reservation failed",
                tgid
            );
        }
    }
    0
}

const CLONE_THREAD: u64 = 0x0001_0000;

/// An event without an executable (an exit, or the offsets unknown).
const NO_EXECUTABLE: ExecutableKey = ExecutableKey {
    inode: 0,
    dev: 0,
    reserved: 0,
};

/// A filtered process starting another: the child is sampled too, from
/// its first instruction (the fork runs in the parent, before the child
/// can be scheduled). On the `task_newtask` raw tracepoint, whose
/// arguments are the new `task_struct` and the clone flags.
#[raw_tracepoint(tracepoint = "task_newtask")]
pub fn follow_fork(ctx: RawTracePointContext) -> u32 {
    let config = config();
    if config.filter_pids == 0 || config.task_tgid_offset == 0 {
        return 0;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: `get` is unsafe because the daemon may rewrite the value
    // under the reference; only the entry's presence is used.
    if unsafe { PID_FILTER.get(&parent) }.is_none() {
        return 0;
    }
    // A new thread belongs to a process that is already in.
    let flags: u64 = ctx.arg(1);
    if flags & CLONE_THREAD != 0 {
        return 0;
    }
    let task: u64 = ctx.arg(0);
    let at = task.wrapping_add(u64::from(config.task_tgid_offset)) as *const i32;
    // One log site for both failures (see `process_event`).
    // SAFETY: the helper reads kernel memory and fails rather than faults;
    // the offset is `task_struct.tgid`'s in the running kernel's BTF.
    let (child, what, error) = match unsafe { bpf_probe_read_kernel(at) } {
        Ok(child) if child > 0 => match PID_FILTER.insert(&(child as u32), &1, 0) {
            Ok(()) => return 0,
            Err(error) => {
                count(Counter::PidFilterFull);
                (child, "PID_FILTER insert", error as i64)
            }
        },
        Ok(_) => return 0,
        Err(error) => (0, "bpf_probe_read_kernel of its tgid", i64::from(error)),
    };
    failed!(
        &ctx,
        "child {} of tgid {} not followed: {} returned {}",
        child,
        parent,
        what,
        error
    );
    0
}

/// Whether a process event wakes the daemon.
enum Wake {
    /// A new image the daemon must look at while it lives: it reads its
    /// maps and registers an interpreter with its walker, before the
    /// image's first samples are taken.
    AtOnce,
    /// With the samples, once enough has accumulated or on the daemon's
    /// timer.
    WhenDue,
}

/// Writes a process event; false when the ring buffer had no room (counted
/// here, logged by the caller: one log site per program keeps the logging
/// code inlined, so the object holds no symbol named after its build path).
#[inline(always)]
fn process_event(kind: RecordKind, executable: ExecutableKey, wake: Wake) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let config = config();
    if !wanted(&config, tgid) {
        return true;
    }
    let Some(mut entry) = EVENTS.reserve::<ProcessRecord>(0) else {
        count(Counter::ProcessEventsLost);
        return false;
    };
    entry.write(ProcessRecord {
        kind: kind as u32,
        tgid,
        // SAFETY: a helper without arguments or preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
        executable,
    });
    let flag = match wake {
        Wake::AtOnce => BPF_RB_FORCE_WAKEUP as u64,
        Wake::WhenDue => wakeup_flag(&config),
    };
    entry.submit(flag);
    true
}
