//! The CPU sampler: `sample_cpu` records a sample (stacks, registers, a
//! copy of the top of the user stack) and hands interpreter processes over
//! to their kind's walker (`python_walk`, `ruby_walk`); `record_sample` and
//! `walk_interpreter` serve the off-CPU programs too.

use core::{
    mem::size_of,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use agent_common::{
    BpfConfig, COMM_LEN, Counter, InterpreterKind, LOG_TARGET, MAX_STACK_COPY, MAX_STACK_DEPTH,
    OffCpuInfo, RecordKind, STACKS_BYTES, SampleRecord, SampleScratch, StackCopy,
    UNWIND_COPY_BY_THREAD, UNWIND_COPY_BYTES, UNWIND_COPY_NO_WALK, UserRegs, sample_flags,
    stacks_off,
};
use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_RB_FORCE_WAKEUP, pt_regs},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{
            bpf_get_current_cgroup_id, bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_ns,
        },
    },
    macros::perf_event,
    maps::{Array, ProgramArray},
    programs::PerfEventContext,
};

use crate::{
    EVENTS, EXCLUDED, SCRATCH, TAIL_CALLS, THREAD_STACKS, UNWIND_COPY, config, count, interpreter,
    maps, offcpu,
    user::{copy_user_stack, user_regs},
    wakeup_flag, wanted,
};

const STACK_BYTES: u32 = (MAX_STACK_DEPTH * size_of::<u64>()) as u32;
const RECORD_BYTES: usize = size_of::<SampleRecord>();
#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    count(Counter::SamplesSeen);
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tgid == 0 {
        count(Counter::IdleSkipped);
        return 0;
    }
    let config = config();
    if !wanted(&config, tgid) {
        count(Counter::Filtered);
        return 0;
    }
    // SAFETY: only the entry's presence is used, never the value.
    if unsafe { EXCLUDED.get(&tgid) }.is_some() {
        count(Counter::Excluded);
        return 0;
    }
    maps::sampled(tgid);
    // SAFETY: a helper without arguments or preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(scratch) = SCRATCH.get_ptr_mut(cpu) else {
        count(Counter::ScratchUnavailable);
        failed!(
            &ctx,
            "sample of tgid {} dropped: no per-CPU scratch buffer",
            tgid
        );
        return 0;
    };
    // SAFETY: `ctx` is the context the kernel passed to this run, and
    // `scratch` is this CPU's slot of SCRATCH. Only this program uses
    // SCRATCH, only on the CPU whose slot it is, and the kernel never
    // runs it nested on one CPU (it skips a
    // perf event program while one is already running there), so the slot
    // is ours alone until we return.
    unsafe {
        record_sample(
            &ctx,
            addr_of!((*ctx.ctx).regs),
            &TAIL_CALLS,
            &config,
            scratch,
            (tgid, tid),
            RecordKind::Sample,
            OffCpuInfo::default(),
            KernelStack::Walk,
        )
    };
    0
}

