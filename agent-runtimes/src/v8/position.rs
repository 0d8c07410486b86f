//! Where a function starts in its script, as line and column, the way
//! V8's own profiler places it: the SharedFunctionInfo's start position
//! (the parameter list's `(` for `function f(a) {}`) turned into a line
//! and column by the script's line ends.
//!
//! A compiled function's start and end positions are kept in its ScopeInfo
//! (`position_info`), two Smis whose slot depends on the release and on
//! the scope's flags: in the header after the counts from V8 12.8 (where
//! `scopeinfo_idx_first_vars` leaves room for them), before it after the
//! optional parts that follow the context locals. Neither the slot nor the
//! flags' bits are among the post-mortem constants, so firn takes the
//! first pair of Smis among those slots that the source itself confirms:
//! the end must close the function (`}`, or the end of an arrow function's
//! expression body, which V8 marks one past its last character) and the
//! start must open its parameters (`(`) or be an arrow function's lone
//! parameter (followed by `=>`). A function whose source firn cannot read (external strings,
//! as Node's own modules are) or whose positions no pair matches has no
//! line: never a guessed one.

use agent_cache::ByteBoundedCache;

use super::{
    Layout, NameError,
    heap::{instance_type, read_units, string_length, tagged_field, unit_at},
};
use crate::Memory;

/// Code units of a script's source read at most to find its line ends
/// when V8 has not computed them (`Script::line_ends` is filled lazily):
/// a function past this has no line.
const MAX_SOURCE_UNITS: u64 = 1 << 21;
/// Slots after the context locals searched for the position pair: the
/// saved class variable, the receiver, the function variable's name and
/// slot, the inferred name come before it.
const SLOTS_AFTER_LOCALS: u64 = 7;
/// Bytes of line tables kept per process.
pub(crate) const LINE_CACHE_BYTES: usize = 1 << 20;

/// Where a function starts: 1-based line and column, as V8's profiler
/// reports them (a `.cpuprofile` file holds them 0-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    pub line: u32,
    pub column: u32,
}

/// Line ends of scripts whose `line_ends` V8 has not computed, by the
/// Script and its source (address and length).
pub(crate) type LineCache = ByteBoundedCache<(u64, u64, u64), Vec<u32>>;

/// The function's start position in its script, from its ScopeInfo
/// (`name_or_scope`), confirmed against the script's `source`.
pub(crate) fn start_position(
    memory: &mut dyn Memory,
    layout: &Layout,
    name_or_scope: u64,
    source: u64,
) -> Result<Option<u64>, NameError> {
    if !layout.tagging.is_heap_object(name_or_scope)
        || instance_type(memory, layout, name_or_scope)? != layout.types.scope_info
    {
        return Ok(None);
    }
    let length = string_length(memory, layout, source)?;
    let object = layout.tagging.untag(name_or_scope);
    let slot_size = u64::from(layout.tagging.tagged_size);
    let slot = |index: u64| layout.fields.heap_object_map + slot_size * (index + 1);
    let smi = |memory: &mut dyn Memory, index: u64| -> Result<Option<u64>, NameError> {
        let value = tagged_field(memory, layout, object, slot(index))?;
        Ok(layout
            .tagging
            .smi(value)
            .and_then(|value| u64::try_from(value).ok()))
    };
    let scope = &layout.scope_info;
    let Some(locals) = smi(memory, scope.context_local_count)? else {
        return Ok(None);
    };
    if locals > super::scope::MAX_CONTEXT_LOCALS {
        return Ok(None);
    }
    let names = if locals <= super::scope::MAX_INLINED_LOCAL_NAMES {
        locals
    } else {
        1
    };
    let after_locals = scope.first_vars + names + locals;
    let header = scope.context_local_count + 1..scope.first_vars;
    let candidates = header.chain(after_locals..after_locals + SLOTS_AFTER_LOCALS);
    let mut previous: Option<(u64, Option<u64>)> = None;
    for index in candidates {
        let value = smi(memory, index)?;
        if let (Some((before, Some(start))), Some(end)) = (previous, value)
            && before + 1 == index
            && start < end
            && end <= length
            && ((start == 0 && end == length) || confirmed(memory, layout, source, start, end)?)
        {
            return Ok(Some(start));
        }
        previous = Some((index, value));
    }
    Ok(None)
}

/// Longest parameter name of an arrow function `x => …` looked through.
const MAX_ARROW_PARAMETER: u64 = 64;

