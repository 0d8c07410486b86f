//! Per process: unwind with frame pointers or with DWARF, and so how much
//! of its stack the BPF program copies. In `auto` mode a process image is
//! unwound with DWARF when its main executable, or any library it maps from
//! outside the system library directories, lacks frame pointers (judged
//! from the CFI, see `agent_unwind::survey`). The decision is written into the BPF map of
//! per-process copy sizes: the leaf copy for processes that keep frame
//! pointers, a copy fitted to its stacks for the others. A process not yet
//! decided (sampled before firn looked at it, or right after an exec) gets
//! the full copy, so even its first samples unwind whole and nothing has
//! to be looked at before sampling starts.

use std::{
    num::NonZeroUsize,
    path::Path,
    sync::{Arc, Weak},
};

mod preset;

use agent_unwind::ObjectFrames;
use lru::LruCache;
pub use preset::Preset;
use tracing::debug;

use agent_common::{MAX_STACK_COPY, UNWIND_COPY_BY_THREAD, UNWIND_COPY_NO_WALK};

use super::{
    StackNeed, Unwinder, WalkUse,
    learned::{ExecutableKey, LearnedCopies, MIN_COPY, fitted},
    threads::{ThreadChange, ThreadStacks},
    walk::WalkJudge,
};
use crate::{
    process::{MappingKind, ProcessImage, ProcessTable},
    sampler::UnwindMode,
    stats::Stats,
};

/// How one process's user stacks are unwound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessUnwinding {
    /// The kernel's frame-pointer walk, leaf repaired with CFI.
    FramePointers,
    /// DWARF CFI over the copy of the stack.
    Dwarf,
}

