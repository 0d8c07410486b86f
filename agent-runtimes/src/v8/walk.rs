//! The frame-pointer chain of a sample, walked over its copy of the user
//! stack, with each frame's function slot as of the sample.
//!
//! V8's generated code (interpreter, baseline, Maglev, TurboFan) and its
//! builtins keep frame pointers, so the chain from the sample's `rbp`
//! passes through every JavaScript frame, and each holds its JSFunction at
//! [`FrameSlots::function`](super::FrameSlots) from its frame pointer. The
//! slot is read from the copy the BPF program made when the sample was
//! taken, not from the live process: by the time it is named the frame
//! may be gone. What the slot points at is then read live and checked
//! ([`V8Namer::name`](super::V8Namer::name)); most native frames hold
//! there something that is not a JSFunction, which the namer refuses.

use super::Layout;

/// Frames walked at most (V8's default stack holds about 10,000 small
/// frames; a profile needs fewer).
pub const MAX_FRAMES: usize = 512;

/// One frame of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainFrame {
    /// Where the frame's code was: the sample's instruction pointer for
    /// the innermost, else the return address its callee saved.
    pub pc: u64,
    /// The frame pointer.
    pub fp: u64,
    /// The word in the function slot, if the copy holds it.
    pub function: Option<u64>,
    /// The words in the bytecode array and bytecode offset slots, which
    /// tell unoptimized frames ([`V8Namer::tier`](super::V8Namer::tier)).
    pub bytecode: [Option<u64>; 2],
}

/// The stack copy of one sample: `bytes` from address `sp` on.
#[derive(Clone, Copy, Debug)]
pub struct StackCopy<'a> {
    pub sp: u64,
    pub bytes: &'a [u8],
}

impl StackCopy<'_> {
    fn word(&self, address: u64) -> Option<u64> {
        let offset = usize::try_from(address.checked_sub(self.sp)?).ok()?;
        let bytes = self.bytes.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

/// The chain from `bp`, innermost first, while it stays in the copy and
/// goes up the stack. The innermost frame's pc is `ip`: when the sample
/// hit a function before it pushed its frame (or one that pushes none),
/// `ip` is paired with its caller's frame, so a caller should only name
/// pcs that lie in V8's code.
pub fn walk_chain(stack: StackCopy<'_>, layout: &Layout, ip: u64, bp: u64) -> Vec<ChainFrame> {
    let mut frames = Vec::new();
    let mut pc = ip;
    let mut fp = bp;
    while frames.len() < MAX_FRAMES {
        let slot = |offset: i64| stack.word(fp.wrapping_add_signed(offset));
        let function = slot(layout.frame.function);
        let bytecode = [
            slot(layout.frame.bytecode_array),
            slot(layout.frame.bytecode_offset),
        ];
        let (Some(caller), Some(return_address)) = (stack.word(fp), stack.word(fp.wrapping_add(8)))
        else {
            if fp >= stack.sp {
                frames.push(ChainFrame {
                    pc,
                    fp,
                    function,
                    bytecode,
                });
            }
            break;
        };
        frames.push(ChainFrame {
            pc,
            fp,
            function,
            bytecode,
        });
        if caller <= fp {
            break;
        }
        pc = return_address;
        fp = caller;
    }
    frames
}
