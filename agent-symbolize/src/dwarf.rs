//! DWARF line tables and inline frames through addr2line, over the bytes of
//! an object or of its separate debug file. Pure: bytes in, frames out, no
//! I/O; so it is tested on fixtures and corrupt inputs without root.
//!
//! A context is built lazily: creating one only indexes the compilation
//! units' address ranges; a unit's lines and functions are parsed the first
//! time an address falls in it. Its heap use is estimated from what was
//! parsed so far, for the byte-bounded cache that holds it.

use std::{
    collections::{HashMap, hash_map::Entry},
    fmt,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
};

use gimli::Section as _;
use object::{CompressionFormat, Object, ObjectSection};

use agent_elf::Bytes;

type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

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
    #[error("indexing this DWARF needs about {bytes} bytes, more than the {limit} allowed")]
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

// What addr2line's structures cost, estimated from the DWARF's shape. The
// unit index built up front holds every unit's abbreviations and line
// program header (file and directory tables); a unit's lines (one 24-byte
// row per one to three opcode bytes) and functions are parsed when an
// address first falls in it. Fitted on firn's own debug and release builds
// and Debian's glibc debug files with `cargo bench -p firn --bench
// symbolize`, within about 40% of the heap measured there. The parsed
// units' cost was refitted on firn's debug build and a pyenv libpython
// 3.11 (2000 addresses: 80.1 and 8.6 MiB measured, 80.0 and 10 MiB
// estimated; 6 per line byte and 1/2 per info byte counted 1.5 to 1.7
// times the heap, which pushed libpython's context out of the default
// cache every profile, to be indexed and parsed again the next).
const INDEX_COST_PER_UNIT: usize = 7 << 10;
const INDEX_COST_PER_ABBREV_BYTE: usize = 6;
const INDEX_COST_PER_LINE_BYTE: usize = 1;
const PARSED_COST_PER_LINE_BYTE: usize = 4;
const PARSED_INFO_BYTES_PER_COST: usize = 3;

/// The sections addr2line reads; the rest are never loaded (which matters
/// for compressed ones: they would be decompressed for nothing).
const NEEDED: [gimli::SectionId; 10] = [
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugAddr,
    gimli::SectionId::DebugAranges,
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugLine,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugRanges,
    gimli::SectionId::DebugRngLists,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugStrOffsets,
];

/// A lazily parsed addr2line context for one object.
pub struct DwarfInfo {
    context: addr2line::Context<Reader>,
    /// The file the uncompressed sections are read from.
    bytes: Bytes,
    /// The units parsed into the context, by offset: what each added to
    /// its heap and the last round a lookup used it.
    units_seen: HashMap<u64, UnitUse>,
    heap_bytes: usize,
    shape: DwarfShape,
    /// Bytes of units parsed since the file pages were last let go.
    touched_bytes: usize,
    /// Rounds (profiles) ended since the context was built.
    round: u64,
}

#[derive(Clone, Copy, Debug)]
struct UnitUse {
    cost: usize,
    round: u64,
}

/// The file pages the units parsed for lookups have touched are let go
/// after this many bytes of units: a large object's DWARF (firn's own, 50 MB
/// of it) would otherwise sit in RSS until the profile is built, and a
/// profile's first lookups reach into a dozen objects at once.
const RELEASE_AFTER_BYTES: usize = 1 << 20;

/// Above this many bytes of `.debug_info`, the file pages are let go while
/// the index is built (by a second thread, see
/// [`Bytes::releasing_pages_during`]), not only after it.
const RELEASE_DURING_INDEX_ABOVE: usize = 4 << 20;

/// How big an object's DWARF is, which predicts what parsing it costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DwarfShape {
    pub units: usize,
    pub info_bytes: usize,
    pub abbrev_bytes: usize,
    pub line_bytes: usize,
    /// Compressed sections inflated into memory.
    pub decompressed_bytes: usize,
}

impl DwarfShape {
    /// Estimated heap of the decompressed sections and the unit index.
    /// DWARF whose pages are let go while it is read, not only after.
    fn is_large(&self) -> bool {
        self.info_bytes >= RELEASE_DURING_INDEX_ABOVE
    }

    pub fn index_cost(&self) -> usize {
        self.decompressed_bytes
            .saturating_add(self.units.saturating_mul(INDEX_COST_PER_UNIT))
            .saturating_add(self.abbrev_bytes.saturating_mul(INDEX_COST_PER_ABBREV_BYTE))
            .saturating_add(self.line_bytes.saturating_mul(INDEX_COST_PER_LINE_BYTE))
            .saturating_add(std::mem::size_of::<DwarfInfo>())
    }
}

