//! Names the control frames the BPF walker recorded: function, file and
//! line, read from the process's instruction sequences and method entries
//! and cached per object.

use std::{collections::HashMap, sync::Arc};

use agent_cache::ByteBoundedCache;
use agent_common::InterpreterFrame;

use super::{
    RubyVersion,
    layout::{
        FRAME_MAGIC_CFUNC, FRAME_MAGIC_DUMMY, FRAME_MAGIC_IFUNC, FRAME_MAGIC_MASK, FirstLine,
        IMEMO_ISEQ, IMEMO_MASK, IMEMO_MENT, IMEMO_SHIFT, Layout, T_IMEMO, TYPE_MASK, layout,
    },
    lines::{EntryIndex, LineTable, succinct_table_bytes},
    names::{ClassPathId, MethodEntry},
    read::{field_u32, field_u64, plausible, pointer, read, read_headers, read_path, read_string},
};
use crate::{Memory, MemoryError};

/// One named control frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RubyFrame {
    /// As Ruby 3.4's backtraces name it: `Class#method`, `Class.method`
    /// (a singleton method), `block in Class#method`, `<main>`,
    /// `<class:Foo>`; the bare method name in an anonymous class.
    pub function: Arc<str>,
    /// The instruction sequence's path (as the script was given to Ruby);
    /// empty for a C function.
    pub file: Arc<str>,
    /// The line of the frame's instruction; 0 for a C function.
    pub line: u32,
}

/// A process running CRuby, as the namer knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RubyProcess {
    /// Unique for the process's lifetime: keys what is cached of it.
    pub key: u64,
    pub version: RubyVersion,
    /// Run-time address of `ruby_global_symbols` (the symbol table):
    /// [`super::RubyObject::symbols`] plus the load bias.
    pub symbols: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum NameError {
    #[error("CRuby {version} is not supported")]
    UnsupportedVersion { version: RubyVersion },
    #[error("could not read the process's memory")]
    Read {
        #[source]
        source: MemoryError,
    },
    #[error("the object at {address:#x} is not an instruction sequence (flags {flags:#x})")]
    NotIseq { address: u64, flags: u64 },
    #[error("the object at {address:#x} is not a method entry (flags {flags:#x})")]
    NotMethodEntry { address: u64, flags: u64 },
    #[error("the object at {address:#x} is not a String (flags {flags:#x})")]
    NotString { address: u64, flags: u64 },
    #[error("the object at {address:#x} is not an Array (flags {flags:#x})")]
    NotArray { address: u64, flags: u64 },
    #[error("the {what} pointer {address:#x} cannot be one")]
    BadPointer { what: &'static str, address: u64 },
    #[error("the ID {id:#x} is not in the process's symbol table")]
    UnknownId { id: u64 },
}

/// What the namer did since the counts were last taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamerCounts {
    /// Frames named from the cache (after checking that its objects are
    /// still what was cached).
    pub hits: u64,
    /// Frames for which something was read from the process (named or
    /// not).
    pub misses: u64,
    /// Cached entries dropped to stay within the byte bound.
    pub evictions: u64,
    /// Frames whose instruction sequence or method entry was no longer
    /// one (freed, its memory reused).
    pub stale: u64,
    /// Reads of the process's memory that failed (it exited, or the
    /// address is unmapped).
    pub read_failures: u64,
}

/// What a cached entry is known by: the process, and the object's address
/// (or the ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Iseq { process: u64, address: u64 },
    Method { process: u64, address: u64 },
    Class { process: u64, address: u64 },
    Id { process: u64, id: u64 },
}

/// A cached entry.
pub(super) enum Entry {
    Iseq(IseqEntry),
    Method(MethodEntry),
    /// A class's or module's prefix for its methods ([`super::names`]).
    Class {
        flags: u64,
        prefix: Arc<str>,
    },
    Id(Arc<str>),
}

impl Entry {
    pub(super) fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + match self {
                Self::Iseq(iseq) => {
                    iseq.label.len()
                        + iseq.base_label.len()
                        + iseq.file.len()
                        + iseq.lines.as_ref().map_or(0, LineTable::heap_bytes)
                }
                Self::Method(method) => method.prefix.len() + method.name.len(),
                Self::Class { prefix, .. } => prefix.len(),
                Self::Id(name) => name.len(),
            }
    }
}

