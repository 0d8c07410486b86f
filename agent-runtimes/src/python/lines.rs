//! Code objects' line tables, decoded once into address ranges.
//!
//! CPython changed the format twice in the supported versions; each decoder
//! follows the interpreter's own (`PyCode_Addr2Line` and the address range
//! walk of `Objects/codeobject.c` of its version), so a frame gets the line
//! Python itself reports as `f_lineno`.

/// Line table formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LineFormat {
    /// `co_lnotab` (3.8, 3.9): `(address delta, signed line delta)` byte
    /// pairs; the line changes once the address is reached.
    Lnotab,
    /// `co_linetable` of 3.10: `(address delta, signed line delta)` pairs
    /// describing consecutive ranges; a line delta of -128 means "no line".
    Ranges,
    /// `co_linetable` of 3.11+: location entries of 1 to 8 code units.
    Locations,
}

/// Each range's start (a byte offset in the bytecode) and line, sorted by
/// start: a range ends where the next begins. A line of `None` is code with
/// no line (and, last, the end of the table).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LineTable {
    starts: Vec<(u32, Option<u32>)>,
}

impl LineTable {
    pub(crate) fn decode(format: LineFormat, table: &[u8], first_line: u32) -> Self {
        let first_line = i64::from(first_line);
        match format {
            LineFormat::Lnotab => lnotab(table, first_line),
            LineFormat::Ranges => ranges(table, first_line),
            LineFormat::Locations => locations(table, first_line),
        }
    }

    /// The line of the instruction at byte offset `offset`, as Python
    /// reports it (`None` for an instruction without one).
    #[cfg(test)]
    pub(crate) fn line(&self, offset: u32) -> Option<u32> {
        // The last range starting at or before `offset`: of several
        // starting at the same offset, the last (the others are empty).
        let after = self.starts.partition_point(|(start, _)| *start <= offset);
        after.checked_sub(1).and_then(|index| self.starts[index].1)
    }

    /// The line of the instruction at `offset`, or for one without a line
    /// (a generator's prologue, an exception handler's cleanup), that of
    /// the closest instruction before it with one: the line the frame is
    /// still on. `None` before every line.
    pub(crate) fn line_or_before(&self, offset: u32) -> Option<u32> {
        let after = self.starts.partition_point(|(start, _)| *start <= offset);
        self.starts[..after]
            .iter()
            .rev()
            .find_map(|(_, line)| *line)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.starts.capacity() * std::mem::size_of::<(u32, Option<u32>)>()
    }

    fn push(&mut self, start: i64, line: Option<i64>) {
        // A hostile table can push addresses or lines out of range: those
        // ranges are dropped (their offsets find the previous range).
        let Ok(start) = u32::try_from(start) else {
            return;
        };
        let line = line.and_then(|line| u32::try_from(line).ok());
        if self.starts.last().is_some_and(|(last, _)| *last > start) {
            return;
        }
        if self.starts.last().is_some_and(|last| last.1 == line) {
            return;
        }
        self.starts.push((start, line));
    }
}

/// 3.8/3.9 (`PyCode_Addr2Line`): the line at an address is the first line
/// plus the line deltas of every pair whose cumulative address is at or
/// before it.
fn lnotab(table: &[u8], first_line: i64) -> LineTable {
    let mut lines = LineTable::default();
    lines.push(0, Some(first_line));
    let (mut address, mut line) = (0i64, first_line);
    for pair in table.chunks_exact(2) {
        address += i64::from(pair[0]);
        line += i64::from(pair[1].cast_signed());
        lines.push(address, Some(line));
    }
    lines
}

/// 3.10 (`PyLineTable_NextAddressRange`): each pair is a range of
/// `address delta` bytes; empty ranges only move the line.
fn ranges(table: &[u8], first_line: i64) -> LineTable {
    let mut lines = LineTable::default();
    let (mut end, mut line) = (0i64, first_line);
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let delta = pair[1].cast_signed();
        let range_line = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if end > start {
            lines.push(start, range_line);
        }
    }
    lines.push(end, None);
    lines
}

