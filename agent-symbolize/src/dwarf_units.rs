//! Frames at an address from DWARF, one compilation unit at a time. The
//! index holds each unit's address ranges and nothing else; a unit's
//! abbreviations, line program header, function ranges and line rows are
//! parsed the first time an address falls in it, and are let go again when
//! a few rounds (profiles) have not used it. So a profile that needs three
//! addresses in a 10 MB debug build pays for the units they lie in, not
//! for an index of every unit, and holding the object between profiles
//! costs its range table.

use std::collections::{HashMap, hash_map::Entry};

use gimli::{AttributeValue, DebugInfoOffset, Reader as _, UnitOffset};

use crate::{
    dwarf::{DwarfFrame, Reader},
    dwarf_lines::{Sequence, file_name, line_rows, row_at},
    dwarf_unit_index::{UnitIndex, innermost},
};

type Unit = gimli::Unit<Reader>;
type UnitRef<'a> = gimli::UnitRef<'a, Reader>;
type Dwarf = gimli::Dwarf<Reader>;

/// More `DW_AT_abstract_origin` or `DW_AT_specification` hops than this
/// for one name means a reference loop.
const NAME_HOPS: usize = 16;
/// More inline levels than this at one address means corrupt DWARF.
const MAX_INLINE_DEPTH: usize = 64;
/// Entries nested deeper than this inside a function (blocks in blocks)
/// are not looked into: the walk recurses, and hostile DWARF may nest
/// without end.
const MAX_NESTING: usize = 256;
/// A parsed unit is let go when this many rounds (a minute of profiles at
/// the default interval) have ended without a lookup in it. Units used
/// now and then (a short-lived interpreter's start-up, reached by a
/// sample every few profiles) would otherwise be parsed again each time;
/// units idle for two rounds are counted stale all the same, for the cache
/// to shed when a profile needs the room.
pub(crate) const IDLE_ROUNDS: u64 = 6;

/// One unit, parsed for lookups.
struct ParsedUnit {
    unit: Unit,
    /// `DW_TAG_subprogram` ranges, sorted by start; parsed at the first
    /// lookup of an address (not for a name another unit refers to).
    functions: Option<Vec<FunctionRange>>,
    lines: Option<Vec<Sequence>>,
    /// The last round a lookup used it.
    round: u64,
    cost: usize,
}

struct FunctionRange {
    begin: u64,
    end: u64,
    entry: UnitOffset<usize>,
}

/// A `DW_TAG_inlined_subroutine` holding the address: the function inlined
/// and where it was called from.
struct InlinedCall {
    entry: UnitOffset<usize>,
    call_file: Option<u64>,
    call_line: Option<u32>,
}

/// The units parsed so far, with what each is estimated to hold.
#[derive(Default)]
pub(crate) struct ParsedUnits {
    units: HashMap<u32, ParsedUnit>,
    heap_bytes: usize,
    counts: UnitCounts,
}

/// Units parsed and let go since the counts were last taken: a unit parsed
/// again and again (let go between sporadic lookups) shows as both rising.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnitCounts {
    pub parsed: u64,
    pub dropped: u64,
}

// What a parsed unit costs, estimated from its size: its line program
// header and gimli's unit, its abbreviation table parsed (an entry with
// its attribute list for every dozen bytes or so), function ranges (one per
// subprogram, a few per 100 bytes of entries) and line rows (12 bytes where
// the file or line changes, with the header's file table). Set against
// the heap parsing took on libpython, glibc's and ld.so's debug files and
// Rust builds (`cargo bench -p firn --bench symbolize -- PATH`), above it
// on all of them.
pub(crate) const UNIT_BASE_COST: usize = 4 << 10;
pub(crate) const INFO_BYTES_PER_COST: usize = 4;
pub(crate) const COST_PER_LINE_BYTE: usize = 2;
/// A parsed abbreviation (with its attribute list) against its bytes.
pub(crate) const COST_PER_ABBREV_BYTE: usize = 16;

impl ParsedUnits {
    pub(crate) fn heap_bytes(&self) -> usize {
        self.heap_bytes
    }

    pub(crate) fn take_counts(&mut self) -> UnitCounts {
        std::mem::take(&mut self.counts)
    }

