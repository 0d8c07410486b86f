//! The unwinding stage: a sample's user side turned into frames by
//! `agent_unwind` over the process image's objects, with what it saw
//! counted in `Stats`. How much stack a process gets copied, and so how it
//! is unwound, is `mode`'s decision. An address outside the image is
//! reported, not looked up again here: the pipeline re-reads the maps and
//! unwinds again (`Pipeline::unwind`).

mod learned;
mod mode;
mod threads;
mod walk;

use std::sync::Arc;

use agent_elf::Bytes;
use agent_unwind::{
    CacheCounts, ForeignFrame, ForeignStep, LeafRepair, Mapped, ObjectFrames, ObjectLookup, Sample,
    StackCopy, Stop,
};
use tracing::debug;

pub use mode::{
    CopyMapError, CopySizeMap, ExecPresetError, Preset, ProcessUnwinding, ThreadStackError,
    UnwindPolicy, is_system_library,
};

use crate::{
    process::{ContentId, MappingKind, ObjectFile, ProcessImage, ProcessTable},
    runtimes::ForeignUnwind,
    sampler::RawSample,
    stats::Stats,
};

/// The objects of one process image, as the unwinder asks about them,
/// and the runtime that unwinds its JIT code, if any.
struct ImageObjects<'a, 'j> {
    image: &'a ProcessImage,
    processes: &'a mut ProcessTable,
    jit: Option<&'a mut (dyn ForeignUnwind + 'j)>,
}

impl ObjectLookup for ImageObjects<'_, '_> {
    type Key = ContentId;

    fn object(&mut self, address: u64) -> Mapped<ContentId> {
        let Some(index) = self.image.mapping_index(address) else {
            return Mapped::Unmapped;
        };
        let mapping = &self.image.mappings[index];
        // JIT code: the pipeline looks for its perf map once per sample,
        // not here for every frame.
        if mapping.spec.kind == MappingKind::Anonymous {
            return Mapped::NoObject;
        }
        let object = match mapping.object() {
            Some(object) => object.content_id,
            None => match self.processes.object(self.image, index) {
                Some(object) => object.content_id,
                None => return Mapped::NoObject,
            },
        };
        let Some(vaddr) = mapping.object_vaddr(address) else {
            return Mapped::NoObject;
        };
        Mapped::Object {
            key: object,
            vaddr,
            system: mapping.system,
        }
    }

    fn bytes(&mut self, address: u64) -> Option<Bytes> {
        let index = self.image.mapping_index(address)?;
        object_bytes(self.image.mappings[index].object()?)
    }

    fn foreign(&mut self, frame: ForeignFrame, stack: StackCopy<'_>) -> Option<ForeignStep> {
        self.jit.as_mut()?.foreign(frame, stack)
    }
}

fn object_bytes(object: &ObjectFile) -> Option<Bytes> {
    match object.data() {
        Ok(data) => Some(Bytes::new(Arc::new(data))),
        Err(error) => {
            debug!(path = object.path, %error, "could not read object");
            None
        }
    }
}

/// One unwind of a sample's user side over one process image, not yet
/// counted: the pipeline may throw it away and unwind again over fresher
/// maps.
#[derive(Clone, Debug)]
pub enum Attempt {
    /// No user registers: the kernel's walk as it is.
    WithoutRegisters {
        walk: Vec<u64>,
    },
    Unwound(agent_unwind::Unwound),
}

impl Attempt {
    /// The first address the unwind found outside the image's mappings.
    pub fn unmapped(&self) -> Option<u64> {
        match self {
            Self::WithoutRegisters { .. } => None,
            Self::Unwound(unwound) => unwound.outcome.unmapped,
        }
    }
}

/// A sample's user frames, innermost first: the interrupted instruction,
/// then return addresses.
#[derive(Clone, Debug)]
pub struct UserFrames {
    pub frames: Vec<u64>,
    /// Unwound with frame pointers, yet the stack held callers without
    /// them: the process needs DWARF.
    pub needs_dwarf: bool,
    /// What a DWARF unwind learned about the stack copy it needs.
    pub stack_need: Option<StackNeed>,
    /// What a DWARF unwind owed the kernel's walk of the stack.
    pub walk: Option<WalkUse>,
}

