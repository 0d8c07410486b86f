//! CRuby (MRI) 2.7, 3.1, 3.3 and 3.4 on x86-64.
//!
//! - [`inspect_object`]: is a mapped object the interpreter (`libruby`, or
//!   an executable with it linked in), which version, and where its
//!   running execution context, its symbol table and its interpreter loop
//!   (`vm_exec_core`) are. Those libruby does not export (the last two;
//!   since 3.3 the first too) are found by decoding the exported
//!   functions that use them (`code.rs`).
//! - [`walker_layout`]: the offsets the BPF walker follows from
//!   `ruby_single_main_ractor` (2.7: `ruby_current_execution_context_ptr`)
//!   to the running thread's control frames, per release (`layout.rs`,
//!   `releases.rs`).
//! - [`RubyNamer`]: names the control frames the walker recorded
//!   (`Class#method`, `Class.method`, `block in Class#method`,
//!   `Integer#times`, `<main>`, file and line), from the process's memory,
//!   with a byte-bounded cache of what it decoded: instruction sequences,
//!   method entries, class paths, symbol names.
//!
//! What the walker records of each frame (an
//! [`agent_common::InterpreterFrame`]): `code` is the frame's instruction
//! sequence (`cfp->iseq`, 0 for C functions), `instruction` its program
//! counter, `stamp` the method entry of its method (the `me_cref` word of
//! the method's environment, reached from a block's through up to three
//! previous environments: a method entry, a cref, or anything), `data` the
//! low half of its environment flags (frame type and `VM_FRAME_FLAG_*`).
//! All of them are read again, later, from a process that may have freed
//! and reused them meanwhile, or that forged them: every object's type is
//! checked where it is used, every length capped.
//!
//! Not supported: other releases (3.0 and 3.2 would be rows of the table
//! in `releases.rs`), builds whose layouts differ from Debian's (debug
//! checks, 3.1 with `USE_RVARGC`), frames of JIT-compiled code (Debian
//! builds 3.3 and 3.4 without YJIT; MJIT and RJIT are off unless asked
//! for), and other architectures than x86-64.

mod code;
mod layout;
mod lines;
mod namer;
mod names;
mod object;
mod read;
mod releases;

#[cfg(test)]
mod tests;

use std::fmt;

pub use layout::walker_layout;
pub use namer::{NameError, NamerCounts, RubyFrame, RubyNamer, RubyProcess};
pub use object::{RubyObject, inspect_object};

/// A CRuby release, from the interpreter's `ruby_version` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RubyVersion {
    pub major: u8,
    pub minor: u8,
    pub patch: u8,
}

impl RubyVersion {
    /// `"3.1.2"` (what `RUBY_VERSION` says); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split('.').map(|part| part.parse::<u8>().ok());
        let version = Self {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(version)
    }
}

impl fmt::Display for RubyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why an object that is a CRuby interpreter cannot be walked.
#[derive(Debug, thiserror::Error)]
pub enum RubyError {
    #[error("could not parse the interpreter object as ELF")]
    Parse {
        #[source]
        source: ::object::Error,
    },
    #[error("the interpreter object has no symbol {name}")]
    MissingSymbol { name: &'static str },
    #[error("the symbol {name} at {address:#x} has no bytes in the interpreter object")]
    UnreadableSymbol { name: &'static str, address: u64 },
    #[error("the interpreter's ruby_version is not a version: {text:?}")]
    UnknownVersion { text: String },
    #[error("CRuby {version} is not supported (2.7, 3.1, 3.3 and 3.4 are)")]
    UnsupportedVersion { version: RubyVersion },
    #[error(
        "no ruby_global_symbols: {function} does not compare an ID with a 32-bit static \
         (global_symbols.last_id) in its first {instructions} instructions"
    )]
    SymbolTableNotFound {
        function: &'static str,
        instructions: usize,
    },
    #[error(
        "no vm_exec_core: none of the {calls} functions {function} calls directly has \
         call frame information in .text"
    )]
    EvalLoopNotFound {
        function: &'static str,
        calls: usize,
    },
    #[error(
        "no {symbol}: it is not exported, and {function} does not compare it with 0 in its \
         first instructions"
    )]
    ContextNotFound {
        symbol: &'static str,
        function: &'static str,
    },
    #[error("could not read the interpreter's call frame information (.eh_frame)")]
    FrameInformation {
        #[source]
        source: gimli::Error,
    },
}
