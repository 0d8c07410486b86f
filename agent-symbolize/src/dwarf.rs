//! DWARF line tables and inline frames through gimli, over the bytes of an
//! object or of its separate debug file. Pure: bytes in, frames out, no
//! I/O; so it is tested on fixtures and corrupt inputs without root.
//!
//! Built lazily: indexing an object keeps only its compilation units'
//! address ranges; a unit is parsed the first time an address falls in it
//! and let go when rounds stop using it ([`crate::dwarf_units`]). Its heap
//! use is estimated from what is parsed at the time, for the byte-bounded
//! cache that holds it.

use std::{
    fmt,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
};

use gimli::Section as _;
use object::{CompressionFormat, Object, ObjectSection};

use agent_elf::Bytes;

use crate::{
    dwarf_unit_index::{UnitIndex, abbrev_table_sizes},
    dwarf_units::{ParsedUnits, UnitCounts},
};

pub(crate) type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

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
    #[error("this DWARF, all parsed, needs about {bytes} bytes, more than the {limit} allowed")]
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

// What indexing costs: the compressed sections inflated, and per unit
// where it starts and its ranges (most units have one to a few; a Rust
// unit lists each function's).
const INDEX_COST_PER_UNIT: usize = 64;

/// The sections lookups read; the rest are never loaded (which matters
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

/// One object's DWARF, parsed a unit at a time as lookups need it.
pub struct DwarfInfo {
    dwarf: gimli::Dwarf<Reader>,
    index: UnitIndex,
    units: ParsedUnits,
    /// The file the uncompressed sections are read from.
    bytes: Bytes,
    /// Heap of the index and the inflated sections.
    index_bytes: usize,
    shape: DwarfShape,
    /// Bytes of units parsed since the file pages were last let go.
    touched_bytes: usize,
    /// Rounds (profiles) ended since the context was built.
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
    /// Abbreviation bytes the units parse all told: a table shared by
    /// units counts once for each.
    pub abbrev_parsed_bytes: usize,
    pub line_bytes: usize,
    /// Compressed sections inflated into memory.
    pub decompressed_bytes: usize,
}

impl DwarfShape {
    /// DWARF whose pages are let go while it is read, not only after.
    fn is_large(&self) -> bool {
        self.info_bytes >= RELEASE_DURING_INDEX_ABOVE
    }

    /// Estimated heap of the decompressed sections and the unit index.
    pub fn index_cost(&self) -> usize {
        self.decompressed_bytes
            .saturating_add(self.units.saturating_mul(INDEX_COST_PER_UNIT))
            .saturating_add(std::mem::size_of::<DwarfInfo>())
    }

    /// Estimated heap with every unit parsed: what the cache must be able
    /// to hold for the object to be taken at all. A larger one (glibc's
    /// debug file, a release build with line tables) would push the
    /// objects that fit out of the cache profile after profile, each
    /// parsed again every profile; it is named from its symbol table.
    pub fn full_cost(&self) -> usize {
        self.index_cost()
            .saturating_add(
                self.units
                    .saturating_mul(crate::dwarf_units::UNIT_BASE_COST),
            )
            .saturating_add(self.info_bytes / crate::dwarf_units::INFO_BYTES_PER_COST)
            .saturating_add(
                self.abbrev_parsed_bytes
                    .saturating_mul(crate::dwarf_units::COST_PER_ABBREV_BYTE),
            )
            .saturating_add(
                self.line_bytes
                    .saturating_mul(crate::dwarf_units::COST_PER_LINE_BYTE),
            )
    }
}

impl fmt::Debug for DwarfInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DwarfInfo")
            .field("units", &self.index.units())
            .field("heap_bytes", &self.heap_bytes())
            .finish()
    }
}

