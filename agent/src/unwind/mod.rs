//! The unwinder stage: turns a sample's user side into frames. `dwarf`
//! unwinds the copied stack frame by frame with the CFI of every object on
//! it; where it stops short of the outermost frame, the rest is taken from
//! the kernel's frame-pointer walk if the two meet. How much stack there is
//! to unwind depends on the process (`mode` decides):
//!
//! - Frame pointers: a small copy of the top of the stack. Its CFI unwind
//!   recovers what the kernel's walk lacks near the leaf (a function
//!   without a frame of its own hides its caller from the walk) and meets
//!   the walk below. If it cannot meet the walk, the walk is kept with its
//!   leaf repaired. Callers without frame pointers seen on the way mark
//!   the process for DWARF.
//! - DWARF: the whole copy (16 KiB by default).

mod cfi;
mod dwarf;
mod mode;
mod survey;

#[cfg(test)]
mod fixture_tests;

use std::{num::NonZeroUsize, sync::Arc};

use agent_common::MAX_STACK_DEPTH;
use lru::LruCache;
use tracing::debug;

pub use cfi::{Cfa, CfiContext, CfiError, CfiSource, Rule, UnwindRow};
pub use dwarf::{Code, CodeLookup, Outcome, StackCopy, Stop, unwind};
pub use mode::{CopyMapError, CopySizeMap, ProcessUnwinding, UnwindPolicy, is_system_library};
pub use survey::{FrameSurvey, ObjectFrames, is_go, survey};

use crate::{
    process::{ContentKey, ObjectData, ObjectFile, ProcessImage, ProcessTable},
    sampler::{Comm, RawSample},
    stats::Stats,
};
use agent_cache::ByteBoundedCache;

/// Memory for rows looked up recently, by object and address: stacks
/// repeat the same return addresses, so most lookups never reach the CFI.
const ROW_CACHE_BYTES: usize = 4 << 20;

/// What one cached row costs: its key and value, the LRU's two links and
/// hash slot (a key pointer and a node pointer, at most half the buckets
/// used), and the allocator's header and rounding of the node.
const ROW_ENTRY_BYTES: usize = std::mem::size_of::<(ContentKey, u64)>()
    + std::mem::size_of::<Option<UnwindRow>>()
    + 2 * std::mem::size_of::<usize>()
    + 2 * 2 * std::mem::size_of::<usize>()
    + 16;

/// Objects whose frame-pointer verdict is remembered.
const VERDICT_CACHE_ENTRIES: usize = 4_096;

/// Most user frames of one stack: what the kernel's walk may hold, plus the
/// leaf's caller.
pub const MAX_USER_FRAMES: usize = MAX_STACK_DEPTH + 1;

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
        Cfa::Signal | Cfa::Unsupported => return None,
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

/// Joins a DWARF unwind that stopped short to the kernel's frame-pointer
/// walk: where the walk holds the last address the unwind reached, the
/// walk's frames beyond it continue the stack. True if frames were added.
pub fn stitch(frames: &mut Vec<u64>, walk: &[u64]) -> bool {
    if frames.len() >= MAX_USER_FRAMES {
        return false;
    }
    let Some(&last) = frames.last() else {
        return false;
    };
    // The interrupted instruction only matches the walk's first entry; a
    // return address never does.
    let from = usize::from(frames.len() > 1);
    let Some(position) = walk.iter().skip(from).position(|&a| a == last) else {
        return false;
    };
    let rest = &walk[from + position + 1..];
    let room = MAX_USER_FRAMES.saturating_sub(frames.len());
    frames.extend(rest.iter().take(room));
    !rest.is_empty() && room > 0
}

/// CFI sources by object (bounded in bytes) and a bounded row cache.
struct CfiCache {
    sources: ByteBoundedCache<ContentKey, Arc<CfiSource<ObjectData>>>,
    rows: LruCache<(ContentKey, u64), Option<UnwindRow>>,
    context: Box<CfiContext>,
    stats: Arc<Stats>,
}

impl CfiCache {
    /// The unwind rules at `vaddr` of `object`.
    fn row(&mut self, object: &ObjectFile, vaddr: u64) -> Option<UnwindRow> {
        let key = object.content_key();
        if let Some(row) = self.rows.get(&(key.clone(), vaddr)) {
            Stats::inc(&self.stats.unwind_cache_hits);
            return *row;
        }
        Stats::inc(&self.stats.unwind_cache_misses);
        let row = self
            .source(object, &key)
            .and_then(|source| source.row(vaddr, &mut self.context));
        // `push` hands back the least recently used row it let go.
        if self.rows.push((key, vaddr), row).is_some() {
            Stats::inc(&self.stats.unwind_cache_evictions);
        }
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

/// The code of one process, as the DWARF unwinder asks about it.
struct ProcessCode<'a> {
    image: Arc<ProcessImage>,
    processes: &'a mut ProcessTable,
    cfi: &'a mut CfiCache,
    comm: Comm,
    refreshed: bool,
}

impl ProcessCode<'_> {
    fn mapping_index(&mut self, address: u64) -> Option<usize> {
        if let Some(index) = self.image.mapping_index(address) {
            return Some(index);
        }
        // The maps may predate a library being mapped (read right after
        // exec, or before a dlopen): re-read them, once per unwind and at
        // most once a second per process.
        if self.refreshed {
            return None;
        }
        self.refreshed = true;
        self.image =
            self.processes
                .image_covering(self.image.tgid, &self.comm.to_string(), address);
        self.image.mapping_index(address)
    }
}