impl fmt::Debug for DwarfInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DwarfInfo")
            .field("units_seen", &self.units_seen.len())
            .field("heap_bytes", &self.heap_bytes)
            .finish()
    }
}

/// What indexing will take at least, known before the large sections are
/// inflated: the compressed sections inflated, the abbreviations' and line
/// programs' index, and a unit's cost for each unit `.debug_aranges` lists
/// (every unit with code has its set there; that section is small).
pub(crate) fn index_cost_lower_bound(file: &object::File<'_>, endian: gimli::RunTimeEndian) -> u64 {
    let mut inflated = 0u64;
    let mut lower_bound = 0u64;
    for id in NEEDED {
        let Some(section) = file.section_by_name(id.name()) else {
            continue;
        };
        let Ok(range) = section.compressed_file_range() else {
            continue;
        };
        if range.format != CompressionFormat::None {
            inflated = inflated.saturating_add(range.uncompressed_size);
        }
        let per_byte = match id {
            gimli::SectionId::DebugAbbrev => INDEX_COST_PER_ABBREV_BYTE,
            gimli::SectionId::DebugLine => INDEX_COST_PER_LINE_BYTE,
            _ => continue,
        };
        lower_bound =
            lower_bound.saturating_add(range.uncompressed_size.saturating_mul(per_byte as u64));
    }
    let units = listed_units(file, endian) as u64;
    lower_bound
        .saturating_add(inflated)
        .saturating_add(units.saturating_mul(INDEX_COST_PER_UNIT as u64))
}

/// Most of `.debug_aranges` inflated to count its units.
const MAX_ARANGES_BYTES: u64 = 16 << 20;

/// The units with address sets in `.debug_aranges` (0 without one).
pub(crate) fn listed_units(file: &object::File<'_>, endian: gimli::RunTimeEndian) -> usize {
    let Some(section) = file.section_by_name(gimli::SectionId::DebugAranges.name()) else {
        return 0;
    };
    let plausible = section.compressed_file_range().is_ok_and(|range| {
        range.uncompressed_size <= MAX_ARANGES_BYTES
            && range.uncompressed_size <= range.compressed_size.saturating_mul(1032)
    });
    let Some(data) = plausible
        .then(|| section.uncompressed_data().ok())
        .flatten()
    else {
        return 0;
    };
    let mut headers = gimli::DebugAranges::new(&data, endian).headers();
    let mut units = 0;
    while let Ok(Some(_)) = headers.next() {
        units += 1;
    }
    units
}

/// Section `id` of `file`: a range of `whole` when stored plainly, or
/// inflated onto the heap, with `decompressed` (the bytes inflated so far)
/// kept under `max_bytes`.
fn load_section(
    file: &object::File<'_>,
    whole: &Reader,
    id: gimli::SectionId,
    endian: gimli::RunTimeEndian,
    max_bytes: usize,
    decompressed: &mut usize,
) -> Result<Reader, DwarfError> {
    let empty = whole.range(0..0);
    let Some(section) = file.section_by_name(id.name()) else {
        return Ok(empty);
    };
    let section_name = id.name();
    let range = section
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
            (Some(start), Some(end)) if end <= whole.len() => Ok(whole.range(start..end)),
            _ => Err(DwarfError::SectionBounds {
                section: section_name,
            }),
        };
    }
    let total = (*decompressed as u64).saturating_add(range.uncompressed_size);
    if total > max_bytes as u64 {
        return Err(DwarfError::TooLarge {
            bytes: total,
            limit: max_bytes,
        });
    }
    let data = section
        .uncompressed_data()
        .map_err(|source| DwarfError::Decompress {
            section: section_name,
            source,
        })?
        .into_owned();
    *decompressed += data.len();
    Ok(Reader::new(Bytes::new(Arc::new(data)), endian))
}

impl DwarfInfo {
    /// Indexes the DWARF of the ELF file in `bytes`, unless that would take
    /// more than `max_bytes` of heap (decompressed sections included).
    pub fn parse(bytes: Bytes, max_bytes: usize) -> Result<Self, DwarfError> {
        catch_unwind(AssertUnwindSafe(|| Self::parse_inner(bytes, max_bytes)))
            .unwrap_or(Err(DwarfError::Panicked { what: "indexing" }))
    }

