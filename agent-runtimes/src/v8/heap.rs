//! V8 heap objects read out of another process: tagged words, instance
//! types, strings. Everything is checked for what it should be (a heap
//! pointer whose map is a map, of the expected instance type) and capped:
//! the process may be hostile, or the garbage collector may have moved the
//! object since the sample and reused its memory.

use std::sync::Arc;

use super::{Layout, NameError};
use crate::Memory;

/// Characters kept of a name or file name; longer ones are cut.
pub(crate) const MAX_STRING_CHARS: u64 = 1024;
/// Cons strings are trees (`a + b`); a name deeper than this is cut.
const MAX_STRING_DEPTH: u32 = 16;

pub(crate) fn read_u64(memory: &mut dyn Memory, address: u64) -> Result<u64, NameError> {
    let mut bytes = [0; 8];
    memory
        .read(address, &mut bytes)
        .map_err(|source| NameError::Read { source })?;
    Ok(u64::from_le_bytes(bytes))
}

/// A tagged field of the object at `object` (untagged), decompressed when
/// pointers are (the cage is the object's own 4 GiB).
pub(crate) fn tagged_field(
    memory: &mut dyn Memory,
    layout: &Layout,
    object: u64,
    offset: u64,
) -> Result<u64, NameError> {
    let address = object.wrapping_add(offset);
    if layout.tagging.tagged_size == 4 {
        let mut bytes = [0; 4];
        memory
            .read(address, &mut bytes)
            .map_err(|source| NameError::Read { source })?;
        let low = u64::from(u32::from_le_bytes(bytes));
        if layout.tagging.is_smi(low) {
            return Ok(low);
        }
        return Ok((object & !0xffff_ffff) | low);
    }
    read_u64(memory, address)
}

/// The tagged field at `offset` of the object `tagged` points at, if it
/// points at an object whose instance type `wanted` accepts (`None` for a
/// Smi or another type).
pub(crate) fn typed_field(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
    offset: u64,
    wanted: impl Fn(u16) -> bool,
) -> Result<Option<u64>, NameError> {
    let field = tagged_field(memory, layout, layout.tagging.untag(tagged), offset)?;
    if !layout.tagging.is_heap_object(field) || !wanted(instance_type(memory, layout, field)?) {
        return Ok(None);
    }
    Ok(Some(field))
}

/// The instance type of the object `tagged` points at, after checking the
/// pointer's tag and that its map's own map is the meta map (a map whose
/// instance type is `MAP_TYPE`): a word that only looks like a pointer
/// seldom passes both.
pub(crate) fn instance_type(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
) -> Result<u16, NameError> {
    if !layout.tagging.is_heap_object(tagged) {
        return Err(NameError::NotHeapObject { value: tagged });
    }
    let object = layout.tagging.untag(tagged);
    let map = tagged_field(memory, layout, object, layout.fields.heap_object_map)?;
    if !layout.tagging.is_heap_object(map) {
        return Err(NameError::NotHeapObject { value: map });
    }
    let map_object = layout.tagging.untag(map);
    let meta = tagged_field(memory, layout, map_object, layout.fields.heap_object_map)?;
    if !layout.tagging.is_heap_object(meta)
        || map_type(memory, layout, layout.tagging.untag(meta))? != layout.types.map
    {
        return Err(NameError::BadMap { object: tagged });
    }
    map_type(memory, layout, map_object)
}

fn map_type(memory: &mut dyn Memory, layout: &Layout, map: u64) -> Result<u16, NameError> {
    let mut bytes = [0; 2];
    memory
        .read(
            map.wrapping_add(layout.fields.map_instance_type),
            &mut bytes,
        )
        .map_err(|source| NameError::Read { source })?;
    Ok(u16::from_le_bytes(bytes))
}

/// Whether an instance type is a string's.
pub(crate) fn is_string(layout: &Layout, instance_type: u16) -> bool {
    instance_type < layout.types.first_nonstring
}

/// The string `tagged` points at: sequential, cons, thin and sliced
/// strings are followed; external strings (their characters live outside
/// the heap, in the embedder's memory) are not read.
pub(crate) fn read_string(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
) -> Result<Arc<str>, NameError> {
    let units = read_units(memory, layout, tagged, MAX_STRING_CHARS)?;
    Ok(Arc::from(String::from_utf16_lossy(&units)))
}

/// The first `limit` UTF-16 code units of a string (V8's source positions
/// count these).
pub(crate) fn read_units(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
    limit: u64,
) -> Result<Vec<u16>, NameError> {
    let mut units = Vec::new();
    append_units(memory, layout, tagged, 0, limit, &mut units)?;
    Ok(units)
}

/// A string's length in code units, whatever its representation (the
/// field is common to all strings).
pub(crate) fn string_length(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
) -> Result<u64, NameError> {
    let kind = instance_type(memory, layout, tagged)?;
    if !is_string(layout, kind) {
        return Err(NameError::WrongType {
            object: tagged,
            expected: "String",
            found: kind,
        });
    }
    raw_length(memory, layout, layout.tagging.untag(tagged))
}

fn raw_length(memory: &mut dyn Memory, layout: &Layout, object: u64) -> Result<u64, NameError> {
    let mut length = [0; 4];
    memory
        .read(
            object.wrapping_add(layout.fields.string_length),
            &mut length,
        )
        .map_err(|source| NameError::Read { source })?;
    Ok(u64::from(u32::from_le_bytes(length)))
}

