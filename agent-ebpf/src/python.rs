//! The CPython walker: at sample time, the sampled thread's interpreter
//! frames, innermost first, as what identifies each one (code object,
//! instruction, a stamp of the code object). Userspace names them later;
//! the frames themselves live on the heap and change by then.
//!
//! The thread state is found the way the interpreter's `PyGILState` API
//! finds it, through the pthread key in `_PyRuntime.autoTSSkey` and glibc's
//! thread-specific data, so every thread has its own stack and a thread
//! that released the GIL (in a C extension, say) still has its Python
//! frames. Everything version-specific comes from the daemon in a
//! `PythonLayout`: this code knows no CPython version.

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use agent_common::{
    Counter, INTERPRETER_CODE_READ, INTERPRETER_FRAME_READ, InterpreterFrame,
    MAX_INTERPRETER_FRAMES, NO_OFFSET, PYTHON_OWNER_CSTACK, PythonEntry, PythonInstruction,
    PythonLayout, SampleScratch, interpreter_frame_flags, sample_flags,
};
use aya_ebpf::helpers::{
    bpf_probe_read_kernel,
    generated::{bpf_get_current_task, bpf_probe_read_user},
};

use crate::{
    count,
    interpreter::{MAX_BASE, field, read_user},
};

/// glibc keeps the first 32 keys' values in the thread descriptor itself.
const TSD_FIRST_BLOCK_KEYS: u32 = 32;
const TSD_ENTRY_BYTES: u64 = 16;
const TSD_DATA_OFFSET: u64 = 8;

/// Every supported layout keeps the fields the walker reads within the
/// first bytes of a frame; a frame at the very end of a mapping may not
/// allow the full read, so a failed full read is retried with this many.
const FRAME_READ_SHORT: u32 = 72;

/// Starts the walk at the innermost frame of the current thread; false
/// (counted) when the thread has no interpreter state or it could not be
/// read.
///
/// # Safety
///
/// `scratch` is this CPU's scratch slot with a walk set up for a Python
/// process, owned by the walker until it returns.
#[inline(always)]
pub unsafe fn first_frame(scratch: *mut SampleScratch) -> bool {
    // SAFETY: the caller's promise; plain data, copied.
    let process = unsafe { (*scratch).walk.layout };
    let layout = unsafe { process.layout.python };
    let Some(frame) = (unsafe { thread_frame(&layout, process.task_thread_pointer) }) else {
        return false;
    };
    // SAFETY: a field of the valid scratch slot.
    unsafe { write_volatile(addr_of_mut!((*scratch).walk.frame), frame) };
    frame != 0
}

/// The innermost frame of the current thread, or `None` (counted) when the
/// thread has no interpreter state or it could not be read.
///
/// # Safety
///
/// None beyond the helpers' own: every address is checked by the kernel.
#[inline(always)]
unsafe fn thread_frame(layout: &PythonLayout, task_thread_pointer: u32) -> Option<u64> {
    // `Py_tss_t`: `{ int _is_initialized; pthread_key_t _key; }`.
    let Ok(key) = (unsafe { read_user::<[u32; 2]>(layout.tss_key_address) }) else {
        count(Counter::InterpreterReadFailed);
        return None;
    };
    if key[0] == 0 || key[1] >= TSD_FIRST_BLOCK_KEYS {
        count(Counter::InterpreterNoThreadState);
        return None;
    }
    // SAFETY: a helper without arguments; the value is only used as an
    // address for the checked read below.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: the helper checks the address; a bad one is an error.
    let Ok(thread_pointer) =
        (unsafe { bpf_probe_read_kernel((task + task_thread_pointer as u64) as *const u64) })
    else {
        count(Counter::InterpreterReadFailed);
        return None;
    };
    let slot = thread_pointer
        + layout.tsd_first_block as u64
        + key[1] as u64 * TSD_ENTRY_BYTES
        + TSD_DATA_OFFSET;
    let thread_state = match unsafe { read_user::<u64>(slot) } {
        Ok(0) => {
            count(Counter::InterpreterNoThreadState);
            return None;
        }
        Ok(state) => state,
        Err(()) => {
            count(Counter::InterpreterReadFailed);
            return None;
        }
    };
    let Ok(mut frame) = (unsafe { read_user::<u64>(thread_state + layout.thread_frame as u64) })
    else {
        count(Counter::InterpreterReadFailed);
        return None;
    };
    if layout.cframe_current_frame != NO_OFFSET && frame != 0 {
        let Ok(current) = (unsafe { read_user::<u64>(frame + layout.cframe_current_frame as u64) })
        else {
            count(Counter::InterpreterReadFailed);
            return None;
        };
        frame = current;
    }
    Some(frame)
}

