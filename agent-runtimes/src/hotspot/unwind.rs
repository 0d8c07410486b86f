//! Unwinding one Java frame on x86-64, from the code blob its pc is in and
//! the copy of the stack taken at the sample (no other memory is read: the
//! slots of interpreted frames are as they were when the sample was
//! taken).
//!
//! - Interpreted frames are rbp-based: the return address at rbp + 8, the
//!   caller's rbp at rbp, the caller's stack pointer as it called in the
//!   sender-sp slot; the `Method*` and the bytecode pointer in slots
//!   below rbp.
//! - Compiled methods, native wrappers and stubs with a frame size: the
//!   caller's stack pointer is the frame's plus its size, the return
//!   address just below it and the saved rbp below that. Where the
//!   interrupted pc is in the prologue or epilogue, the frame may be
//!   partly built: the candidates are tried in turn, and a return address
//!   must be in the code cache (every caller of Java code is Java code, an
//!   adapter or the call stub, all in the code cache).
//! - Stubs without a frame size (the call stub, most `StubRoutines`) keep
//!   rbp-based frames, or none when interrupted at their start.

use std::sync::Arc;

use super::{
    HotSpotError,
    codecache::{BlobKind, CodeBlob, CodeCache},
    invalid,
    layout::Layout,
};

/// A frame's registers as the unwind knows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: Option<u64>,
}

/// What naming a Java frame needs, taken at unwind time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JavaFrame {
    /// The `Method*` and bytecode pointer from the frame's slots.
    Interpreted { method: u64, bcp: u64 },
    /// A compiled method: its scopes are those of `pc` in the nmethod
    /// whose code starts at `code`; `exact` when `pc` is a return address
    /// (with a pc desc of its own).
    Compiled {
        code: u64,
        method: u64,
        compile_id: i32,
        pc: u64,
        exact: bool,
        tier: u8,
    },
    /// The wrapper of a `native` method.
    Native { method: u64 },
    /// Generated code without a Java method, by its blob's name.
    Stub { name: Arc<str> },
}

/// One frame unwound: the caller's registers and what the frame was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub caller: FrameRegs,
    pub frame: JavaFrame,
}

/// Unwinds the frame at `regs`, whose pc is in `blob`. `interrupted`: the
/// pc was interrupted there (the leaf), rather than being a return
/// address. `stack` reads a word of the stack copy.
pub fn step(
    cache: &CodeCache,
    layout: &Layout,
    blob: &CodeBlob,
    regs: FrameRegs,
    interrupted: bool,
    stack: &dyn Fn(u64) -> Option<u64>,
) -> Result<Step, HotSpotError> {
    let frame = match blob.kind {
        BlobKind::Interpreter => return interpreted(layout, regs, stack),
        BlobKind::Compiled { tier } => JavaFrame::Compiled {
            code: blob.code.start,
            method: blob.method,
            compile_id: blob.compile_id,
            pc: regs.ip,
            exact: !interrupted,
            tier,
        },
        BlobKind::Native => JavaFrame::Native {
            method: blob.method,
        },
        // The call stub's blob holds other stubs too: the call stub is
        // the one Java code returns to.
        BlobKind::Stub if regs.ip == cache.call_stub_return => JavaFrame::Stub {
            name: "call_stub".into(),
        },
        BlobKind::Stub => JavaFrame::Stub {
            name: blob.name.clone(),
        },
    };
    let caller = if blob.frame_size > 0 {
        sized(cache, blob, regs, interrupted, stack)?
    } else {
        frameless(cache, regs, interrupted, stack)?
    };
    Ok(Step { caller, frame })
}

