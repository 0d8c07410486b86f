//! The functions TurboFan (or Maglev) inlined into the code a frame runs,
//! at the frame's pc, innermost first.
//!
//! Optimized code keeps, for deoptimization, a DeoptimizationData array:
//! its outermost function, the SharedFunctionInfos of the functions
//! inlined into it (the first entries of its literal array) and the
//! InliningPositions (per inlining: where in its caller the call was, and
//! which function). Its source position table maps each pc offset to a
//! source position whose inlining id says which inlining the instruction
//! belongs to (0: none). From the pc's position the chain of inlinings
//! leads out to the outermost function.
//!
//! The release's constants give the slots of DeoptimizationData but not,
//! in every release, where a Code keeps it and its position table (V8 10
//! and 12 to 13 export neither). firn looks at a Code's first tagged
//! fields for an array of one of the fixed array types whose
//! SharedFunctionInfo slot is the frame's own function's: the
//! deoptimization data; the position table is the field after it (as in
//! every release since V8 7), a byte array whose entries must decode in
//! order and within the code. A Code that fails a check gives no inlined
//! functions, counted, never a guess.

use agent_cache::ByteBoundedCache;

use super::{
    Layout, NameError,
    code::{CODE_FIELDS_PROBED, CodeLayout, FoundCode},
    heap::{instance_type, tagged_field},
};
use crate::Memory;

/// Bytes of a position table or inlining positions read at most.
const MAX_TABLE_BYTES: u64 = 1 << 20;
/// Slots of DeoptimizationData looked through for the outermost
/// SharedFunctionInfo where its index is not exported.
const DEOPT_SLOTS_PROBED: u64 = 12;
/// Inlinings followed out from one pc at most.
const MAX_DEPTH: usize = 64;
/// Bytes of decoded tables kept per process.
const TABLE_CACHE_BYTES: usize = 1 << 20;
/// One InliningPosition: its SourcePosition (8 bytes), the inlined
/// function's index (4) and padding.
const INLINING_POSITION_BYTES: usize = 16;

/// Why a frame's inlined functions could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InlineError {
    #[error("no code object holds the pc {pc:#x}")]
    NoCode { pc: u64 },
    #[error("the code's deoptimization data was not found or is not the frame's function's")]
    NoDeoptimizationData,
    #[error("the code's tables do not decode: {what}")]
    BadTable { what: &'static str },
    #[error(transparent)]
    Name(#[from] NameError),
}

impl InlineError {
    /// A short name for the reason, for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoCode { .. } => "no_code",
            Self::NoDeoptimizationData => "deoptimization_data",
            Self::BadTable { .. } => "table",
            Self::Name(NameError::Read { .. }) => "read",
            Self::Name(_) => "stale",
        }
    }
}

/// A Code's tables, decoded: what does not change while the Code lives.
#[derive(Debug, Default)]
struct Tables {
    /// (pc offset, source position), in pc order.
    positions: Vec<(u64, u64)>,
    /// Per inlining: the caller's source position and the inlined
    /// function's index in the literal array.
    inlinings: Vec<(u64, i32)>,
}

impl Tables {
    /// The literal array indexes of the functions inlined at pc offset
    /// `offset`, innermost first, each with the source position it runs,
    /// and the position the outermost function runs (`None` when no
    /// entry covers the offset).
    fn chain(&self, offset: u64) -> Result<Chain, InlineError> {
        // The last entry at or before the offset.
        let at = self
            .positions
            .partition_point(|&(pc_offset, _)| pc_offset <= offset);
        let Some(&(_, mut position)) = at.checked_sub(1).map(|index| &self.positions[index]) else {
            return Ok((Vec::new(), None));
        };
        let mut chain = Vec::new();
        let mut id = inlining_id(position);
        while id != 0 {
            if chain.len() >= MAX_DEPTH {
                return Err(InlineError::BadTable {
                    what: "inlining too deep",
                });
            }
            let &(caller, function) =
                self.inlinings
                    .get(usize::from(id) - 1)
                    .ok_or(InlineError::BadTable {
                        what: "inlining id",
                    })?;
            chain.push((function, position));
            position = caller;
            let next = inlining_id(position);
            // Callers were inlined before their callees.
            if next >= id {
                return Err(InlineError::BadTable {
                    what: "inlining ids out of order",
                });
            }
            id = next;
        }
        Ok((chain, Some(position)))
    }

    fn weight(&self) -> usize {
        std::mem::size_of::<Self>() + self.positions.len() * 16 + self.inlinings.len() * 16
    }
}