    /// Bytes of units no lookup used in this round or the one before.
    pub(crate) fn stale_bytes(&self, round: u64) -> usize {
        self.units
            .values()
            .filter(|unit| unit.round.saturating_add(1) < round)
            .map(|unit| unit.cost)
            .sum()
    }

    /// Lets go of units idle for [`IDLE_ROUNDS`] rounds before `round`.
    pub(crate) fn shed_idle(&mut self, round: u64) {
        let (mut freed, mut dropped) = (0, 0);
        self.units.retain(|_, unit| {
            let keep = unit.round.saturating_add(IDLE_ROUNDS) >= round;
            if !keep {
                freed += unit.cost;
                dropped += 1;
            }
            keep
        });
        self.counts.dropped += dropped;
        self.heap_bytes = self.heap_bytes.saturating_sub(freed);
    }

    /// Parses unit `number` unless it was; returns the bytes of
    /// `.debug_info` and `.debug_line` a first parse read.
    fn ensure(
        &mut self,
        dwarf: &Dwarf,
        index: &UnitIndex,
        number: u32,
        round: u64,
    ) -> Result<usize, gimli::Error> {
        match self.units.entry(number) {
            Entry::Occupied(mut parsed) => {
                let parsed = parsed.get_mut();
                parsed.round = parsed.round.max(round);
                Ok(0)
            }
            Entry::Vacant(vacant) => {
                let offset = index
                    .offsets
                    .get(number as usize)
                    .ok_or(gimli::Error::NoEntryAtGivenOffset(0))?;
                let header = dwarf
                    .debug_info
                    .header_from_offset(DebugInfoOffset(*offset))?;
                let info = header.length_including_self();
                let unit = dwarf.unit(header)?;
                let lines = unit
                    .line_program
                    .as_ref()
                    .map_or(0, |program| program.header().raw_program_buf().len());
                let abbrevs = index.abbrev_sizes.get(number as usize).map_or(0, |&size| {
                    (size as usize).saturating_mul(COST_PER_ABBREV_BYTE)
                });
                let cost = UNIT_BASE_COST
                    .saturating_add(abbrevs)
                    .saturating_add(info / INFO_BYTES_PER_COST)
                    .saturating_add(lines.saturating_mul(COST_PER_LINE_BYTE));
                self.heap_bytes = self.heap_bytes.saturating_add(cost);
                self.counts.parsed += 1;
                vacant.insert(ParsedUnit {
                    unit,
                    functions: None,
                    lines: None,
                    round,
                    cost,
                });
                Ok(info.saturating_add(lines))
            }
        }
    }

    /// Frames at `vaddr`, innermost (inlined) first, the function the code
    /// was inlined into last; with the bytes of DWARF a first parse of a
    /// unit read. Empty when no unit holds the address.
    pub(crate) fn frames(
        &mut self,
        dwarf: &Dwarf,
        index: &UnitIndex,
        vaddr: u64,
        round: u64,
    ) -> Result<(Vec<DwarfFrame>, usize), gimli::Error> {
        let Some(number) = index.unit_at(vaddr) else {
            return Ok((Vec::new(), 0));
        };
        let mut read = self.ensure(dwarf, index, number, round)?;
        let parsed = self
            .units
            .get_mut(&number)
            .ok_or(gimli::Error::NoEntryAtGivenOffset(0))?;
        let unit = UnitRef::new(dwarf, &parsed.unit);
        if parsed.functions.is_none() {
            parsed.functions = Some(function_ranges(unit)?);
        }
        if parsed.lines.is_none() {
            parsed.lines = Some(line_rows(&parsed.unit)?);
        }
        let function = parsed
            .functions
            .as_deref()
            .and_then(|functions| innermost(functions, vaddr, |f| (f.begin, f.end)))
            .map(|function| function.entry);
        let location = parsed
            .lines
            .as_deref()
            .and_then(|lines| row_at(lines, vaddr))
            .map(|row| (Some(row.file()), row.line()));
        let Some(function) = function else {
            // Code with lines but no function entry: a frame without a name.
            return Ok((
                location
                    .map(|(file, line)| {
                        vec![DwarfFrame {
                            name: None,
                            file: file.and_then(|file| file_name(unit, file)),
                            line,
                        }]
                    })
                    .unwrap_or_default(),
                read,
            ));
        };
        let calls = inlined_calls(unit, function, vaddr)?;
        // Innermost first: the innermost inlined function at the line row,
        // each caller at the call site of the function inlined into it.
        // Paths are rendered first: naming may parse other units, which
        // needs the parsed units mutably.
        let mut located = Vec::with_capacity(calls.len() + 1);
        let (mut file, mut line) = location.unwrap_or((None, None));
        for call in calls.iter().rev() {
            located.push((call.entry, file.and_then(|f| file_name(unit, f)), line));
            (file, line) = (call.call_file, call.call_line);
        }
        located.push((function, file.and_then(|f| file_name(unit, f)), line));
        let mut frames = Vec::with_capacity(located.len());
        for (entry, file, line) in located {
            let (name, name_read) = self.name(dwarf, index, number, entry, round)?;
            read = read.saturating_add(name_read);
            frames.push(DwarfFrame { name, file, line });
        }
        Ok((frames, read))
    }

