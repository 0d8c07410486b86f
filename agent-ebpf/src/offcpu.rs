//! Off-CPU sampling: where threads of profiled processes wait, weighted by
//! how long. Loaded and attached only when the daemon turns it on
//! (`CONFIG.off_cpu_period_ns` non-zero); off, nothing here runs.
//!
//! Only raw tracepoints, which every kernel with BPF has (kprobes and BPF
//! trampolines on scheduler functions are often compiled out or refused):
//!
//! - `offcpu_switch` on `sched_switch`, in the context of the task leaving
//!   the CPU (`prev`). A task that leaves runnable (preempted, yielding)
//!   is not waiting. One that leaves asleep inside a system call of a
//!   profiled process gets an entry in `OFFCPU_THREADS`: the time, its
//!   state, the system call and user stack pointer, and its kernel stack
//!   (walked into `OFFCPU_KSTACKS`, where equal stacks are stored once).
//! - `offcpu_wakeup` on `sched_wakeup`, in the waker's context: the task
//!   woken is runnable again. When it has an entry, its wait has just
//!   ended and its length `d` is known, so this is where it is kept or
//!   not. The wait is the time the thread could not run; the time from
//!   its wakeup until it runs is the scheduler's (run queue) latency, left
//!   out, as are preemptions.
//! - `offcpu_syscall_exit` on `sys_exit`, in the context of the thread
//!   that waited, when its system call returns: its user stack, registers
//!   and interpreter frames are still exactly those it left the CPU with
//!   (no user code ran since), so a kept wait is written here, with the
//!   user side taken now and the kernel side stored at the switch-out.
//!   The system call and the stack pointer must match those stored, so a
//!   sample is never written with another call's stack.
//!
//! Which waits are kept (see `agent_common::OffCpuInfo`): a wait of length
//! `d` stands for `floor(d / T)` periods of `T` plus one with probability
//! `(d mod T) / T`. The expectation of the periods times `T` is `d`
//! exactly, so totals per stack estimate the time waited there without
//! bias, whatever the mix of short and long waits (keeping a wait with
//! probability `1 - e^(-d/T)` and weighting it `T` would not: its
//! expectation `T (1 - e^(-d/T))` falls short of `d` for waits near `T`
//! or longer). Several waits in one system call add up into one sample. A
//! thread yields at most (time waited) / `T` samples, however often it
//! switches.
//!
//! Waits outside system calls (a page fault waiting on the disk) have no
//! return to catch in the thread's context and are counted, not sampled.

use core::{
    mem::size_of,
    ptr::{addr_of, addr_of_mut},
};

use agent_common::{
    Counter, InterpreterKind, MAX_OFFCPU_THREADS, MAX_STACK_DEPTH, OffCpuInfo, RecordKind,
    SampleScratch, stacks_off, tail_calls,
};
use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_task_btf, bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_get_stack,
            bpf_ktime_get_ns, bpf_task_pt_regs,
        },
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, ProgramArray},
    programs::RawTracePointContext,
};

use crate::{
    config, count,
    sample::{KernelStack, record_sample, walk_interpreter},
    wanted,
};

/// Frames of the tracepoint's own machinery at the top of a kernel stack
/// walked from `sched_switch` (this program and `bpf_trace_run4`),
/// skipped: the stack starts at `__schedule`.
const TRACEPOINT_FRAMES: u64 = 2;

/// `TASK_DEAD`: the task's last switch-out; it never comes back.
const TASK_DEAD: u32 = 0x80;

/// A thread of a profiled process in a system call that has waited, by
/// thread id.
#[derive(Clone, Copy)]
#[repr(C)]
struct Waiting {
    /// `bpf_ktime_get_ns` at the switch-out; zero while it runs again.
    since_ns: u64,
    /// Periods kept so far in this system call.
    periods: u64,
    /// Time waited so far in this system call.
    blocked_ns: u64,
    /// The user stack pointer saved on entry to the system call.
    user_sp: u64,
    /// The bytes of the last wait's kernel stack in `kernel`, or the error
    /// of its walk (negative).
    kernel_bytes: i64,
    /// `prev_state` at the last switch-out.
    state: u32,
    /// The system call (`orig_ax`).
    syscall: i32,
    /// The last wait's kernel stack, innermost first.
    kernel: [u64; MAX_STACK_DEPTH],
}

