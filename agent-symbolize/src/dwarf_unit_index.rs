//! Where each compilation unit's code lies: the index a lookup consults
//! before parsing the one unit that holds its address. Built from
//! `.debug_aranges` where it lists a unit, else from the unit's root entry;
//! it holds ranges, unit offsets and abbreviation table sizes, nothing a
//! unit's parse produces.

use std::collections::HashMap;

use gimli::DebugInfoOffset;

use crate::dwarf_units::for_each_range;

type UnitRef<'a> = gimli::UnitRef<'a, crate::dwarf::Reader>;
type Dwarf = gimli::Dwarf<crate::dwarf::Reader>;

/// Ranges looked at backwards from the last one starting at or before an
/// address, for the one holding it: ranges of one object overlap only
/// where a function nests in another (or the DWARF is broken).
const OVERLAP_LOOKBACK: usize = 64;

/// The address ranges of every compilation unit, and where each unit
/// starts (for references from one unit into another).
#[derive(Default)]
pub(crate) struct UnitIndex {
    /// Sorted by `begin`.
    ranges: Vec<UnitRange>,
    /// Each unit's header offset in `.debug_info`, ascending.
    pub(crate) offsets: Vec<usize>,
    /// The bytes of each unit's abbreviation table (by unit, as
    /// `offsets`): gimli parses a unit's table whole, for each unit.
    pub(crate) abbrev_sizes: Vec<u32>,
}

/// The size of each unit's abbreviation table, given where each starts
/// (one per unit, in unit order): up to the next table, or the end of the
/// section. Units sharing a table each count it whole: each parses it.
pub(crate) fn abbrev_table_sizes(starts: &[usize], section_len: usize) -> Vec<u32> {
    let mut distinct = starts.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    starts
        .iter()
        .map(|&start| {
            let next = distinct.partition_point(|&other| other <= start);
            let end = distinct.get(next).copied().unwrap_or(section_len);
            u32::try_from(end.saturating_sub(start)).unwrap_or(u32::MAX)
        })
        .collect()
}

#[derive(Clone, Copy)]
struct UnitRange {
    begin: u64,
    end: u64,
    unit: u32,
}

impl UnitIndex {
    /// The ranges of each unit: from `.debug_aranges` where it lists the
    /// unit (no need to parse it), else from the unit's root entry.
    pub(crate) fn build(dwarf: &Dwarf, abbrev_sizes: Vec<u32>) -> Result<Self, gimli::Error> {
        let mut listed: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        let mut headers = dwarf.debug_aranges.headers();
        while let Some(header) = headers.next()? {
            let ranges = listed.entry(header.debug_info_offset().0).or_default();
            let mut entries = header.entries();
            while let Some(entry) = entries.next()? {
                let range = entry.range();
                if range.begin < range.end {
                    ranges.push((range.begin, range.end));
                }
            }
        }
        let mut index = Self {
            abbrev_sizes,
            ..Self::default()
        };
        let mut units = dwarf.units();
        while let Some(header) = units.next()? {
            let offset = DebugInfoOffset(header.offset().0);
            let Ok(number) = u32::try_from(index.offsets.len()) else {
                break;
            };
            index.offsets.push(offset.0);
            // Type and partial units hold no code; they are only referred to.
            if !matches!(
                header.type_(),
                gimli::UnitType::Compilation | gimli::UnitType::Skeleton(_)
            ) {
                continue;
            }
            let mut push = |begin: u64, end: u64| {
                if begin < end {
                    index.ranges.push(UnitRange {
                        begin,
                        end,
                        unit: number,
                    });
                }
            };
            if let Some(ranges) = listed.get(&offset.0).filter(|ranges| !ranges.is_empty()) {
                for &(begin, end) in ranges {
                    push(begin, end);
                }
                continue;
            }
            // A unit that cannot be parsed has no frames; the others still do.
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let unit = UnitRef::new(dwarf, &unit);
            let mut entries = unit.entries();
            if let Ok(Some(root)) = entries.next_dfs() {
                // Ranges read before one that does not read still count.
                let _ = for_each_range(unit, root.attrs(), &mut push);
            }
        }
        index.ranges.sort_unstable_by_key(|range| range.begin);
        index.ranges.shrink_to_fit();
        index.offsets.shrink_to_fit();
        Ok(index)
    }

    pub(crate) fn units(&self) -> usize {
        self.offsets.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.ranges.capacity() * size_of::<UnitRange>()
            + self.offsets.capacity() * size_of::<usize>()
            + self.abbrev_sizes.capacity() * size_of::<u32>()
    }

    /// The unit whose ranges hold `vaddr`.
    pub(crate) fn unit_at(&self, vaddr: u64) -> Option<u32> {
        innermost(&self.ranges, vaddr, |range| (range.begin, range.end)).map(|range| range.unit)
    }

    /// The unit holding `.debug_info` offset `offset`.
    pub(crate) fn unit_holding(&self, offset: usize) -> Option<u32> {
        let after = self.offsets.partition_point(|&start| start <= offset);
        u32::try_from(after.checked_sub(1)?).ok()
    }
}

/// Among `items` sorted by start, the narrowest that holds `vaddr`.
pub(crate) fn innermost<T>(
    items: &[T],
    vaddr: u64,
    range: impl Fn(&T) -> (u64, u64),
) -> Option<&T> {
    let after = items.partition_point(|item| range(item).0 <= vaddr);
    items[..after]
        .iter()
        .rev()
        .take(OVERLAP_LOOKBACK)
        .filter(|item| vaddr < range(item).1)
        .min_by_key(|item| {
            let (begin, end) = range(item);
            end - begin
        })
}
