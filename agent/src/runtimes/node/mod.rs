//! Node.js and other V8 embedders: found in their images by V8's
//! post-mortem constants (`v8dbg_*`, in the executable or `libnode.so`),
//! their layout read from those constants once per object; JavaScript
//! frames named from the function slot of each frame, through
//! `agent_runtimes::v8`.
//!
//! V8's generated code and its builtins keep frame pointers but have no
//! CFI, so the DWARF unwinder crosses them by their frame pointers and
//! asks the runtime about each (`ForeignUnwind`): at that point it knows
//! the frame's own frame pointer even below C++ frames that have none,
//! which a walk of the rbp chain from the sample's registers does not.
//! The hook only reads the frame's context and function slots from the
//! stack copy (as of the sample) and leaves the step to the unwinder. The
//! function is named while the process is alive, each object checked
//! against the heap; a frame whose context slot holds a frame type marker
//! (entry, exit and stub frames) is V8's own and keeps its native name.
//! A V8 process is therefore always unwound with DWARF over a stack copy
//! (`RuntimeSupport::unwinds_over_stack`).

mod frames;

use std::{collections::HashMap, sync::Arc};

use agent_elf::ContentKey;
use agent_runtimes::{
    recent::RecentReads,
    v8::{Layout, V8Namer, inspect_object},
};
use agent_unwind::{ForeignFrame, ForeignStep, StackCopy};
use tracing::{debug, info};

use super::{
    ForeignUnwind, ProcessMemory, Runtime, RuntimeSupport, Spliced, UserFrame, file_name,
    find_runtime_object,
};
use crate::{
    process::{ProcessImage, ProcessTable},
    sampler::RawSample,
    stats::Stats,
    watchdog::monotonic_ns,
};

/// What the Node.js support does.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Name the JavaScript frames of V8 processes (`--nodejs`).
    pub enabled: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Most processes remembered; beyond, those that are not V8 are forgotten
/// and looked at again.
const MAX_PROCESSES: usize = 4096;

/// Most V8 processes named at once, each with its namer's caches (about a
/// MiB at most); beyond, one is forgotten (its caches dropped) and looked
/// at again on its next sample.
const MAX_V8_PROCESSES: usize = 256;

/// Frames the hook records per sample at most (a stack holds fewer).
const MAX_RECORDED: usize = agent_runtimes::v8::MAX_FRAMES;

/// Why a V8 process's frames are not named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SkipReason {
    /// A constant firn needs is missing: perf maps name its code, if any.
    Layout,
    Unreadable,
}

/// What an object is, as far as V8 goes.
#[derive(Clone)]
enum Inspected {
    NotV8,
    V8 {
        layout: Box<Layout>,
        major: Option<u32>,
    },
    Skipped(SkipReason),
}

enum State {
    NotNode,
    Node(Box<V8Process>),
    Skipped,
}

/// A V8 process named: its namer, and the memory read for its latest
/// samples.
struct V8Process {
    namer: V8Namer,
    recent: RecentReads,
}

struct Entry {
    /// The image looked at (by identity): a new one is looked at again.
    image: *const ProcessImage,
    state: State,
}

/// One frame of V8 code the unwinder crossed, with its slots as of the
/// sample.
#[derive(Clone, Copy, Debug)]
struct Recorded {
    depth: usize,
    ip: u64,
    function: u64,
    context: u64,
    /// The receiver (`this`), which names a method's class.
    receiver: Option<u64>,
    /// The bytecode array and offset slots, which tell unoptimized
    /// frames from optimized ones.
    bytecode: [Option<u64>; 2],
}

/// The V8 processes firn has seen.
pub struct NodeRuntime {
    processes: HashMap<u32, Entry>,
    objects: HashMap<ContentKey, Inspected>,
    /// What the last unwind of a V8 process's sample crossed.
    found: Vec<Recorded>,
    stats: Arc<Stats>,
}

impl NodeRuntime {
    pub fn new(stats: Arc<Stats>) -> Self {
        Self {
            processes: HashMap::new(),
            objects: HashMap::new(),
            found: Vec::new(),
            stats,
        }
    }

