//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for
//! interpreter runtimes: the objects a process maps and the memory its
//! interpreter frames point into, both the process's to forge. None may
//! panic, hang or allocate without bound on any input.

use agent_common::InterpreterFrame;

use crate::{
    Memory, MemoryError,
    libc::glibc_thread_specific_offset,
    python::{self, PythonNamer, PythonVersion},
};

/// An object a process maps, looked at as a CPython interpreter and as a
/// libc (`pthread_getspecific`), then asked for a walker layout.
pub fn python_object(data: &[u8]) {
    let _ = glibc_thread_specific_offset(data);
    for name in ["libpython3.11.so.1.0", "python3.8", "python"] {
        if let Ok(Some(object)) = python::inspect_object(name, data) {
            let _ = python::walker_layout(object.version, object.runtime, object.code_type, 0x310);
        }
    }
}

/// Where a `python_frame` input's memory starts.
const PYTHON_MEMORY_BASE: u64 = 0x10_0000;

/// The input's bytes as a process's memory from `PYTHON_MEMORY_BASE` on.
struct Flat<'a>(&'a [u8]);

impl Memory for Flat<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let fail = || MemoryError {
            address,
            length: buf.len(),
            source: None,
        };
        let start = usize::try_from(address.checked_sub(PYTHON_MEMORY_BASE).ok_or_else(fail)?)
            .map_err(|_| fail())?;
        let bytes = start
            .checked_add(buf.len())
            .and_then(|end| self.0.get(start..end))
            .ok_or_else(fail)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// A process's memory as a hostile process leaves it: a sampled frame's
/// code object, its strings and line table, all at will. The first bytes
/// choose the version and the sampled fields; the rest is memory from
/// `PYTHON_MEMORY_BASE` on. Named twice: the second time from the cache.
pub fn python_frame(data: &[u8]) {
    let Some((head, memory)) = data.split_first_chunk::<24>() else {
        return;
    };
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
    let version = PythonVersion {
        major: 3,
        minor: 8 + head[0] % 6,
        patch: 0,
    };
    let code = PYTHON_MEMORY_BASE + (word(0) >> 8) % 4096;
    // The stamp as the BPF walker would have read it, so that inputs get
    // past the staleness check to the decoding behind it.
    let stamp_at = python::walker_layout(version, 0, 0, 0)
        .map(|layout| code + u64::from(layout.code_stamp))
        .unwrap_or(code);
    let mut stamp = [0u8; 8];
    let stamp = match Flat(memory).read(stamp_at, &mut stamp) {
        Ok(()) => u64::from_le_bytes(stamp),
        Err(_) => word(8),
    };
    let frame = InterpreterFrame {
        code,
        stamp,
        instruction: word(16),
        flags: 0,
        reserved: 0,
    };
    let mut namer = PythonNamer::new(64 << 10);
    for _ in 0..2 {
        let _ = namer.name(1, version, &mut Flat(memory), &frame);
    }
    let _ = namer.take_counts();
}

#[cfg(test)]
agent_fixtures::replays! {
    "python_object" => python_object,
    "python_frame" => python_frame,
}