/// Threads in a system call that have waited, bounded; not preallocated,
/// so memory follows the threads waiting now rather than the bound. An
/// entry goes when its wait is not kept or its system call returns; a
/// thread that waits until firn stops holds its entry until then.
#[map]
static OFFCPU_THREADS: HashMap<u32, Waiting> =
    HashMap::with_max_entries(MAX_OFFCPU_THREADS, BPF_F_NO_PREALLOC);

/// Where a new entry of `OFFCPU_THREADS` is put together (larger than the
/// BPF stack) before it is inserted.
#[map]
static OFFCPU_NEW: PerCpuArray<Waiting> = PerCpuArray::with_max_entries(1, 0);

/// Where off-CPU samples are assembled, one slot per CPU as `SCRATCH`: a
/// map of its own, because a CPU sample can interrupt `sys_exit`.
#[map]
static OFFCPU_SCRATCH: Array<SampleScratch> = Array::with_max_entries(1, 0);

/// The interpreter walker of the raw tracepoint type
/// (`offcpu_python_walk`, `offcpu_ruby_walk`): a program array holds
/// programs of one type.
#[map]
static OFFCPU_TAIL_CALLS: ProgramArray = ProgramArray::with_max_entries(tail_calls::COUNT, 0);

/// `orig_ax` to `sp` of `pt_regs`, in order.
#[repr(C)]
#[derive(Clone, Copy)]
struct SyscallRegs {
    orig_ax: u64,
    ip: u64,
    cs: u64,
    flags: u64,
    sp: u64,
}

/// The system call and user stack pointer in saved user registers, or
/// `None` when they are not a user task's (a kernel thread, an io_uring
/// worker) or it is in no system call.
#[inline(always)]
fn syscall_in(regs: *const pt_regs) -> Option<(i32, u64)> {
    if regs.is_null() {
        return None;
    }
    // SAFETY: the helper checks the address and fails rather than faults.
    let at = unsafe { addr_of!((*regs).orig_rax) } as *const SyscallRegs;
    let saved = unsafe { bpf_probe_read_kernel(at) }.ok()?;
    let syscall = saved.orig_ax as i64;
    if saved.cs & 3 != 3 || syscall < 0 {
        return None;
    }
    Some((syscall as i32, saved.sp))
}

#[inline(always)]
fn current_syscall() -> Option<(i32, u64)> {
    // SAFETY: a helper without arguments; it returns the running task.
    let task = unsafe { bpf_get_current_task_btf() };
    if task.is_null() {
        return None;
    }
    // SAFETY: the non-null task pointer the helper above gave.
    syscall_in(unsafe { bpf_task_pt_regs(task) } as *const pt_regs)
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct
/// task_struct *next, unsigned int prev_state)`, in `prev`'s context.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn offcpu_switch(ctx: RawTracePointContext) -> u32 {
    let config = config();
    let period_ns = config.off_cpu_period_ns;
    if period_ns == 0 {
        return 0;
    }
    let preempt: u64 = ctx.arg(0);
    let state = ctx.arg::<u64>(3) as u32;
    // Preempted or yielding: runnable, not waiting.
    if preempt & 0xff != 0 || state == 0 || state & TASK_DEAD != 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == 0 || !wanted(&config, tgid) {
        return 0;
    }
    let Some((syscall, user_sp)) = current_syscall() else {
        count(Counter::OffCpuOutsideSyscall);
        return 0;
    };
    let kernel_on = config.stacks_off & stacks_off::KERNEL == 0;
    // SAFETY: a helper without arguments or preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let tid = pid_tgid as u32;
    // A later wait in the same system call adds to what is kept of the
    // earlier ones.
    if let Some(entry) = OFFCPU_THREADS.get_ptr_mut(&tid) {
        // SAFETY: this thread's entry; only programs running as or
        // switching this thread touch it, one at a time.
        let entry = unsafe { &mut *entry };
        if entry.syscall == syscall && entry.user_sp == user_sp {
            entry.since_ns = now;
            entry.state = state;
            // SAFETY: the entry is valid and `ctx` is this run's.
            entry.kernel_bytes = unsafe { walk_kernel(&ctx, kernel_on, entry) };
            count(Counter::OffCpuWaits);
            return 0;
        }
    }
    let Some(new) = OFFCPU_NEW.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot, used only here with interrupts off.
    let new = unsafe { &mut *new };
    new.since_ns = now;
    new.periods = 0;
    new.blocked_ns = 0;
    new.user_sp = user_sp;
    new.state = state;
    new.syscall = syscall;
    // SAFETY: as above.
    new.kernel_bytes = unsafe { walk_kernel(&ctx, kernel_on, new) };
    match OFFCPU_THREADS.insert(&tid, new, 0) {
        Ok(()) => count(Counter::OffCpuWaits),
        Err(_) => count(Counter::OffCpuMapFull),
    }
    0
}