/// What an optimized frame runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OptimizedRun {
    /// The functions inlined at its pc (SharedFunctionInfos, tagged),
    /// innermost first, each with the source position it runs.
    pub inlined: Vec<(u64, u64)>,
    /// The source position the frame's own function runs.
    pub position: Option<u64>,
}

/// Inlined functions' literal indexes with their source positions,
/// innermost first, and the outermost function's position.
type Chain = (Vec<(i32, u64)>, Option<u64>);

/// Offsets in Code found in the process's own objects.
#[derive(Clone, Copy, Debug, Default)]
struct Learned {
    deoptimization_data: Option<u64>,
    /// DeoptimizationData's slot of the outermost SharedFunctionInfo.
    shared: Option<u64>,
}

pub(crate) struct Inliner {
    layout: CodeLayout,
    learned: Learned,
    /// By Code and its two tables (a table that moved is read again).
    tables: ByteBoundedCache<(u64, u64, u64), std::sync::Arc<Tables>>,
}

impl Inliner {
    pub fn new(layout: CodeLayout) -> Self {
        Self {
            layout,
            learned: Learned::default(),
            tables: ByteBoundedCache::new(TABLE_CACHE_BYTES),
        }
    }

    /// What an optimized frame runs at `offset` (the pc's offset in
    /// `found`'s instructions), in code of the function whose
    /// SharedFunctionInfo is `shared`.
    pub fn run(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        found: &FoundCode,
        shared: u64,
        offset: u64,
    ) -> Result<OptimizedRun, InlineError> {
        let code = layout.tagging.untag(found.code);
        let deopt_field = self.deoptimization_field(memory, layout, code, shared)?;
        let data = layout
            .tagging
            .untag(tagged_field(memory, layout, code, deopt_field)?);
        let slot = |index: u64| {
            layout.fields.fixed_array_data + index * u64::from(layout.tagging.tagged_size)
        };
        let indexes = self.layout.deopt;
        let count = tagged_field(memory, layout, data, slot(indexes.inlined_count))?;
        let count = layout
            .tagging
            .smi(count)
            .and_then(|count| usize::try_from(count).ok())
            .ok_or(InlineError::BadTable {
                what: "inlined function count",
            })?;
        let positions_field = self
            .layout
            .source_positions
            .unwrap_or(deopt_field + u64::from(layout.tagging.tagged_size));
        let positions = tagged_field(memory, layout, code, positions_field)?;
        let shared_index = indexes
            .shared
            .or(self.learned.shared)
            .ok_or(InlineError::NoDeoptimizationData)?;
        let inlining_positions = indexes.inlining_positions.unwrap_or(shared_index + 1);
        let inlinings = tagged_field(memory, layout, data, slot(inlining_positions))?;
        let key = (found.code, positions, inlinings);
        let tables = match self.tables.get(&key) {
            Some(tables) => tables.clone(),
            None => {
                let tables = std::sync::Arc::new(self.read_tables(
                    memory,
                    layout,
                    positions,
                    (count > 0).then_some(inlinings),
                    found.size,
                )?);
                self.tables.insert(key, tables.clone(), tables.weight());
                tables
            }
        };
        let (chain, position) = tables.chain(offset)?;
        let mut inlined = Vec::with_capacity(chain.len());
        if !chain.is_empty() {
            let literals = tagged_field(memory, layout, data, slot(indexes.literal_array))?;
            if !layout.tagging.is_heap_object(literals) {
                return Err(InlineError::BadTable {
                    what: "literal array",
                });
            }
            let literal_count = array_length(memory, layout, literals)?;
            for (function, position) in chain {
                let function = usize::try_from(function)
                    .ok()
                    .filter(|&function| function < count && function < literal_count)
                    .ok_or(InlineError::BadTable {
                        what: "inlined function index",
                    })?;
                let sfi = tagged_field(
                    memory,
                    layout,
                    layout.tagging.untag(literals),
                    slot(function as u64),
                )?;
                let kind = instance_type(memory, layout, sfi)?;
                if kind != layout.types.shared_function_info {
                    return Err(NameError::WrongType {
                        object: sfi,
                        expected: "SharedFunctionInfo",
                        found: kind,
                    }
                    .into());
                }
                inlined.push((sfi, position));
            }
        }
        Ok(OptimizedRun { inlined, position })
    }