/// One step of the walk: looks at `walk.frame`, records it unless it is a
/// shim, and moves to its caller. False when the walk is over.
///
/// # Safety
///
/// As [`walk`].
#[inline(always)]
pub unsafe fn step(scratch: *mut SampleScratch) -> bool {
    // Everything a step needs is loaded from the map (volatile: not
    // carried over in registers from the previous step), where the
    // verifier sees unknown values, and its results go straight back
    // there; what it computes is branch-free where it can be. The paths
    // through one step then end alike, and each step is checked once
    // rather than once per combination of earlier outcomes.
    // SAFETY: the caller's promise; only field addresses are taken.
    let walk = unsafe { addr_of_mut!((*scratch).walk) };
    let layout = unsafe { addr_of!((*walk).layout.layout.python) };
    // SAFETY (the volatile loads below): fields of the valid scratch slot.
    let frame = unsafe { read_volatile(addr_of!((*walk).frame)) };
    let recorded = unsafe { read_volatile(addr_of!((*walk).recorded)) };
    let base = unsafe { read_volatile(addr_of!((*walk).base)) } as usize;
    if frame == 0 || recorded >= MAX_INTERPRETER_FRAMES as u32 || base > MAX_BASE {
        return false;
    }
    // SAFETY: only the field's address is taken.
    let buffer = unsafe { addr_of_mut!((*scratch).frame) } as *mut u64;
    if unsafe { read_frame(buffer as *mut u8, frame) }.is_err() {
        // SAFETY: a field of the valid scratch slot.
        unsafe { (*walk).flags |= sample_flags::INTERPRETER_READ_FAILED };
        return false;
    }
    let frame_field = |offset: *const u16| {
        // SAFETY: `offset` is a layout field; `field` bounds the read.
        unsafe { field(buffer, read_volatile(offset)) }
    };
    let marker = frame_field(unsafe { addr_of!((*layout).frame_entry) }) & 0xff;
    let kind = unsafe { read_volatile(addr_of!((*layout).entry)) } as u64;
    // 1 when equal, else 0, without a branch (both sides < 2^63).
    let equal = |a: u64, b: u64| (a ^ b).wrapping_sub(1) >> 63;
    let previous = frame_field(unsafe { addr_of!((*layout).frame_previous) });
    // A frame that is its own caller ends the walk (a chain read while the
    // interpreter changed it); nothing else could stop it before the bound.
    let next = if previous == frame { 0 } else { previous };
    // SAFETY: a field of the valid scratch slot.
    unsafe { write_volatile(addr_of_mut!((*walk).frame), next) };

    if equal(kind, PythonEntry::Shim as u64) & equal(marker, PYTHON_OWNER_CSTACK as u64) != 0 {
        // A shim: the frame recorded before it was its loop's entry.
        if recorded > 0 {
            // SAFETY: the caller's promise.
            unsafe { mark_entry(scratch, base, recorded - 1) };
        }
        return true;
    }
    let index = recorded as usize & (MAX_INTERPRETER_FRAMES - 1);
    // SAFETY: `base` <= MAX_BASE and `index` < MAX_INTERPRETER_FRAMES keep
    // the slot inside the tail.
    let slot = unsafe {
        (addr_of_mut!((*scratch).tail) as *mut u8).add(base + index * size_of::<InterpreterFrame>())
    } as *mut InterpreterFrame;
    let code = frame_field(unsafe { addr_of!((*layout).frame_code) });
    // Only a code object makes a frame: a read that raced the interpreter
    // pushing or popping a frame (or a stale pointer) yields something
    // else, and the walk stops rather than record garbage.
    // SAFETY: only the field's address is taken.
    let window = unsafe { addr_of_mut!((*scratch).code) } as *mut u64;
    // SAFETY: the buffer holds INTERPRETER_CODE_READ bytes; the helper
    // checks the user address.
    let read = unsafe {
        bpf_probe_read_user(
            window as *mut c_void,
            INTERPRETER_CODE_READ as u32,
            code as *const c_void,
        )
    };
    // SAFETY: word 1 (`ob_type`) lies inside the buffer.
    let code_type = unsafe { read_volatile(window.add(1)) };
    if read != 0 || code_type != unsafe { read_volatile(addr_of!((*layout).code_type)) } {
        // SAFETY: fields of the valid scratch slot.
        unsafe {
            (*walk).flags |= sample_flags::INTERPRETER_READ_FAILED;
            write_volatile(addr_of_mut!((*walk).frame), 0);
        }
        return false;
    }
    // `Index` keeps the low 32 bits (an int field), `Pointer` all 64.
    let pointer = unsafe { read_volatile(addr_of!((*layout).instruction)) } as u64 & 1;
    let instruction = frame_field(unsafe { addr_of!((*layout).frame_instruction) })
        & (u64::MAX >> (32 * (1 - pointer)));
    let marker_set = marker.wrapping_neg() >> 63;
    let entry = equal(kind, PythonEntry::EveryFrame as u64)
        | (equal(kind, PythonEntry::Flag as u64) & marker_set);
    // SAFETY: `field` bounds the read to the window.
    let stamp = unsafe { field(window, read_volatile(addr_of!((*layout).code_stamp))) };
    // SAFETY: `slot` lies inside the scratch tail (above).
    unsafe {
        write_volatile(addr_of_mut!((*slot).code), code);
        write_volatile(addr_of_mut!((*slot).instruction), instruction);
        write_volatile(
            addr_of_mut!((*slot).flags),
            entry as u32 * interpreter_frame_flags::ENTRY,
        );
        write_volatile(addr_of_mut!((*slot).data), 0);
        write_volatile(addr_of_mut!((*slot).stamp), stamp);
        write_volatile(addr_of_mut!((*walk).recorded), recorded + 1);
    }
    true
}