/// Walks the current kernel stack into `waiting.kernel`; its bytes, or
/// the walk's error, or -1 when kernel stacks are off.
///
/// # Safety
///
/// `ctx` is this run's context.
#[inline(always)]
unsafe fn walk_kernel(ctx: &RawTracePointContext, on: bool, waiting: &mut Waiting) -> i64 {
    if !on {
        return -1;
    }
    let bytes = (MAX_STACK_DEPTH * size_of::<u64>()) as u32;
    // SAFETY: the destination is the entry's stack array, `bytes` long.
    unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            addr_of_mut!(waiting.kernel).cast(),
            bytes,
            TRACEPOINT_FRAMES,
        )
    }
}

/// `sched_wakeup(struct task_struct *p)`, in the waker's context: `p` is
/// runnable again, so its wait has ended; when it is followed, the wait
/// is kept as some periods, or not at all. The time from here until it
/// runs is the scheduler's latency, not a wait of the thread's.
#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn offcpu_wakeup(ctx: RawTracePointContext) -> u32 {
    let config = config();
    let period_ns = config.off_cpu_period_ns;
    if period_ns == 0 || config.task_pid_offset == 0 {
        return 0;
    }
    let task: u64 = ctx.arg(0);
    let at = task.wrapping_add(u64::from(config.task_pid_offset)) as *const i32;
    // SAFETY: the helper reads kernel memory and fails rather than
    // faults; the offset is `task_struct.pid`'s in the running kernel.
    if let Ok(tid) = unsafe { bpf_probe_read_kernel(at) } {
        woken(tid as u32, period_ns);
    }
    0
}

#[inline(always)]
fn woken(tid: u32, period_ns: u64) {
    let Some(entry) = OFFCPU_THREADS.get_ptr_mut(&tid) else {
        return;
    };
    // SAFETY: as in `offcpu_switch`.
    let entry = unsafe { &mut *entry };
    if entry.since_ns == 0 {
        return;
    }
    // SAFETY (these two): helpers without arguments or preconditions.
    let blocked_ns = unsafe { bpf_ktime_get_ns() }.saturating_sub(entry.since_ns);
    let periods = periods_kept(blocked_ns, period_ns, unsafe { bpf_get_prandom_u32() });
    entry.since_ns = 0;
    if periods == 0 {
        count(Counter::OffCpuNotKept);
        if entry.periods == 0 {
            let _ = OFFCPU_THREADS.remove(&tid);
        }
        return;
    }
    entry.periods += periods;
    entry.blocked_ns += blocked_ns;
}

/// How many periods of `period_ns` a wait of `blocked_ns` is kept as:
/// the whole periods in it, plus one with probability (remainder /
/// period), from `random` (uniform over u32). Exact up to the 2^-32
/// resolution of the draw.
#[inline(always)]
fn periods_kept(blocked_ns: u64, period_ns: u64, random: u32) -> u64 {
    let whole = blocked_ns / period_ns;
    let rest = blocked_ns - whole * period_ns;
    // random / 2^32 < rest / period, without division; the product fits
    // in 64 bits for any period below 2^32 ns (the daemon's bound).
    let extra = ((u64::from(random) * period_ns) >> 32) < rest;
    whole + u64::from(extra)
}