    fn parse_inner(bytes: Bytes, max_bytes: usize) -> Result<Self, DwarfError> {
        let file = object::File::parse(&*bytes).map_err(|source| DwarfError::Elf { source })?;
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let whole = Reader::new(bytes.clone(), endian);
        // Refuse before inflating anything: what the compressed sections
        // and the abbreviations alone will take.
        let lower_bound = index_cost_lower_bound(&file, endian);
        if lower_bound > max_bytes as u64 {
            return Err(DwarfError::TooLarge {
                bytes: lower_bound,
                limit: max_bytes,
            });
        }
        let mut decompressed = 0usize;
        let dwarf = gimli::Dwarf::load(|id| {
            if !NEEDED.contains(&id) {
                return Ok(whole.range(0..0));
            }
            load_section(&file, &whole, id, endian, max_bytes, &mut decompressed)
        })?;
        let mut shape = DwarfShape {
            units: 0,
            info_bytes: dwarf.debug_info.reader().len(),
            abbrev_bytes: dwarf.debug_abbrev.reader().len(),
            line_bytes: dwarf.debug_line.reader().len(),
            decompressed_bytes: decompressed,
        };
        // Counting and indexing read every unit's header, all over the
        // file: a large DWARF's pages are let go as they are read, not
        // after (lookups will read a few units).
        let large = shape.is_large();
        let index = || {
            let mut headers = dwarf.units();
            while let Ok(Some(_)) = headers.next() {
                shape.units += 1;
            }
            let heap_bytes = shape.index_cost();
            if heap_bytes > max_bytes {
                return Err(DwarfError::TooLarge {
                    bytes: heap_bytes as u64,
                    limit: max_bytes,
                });
            }
            let mut dwarf = dwarf;
            dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
            let context = addr2line::Context::from_dwarf(dwarf)
                .map_err(|source| DwarfError::Malformed { source })?;
            Ok((context, heap_bytes))
        };
        let (context, heap_bytes) = if large {
            bytes.releasing_pages_during(index)?
        } else {
            let indexed = index()?;
            bytes.release_pages();
            indexed
        };
        Ok(Self {
            context,
            bytes,
            units_seen: HashMap::new(),
            heap_bytes,
            shape,
            touched_bytes: 0,
            round: 0,
        })
    }

    /// Lets the kernel drop the file pages lookups have touched.
    pub fn release_pages(&self) {
        self.bytes.release_pages();
    }

    /// Sizes of what was indexed.
    pub fn shape(&self) -> DwarfShape {
        self.shape
    }

    /// Estimated heap bytes of the context, growing as units are parsed.
    pub fn heap_bytes(&self) -> usize {
        self.heap_bytes
    }

    /// Estimated heap bytes of the units parsed into the context that no
    /// lookup used in this round or the one before: what building the
    /// context again would not bring back unless later lookups need it.
    pub fn stale_bytes(&self) -> usize {
        self.units_seen
            .values()
            .filter(|unit| unit.round.saturating_add(1) < self.round)
            .map(|unit| unit.cost)
            .sum()
    }

    /// A round (a profile's lookups) is over.
    pub fn end_round(&mut self) {
        self.round += 1;
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
        if let Some(unit) = self.context.find_dwarf_and_unit(vaddr).skip_all_loads() {
            let round = self.round;
            match self.units_seen.entry(unit.header.offset().0 as u64) {
                Entry::Occupied(mut seen) => seen.get_mut().round = round,
                Entry::Vacant(new) => {
                    let info = unit.header.length_including_self();
                    let lines = unit
                        .line_program
                        .as_ref()
                        .map_or(0, |program| program.header().raw_program_buf().len());
                    let cost = (info / PARSED_INFO_BYTES_PER_COST)
                        .saturating_add(lines.saturating_mul(PARSED_COST_PER_LINE_BYTE));
                    new.insert(UnitUse { cost, round });
                    self.heap_bytes = self.heap_bytes.saturating_add(cost);
                    self.touched_bytes = self
                        .touched_bytes
                        .saturating_add(info)
                        .saturating_add(lines);
                }
            }
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
        // After the lookup: the unit it parsed is in the heap now. A large
        // DWARF's units are let go one at a time: the names of one unit's
        // functions lie all over its `.debug_str` (10 MB in a debug build),
        // and each read there faults in the 64 KiB around it.
        let release_after = if self.shape.is_large() {
            1
        } else {
            RELEASE_AFTER_BYTES
        };
        if self.touched_bytes >= release_after {
            self.touched_bytes = 0;
            self.bytes.release_pages();
        }
        Ok(frames)
    }
}
