//! What every interpreter walker shares: the table of interpreter
//! processes by tgid (each entry says which interpreter and its layout),
//! the walk's set-up in the sampler, the dispatch to the kind's walker
//! program, and the end of the walk. The walkers themselves (`python`,
//! `ruby`) only find a thread's first frame and take one step at a time.
//!
//! A walk runs in the walker program of its kind, a few steps per run,
//! calling itself for the next ones: the verifier checks those steps, not
//! a whole walk, in one program, and the kernel's limit of 33 tail calls
//! leaves room for the whole walk.

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of_mut, read_volatile, write_volatile},
};

use agent_common::{
    Counter, ExecutableKey, INTERPRETER_FRAME_READ, InterpreterFrame, InterpreterKind,
    InterpreterProcess, MAX_INTERPRETER_EXECUTABLES, MAX_INTERPRETER_FRAMES,
    MAX_INTERPRETER_PROCESSES, MAX_STACK_COPY, STACKS_BYTES, SampleScratch, sample_flags,
};
use aya_ebpf::{
    helpers::generated::{bpf_ktime_get_ns, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, LruHashMap},
};

use crate::{count, count_by, python, ruby};

/// Each interpreter process's kind and layout, by tgid, written by the
/// daemon.
#[map]
pub static INTERPRETER_PROCESSES: HashMap<u32, InterpreterProcess> =
    HashMap::with_max_entries(MAX_INTERPRETER_PROCESSES, 0);

/// Layouts of interpreters in executables loaded at a fixed address, by
/// executable, written by the daemon once it registered one of their
/// processes: a new process of one is registered at its exec (`exec`).
#[map]
pub static INTERPRETER_EXECUTABLES: LruHashMap<ExecutableKey, InterpreterProcess> =
    LruHashMap::with_max_entries(MAX_INTERPRETER_EXECUTABLES, 0);

/// Steps allowed per walk: CPython's shim frames (3.12+) and CRuby's
/// frames of C code without a method take a step each without being
/// recorded, or being worth little.
pub const MAX_STEPS: u32 = 2 * MAX_INTERPRETER_FRAMES as u32;

/// Steps per run of a walker program (see the module's notes): each step
/// is some 700 instructions to verify.
pub const STEPS_PER_RUN: u32 = 16;
const _: () = assert!(MAX_STEPS.div_ceil(STEPS_PER_RUN) < 33);

/// Where the frames may start in the tail at the latest: after both
/// stacks and the largest stack copy.
pub const MAX_BASE: usize = STACKS_BYTES + MAX_STACK_COPY;

/// A new image of `tgid` from `executable`: when the daemon stored the
/// layout of processes of this executable, the process is walked from its
/// first samples, before the daemon has read its maps (which it then
/// checks). The stored `wake_until_ms` is a duration from now.
#[inline(always)]
pub fn exec(tgid: u32, executable: &ExecutableKey) {
    // SAFETY: copied out at once.
    let Some(layout) = (unsafe { INTERPRETER_EXECUTABLES.get(executable) }).copied() else {
        return;
    };
    // SAFETY: a helper without arguments or preconditions.
    let now = (unsafe { bpf_ktime_get_ns() } / 1_000_000) as u32;
    let layout = InterpreterProcess {
        wake_until_ms: now.wrapping_add(layout.wake_until_ms).max(1),
        ..layout
    };
    // A full map: the daemon's own registration tries again, and counts.
    let _ = INTERPRETER_PROCESSES.insert(&tgid, &layout, 0);
}

/// The image of `tgid` is gone (exec or exit): so is its layout.
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = INTERPRETER_PROCESSES.remove(&tgid);
}

/// Sets up the walk of the current thread's interpreter frames when `tgid`
/// is a registered interpreter; the frames will be written from `base` in
/// `scratch.tail` on. Returns the interpreter's kind, the index of the
/// walker program to hand over to.
///
/// # Safety
///
/// `scratch` is this CPU's scratch slot, owned by the sampling program
/// until it returns.
#[inline(always)]
pub unsafe fn start(scratch: *mut SampleScratch, tgid: u32, base: usize) -> Option<u32> {
    // SAFETY: copied out at once; the daemon replacing the entry meanwhile
    // only means this sample walks with the old layout.
    let layout = (unsafe { INTERPRETER_PROCESSES.get(&tgid) }).copied()?;
    if layout.kind >= InterpreterKind::COUNT {
        return None;
    }
    count(Counter::InterpreterWalks.of_kind(layout.kind));
    // SAFETY: the caller's promise; `walk` is plain data.
    let walk = unsafe { &mut *addr_of_mut!((*scratch).walk) };
    walk.layout = layout;
    walk.frame = 0;
    walk.end = 0;
    walk.recorded = 0;
    walk.flags = 0;
    walk.base = base as u32;
    walk.steps = 0;
    walk.started = 0;
    Some(layout.kind)
}

