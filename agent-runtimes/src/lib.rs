//! Interpreter runtimes: how firn finds and names the frames of programs
//! run by an interpreter or a JIT compiler (CPython, CRuby, HotSpot), whose native
//! stack shows only the interpreter's own loop or anonymous JIT code.
//!
//! HotSpot ([`hotspot`]) differs from the shape below: its frames are not
//! walked in BPF but unwound in userspace over the sample's stack copy,
//! with a layout read from the JVM's own structure tables; see its module.
//!
//! Every runtime has the same shape, split between kernel and userspace:
//!
//! - **detection**: from an object mapped by a process (its file name and
//!   ELF bytes), whether it is that runtime's interpreter, which version,
//!   and where its state is ([`python::inspect_object`],
//!   [`ruby::inspect_object`]);
//! - **a per-process layout** for the BPF walker: where to start (for
//!   CPython the thread state, through a pthread key, hence
//!   [`libc::glibc_thread_specific_offset`]) and the offsets of the few
//!   fields it follows from frame to frame ([`python::walker_layout`],
//!   an [`agent_common::PythonLayout`]; for CRuby the running execution
//!   context, [`ruby::walker_layout`]). At sample time the walker only
//!   records what identifies each frame ([`agent_common::InterpreterFrame`]:
//!   the code object's address, a stamp of it, the raw instruction field);
//! - **a namer** in userspace that turns such a record into function, file
//!   and line later, by reading the process's memory through [`Memory`]
//!   and caching what it decoded per code object ([`python::PythonNamer`],
//!   [`ruby::RubyNamer`]).
//!
//! The crate does no I/O of its own: it takes ELF bytes, and a [`Memory`]
//! the agent implements over the process (`process_vm_readv`), so its tests
//! run on checked-in fixtures.
//!
//! Not supported: CPython before 3.8 and from 3.14, free-threaded builds
//! (3.13t: other object and frame layouts), debug builds (`Py_DEBUG`
//! changes the object header), musl (its thread-specific data is laid out
//! differently; the agent checks [`libc::libc_kind`]), pthread keys of 32
//! and more (glibc keeps them in a second-level block), and interpreters
//! on other architectures than x86-64.

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod hotspot;
pub mod libc;
pub mod python;
pub mod recent;
pub mod ruby;
pub mod v8;

/// A failed read of another process's memory.
#[derive(Debug, thiserror::Error)]
#[error("could not read {length} bytes at {address:#x}")]
pub struct MemoryError {
    pub address: u64,
    pub length: usize,
    #[source]
    pub source: Option<std::io::Error>,
}

/// Another process's memory, read whole: a read fills all of `buf` or
/// fails.
pub trait Memory {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError>;

    /// Several reads, in order, up to the first that fails: how many were
    /// read whole. A process's memory does them in one system call.
    fn read_many(&mut self, reads: &mut [(u64, &mut [u8])]) -> usize {
        let mut done = 0;
        for (address, buf) in reads.iter_mut() {
            if self.read(*address, buf).is_err() {
                break;
            }
            done += 1;
        }
        done
    }

    /// A hint that the bytes at `addresses` are about to be read: a
    /// memory that keeps what it read (`recent::RecentMemory`) reads them
    /// at once. Nothing by default.
    fn prefetch(&mut self, _addresses: &[u64]) {}
}

/// Reads captured memory as a live process's: the tests' [`Memory`] over
/// the regions a capture holds, failing where nothing was captured.
#[cfg(test)]
pub(crate) fn read_captured(
    regions: &agent_fixtures::memory::Regions,
    address: u64,
    buf: &mut [u8],
) -> Result<(), MemoryError> {
    let bytes = regions.get(address, buf.len()).ok_or(MemoryError {
        address,
        length: buf.len(),
        source: None,
    })?;
    buf.copy_from_slice(bytes);
    Ok(())
}