    fn inspect(&mut self, image: &ProcessImage, processes: &mut ProcessTable) -> State {
        let found = find_runtime_object(
            image,
            processes,
            &mut self.objects,
            |path| file_name(path).starts_with("libnode"),
            |path, object| match object.data() {
                Ok(data) => inspect(path, &data),
                Err(error) => {
                    debug!(path, %error, "could not read object");
                    Inspected::Skipped(SkipReason::Unreadable)
                }
            },
            |inspected| !matches!(inspected, Inspected::NotV8),
        );
        match found.map(|(_, inspected)| inspected) {
            None | Some(Inspected::NotV8) => State::NotNode,
            Some(Inspected::V8 { layout, major }) => {
                self.count_version(major);
                debug!(
                    tgid = image.tgid,
                    comm = image.comm,
                    v8 = major,
                    "naming the JavaScript frames of a V8 process"
                );
                State::Node(Box::new(V8Process {
                    namer: V8Namer::new(*layout),
                    recent: RecentReads::new(),
                }))
            }
            Some(Inspected::Skipped(reason)) => {
                let stats = &self.stats;
                Stats::inc(match reason {
                    SkipReason::Layout => &stats.node_skipped_layout,
                    SkipReason::Unreadable => &stats.node_skipped_unreadable,
                });
                info!(
                    tgid = image.tgid,
                    comm = image.comm,
                    ?reason,
                    "JavaScript frames of this process are not named from V8's heap \
                     (a perf map still names them, if the process writes one)"
                );
                State::Skipped
            }
        }
    }

    /// Keeps the V8 processes named, `tgid` about to be one, within
    /// [`MAX_V8_PROCESSES`].
    fn make_room(&mut self, tgid: u32) {
        let named = |entry: &Entry| matches!(entry.state, State::Node(_));
        let count = self.processes.values().filter(|entry| named(entry)).count();
        if count < MAX_V8_PROCESSES || self.processes.get(&tgid).is_some_and(named) {
            return;
        }
        let evicted = self
            .processes
            .iter()
            .find(|(other, entry)| **other != tgid && named(entry))
            .map(|(other, _)| *other);
        if let Some(evicted) = evicted {
            debug!(tgid = evicted, "V8 process forgotten to make room");
            self.processes.remove(&evicted);
        }
    }

    fn count_version(&self, major: Option<u32>) {
        let stats = &self.stats;
        Stats::inc(match major {
            Some(10) => &stats.node_processes_v8_10,
            Some(11) => &stats.node_processes_v8_11,
            Some(12) => &stats.node_processes_v8_12,
            Some(13) => &stats.node_processes_v8_13,
            _ => &stats.node_processes_v8_other,
        });
    }
}

/// Whether the object is a V8 embedder, and its layout.
fn inspect(path: &str, data: &[u8]) -> Inspected {
    // Every process's executable is looked at: only its dynamic string
    // table is read to rule V8 out, not the whole file.
    let Some(rodata) = exported_v8_constants(data) else {
        return Inspected::NotV8;
    };
    let object = match inspect_object(data) {
        Ok(Some(object)) => object,
        Ok(None) => return Inspected::NotV8,
        Err(error) => {
            debug!(path, %error, "not a V8 embedder firn can read");
            return Inspected::Skipped(SkipReason::Unreadable);
        }
    };
    match Layout::new(&object.constants) {
        Ok(layout) => Inspected::V8 {
            layout: Box::new(layout),
            major: data.get(rodata).and_then(v8_major),
        },
        Err(error) => {
            info!(path, %error, "V8 build without a constant firn needs");
            Inspected::Skipped(SkipReason::Layout)
        }
    }
}

