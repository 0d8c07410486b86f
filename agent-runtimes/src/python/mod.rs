//! CPython 3.8 to 3.13 on x86-64 glibc.
//!
//! - [`inspect_object`]: is a mapped object the interpreter, which version,
//!   where are `_PyRuntime` and the interpreter loop.
//! - [`walker_layout`]: the offsets the BPF walker follows from the thread
//!   state (found through `_PyRuntime`'s pthread key) along the frame
//!   chain, per minor version.
//! - [`PythonNamer`]: names the frames the walker recorded, from the
//!   process's memory, with a byte-bounded cache of decoded code objects.

mod layout;
mod lines;
mod namer;
mod object;
mod read;

#[cfg(test)]
mod tests;

use std::fmt;

pub use layout::walker_layout;
pub use namer::{NameError, NamerCounts, PythonFrame, PythonNamer, SharedObject};
pub use object::{PythonObject, inspect_mapped_object, inspect_object, loads_libpython};

/// A CPython version. `patch` is 0 when only a file name told the version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PythonVersion {
    pub major: u8,
    pub minor: u8,
    pub patch: u8,
}

impl PythonVersion {
    /// From `PY_VERSION_HEX` (`0xMMmmpp..`: major, minor, micro, then the
    /// release level and serial).
    pub fn from_hex(hex: u64) -> Self {
        Self {
            major: (hex >> 24) as u8,
            minor: (hex >> 16) as u8,
            patch: (hex >> 8) as u8,
        }
    }
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why an object that is a CPython interpreter cannot be walked.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("could not parse the interpreter object as ELF")]
    Parse {
        #[source]
        source: ::object::Error,
    },
    #[error("the interpreter object has no symbol {name}")]
    MissingSymbol { name: &'static str },
    #[error("the symbol {name} at {address:#x} has no bytes in the interpreter object")]
    UnreadableSymbol { name: &'static str, address: u64 },
    #[error("the interpreter's version is not known (no Py_Version, no version in the file name)")]
    UnknownVersion,
    #[error("CPython {version} is not supported (3.8 to 3.13 are)")]
    UnsupportedVersion { version: PythonVersion },
    #[error("{file_name} is a {build} build of CPython, which is not supported")]
    UnsupportedBuild {
        file_name: String,
        build: &'static str,
    },
}
