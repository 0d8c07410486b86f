//! The line side of a unit's DWARF: its line program run into rows once,
//! the row at an address, and the path of a file of its file table.

use gimli::Reader as _;

use crate::dwarf::Reader;

type Unit = gimli::Unit<Reader>;
type UnitRef<'a> = gimli::UnitRef<'a, Reader>;

/// One contiguous run of code and its rows, in address order.
pub(crate) struct Sequence {
    begin: u64,
    end: u64,
    rows: Box<[Row]>,
}

/// Where the code from an address on (up to the next row) comes from. A
/// parsed unit's memory is mostly these, so they are kept small: the
/// address as an offset into its sequence, and only where the file or
/// line changes (column and statement rows in between do not change what
/// a lookup answers).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Row {
    offset: u32,
    file: u32,
    /// 0: no line.
    line: u32,
}

impl Row {
    pub(crate) fn file(self) -> u64 {
        u64::from(self.file)
    }

    pub(crate) fn line(self) -> Option<u32> {
        (self.line != 0).then_some(self.line)
    }

    fn same_place(self, other: Row) -> bool {
        (self.file, self.line) == (other.file, other.line)
    }
}

/// The unit's line rows, one sequence of address-ordered rows per
/// contiguous run of code, sequences sorted by start.
pub(crate) fn line_rows(unit: &Unit) -> Result<Vec<Sequence>, gimli::Error> {
    let Some(program) = unit.line_program.clone() else {
        return Ok(Vec::new());
    };
    let mut sequences = Vec::new();
    let mut run = Run::default();
    let mut program_rows = program.rows();
    while let Some((_, row)) = program_rows.next_row()? {
        let address = row.address();
        if row.end_sequence() {
            run.finish(address, &mut sequences);
            continue;
        }
        let line = row
            .line()
            .map_or(0, |line| u32::try_from(line.get()).unwrap_or(u32::MAX));
        // A file index past u32 names no file of any real table.
        let file = u32::try_from(row.file_index()).unwrap_or(u32::MAX);
        run.push(address, file, line, &mut sequences);
    }
    sequences.sort_unstable_by_key(|sequence| sequence.begin);
    sequences.shrink_to_fit();
    Ok(sequences)
}

/// The sequence being read.
#[derive(Default)]
struct Run {
    begin: u64,
    /// Address of the last row pushed.
    last: u64,
    rows: Vec<Row>,
}

impl Run {
    fn push(&mut self, address: u64, file: u32, line: u32, sequences: &mut Vec<Sequence>) {
        if self.rows.is_empty() {
            self.begin = address;
        } else if address < self.last {
            // Rows out of order break the sequence's search: dropped.
            return;
        }
        let offset = match u32::try_from(address - self.begin) {
            Ok(offset) => offset,
            Err(_) => {
                // A run of 4 GiB of code: split where the offsets end.
                self.finish(address, sequences);
                self.begin = address;
                0
            }
        };
        let next = Row { offset, file, line };
        self.last = address;
        match self.rows.last_mut() {
            // Rows at one address: the last one describes the code there.
            Some(last) if last.offset == offset => *last = next,
            Some(last) if last.same_place(next) => {}
            _ => self.rows.push(next),
        }
    }

    /// Ends the sequence at `end`, keeping it unless it is empty.
    fn finish(&mut self, end: u64, sequences: &mut Vec<Sequence>) {
        if !self.rows.is_empty() && self.begin < end {
            sequences.push(Sequence {
                begin: self.begin,
                end,
                rows: std::mem::take(&mut self.rows).into_boxed_slice(),
            });
        }
        self.rows.clear();
    }
}

/// The row describing the code at `vaddr`.
pub(crate) fn row_at(sequences: &[Sequence], vaddr: u64) -> Option<Row> {
    let after = sequences.partition_point(|sequence| sequence.begin <= vaddr);
    let sequence = sequences.get(after.checked_sub(1)?)?;
    if vaddr >= sequence.end {
        return None;
    }
    // Below `end`, so within u32 of `begin` unless a split made the
    // sequence end where a longer one would have.
    let offset = u32::try_from(vaddr - sequence.begin).ok()?;
    let row = sequence.rows.partition_point(|row| row.offset <= offset);
    sequence.rows.get(row.checked_sub(1)?).copied()
}

/// The path of file `index` of the unit's line program: its directory and
/// name under the unit's compilation directory, unless absolute.
pub(crate) fn file_name(unit: UnitRef<'_>, index: u64) -> Option<String> {
    let header = unit.line_program.as_ref()?.header();
    let file = header.file(index)?;
    let mut path = unit
        .comp_dir
        .as_ref()
        .and_then(|dir| dir.to_string_lossy().ok())
        .map(|dir| dir.into_owned())
        .unwrap_or_default();
    let text = |value| {
        unit.attr_string(value)
            .ok()
            .and_then(|text| text.to_string_lossy().ok().map(|text| text.into_owned()))
    };
    // Directory 0 is the compilation directory itself.
    if file.directory_index() != 0
        && let Some(directory) = file.directory(header).and_then(text)
    {
        push_path(&mut path, &directory);
    }
    push_path(&mut path, &text(file.path_name())?);
    Some(path)
}

fn push_path(path: &mut String, part: &str) {
    if part.starts_with('/') {
        *path = part.to_owned();
        return;
    }
    if !path.is_empty() && !path.ends_with('/') {
        path.push('/');
    }
    path.push_str(part);
}