fn interpreted(
    layout: &Layout,
    regs: FrameRegs,
    stack: &dyn Fn(u64) -> Option<u64>,
) -> Result<Step, HotSpotError> {
    let slots = layout.interpreter_frame;
    let bp = regs
        .bp
        .filter(|&bp| bp >= regs.sp && bp.is_multiple_of(8))
        .ok_or_else(|| invalid("an interpreted frame", regs.sp, "rbp is not a frame"))?;
    let slot = |words: i64| {
        bp.checked_add_signed(words * 8)
            .and_then(stack)
            .ok_or_else(|| invalid("an interpreted frame", bp, "slots beyond the stack copy"))
    };
    let method = slot(slots.method)?;
    let bcp = slot(slots.bcp)?;
    let ip = slot(1)?;
    let caller_bp = slot(0)?;
    // The caller's stack pointer as it called: above this frame. A value
    // that is not is no sender sp, and the caller's frame starts right
    // above the return address.
    let sender_sp = slot(slots.sender_sp)
        .ok()
        .filter(|&sp| sp >= bp.saturating_add(16) && sp.is_multiple_of(8))
        .unwrap_or(bp.wrapping_add(16));
    Ok(Step {
        caller: FrameRegs {
            ip,
            sp: sender_sp,
            bp: Some(caller_bp),
        },
        frame: JavaFrame::Interpreted { method, bcp },
    })
}

/// A frame of known size: the caller's sp is the frame's plus its size,
/// unless the interrupted pc is where the frame is not (yet, or any more)
/// built.
fn sized(
    cache: &CodeCache,
    blob: &CodeBlob,
    regs: FrameRegs,
    interrupted: bool,
    stack: &dyn Fn(u64) -> Option<u64>,
) -> Result<FrameRegs, HotSpotError> {
    let built = FrameRegs {
        ip: 0,
        sp: regs.sp.wrapping_add(blob.frame_size),
        bp: stack(regs.sp.wrapping_add(blob.frame_size).wrapping_sub(16)),
    };
    // Nothing pushed yet (the entry), or rbp pushed and the frame not
    // yet made (or already popped).
    let bare = FrameRegs {
        ip: 0,
        sp: regs.sp.wrapping_add(8),
        bp: regs.bp,
    };
    let pushed = FrameRegs {
        ip: 0,
        sp: regs.sp.wrapping_add(16),
        bp: stack(regs.sp),
    };
    let candidates: &[FrameRegs] = if !interrupted {
        return with_return_address(built, stack)
            .ok_or_else(|| invalid("a compiled frame", regs.sp, "beyond the stack copy"));
    } else if blob
        .frame_complete
        .is_some_and(|complete| regs.ip < complete)
    {
        &[bare, pushed, built]
    } else {
        &[built, bare, pushed]
    };
    candidates
        .iter()
        .filter_map(|&candidate| with_return_address(candidate, stack))
        .find(|caller| cache.contains(caller.ip))
        .ok_or_else(|| {
            invalid(
                "a compiled frame",
                regs.sp,
                "no return address into Java code",
            )
        })
}

/// A stub without a frame size: interrupted at its start with the return
/// address at sp, or with an rbp-based frame.
fn frameless(
    cache: &CodeCache,
    regs: FrameRegs,
    interrupted: bool,
    stack: &dyn Fn(u64) -> Option<u64>,
) -> Result<FrameRegs, HotSpotError> {
    if interrupted
        && let Some(caller) = with_return_address(
            FrameRegs {
                ip: 0,
                sp: regs.sp.wrapping_add(8),
                bp: regs.bp,
            },
            stack,
        )
        && cache.contains(caller.ip)
    {
        return Ok(caller);
    }
    let bp = regs
        .bp
        .filter(|&bp| bp >= regs.sp && bp.is_multiple_of(8))
        .ok_or_else(|| invalid("a stub frame", regs.sp, "rbp is not a frame"))?;
    Ok(FrameRegs {
        ip: stack(bp.wrapping_add(8))
            .ok_or_else(|| invalid("a stub frame", bp, "beyond the stack copy"))?,
        sp: bp.wrapping_add(16),
        bp: stack(bp),
    })
}

/// `caller` with its return address (just below its sp) filled in.
fn with_return_address(caller: FrameRegs, stack: &dyn Fn(u64) -> Option<u64>) -> Option<FrameRegs> {
    let ip = stack(caller.sp.wrapping_sub(8))?;
    (ip != 0).then_some(FrameRegs { ip, ..caller })
}