/// Reads a frame's first bytes into `buffer`, the whole read window if it
/// can, else the part every layout's fields fit in.
///
/// # Safety
///
/// `buffer` is the scratch slot's `frame` field.
#[inline(always)]
unsafe fn read_frame(buffer: *mut u8, frame: u64) -> Result<(), ()> {
    for size in [INTERPRETER_FRAME_READ as u32, FRAME_READ_SHORT] {
        // SAFETY: `size` is at most the buffer's length; the helper checks
        // the user address and fails on an unmapped one.
        if unsafe { bpf_probe_read_user(buffer as *mut c_void, size, frame as *const c_void) } == 0
        {
            return Ok(());
        }
    }
    Err(())
}

/// # Safety
///
/// As [`step`], with `base` at most MAX_BASE.
#[inline(always)]
unsafe fn mark_entry(scratch: *mut SampleScratch, base: usize, index: u32) {
    let index = index as usize & (MAX_INTERPRETER_FRAMES * 2 - 1);
    if index >= MAX_INTERPRETER_FRAMES || base > MAX_BASE {
        return;
    }
    const FLAGS: usize = 24;
    // SAFETY: as in `step`; the flags field lies inside the slot.
    unsafe {
        let tail = addr_of_mut!((*scratch).tail) as *mut u8;
        let flags = tail.add(base + index * size_of::<InterpreterFrame>() + FLAGS) as *mut u32;
        write_volatile(flags, read_volatile(flags) | interpreter_frame_flags::ENTRY);
    }
}

// The branch-free step relies on these values.
const _: () = assert!(INTERPRETER_CODE_READ == INTERPRETER_FRAME_READ);
const _: () = assert!(PythonInstruction::Index as u8 == 0 && PythonInstruction::Pointer as u8 == 1);
// Keep the flags offset used by `mark_entry` in step with the type.
const _: () = assert!(core::mem::offset_of!(InterpreterFrame, flags) == 24);
