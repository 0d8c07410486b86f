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
//! `PythonProcess`: this code knows no CPython version.

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use agent_common::{
    Counter, ExecutableKey, INTERPRETER_CODE_READ, INTERPRETER_FRAME_READ, InterpreterFrame,
    MAX_INTERPRETER_FRAMES, MAX_INTERPRETER_PROCESSES, MAX_PYTHON_EXECUTABLES, MAX_STACK_COPY,
    PYTHON_NO_OFFSET, PYTHON_OWNER_CSTACK, PythonEntry, PythonInstruction, PythonProcess,
    STACKS_BYTES, SampleScratch, interpreter_frame_flags, sample_flags,
};
use aya_ebpf::{
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_user},
    },
    macros::map,
    maps::{HashMap, LruHashMap},
};

use crate::{count, count_by};

/// The walker's layout per tgid, written by the daemon.
#[map]
pub static PYTHON_PROCESSES: HashMap<u32, PythonProcess> =
    HashMap::with_max_entries(MAX_INTERPRETER_PROCESSES, 0);

/// Layouts of interpreters in executables loaded at a fixed address, by
/// executable, written by the daemon once it registered one of their
/// processes: a new process of one is registered at its exec (`exec`).
#[map]
pub static PYTHON_EXECUTABLES: LruHashMap<ExecutableKey, PythonProcess> =
    LruHashMap::with_max_entries(MAX_PYTHON_EXECUTABLES, 0);

/// A new image of `tgid` from `executable`: when the daemon stored the
/// layout of processes of this executable, the process is walked from its
/// first samples, before the daemon has read its maps (which it then
/// checks). The stored `wake_until_ms` is a duration from now.
#[inline(always)]
pub fn exec(tgid: u32, executable: &ExecutableKey) {
    // SAFETY: copied out at once.
    let Some(layout) = (unsafe { PYTHON_EXECUTABLES.get(executable) }).copied() else {
        return;
    };
    // SAFETY: a helper without arguments or preconditions.
    let now = (unsafe { bpf_ktime_get_ns() } / 1_000_000) as u32;
    let layout = PythonProcess {
        wake_until_ms: now.wrapping_add(layout.wake_until_ms).max(1),
        ..layout
    };
    // A full map: the daemon's own registration tries again, and counts.
    let _ = PYTHON_PROCESSES.insert(&tgid, &layout, 0);
}

/// Steps allowed per walk: shim frames (3.12+) take a step without being
/// recorded, one per call of the interpreter loop.
const MAX_STEPS: u32 = 2 * MAX_INTERPRETER_FRAMES as u32;

/// Steps per run of the walker program, which calls itself for the next
/// ones: the verifier checks these, not all MAX_STEPS (each step is ~700
/// instructions to verify, 16 steps ~3 ms at every start), and the kernel's
/// limit of 33 tail calls leaves room for the whole walk (16 runs).
const STEPS_PER_RUN: u32 = 16;
const _: () = assert!(MAX_STEPS.div_ceil(STEPS_PER_RUN) < 33);

/// Where the frames may start in the tail at the latest: after both
/// stacks and the largest stack copy.
const MAX_BASE: usize = STACKS_BYTES + MAX_STACK_COPY;

/// glibc keeps the first 32 keys' values in the thread descriptor itself.
const TSD_FIRST_BLOCK_KEYS: u32 = 32;
const TSD_ENTRY_BYTES: u64 = 16;
const TSD_DATA_OFFSET: u64 = 8;

/// Every supported layout keeps the fields the walker reads within the
/// first bytes of a frame; a frame at the very end of a mapping may not
/// allow the full read, so a failed full read is retried with this many.
const FRAME_READ_SHORT: u32 = 72;

/// Sets up the walk of the current thread's interpreter frames when `tgid`
/// is a registered interpreter and the thread has a frame; the frames will
/// be written from `base` in `scratch.tail` on. False when there is
/// nothing to walk (counted).
///
/// # Safety
///
/// `scratch` is this CPU's scratch slot, owned by the sampling program
/// until it returns.
#[inline(always)]
pub unsafe fn start(scratch: *mut SampleScratch, tgid: u32, base: usize) -> bool {
    // SAFETY: copied out at once; the daemon replacing the entry meanwhile
    // only means this sample walks with the old layout.
    let Some(layout) = (unsafe { PYTHON_PROCESSES.get(&tgid) }).copied() else {
        return false;
    };
    count(Counter::InterpreterWalks);
    let Some(first) = (unsafe { first_frame(&layout) }) else {
        return false;
    };
    // SAFETY: the caller's promise; `walk` is plain data.
    let walk = unsafe { &mut *addr_of_mut!((*scratch).walk) };
    walk.layout = layout;
    walk.frame = first;
    walk.recorded = 0;
    walk.flags = 0;
    walk.base = base as u32;
    walk.steps = 0;
    true
}