/// An instruction sequence as decoded once.
pub(super) struct IseqEntry {
    /// Its `body` pointer: an iseq at the same address with another body
    /// is another one.
    body: u64,
    label: Arc<str>,
    base_label: Arc<str>,
    file: Arc<str>,
    first_line: u32,
    /// `iseq_encoded` and `iseq_size` (in VALUEs).
    encoded: u64,
    size: u64,
    /// `None` when the table could not be read: lines are the first line.
    lines: Option<LineTable>,
}

impl IseqEntry {
    /// The line of the instruction before `pc` (a frame's `pc` points past
    /// the instruction it runs), as `rb_vm_get_sourceline` computes it.
    fn line(&self, pc: u64) -> u32 {
        let Some(offset) = pc.checked_sub(self.encoded) else {
            return self.first_line;
        };
        let position = offset / 8;
        if offset % 8 != 0 || position > self.size {
            return self.first_line;
        }
        let position = position.saturating_sub(1);
        self.lines
            .as_ref()
            .and_then(|lines| lines.line(position))
            .unwrap_or(self.first_line)
    }
}

/// Most `insns_info` entries read of one instruction sequence (a method of
/// thousands of lines has a few thousand).
const MAX_INFO_ENTRIES: u64 = 1 << 16;
/// Most VALUEs of an instruction sequence whose succinct index is read
/// (its table is 80 bytes per 512).
const MAX_ISEQ_SIZE: u64 = 1 << 22;
/// Bytes of an `rb_iseq_t` read: `flags`, `wrapper`, `body`.
const ISEQ_HEADER: usize = 24;

/// Names CRuby control frames, caching what it decoded of each process
/// within one byte bound.
pub struct RubyNamer {
    pub(super) cache: ByteBoundedCache<Key, Entry>,
    /// Per process: the ID of `__classpath__`, once looked for.
    pub(super) class_path_ids: HashMap<u64, ClassPathId>,
    pub(super) counts: NamerCounts,
    /// Whether the frame being named read anything into the cache.
    pub(super) missed: bool,
    empty: Arc<str>,
}

impl RubyNamer {
    /// A namer whose cache keeps at most about `cache_bytes`.
    pub fn new(cache_bytes: usize) -> Self {
        Self {
            cache: ByteBoundedCache::new(cache_bytes),
            class_path_ids: HashMap::new(),
            counts: NamerCounts::default(),
            missed: false,
            empty: Arc::from(""),
        }
    }

    /// Names `frame`, sampled in `process`, reading what the cache does
    /// not hold (and checking what it does) from `memory`. `Ok(None)` for
    /// frames a Ruby user does not see: the VM's dummy frames, C blocks
    /// (`ifunc`), frames not started.
    pub fn name(
        &mut self,
        process: &RubyProcess,
        memory: &mut dyn Memory,
        frame: &InterpreterFrame,
    ) -> Result<Option<RubyFrame>, NameError> {
        let version = process.version;
        let layout = layout(version).map_err(|_| NameError::UnsupportedVersion { version })?;
        let magic = frame.data & FRAME_MAGIC_MASK;
        self.missed = false;
        let named = match magic {
            FRAME_MAGIC_DUMMY | FRAME_MAGIC_IFUNC => return Ok(None),
            FRAME_MAGIC_CFUNC => self.name_function(process, layout, memory, frame.stamp),
            _ if frame.code == 0 || frame.instruction == 0 => return Ok(None),
            _ => self.name_iseq(process, layout, memory, frame),
        };
        match &named {
            Ok(_) if self.missed => self.counts.misses += 1,
            Ok(_) => self.counts.hits += 1,
            Err(error) => {
                self.counts.misses += 1;
                match error {
                    NameError::Read { .. } => self.counts.read_failures += 1,
                    NameError::NotIseq { .. } | NameError::NotMethodEntry { .. } => {
                        self.counts.stale += 1;
                    }
                    _ => {}
                }
            }
        }
        named.map(Some)
    }

