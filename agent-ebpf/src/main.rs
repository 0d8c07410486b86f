//! firn's BPF programs.
//!
//! `sample_cpu` runs on every tick of the software `cpu-clock` perf event,
//! one event per online CPU. It records who was running (tgid, tid, comm,
//! cgroup), the kernel and user stacks (frame-pointer walks done by the
//! kernel), the user registers and a copy of the top of the user stack, so
//! the daemon can repair or replace the frame-pointer walk with CFI. How
//! much stack is copied is decided per process: `UNWIND_COPY` (written by
//! the daemon) holds the size for processes unwound with DWARF; everyone
//! else gets the small default the leaf repair needs.
//!
//! For CPython processes the daemon has registered in `PYTHON_PROCESSES`,
//! it also records the sampled thread's interpreter frames (`python`).
//!
//! `process_exec` / `process_exit` tell the daemon when a process image
//! changes or goes away, in the same ring buffer and therefore in order with
//! the samples. They also keep `UNWIND_COPY` and `PYTHON_PROCESSES` in step:
//! a fresh image gets the full copy until the daemon has decided and loses
//! its interpreter layout, an exited process loses both entries.
//!
//! Where a read, a walk or a write fails, the program bumps a counter and
//! says why through `aya-log` at debug level under the daemon's `firn::bpf`
//! log target (`failed!`). The daemon leaves `AYA_LOG_LEVEL` at zero unless
//! that target's debug level is on; the verifier then sees the logging
//! branches as dead, so by default no record is built or sent.
#![no_std]
#![no_main]
// The exit walk's kfunc calls are raw instructions (see `maps`).
#![feature(asm_experimental_arch)]

mod maps;
mod offcpu;
mod python;

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use agent_common::{
    BpfConfig, COMM_LEN, Counter, LOG_TARGET, MAX_EXCLUDED_PROCESSES, MAX_PID_FILTER,
    MAX_STACK_COPY, MAX_STACK_DEPTH, MAX_UNWIND_PROCESSES, OffCpuInfo, ProcessRecord, RecordKind,
    STACK_READ_BYTES, STACKS_BYTES, SampleRecord, SampleScratch, StackCopy, UserRegs, sample_flags,
    stacks_off, tail_calls,
};
use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, pt_regs,
    },
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_cgroup_id, bpf_get_current_task_btf, bpf_get_smp_processor_id,
            bpf_get_stack, bpf_ktime_get_ns, bpf_probe_read_user, bpf_task_pt_regs,
        },
    },
    macros::{map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, ProgramArray, RingBuf},
    programs::{PerfEventContext, RawTracePointContext},
};

/// Says why something failed, at debug level under the daemon's log
/// target. Only ever on a failure path: the success path of a sample must
/// not pay for it even when debug logging is on.
macro_rules! failed {
    ($ctx:expr, $($message:tt)+) => {
        aya_log_ebpf::debug!($ctx, target: LOG_TARGET, $($message)+)
    };
}

/// Written by the daemon before load (`EbpfLoader::override_global`).
// SAFETY: the loader finds the variable by this name, and no other symbol
// in the object has it, so nothing clashes.
#[unsafe(no_mangle)]
static CONFIG: BpfConfig = BpfConfig::DEFAULT;

/// Samples and process events. The daemon sets the real size at load time.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// One sample's scratch space per CPU, by CPU number; the daemon sizes it
/// to the possible CPUs. Not a per-CPU map: their values are limited to
/// 32 KiB, less than a deep stack's copy.
#[map]
static SCRATCH: Array<SampleScratch> = Array::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// tgids to sample when `CONFIG.filter_pids` is set. `follow_fork` adds
/// the processes they start; `process_exit` removes every process that ends.
#[map]
static PID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PID_FILTER, 0);

/// tgids whose samples are not recorded: processes the daemon found
/// relabeling drops. Cleared by their exec (a new image is judged anew)
/// and their exit.
#[map]
static EXCLUDED: HashMap<u32, u8> = HashMap::with_max_entries(MAX_EXCLUDED_PROCESSES, 0);