#[derive(Debug, thiserror::Error)]
#[error("could not set the stack copy size of process {tgid}")]
pub struct CopyMapError {
    pub tgid: u32,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
#[error("could not preset the stack copy of executable {executable:?}")]
pub struct ExecPresetError {
    pub executable: agent_common::ExecutableKey,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
#[error("could not set where the stack of thread {tid} ends")]
pub struct ThreadStackError {
    pub tid: u32,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// The BPF maps of per-process stack copy sizes and per-thread stack
/// ends; a trait so the policy is tested without BPF.
pub trait CopySizeMap: Send {
    fn set(&mut self, tgid: u32, bytes: u32) -> Result<(), CopyMapError>;
    fn remove(&mut self, tgid: u32);
    /// Thread `tid`'s copy ends at `end` (`THREAD_STACKS`).
    fn set_thread(&mut self, tid: u32, end: u64) -> Result<(), ThreadStackError>;
    fn remove_thread(&mut self, tid: u32);
    /// New processes of `executable` get `entry` at their exec, without
    /// waking the daemon (`EXEC_PRESETS`, an LRU map).
    fn set_exec_preset(
        &mut self,
        executable: agent_common::ExecutableKey,
        entry: u32,
    ) -> Result<(), ExecPresetError>;
}

/// Libraries here come with the distribution. Debian builds them without
/// frame pointers, but they sit at the ends of most stacks (syscall
/// wrappers at the leaf, which leaf repair covers; `__libc_start_main` at
/// the root), so they alone do not make a process pay for DWARF.
const SYSTEM_LIBRARY_DIRS: [&str; 8] = [
    "/lib/",
    "/lib32/",
    "/lib64/",
    "/libx32/",
    "/usr/lib/",
    "/usr/lib32/",
    "/usr/lib64/",
    "/usr/libx32/",
];

pub fn is_system_library(path: &str) -> bool {
    SYSTEM_LIBRARY_DIRS.iter().any(|dir| path.starts_with(dir))
}

struct Decision {
    /// The image it was made for; a new image (exec, new mappings) is
    /// decided again.
    image: Weak<ProcessImage>,
    unwinding: ProcessUnwinding,
    /// The BPF map holds an entry for this tgid.
    in_map: bool,
    /// The copy size asked for in the map (when `in_map`).
    copy: u32,
    sizing: Sizing,
    walk: WalkJudge,
}

impl Decision {
    /// The map's value for this process: its copy size, flagged when the
    /// kernel's walk of its user stack is skipped.
    fn entry(&self, copy: u32) -> u32 {
        entry(copy, self.unwinding, self.walk.on)
    }
}

/// An `UNWIND_COPY` value: the copy size, flagged for a DWARF process
/// (whose threads' copies end where `THREAD_STACKS` says) and when the
/// kernel's walk of its user stack is skipped.
fn entry(copy: u32, unwinding: ProcessUnwinding, walk: bool) -> u32 {
    let mut entry = copy;
    if unwinding == ProcessUnwinding::Dwarf {
        entry |= UNWIND_COPY_BY_THREAD;
    }
    if !walk {
        entry |= UNWIND_COPY_NO_WALK;
    }
    entry
}

/// What complete DWARF unwinds of one process needed, towards fitting its
/// copy to its stacks: a process with shallow stacks should not pay for
/// copying 64 KiB per sample, nor one with deep stacks lose its roots.
#[derive(Clone, Copy, Debug, Default)]
struct Sizing {
    /// The most stack a complete unwind used since the copy last grew.
    deepest: u64,
    complete: u32,
    /// Fitted to its unwinds once already.
    fitted: bool,
    /// Grown after it was fitted: its deep stacks are rare but real, and
    /// it keeps the largest copy, so it does not flip back and forth.
    settled: bool,
}

/// Complete unwinds seen before a copy is shrunk to fit them.
const SHRINK_AFTER: u32 = 200;

impl Sizing {
    /// The size to shrink to, once enough unwinds have been seen: the
    /// deepest with a quarter and a KiB to spare, in copy chunks.
    fn fit(&mut self, current: u32) -> Option<u32> {
        if self.fitted || self.settled || self.complete < SHRINK_AFTER {
            return None;
        }
        self.fitted = true;
        let want = fitted(self.deepest).max(MIN_COPY);
        (want < current).then_some(want)
    }
}

impl Sizing {
    /// A stack did not fit: the copy grows to the most the BPF program
    /// copies at once (growing step by step would cut the stacks sampled
    /// meanwhile), and the unwinds after it say how much is needed.
    fn grow(&mut self) -> u32 {
        self.settled = self.fitted;
        self.deepest = 0;
        self.complete = 0;
        MAX_STACK_COPY as u32
    }
}

pub struct UnwindPolicy {
    mode: UnwindMode,
    copy_bytes: u32,
    /// What processes unwound with frame pointers get in the map.
    leaf_copy_bytes: u32,
    map: Option<Box<dyn CopySizeMap>>,
    decisions: LruCache<u32, Decision>,
    /// The copy each executable's processes need, over all of them: its
    /// next processes (a compiler run again and again) start there.
    learned: LearnedCopies,
    /// Where the stacks of DWARF processes' threads end.
    threads: ThreadStacks,
    /// What the BPF program gives each preset executable's new processes.
    published: preset::Published,
    stats: Arc<Stats>,
}

impl UnwindPolicy {
    /// `capacity`: processes remembered (the process table's size).
    pub fn new(mode: UnwindMode, copy_bytes: u32, capacity: usize, stats: Arc<Stats>) -> Self {
        Self {
            mode,
            copy_bytes,
            leaf_copy_bytes: 0,
            map: None,
            decisions: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
            learned: LearnedCopies::default(),
            threads: ThreadStacks::default(),
            published: preset::Published::default(),
            stats,
        }
    }

    /// Decisions are written into `map` from now on, processes unwound
    /// with frame pointers given `leaf_copy_bytes`.
    pub fn with_map(mut self, map: Box<dyn CopySizeMap>, leaf_copy_bytes: u32) -> Self {
        self.map = Some(map);
        self.leaf_copy_bytes = leaf_copy_bytes;
        self
    }

    pub fn mode(&self) -> UnwindMode {
        self.mode
    }