/// Takes up to STEPS_PER_RUN steps of the walk; true when it is not over.
///
/// # Safety
///
/// As [`start`], for the walker program, with a walk set up by it.
#[inline(always)]
pub unsafe fn steps(scratch: *mut SampleScratch) -> bool {
    for _ in 0..STEPS_PER_RUN {
        // SAFETY: the caller's promise.
        if !unsafe { step(scratch) } {
            return false;
        }
    }
    // SAFETY: a field of the valid scratch slot.
    let taken = unsafe { addr_of_mut!((*scratch).walk.steps) };
    let steps = unsafe { read_volatile(taken) } + STEPS_PER_RUN;
    unsafe { write_volatile(taken, steps) };
    steps < MAX_STEPS
}

/// Ends the walk: its flags and frame count go into the record, and what
/// went wrong is counted. Returns the tail bytes the sample carries: the
/// stacks, the stack copy and the frames.
///
/// # Safety
///
/// As [`steps`].
#[inline(always)]
pub unsafe fn finish(scratch: *mut SampleScratch) -> usize {
    // SAFETY: the caller's promise; both are plain data.
    let walk = unsafe { &mut *addr_of_mut!((*scratch).walk) };
    let record = unsafe { &mut *addr_of_mut!((*scratch).record) };
    let failed = walk.flags & sample_flags::INTERPRETER_READ_FAILED != 0;
    if walk.frame != 0 && !failed {
        walk.flags |= sample_flags::INTERPRETER_TRUNCATED;
        count(Counter::InterpreterTruncated);
    }
    if failed {
        count(Counter::InterpreterReadFailed);
    }
    record.flags |= walk.flags;
    let mut recorded = walk.recorded as usize;
    if recorded > MAX_INTERPRETER_FRAMES {
        recorded = MAX_INTERPRETER_FRAMES;
    }
    count_by(Counter::InterpreterFrames, recorded as u64);
    record.interpreter_frames = recorded as u32;
    let mut base = walk.base as usize;
    if base > MAX_BASE {
        base = MAX_BASE;
    }
    base + recorded * size_of::<InterpreterFrame>()
}

/// The innermost frame of the current thread, or `None` (counted) when the
/// thread has no interpreter state or it could not be read.
///
/// # Safety
///
/// None beyond the helpers' own: every address is checked by the kernel.
#[inline(always)]
unsafe fn first_frame(layout: &PythonProcess) -> Option<u64> {
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
    let Ok(thread_pointer) = (unsafe {
        bpf_probe_read_kernel((task + layout.task_thread_pointer as u64) as *const u64)
    }) else {
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
    if layout.cframe_current_frame != PYTHON_NO_OFFSET && frame != 0 {
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
unsafe fn step(scratch: *mut SampleScratch) -> bool {
    // Everything a step needs is loaded from the map (volatile: not
    // carried over in registers from the previous step), where the
    // verifier sees unknown values, and its results go straight back
    // there; what it computes is branch-free where it can be. The paths
    // through one step then end alike, and each step is checked once
    // rather than once per combination of earlier outcomes.
    // SAFETY: the caller's promise; only field addresses are taken.
    let walk = unsafe { addr_of_mut!((*scratch).walk) };
    let layout = unsafe { addr_of!((*walk).layout) };
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
        write_volatile(addr_of_mut!((*slot).reserved), 0);
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

/// The eight bytes of a read window (a frame's or a code object's) from
/// `offset` on, as a little-endian u64; callers keep the part they need.
/// Two aligned loads and shifts, no branch: a field may straddle two
/// words (the code stamp does).
///
/// # Safety
///
/// `buffer` is one of the scratch slot's 8-aligned read windows, of
/// `INTERPRETER_FRAME_READ` bytes.
#[inline(always)]
unsafe fn field(buffer: *const u64, offset: u16) -> u64 {
    const WORDS: usize = INTERPRETER_FRAME_READ / 8;
    let word = (offset as usize >> 3) & (WORDS - 1);
    let next = (word + 1) & (WORDS - 1);
    let shift = (offset as u64 & 7) * 8;
    // SAFETY: both indexes are below WORDS, inside the buffer.
    let (low, high) = unsafe {
        (
            read_volatile(buffer.add(word)),
            read_volatile(buffer.add(next)),
        )
    };
    // `high << (64 - shift)`, written so that a zero shift gives zero.
    (low >> shift) | ((high << 1) << (63 - shift))
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

/// # Safety
///
/// None: the helper checks the address.
#[inline(always)]
unsafe fn read_user<T: Copy>(address: u64) -> Result<T, ()> {
    let mut value = core::mem::MaybeUninit::<T>::uninit();
    // SAFETY: the destination is a local of the right size; the helper
    // checks the source address.
    let ret = unsafe {
        bpf_probe_read_user(
            value.as_mut_ptr() as *mut c_void,
            size_of::<T>() as u32,
            address as *const c_void,
        )
    };
    if ret == 0 {
        // SAFETY: the helper filled every byte.
        Ok(unsafe { value.assume_init() })
    } else {
        Err(())
    }
}

// The branch-free step relies on these values.
const _: () = assert!(INTERPRETER_CODE_READ == INTERPRETER_FRAME_READ);
const _: () = assert!(PythonInstruction::Index as u8 == 0 && PythonInstruction::Pointer as u8 == 1);
const _: () = assert!(MAX_INTERPRETER_FRAMES.is_power_of_two());
// Keep the flags offset used by `mark_entry` in step with the type.
const _: () = assert!(core::mem::offset_of!(InterpreterFrame, flags) == 24);