/// Stack copy size per tgid, for processes that differ from
/// `CONFIG.stack_copy_bytes` (those unwound with DWARF).
#[map]
static UNWIND_COPY: HashMap<u32, u32> = HashMap::with_max_entries(MAX_UNWIND_PROCESSES, 0);

/// The programs `sample_cpu` hands a sample over to (`tail_calls`); the
/// daemon fills it after loading them.
#[map]
static TAIL_CALLS: ProgramArray = ProgramArray::with_max_entries(tail_calls::COUNT, 0);

const STACK_BYTES: u32 = (MAX_STACK_DEPTH * size_of::<u64>()) as u32;
const RECORD_BYTES: usize = size_of::<SampleRecord>();

#[inline(always)]
fn config() -> BpfConfig {
    // The loader rewrites the read-only data; a plain read would be
    // constant-folded to the compile-time default.
    // SAFETY: a reference to a static is valid and aligned, and `BpfConfig`
    // is plain integers, valid for whatever bytes the loader wrote.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

#[inline(always)]
fn count(counter: Counter) {
    count_by(counter, 1);
}

#[inline(always)]
fn count_by(counter: Counter, by: u64) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the lookup returned this CPU's slot of the array, valid
        // while the program runs. The only other writer at the same time
        // is the sampler interrupting a tracepoint program on this CPU;
        // that can lose one count, never tear the u64 or touch other memory.
        unsafe { *value += by };
    }
}