/// Location entry codes of 3.11+ (`Include/cpython/code.h`,
/// `_PyCodeLocationInfoKind`).
const LOCATION_NO_COLUMNS: u8 = 13;
const LOCATION_LONG: u8 = 14;
const LOCATION_NONE: u8 = 15;
const LOCATION_ONE_LINE0: u8 = 10;
const LOCATION_ONE_LINE2: u8 = 12;

/// 3.11+ (`advance` in `Objects/codeobject.c`): an entry starts with a
/// byte with the top bit set: `1 code:4 length-1:3`, then its operands.
/// Only the line delta matters here: it is the entry's first operand
/// (a signed varint) for the long and no-column forms, the code itself for
/// the one-line forms, 0 for the short forms.
fn locations(table: &[u8], first_line: i64) -> LineTable {
    let mut lines = LineTable::default();
    let (mut address, mut line) = (0i64, first_line);
    let mut position = 0;
    while let Some(&header) = table.get(position) {
        position += 1;
        if header & 0x80 == 0 {
            // Not an entry start: CPython's tables never get here, a
            // hostile one stops.
            break;
        }
        let code = (header >> 3) & 15;
        let delta = match code {
            LOCATION_NO_COLUMNS | LOCATION_LONG => signed_varint(table, position),
            LOCATION_ONE_LINE0..=LOCATION_ONE_LINE2 => i64::from(code - LOCATION_ONE_LINE0),
            _ => 0,
        };
        line = line.saturating_add(delta);
        let entry_line = (code != LOCATION_NONE).then_some(line);
        lines.push(address, entry_line);
        address += (i64::from(header & 7) + 1) * 2;
        while table.get(position).is_some_and(|byte| byte & 0x80 == 0) {
            position += 1;
        }
    }
    lines.push(address, None);
    lines
}

/// `read_varint` of `Objects/codeobject.c`: 6 bits per byte, bit 6 says
/// another byte follows.
fn varint(table: &[u8], mut position: usize) -> u64 {
    let mut value = 0u64;
    let mut shift = 0u32;
    while let Some(&byte) = table.get(position) {
        if shift < 64 {
            value |= u64::from(byte & 63) << shift;
        }
        if byte & 64 == 0 {
            break;
        }
        shift += 6;
        position += 1;
    }
    value
}

