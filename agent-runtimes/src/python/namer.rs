//! Names the interpreter frames the BPF walker recorded: function, file and
//! line, read from the process's code objects and cached per code object.

use std::{collections::HashMap, ops::Range, sync::Arc};

use agent_cache::ByteBoundedCache;
use agent_common::InterpreterFrame;

use super::{
    PythonVersion,
    layout::{Bytecode, InstructionField, Layout, OBJECT_SIZE, OBJECT_TYPE, TYPE_NAME},
    lines::LineTable,
    read::{
        BYTES_READ_AHEAD, MAX_LINE_TABLE, STRING_READ_AHEAD, field_i32, field_u64, object_size,
        read, read_bytes_ahead, read_string_ahead, read_u64,
    },
};
use crate::{Memory, MemoryError};

/// One named interpreter frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PythonFrame {
    /// `co_qualname` from 3.11 (`Class.method`, `outer.<locals>.inner`),
    /// `co_name` before.
    pub function: Arc<str>,
    /// `co_filename`.
    pub file: Arc<str>,
    /// The line of the frame's instruction; 0 if the code there has none.
    pub line: u32,
    /// `co_firstlineno`: the function's `def` line.
    pub first_line: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum NameError {
    #[error("CPython {version} is not supported")]
    UnsupportedVersion { version: PythonVersion },
    #[error("could not read the process's memory")]
    Read {
        #[source]
        source: MemoryError,
    },
    #[error(
        "the code object at {code:#x} is not the one sampled (stamp {sampled:#x}, now {found:#x})"
    )]
    Stale { code: u64, sampled: u64, found: u64 },
    #[error("the object at {code:#x} is not a code object (its type is at {type_address:#x})")]
    NotCode { code: u64, type_address: u64 },
    #[error("the object at {address:#x} is not a compact string (state {state:#x})")]
    BadString { address: u64, state: u32 },
    #[error("the object at {address:#x} has {size} bytes, more than {limit}")]
    TooLarge { address: u64, size: u64, limit: u64 },
}

/// What the namer did since the counts were last taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamerCounts {
    /// Frames named from the cache, from an entry the same process read.
    pub hits: u64,
    /// Frames named from an entry another process of the same object and
    /// owner read: a code object in the interpreter's file-backed data.
    pub shared_hits: u64,
    /// Frames whose code object was read from the process (named or not).
    pub misses: u64,
    /// Cached code objects dropped to stay within the byte bound.
    pub evictions: u64,
    /// Code objects that were no longer what was sampled: another stamp,
    /// or no code object at all (freed, its memory reused).
    pub stale: u64,
    /// Reads of the process's memory that failed (it exited, or the
    /// address is unmapped).
    pub read_failures: u64,
}

/// Where an interpreter object (libpython, or the executable) lies in one
/// process, for the code objects inside it: in 3.11 and 3.12 those of the
/// frozen start-up modules are static objects in its data (deep-frozen;
/// 3.13 unmarshals them onto the heap), at the same offset in every
/// process of that file, so one process's read names them for the next.
///
/// A process can write its private copy of that data, so an entry one
/// process read could mislabel another's frames. Entries are shared only
/// between processes of one `owner`: the processes of one user can
/// already change each other (`ptrace`, `/proc/PID/mem`; where Yama
/// narrows that, through the user's files they all load), so sharing
/// among them lets none mislabel what it could not already change. The
/// stamp still has to match, as for a process's own entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedObject {
    /// Who can write the process's memory (the caller's uid for it).
    pub owner: u32,
    /// The object's content, as the caller keys objects: equal only for
    /// the same bytes.
    pub content: u64,
    /// The object's file-backed runtime ranges in this process, each with
    /// the file offset of its start.
    pub ranges: Vec<(Range<u64>, u64)>,
}

impl SharedObject {
    /// The key of the code object at `code` if it lies in the object.
    fn key(&self, code: u64) -> Option<CodeKey> {
        self.ranges.iter().find_map(|(range, file_offset)| {
            range.contains(&code).then(|| CodeKey::Shared {
                owner: self.owner,
                content: self.content,
                file_offset: file_offset.wrapping_add(code - range.start),
            })
        })
    }
}

/// What a cached code object is known by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CodeKey {
    /// On the heap: one process's, by address.
    Process { process: u64, code: u64 },
    /// In an interpreter object's data: every process's of that owner.
    Shared {
        owner: u32,
        content: u64,
        file_offset: u64,
    },
}