/// Fills the record in `scratch`, copies the user stack behind it and
/// writes both to the ring buffer: a CPU sample from `sample_cpu`, an
/// off-CPU one from `offcpu_resume`. `regs` are the registers the program
/// was handed (the interrupted ones of a perf event, the probed function's
/// of a kprobe), `calls` the program array of the interpreter walker of
/// the same program type.
///
/// # Safety
///
/// `ctx` is the context the kernel passed to this run and `regs` points
/// into it; `scratch` points to a `SampleScratch` nobody else reads or
/// writes until this returns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn record_sample<C: EbpfContext>(
    ctx: &C,
    regs: *const pt_regs,
    calls: &ProgramArray,
    config: &BpfConfig,
    scratch: *mut SampleScratch,
    (tgid, tid): (u32, u32),
    kind: RecordKind,
    off_cpu: OffCpuInfo,
    kernel_stack: KernelStack,
) {
    // SAFETY: `scratch` is valid and ours alone (the caller's promise);
    // every field is plain data, so any bytes left by an earlier sample are
    // a valid record, overwritten below.
    let record = unsafe { &mut *addr_of_mut!((*scratch).record) };
    record.kind = kind as u32;
    // SAFETY (these three): helpers without arguments or preconditions.
    record.cpu = unsafe { bpf_get_smp_processor_id() };
    record.tgid = tgid;
    record.tid = tid;
    record.timestamp_ns = unsafe { bpf_ktime_get_ns() };
    record.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    record.comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    record.flags = 0;
    record.kernel_frames = 0;
    record.user_frames = 0;
    record.stack_copy_len = 0;
    record.interpreter_frames = 0;
    record.reserved = 0;
    record.user_regs = UserRegs::default();
    record.off_cpu = off_cpu;

    let raw_ctx = ctx.as_ptr();
    let kernel_on = config.stacks_off & stacks_off::KERNEL == 0;
    let user_on = config.stacks_off & stacks_off::USER == 0;
    // SAFETY: only the field's address is taken; `scratch` is valid (the
    // caller's promise).
    let tail = unsafe { addr_of_mut!((*scratch).tail) } as *mut u8;
    // SAFETY: `raw_ctx` is this run's context and the tail has room for
    // both stacks, STACK_BYTES each.
    let kernel = match kernel_stack {
        _ if !kernel_on => 0,
        KernelStack::Walk => unsafe { bpf_get_stack(raw_ctx, tail.cast(), STACK_BYTES, 0) },
        // SAFETY: the tail has room for a whole stack, and the stored one
        // is valid for as much (the caller's promise).
        KernelStack::Stored(bytes, from) => unsafe {
            offcpu::stored_kernel_stack(bytes, from, tail)
        },
    };
    let mut kernel_bytes = 0usize;
    if kernel >= 0 {
        kernel_bytes = stack_bytes(kernel);
        record.kernel_frames = (kernel_bytes / 8) as u32;
    } else {
        record.flags |= sample_flags::KERNEL_STACK_FAILED;
        count(Counter::KernelStackFailed);
        failed!(
            ctx,
            "kernel stack walk of tgid {} tid {} failed: bpf_get_stack returned {}",
            tgid,
            tid,
            kernel
        );
    }
    // The copy this process gets, and whether the kernel walks its user
    // stack: not for one unwound from the copy alone
    // (`UNWIND_COPY_NO_WALK`), whose first frame is the interrupted
    // instruction the registers hold.
    // SAFETY: the value is copied out at once; the daemon replacing it
    // meanwhile only changes what this sample gets.
    let entry = match unsafe { UNWIND_COPY.get(&tgid) } {
        Some(&entry) if user_on => entry,
        _ => config.stack_copy_bytes,
    };
    let skip_walk = user_on && entry & UNWIND_COPY_NO_WALK != 0;
    // SAFETY: as above; the user's frames follow the kernel's, and
    // `kernel_bytes` is at most STACK_BYTES, so they fit as well.
    let user = if user_on && !skip_walk {
        unsafe {
            bpf_get_stack(
                raw_ctx,
                tail.add(kernel_bytes).cast(),
                STACK_BYTES,
                BPF_F_USER_STACK as u64,
            )
        }
    } else {
        0
    };
    let mut user_bytes = 0usize;
    if user >= 0 {
        user_bytes = stack_bytes(user);
        record.user_frames = (user_bytes / 8) as u32;
    } else {
        record.flags |= sample_flags::USER_STACK_FAILED;
        count(Counter::UserStackFailed);
        failed!(
            ctx,
            "user stack walk of tgid {} tid {} failed: bpf_get_stack returned {}",
            tgid,
            tid,
            user
        );
    }

    if skip_walk {
        record.flags |= sample_flags::USER_WALK_SKIPPED;
    }

    // With one stack off, a sample without frames of the other is nothing.
    if (!kernel_on || !user_on)
        && record.kernel_frames == 0
        && record.user_frames == 0
        && !skip_walk
    {
        count(Counter::NoStackLeft);
        return;
    }
    // SAFETY: a field of the valid scratch slot, which `record` does not
    // cover.
    let copy = unsafe { addr_of_mut!((*scratch).copy) };
    // SAFETY (these accesses of `copy`): as above.
    unsafe {
        write_volatile(
            copy,
            StackCopy {
                base: (kernel_bytes + user_bytes) as u32,
                wanted: 0,
                sp: 0,
                copied: 0,
            },
        )
    };

    // Kernel threads have no user side (no frames walked, and never in
    // `UNWIND_COPY`); nothing more to capture.
    if record.user_frames > 0 || skip_walk {
        // SAFETY: `ctx` is this run's context (the caller's promise).
        if let Some(regs) = unsafe { user_regs(ctx, regs, record) } {
            record.user_regs = regs;
            record.flags |= sample_flags::USER_REGS_VALID;
            let mut wanted = entry & UNWIND_COPY_BYTES;
            // A thread whose stack ends sooner: copied up to its end.
            if entry & UNWIND_COPY_BY_THREAD != 0
                // SAFETY: the value is copied out at once.
                && let Some(&end) = unsafe { THREAD_STACKS.get(&tid) }
                && end > regs.sp
                && end - regs.sp < u64::from(wanted)
            {
                wanted = (end - regs.sp) as u32;
            }
            // SAFETY (these accesses of `copy`): fields of the valid
            // scratch slot.
            unsafe {
                write_volatile(addr_of_mut!((*copy).wanted), wanted);
                write_volatile(addr_of_mut!((*copy).sp), regs.sp);
            }
            // SAFETY: `scratch` is valid and ours alone (the caller's
            // promise); the copy writes only the tail after the stacks and
            // `copy`, which `record` does not cover.
            unsafe { copy_user_stack(ctx, scratch) };
        } else {
            count(Counter::UserRegsFailed);
        }
    }
    // Read back from the map, bounded: whichever way the sample came here,
    // what follows is checked once.
    let mut copied = unsafe { read_volatile(addr_of_mut!((*copy).copied)) } as usize;
    if copied > MAX_STACK_COPY {
        copied = MAX_STACK_COPY;
    }
    let mut stacks = unsafe { read_volatile(addr_of_mut!((*copy).base)) } as usize;
    if stacks > STACKS_BYTES {
        stacks = STACKS_BYTES;
    }
    record.stack_copy_len = copied as u32;
    let body = stacks + copied;

    // An interpreter process: its kind's walker program records its
    // interpreter frames after the copy and writes the sample. It is a
    // program of its own so that the verifier checks a few of its steps,
    // not all of them, in one program.
    // SAFETY: `scratch` is ours alone (the caller's promise).
    if user_on && let Some(kind) = unsafe { interpreter::start(scratch, tgid, body) } {
        // SAFETY: `ctx` is this run's context; a successful tail call does
        // not return.
        unsafe { calls.tail_call(ctx, kind) };
        count(Counter::InterpreterWalkerUnavailable.of_kind(kind));
    }
    // SAFETY: as above.
    if let Err((len, error)) = unsafe { submit(config, scratch, body) } {
        failed!(
            ctx,
            "sample of tgid {} lost: ring buffer output of {} bytes returned {}",
            tgid,
            len,
            error
        );
    }
}