    /// How `image`'s stacks are unwound; decided once per image.
    pub fn decide(
        &mut self,
        image: &Arc<ProcessImage>,
        processes: &mut ProcessTable,
        unwinder: &mut Unwinder,
    ) -> ProcessUnwinding {
        match self.mode {
            UnwindMode::FramePointers => return ProcessUnwinding::FramePointers,
            UnwindMode::Dwarf => return ProcessUnwinding::Dwarf,
            UnwindMode::Auto => {}
        }
        let tgid = image.tgid;
        if let Some(decision) = self.decisions.get(&tgid)
            && std::ptr::eq(decision.image.as_ptr(), Arc::as_ptr(image))
        {
            return decision.unwinding;
        }
        let unwinding = classify(image, processes, unwinder);
        match unwinding {
            ProcessUnwinding::Dwarf => Stats::inc(&self.stats.unwind_dwarf_images),
            ProcessUnwinding::FramePointers => Stats::inc(&self.stats.unwind_fp_images),
        }
        let previous = self.decisions.pop(&tgid).filter(|d| d.in_map);
        let decision = match (unwinding, previous) {
            // A new image of a process already unwound with DWARF (maps
            // read again): its copy stays fitted.
            (ProcessUnwinding::Dwarf, Some(previous))
                if previous.unwinding == ProcessUnwinding::Dwarf =>
            {
                Decision {
                    image: Arc::downgrade(image),
                    ..previous
                }
            }
            (_, previous) => {
                let learned = ExecutableKey::of(image)
                    .and_then(|key| self.learned.size(key, self.copy_bytes))
                    .filter(|_| unwinding == ProcessUnwinding::Dwarf);
                let wanted = match unwinding {
                    ProcessUnwinding::Dwarf => learned.unwrap_or(self.copy_bytes),
                    ProcessUnwinding::FramePointers => self.leaf_copy_bytes,
                };
                // A held entry without the walk is written again: the
                // new decision starts with it.
                let held = previous
                    .filter(|d| d.walk.on && d.unwinding == unwinding)
                    .map(|d| d.copy);
                let copy = if held == Some(wanted)
                    || self.set_copy(tgid, entry(wanted, unwinding, true))
                {
                    Some(wanted)
                } else {
                    held
                };
                Decision {
                    image: Arc::downgrade(image),
                    unwinding,
                    in_map: copy.is_some(),
                    copy: copy.unwrap_or(0),
                    // A learned size is fitted already.
                    sizing: Sizing {
                        fitted: learned.is_some(),
                        ..Sizing::default()
                    },
                    walk: WalkJudge::default(),
                }
            }
        };
        self.remember(tgid, decision);
        unwinding
    }

    /// Writes `bytes` as `tgid`'s copy size; false (and counted) when the
    /// map refuses it, or when there is no map.
    fn set_copy(&mut self, tgid: u32, bytes: u32) -> bool {
        let Some(map) = &mut self.map else {
            return false;
        };
        match map.set(tgid, bytes) {
            Ok(()) => true,
            Err(error) => {
                Stats::inc(&self.stats.unwind_copy_map_failures);
                debug!(%error, "process keeps the copy it had");
                false
            }
        }
    }

    /// `image` was left to frame pointers, but its stacks hold callers
    /// without them (a binary mixing code built with and without, such as
    /// Rust programs over a frame-pointer std): unwind it with DWARF.
    pub fn require_dwarf(&mut self, image: &Arc<ProcessImage>) {
        let tgid = image.tgid;
        let Some(decision) = self.decisions.peek_mut(&tgid) else {
            return;
        };
        if decision.unwinding == ProcessUnwinding::Dwarf
            || !std::ptr::eq(decision.image.as_ptr(), Arc::as_ptr(image))
        {
            return;
        }
        decision.unwinding = ProcessUnwinding::Dwarf;
        Stats::inc(&self.stats.unwind_switched_to_dwarf);
        debug!(
            pid = tgid,
            "frame pointers missing on the stack: switching to DWARF"
        );
        if decision.in_map && decision.copy >= self.copy_bytes {
            return;
        }
        let Some(map) = &mut self.map else {
            return;
        };
        match map.set(tgid, decision.entry(self.copy_bytes)) {
            Ok(()) => {
                decision.in_map = true;
                decision.copy = self.copy_bytes;
                decision.sizing = Sizing::default();
            }
            Err(error) => {
                Stats::inc(&self.stats.unwind_copy_map_failures);
                debug!(%error, "process keeps the copy it had");
            }
        }
    }