/// What a DWARF unwind owed the kernel's frame-pointer walk of the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkUse {
    /// It completed over the copy alone.
    Unneeded,
    /// It stopped short, and the walk continued it.
    Stitched,
    /// It stopped short, and the walk (if taken) did not continue it.
    Short,
}

/// How much of the stack a DWARF unwind needed copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackNeed {
    /// It completed within this many bytes from the sampled rsp.
    Used(u64),
    /// It needed a value beyond the copy.
    MoreThanCopied,
}

/// The unwinder's memory.
#[derive(Clone, Debug)]
pub struct UnwinderConfig {
    /// Bytes of unwind tables kept in memory.
    pub cache_bytes: usize,
}

impl Default for UnwinderConfig {
    fn default() -> Self {
        Self {
            cache_bytes: 32 << 20,
        }
    }
}

/// Unwinds samples over process images and counts what it saw.
pub struct Unwinder {
    unwinder: agent_unwind::Unwinder<ContentId>,
    stats: Arc<Stats>,
    /// The cache counts already added to `stats`.
    published: CacheCounts,
}

impl Unwinder {
    pub fn new(config: &UnwinderConfig, stats: Arc<Stats>) -> Self {
        Self {
            unwinder: agent_unwind::Unwinder::new(config.cache_bytes),
            stats,
            published: CacheCounts::default(),
        }
    }

    /// Once a second: the object pages unwinding touched since the last
    /// call are dropped from RSS, as the symbolizer does after each
    /// profile. Only the objects whose CFI was read since (a row cache
    /// miss) are released: none when every row came from the cache.
    pub fn release_pages(&mut self) {
        self.unwinder.release_pages();
    }