/// Where a sample's kernel stack comes from.
#[derive(Clone, Copy)]
pub(crate) enum KernelStack {
    /// Walked now, from the program's context.
    Walk,
    /// Walked earlier: this many bytes (negative: that walk failed, with
    /// this error) of a stack of `MAX_STACK_DEPTH` addresses there.
    Stored(i64, *const u8),
}

/// The bytes `bpf_get_stack` wrote, from what it returned (non-negative),
/// as whole frames and at most one stack's room.
#[inline(always)]
fn stack_bytes(returned: i64) -> usize {
    let mut bytes = returned as usize & !7;
    if bytes > STACK_BYTES as usize {
        bytes = STACK_BYTES as usize;
    }
    bytes
}

/// Writes the record in `scratch` and the first `body` bytes of its tail
/// to the ring buffer. On failure (no room), counted here and handed back
/// (the length and the error) for the caller to log: one log site per
/// program keeps the logging code inlined, so the object holds no symbol
/// named after its build path.
///
/// # Safety
///
/// `scratch` points to a `SampleScratch` nobody else reads or writes until
/// this returns.
#[inline(always)]
unsafe fn submit(
    config: &BpfConfig,
    scratch: *mut SampleScratch,
    body: usize,
) -> Result<(), (usize, i32)> {
    let mut len = RECORD_BYTES + body;
    if len > size_of::<SampleScratch>() {
        len = size_of::<SampleScratch>();
    }
    // SAFETY: `len` is clamped to the size of the scratch buffer, which is
    // valid for reads and not written while the slice lives.
    let bytes = unsafe { core::slice::from_raw_parts(scratch as *const u8, len) };
    // SAFETY: a field of the valid scratch slot.
    let off_cpu =
        unsafe { read_volatile(addr_of!((*scratch).record.kind)) } == RecordKind::OffCpu as u32;
    let (written, lost) = match off_cpu {
        true => (Counter::OffCpuWritten, Counter::OffCpuLostRingFull),
        false => (Counter::SamplesWritten, Counter::SamplesLostRingFull),
    };
    // SAFETY: as above.
    let flag = match unsafe { wakes_at_once(scratch) } {
        true => BPF_RB_FORCE_WAKEUP as u64,
        false => wakeup_flag(config),
    };
    match EVENTS.output::<[u8]>(bytes, flag) {
        Ok(()) => {
            count(written);
            Ok(())
        }
        Err(error) => {
            count(lost);
            Err((len, error))
        }
    }
}

