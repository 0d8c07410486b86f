//! HotSpot (OpenJDK's JVM) on x86-64: Java frames named from the JVM's own
//! structure tables.
//!
//! - [`inspect_object`]: is a mapped object `libjvm.so`, and where its
//!   structure tables are (`gHotSpotVMStructs` and the rest: exported
//!   symbols that hold, once the JVM started, pointers to arrays
//!   describing its C++ types, fields and constants).
//! - [`VmTables::read`]: those tables, read out of the process.
//! - [`Layout::new`]: the offsets firn follows, from the tables alone, so a
//!   JDK firn has never seen works when its tables name the same fields;
//!   a field missing is an error naming it, never a guess.
//! - [`CodeCache`]: the code blob holding a pc (the code heaps' segment
//!   maps), its kind and frame size.
//! - [`step`]: one Java frame unwound over the sample's stack copy.
//! - [`MethodNamer`]: a `Method*` as `package.Class.method`, its signature
//!   and source file, the line of a bytecode index; the scopes of a
//!   compiled pc, inlined methods included.
//!
//! Everything read comes from a process that may be hostile or have moved
//! on since the sample (methods compiled, made not entrant, freed; classes
//! unloaded): every pointer is checked for what it should point at, and a
//! frame that fails is reported as an error, not named wrongly.

mod codecache;
mod layout;
mod method;
mod names;
mod object;
mod read;
mod scopes;
mod stream;
mod tables;
mod threads;
mod unwind;

#[cfg(test)]
mod tests;

pub use codecache::{BlobCounts, BlobKind, CodeBlob, CodeCache};
pub use layout::{Layout, LayoutError};
pub use method::{JavaMethod, MethodNamer, NamerCounts};
pub use names::{FrameKind, JavaNamer, NamedJavaFrame};
pub use object::{JvmObject, inspect_object};
pub use scopes::{NmethodDebug, Scope, scopes_at};
pub use stream::Coding;
pub use tables::{Field, TableError, VmTables};
pub use threads::{ObjectLayout, ThreadLayout, java_threads};
pub use unwind::{FrameRegs, JavaFrame, Step, step};

/// Why something of the JVM could not be read or made sense of.
#[derive(Debug, thiserror::Error)]
pub enum HotSpotError {
    #[error("reading the JVM's memory failed")]
    Read {
        #[source]
        source: crate::MemoryError,
    },
    #[error("{what} at {address:#x} is not valid: {why}")]
    Invalid {
        what: &'static str,
        address: u64,
        why: &'static str,
    },
}

impl From<crate::MemoryError> for HotSpotError {
    fn from(source: crate::MemoryError) -> Self {
        Self::Read { source }
    }
}

pub(crate) fn invalid(what: &'static str, address: u64, why: &'static str) -> HotSpotError {
    HotSpotError::Invalid { what, address, why }
}