/// The code unit at `index` of a string, found by descending its cons,
/// thin and sliced parts to the sequential string that holds it: a few
/// small reads, however long the string.
pub(crate) fn unit_at(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
    index: u64,
) -> Result<u16, NameError> {
    let fields = &layout.fields;
    let strings = &layout.strings;
    let mut tagged = tagged;
    let mut index = index;
    for _ in 0..=MAX_STRING_DEPTH * 4 {
        let kind = instance_type(memory, layout, tagged)?;
        if !is_string(layout, kind) {
            return Err(NameError::WrongType {
                object: tagged,
                expected: "String",
                found: kind,
            });
        }
        let object = layout.tagging.untag(tagged);
        let length = raw_length(memory, layout, object)?;
        if index >= length {
            return Err(NameError::BadString { object: tagged });
        }
        let representation = kind & strings.representation_mask;
        if representation == strings.seq {
            if kind & strings.encoding_mask == strings.one_byte {
                let mut byte = [0; 1];
                memory
                    .read(
                        object.wrapping_add(fields.seq_one_byte_chars + index),
                        &mut byte,
                    )
                    .map_err(|source| NameError::Read { source })?;
                return Ok(u16::from(byte[0]));
            }
            let mut unit = [0; 2];
            memory
                .read(
                    object.wrapping_add(fields.seq_two_byte_chars + 2 * index),
                    &mut unit,
                )
                .map_err(|source| NameError::Read { source })?;
            return Ok(u16::from_le_bytes(unit));
        } else if representation == strings.cons {
            let first = tagged_field(memory, layout, object, fields.cons_first)?;
            let first_length = string_length(memory, layout, first)?;
            if index < first_length {
                tagged = first;
            } else {
                index -= first_length;
                tagged = tagged_field(memory, layout, object, fields.cons_second)?;
            }
        } else if representation == strings.thin {
            tagged = tagged_field(memory, layout, object, fields.thin_actual)?;
        } else if representation == strings.sliced {
            let offset = tagged_field(memory, layout, object, fields.sliced_offset)?;
            let offset = layout
                .tagging
                .smi(offset)
                .and_then(|offset| u64::try_from(offset).ok())
                .ok_or(NameError::BadString { object: tagged })?;
            index += offset;
            tagged = tagged_field(memory, layout, object, fields.sliced_parent)?;
        } else {
            return Err(NameError::ExternalString { object: tagged });
        }
    }
    Err(NameError::TooDeep { object: tagged })
}

fn append_units(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
    depth: u32,
    limit: u64,
    out: &mut Vec<u16>,
) -> Result<(), NameError> {
    if depth > MAX_STRING_DEPTH {
        return Err(NameError::TooDeep { object: tagged });
    }
    let kind = instance_type(memory, layout, tagged)?;
    if !is_string(layout, kind) {
        return Err(NameError::WrongType {
            object: tagged,
            expected: "String",
            found: kind,
        });
    }
    let object = layout.tagging.untag(tagged);
    let fields = &layout.fields;
    let strings = &layout.strings;
    let representation = kind & strings.representation_mask;
    if representation == strings.seq {
        let length = raw_length(memory, layout, object)?.min(limit);
        let one_byte = kind & strings.encoding_mask == strings.one_byte;
        let (chars, width) = if one_byte {
            (fields.seq_one_byte_chars, 1)
        } else {
            (fields.seq_two_byte_chars, 2)
        };
        let mut bytes = vec![0; (length * width) as usize];
        memory
            .read(object.wrapping_add(chars), &mut bytes)
            .map_err(|source| NameError::Read { source })?;
        if one_byte {
            out.extend(bytes.iter().map(|&byte| u16::from(byte)));
        } else {
            out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|unit| u16::from_le_bytes([unit[0], unit[1]])),
            );
        }
        Ok(())
    } else if representation == strings.cons {
        let first = tagged_field(memory, layout, object, fields.cons_first)?;
        let second = tagged_field(memory, layout, object, fields.cons_second)?;
        let before = out.len() as u64;
        append_units(memory, layout, first, depth + 1, limit, out)?;
        let left = limit.saturating_sub(out.len() as u64 - before);
        if left > 0 {
            append_units(memory, layout, second, depth + 1, left, out)?;
        }
        Ok(())
    } else if representation == strings.thin {
        let actual = tagged_field(memory, layout, object, fields.thin_actual)?;
        append_units(memory, layout, actual, depth + 1, limit, out)
    } else if representation == strings.sliced {
        let parent = tagged_field(memory, layout, object, fields.sliced_parent)?;
        let offset = tagged_field(memory, layout, object, fields.sliced_offset)?;
        let offset = layout.tagging.smi(offset).unwrap_or(-1);
        let length = raw_length(memory, layout, object)?;
        let Ok(offset) = u64::try_from(offset) else {
            return Err(NameError::BadString { object: tagged });
        };
        let mut whole = Vec::new();
        append_units(
            memory,
            layout,
            parent,
            depth + 1,
            offset.saturating_add(length.min(limit)),
            &mut whole,
        )?;
        out.extend(whole.iter().skip(offset as usize));
        Ok(())
    } else {
        Err(NameError::ExternalString { object: tagged })
    }
}