    /// Forgets what is known of `process` (it exited). Its cached entries
    /// are not looked for: nothing asks for them again, so they are the
    /// least recently used and leave the cache first.
    pub fn forget(&mut self, process: u64) {
        self.class_path_ids.remove(&process);
    }

    /// The counts since the last call.
    pub fn take_counts(&mut self) -> NamerCounts {
        std::mem::take(&mut self.counts)
    }

    pub(super) fn insert(&mut self, key: Key, entry: Entry) {
        self.missed = true;
        let bytes = entry.bytes();
        self.counts.evictions += self.cache.insert(key, entry, bytes) as u64;
    }

    /// A C function's frame: its method entry names it.
    fn name_function(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
        stamp: u64,
    ) -> Result<RubyFrame, NameError> {
        let not_method = NameError::NotMethodEntry {
            address: stamp,
            flags: 0,
        };
        if !plausible(stamp) {
            return Err(not_method);
        }
        let mut header = [0; 64];
        let header = &mut header[..layout.method.entry_size];
        read(memory, stamp, header)?;
        let (prefix, name) = self.method_entry(process, layout, memory, stamp, header)?;
        Ok(RubyFrame {
            function: Arc::from(format!("{prefix}{name}")),
            file: self.empty.clone(),
            line: 0,
        })
    }

    /// A frame running an instruction sequence: its label, qualified by
    /// the class of its method entry, if the stamp is one.
    fn name_iseq(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
        frame: &InterpreterFrame,
    ) -> Result<RubyFrame, NameError> {
        let code = pointer(frame.code, "iseq")?;
        // The two checks every naming makes, in one system call.
        let mut iseq = [0; ISEQ_HEADER];
        let mut method = [0; 64];
        let method = &mut method[..layout.method.entry_size];
        let stamp = plausible(frame.stamp).then_some(frame.stamp);
        let read_whole = match stamp {
            Some(stamp) => memory.read_many(&mut [(code, &mut iseq[..]), (stamp, &mut *method)]),
            None => memory.read_many(&mut [(code, &mut iseq[..])]),
        };
        if read_whole == 0 {
            return Err(failed_read(code, ISEQ_HEADER));
        }
        let (label, base_label, file, line) = {
            let entry = self.iseq_entry(process, layout, memory, code, &iseq)?;
            (
                entry.label.clone(),
                entry.base_label.clone(),
                entry.file.clone(),
                entry.line(frame.instruction),
            )
        };
        let function = match stamp {
            Some(stamp) if read_whole < 2 => return Err(failed_read(stamp, method.len())),
            Some(stamp) if is_imemo(field_u64(method, 0), IMEMO_MENT) => {
                let (prefix, name) = self.method_entry(process, layout, memory, stamp, method)?;
                qualify(&label, &base_label, &prefix, &name).unwrap_or(label)
            }
            // A cref (top level, class bodies, blocks in them), or none.
            _ => label,
        };
        Ok(RubyFrame {
            function,
            file,
            line,
        })
    }

    /// The cached entry of the iseq at `address`, whose header is
    /// `header`, if it is still that iseq; else read anew.
    fn iseq_entry(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
        address: u64,
        header: &[u8],
    ) -> Result<&IseqEntry, NameError> {
        let flags = field_u64(header, 0);
        if !is_imemo(flags, IMEMO_ISEQ) {
            return Err(NameError::NotIseq { address, flags });
        }
        let body = field_u64(header, layout.iseq.body);
        let key = Key::Iseq {
            process: process.key,
            address,
        };
        let cached =
            matches!(self.cache.peek(&key), Some(Entry::Iseq(entry)) if entry.body == body);
        if !cached {
            let entry = read_iseq(layout, memory, body)?;
            self.insert(key, Entry::Iseq(entry));
        }
        match self.cache.get(&key) {
            Some(Entry::Iseq(entry)) => Ok(entry),
            // Just inserted: an entry larger than the cache is still kept.
            _ => Err(NameError::NotIseq { address, flags }),
        }
    }
}

/// `label` with its method part (`base_label`: the whole label of a
/// method, the end of a block's `block in foo`) qualified by `prefix`
/// (the method entry's class), if the method entry's `name` is the method
/// the label names.
fn qualify(label: &str, base_label: &str, prefix: &str, name: &str) -> Option<Arc<str>> {
    if name != base_label || prefix.is_empty() {
        return None;
    }
    let outer = label.strip_suffix(base_label)?;
    if !(outer.is_empty() || outer.ends_with(" in ")) {
        return None;
    }
    Some(Arc::from(format!("{outer}{prefix}{name}")))
}