/// `read_signed_varint`: the sign in the lowest bit.
fn signed_varint(table: &[u8], position: usize) -> i64 {
    let value = varint(table, position);
    let magnitude = i64::try_from(value >> 1).unwrap_or(i64::MAX);
    if value & 1 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_with_negative_and_split_deltas() {
        // Line 10 from 0, +1 at 6, address +300 in two steps (255, 45)
        // then +200 lines in two (127, 73), back -3 at 310.
        let table = [6, 1, 255, 0, 45, 127, 0, 73, 4, (-3i8).cast_unsigned()];
        let lines = LineTable::decode(LineFormat::Lnotab, &table, 10);
        assert_eq!(lines.line(0), Some(10));
        assert_eq!(lines.line(5), Some(10));
        assert_eq!(lines.line(6), Some(11));
        assert_eq!(lines.line(305), Some(11));
        assert_eq!(lines.line(306), Some(211));
        assert_eq!(lines.line(309), Some(211));
        assert_eq!(lines.line(310), Some(208));
        assert_eq!(lines.line(100_000), Some(208), "the last line holds on");
    }

    #[test]
    fn ranges_without_lines_and_empty_ranges() {
        // 4 bytes at line 3, no line for 2, an empty range moving to 5,
        // then 6 bytes of line 5.
        let table = [4, 2, 2, 0x80, 0, 2, 6, 0];
        let lines = LineTable::decode(LineFormat::Ranges, &table, 1);
        assert_eq!(lines.line(0), Some(3));
        assert_eq!(lines.line(3), Some(3));
        assert_eq!(lines.line(4), None);
        assert_eq!(lines.line(6), Some(5));
        assert_eq!(lines.line(11), Some(5));
        assert_eq!(lines.line(12), None, "past the table");
    }

    #[test]
    fn instructions_without_a_line_are_on_the_line_before() {
        // 3.10's `async def`: `GEN_START` (2 bytes, no line), then the body
        // at the def line + 2, an instruction without a line, line + 3.
        let table = [2, 0x80, 4, 2, 2, 0x80, 2, 1];
        let lines = LineTable::decode(LineFormat::Ranges, &table, 7);
        assert_eq!(lines.line(0), None);
        assert_eq!(lines.line_or_before(0), None, "before every line");
        assert_eq!(lines.line_or_before(1), None);
        assert_eq!(lines.line(2), Some(9));
        assert_eq!(lines.line_or_before(2), Some(9));
        assert_eq!(lines.line(6), None);
        assert_eq!(lines.line_or_before(6), Some(9), "still on the line before");
        assert_eq!(lines.line_or_before(8), Some(10));
        // 3.12's `asyncio.tasks.__sleep0` (a generator, def at 641):
        // `RETURN_GENERATOR` at 641, `POP_TOP` without a line (where a
        // started generator resumes), `RESUME` at 641, the body at 650, an
        // exception handler without a line.
        let table = [232, 0, 248, 128, 0, 244, 18, 0, 5, 10, 249];
        let lines = LineTable::decode(LineFormat::Locations, &table, 641);
        assert_eq!(lines.line(2), None);
        assert_eq!(lines.line_or_before(2), Some(641));
        assert_eq!(lines.line_or_before(6), Some(650));
        assert_eq!(lines.line(16), None);
        assert_eq!(lines.line_or_before(16), Some(650));
    }

    #[test]
    fn location_entries_of_every_kind() {
        let table = [
            0x80 | (LOCATION_ONE_LINE2 << 3),
            1,
            2, // 1 unit, line +2 (3)
            0x80 | (5 << 3) | 1,
            7, // short form, 2 units, same line
            0x80 | (LOCATION_NONE << 3),
            0x80 | (LOCATION_NO_COLUMNS << 3) | 2,
            0x40,
            0x02, // 3 units, line +(128 >> 1) = +64 (67)
            0x80 | (LOCATION_LONG << 3),
            5, // line -2 (65)
            0,
            1,
            2,
        ];
        let lines = LineTable::decode(LineFormat::Locations, &table, 1);
        assert_eq!(lines.line(0), Some(3));
        assert_eq!(lines.line(2), Some(3));
        assert_eq!(lines.line(5), Some(3));
        assert_eq!(lines.line(6), None);
        assert_eq!(lines.line(8), Some(67));
        assert_eq!(lines.line(13), Some(67));
        assert_eq!(lines.line(14), Some(65));
        assert_eq!(lines.line(16), None, "past the table");
    }

    #[test]
    fn hostile_tables_decode_to_something_bounded() {
        let lines = LineTable::decode(LineFormat::Locations, &[0x7f, 0x80], 5);
        assert_eq!(lines.line(0), None);
        let long = [
            0x80 | (LOCATION_LONG << 3),
            0x7f,
            0x7f,
            0x7f,
            0x7f,
            0x7f,
            0x7f,
        ];
        let lines = LineTable::decode(LineFormat::Locations, &long.repeat(20), 5);
        assert!(lines.starts.len() <= 2);
        let lines = LineTable::decode(LineFormat::Lnotab, &[0, 0x80, 0, 0x80], 100);
        assert_eq!(lines.line(0), None, "a negative line is no line");
        assert_eq!(LineTable::decode(LineFormat::Ranges, &[], 1).line(0), None);
    }
}
