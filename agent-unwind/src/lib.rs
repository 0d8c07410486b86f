//! firn's unwinder: turns a sample's user registers and stack copy into
//! frames. `dwarf` unwinds the copied stack frame by frame with the CFI of
//! every object on it; where it stops short of the outermost frame, the
//! rest is taken from the kernel's frame-pointer walk if the two meet.
//! How much stack there is to unwind depends on the process (the agent
//! decides):
//!
//! - Frame pointers: a small copy of the top of the stack. Its CFI unwind
//!   recovers what the kernel's walk lacks near the leaf (a function
//!   without a frame of its own hides its caller from the walk) and meets
//!   the walk below. If it cannot meet the walk, the walk is kept with its
//!   leaf repaired. Callers without frame pointers seen on the way tell the
//!   caller the process needs DWARF.
//! - DWARF: the whole copy (up to 64 KiB by default).
//!
//! No I/O: the caller describes the process's code through
//! [`ObjectLookup`] (which object is mapped where, and its bytes when
//! asked), and an address outside every mapping is reported in the
//! [`Outcome`] for the caller to re-read the maps, not looked up again
//! from in here.

mod cfi;
mod dwarf;
mod leaf;
mod recent;
mod survey;
mod unwinder;

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod fixture_tests;

pub use cfi::{Cfa, CfiContext, CfiError, CfiSource, Rule, UnwindRow};
pub use dwarf::{Code, CodeLookup, ForeignFrame, ForeignStep, Outcome, StackCopy, Stop, unwind};
pub use leaf::{LeafRepair, repair_leaf, stitch};
pub use survey::{FrameSurvey, ObjectFrames, is_go, survey};
pub use unwinder::{CacheCounts, Mapped, ObjectLookup, Sample, Unwinder, Unwound};

/// Most user frames of one stack: what the kernel's walk may hold, plus the
/// leaf's caller.
pub const MAX_USER_FRAMES: usize = agent_common::MAX_STACK_DEPTH + 1;