/// A code object as decoded once: what names its frames.
struct CodeEntry {
    /// The process whose memory it was read from.
    reader: u64,
    stamp: u64,
    function: Arc<str>,
    file: Arc<str>,
    first_line: u32,
    /// Size of the bytecode in bytes.
    code_bytes: u64,
    lines: LineTable,
}

impl CodeEntry {
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.function.len()
            + self.file.len()
            + self.lines.heap_bytes()
    }

    fn frame(&self, layout: &Layout, code: u64, instruction: u64) -> PythonFrame {
        let line = match bytecode_offset(layout, code, instruction) {
            Some(offset) if offset < self.code_bytes => {
                let offset = u32::try_from(offset).unwrap_or(u32::MAX);
                // Python says no line (`f_lineno` None) for code the
                // compiler added: the frame is still on the line before,
                // or before the body (a generator's prologue) at its `def`.
                self.lines.line_or_before(offset).unwrap_or(self.first_line)
            }
            // Not started yet (`f_lasti` -1, a pointer just before the
            // code), or garbage: CPython says the first line too.
            _ => self.first_line,
        };
        PythonFrame {
            function: self.function.clone(),
            file: self.file.clone(),
            line,
            first_line: self.first_line,
        }
    }
}

/// The byte offset in the bytecode the raw instruction field points at,
/// `None` if before the start.
fn bytecode_offset(layout: &Layout, code: u64, instruction: u64) -> Option<u64> {
    // 3.8-3.10 keep an `int`: the low half of what the walker read.
    let index = i64::from(instruction as u32 as i32);
    match (layout.instruction, layout.code.bytecode) {
        (InstructionField::ByteIndex, _) => u64::try_from(index).ok(),
        (InstructionField::UnitIndex, _) => u64::try_from(index).ok().map(|units| units * 2),
        (InstructionField::Pointer, Bytecode::Inline { adaptive }) => {
            instruction.checked_sub(code.checked_add(adaptive)?)
        }
        (InstructionField::Pointer, Bytecode::Object { .. }) => None,
    }
}

/// Names CPython frames, caching decoded code objects: each process's own,
/// and those in an interpreter object's data for every process of that
/// object and owner ([`SharedObject`]), within one byte bound.
pub struct PythonNamer {
    cache: ByteBoundedCache<CodeKey, CodeEntry>,
    /// The address of each process's `code` type, once one of its objects
    /// was checked to be a code object by the type's name: later objects
    /// only compare their type pointer.
    code_types: HashMap<u64, u64>,
    counts: NamerCounts,
}

impl PythonNamer {
    /// A namer whose cache keeps at most about `cache_bytes` of decoded
    /// code objects.
    pub fn new(cache_bytes: usize) -> Self {
        Self {
            cache: ByteBoundedCache::new(cache_bytes),
            code_types: HashMap::new(),
            counts: NamerCounts::default(),
        }
    }

    /// Names `frame`, sampled in the process `process` (a key unique for
    /// the process's lifetime) running CPython `version`, reading what the
    /// cache does not hold from `memory`.
    ///
    /// A cached code object is used only while its stamp is the frame's;
    /// one read from memory only if its stamp still is the frame's
    /// ([`NameError::Stale`] otherwise: it was freed after the sample).
    pub fn name(
        &mut self,
        process: u64,
        version: PythonVersion,
        memory: &mut dyn Memory,
        frame: &InterpreterFrame,
    ) -> Result<PythonFrame, NameError> {
        self.name_shared(process, None, version, memory, frame)
    }

    /// [`Self::name`], for a process whose interpreter object is `shared`:
    /// a code object inside it is cached for every process of that object
    /// and owner, one on the heap for `process` alone.
    pub fn name_shared(
        &mut self,
        process: u64,
        shared: Option<&SharedObject>,
        version: PythonVersion,
        memory: &mut dyn Memory,
        frame: &InterpreterFrame,
    ) -> Result<PythonFrame, NameError> {
        let layout = Layout::of(version).map_err(|_| NameError::UnsupportedVersion { version })?;
        let key = shared
            .and_then(|shared| shared.key(frame.code))
            .unwrap_or(CodeKey::Process {
                process,
                code: frame.code,
            });
        if let Some(entry) = self.cache.get(&key)
            && entry.stamp == frame.stamp
        {
            if entry.reader == process {
                self.counts.hits += 1;
            } else {
                self.counts.shared_hits += 1;
            }
            return Ok(entry.frame(layout, frame.code, frame.instruction));
        }
        self.counts.misses += 1;
        let entry = match self.read_code(process, layout, memory, frame) {
            Ok(entry) => entry,
            Err(error) => {
                match error {
                    NameError::Read { .. } => self.counts.read_failures += 1,
                    NameError::Stale { .. } | NameError::NotCode { .. } => self.counts.stale += 1,
                    _ => {}
                }
                return Err(error);
            }
        };
        let named = entry.frame(layout, frame.code, frame.instruction);
        let bytes = entry.bytes();
        self.counts.evictions += self.cache.insert(key, entry, bytes) as u64;
        Ok(named)
    }

