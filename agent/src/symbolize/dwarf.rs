//! DWARF line tables and inline frames through addr2line, over the bytes of
//! an object or of its separate debug file. Pure: bytes in, frames out, no
//! I/O; so it is tested on fixtures and corrupt inputs without root.
//!
//! A context is built lazily: creating one only indexes the compilation
//! units' address ranges; a unit's lines and functions are parsed the first
//! time an address falls in it. Its heap use is estimated from what was
//! parsed so far, for the byte-bounded cache that holds it.

use std::{
    collections::HashSet,
    fmt,
    ops::Deref,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
};

use object::{CompressionFormat, Object, ObjectSection};

/// Bytes shared by the readers of one context: a memory-mapped file, or a
/// section decompressed into memory.
#[derive(Clone)]
pub struct Bytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl Bytes {
    pub fn new(bytes: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        Self(bytes)
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

// SAFETY: the bytes live behind an `Arc` (a mapping or a heap buffer that is
// never resized), so moving or cloning a `Bytes` never moves them, and
// `deref` returns the same slice for the life of the value.
unsafe impl gimli::StableDeref for Bytes {}
// SAFETY: as above; clones share the same allocation.
unsafe impl gimli::CloneStableDeref for Bytes {}

pub type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

#[derive(Debug, thiserror::Error)]
pub enum DwarfError {
    #[error("not a parsable ELF file")]
    Elf {
        #[source]
        source: object::Error,
    },
    #[error("section {section} lies outside the file")]
    SectionBounds { section: &'static str },
    #[error("could not decompress {section}")]
    Decompress {
        section: &'static str,
        #[source]
        source: object::Error,
    },
    #[error("the compressed DWARF needs {bytes} bytes in memory, more than the {limit} allowed")]
    TooLarge { bytes: u64, limit: usize },
    #[error("malformed DWARF")]
    Malformed {
        #[source]
        source: gimli::Error,
    },
    #[error("the DWARF parser failed on malformed input ({what})")]
    Panicked { what: &'static str },
}

/// One source-level frame at an address, as DWARF describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DwarfFrame {
    /// The linkage (mangled) name when DWARF has one, else the plain name.
    pub name: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// More inline levels than this at one address means corrupt DWARF.
const MAX_INLINE_DEPTH: usize = 64;

/// Estimated heap bytes per byte of a parsed unit's `.debug_info`
/// (functions and inlined-function trees) and of its line program (one
/// 24-byte row per one to three opcode bytes). Measured on firn's own debug
/// build with `cargo xtask bench-symbolize`.
const INFO_COST: usize = 1;
const LINE_COST: usize = 10;
/// The unit index built up front, per unit.
const UNIT_INDEX_COST: usize = 160;

/// The sections addr2line reads; the rest are never loaded (which matters
/// for compressed ones: they would be decompressed for nothing).
fn needed(id: gimli::SectionId) -> bool {
    use gimli::SectionId::*;
    matches!(
        id,
        DebugAbbrev
            | DebugAddr
            | DebugAranges
            | DebugInfo
            | DebugLine
            | DebugLineStr
            | DebugRanges
            | DebugRngLists
            | DebugStr
            | DebugStrOffsets
    )
}

/// A lazily parsed addr2line context for one object.
pub struct DwarfInfo {
    context: addr2line::Context<Reader>,
    units_seen: HashSet<u64>,
    heap_bytes: usize,
}

impl fmt::Debug for DwarfInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DwarfInfo")
            .field("units_seen", &self.units_seen.len())
            .field("heap_bytes", &self.heap_bytes)
            .finish()
    }
}

impl DwarfInfo {
    /// Indexes the DWARF of the ELF file in `bytes`. Compressed sections
    /// are decompressed into memory, at most `max_decompressed` bytes.
    pub fn parse(bytes: Bytes, max_decompressed: usize) -> Result<Self, DwarfError> {
        catch_unwind(AssertUnwindSafe(|| {
            Self::parse_inner(bytes, max_decompressed)
        }))
        .unwrap_or(Err(DwarfError::Panicked { what: "indexing" }))
    }

    fn parse_inner(bytes: Bytes, max_decompressed: usize) -> Result<Self, DwarfError> {
        let file = object::File::parse(&*bytes).map_err(|source| DwarfError::Elf { source })?;
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let whole = Reader::new(bytes.clone(), endian);
        let mut decompressed = 0usize;
        let dwarf = gimli::Dwarf::load(|id| -> Result<Reader, DwarfError> {
            let empty = whole.range(0..0);
            if !needed(id) {
                return Ok(empty);
            }
            let Some(section) = file.section_by_name(id.name()) else {
                return Ok(empty);
            };
            let section_name = id.name();
            let range =
                section
                    .compressed_file_range()
                    .map_err(|source| DwarfError::Decompress {
                        section: section_name,
                        source,
                    })?;
            if range.format == CompressionFormat::None {
                // SHT_NOBITS: nothing in the file.
                let Some((offset, size)) = section.file_range() else {
                    return Ok(empty);
                };
                let start = usize::try_from(offset).ok();
                let end = start
                    .zip(usize::try_from(size).ok())
                    .and_then(|(s, l)| s.checked_add(l));
                return match (start, end) {
                    (Some(start), Some(end)) if end <= bytes.len() => Ok(whole.range(start..end)),
                    _ => Err(DwarfError::SectionBounds {
                        section: section_name,
                    }),
                };
            }
            let total = (decompressed as u64).saturating_add(range.uncompressed_size);
            if total > max_decompressed as u64 {
                return Err(DwarfError::TooLarge {
                    bytes: total,
                    limit: max_decompressed,
                });
            }
            let data = section
                .uncompressed_data()
                .map_err(|source| DwarfError::Decompress {
                    section: section_name,
                    source,
                })?
                .into_owned();
            decompressed += data.len();
            Ok(Reader::new(Bytes::new(Arc::new(data)), endian))
        })?;
        let units = {
            let mut count = 0usize;
            let mut headers = dwarf.units();
            while let Ok(Some(_)) = headers.next() {
                count += 1;
            }
            count
        };
        let context = addr2line::Context::from_dwarf(dwarf)
            .map_err(|source| DwarfError::Malformed { source })?;
        Ok(Self {
            context,
            units_seen: HashSet::new(),
            heap_bytes: decompressed + units * UNIT_INDEX_COST + std::mem::size_of::<Self>(),
        })
    }

    /// Estimated heap bytes of the context, growing as units are parsed.
    pub fn heap_bytes(&self) -> usize {
        self.heap_bytes
    }

    /// Frames at link-time address `vaddr`, innermost (inlined) first, the
    /// function the code was inlined into last. Empty when no unit covers
    /// the address.
    pub fn frames(&mut self, vaddr: u64) -> Result<Vec<DwarfFrame>, DwarfError> {
        catch_unwind(AssertUnwindSafe(|| self.frames_inner(vaddr)))
            .unwrap_or(Err(DwarfError::Panicked { what: "lookup" }))
    }

    fn frames_inner(&mut self, vaddr: u64) -> Result<Vec<DwarfFrame>, DwarfError> {
        // addr2line probes [vaddr, vaddr + 1).
        if vaddr == u64::MAX {
            return Ok(Vec::new());
        }
        if let Some(unit) = self.context.find_dwarf_and_unit(vaddr).skip_all_loads()
            && self.units_seen.insert(unit.header.offset().0 as u64)
        {
            let info = unit.header.length_including_self();
            let lines = unit
                .line_program
                .as_ref()
                .map_or(0, |program| program.header().raw_program_buf().len());
            self.heap_bytes = self
                .heap_bytes
                .saturating_add(info.saturating_mul(INFO_COST))
                .saturating_add(lines.saturating_mul(LINE_COST));
        }
        let mut iter = self
            .context
            .find_frames(vaddr)
            .skip_all_loads()
            .map_err(|source| DwarfError::Malformed { source })?;
        let mut frames = Vec::new();
        while let Some(frame) = iter
            .next()
            .map_err(|source| DwarfError::Malformed { source })?
        {
            if frames.len() == MAX_INLINE_DEPTH {
                break;
            }
            let name = frame
                .function
                .as_ref()
                .and_then(|function| function.raw_name().ok())
                .map(|name| name.into_owned())
                .filter(|name| !name.is_empty());
            let (file, line) = frame.location.map_or((None, None), |location| {
                (location.file.map(str::to_owned), location.line)
            });
            frames.push(DwarfFrame { name, file, line });
        }
        Ok(frames)
    }
}
