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

#[derive(Clone, Copy)]
pub(crate) struct Row {
    address: u64,
    pub(crate) file: u64,
    /// 0: no line.
    pub(crate) line: u32,
}

/// The unit's line rows, one sequence of address-ordered rows per
/// contiguous run of code, sequences sorted by start.
pub(crate) fn line_rows(unit: &Unit) -> Result<Vec<Sequence>, gimli::Error> {
    let Some(program) = unit.line_program.clone() else {
        return Ok(Vec::new());
    };
    let mut sequences = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut program_rows = program.rows();
    while let Some((_, row)) = program_rows.next_row()? {
        let address = row.address();
        if row.end_sequence() {
            if let Some(first) = rows.first()
                && first.address < address
            {
                sequences.push(Sequence {
                    begin: first.address,
                    end: address,
                    rows: std::mem::take(&mut rows).into_boxed_slice(),
                });
            }
            rows.clear();
            continue;
        }
        let line = row
            .line()
            .map_or(0, |line| u32::try_from(line.get()).unwrap_or(u32::MAX));
        let next = Row {
            address,
            file: row.file_index(),
            line,
        };
        match rows.last_mut() {
            // Rows at one address: the last one describes the code there.
            Some(last) if last.address == address => *last = next,
            // Rows out of order break the sequence's search: dropped.
            Some(last) if last.address > address => {}
            _ => rows.push(next),
        }
    }
    sequences.sort_unstable_by_key(|sequence| sequence.begin);
    sequences.shrink_to_fit();
    Ok(sequences)
}

/// The row describing the code at `vaddr`.
pub(crate) fn row_at(sequences: &[Sequence], vaddr: u64) -> Option<Row> {
    let after = sequences.partition_point(|sequence| sequence.begin <= vaddr);
    let sequence = sequences.get(after.checked_sub(1)?)?;
    if vaddr >= sequence.end {
        return None;
    }
    let row = sequence.rows.partition_point(|row| row.address <= vaddr);
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
