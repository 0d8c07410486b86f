//! The unwinder stage: turns a sample's user side into frames. The kernel's
//! frame-pointer walk is taken as is, except for the leaf: a function without
//! a frame of its own (most leaves, and any function caught in its prologue
//! or epilogue) hides its caller from that walk. The leaf's CFI and the copy
//! of the top of the stack recover it.

mod cfi;

use std::{num::NonZeroUsize, sync::Arc};

use lru::LruCache;
use tracing::debug;

pub use cfi::{Cfa, CfiContext, CfiError, CfiSource, Rule, UnwindRow};

use crate::{
    cache::ByteBoundedCache,
    process::{ContentKey, ObjectData, ObjectFile, ProcessImage, ProcessTable},
    sampler::RawSample,
    stats::Stats,
};

/// Rows looked up recently, by object and address: stacks repeat the same
/// return addresses, so most lookups never reach the CFI.
const ROW_CACHE_ENTRIES: usize = 65_536;

/// What leaf repair did to one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafRepair {
    /// The walk already held the leaf's caller.
    NotNeeded,
    /// The caller was missing and was inserted.
    Repaired,
    /// Could not tell: no registers, no CFI, or the slot lay beyond the copy.
    Unavailable,
}

/// Reads a little-endian u64 at `address` from a copy of the stack that
/// starts at `sp`.
pub fn read_stack_u64(stack: &[u8], sp: u64, address: u64) -> Option<u64> {
    let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
    let bytes = stack.get(offset..offset.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// The return address of the frame executing at `row`, if the stack copy
/// holds it.
pub fn return_address(row: &UnwindRow, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> Option<u64> {
    let cfa = match row.cfa {
        Cfa::RspOffset(offset) => sp.checked_add_signed(i64::from(offset))?,
        Cfa::RbpOffset(offset) => bp.checked_add_signed(i64::from(offset))?,
        Cfa::Plt { threshold } => {
            let extra = if ip & 15 >= u64::from(threshold) {
                8
            } else {
                0
            };
            sp.checked_add(8 + extra)?
        }
        Cfa::Unsupported => return None,
    };
    match row.ra {
        Rule::CfaOffset(offset) => {
            read_stack_u64(stack, sp, cfa.checked_add_signed(i64::from(offset))?)
        }
        Rule::Same | Rule::Undefined | Rule::Unsupported => None,
    }
}

/// Inserts the leaf's caller into a frame-pointer walk when the walk lacks
/// it. `frames[0]` must be the interrupted instruction.
pub fn repair_leaf(
    frames: &mut Vec<u64>,
    row: &UnwindRow,
    regs: (u64, u64, u64),
    stack: &[u8],
) -> LeafRepair {
    let (ip, sp, bp) = regs;
    if frames.first() != Some(&ip) {
        return LeafRepair::Unavailable;
    }
    let Some(caller) = return_address(row, ip, sp, bp, stack) else {
        return LeafRepair::Unavailable;
    };
    if caller == 0 || frames.get(1) == Some(&caller) {
        return LeafRepair::NotNeeded;
    }
    frames.insert(1, caller);
    frames.truncate(agent_common::MAX_STACK_DEPTH + 1);
    LeafRepair::Repaired
}

/// CFI sources by object (bounded in bytes) and a bounded row cache.
pub struct Unwinder {
    sources: ByteBoundedCache<ContentKey, Arc<CfiSource<ObjectData>>>,
    rows: LruCache<(ContentKey, u64), Option<UnwindRow>>,
    context: Box<CfiContext>,
    stats: Arc<Stats>,
}

impl Unwinder {
    pub fn new(max_bytes: usize, stats: Arc<Stats>) -> Self {
        Self {
            sources: ByteBoundedCache::new(max_bytes),
            rows: LruCache::new(NonZeroUsize::new(ROW_CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN)),
            context: Box::new(CfiContext::new()),
            stats,
        }
    }

    /// The sample's user frames, innermost first, with the leaf repaired.
    pub fn user_frames(
        &mut self,
        sample: &RawSample,
        image: &ProcessImage,
        processes: &mut ProcessTable,
    ) -> Vec<u64> {
        let mut frames = sample.user_stack.clone();
        let Some(regs) = sample.user_regs else {
            return frames;
        };
        if frames.is_empty() || sample.stack_copy.is_empty() {
            return frames;
        }
        let outcome =
            self.leaf_row(regs.ip, image, processes)
                .map_or(LeafRepair::Unavailable, |row| {
                    repair_leaf(
                        &mut frames,
                        &row,
                        (regs.ip, regs.sp, regs.bp),
                        &sample.stack_copy,
                    )
                });
        match outcome {
            LeafRepair::Repaired => Stats::inc(&self.stats.leaf_frames_repaired),
            LeafRepair::Unavailable => Stats::inc(&self.stats.leaf_repair_failures),
            LeafRepair::NotNeeded => {}
        }
        frames
    }

    fn leaf_row(
        &mut self,
        ip: u64,
        image: &ProcessImage,
        processes: &mut ProcessTable,
    ) -> Option<UnwindRow> {
        let index = image.mapping_index(ip)?;
        let object = processes.object(image, index)?;
        let vaddr = image.mappings[index].object_vaddr(ip)?;
        self.row(&object, vaddr)
    }

    /// The unwind rules at `vaddr` of `object`.
    pub fn row(&mut self, object: &ObjectFile, vaddr: u64) -> Option<UnwindRow> {
        let key = object.content_key();
        if let Some(row) = self.rows.get(&(key.clone(), vaddr)) {
            Stats::inc(&self.stats.unwind_cache_hits);
            return *row;
        }
        Stats::inc(&self.stats.unwind_cache_misses);
        let row = self
            .source(object, &key)
            .and_then(|source| source.row(vaddr, &mut self.context));
        self.rows.put((key, vaddr), row);
        row
    }

    fn source(
        &mut self,
        object: &ObjectFile,
        key: &ContentKey,
    ) -> Option<Arc<CfiSource<ObjectData>>> {
        if let Some(source) = self.sources.get(key) {
            return Some(source.clone());
        }
        let data = match object.data() {
            Ok(data) => data,
            Err(error) => {
                debug!(path = object.path, %error, "could not read object");
                return None;
            }
        };
        let source = match CfiSource::new(data) {
            Ok(source) => Arc::new(source),
            Err(error) => {
                debug!(path = object.path, %error, "no usable CFI");
                return None;
            }
        };
        let evicted = self
            .sources
            .insert(key.clone(), source.clone(), source.heap_bytes() + 512);
        Stats::add(&self.stats.unwind_cache_evictions, evicted as u64);
        Some(source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEAF: UnwindRow = UnwindRow {
        cfa: Cfa::RspOffset(8),
        ra: Rule::CfaOffset(-8),
        rbp: Rule::Same,
    };

    fn stack(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn frameless_leaf_gets_its_caller_back() {
        // The FP walk went ip -> caller's caller, skipping level_three.
        let mut frames = vec![0x1010, 0x2222, 0x3333];
        let copy = stack(&[0x1111, 0xdead]);
        let outcome = repair_leaf(&mut frames, &LEAF, (0x1010, 0x7000, 0x7100), &copy);
        assert_eq!(outcome, LeafRepair::Repaired);
        assert_eq!(frames, vec![0x1010, 0x1111, 0x2222, 0x3333]);
    }

    #[test]
    fn framed_leaf_is_left_alone() {
        let framed = UnwindRow {
            cfa: Cfa::RbpOffset(16),
            ..LEAF
        };
        let mut frames = vec![0x1010, 0x1111, 0x2222];
        // rbp = sp + 8: [rbp] saved rbp, [rbp + 8] return address.
        let copy = stack(&[0, 0xbeef, 0x1111]);
        let outcome = repair_leaf(&mut frames, &framed, (0x1010, 0x7000, 0x7008), &copy);
        assert_eq!(outcome, LeafRepair::NotNeeded);
        assert_eq!(frames, vec![0x1010, 0x1111, 0x2222]);
    }

    #[test]
    fn slot_beyond_the_copy_is_unavailable() {
        let deep = UnwindRow {
            cfa: Cfa::RspOffset(4096),
            ..LEAF
        };
        let mut frames = vec![0x1010, 0x2222];
        let outcome = repair_leaf(&mut frames, &deep, (0x1010, 0x7000, 0), &stack(&[1, 2]));
        assert_eq!(outcome, LeafRepair::Unavailable);
        assert_eq!(frames, vec![0x1010, 0x2222]);
    }

    #[test]
    fn plt_cfa_depends_on_the_instruction_offset() {
        let plt = UnwindRow {
            cfa: Cfa::Plt { threshold: 11 },
            ..LEAF
        };
        let copy = stack(&[0xaaaa, 0xbbbb]);
        // rip & 15 < 11: CFA = rsp + 8, return address at rsp.
        assert_eq!(return_address(&plt, 0x1004, 0x7000, 0, &copy), Some(0xaaaa));
        // rip & 15 >= 11: one more word was pushed.
        assert_eq!(return_address(&plt, 0x100b, 0x7000, 0, &copy), Some(0xbbbb));
    }

    #[test]
    fn stack_reads_are_bounds_checked() {
        let copy = stack(&[7, 8]);
        assert_eq!(read_stack_u64(&copy, 0x100, 0x108), Some(8));
        assert_eq!(read_stack_u64(&copy, 0x100, 0x10c), None);
        assert_eq!(read_stack_u64(&copy, 0x100, 0x80), None);
        assert_eq!(read_stack_u64(&copy, 0x100, u64::MAX), None);
    }
}
