//! The CRuby walker: at sample time, the sampled thread's control frames,
//! innermost first, as what identifies each one (the instruction
//! sequence, the program counter, the method entry, the frame's flags).
//! Userspace names them later, from the process's memory.
//!
//! The running execution context is the one of the thread holding the VM
//! lock (`ruby_single_main_ractor->threads.running_ec`); it is walked only
//! when its thread is the sampled one: its native thread id, glibc's
//! `pthread_t`, is the thread's thread pointer. A thread that runs without
//! the lock (in a C extension that released it, or waiting for it) keeps
//! its native frames and is counted (`RubyOtherThread`).
//! Everything version-specific comes from the daemon in a `RubyLayout`:
//! this code knows no Ruby version.
//!
//! Control frames lie at the end of the context's VM stack, the innermost
//! (`ec->cfp`) lowest; the walk goes up to the end of the stack.

use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use agent_common::{
    Counter, INTERPRETER_CODE_READ, INTERPRETER_FRAME_READ, InterpreterFrame,
    MAX_INTERPRETER_FRAMES, NO_OFFSET, SampleScratch, interpreter_frame_flags, sample_flags,
};
use aya_ebpf::helpers::{
    bpf_probe_read_kernel,
    generated::{bpf_get_current_task, bpf_probe_read_user},
};

use crate::{
    count,
    interpreter::{MAX_BASE, field, read_user, record, slot},
};

/// `VM_ENV_FLAG_LOCAL`: the environment of a method (or of the top
/// level), not of a block. The same bit in every Ruby since 2.3.
const ENV_LOCAL: u64 = 0x2;
/// `VM_FRAME_FLAG_FINISH`: the interpreter loop returns when this frame
/// does, so it is the outermost frame of one call of `rb_vm_exec`.
const FRAME_FINISH: u64 = 0x20;
/// Blocks within blocks followed up to their method's environment; a
/// block nested deeper keeps no method entry (its label still names it).
const MAX_ENV_HOPS: usize = 3;
/// Most words of VM stack believed: 16M words is 128 MiB, far beyond
/// Ruby's default of 1 MiB (a bad read must not put the end anywhere).
const MAX_STACK_WORDS: u64 = 1 << 24;

/// Starts the walk at the current thread's innermost control frame; false
/// (counted) when the thread does not run Ruby code now or the context
/// could not be read.
///
/// # Safety
///
/// `scratch` is this CPU's scratch slot with a walk set up for a Ruby
/// process, owned by the walker until it returns.
#[inline(always)]
pub unsafe fn first_frame(scratch: *mut SampleScratch) -> bool {
    // SAFETY: the caller's promise; plain data, copied.
    let process = unsafe { (*scratch).walk.layout };
    let layout = unsafe { process.layout.ruby };
    let Ok(global) = (unsafe { read_user::<u64>(layout.context_global) }) else {
        return read_failed();
    };
    let context = if layout.running_context == NO_OFFSET || global == 0 {
        global
    } else {
        match unsafe { read_user::<u64>(global + layout.running_context as u64) } {
            Ok(context) => context,
            Err(()) => return read_failed(),
        }
    };
    if context == 0 {
        count(Counter::RubyNoThreadState);
        return false;
    }
    // SAFETY: only the field's address is taken; the window holds
    // INTERPRETER_FRAME_READ bytes.
    let window = unsafe { addr_of_mut!((*scratch).frame) } as *mut u64;
    if unsafe {
        bpf_probe_read_user(
            window as *mut c_void,
            INTERPRETER_FRAME_READ as u32,
            context as *const c_void,
        )
    } != 0
    {
        return read_failed();
    }
    // SAFETY (the field reads): offsets into the window just read.
    let stack = unsafe { field(window, layout.context_stack) };
    let words = unsafe { field(window, layout.context_stack_size) };
    let frame = unsafe { field(window, layout.context_frame) };
    let thread = unsafe { field(window, layout.context_thread) };
    let native = if layout.thread_native == NO_OFFSET {
        thread
    } else {
        match unsafe { read_user::<u64>(thread + layout.thread_native as u64) } {
            Ok(native) => native,
            Err(()) => return read_failed(),
        }
    };
    let Ok(thread_id) = (unsafe { read_user::<u64>(native + layout.native_thread_id as u64) })
    else {
        return read_failed();
    };
    // SAFETY: a helper without arguments; the value is only used as an
    // address for the checked read below.
    let task = unsafe { bpf_get_current_task() };
    let Ok(thread_pointer) = (unsafe {
        bpf_probe_read_kernel((task + process.task_thread_pointer as u64) as *const u64)
    }) else {
        return read_failed();
    };
    if thread_id != thread_pointer {
        count(Counter::RubyOtherThread);
        return false;
    }
    if words > MAX_STACK_WORDS || frame < stack {
        return read_failed();
    }
    let end = stack + words * 8;
    // SAFETY: fields of the valid scratch slot.
    unsafe {
        write_volatile(addr_of_mut!((*scratch).walk.frame), frame);
        write_volatile(addr_of_mut!((*scratch).walk.end), end);
    }
    frame != 0 && frame < end
}