    /// The name of the entry at `entry` in unit `number`: its linkage name,
    /// else its name, else that of the entry it is an instance or the
    /// definition of (`DW_AT_abstract_origin`, `DW_AT_specification`),
    /// which may lie in another unit.
    fn name(
        &mut self,
        dwarf: &Dwarf,
        index: &UnitIndex,
        mut number: u32,
        mut entry: UnitOffset<usize>,
        round: u64,
    ) -> Result<(Option<String>, usize), gimli::Error> {
        let mut read = 0;
        for _ in 0..NAME_HOPS {
            let parsed = self
                .units
                .get(&number)
                .ok_or(gimli::Error::NoEntryAtGivenOffset(0))?;
            let unit = UnitRef::new(dwarf, &parsed.unit);
            let die = unit.entry(entry)?;
            let string = |name| {
                die.attr_value(name)
                    .and_then(|value| unit.attr_string(value).ok())
                    .and_then(|name| name.to_string_lossy().ok().map(|name| name.into_owned()))
                    .filter(|name| !name.is_empty())
            };
            if let Some(name) = string(gimli::DW_AT_linkage_name)
                .or_else(|| string(gimli::DW_AT_MIPS_linkage_name))
                .or_else(|| string(gimli::DW_AT_name))
            {
                return Ok((Some(name), read));
            }
            let next = die
                .attr_value(gimli::DW_AT_abstract_origin)
                .or_else(|| die.attr_value(gimli::DW_AT_specification));
            match next {
                Some(AttributeValue::UnitRef(offset)) => entry = offset,
                Some(AttributeValue::DebugInfoRef(offset)) => {
                    let Some(target) = index.unit_holding(offset.0) else {
                        return Ok((None, read));
                    };
                    read = read.saturating_add(self.ensure(dwarf, index, target, round)?);
                    let start = index.offsets[target as usize];
                    let parsed = &self.units[&target];
                    let Some(relative) = DebugInfoOffset(offset.0)
                        .to_unit_offset(&parsed.unit.header)
                        .filter(|_| offset.0 >= start)
                    else {
                        return Ok((None, read));
                    };
                    number = target;
                    entry = relative;
                }
                _ => return Ok((None, read)),
            }
        }
        Ok((None, read))
    }
}

/// The ranges of every `DW_TAG_subprogram` in the unit, sorted by start.
/// Every entry is walked (a function may be defined inside another's
/// block, or inside a local class), but only a subprogram's attributes are
/// decoded: the rest are skipped by their forms' sizes, which is most of
/// what parsing a unit costs.
fn function_ranges(unit: UnitRef<'_>) -> Result<Vec<FunctionRange>, gimli::Error> {
    let mut functions = Vec::new();
    let mut attrs = Vec::new();
    let mut entries = unit.entries_raw(None)?;
    while !entries.is_empty() {
        let offset = entries.next_offset();
        let Some(abbreviation) = entries.read_abbreviation()? else {
            continue;
        };
        if abbreviation.tag() != gimli::DW_TAG_subprogram {
            entries.skip_attributes(abbreviation.attributes())?;
            continue;
        }
        entries.read_attributes(abbreviation.attributes(), &mut attrs)?;
        for_each_range(unit, &attrs, |begin, end| {
            functions.push(FunctionRange {
                begin,
                end,
                entry: offset,
            });
        })?;
    }
    functions.sort_unstable_by_key(|function| function.begin);
    functions.shrink_to_fit();
    Ok(functions)
}