pub(super) fn is_imemo(flags: u64, kind: u64) -> bool {
    flags & TYPE_MASK == T_IMEMO && (flags >> IMEMO_SHIFT) & IMEMO_MASK == kind
}

pub(super) fn failed_read(address: u64, length: usize) -> NameError {
    NameError::Read {
        source: MemoryError {
            address,
            length,
            source: None,
        },
    }
}

/// Decodes the iseq body at `body`: its names, file and line table.
fn read_iseq(layout: &Layout, memory: &mut dyn Memory, body: u64) -> Result<IseqEntry, NameError> {
    let fields = &layout.iseq;
    let body = pointer(body, "iseq body")?;
    let mut header = [0; 256];
    let header = &mut header[..fields.body_header];
    read(memory, body, header)?;
    let (path, base_label, label) = (
        field_u64(header, fields.path),
        field_u64(header, fields.base_label),
        field_u64(header, fields.label),
    );
    let [path_header, base_header, label_header] = read_headers(memory, [path, base_label, label]);
    let file = read_path(memory, layout, path, path_header.as_ref().map(|h| &h[..]))?;
    let base_label = read_string(
        memory,
        &layout.string,
        base_label,
        base_header.as_ref().map(|h| &h[..]),
    )?;
    let label = read_string(
        memory,
        &layout.string,
        label,
        label_header.as_ref().map(|h| &h[..]),
    )?;
    let first_line = match fields.first_line_kind {
        // A Fixnum: `(n << 1) | 1`.
        FirstLine::Fixnum => {
            let value = field_u64(header, fields.first_line);
            match value & 1 {
                1 => u32::try_from(value >> 1).unwrap_or(0),
                _ => 0,
            }
        }
        FirstLine::Int => {
            u32::try_from(field_u32(header, fields.first_line).cast_signed()).unwrap_or(0)
        }
    };
    let size = u64::from(field_u32(header, fields.size));
    Ok(IseqEntry {
        body,
        label,
        base_label,
        file,
        first_line,
        encoded: field_u64(header, fields.encoded),
        size,
        lines: read_lines(layout, memory, header, size),
    })
}

/// The line table of the iseq body whose first bytes are `body`; `None`
/// if there is none or it cannot be read.
fn read_lines(
    layout: &Layout,
    memory: &mut dyn Memory,
    body: &[u8],
    size: u64,
) -> Option<LineTable> {
    let fields = &layout.iseq;
    let count = u64::from(field_u32(body, fields.info_size));
    if count == 0 || count > MAX_INFO_ENTRIES {
        return None;
    }
    let entries = field_u64(body, fields.info_entries);
    let mut bytes = vec![0; (count * fields.entry_size) as usize];
    read(memory, pointer(entries, "insns_info").ok()?, &mut bytes).ok()?;
    let lines = bytes
        .chunks_exact(fields.entry_size as usize)
        .map(|entry| {
            let line = field_u32(entry, fields.entry_line).cast_signed();
            u32::try_from(line).unwrap_or(0)
        })
        .collect();
    let positions = field_u64(body, fields.info_positions);
    let succinct = field_u64(body, fields.info_succinct);
    let index = if count == 1 {
        EntryIndex::Single
    } else if positions != 0 {
        let mut bytes = vec![0; (count * 4) as usize];
        read(memory, pointer(positions, "positions").ok()?, &mut bytes).ok()?;
        EntryIndex::Positions(
            bytes
                .chunks_exact(4)
                .map(|position| field_u32(position, 0))
                .collect(),
        )
    } else if succinct != 0 && size <= MAX_ISEQ_SIZE {
        let mut table = vec![0; succinct_table_bytes(size) as usize];
        read(
            memory,
            pointer(succinct, "succ_index_table").ok()?,
            &mut table,
        )
        .ok()?;
        EntryIndex::Succinct(table)
    } else {
        return None;
    };
    Some(LineTable { lines, index })
}
