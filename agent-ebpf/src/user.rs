//! The user side of a sample beyond the kernel's frame-pointer walk: the
//! task's user registers and a copy of the top of its user stack, for the
//! daemon's CFI unwinding.

use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use agent_common::{
    Counter, LOG_TARGET, MAX_STACK_COPY, STACK_READ_BYTES, STACKS_BYTES, SampleRecord,
    SampleScratch, UserRegs, sample_flags,
};
use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs},
    },
};

use crate::count;

/// The task's user registers: the interrupted registers when the sample hit
/// user mode, else those saved on kernel entry.
///
/// # Safety
///
/// `ctx` is the context the kernel passed to this run and `regs` the
/// registers in it.
#[inline(always)]
pub(crate) unsafe fn user_regs<C: EbpfContext>(
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
pub(crate) unsafe fn copy_user_stack<C: EbpfContext>(ctx: &C, scratch: *mut SampleScratch) {
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