/// `sys_exit(struct pt_regs *regs, long ret)`, in the context of the
/// thread whose system call returns.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn offcpu_syscall_exit(ctx: RawTracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(entry) = OFFCPU_THREADS.get_ptr(&tid) else {
        return 0;
    };
    // SAFETY: this thread's entry (see `offcpu_switch`); it stays until
    // removed at the end of this run. The fields are copied out; the
    // kernel stack is copied from the entry into the sample.
    let waiting = unsafe { (*entry).header() };
    if waiting.periods == 0 {
        let _ = OFFCPU_THREADS.remove(&tid);
        return 0;
    }
    let regs: u64 = ctx.arg(0);
    match syscall_in(regs as *const pt_regs) {
        Some((syscall, sp)) if syscall == waiting.syscall && sp == waiting.user_sp => {}
        _ => {
            count(Counter::OffCpuStale);
            let _ = OFFCPU_THREADS.remove(&tid);
            return 0;
        }
    }
    // SAFETY: a helper without arguments or preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(scratch) = OFFCPU_SCRATCH.get_ptr_mut(cpu) else {
        count(Counter::ScratchUnavailable);
        let _ = OFFCPU_THREADS.remove(&tid);
        return 0;
    };
    let info = OffCpuInfo {
        periods: waiting.periods,
        blocked_ns: waiting.blocked_ns,
        state: waiting.state,
        syscall: waiting.syscall,
    };
    // SAFETY: `ctx` is this run's context, whose registers are not the
    // thread's (null: the saved user registers are used). `scratch` is
    // this CPU's slot of OFFCPU_SCRATCH, used only by this program and its
    // walker; the kernel does not nest a raw tracepoint program in itself
    // on one CPU, so the slot is ours until this chain returns.
    unsafe {
        record_sample(
            &ctx,
            core::ptr::null(),
            &OFFCPU_TAIL_CALLS,
            &config(),
            scratch as *mut SampleScratch,
            ((pid_tgid >> 32) as u32, tid),
            RecordKind::OffCpu,
            info,
            KernelStack::Stored(waiting.kernel_bytes, addr_of!((*entry).kernel).cast()),
        )
    };
    let _ = OFFCPU_THREADS.remove(&tid);
    0
}

/// `python_walk` for off-CPU samples; tail-called only, never attached.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn offcpu_python_walk(ctx: RawTracePointContext) -> u32 {
    walk_interpreter::<{ InterpreterKind::Python as u32 }, _>(
        &ctx,
        &OFFCPU_TAIL_CALLS,
        &OFFCPU_SCRATCH,
    )
}

/// `ruby_walk` for off-CPU samples; tail-called only, never attached.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn offcpu_ruby_walk(ctx: RawTracePointContext) -> u32 {
    walk_interpreter::<{ InterpreterKind::Ruby as u32 }, _>(
        &ctx,
        &OFFCPU_TAIL_CALLS,
        &OFFCPU_SCRATCH,
    )
}

impl Waiting {
    /// The fields but the stack.
    #[inline(always)]
    fn header(&self) -> Header {
        Header {
            periods: self.periods,
            blocked_ns: self.blocked_ns,
            user_sp: self.user_sp,
            kernel_bytes: self.kernel_bytes,
            state: self.state,
            syscall: self.syscall,
        }
    }
}

#[derive(Clone, Copy)]
struct Header {
    periods: u64,
    blocked_ns: u64,
    user_sp: u64,
    kernel_bytes: i64,
    state: u32,
    syscall: i32,
}

/// Copies a kernel stack walked earlier (`bytes` of it at `from`, or the
/// walk's error when negative) into `to`; returns its bytes or the error.
///
/// # Safety
///
/// `from` is valid for `MAX_STACK_DEPTH` addresses and `to` has room for
/// as many.
#[inline(always)]
pub(crate) unsafe fn stored_kernel_stack(bytes: i64, from: *const u8, to: *mut u8) -> i64 {
    if bytes <= 0 {
        return bytes;
    }
    let mut len = bytes as u32 & !7;
    let max = (MAX_STACK_DEPTH * size_of::<u64>()) as u32;
    if len > max {
        len = max;
    }
    // SAFETY: `len` is at most the room on both sides (the caller's
    // promise); the helper fails rather than faults.
    match unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(to.cast(), len, from.cast())
    } {
        0 => i64::from(len),
        error => error,
    }
}
