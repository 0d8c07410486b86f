//! JIT symbols from a process's jitdump file (`/tmp/jit-PID.dump`, written
//! by V8's `--perf-prof`, Wasmtime, Julia, .NET, the JVM's perf agents):
//! binary records, appended as code is compiled, in the format of the
//! kernel's `tools/perf/Documentation/jitdump-specification.txt`. Code
//! loads and moves are read; the code bytes, debug and unwind records are
//! skipped over. Like a perf map it is read incrementally, through
//! [`PerfMapSource`] (which the caller opens), up to a bound in bytes.

use std::io;

use crate::perfmap::{PerfMapSource, PerfMapStat, PerfMapTable, ReadReport};

/// `JiTD` as a little-endian u32: the file was written on a machine of
/// this byte order.
const MAGIC: u32 = 0x4a69_5444;
const HEADER_SIZE: u64 = 40;
/// A larger header is not one.
const MAX_HEADER_SIZE: u64 = 4096;
/// id, total size, timestamp.
const RECORD_PREFIX: u64 = 16;
const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
/// pid, tid, vma, code address, code size, code index.
const LOAD_FIXED: u64 = 40;
/// pid, tid, vma, old code address, new code address, code size, index.
const MOVE_FIXED: u64 = 48;
/// Bytes of a name read; longer ones are cut.
const MAX_NAME: u64 = 4096;

/// The functions of one jitdump file.
#[derive(Debug, Default)]
pub struct JitdumpTable {
    table: PerfMapTable,
    /// Bytes of the file read so far (whole records only).
    consumed: u64,
    identity: (u64, u64),
    /// The header was read and is one.
    started: bool,
    /// The file is not a jitdump firn reads (wrong magic, a record that
    /// cannot be): nothing more is read from it.
    broken: bool,
    truncated: bool,
}