    /// Fits the copy of a process unwound with DWARF to what its unwinds
    /// need (`auto` mode, where each such process has its own entry): one
    /// that ran past a full copy grows at once to the most the BPF program
    /// copies; once enough complete unwinds show the stacks are shallower,
    /// the copy shrinks to fit them. Fitted once; a process whose stacks
    /// outgrow the fitted copy keeps the largest from then on.
    pub fn observe_stack(&mut self, image: &Arc<ProcessImage>, need: StackNeed, copied: usize) {
        let Some(decision) = self.decisions.peek_mut(&image.tgid) else {
            return;
        };
        if !decision.in_map
            || decision.unwinding != ProcessUnwinding::Dwarf
            || !std::ptr::eq(decision.image.as_ptr(), Arc::as_ptr(image))
        {
            return;
        }
        let cut = matches!(need, StackNeed::MoreThanCopied)
            && copied >= decision.copy as usize
            && (decision.copy as usize) < MAX_STACK_COPY;
        if let Some(key) = ExecutableKey::of(image) {
            match need {
                StackNeed::Used(bytes) => self.learned.used(key, bytes),
                StackNeed::MoreThanCopied if cut => self.learned.grown(key),
                StackNeed::MoreThanCopied => {}
            }
        }
        let resized = match need {
            // A copy that ended short (the top of the stack) needs no more.
            StackNeed::MoreThanCopied if cut => {
                Some((decision.sizing.grow(), &self.stats.unwind_copy_grown))
            }
            StackNeed::MoreThanCopied => None,
            StackNeed::Used(bytes) => {
                decision.sizing.deepest = decision.sizing.deepest.max(bytes);
                decision.sizing.complete += 1;
                decision
                    .sizing
                    .fit(decision.copy)
                    .map(|size| (size, &self.stats.unwind_copy_shrunk))
            }
        };
        let (Some((size, counter)), Some(map)) = (resized, &mut self.map) else {
            return;
        };
        match map.set(image.tgid, decision.entry(size)) {
            Ok(()) => {
                debug!(
                    pid = image.tgid,
                    from = decision.copy,
                    to = size,
                    "stack copy resized"
                );
                decision.copy = size;
                Stats::inc(counter);
            }
            Err(error) => {
                Stats::inc(&self.stats.unwind_copy_map_failures);
                debug!(%error, "stack copy not resized");
            }
        }
    }

    /// Learns from one DWARF unwind of thread `tid` of `image`, from stack
    /// pointer `sp`, where the thread's stack ends (`ThreadStacks`), and
    /// tells the BPF program.
    pub fn observe_thread(
        &mut self,
        image: &Arc<ProcessImage>,
        (tid, sp): (u32, u64),
        need: StackNeed,
        copied: usize,
    ) {
        let Some(decision) = self.decisions.peek(&image.tgid) else {
            return;
        };
        if !decision.in_map
            || decision.unwinding != ProcessUnwinding::Dwarf
            || !std::ptr::eq(decision.image.as_ptr(), Arc::as_ptr(image))
        {
            return;
        }
        let Some(change) = self.threads.observe((image.tgid, tid), sp, need, copied) else {
            return;
        };
        let Some(map) = &mut self.map else {
            return;
        };
        match change {
            ThreadChange::Set { tid, end } => match map.set_thread(tid, end) {
                Ok(()) => Stats::inc(&self.stats.unwind_thread_stack_set),
                Err(error) => {
                    Stats::inc(&self.stats.unwind_copy_map_failures);
                    debug!(%error, "thread keeps its process's copy");
                }
            },
            ThreadChange::Remove { tid } => {
                map.remove_thread(tid);
                Stats::inc(&self.stats.unwind_thread_stack_removed);
            }
        }
    }