/// Calls `each` with every address range of `entry` (`DW_AT_low_pc` with
/// `DW_AT_high_pc`, or `DW_AT_ranges`); empty and wrapping ones are left
/// out. gimli's own `die_ranges` adds a size to the start unchecked.
pub(crate) fn for_each_range(
    unit: UnitRef<'_>,
    attrs: &[gimli::Attribute<Reader>],
    mut each: impl FnMut(u64, u64),
) -> Result<(), gimli::Error> {
    let (mut low, mut high, mut size) = (None, None, None);
    for attr in attrs {
        match attr.name() {
            gimli::DW_AT_low_pc => low = unit.attr_address(attr.value())?,
            gimli::DW_AT_high_pc => match attr.value() {
                AttributeValue::Udata(bytes) => size = Some(bytes),
                value => high = unit.attr_address(value)?,
            },
            gimli::DW_AT_ranges => {
                if let Some(mut ranges) = unit.attr_ranges(attr.value())? {
                    while let Some(range) = ranges.next()? {
                        if range.begin < range.end {
                            each(range.begin, range.end);
                        }
                    }
                    return Ok(());
                }
            }
            _ => {}
        }
    }
    let end = match (low, size) {
        (Some(low), Some(size)) => low.checked_add(size),
        _ => high,
    };
    if let (Some(begin), Some(end)) = (low, end)
        && begin < end
    {
        each(begin, end);
    }
    Ok(())
}

/// The `DW_TAG_inlined_subroutine` entries holding `vaddr` in the function
/// at `function`, outermost first.
fn inlined_calls(
    unit: UnitRef<'_>,
    function: UnitOffset<usize>,
    vaddr: u64,
) -> Result<Vec<InlinedCall>, gimli::Error> {
    let mut calls = Vec::new();
    let mut tree = unit.entries_tree(Some(function))?;
    let root = tree.root()?;
    collect_inlined(unit, root, vaddr, &mut calls, 0)?;
    Ok(calls)
}

fn collect_inlined(
    unit: UnitRef<'_>,
    node: gimli::EntriesTreeNode<'_, '_, Reader>,
    vaddr: u64,
    calls: &mut Vec<InlinedCall>,
    nesting: usize,
) -> Result<bool, gimli::Error> {
    if nesting == MAX_NESTING {
        return Ok(false);
    }
    let mut children = node.children();
    while let Some(child) = children.next()? {
        let entry = child.entry();
        let tag = entry.tag();
        // A nested function is a function of its own.
        if tag == gimli::DW_TAG_subprogram {
            continue;
        }
        if tag == gimli::DW_TAG_inlined_subroutine {
            if !holds(unit, entry, vaddr)? {
                continue;
            }
            if calls.len() == MAX_INLINE_DEPTH {
                return Ok(true);
            }
            calls.push(InlinedCall {
                entry: entry.offset(),
                call_file: match entry.attr_value(gimli::DW_AT_call_file) {
                    Some(AttributeValue::FileIndex(file) | AttributeValue::Udata(file)) => {
                        Some(file)
                    }
                    _ => None,
                },
                call_line: entry
                    .attr_value(gimli::DW_AT_call_line)
                    .and_then(|line| line.udata_value())
                    .and_then(|line| u32::try_from(line).ok())
                    .filter(|&line| line != 0),
            });
            collect_inlined(unit, child, vaddr, calls, nesting + 1)?;
            return Ok(true);
        }
        // Lexical blocks and the like: what they hold may be inlined code
        // at the address.
        if entry.has_children() && collect_inlined(unit, child, vaddr, calls, nesting + 1)? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn holds(
    unit: UnitRef<'_>,
    entry: &gimli::DebuggingInformationEntry<Reader>,
    vaddr: u64,
) -> Result<bool, gimli::Error> {
    let mut held = false;
    for_each_range(unit, entry.attrs(), |begin, end| {
        held |= begin <= vaddr && vaddr < end
    })?;
    Ok(held)
}