#[inline(always)]
fn wanted(config: &BpfConfig, tgid: u32) -> bool {
    // SAFETY: `get` is unsafe because the daemon may rewrite the value under
    // the reference; only the entry's presence is used, never the value.
    config.filter_pids == 0 || unsafe { PID_FILTER.get(&tgid) }.is_some()
}

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
unsafe fn record_sample<C: EbpfContext>(
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
    // SAFETY: as above; the user's frames follow the kernel's, and
    // `kernel_bytes` is at most STACK_BYTES, so they fit as well.
    let user = if user_on {
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

    // With one stack off, a sample without frames of the other is nothing.
    if (!kernel_on || !user_on) && record.kernel_frames == 0 && record.user_frames == 0 {
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

    // Kernel threads have no user side; nothing more to capture.
    if record.user_frames > 0 {
        // SAFETY: `ctx` is this run's context (the caller's promise).
        if let Some(regs) = unsafe { user_regs(ctx, regs, record) } {
            record.user_regs = regs;
            record.flags |= sample_flags::USER_REGS_VALID;
            // SAFETY: the value is copied out at once; the daemon replacing
            // it meanwhile only changes which size this sample gets.
            let wanted = match unsafe { UNWIND_COPY.get(&tgid) } {
                Some(&bytes) => bytes,
                None => config.stack_copy_bytes,
            };
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

    // A CPython process: the walker program records its interpreter frames
    // after the copy and writes the sample. It is a program of its own so
    // that the verifier checks a few of its steps, not all of them, in
    // one program.
    // SAFETY: `scratch` is ours alone (the caller's promise).
    if user_on && unsafe { python::start(scratch, tgid, body) } {
        // SAFETY: `ctx` is this run's context; a successful tail call does
        // not return.
        unsafe { calls.tail_call(ctx, tail_calls::PYTHON_WALK) };
        count(Counter::InterpreterWalkerUnavailable);
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
enum KernelStack {
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
    match EVENTS.output::<[u8]>(bytes, wakeup_flag(config)) {
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

/// Walks the interpreter stack of the sample `sample_cpu` handed over
/// (`python::start`), a few steps per run, calling itself for the next
/// steps until the walk is over, then writes the sample.
#[perf_event]
pub fn python_walk(ctx: PerfEventContext) -> u32 {
    walk_python(&ctx, &TAIL_CALLS, &SCRATCH)
}

/// The body of the walker programs (`python_walk`, `offcpu_python_walk`):
/// `calls` is the program array of the walker's own program type,
/// `scratches` the scratch slots of the sampling program that handed over.
#[inline(always)]
fn walk_python<C: EbpfContext>(
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
        if python::steps(scratch) {
            calls.tail_call(ctx, tail_calls::PYTHON_WALK);
            // Only past the kernel's tail call limit: the walk ends here,
            // flagged as cut short.
        }
        let body = python::finish(scratch);
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

/// The task's user registers: the interrupted registers when the sample hit
/// user mode, else those saved on kernel entry.
///
/// # Safety
///
/// `ctx` is the context the kernel passed to this run and `regs` the
/// registers in it.
#[inline(always)]
unsafe fn user_regs<C: EbpfContext>(
    ctx: &C,
    regs: *const pt_regs,
    record: &mut SampleRecord,
) -> Option<UserRegs> {
    // Null: the program's registers are not the task's (a tracepoint);
    // only those saved on kernel entry are.
    if !regs.is_null() {
        // SAFETY: registers in the context of this run (the caller's
        // promise), readable for the whole run.
        let regs = unsafe { &*regs };
        // Volatile keeps each field one plain 8-byte load from the
        // context, the only access the verifier allows there.
        // SAFETY (these four): fields of the valid context above.
        let cs = unsafe { core::ptr::read_volatile(&regs.cs) };
        if cs & 3 == 3 {
            record.flags |= sample_flags::USER_MODE;
            return Some(UserRegs {
                ip: unsafe { core::ptr::read_volatile(&regs.rip) },
                sp: unsafe { core::ptr::read_volatile(&regs.rsp) },
                bp: unsafe { core::ptr::read_volatile(&regs.rbp) },
            });
        }
    }
    // One call site: the logging in it stays inlined (see `submit`).
    unsafe { saved_user_regs(ctx, record) }
}

/// The current task's user registers saved on kernel entry.
///
/// # Safety
///
/// `ctx` is the context the kernel passed to this run.
#[inline(always)]
unsafe fn saved_user_regs<C: EbpfContext>(ctx: &C, record: &mut SampleRecord) -> Option<UserRegs> {
    // SAFETY: a helper without arguments; it returns the running task.
    let task = unsafe { bpf_get_current_task_btf() };
    if task.is_null() {
        failed!(
            ctx,
            "no user registers for tgid {}: no current task",
            record.tgid
        );
        return None;
    }
    // SAFETY: `task` is the non-null task pointer the helper above gave, the
    // kind of pointer `bpf_task_pt_regs` takes.
    let saved = unsafe { bpf_task_pt_regs(task) } as *const pt_regs;
    if saved.is_null() {
        failed!(
            ctx,
            "no user registers for tgid {}: the task has no saved registers",
            record.tgid
        );
        return None;
    }
    // SAFETY: the helper checks the address itself; a bad one is an error
    // returned, never a fault.
    let saved: pt_regs = match unsafe { bpf_probe_read_kernel(saved) } {
        Ok(saved) => saved,
        Err(error) => {
            failed!(
                ctx,
                "no user registers for tgid {}: bpf_probe_read_kernel of the saved registers returned {}",
                record.tgid,
                error
            );
            return None;
        }
    };
    Some(UserRegs {
        ip: saved.rip,
        sp: saved.rsp,
        bp: saved.rbp,
    })
}

/// Copies up to `copy.wanted` bytes of user stack from `copy.sp` up into
/// the scratch tail from `copy.base` (after the stacks, at most
/// `STACKS_BYTES`) on, a page at a time, stopping at the first page that
/// cannot be read (the end of the stack mapping). The first read runs up
/// to the next page boundary, so later reads never straddle the end of the
/// mapping and nothing readable is left behind. Leaves the bytes copied in
/// `copy.copied`.
///
/// Every value the loop uses is read from the map at the top of each
/// iteration and written back there, not kept in registers: the verifier
/// tracks no map contents, so each iteration starts from the same state
/// whatever the earlier reads returned and however the sample got here, and
/// the loop is checked once per iteration rather than once per combination
/// (kept in registers, it cost 150 ms of verification at every start).
///
/// # Safety
///
/// `scratch` points to a `SampleScratch` nobody else reads or writes until
/// this returns.
#[inline(always)]
unsafe fn copy_user_stack<C: EbpfContext>(ctx: &C, scratch: *mut SampleScratch) {
    // SAFETY: only field addresses are taken; `scratch` is valid (the
    // caller's promise).
    let tail = unsafe { addr_of_mut!((*scratch).tail) } as *mut u8;
    let copy = unsafe { addr_of_mut!((*scratch).copy) };
    for _ in 0..(MAX_STACK_COPY / STACK_READ_BYTES + 1) {
        // SAFETY (the volatile accesses of `copy`): fields of the valid
        // scratch slot.
        let (base, wanted, sp, copied) = unsafe {
            (
                read_volatile(addr_of!((*copy).base)) as usize,
                read_volatile(addr_of!((*copy).wanted)) as usize,
                read_volatile(addr_of!((*copy).sp)),
                read_volatile(addr_of!((*copy).copied)) as usize,
            )
        };
        // The bounds keep every read inside the buffer for the verifier;
        // the second only bites when more than MAX_STACK_COPY - a page is
        // wanted.
        if base > STACKS_BYTES || copied >= wanted || copied > MAX_STACK_COPY - STACK_READ_BYTES {
            break;
        }
        let head =
            (STACK_READ_BYTES - (sp as usize & (STACK_READ_BYTES - 1))) & (STACK_READ_BYTES - 1);
        let mut size = if copied == 0 && head != 0 {
            head
        } else {
            STACK_READ_BYTES
        };
        if size > wanted - copied {
            size = wanted - copied;
        }
        let from = sp + copied as u64;
        // SAFETY: the bounds above keep `copied + size` within
        // MAX_STACK_COPY and `base` within STACKS_BYTES, so the destination
        // stays inside the scratch tail; the helper checks the user address
        // itself and fails on an unmapped one instead of faulting.
        let ret = unsafe {
            bpf_probe_read_user(
                tail.add(base + copied) as *mut c_void,
                size as u32,
                from as *const c_void,
            )
        };
        if ret != 0 {
            count(Counter::StackCopyShort);
            failed!(
                ctx,
                "user stack copy of tgid {} stopped short: bpf_probe_read_user of {} bytes at 0x{:x} returned {}; {} of {} bytes copied",
                // SAFETY: a field of the valid scratch slot.
                unsafe { (*scratch).record.tgid },
                size,
                from,
                ret,
                copied,
                wanted
            );
            break;
        }
        unsafe { write_volatile(addr_of_mut!((*copy).copied), (copied + size) as u64) };
    }
}

/// Wake the reader only once enough has accumulated; it also drains on a
/// timer, so a quiet ring never waits long.
#[inline(always)]
fn wakeup_flag(config: &BpfConfig) -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= config.wakeup_bytes {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(ctx: RawTracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // The new image is judged anew by the daemon.
    let _ = EXCLUDED.remove(&tgid);
    let config = config();
    // The daemon has not seen this image yet; until it decides, the image
    // is unwound as if it had no frame pointers.
    if config.exec_copy_bytes != 0
        && wanted(&config, tgid)
        && let Err(error) = UNWIND_COPY.insert(&tgid, &config.exec_copy_bytes, 0)
    {
        count(Counter::UnwindCopyMapFull);
        failed!(
            &ctx,
            "new image of tgid {} gets no full stack copy: UNWIND_COPY insert returned {}",
            tgid,
            error
        );
    }
    // The new image is not the interpreter the daemon registered, if any.
    let _ = python::PYTHON_PROCESSES.remove(&tgid);
    if wanted(&config, tgid) {
        maps::started(tgid);
    }
    if !process_event(RecordKind::Exec) {
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
        let _ = python::PYTHON_PROCESSES.remove(&tgid);
        let _ = EXCLUDED.remove(&tgid);
        let lost = !process_event(RecordKind::Exit);
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

/// Writes a process event; false when the ring buffer had no room (counted
/// here, logged by the caller: one log site per program keeps the logging
/// code inlined, so the object holds no symbol named after its build path).
#[inline(always)]
fn process_event(kind: RecordKind) -> bool {
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
    });
    entry.submit(wakeup_flag(&config));
    true
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY: the kernel reads the program's license from this section, and it
// holds nothing but the NUL-terminated string; no other symbol is named
// LICENSE.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
