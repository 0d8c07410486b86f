//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for
//! interpreter runtimes (CPython, CRuby): the objects a process maps and
//! the memory its interpreter frames point into, both the process's to
//! forge. None may
//! panic, hang or allocate without bound on any input.

use agent_common::InterpreterFrame;

use crate::{
    Memory, MemoryError,
    libc::glibc_thread_specific_offset,
    python::{self, PythonNamer, PythonVersion},
    ruby::{self, RubyNamer, RubyProcess, RubyVersion},
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

/// Where a `python_frame` or `ruby_frame` input's memory starts.
pub const MEMORY_BASE: u64 = 0x10_0000;

/// The input's bytes as a process's memory from `MEMORY_BASE` on.
struct Flat<'a>(&'a [u8]);

impl Memory for Flat<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let fail = || MemoryError {
            address,
            length: buf.len(),
            source: None,
        };
        let start = usize::try_from(address.checked_sub(MEMORY_BASE).ok_or_else(fail)?)
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
/// `MEMORY_BASE` on. Named twice: the second time from the cache.
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
    let code = MEMORY_BASE + (word(0) >> 8) % 4096;
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
        data: 0,
    };
    let mut namer = PythonNamer::new(64 << 10);
    for _ in 0..2 {
        let _ = namer.name(1, version, &mut Flat(memory), &frame);
    }
    let _ = namer.take_counts();
}

/// An object a process maps, looked at as a CRuby interpreter, then
/// asked for a walker layout.
pub fn ruby_object(data: &[u8]) {
    for name in ["libruby-3.1.so.3.1", "ruby"] {
        if let Ok(Some(object)) = ruby::inspect_object(name, data) {
            let _ = ruby::walker_layout(object.version, object.context_global);
        }
    }
}

/// Bytes before the memory in a `ruby_frame` input: the frame's `code`,
/// `stamp` and `instruction` and the symbol table's address (each an
/// offset into the memory, 0 for none), then its `data` and `flags`.
pub const RUBY_FRAME_HEAD: usize = 40;

/// A process's memory as a hostile process leaves it: a sampled control
/// frame's instruction sequence, method entry, classes, strings, line
/// table and symbol table, all at will (read as CRuby 3.1, 3.3 and 3.4
/// lay them out). The first [`RUBY_FRAME_HEAD`] bytes are the sampled
/// fields; the rest is memory from `MEMORY_BASE` on. Named twice: the
/// second time from the cache.
pub fn ruby_frame(data: &[u8]) {
    let Some((head, memory)) = data.split_first_chunk::<RUBY_FRAME_HEAD>() else {
        return;
    };
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
    let half = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().unwrap_or_default());
    // Offsets into the memory, so that inputs point at what they hold.
    let at = |offset: u64| match offset {
        0 => 0,
        offset => MEMORY_BASE + offset % (1 << 20),
    };
    let frame = InterpreterFrame {
        code: at(word(0)),
        stamp: at(word(8)),
        instruction: at(word(16)),
        data: half(32),
        flags: half(36),
    };
    // The same memory read as each release lays it out: 3.3's and 3.4's
    // paths (class fields, strings longer than a header) get inputs too.
    for minor in [1, 3, 4] {
        let process = RubyProcess {
            key: 1,
            version: RubyVersion {
                major: 3,
                minor,
                patch: 0,
            },
            symbols: at(word(24)),
        };
        let mut namer = RubyNamer::new(64 << 10);
        for _ in 0..2 {
            let _ = namer.name(&process, &mut Flat(memory), &frame);
        }
        namer.forget(process.key);
        let _ = namer.take_counts();
    }
}

#[cfg(test)]
agent_fixtures::replays! {
    "python_object" => python_object,
    "python_frame" => python_frame,
    "ruby_object" => ruby_object,
    "ruby_frame" => ruby_frame,
}