    /// Judges from one DWARF unwind of `image` whether the kernel's walk
    /// of its user stack is still worth taking (`WalkJudge`), and tells
    /// the BPF program when that changes.
    pub fn observe_walk(&mut self, image: &Arc<ProcessImage>, walk: WalkUse) {
        let Some(decision) = self.decisions.peek_mut(&image.tgid) else {
            return;
        };
        if !decision.in_map
            || decision.unwinding != ProcessUnwinding::Dwarf
            || !std::ptr::eq(decision.image.as_ptr(), Arc::as_ptr(image))
            || !decision.walk.observe(walk)
        {
            return;
        }
        let Some(map) = &mut self.map else {
            return;
        };
        match map.set(image.tgid, decision.entry(decision.copy)) {
            Ok(()) => {
                debug!(
                    pid = image.tgid,
                    walk = decision.walk.on,
                    "kernel's user stack walk switched"
                );
                Stats::inc(match decision.walk.on {
                    true => &self.stats.unwind_walk_restored,
                    false => &self.stats.unwind_walk_skipped,
                });
            }
            Err(error) => {
                // The map keeps what it had: so does the judgement.
                decision.walk.on = !decision.walk.on;
                Stats::inc(&self.stats.unwind_copy_map_failures);
                debug!(%error, "user stack walk not switched");
            }
        }
    }

    /// The process executed a new image: the BPF program gave it the full
    /// copy until it is decided.
    pub fn on_exec(&mut self, tgid: u32) {
        if self.mode != UnwindMode::Auto {
            return;
        }
        let in_map = self.map.is_some();
        self.remember(
            tgid,
            Decision {
                image: Weak::new(),
                unwinding: ProcessUnwinding::Dwarf,
                in_map,
                copy: self.copy_bytes,
                sizing: Sizing::default(),
                walk: WalkJudge::default(),
            },
        );
    }

    /// The process exited; the BPF program dropped its entry.
    pub fn on_exit(&mut self, tgid: u32) {
        if let Some(decision) = self.decisions.peek_mut(&tgid) {
            decision.in_map = false;
        }
    }

    /// Drops map entries of processes that are gone: a decision can race
    /// with an exit, and exit events can be lost.
    pub fn sweep(&mut self, proc_root: &Path) {
        let Some(map) = &mut self.map else {
            return;
        };
        for (&tgid, decision) in self.decisions.iter_mut() {
            if decision.in_map && !proc_root.join(tgid.to_string()).exists() {
                map.remove(tgid);
                decision.in_map = false;
            }
        }
    }

    fn remember(&mut self, tgid: u32, decision: Decision) {
        if let Some((evicted, old)) = self.decisions.push(tgid, decision)
            && evicted != tgid
            && old.in_map
            && let Some(map) = &mut self.map
        {
            map.remove(evicted);
        }
    }
}

/// DWARF when the main executable or a non-system object lacks frame
/// pointers.
fn classify(
    image: &ProcessImage,
    processes: &mut ProcessTable,
    unwinder: &mut Unwinder,
) -> ProcessUnwinding {
    let executable = image
        .mappings
        .iter()
        .position(|m| m.spec.kind == MappingKind::File);
    let mut last = None;
    for (index, mapping) in image.mappings.iter().enumerate() {
        let spec = &mapping.spec;
        // A JVM: its JIT code has no frame pointers to walk, and its Java
        // frames are unwound over the stack copy.
        if spec.kind == MappingKind::File && spec.path.ends_with("/libjvm.so") {
            return ProcessUnwinding::Dwarf;
        }
        if spec.kind != MappingKind::File
            || (Some(index) != executable && is_system_library(&spec.path))
            || last == Some((spec.dev, spec.inode))
        {
            continue;
        }
        last = Some((spec.dev, spec.inode));
        let Some(object) = processes.object(image, index) else {
            continue;
        };
        if unwinder.object_frames(&object) == ObjectFrames::NoFramePointers {
            debug!(pid = image.tgid, object = object.path, "no frame pointers");
            return ProcessUnwinding::Dwarf;
        }
    }
    ProcessUnwinding::FramePointers
}

#[cfg(test)]
mod tests;