impl JitdumpTable {
    pub fn heap_bytes(&self) -> usize {
        self.table.heap_bytes() + std::mem::size_of::<Self>()
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Bytes of the file read so far.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The function whose code covers `address`.
    pub fn lookup(&self, address: u64) -> Option<&str> {
        self.table.lookup(address)
    }

    /// Reads the records appended to `file` since the last read, up to
    /// `max_file_bytes` of the file. A record still being written is read
    /// next time; a file that shrank or was replaced is read again from the
    /// start.
    pub fn refresh(
        &mut self,
        file: &dyn PerfMapSource,
        max_file_bytes: u64,
    ) -> io::Result<ReadReport> {
        let PerfMapStat { identity, len } = file.stat()?;
        if identity != self.identity || len < self.consumed {
            *self = Self {
                identity,
                ..Self::default()
            };
        }
        let mut report = ReadReport::default();
        if self.broken {
            return Ok(report);
        }
        let end = len.min(max_file_bytes);
        if !self.started {
            match read_header(file, end)? {
                Header::Incomplete => return Ok(report),
                Header::Bad => {
                    self.broken = true;
                    report.errors += 1;
                    return Ok(report);
                }
                Header::Size(size) => {
                    self.started = true;
                    self.consumed = size;
                }
            }
        }
        while self.consumed + RECORD_PREFIX <= end {
            let mut prefix = [0; RECORD_PREFIX as usize];
            if !read_exact(file, &mut prefix, self.consumed)? {
                break;
            }
            let id = u32_at(&prefix, 0);
            let size = u64::from(u32_at(&prefix, 4));
            if size < RECORD_PREFIX {
                self.broken = true;
                report.errors += 1;
                break;
            }
            if self.consumed + size > end {
                break;
            }
            let body_at = self.consumed + RECORD_PREFIX;
            let body_size = size - RECORD_PREFIX;
            let added = match id {
                CODE_LOAD => self.code_load(file, body_at, body_size)?,
                CODE_MOVE => self.code_move(file, body_at, body_size)?,
                _ => None,
            };
            match added {
                Some(true) => report.entries += 1,
                Some(false) => report.errors += 1,
                None => {}
            }
            self.consumed += size;
        }
        self.table.settle();
        if len > max_file_bytes && !self.truncated {
            self.truncated = true;
            report.truncated = true;
        }
        Ok(report)
    }

    /// A code load: `Some(true)` when its function was added.
    fn code_load(
        &mut self,
        file: &dyn PerfMapSource,
        at: u64,
        size: u64,
    ) -> io::Result<Option<bool>> {
        if size < LOAD_FIXED + 1 {
            return Ok(Some(false));
        }
        let mut body = vec![0; (size.min(LOAD_FIXED + MAX_NAME)) as usize];
        if !read_exact(file, &mut body, at)? {
            return Ok(Some(false));
        }
        let code_address = u64_at(&body, 16);
        let code_size = u64_at(&body, 24);
        let name = &body[LOAD_FIXED as usize..];
        let name = &name[..memchr::memchr(0, name).unwrap_or(name.len())];
        let name = String::from_utf8_lossy(name);
        if name.is_empty() || code_size == 0 {
            return Ok(Some(false));
        }
        Ok(Some(self.table.push(code_address, code_size, &name)))
    }

    /// Code moved: the function's name at its new address.
    fn code_move(
        &mut self,
        file: &dyn PerfMapSource,
        at: u64,
        size: u64,
    ) -> io::Result<Option<bool>> {
        if size < MOVE_FIXED {
            return Ok(Some(false));
        }
        let mut body = [0; MOVE_FIXED as usize];
        if !read_exact(file, &mut body, at)? {
            return Ok(Some(false));
        }
        let old = u64_at(&body, 16);
        let new = u64_at(&body, 24);
        let code_size = u64_at(&body, 32);
        self.table.settle();
        let Some(name) = self.table.lookup(old).map(str::to_owned) else {
            return Ok(Some(false));
        };
        Ok(Some(self.table.push(new, code_size, &name)))
    }
}

enum Header {
    Incomplete,
    Bad,
    Size(u64),
}

fn read_header(file: &dyn PerfMapSource, end: u64) -> io::Result<Header> {
    if end < HEADER_SIZE {
        return Ok(Header::Incomplete);
    }
    let mut header = [0; HEADER_SIZE as usize];
    if !read_exact(file, &mut header, 0)? {
        return Ok(Header::Incomplete);
    }
    let size = u64::from(u32_at(&header, 8));
    if u32_at(&header, 0) != MAGIC || !(HEADER_SIZE..=MAX_HEADER_SIZE).contains(&size) {
        return Ok(Header::Bad);
    }
    Ok(Header::Size(size))
}

/// Fills `buf` from `offset`; `false` if the file ends first.
fn read_exact(file: &dyn PerfMapSource, buf: &mut [u8], offset: u64) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        let read = file.read_at(&mut buf[filled..], offset + filled as u64)?;
        if read == 0 {
            return Ok(false);
        }
        filled += read;
    }
    Ok(true)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|word| <[u8; 4]>::try_from(word).ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|word| <[u8; 8]>::try_from(word).ok())
        .map_or(0, u64::from_le_bytes)
}

/// A JIT's symbol file of either kind, told apart by its first bytes:
/// a jitdump starts with its magic, a perf map with a hex address.
#[derive(Debug)]
pub enum JitTable {
    PerfMap(PerfMapTable),
    Jitdump(JitdumpTable),
}

impl JitTable {
    /// An empty table for `file`, of the kind its first bytes say; `None`
    /// while the file is empty.
    pub fn for_file(file: &dyn PerfMapSource) -> Option<Self> {
        let mut magic = [0; 4];
        if !read_exact(file, &mut magic, 0).ok()? {
            return None;
        }
        Some(if u32::from_le_bytes(magic) == MAGIC {
            Self::Jitdump(JitdumpTable::default())
        } else {
            Self::PerfMap(PerfMapTable::default())
        })
    }

    pub fn heap_bytes(&self) -> usize {
        match self {
            Self::PerfMap(table) => table.heap_bytes(),
            Self::Jitdump(table) => table.heap_bytes(),
        }
    }

    pub fn lookup(&self, address: u64) -> Option<&str> {
        match self {
            Self::PerfMap(table) => table.lookup(address),
            Self::Jitdump(table) => table.lookup(address),
        }
    }

    pub fn refresh(
        &mut self,
        file: &dyn PerfMapSource,
        max_file_bytes: u64,
    ) -> io::Result<ReadReport> {
        match self {
            Self::PerfMap(table) => table.refresh(file, max_file_bytes),
            Self::Jitdump(table) => table.refresh(file, max_file_bytes),
        }
    }
}

#[cfg(test)]
mod tests;