/// Where the object's read-only data is (empty if it has no `.rodata`),
/// if its dynamic symbols name post-mortem constants (as Node's executable
/// and `libnode.so` export them); `None` if not.
fn exported_v8_constants(data: &[u8]) -> Option<std::ops::Range<usize>> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(data).ok()?;
    let names = file.section_by_name(".dynstr")?.data().ok()?;
    memchr::memmem::find(names, b"v8dbg_")?;
    let rodata = file
        .section_by_name(".rodata")
        .and_then(|section| section.file_range())
        .and_then(|(offset, size)| {
            let start = usize::try_from(offset).ok()?;
            Some(start..start.checked_add(usize::try_from(size).ok()?)?)
        });
    Some(rodata.unwrap_or(0..0))
}

/// V8's major version, from the version string Node embeds
/// (`11.3.244.8-node.38`); `None` for other embedders.
fn v8_major(data: &[u8]) -> Option<u32> {
    const SUFFIX: &[u8] = b"-node.";
    for at in memchr::memmem::find_iter(data, SUFFIX).take(64) {
        let start = data[..at]
            .iter()
            .rposition(|byte| !(byte.is_ascii_digit() || *byte == b'.'))
            .map_or(0, |position| position + 1);
        let version = std::str::from_utf8(&data[start..at]).ok()?;
        let parts: Vec<&str> = version.split('.').collect();
        if parts.len() == 4 && parts.iter().all(|part| !part.is_empty()) {
            return parts[0].parse().ok();
        }
    }
    None
}

/// Records the V8 frames one unwind crosses.
struct V8Unwinder<'a> {
    function: i64,
    context: i64,
    bytecode: [i64; 2],
    receiver: Option<i64>,
    found: &'a mut Vec<Recorded>,
}

impl ForeignUnwind for V8Unwinder<'_> {
    fn foreign(&mut self, frame: ForeignFrame, stack: StackCopy<'_>) -> Option<ForeignStep> {
        // Depths only grow within one unwind: a smaller one is the start
        // of another over fresher maps.
        while self
            .found
            .last()
            .is_some_and(|last| last.depth >= frame.depth)
        {
            self.found.pop();
        }
        let bp = frame.bp?;
        if self.found.len() < MAX_RECORDED
            && let (Some(function), Some(context)) = (
                stack.word(bp.wrapping_add_signed(self.function)),
                stack.word(bp.wrapping_add_signed(self.context)),
            )
        {
            let receiver = self
                .receiver
                .and_then(|slot| stack.word(bp.wrapping_add_signed(slot)));
            let bytecode = self
                .bytecode
                .map(|slot| stack.word(bp.wrapping_add_signed(slot)));
            self.found.push(Recorded {
                depth: frame.depth,
                ip: frame.ip,
                function,
                context,
                receiver,
                bytecode,
            });
        }
        // The unwinder follows the frame pointer, as for any JIT code.
        None
    }
}

impl RuntimeSupport for NodeRuntime {
    fn runtime(&self) -> Runtime {
        Runtime::JavaScript
    }

    fn observe(&mut self, image: &Arc<ProcessImage>, processes: &mut ProcessTable) {
        if image.gone || image.mappings.is_empty() {
            return;
        }
        let tgid = image.tgid;
        if let Some(entry) = self.processes.get(&tgid)
            && std::ptr::eq(entry.image, Arc::as_ptr(image))
        {
            return;
        }
        if !self.processes.contains_key(&tgid) && self.processes.len() >= MAX_PROCESSES {
            self.processes
                .retain(|_, entry| matches!(entry.state, State::Node(_)));
        }
        let state = self.inspect(image, processes);
        if matches!(state, State::Node(_)) {
            self.make_room(tgid);
        }
        self.processes.insert(
            tgid,
            Entry {
                image: Arc::as_ptr(image),
                state,
            },
        );
    }

    fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    fn passed_over(&self, tgid: u32) -> bool {
        self.processes
            .get(&tgid)
            .is_some_and(|entry| matches!(entry.state, State::NotNode))
    }

    fn unwinds_over_stack(&self, tgid: u32) -> bool {
        matches!(
            self.processes.get(&tgid),
            Some(Entry {
                state: State::Node(_),
                ..
            })
        )
    }