impl CodeLookup for ProcessCode<'_> {
    fn code(&mut self, address: u64) -> Code {
        let Some(index) = self.mapping_index(address) else {
            return Code::Unmapped;
        };
        let Some(object) = self.processes.object(&self.image, index) else {
            return Code::NoCfi;
        };
        let mapping = &self.image.mappings[index];
        let Some(vaddr) = mapping.object_vaddr(address) else {
            return Code::NoCfi;
        };
        match self.cfi.row(&object, vaddr) {
            Some(row) => Code::Row {
                row,
                system: is_system_library(&mapping.spec.path),
            },
            None => Code::NoCfi,
        }
    }
}

/// A sample's user frames, innermost first: the interrupted instruction,
/// then return addresses.
#[derive(Clone, Debug)]
pub struct Unwound {
    pub frames: Vec<u64>,
    /// The image the frames belong to: the one given, or a fresh read of
    /// the process's maps if the stack ran into code outside it.
    pub image: Arc<ProcessImage>,
    /// Unwound with frame pointers, yet the stack held callers without
    /// them: the process needs DWARF.
    pub needs_dwarf: bool,
}

/// Unwinds samples; owns the CFI caches.
pub struct Unwinder {
    cfi: CfiCache,
    verdicts: LruCache<ContentKey, ObjectFrames>,
    stats: Arc<Stats>,
}