/// Whether the sample in `scratch` carries the interpreter frames of a
/// process the daemon asked to hear of at once (`wake_until_ms`): one that
/// just started, whose frames can only be named while it lives.
///
/// # Safety
///
/// As [`submit`].
#[inline(always)]
unsafe fn wakes_at_once(scratch: *const SampleScratch) -> bool {
    // SAFETY (both): fields of the valid scratch slot; the walk's layout
    // is this sample's whenever it recorded frames.
    if unsafe { read_volatile(addr_of!((*scratch).record.interpreter_frames)) } == 0 {
        return false;
    }
    let until = unsafe { read_volatile(addr_of!((*scratch).walk.layout.wake_until_ms)) };
    // SAFETY: a helper without arguments or preconditions.
    let now = (unsafe { bpf_ktime_get_ns() } / 1_000_000) as u32;
    until != 0 && (until.wrapping_sub(now) as i32) > 0
}

/// Walks the CPython stack of the sample `sample_cpu` handed over
/// (`interpreter::start`), a few steps per run, calling itself for the
/// next steps until the walk is over, then writes the sample.
#[perf_event]
pub fn python_walk(ctx: PerfEventContext) -> u32 {
    walk_interpreter::<{ InterpreterKind::Python as u32 }, _>(&ctx, &TAIL_CALLS, &SCRATCH)
}

/// As [`python_walk`], for CRuby.
#[perf_event]
pub fn ruby_walk(ctx: PerfEventContext) -> u32 {
    walk_interpreter::<{ InterpreterKind::Ruby as u32 }, _>(&ctx, &TAIL_CALLS, &SCRATCH)
}

/// The body of the walker programs of kind `KIND` (`python_walk`,
/// `offcpu_python_walk`, ...): `calls` is the program array of the
/// walker's own program type, `scratches` the scratch slots of the
/// sampling program that handed over.
#[inline(always)]
pub(crate) fn walk_interpreter<const KIND: u32, C: EbpfContext>(
    ctx: &C,
    calls: &ProgramArray,
    scratches: &Array<SampleScratch>,
) -> u32 {
    // SAFETY: a helper without arguments or preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(scratch) = scratches.get_ptr_mut(cpu) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: this CPU's slot, which the sampling program filled and
    // handed over on this CPU without returning; nothing else uses it
    // until this program chain returns.
    unsafe {
        if interpreter::run::<KIND>(scratch) {
            calls.tail_call(ctx, KIND);
            // Only past the kernel's tail call limit: the walk ends here,
            // flagged as cut short.
        }
        let body = interpreter::finish::<KIND>(scratch);
        if let Err((len, error)) = submit(&config(), scratch, body) {
            failed!(
                ctx,
                "sample of tgid {} lost: ring buffer output of {} bytes returned {}",
                (*scratch).record.tgid,
                len,
                error
            );
        }
    }
    0
}
