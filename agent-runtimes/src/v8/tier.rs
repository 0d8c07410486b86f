//! Which of V8's tiers ran a frame, from the frame's own slots.
//!
//! Unoptimized frames (the Ignition interpreter's and Sparkplug's baseline
//! code) share one layout: below the function slot, the BytecodeArray being
//! run, then a Smi bytecode offset in an interpreted frame, or the
//! FeedbackVector in a baseline one (V8's
//! `kBytecodeOffsetOrFeedbackVectorFromFp`). Optimized frames (Maglev,
//! TurboFan) keep spill slots there instead, except code entered by
//! on-stack replacement (a long loop optimized while it runs), which
//! keeps the interpreter's frame: such a frame's pc is in generated code,
//! where an interpreted frame's is in the interpreter, one of V8's
//! builtins ([`V8Object::builtins_in_process`](super::V8Object::builtins_in_process)
//! says where they are). Where the caller cannot say, an OSR frame is
//! taken for an interpreted one; with `--interpreted-frames-native-stack`
//! (each function's interpreter entry copied into generated code), an
//! interpreted frame is taken for an optimized one.
//!
//! Maglev and TurboFan frames are not told apart: that needs the kind of
//! the frame's Code object ([`super::code`] finds it from the pc), and the
//! kinds that name Maglev and TurboFan code are not exported.

use std::ops::Range;

use super::{ChainFrame, Layout, NameError, heap::instance_type};
use crate::Memory;

/// A frame's tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Ignition, V8's bytecode interpreter.
    Interpreted,
    /// Sparkplug, the baseline compiler's code.
    Baseline,
    /// Maglev or TurboFan code.
    Optimized,
}

impl Tier {
    /// As V8's profiler and `--trace-opt` say them.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interpreted => "ignition",
            Self::Baseline => "sparkplug",
            Self::Optimized => "optimized",
        }
    }
}

/// The tier of a JavaScript frame (one whose function slot held a
/// JSFunction), from its slots as of the sample and the live heap.
pub(crate) fn frame_tier(
    memory: &mut dyn Memory,
    layout: &Layout,
    frame: &ChainFrame,
    builtins: &[Range<u64>],
) -> Result<Tier, NameError> {
    let [Some(bytecode_array), Some(offset_or_feedback)] = frame.bytecode else {
        return Ok(Tier::Optimized);
    };
    // A spill slot holding a small integer or another object is not a
    // BytecodeArray.
    if !layout.tagging.is_heap_object(bytecode_array)
        || instance_type(memory, layout, bytecode_array)? != layout.types.bytecode_array
    {
        return Ok(Tier::Optimized);
    }
    if layout.tagging.is_smi(offset_or_feedback) {
        let in_builtins = builtins.iter().any(|range| range.contains(&frame.pc));
        if builtins.is_empty() || in_builtins {
            Ok(Tier::Interpreted)
        } else {
            Ok(Tier::Optimized)
        }
    } else if layout.tagging.is_heap_object(offset_or_feedback) {
        Ok(Tier::Baseline)
    } else {
        Ok(Tier::Optimized)
    }
}