    fn unwinder(&mut self, tgid: u32) -> Option<Box<dyn ForeignUnwind + '_>> {
        let Some(Entry {
            state: State::Node(process),
            ..
        }) = self.processes.get(&tgid)
        else {
            return None;
        };
        let layout = process.namer.layout();
        let frame = layout.frame;
        self.found.clear();
        Some(Box::new(V8Unwinder {
            function: frame.function,
            context: frame.context,
            bytecode: [frame.bytecode_array, frame.bytecode_offset],
            receiver: layout.receivers.map(|receivers| receivers.slot),
            found: &mut self.found,
        }))
    }

    fn splice(&mut self, sample: &RawSample, native: Vec<u64>) -> Spliced {
        let tgid = sample.tgid;
        let Some(Entry {
            state: State::Node(process),
            ..
        }) = self.processes.get_mut(&tgid)
        else {
            return Spliced::NotMine(native);
        };
        let V8Process { namer, recent } = &mut **process;
        let found = std::mem::take(&mut self.found);
        // Blocks read for an earlier sample of the batch, after this one
        // was taken, are believed for it (see `agent_runtimes::recent`).
        let mut process_memory = ProcessMemory::new(tgid);
        let mut memory =
            recent.for_sample(&mut process_memory, sample.timestamp_ns, monotonic_ns());
        // What the JavaScript frames' names are read from first, in a few
        // calls rather than a read per block.
        let tagging = namer.layout().tagging;
        let javascript = || {
            found
                .iter()
                .filter(|recorded| tagging.is_heap_object(recorded.context))
        };
        let functions: Vec<u64> = javascript().map(|recorded| recorded.function).collect();
        let arrays: Vec<u64> = javascript()
            .filter_map(|recorded| recorded.bytecode[0])
            .collect();
        namer.prefetch(&mut memory, &functions, &arrays);
        let mut recorded = found.iter().peekable();
        let mut frames = Vec::with_capacity(native.len());
        for (depth, address) in native.into_iter().enumerate() {
            // Frames recorded at a depth whose address is not this one's
            // belong to an unwind that was not kept.
            let named = recorded
                .next_if(|recorded| recorded.depth == depth && recorded.ip == address)
                .is_some_and(|recorded| {
                    Self::name(namer, &mut memory, recorded, &self.stats, &mut frames)
                });
            if !named {
                frames.push(UserFrame::Native(address));
            }
        }
        let counts = namer.counts();
        debug!(hits = counts.hits, misses = counts.misses, "V8 namer cache");
        let reads = recent.take_counts();
        Stats::add(&self.stats.node_recent_hits, reads.hits);
        Stats::add(&self.stats.node_memory_reads, reads.reads);
        Spliced::Named(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v8_version_from_nodes_string() {
        let data = b"\0\0v20.20.2\0garbage-node.x\0\x0111.3.244.8-node.38\0";
        assert_eq!(v8_major(data), Some(11));
        assert_eq!(v8_major(b"no version here"), None);
        assert_eq!(v8_major(b"1.2-node.3"), None);
    }

    fn recorded(depth: usize) -> Recorded {
        Recorded {
            depth,
            ip: 0x1000 + depth as u64,
            function: 0,
            context: 0,
            receiver: None,
            bytecode: [None; 2],
        }
    }

    #[test]
    fn a_new_unwind_drops_what_the_last_one_recorded_from_its_depth() {
        let mut found = vec![recorded(1), recorded(3), recorded(4)];
        let mut unwinder = V8Unwinder {
            function: -16,
            context: -8,
            bytecode: [-32, -40],
            receiver: Some(16),
            found: &mut found,
        };
        let bytes = [0u8; 64];
        let stack = StackCopy {
            sp: 0x7000,
            bytes: &bytes,
        };
        let step = unwinder.foreign(
            ForeignFrame {
                ip: 0x1003,
                sp: 0x7000,
                bp: Some(0x7020),
                depth: 3,
                exact: false,
            },
            stack,
        );
        assert_eq!(step, None);
        let depths: Vec<usize> = found.iter().map(|recorded| recorded.depth).collect();
        assert_eq!(depths, [1, 3]);
    }
}