/// Takes up to STEPS_PER_RUN steps of the walk of kind `KIND`, after
/// finding its first frame on the first run; true when it is not over.
///
/// # Safety
///
/// `scratch` is this CPU's scratch slot with a walk set up by [`start`],
/// owned by the walker program chain until it returns.
#[inline(always)]
pub unsafe fn run<const KIND: u32>(scratch: *mut SampleScratch) -> bool {
    // SAFETY: fields of the valid scratch slot.
    let started = unsafe { addr_of_mut!((*scratch).walk.started) };
    if unsafe { read_volatile(started) } == 0 {
        unsafe { write_volatile(started, 1) };
        // SAFETY: the caller's promise.
        let found = match KIND {
            k if k == InterpreterKind::Python as u32 => unsafe { python::first_frame(scratch) },
            _ => unsafe { ruby::first_frame(scratch) },
        };
        if !found {
            return false;
        }
    }
    for _ in 0..STEPS_PER_RUN {
        // SAFETY: the caller's promise.
        let more = match KIND {
            k if k == InterpreterKind::Python as u32 => unsafe { python::step(scratch) },
            _ => unsafe { ruby::step(scratch) },
        };
        if !more {
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
/// As [`run`].
#[inline(always)]
pub unsafe fn finish<const KIND: u32>(scratch: *mut SampleScratch) -> usize {
    // SAFETY: the caller's promise; both are plain data.
    let walk = unsafe { &mut *addr_of_mut!((*scratch).walk) };
    let record = unsafe { &mut *addr_of_mut!((*scratch).record) };
    let failed = walk.flags & sample_flags::INTERPRETER_READ_FAILED != 0;
    if walk.frame != 0 && !failed {
        walk.flags |= sample_flags::INTERPRETER_TRUNCATED;
        count(Counter::InterpreterTruncated.of_kind(KIND));
    }
    if failed {
        count(Counter::InterpreterReadFailed.of_kind(KIND));
    }
    record.flags |= walk.flags;
    let mut recorded = walk.recorded as usize;
    if recorded > MAX_INTERPRETER_FRAMES {
        recorded = MAX_INTERPRETER_FRAMES;
    }
    count_by(Counter::InterpreterFrames.of_kind(KIND), recorded as u64);
    record.interpreter_frames = recorded as u32;
    let mut base = walk.base as usize;
    if base > MAX_BASE {
        base = MAX_BASE;
    }
    base + recorded * size_of::<InterpreterFrame>()
}

/// The slot of the `index`-th recorded frame in the tail, or `None` past
/// the last.
///
/// # Safety
///
/// `scratch` is a valid scratch slot.
#[inline(always)]
pub unsafe fn slot(
    scratch: *mut SampleScratch,
    base: usize,
    index: u32,
) -> Option<*mut InterpreterFrame> {
    if index >= MAX_INTERPRETER_FRAMES as u32 || base > MAX_BASE {
        return None;
    }
    let index = index as usize & (MAX_INTERPRETER_FRAMES - 1);
    // SAFETY: `base` <= MAX_BASE and `index` < MAX_INTERPRETER_FRAMES keep
    // the slot inside the tail.
    Some(unsafe {
        (addr_of_mut!((*scratch).tail) as *mut u8).add(base + index * size_of::<InterpreterFrame>())
    } as *mut InterpreterFrame)
}

/// Writes one recorded frame into `slot`.
///
/// # Safety
///
/// `slot` came from [`slot`].
#[inline(always)]
pub unsafe fn record(slot: *mut InterpreterFrame, frame: InterpreterFrame) {
    // SAFETY: the caller's promise; volatile so that each field is one
    // store the verifier checks once.
    unsafe {
        write_volatile(addr_of_mut!((*slot).code), frame.code);
        write_volatile(addr_of_mut!((*slot).instruction), frame.instruction);
        write_volatile(addr_of_mut!((*slot).flags), frame.flags);
        write_volatile(addr_of_mut!((*slot).data), frame.data);
        write_volatile(addr_of_mut!((*slot).stamp), frame.stamp);
    }
}

/// The eight bytes of a read window (a frame's or a code object's) from
/// `offset` on, as a little-endian u64; callers keep the part they need.
/// Two aligned loads and shifts, no branch: a field may straddle two
/// words (CPython's code stamp does).
///
/// # Safety
///
/// `buffer` is one of the scratch slot's 8-aligned read windows, of
/// `INTERPRETER_FRAME_READ` bytes.
#[inline(always)]
pub unsafe fn field(buffer: *const u64, offset: u16) -> u64 {
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
/// None: the helper checks the address.
#[inline(always)]
pub unsafe fn read_user<T: Copy>(address: u64) -> Result<T, ()> {
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

const _: () = assert!(MAX_INTERPRETER_FRAMES.is_power_of_two());