/// Whether the source between `start` and `end` looks like a function:
/// `(`…, or `x =>`… (an arrow function's lone parameter), ending on a
/// character that is not a space; a string firn cannot read confirms
/// nothing.
fn confirmed(
    memory: &mut dyn Memory,
    layout: &Layout,
    source: u64,
    start: u64,
    end: u64,
) -> Result<bool, NameError> {
    let Some(last) = unit(memory, layout, source, end - 1)? else {
        return Ok(false);
    };
    if char_of(last).is_whitespace() {
        return Ok(false);
    }
    let Some(first) = unit(memory, layout, source, start)? else {
        return Ok(false);
    };
    if first == u16::from(b'(') {
        return Ok(true);
    }
    if !is_identifier_start(char_of(first)) {
        return Ok(false);
    }
    // The parameter, spaces, then `=>`.
    let mut at = start + 1;
    let limit = end.min(start + MAX_ARROW_PARAMETER);
    while at < limit {
        let Some(next) = unit(memory, layout, source, at)? else {
            return Ok(false);
        };
        let next = char_of(next);
        if next == '=' {
            let arrow = unit(memory, layout, source, at + 1)?;
            return Ok(at + 1 < end && arrow == Some(u16::from(b'>')));
        }
        if !(is_identifier_part(next) || next.is_whitespace()) {
            return Ok(false);
        }
        at += 1;
    }
    Ok(false)
}

fn unit(
    memory: &mut dyn Memory,
    layout: &Layout,
    source: u64,
    index: u64,
) -> Result<Option<u16>, NameError> {
    match unit_at(memory, layout, source, index) {
        Ok(unit) => Ok(Some(unit)),
        Err(NameError::ExternalString { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

fn char_of(unit: u16) -> char {
    char::from_u32(u32::from(unit)).unwrap_or(char::REPLACEMENT_CHARACTER)
}

fn is_identifier_start(c: char) -> bool {
    c.is_alphabetic() || c == '_' || c == '$'
}

fn is_identifier_part(c: char) -> bool {
    is_identifier_start(c) || c.is_numeric()
}

/// `start` as line and column: from the Script's `line_ends` when V8 has
/// computed them, else from the source's newlines (kept per script).
pub(crate) fn line_and_column(
    memory: &mut dyn Memory,
    layout: &Layout,
    cache: &mut LineCache,
    script: u64,
    source: u64,
    start: u64,
) -> Result<Option<Position>, NameError> {
    let object = layout.tagging.untag(script);
    let line_ends = tagged_field(memory, layout, object, layout.fields.script_line_ends)?;
    if layout.tagging.is_heap_object(line_ends)
        && let Some(position) = from_line_ends(memory, layout, line_ends, start)?
    {
        return Ok(Some(position));
    }
    let length = string_length(memory, layout, source)?;
    let key = (script, source, length);
    if cache.get(&key).is_none() {
        let units = match read_units(memory, layout, source, length.min(MAX_SOURCE_UNITS)) {
            Ok(units) => units,
            Err(NameError::ExternalString { .. }) => return Ok(None),
            Err(error) => return Err(error),
        };
        let newlines: Vec<u32> = units
            .iter()
            .enumerate()
            .filter(|(_, unit)| **unit == u16::from(b'\n'))
            .map(|(index, _)| index as u32)
            .collect();
        let weight = std::mem::size_of::<Vec<u32>>() + newlines.len() * 4;
        cache.insert(key, newlines, weight);
    }
    let Some(newlines) = cache.get(&key) else {
        return Ok(None);
    };
    if start >= length.min(MAX_SOURCE_UNITS) {
        return Ok(None);
    }
    let line = newlines.partition_point(|&newline| u64::from(newline) < start);
    let line_start = match line {
        0 => 0,
        _ => u64::from(newlines[line - 1]) + 1,
    };
    Ok(Some(position(line as u64, start - line_start)))
}

/// Line ends as V8 keeps them: a FixedArray of Smis, each the position of
/// a line's `\n` (the last one the source's length), searched in place.
fn from_line_ends(
    memory: &mut dyn Memory,
    layout: &Layout,
    line_ends: u64,
    start: u64,
) -> Result<Option<Position>, NameError> {
    if instance_type(memory, layout, line_ends)? != layout.types.fixed_array {
        return Ok(None);
    }
    let object = layout.tagging.untag(line_ends);
    let count = tagged_field(memory, layout, object, layout.fields.fixed_array_length)?;
    let Some(count) = layout
        .tagging
        .smi(count)
        .and_then(|count| u64::try_from(count).ok())
    else {
        return Ok(None);
    };
    let slot_size = u64::from(layout.tagging.tagged_size);
    let end_of = |memory: &mut dyn Memory, line: u64| -> Result<Option<u64>, NameError> {
        let value = tagged_field(
            memory,
            layout,
            object,
            layout.fields.fixed_array_data + slot_size * line,
        )?;
        Ok(layout
            .tagging
            .smi(value)
            .and_then(|value| u64::try_from(value).ok()))
    };
    // The first line whose end is at or after `start`.
    let (mut low, mut high) = (0, count.min(1 << 24));
    while low < high {
        let middle = low + (high - low) / 2;
        let Some(end) = end_of(memory, middle)? else {
            return Ok(None);
        };
        if end < start {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    if low == count {
        return Ok(None);
    }
    let line_start = match low {
        0 => 0,
        _ => match end_of(memory, low - 1)? {
            Some(end) => end + 1,
            None => return Ok(None),
        },
    };
    Ok(Some(position(low, start.saturating_sub(line_start))))
}

fn position(line: u64, column: u64) -> Position {
    Position {
        line: u32::try_from(line + 1).unwrap_or(u32::MAX),
        column: u32::try_from(column + 1).unwrap_or(u32::MAX),
    }
}
