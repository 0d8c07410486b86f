//! The line a frame is running, where V8 says: an interpreted frame's
//! bytecode offset (a slot of the frame) mapped by its BytecodeArray's
//! source position table, an optimized frame's pc by its Code's (see
//! [`super::inlined`]). Baseline (Sparkplug) frames keep no bytecode
//! offset in the frame; they, and frames whose tables cannot be read, keep
//! the line where their function starts.
//!
//! No release exports where a BytecodeArray keeps its source position
//! table (V8 10 and 11 after the constant pool and the handler table, V8
//! 12 on before them). Both tables are byte arrays; firn takes the table
//! from the tagged fields between the array's length and its bytecodes
//! (`BytecodeArray::data`, exported) that decodes as one: bytecode offsets
//! in order within the bytecodes, no inlining, script offsets within the
//! script. A field is learned per process once it was the only one to
//! decode in an array (a function without `try` has an empty handler
//! table); every table is decoded and checked all the same.

use std::sync::Arc;

use agent_cache::ByteBoundedCache;

use super::{
    Layout, NameError,
    heap::{instance_type, string_length, tagged_field},
    inlined::{decode_positions, script_offset},
};
use crate::Memory;

/// Bytes of a bytecode position table read at most.
const MAX_TABLE_BYTES: usize = 256 << 10;
/// Bytes of decoded bytecode tables kept per process.
const TABLE_CACHE_BYTES: usize = 1 << 20;

/// A decoded table: (bytecode offset, source position), in order.
type Table = Arc<Vec<(u64, u64)>>;

/// Reads interpreted frames' positions in one process.
pub(crate) struct BytecodePositions {
    /// `BytecodeArray::data`: the bytecodes' offset in the array.
    data: u64,
    byte_arrays: [u16; 2],
    /// The field holding the source position table, once learned.
    field: Option<u64>,
    /// By BytecodeArray and table.
    tables: ByteBoundedCache<(u64, u64), Table>,
}

impl BytecodePositions {
    pub fn new(data: u64, byte_arrays: [u16; 2]) -> Self {
        Self {
            data,
            byte_arrays,
            field: None,
            tables: ByteBoundedCache::new(TABLE_CACHE_BYTES),
        }
    }

    /// The script offset an interpreted frame runs: `bytecode_array` and
    /// `offset` are the frame's slots as of the sample (the offset a Smi
    /// counted from the tagged array), `source` the function's script's
    /// source (checked a string).
    pub fn script_offset(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        bytecode_array: u64,
        offset: u64,
        source: u64,
    ) -> Result<Option<u64>, NameError> {
        let tag = layout.tagging.heap_object_tag;
        let (Some(offset), true) = (
            layout.tagging.smi(offset),
            layout.tagging.is_heap_object(bytecode_array),
        ) else {
            return Ok(None);
        };
        if instance_type(memory, layout, bytecode_array)? != layout.types.bytecode_array {
            return Ok(None);
        }
        let object = layout.tagging.untag(bytecode_array);
        let length = tagged_field(memory, layout, object, layout.fields.fixed_array_length)?;
        let (Some(length), Ok(offset)) = (
            layout.tagging.smi(length),
            u64::try_from(offset - (self.data as i64 - tag as i64)),
        ) else {
            return Ok(None);
        };
        if offset >= length as u64 {
            return Ok(None);
        }
        let limits = Limits {
            bytecodes: length as u64,
            source: string_length(memory, layout, source)?,
        };
        let Some(table) = self.table(memory, layout, bytecode_array, limits)? else {
            return Ok(None);
        };
        let at = table.partition_point(|&(bytecode, _)| bytecode <= offset);
        Ok(at
            .checked_sub(1)
            .and_then(|index| script_offset(table[index].1)))
    }

    /// The array's position table, decoded.
    fn table(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        bytecode_array: u64,
        limits: Limits,
    ) -> Result<Option<Table>, NameError> {
        let object = layout.tagging.untag(bytecode_array);
        let slot = u64::from(layout.tagging.tagged_size);
        let fields: Vec<u64> = match self.field {
            Some(field) => vec![field],
            None => (layout.fields.fixed_array_length + slot..self.data)
                .step_by(slot as usize)
                .collect(),
        };
        let mut decoded = Vec::new();
        for field in fields {
            let table = tagged_field(memory, layout, object, field)?;
            if let Some(entries) = self.tables.get(&(bytecode_array, table)) {
                return Ok(Some(entries.clone()));
            }
            if let Some(entries) = self.decode(memory, layout, table, limits)? {
                decoded.push((field, table, entries));
            }
        }
        // Two tables that decode leave the field unknown, and the array
        // without a line.
        if decoded.len() != 1 {
            return Ok(None);
        }
        let (field, table, entries) = decoded.pop().expect("one table");
        self.field = Some(field);
        let entries = Arc::new(entries);
        let weight = std::mem::size_of::<(u64, u64)>() * (entries.len() + 2);
        self.tables
            .insert((bytecode_array, table), entries.clone(), weight);
        Ok(Some(entries))
    }

    /// `table`'s entries, if it is a byte array that decodes as a source
    /// position table within `limits`.
    fn decode(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        table: u64,
        limits: Limits,
    ) -> Result<Option<Vec<(u64, u64)>>, NameError> {
        if !layout.tagging.is_heap_object(table) {
            return Ok(None);
        }
        let kind = instance_type(memory, layout, table)?;
        if kind == 0 || !self.byte_arrays.contains(&kind) {
            return Ok(None);
        }
        let object = layout.tagging.untag(table);
        let length = tagged_field(memory, layout, object, layout.fields.fixed_array_length)?;
        let Some(length) = layout
            .tagging
            .smi(length)
            .and_then(|length| usize::try_from(length).ok())
            .filter(|&length| length > 0 && length <= MAX_TABLE_BYTES)
        else {
            return Ok(None);
        };
        let mut bytes = vec![0; length];
        memory
            .read(object + layout.fields.fixed_array_data, &mut bytes)
            .map_err(|source| NameError::Read { source })?;
        let Ok(entries) = decode_positions(&bytes, Some(limits.bytecodes), 0) else {
            return Ok(None);
        };
        let within = entries.iter().all(|&(_, position)| {
            position & 1 == 0 && script_offset(position).is_none_or(|at| at <= limits.source)
        });
        Ok(within.then_some(entries))
    }
}

#[derive(Clone, Copy, Debug)]
struct Limits {
    bytecodes: u64,
    source: u64,
}