    /// Unwinds the user side of `sample` over `image`, without reading
    /// anything but the objects' bytes, and the JIT code's blobs where a
    /// runtime (`jit`) unwinds them.
    pub fn attempt(
        &mut self,
        sample: &RawSample,
        image: &ProcessImage,
        processes: &mut ProcessTable,
        unwinding: ProcessUnwinding,
        jit: Option<&mut (dyn ForeignUnwind + '_)>,
    ) -> Attempt {
        let Some(regs) = sample.user_regs else {
            return Attempt::WithoutRegisters {
                walk: sample.user_stack.clone(),
            };
        };
        let input = Sample {
            regs,
            stack: sample.stack_copy,
            walk: &sample.user_stack,
        };
        let mut objects = ImageObjects {
            image,
            processes,
            jit,
        };
        let unwound = match unwinding {
            ProcessUnwinding::Dwarf => self.unwinder.dwarf(input, &mut objects),
            ProcessUnwinding::FramePointers => self.unwinder.frame_pointers(input, &mut objects),
        };
        self.publish_cache_counts();
        Attempt::Unwound(unwound)
    }

    /// Counts the attempt the pipeline kept and hands its frames over.
    pub fn finish(&self, attempt: Attempt, unwinding: ProcessUnwinding) -> UserFrames {
        let stats = &self.stats;
        let unwound = match attempt {
            Attempt::WithoutRegisters { walk } => {
                // Kernel threads have no user side; a user task whose
                // registers could not be read keeps the kernel's walk.
                if unwinding == ProcessUnwinding::Dwarf && !walk.is_empty() {
                    Stats::inc(&stats.unwind_without_registers);
                }
                return UserFrames {
                    frames: walk,
                    needs_dwarf: false,
                    stack_need: None,
                    walk: None,
                };
            }
            Attempt::Unwound(unwound) => unwound,
        };
        match unwinding {
            ProcessUnwinding::Dwarf => {
                self.count_dwarf(&unwound);
                let stack_need = match unwound.outcome.stop {
                    Stop::Complete => Some(StackNeed::Used(unwound.outcome.stack_used)),
                    Stop::Truncated => Some(StackNeed::MoreThanCopied),
                    _ => None,
                };
                let walk = match (unwound.outcome.stop, unwound.stitched) {
                    (Stop::Complete, _) => WalkUse::Unneeded,
                    (_, true) => WalkUse::Stitched,
                    (_, false) => WalkUse::Short,
                };
                UserFrames {
                    frames: unwound.frames,
                    needs_dwarf: false,
                    stack_need,
                    walk: Some(walk),
                }
            }
            ProcessUnwinding::FramePointers => {
                match unwound.leaf {
                    Some(LeafRepair::Repaired) => Stats::inc(&stats.leaf_frames_repaired),
                    Some(LeafRepair::Unavailable) => Stats::inc(&stats.leaf_repair_failures),
                    Some(LeafRepair::NotNeeded) | None => {}
                }
                UserFrames {
                    needs_dwarf: unwound.outcome.frameless_callers > 0,
                    frames: unwound.frames,
                    stack_need: None,
                    walk: None,
                }
            }
        }
    }

    fn count_dwarf(&self, unwound: &agent_unwind::Unwound) {
        let stats = &self.stats;
        let outcome = &unwound.outcome;
        Stats::inc(&stats.unwind_dwarf_stacks);
        Stats::add(&stats.unwind_rbp_frames, u64::from(outcome.rbp_frames));
        Stats::add(&stats.unwind_jit_frames, u64::from(outcome.foreign_frames));
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
        if unwound.stitched {
            Stats::inc(&stats.unwind_stitched);
        }
    }

    /// Whether `object`'s code keeps frame pointers; looked at once per
    /// object, with bounded work.
    pub fn object_frames(&mut self, object: &ObjectFile) -> ObjectFrames {
        let verdict = self
            .unwinder
            .object_frames(&object.content_id, || object_bytes(object));
        self.publish_cache_counts();
        verdict
    }

    fn publish_cache_counts(&mut self) {
        let counts = self.unwinder.cache_counts();
        let new = counts.since(self.published);
        let stats = &self.stats;
        Stats::add(&stats.unwind_cache_hits, new.hits);
        Stats::add(&stats.unwind_cache_misses, new.misses);
        Stats::add(&stats.unwind_cache_evictions, new.evictions);
        self.published = counts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Garbage registers and stacks of a live process: every DWARF unwind
    /// is counted under exactly one reason, none panics.
    #[test]
    fn corrupt_samples_are_counted_under_one_reason() {
        use agent_common::UserRegs;
        use agent_unwind::MAX_USER_FRAMES;

        use crate::process::{DebugFileConfig, ProcessTable, ProcessTableConfig};

        let stats = Arc::new(Stats::default());
        let mut processes = ProcessTable::new(
            "/proc".into(),
            &ProcessTableConfig::default(),
            &DebugFileConfig {
                directories: Vec::new(),
            },
            stats.clone(),
        );
        let mut unwinder = Unwinder::new(
            &UnwinderConfig {
                cache_bytes: 1 << 20,
            },
            stats.clone(),
        );
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
                let copy = stack(&words);
                let sample = RawSample {
                    tgid: pid,
                    tid: pid,
                    user_stack: vec![ip, code],
                    user_regs: Some(UserRegs {
                        ip,
                        sp: 0x7ffd_0000,
                        bp: 0x7ffd_0000 + seed * 8,
                    }),
                    stack_copy: &copy,
                    ..RawSample::default()
                };
                let dwarf = ProcessUnwinding::Dwarf;
                let attempt = unwinder.attempt(&sample, &image, &mut processes, dwarf, None);
                let unwound = unwinder.finish(attempt, dwarf);
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
        // The caches' counts reach `Stats`.
        assert!(
            s.unwind_cache_hits > 0 && s.unwind_cache_misses > 0,
            "{s:?}"
        );
    }
}