impl Unwinder {
    pub fn new(max_bytes: usize, stats: Arc<Stats>) -> Self {
        let entries = |n| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN);
        Self {
            cfi: CfiCache {
                sources: ByteBoundedCache::new(max_bytes),
                rows: LruCache::new(entries(ROW_CACHE_BYTES / ROW_ENTRY_BYTES)),
                context: Box::new(CfiContext::new()),
                stats: stats.clone(),
            },
            verdicts: LruCache::new(entries(VERDICT_CACHE_ENTRIES)),
            stats,
        }
    }

    /// Once an interval: the object pages unwinding touched (CFI sections,
    /// an index built over `.eh_frame`) are dropped from RSS, as the
    /// symbolizer does after each profile; the rows that matter are cached.
    pub fn release_pages(&self) {
        for source in self.cfi.sources.values() {
            source.release_pages();
        }
    }

    /// Unwinds the user side of `sample`.
    pub fn user_frames(
        &mut self,
        sample: &RawSample,
        image: Arc<ProcessImage>,
        processes: &mut ProcessTable,
        unwinding: ProcessUnwinding,
    ) -> Unwound {
        let Some(regs) = sample.user_regs else {
            // Kernel threads have no user side; a user task whose registers
            // could not be read keeps the kernel's walk.
            if unwinding == ProcessUnwinding::Dwarf && !sample.user_stack.is_empty() {
                Stats::inc(&self.stats.unwind_without_registers);
            }
            return Unwound {
                frames: sample.user_stack.clone(),
                image,
                needs_dwarf: false,
            };
        };
        let mut frames = Vec::with_capacity(32);
        let mut code = ProcessCode {
            image,
            processes,
            cfi: &mut self.cfi,
            comm: sample.comm,
            refreshed: false,
        };
        let stack = StackCopy {
            sp: regs.sp,
            bytes: &sample.stack_copy,
        };
        let outcome = unwind(regs, stack, &mut code, MAX_USER_FRAMES, &mut frames);
        let image = code.image;
        let stitched = outcome.stop != Stop::Complete && stitch(&mut frames, &sample.user_stack);
        if unwinding == ProcessUnwinding::Dwarf {
            self.count_dwarf(&outcome, stitched);
            return Unwound {
                frames,
                image,
                needs_dwarf: false,
            };
        }
        let needs_dwarf = outcome.frameless_callers > 0;
        if outcome.stop == Stop::Complete || stitched {
            if frames.get(..2) != sample.user_stack.get(..2) {
                Stats::inc(&self.stats.leaf_frames_repaired);
            }
        } else {
            // The unwind and the walk do not meet: the walk, leaf repaired.
            frames.clear();
            frames.extend_from_slice(&sample.user_stack);
            self.repair_walk(&mut frames, sample, &image, processes);
        }
        Unwound {
            frames,
            image,
            needs_dwarf,
        }
    }

    fn count_dwarf(&self, outcome: &Outcome, stitched: bool) {
        let stats = &self.stats;
        Stats::inc(&stats.unwind_dwarf_stacks);
        Stats::add(&stats.unwind_rbp_frames, u64::from(outcome.rbp_frames));
        Stats::add(
            &stats.unwind_signal_frames,
            u64::from(outcome.signal_frames),
        );
        let counter = match outcome.stop {
            Stop::Complete => &stats.unwind_dwarf_complete,
            Stop::Truncated => &stats.unwind_truncated,
            Stop::NoCfi => &stats.unwind_failed_no_cfi,
            Stop::Unmapped => &stats.unwind_failed_unmapped,
            Stop::UnsupportedRule => &stats.unwind_failed_unsupported_rule,
            Stop::NotProgressing => &stats.unwind_failed_not_progressing,
            Stop::TooDeep => &stats.unwind_failed_too_deep,
        };
        Stats::inc(counter);
        if stitched {
            Stats::inc(&stats.unwind_stitched);
        }
    }

    /// The kernel's frame-pointer walk with the leaf's caller recovered.
    fn repair_walk(
        &mut self,
        frames: &mut Vec<u64>,
        sample: &RawSample,
        image: &ProcessImage,
        processes: &mut ProcessTable,
    ) {
        let Some(regs) = sample.user_regs else {
            return;
        };
        if frames.is_empty() || sample.stack_copy.is_empty() {
            return;
        }
        let outcome =
            self.leaf_row(regs.ip, image, processes)
                .map_or(LeafRepair::Unavailable, |row| {
                    repair_leaf(
                        frames,
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
        self.cfi.row(object, vaddr)
    }

    /// Whether `object`'s code keeps frame pointers; looked at once per
    /// object, with bounded work (`survey`).
    pub fn object_frames(&mut self, object: &ObjectFile) -> ObjectFrames {
        let key = object.content_key();
        if let Some(&verdict) = self.verdicts.get(&key) {
            return verdict;
        }
        // Go first: its CFI need not be read (or decompressed) to judge.
        let go = object.data().is_ok_and(|data| is_go(&data));
        let verdict = if go {
            ObjectFrames::FramePointers
        } else {
            match self.cfi.source(object, &key) {
                Some(source) => survey::survey(&source, &mut self.cfi.context).verdict(),
                None => ObjectFrames::Unknown,
            }
        };
        debug!(path = object.path, ?verdict, "frame pointers");
        self.verdicts.put(key, verdict);
        verdict
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

    /// Garbage registers and stacks of a live process: every DWARF unwind
    /// is counted under exactly one reason, none panics.
    #[test]
    fn corrupt_samples_are_counted_under_one_reason() {
        use agent_common::UserRegs;

        use crate::{config::Limits, process::ProcessTable};

        let stats = Arc::new(Stats::default());
        let mut processes =
            ProcessTable::new("/proc".into(), &Limits::default(), &[], stats.clone());
        let mut unwinder = Unwinder::new(1 << 20, stats.clone());
        let pid = std::process::id();
        let image = processes.image(pid, "test");
        let code = corrupt_samples_are_counted_under_one_reason as *const () as usize as u64;
        let mut samples = 0;
        for (index, ip) in [0, 1, code, code + 3, u64::MAX].into_iter().enumerate() {
            for seed in 0..20u64 {
                let words: Vec<u64> = (0..64)
                    .map(|i| match (i + seed + index as u64) % 4 {
                        0 => code + i,
                        1 => 0x7ffd_0000 + i * 8,
                        2 => 0,
                        _ => i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    })
                    .collect();
                let sample = RawSample {
                    tgid: pid,
                    tid: pid,
                    user_stack: vec![ip, code],
                    user_regs: Some(UserRegs {
                        ip,
                        sp: 0x7ffd_0000,
                        bp: 0x7ffd_0000 + seed * 8,
                    }),
                    stack_copy: stack(&words),
                    ..RawSample::default()
                };
                let unwound = unwinder.user_frames(
                    &sample,
                    image.clone(),
                    &mut processes,
                    ProcessUnwinding::Dwarf,
                );
                assert!(!unwound.frames.is_empty() && unwound.frames.len() <= MAX_USER_FRAMES);
                samples += 1;
            }
        }
        let s = stats.snapshot();
        assert_eq!(s.unwind_dwarf_stacks, samples);
        let reasons = s.unwind_dwarf_complete
            + s.unwind_truncated
            + s.unwind_failed_no_cfi
            + s.unwind_failed_unmapped
            + s.unwind_failed_unsupported_rule
            + s.unwind_failed_not_progressing
            + s.unwind_failed_too_deep;
        assert_eq!(reasons, samples, "{s:?}");
        assert!(s.unwind_failed_unmapped > 0, "{s:?}");
    }
}