    /// The Code's field holding its deoptimization data, checked to be
    /// the frame's function's (`shared`).
    fn deoptimization_field(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        code: u64,
        shared: u64,
    ) -> Result<u64, InlineError> {
        let slot = u64::from(layout.tagging.tagged_size);
        let candidates: Vec<u64> = match self
            .layout
            .deoptimization_data
            .or(self.learned.deoptimization_data)
        {
            Some(field) => vec![field],
            None => (1..=CODE_FIELDS_PROBED).map(|index| index * slot).collect(),
        };
        for field in candidates {
            let data = tagged_field(memory, layout, code, field)?;
            if layout.tagging.is_heap_object(data)
                && self
                    .layout
                    .is_fixed_array(instance_type(memory, layout, data)?)
                && self.holds_shared(memory, layout, data, shared)?
            {
                if self.layout.deoptimization_data.is_none() {
                    self.learned.deoptimization_data = Some(field);
                }
                return Ok(field);
            }
        }
        Err(InlineError::NoDeoptimizationData)
    }

    /// Whether deoptimization data `data` is of the function whose
    /// SharedFunctionInfo is `shared`; where the slot is not exported, the
    /// first that holds it is learned.
    fn holds_shared(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        data: u64,
        shared: u64,
    ) -> Result<bool, NameError> {
        let indexes = self.layout.deopt;
        let length = array_length(memory, layout, data)? as u64;
        let slots: Vec<u64> = match indexes.shared.or(self.learned.shared) {
            Some(index) => vec![index],
            None => (0..length.min(DEOPT_SLOTS_PROBED)).collect(),
        };
        for index in slots {
            let positions = indexes.inlining_positions.unwrap_or(index + 1);
            if length <= positions.max(indexes.literal_array) {
                continue;
            }
            let slot =
                layout.fields.fixed_array_data + index * u64::from(layout.tagging.tagged_size);
            let mut found = tagged_field(memory, layout, layout.tagging.untag(data), slot)?;
            if let Some((wrapper_type, field)) = indexes.shared_wrapper {
                if !layout.tagging.is_heap_object(found)
                    || instance_type(memory, layout, found)? != wrapper_type
                {
                    continue;
                }
                found = tagged_field(memory, layout, layout.tagging.untag(found), field)?;
            }
            if found == shared {
                if indexes.shared.is_none() {
                    self.learned.shared = Some(index);
                }
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn read_tables(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        positions: u64,
        inlinings: Option<u64>,
        size: Option<u64>,
    ) -> Result<Tables, InlineError> {
        let positions = self.byte_array(memory, layout, positions, "source position table")?;
        let inlinings = match inlinings {
            Some(inlinings) => self.byte_array(memory, layout, inlinings, "inlining positions")?,
            None => Vec::new(),
        };
        if inlinings.len() % INLINING_POSITION_BYTES != 0 {
            return Err(InlineError::BadTable {
                what: "inlining positions' length",
            });
        }
        let inlinings: Vec<(u64, i32)> = inlinings
            .chunks_exact(INLINING_POSITION_BYTES)
            .map(|entry| {
                (
                    u64::from_le_bytes(entry[..8].try_into().expect("8 bytes")),
                    i32::from_le_bytes(entry[8..12].try_into().expect("4 bytes")),
                )
            })
            .collect();
        let positions = decode_positions(&positions, size, inlinings.len())?;
        Ok(Tables {
            positions,
            inlinings,
        })
    }

    fn byte_array(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        array: u64,
        what: &'static str,
    ) -> Result<Vec<u8>, InlineError> {
        if !layout.tagging.is_heap_object(array)
            || !self
                .layout
                .is_byte_array(instance_type(memory, layout, array)?)
        {
            return Err(InlineError::BadTable { what });
        }
        let length = array_length(memory, layout, array)? as u64;
        if length > MAX_TABLE_BYTES {
            return Err(InlineError::BadTable { what });
        }
        let mut bytes = vec![0; length as usize];
        memory
            .read(
                layout.tagging.untag(array) + layout.fields.fixed_array_data,
                &mut bytes,
            )
            .map_err(|source| NameError::Read { source })?;
        Ok(bytes)
    }
}

/// A fixed or byte array's length (a Smi after the map).
fn array_length(memory: &mut dyn Memory, layout: &Layout, array: u64) -> Result<usize, NameError> {
    let length = tagged_field(
        memory,
        layout,
        layout.tagging.untag(array),
        layout.fields.fixed_array_length,
    )?;
    layout
        .tagging
        .smi(length)
        .and_then(|length| usize::try_from(length).ok())
        .ok_or(NameError::NotHeapObject { value: length })
}

/// A SourcePosition's inlining id: bits 31 to 46, 0 for none (V8 stores
/// the id plus one).
pub(crate) fn inlining_id(position: u64) -> u16 {
    (position >> 31) as u16
}

/// A SourcePosition's script offset (bits 1 to 30, stored plus one), or
/// `None` for an external position or none.
pub(crate) fn script_offset(position: u64) -> Option<u64> {
    if position & 1 == 1 {
        return None;
    }
    ((position >> 1) & ((1 << 30) - 1)).checked_sub(1)
}

/// A source position table: pairs of zigzag VLQ deltas, the pc offset's
/// (negative for an expression, not a statement) and the position's,
/// from pc offset -1 and position 0 (an entry left at -1 is skipped).
/// Checked: pc offsets in order and within the code (`size`, where
/// known), inlining ids among the `inlinings`.
pub(crate) fn decode_positions(
    bytes: &[u8],
    size: Option<u64>,
    inlinings: usize,
) -> Result<Vec<(u64, u64)>, InlineError> {
    let bad = |what| InlineError::BadTable { what };
    let mut at = 0;
    let mut pc: i64 = -1;
    let mut position: i64 = 0;
    let mut entries = Vec::new();
    while at < bytes.len() {
        let delta = vlq(bytes, &mut at).ok_or(bad("position table entry"))?;
        pc += if delta >= 0 { delta } else { -(delta + 1) };
        position = position.wrapping_add(vlq(bytes, &mut at).ok_or(bad("position table entry"))?);
        // Bytecode tables may start with the function entry's position
        // (V8's `kFunctionEntryBytecodeOffset`, -1), no bytecode's.
        if pc == -1 {
            continue;
        }
        let (Ok(pc_offset), Ok(value)) = (u64::try_from(pc), u64::try_from(position)) else {
            return Err(bad("position table values"));
        };
        if size.is_some_and(|size| pc_offset > size)
            || usize::from(inlining_id(value)) > inlinings
            || (value >> 47) != 0
        {
            return Err(bad("position table values"));
        }
        entries.push((pc_offset, value));
    }
    Ok(entries)
}

/// One zigzag-encoded VLQ (V8's `VLQDecode`).
fn vlq(bytes: &[u8], at: &mut usize) -> Option<i64> {
    let mut value: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = *bytes.get(*at)?;
        *at += 1;
        if shift >= 64 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            break;
        }
    }
    Some(((value >> 1) as i64) ^ -((value & 1) as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(value: i64, out: &mut Vec<u8>) {
        let mut bits = ((value << 1) ^ (value >> 63)) as u64;
        loop {
            let byte = (bits & 0x7f) as u8;
            bits >>= 7;
            if bits == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }

    fn position(offset: u64, inlining: u16) -> u64 {
        ((offset + 1) << 1) | (u64::from(inlining) << 31)
    }

    fn table(entries: &[(i64, u64)]) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut pc, mut previous) = (-1, 0i64);
        for &(offset, value) in entries {
            // Statements are written with a negative pc delta.
            let delta = offset - pc;
            encode(if offset % 2 == 0 { delta } else { -delta - 1 }, &mut out);
            encode(value as i64 - previous, &mut out);
            pc = offset;
            previous = value as i64;
        }
        out
    }

    #[test]
    fn a_position_table_decodes_with_its_inlining_ids() {
        let entries = [
            (0, position(67, 0)),
            (39, position(102, 0)),
            (159, position(30, 1)),
            (183, position(35, 2)),
            (258, position(121, 0)),
        ];
        let decoded = decode_positions(&table(&entries), Some(504), 2).expect("decodes");
        let expected: Vec<(u64, u64)> = entries.iter().map(|&(pc, v)| (pc as u64, v)).collect();
        assert_eq!(decoded, expected);
        assert_eq!(inlining_id(decoded[2].1), 1);
        assert_eq!(script_offset(decoded[2].1), Some(30));
        assert_eq!(inlining_id(decoded[4].1), 0);
        assert_eq!(script_offset(decoded[4].1), Some(121));
    }

    #[test]
    fn a_table_past_its_code_or_its_inlinings_is_refused() {
        let entries = [(0, position(1, 0)), (600, position(2, 0))];
        assert!(decode_positions(&table(&entries), Some(504), 0).is_err());
        assert!(decode_positions(&table(&entries), None, 0).is_ok());
        let entries = [(0, position(1, 3))];
        assert!(decode_positions(&table(&entries), None, 2).is_err());
        // Cut in the middle of a number.
        assert!(decode_positions(&[0x80], None, 0).is_err());
    }
}