/// What the object would take all parsed ([`DwarfShape::full_cost`]) at
/// least, known before any section is inflated: from the sections' sizes
/// (a compressed one's is in its header), and a unit's cost for each unit
/// `.debug_aranges` lists (every unit with code has its set there; that
/// section is small).
pub(crate) fn full_cost_lower_bound(file: &object::File<'_>, endian: gimli::RunTimeEndian) -> u64 {
    use crate::dwarf_units::{
        COST_PER_ABBREV_BYTE, COST_PER_LINE_BYTE, INFO_BYTES_PER_COST, UNIT_BASE_COST,
    };
    let mut bound = 0u64;
    for id in NEEDED {
        let Some(section) = file.section_by_name(id.name()) else {
            continue;
        };
        let Ok(range) = section.compressed_file_range() else {
            continue;
        };
        let size = range.uncompressed_size;
        if range.format != CompressionFormat::None {
            bound = bound.saturating_add(size);
        }
        bound = bound.saturating_add(match id {
            gimli::SectionId::DebugInfo => size / INFO_BYTES_PER_COST as u64,
            gimli::SectionId::DebugLine => size.saturating_mul(COST_PER_LINE_BYTE as u64),
            // Each table is parsed at least once.
            gimli::SectionId::DebugAbbrev => size.saturating_mul(COST_PER_ABBREV_BYTE as u64),
            _ => 0,
        });
    }
    let units = listed_units(file, endian) as u64;
    bound.saturating_add(units.saturating_mul((UNIT_BASE_COST + INDEX_COST_PER_UNIT) as u64))
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
        // Refuse before inflating anything: what the sections' sizes alone
        // say the object would take all parsed.
        let lower_bound = full_cost_lower_bound(&file, endian);
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
            abbrev_parsed_bytes: 0,
            line_bytes: dwarf.debug_line.reader().len(),
            decompressed_bytes: decompressed,
        };
        // Counting and indexing read every unit's header, all over the
        // file: a large DWARF's pages are let go as they are read, not
        // after (lookups will read a few units).
        let large = shape.is_large();
        let index = || {
            let mut headers = dwarf.units();
            let mut abbrev_starts = Vec::new();
            while let Ok(Some(header)) = headers.next() {
                shape.units += 1;
                abbrev_starts.push(header.debug_abbrev_offset().0);
            }
            let abbrev_sizes = abbrev_table_sizes(&abbrev_starts, shape.abbrev_bytes);
            shape.abbrev_parsed_bytes = abbrev_sizes.iter().map(|&size| size as usize).sum();
            let full = shape.full_cost();
            if full > max_bytes {
                return Err(DwarfError::TooLarge {
                    bytes: full as u64,
                    limit: max_bytes,
                });
            }
            let heap_bytes = shape.index_cost();
            let index = UnitIndex::build(&dwarf, abbrev_sizes)
                .map_err(|source| DwarfError::Malformed { source })?;
            let index_bytes = heap_bytes.saturating_add(index.heap_bytes());
            Ok((dwarf, index, index_bytes))
        };
        let (dwarf, index, index_bytes) = if large {
            bytes.releasing_pages_during(index)?
        } else {
            let indexed = index()?;
            bytes.release_pages();
            indexed
        };
        Ok(Self {
            dwarf,
            index,
            units: ParsedUnits::default(),
            bytes,
            index_bytes,
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

    /// Estimated heap bytes: the index, and the units parsed and not yet
    /// let go.
    pub fn heap_bytes(&self) -> usize {
        self.index_bytes.saturating_add(self.units.heap_bytes())
    }

    /// Estimated heap bytes of the units parsed that no lookup used in
    /// this round or the one before.
    pub fn stale_bytes(&self) -> usize {
        self.units.stale_bytes(self.round)
    }

    /// Units parsed and let go since the last call.
    pub fn take_unit_counts(&mut self) -> UnitCounts {
        self.units.take_counts()
    }

    /// A round (a profile's lookups) is over: units idle for a few rounds
    /// are let go.
    pub fn end_round(&mut self) {
        self.round += 1;
        self.units.shed_idle(self.round);
    }

    /// Frames at link-time address `vaddr`, innermost (inlined) first, the
    /// function the code was inlined into last. Empty when no unit covers
    /// the address.
    pub fn frames(&mut self, vaddr: u64) -> Result<Vec<DwarfFrame>, DwarfError> {
        catch_unwind(AssertUnwindSafe(|| self.frames_inner(vaddr)))
            .unwrap_or(Err(DwarfError::Panicked { what: "lookup" }))
    }

    fn frames_inner(&mut self, vaddr: u64) -> Result<Vec<DwarfFrame>, DwarfError> {
        let (frames, read) = self
            .units
            .frames(&self.dwarf, &self.index, vaddr, self.round)
            .map_err(|source| DwarfError::Malformed { source })?;
        self.touched_bytes = self.touched_bytes.saturating_add(read);
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