    /// Forgets what is known of `process` (it exited). Its cached code
    /// objects are not looked for: no frame of it will ask for its own
    /// again, so they are the least recently used and leave the cache
    /// first; the shared ones stay for the object's next process.
    pub fn forget(&mut self, process: u64) {
        self.code_types.remove(&process);
    }

    /// The counts since the last call.
    pub fn take_counts(&mut self) -> NamerCounts {
        std::mem::take(&mut self.counts)
    }

    fn read_code(
        &mut self,
        process: u64,
        layout: &Layout,
        memory: &mut dyn Memory,
        frame: &InterpreterFrame,
    ) -> Result<CodeEntry, NameError> {
        let code = &layout.code;
        let mut header = vec![0; code.header];
        read(memory, frame.code, &mut header)?;
        let stamp = field_u64(&header, code.stamp);
        if stamp != frame.stamp {
            return Err(NameError::Stale {
                code: frame.code,
                sampled: frame.stamp,
                found: stamp,
            });
        }
        self.check_code_type(process, memory, frame.code, field_u64(&header, OBJECT_TYPE))?;
        let (file, function, table) = (
            field_u64(&header, code.file),
            field_u64(&header, code.function),
            field_u64(&header, code.line_table),
        );
        // The three objects' headers and most of their data in one system
        // call; a read that fails (one ending past its mapping) and those
        // after it are left empty, and their objects read as they need.
        let mut file_ahead = [0; STRING_READ_AHEAD];
        let mut function_ahead = [0; STRING_READ_AHEAD];
        let mut table_ahead = [0; BYTES_READ_AHEAD];
        let read_ahead = memory.read_many(&mut [
            (file, &mut file_ahead[..]),
            (function, &mut function_ahead[..]),
            (table, &mut table_ahead[..]),
        ]);
        let whole = |bytes: &[u8], index: usize| bytes.len() * usize::from(index < read_ahead);
        let file_ahead = &file_ahead[..whole(&file_ahead, 0)];
        let function_ahead = &function_ahead[..whole(&function_ahead, 1)];
        let table_ahead = &table_ahead[..whole(&table_ahead, 2)];
        let file = read_string_ahead(memory, &layout.unicode, file, file_ahead)?;
        let function = read_string_ahead(memory, &layout.unicode, function, function_ahead)?;
        let first_line = u32::try_from(field_i32(&header, code.first_line)).unwrap_or(0);
        let table = read_bytes_ahead(memory, table, MAX_LINE_TABLE, table_ahead)?;
        let code_bytes = match code.bytecode {
            Bytecode::Object { code } => object_size(memory, field_u64(&header, code))?,
            // `ob_size` counts 2-byte code units.
            Bytecode::Inline { .. } => field_u64(&header, OBJECT_SIZE).saturating_mul(2),
        };
        Ok(CodeEntry {
            reader: process,
            stamp,
            function,
            file,
            first_line,
            code_bytes,
            lines: LineTable::decode(code.line_format, &table, first_line),
        })
    }

    /// Whether `type_address` is the type `code`: known for the process,
    /// or named so (`tp_name`).
    fn check_code_type(
        &mut self,
        process: u64,
        memory: &mut dyn Memory,
        code: u64,
        type_address: u64,
    ) -> Result<(), NameError> {
        if self.code_types.get(&process) == Some(&type_address) {
            return Ok(());
        }
        // An unreadable type is no type: the object is not a code object.
        let mut name = [0; 5];
        let named_code = read_u64(memory, type_address.wrapping_add(TYPE_NAME))
            .and_then(|name_address| read(memory, name_address, &mut name))
            .is_ok_and(|()| &name == b"code\0");
        if !named_code {
            return Err(NameError::NotCode { code, type_address });
        }
        self.code_types.insert(process, type_address);
        Ok(())
    }
}
