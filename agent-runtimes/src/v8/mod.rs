//! V8 (Node.js and other embedders) on x86-64: JavaScript frames named
//! from V8's own post-mortem constants.
//!
//! - [`inspect_object`]: does a mapped object embed V8 with its
//!   post-mortem constants (`v8dbg_*` symbols), and their values, read
//!   from the object's bytes; where its embedded builtins are.
//! - [`Layout::new`]: the tagging, frame slots, instance types and field
//!   offsets firn follows, from those constants alone; a constant missing
//!   is an error naming it, never a guess.
//! - [`walk_chain`]: a sample's frame-pointer chain over its stack copy,
//!   with each frame's function slot as of the sample.
//! - [`V8Namer`]: a function slot's JSFunction as name, file and line
//!   (where the function starts, as V8's profiler places it), checked
//!   object by object against the live heap and cached; a frame's tier
//!   ([`Tier`]) from its slots.
//!
//! V8's generated code keeps frame pointers, so the native frame-pointer
//! walk already passes through JavaScript frames; each one holds its
//! JSFunction in a fixed slot below its frame pointer
//! ([`FrameSlots::function`]), the root of everything that names it.

mod code;
pub(crate) mod heap;
mod inlined;
mod layout;
mod namer;
mod object;
mod position;
mod prefetch;
mod receiver;
mod running;
mod scope;
mod tier;
mod walk;

#[cfg(test)]
mod tests;

pub use code::{CodeKind, CodeLayout, DeoptIndexes, MAX_CODE_BYTES};
pub use inlined::InlineError;
pub use layout::{
    Fields, FrameSlots, Layout, LayoutError, Receivers, ScopeInfoSlots, StringTags, Tagging, Types,
};
pub use namer::{JsFunction, NameError, NamerCounts, OptimizedFrame, V8Namer};
pub use object::{Constants, FileMapping, ObjectError, V8Object, inspect_object};
pub use position::Position;
pub use tier::Tier;
pub use walk::{ChainFrame, MAX_FRAMES, StackCopy, walk_chain};