/// One step of the walk: records the control frame at `walk.frame` and
/// moves to its caller, the next one up. False when the walk is over.
///
/// # Safety
///
/// As [`first_frame`].
#[inline(always)]
pub unsafe fn step(scratch: *mut SampleScratch) -> bool {
    // As CPython's step: what the step needs is loaded from the map, its
    // results go straight back there, so each step is checked once.
    // SAFETY: the caller's promise; only field addresses are taken.
    let walk = unsafe { addr_of_mut!((*scratch).walk) };
    let layout = unsafe { addr_of!((*walk).layout.layout.ruby) };
    // SAFETY (the volatile loads below): fields of the valid scratch slot.
    let frame = unsafe { read_volatile(addr_of!((*walk).frame)) };
    let end = unsafe { read_volatile(addr_of!((*walk).end)) };
    let recorded = unsafe { read_volatile(addr_of!((*walk).recorded)) };
    let base = unsafe { read_volatile(addr_of!((*walk).base)) } as usize;
    if frame == 0 || frame >= end || base > MAX_BASE {
        // SAFETY: a field of the valid scratch slot.
        unsafe { write_volatile(addr_of_mut!((*walk).frame), 0) };
        return false;
    }
    let Some(slot) = (unsafe { slot(scratch, base, recorded) }) else {
        return false;
    };
    let size = unsafe { read_volatile(addr_of!((*layout).frame_size)) } as u64;
    // SAFETY: only the field's address is taken.
    let buffer = unsafe { addr_of_mut!((*scratch).frame) } as *mut u64;
    // A frame is at most a few words; the mask keeps the read inside the
    // window whatever the layout says.
    let read = (size as u32) & (INTERPRETER_FRAME_READ as u32 - 1);
    // SAFETY: `read` is below the window's size; the helper checks the
    // user address.
    if read < 8
        || unsafe { bpf_probe_read_user(buffer as *mut c_void, read, frame as *const c_void) } != 0
    {
        // SAFETY: fields of the valid scratch slot.
        unsafe {
            (*walk).flags |= sample_flags::INTERPRETER_READ_FAILED;
            write_volatile(addr_of_mut!((*walk).frame), 0);
        }
        return false;
    }
    let frame_field = |offset: *const u16| {
        // SAFETY: `offset` is a layout field; `field` bounds the read.
        unsafe { field(buffer, read_volatile(offset)) }
    };
    let pc = frame_field(unsafe { addr_of!((*layout).frame_pc) });
    let iseq = frame_field(unsafe { addr_of!((*layout).frame_iseq) });
    let ep = frame_field(unsafe { addr_of!((*layout).frame_ep) });
    let next = frame + size;
    // SAFETY: a field of the valid scratch slot.
    unsafe { write_volatile(addr_of_mut!((*walk).frame), next) };

    // The environment's last three words: the method entry or cref, the
    // block handler or previous environment, the flags.
    // SAFETY: only the field's address is taken; the window holds
    // INTERPRETER_CODE_READ bytes, more than three words.
    let env = unsafe { addr_of_mut!((*scratch).code) } as *mut u64;
    let flags = match unsafe { read_env(env, ep) } {
        true => unsafe { read_volatile(env.add(2)) },
        false => 0,
    };
    // A block's method entry is in its method's environment.
    for _ in 0..MAX_ENV_HOPS {
        // SAFETY: words of the window.
        let here = unsafe { read_volatile(env.add(2)) };
        if here & ENV_LOCAL != 0 {
            break;
        }
        let previous = unsafe { read_volatile(env.add(1)) } & !3;
        if !unsafe { read_env(env, previous) } {
            break;
        }
    }
    // SAFETY: a word of the window.
    let env_flags = unsafe { read_volatile(env.add(2)) };
    let method = match env_flags & ENV_LOCAL {
        0 => 0,
        _ => unsafe { read_volatile(env) },
    };
    let entry = ((flags & FRAME_FINISH) >> 5) as u32 * interpreter_frame_flags::ENTRY;
    // SAFETY: `slot` lies inside the scratch tail.
    unsafe {
        record(
            slot,
            InterpreterFrame {
                code: iseq,
                stamp: method,
                instruction: pc,
                flags: entry,
                data: flags as u32,
            },
        );
        write_volatile(addr_of_mut!((*walk).recorded), recorded + 1);
    }
    next < end && recorded + 1 < MAX_INTERPRETER_FRAMES as u32
}

/// Reads the three words before and at `ep` into `env`; on failure zeroes
/// them (no flags: not local, no method entry) and says so.
///
/// # Safety
///
/// `env` is the scratch slot's code window.
#[inline(always)]
unsafe fn read_env(env: *mut u64, ep: u64) -> bool {
    // SAFETY: three words fit in the window; the helper checks the user
    // address.
    let failed = ep < 16
        || unsafe { bpf_probe_read_user(env as *mut c_void, 24, (ep - 16) as *const c_void) } != 0;
    if failed {
        // SAFETY: words of the window.
        unsafe {
            write_volatile(env, 0);
            write_volatile(env.add(1), 0);
            write_volatile(env.add(2), ENV_LOCAL);
        }
    }
    !failed
}

/// Counts a failed read of the thread's state; the walk does not start.
#[inline(always)]
fn read_failed() -> bool {
    count(Counter::RubyReadFailed);
    false
}

const _: () = assert!(INTERPRETER_CODE_READ >= 24);
const _: () = assert!(INTERPRETER_FRAME_READ.is_power_of_two());
