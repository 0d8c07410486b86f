//! HotSpot JVMs: found in their images by `libjvm.so`, their tables read
//! once per process; Java frames unwound in userspace over the sample's
//! stack copy (the DWARF unwinder hands them over: JIT code has no CFI)
//! and named while the process is alive, through `agent_runtimes::hotspot`.
//!
//! Why userspace and not BPF: the stack copy already holds every slot an
//! interpreted frame keeps (its `Method*` and bytecode pointer, as of the
//! sample) and the frame sizes of compiled code change only when code is
//! compiled or freed, so nothing needs reading at sample time; the code
//! blob lookup (a segment map walk and a header) runs once per frame in
//! userspace, where it is bounded by firn's CPU budget, not the
//! verifier's.

use std::{
    collections::HashMap,
    num::NonZeroUsize,
    sync::{Arc, atomic::AtomicU64},
    time::Instant,
};

use agent_elf::ContentKey;
use agent_runtimes::{
    Memory,
    hotspot::{
        CodeBlob, CodeCache, FrameKind, FrameRegs, HotSpotError, JavaFrame, JavaNamer, JvmObject,
        Layout, ThreadLayout, VmTables, inspect_object, step,
    },
};
use agent_unwind::{ForeignFrame, ForeignStep, StackCopy};
use lru::LruCache;
use tracing::{debug, info};

use super::{
    InterpretedFrame, JavaKind, ProcessMemory, Runtime, UserFrame, file_name,
    java_threads::JvmThreads, load_bias,
};
use crate::{
    process::{MappingKind, ProcessImage, ProcessTable},
    stats::Stats,
    watchdog::monotonic_ns,
};

/// What the Java support does.
#[derive(Clone, Debug)]
pub struct JavaConfig {
    /// Unwind and name Java frames (`--java`).
    pub enabled: bool,
}

impl Default for JavaConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Most JVM processes remembered; beyond, the others are forgotten and
/// looked at again.
const MAX_PROCESSES: usize = 4096;

/// Most objects whose inspection is remembered.
const MAX_REMEMBERED_OBJECTS: usize = 4096;

/// Samples of a JVM whose tables are not initialized yet after which it
/// is looked at again (the JVM fills them early in its start-up).
const RETRY_AFTER_SAMPLES: u32 = 16;

struct Jvm {
    layout: Layout,
    cache: CodeCache,
    namer: JavaNamer,
    /// Compiled frames as spliced, by their nmethod's code start and
    /// compile id and the frame's pc (and whether it is a return
    /// address). The sample's unwind found that nmethod by its header,
    /// compile id included, after the sample: the same compilation, alive,
    /// keeping its methods alive, so its frames' names hold without
    /// reading the methods again.
    compiled: LruCache<CompiledAt, Arc<[(FrameKind, UserFrame)]>>,
    threads: Option<JvmThreads>,
}

/// Most compiled frames' names remembered of one JVM.
const MAX_COMPILED_FRAMES: usize = 4096;

/// A compiled frame: its nmethod's code start and compile id, its pc and
/// whether the pc is a return address.
type CompiledAt = (u64, i32, u64, bool);

impl Jvm {
    /// Appends the frames `frame`, found at `address`, stands for.
    fn name(
        &mut self,
        memory: &mut ProcessMemory,
        stats: &Stats,
        frame: &JavaFrame,
        address: u64,
        sampled: (u64, u64),
        out: &mut Vec<UserFrame>,
    ) {
        if let JavaFrame::Stub { name } = frame {
            // Generated code of the JVM: named by its blob, a frame of the
            // JVM rather than of Java.
            out.push(UserFrame::Interpreted(Arc::new(InterpretedFrame {
                runtime: Runtime::Java(JavaKind::Generated),
                function: format!("[{name}]").into(),
                file: "".into(),
                line: 0,
            })));
            return;
        }
        let at = match *frame {
            JavaFrame::Compiled {
                code,
                compile_id,
                pc,
                exact,
                ..
            } => Some((code, compile_id, pc, exact)),
            _ => None,
        };
        if let Some(named) = at.and_then(|at| self.compiled.get(&at)) {
            for (kind, frame) in named.iter() {
                Stats::inc(frame_counter(stats, *kind));
                out.push(frame.clone());
            }
            return;
        }
        match self
            .namer
            .name_at(memory, &self.layout, &self.cache, frame, sampled)
        {
            Ok(named) if named.is_empty() => out.push(UserFrame::Native(address)),
            Ok(named) => {
                let named: Arc<[(FrameKind, UserFrame)]> = named
                    .into_iter()
                    .map(|named| {
                        let frame = UserFrame::Interpreted(Arc::new(InterpretedFrame {
                            runtime: Runtime::Java(kind_of(named.kind)),
                            function: named.method.function().into(),
                            file: named.method.file.clone(),
                            line: named.line,
                        }));
                        (named.kind, frame)
                    })
                    .collect();
                for (kind, frame) in named.iter() {
                    Stats::inc(frame_counter(stats, *kind));
                    out.push(frame.clone());
                }
                if let Some(at) = at {
                    self.compiled.put(at, named);
                }
            }
            Err(error) => {
                debug!(%error, ?frame, "Java frame not named");
                Stats::inc(match is_stale(&error) {
                    true => &stats.java_name_stale,
                    false => &stats.java_name_failures,
                });
                out.push(unknown());
            }
        }
    }
}

/// A Java frame that could not be named.
fn unknown() -> UserFrame {
    UserFrame::Interpreted(Arc::new(InterpretedFrame {
        runtime: Runtime::Java(JavaKind::Generated),
        function: "<unknown>".into(),
        file: "".into(),
        line: 0,
    }))
}

enum State {
    NotJava,
    Java(Box<Jvm>),
    /// Tables not initialized yet: `samples` until the next look.
    Pending {
        samples: u32,
    },
    Skipped,
}

struct Entry {
    image: *const ProcessImage,
    state: State,
}

/// Why a `libjvm.so` is not read: a `firn_java_processes_skipped_total`
/// reason.
#[derive(Clone, Copy, Debug)]
enum Unusable {
    NoTables,
    Unreadable,
}

/// The JVMs firn has seen.
pub struct JavaRuntime {
    processes: HashMap<u32, Entry>,
    objects: HashMap<ContentKey, Result<JvmObject, Unusable>>,
    stats: Arc<Stats>,
}

/// The Java frames one unwind found, by their index among its frames.
#[derive(Default)]
pub struct JavaFrames {
    frames: Vec<Found>,
}

/// A Java frame an unwind found.
struct Found {
    depth: usize,
    ip: u64,
    frame: JavaFrame,
    /// The blob remembered from earlier samples that the frame was unwound
    /// with, unread: its header is checked before the frame is named.
    unchecked: Option<CodeBlob>,
}

/// One process's JVM as the unwinder asks about its frames.
pub struct JvmUnwinder<'a> {
    jvm: &'a Jvm,
    memory: ProcessMemory,
    found: &'a mut JavaFrames,
    stats: &'a Stats,
    /// Before any read of this unwind (`CLOCK_MONOTONIC`, as the samples'
    /// times).
    now: u64,
}

impl JvmUnwinder<'_> {
    /// The caller of a frame in JIT code, if it is this JVM's.
    pub fn foreign(&mut self, frame: ForeignFrame, stack: StackCopy<'_>) -> Option<ForeignStep> {
        let jvm = self.jvm;
        if !jvm.cache.contains(frame.ip) {
            return None;
        }
        if frame.depth == 0 {
            self.found.frames.clear();
        }
        let lookup = if frame.exact {
            frame.ip
        } else {
            frame.ip.wrapping_sub(1)
        };
        // A blob remembered is taken as it was and checked with the
        // sample's others in one read when the frames are named.
        let (blob, unchecked) = match jvm.cache.remembered(lookup) {
            Some(blob) => (blob, true),
            None => match jvm
                .cache
                .find_at(&mut self.memory, &jvm.layout, lookup, self.now)
            {
                Ok(Some(blob)) => (blob, false),
                Ok(None) => {
                    Stats::inc(&self.stats.java_unwind_failures);
                    return Some(ForeignStep::Stop);
                }
                Err(error) => {
                    debug!(%error, "no code blob for a Java frame");
                    Stats::inc(&self.stats.java_unwind_failures);
                    return Some(ForeignStep::Stop);
                }
            },
        };
        let regs = FrameRegs {
            ip: frame.ip,
            sp: frame.sp,
            bp: frame.bp,
        };
        match step(
            &jvm.cache,
            &jvm.layout,
            &blob,
            regs,
            frame.exact,
            &|address| stack.word(address),
        ) {
            Ok(step) => {
                self.found.frames.push(Found {
                    depth: frame.depth,
                    ip: frame.ip,
                    frame: step.frame,
                    unchecked: unchecked.then_some(blob),
                });
                Some(ForeignStep::Caller {
                    ip: step.caller.ip,
                    sp: step.caller.sp,
                    bp: step.caller.bp,
                })
            }
            Err(error) => {
                debug!(%error, "Java frame not unwound");
                Stats::inc(&self.stats.java_unwind_failures);
                Some(ForeignStep::Stop)
            }
        }
    }
}

impl JavaRuntime {
    pub fn new(stats: Arc<Stats>) -> Self {
        Self {
            processes: HashMap::new(),
            objects: HashMap::new(),
            stats,
        }
    }

    /// Looks at a process image: reads the tables of its JVM, if any.
    pub fn observe(&mut self, image: &Arc<ProcessImage>, processes: &mut ProcessTable) {
        if image.gone || image.mappings.is_empty() {
            return;
        }
        let tgid = image.tgid;
        if let Some(entry) = self.processes.get_mut(&tgid)
            && std::ptr::eq(entry.image, Arc::as_ptr(image))
        {
            match &mut entry.state {
                State::Pending { samples } if *samples > 0 => {
                    *samples -= 1;
                    return;
                }
                State::Pending { .. } => {}
                _ => return,
            }
        }
        if !self.processes.contains_key(&tgid) && self.processes.len() >= MAX_PROCESSES {
            self.processes
                .retain(|_, entry| matches!(entry.state, State::Java(_)));
        }
        let state = self.inspect(image, processes);
        self.processes.insert(
            tgid,
            Entry {
                image: Arc::as_ptr(image),
                state,
            },
        );
    }

    fn inspect(&mut self, image: &ProcessImage, processes: &mut ProcessTable) -> State {
        let Some((index, object)) = self.find_jvm(image, processes) else {
            return State::NotJava;
        };
        let object = match object {
            Ok(object) => object,
            Err(Unusable::NoTables) => {
                Stats::inc(&self.stats.java_skipped_no_tables);
                return State::Skipped;
            }
            Err(Unusable::Unreadable) => {
                Stats::inc(&self.stats.java_skipped_unreadable);
                return State::Skipped;
            }
        };
        let Some(bias) = load_bias(image, index) else {
            Stats::inc(&self.stats.java_skipped_unreadable);
            return State::Skipped;
        };
        let mut memory = ProcessMemory::new(image.tgid);
        let tables = match VmTables::read(&mut memory, &object.relocated(bias)) {
            Ok(tables) => tables,
            Err(agent_runtimes::hotspot::TableError::NotInitialized { .. }) => {
                return State::Pending {
                    samples: RETRY_AFTER_SAMPLES,
                };
            }
            Err(error) => {
                info!(tgid = image.tgid, %error, "Java frames of this JVM are not unwound");
                Stats::inc(&self.stats.java_skipped_unreadable);
                return State::Skipped;
            }
        };
        let layout = match Layout::new(&tables) {
            Ok(layout) => layout,
            Err(error) => {
                info!(tgid = image.tgid, %error, "Java frames of this JVM are not unwound");
                Stats::inc(&self.stats.java_skipped_layout);
                return State::Skipped;
            }
        };
        let cache = match CodeCache::read(&mut memory, &layout) {
            Ok(cache) => cache,
            Err(error) => {
                debug!(tgid = image.tgid, %error, "code cache not readable yet");
                return State::Pending {
                    samples: RETRY_AFTER_SAMPLES,
                };
            }
        };
        let version = major_version(&mut memory, &layout);
        Stats::inc(self.version_counter(version));
        debug!(
            tgid = image.tgid,
            comm = image.comm,
            version,
            "unwinding the Java frames of a JVM"
        );
        let threads = match ThreadLayout::new(&tables) {
            Ok(layout) => Some(JvmThreads::new(layout)),
            Err(error) => {
                debug!(tgid = image.tgid, %error, "Java thread names are not read");
                None
            }
        };
        State::Java(Box::new(Jvm {
            layout,
            cache,
            namer: JavaNamer::new(),
            compiled: LruCache::new(
                NonZeroUsize::new(MAX_COMPILED_FRAMES).unwrap_or(NonZeroUsize::MIN),
            ),
            threads,
        }))
    }

    /// `firn_java_processes_total`'s counter for a JVM of major `version`.
    fn version_counter(&self, version: Option<u32>) -> &AtomicU64 {
        match version {
            Some(8) => &self.stats.java_processes_8,
            Some(11) => &self.stats.java_processes_11,
            Some(17) => &self.stats.java_processes_17,
            Some(21) => &self.stats.java_processes_21,
            Some(25) => &self.stats.java_processes_25,
            _ => &self.stats.java_processes_other,
        }
    }

    /// The mapping of the image's `libjvm.so` and its table symbols.
    fn find_jvm(
        &mut self,
        image: &ProcessImage,
        processes: &mut ProcessTable,
    ) -> Option<(usize, Result<JvmObject, Unusable>)> {
        let index = image.mappings.iter().position(|mapping| {
            mapping.spec.kind == MappingKind::File && file_name(&mapping.spec.path) == "libjvm.so"
        })?;
        let Some(object) = processes.object(image, index) else {
            return Some((index, Err(Unusable::Unreadable)));
        };
        let key = object.content_key();
        if let Some(found) = self.objects.get(&key) {
            return Some((index, found.clone()));
        }
        let found = match object.data() {
            Ok(data) => match inspect_object(&object.path, &data) {
                Ok(Some(found)) => Ok(found),
                Ok(None) => Err(Unusable::NoTables),
                Err(error) => {
                    debug!(path = object.path, %error, "not a HotSpot firn can read");
                    Err(Unusable::NoTables)
                }
            },
            Err(error) => {
                debug!(path = object.path, %error, "could not read libjvm.so");
                Err(Unusable::Unreadable)
            }
        };
        if self.objects.len() >= MAX_REMEMBERED_OBJECTS {
            self.objects.clear();
        }
        self.objects.insert(key, found.clone());
        Some((index, found))
    }

    /// Whether `tgid` is a JVM whose frames are unwound.
    pub fn is_java(&self, tgid: u32) -> bool {
        matches!(
            self.processes.get(&tgid),
            Some(Entry {
                state: State::Java(_),
                ..
            })
        )
    }

    /// The unwinder of `tgid`'s Java frames, recording into `found`.
    pub fn unwinder<'a>(&'a self, tgid: u32, found: &'a mut JavaFrames) -> Option<JvmUnwinder<'a>> {
        let Some(Entry {
            state: State::Java(jvm),
            ..
        }) = self.processes.get(&tgid)
        else {
            return None;
        };
        found.frames.clear();
        Some(JvmUnwinder {
            jvm,
            memory: ProcessMemory::new(tgid),
            found,
            stats: &self.stats,
            now: monotonic_ns(),
        })
    }

    /// `native` with the Java frames `found` named in place of their
    /// addresses (a compiled frame becomes one frame per scope), of a
    /// sample taken at `sampled_at` (`CLOCK_MONOTONIC`).
    pub fn splice(
        &mut self,
        tgid: u32,
        sampled_at: u64,
        native: Vec<u64>,
        found: &JavaFrames,
    ) -> Vec<UserFrame> {
        let Some(Entry {
            state: State::Java(jvm),
            ..
        }) = self.processes.get_mut(&tgid)
        else {
            return native.into_iter().map(UserFrame::Native).collect();
        };
        let mut memory = ProcessMemory::new(tgid);
        // The frames of the unwind that was kept: recorded at the depth and
        // address of a frame of `native` (others belong to an attempt that
        // was not kept).
        let mut recorded = found.frames.iter().peekable();
        let kept: Vec<Option<&Found>> = native
            .iter()
            .enumerate()
            .map(|(depth, &address)| {
                recorded.next_if(|found| found.depth == depth && found.ip == address)
            })
            .collect();
        // The blobs taken unread, checked at once: from the first that
        // changed on, the unwind went by what is no longer there.
        let unchecked: Vec<(usize, (u64, &CodeBlob))> = kept
            .iter()
            .enumerate()
            .filter_map(|(depth, found)| {
                let found = (*found)?;
                Some((depth, (found.ip, found.unchecked.as_ref()?)))
            })
            .collect();
        let blobs: Vec<(u64, &CodeBlob)> = unchecked.iter().map(|(_, blob)| *blob).collect();
        // Reads for this sample are made from now on: what was read after
        // the sample is believed without another read.
        let now = monotonic_ns();
        let changed = jvm
            .cache
            .check_at(&mut memory, &jvm.layout, &blobs, sampled_at, now)
            .map_or(usize::MAX, |index| unchecked[index].0);
        let mut out = Vec::with_capacity(native.len() + found.frames.len());
        for (depth, (&address, found)) in native.iter().zip(&kept).enumerate() {
            if depth >= changed {
                Stats::inc(&self.stats.java_name_stale);
                out.push(unknown());
                break;
            }
            match found {
                Some(found) => jvm.name(
                    &mut memory,
                    &self.stats,
                    &found.frame,
                    address,
                    (sampled_at, now),
                    &mut out,
                ),
                None => out.push(UserFrame::Native(address)),
            }
        }
        let counts = jvm.namer.take_counts();
        Stats::add(&self.stats.java_method_cache_hits, counts.hits);
        Stats::add(&self.stats.java_method_cache_misses, counts.misses);
        let blobs = jvm.cache.take_counts();
        Stats::add(&self.stats.java_blob_cache_hits, blobs.hits);
        Stats::add(&self.stats.java_blob_cache_misses, blobs.misses);
        out
    }

    /// The Java name of thread `tid` of `tgid`, if it is a JVM's thread
    /// whose name could be read; counted either way for a JVM.
    pub fn thread_name(&mut self, tgid: u32, tid: u32, now: Instant) -> Option<Arc<str>> {
        let Some(Entry {
            state: State::Java(jvm),
            ..
        }) = self.processes.get_mut(&tgid)
        else {
            return None;
        };
        let name = jvm
            .threads
            .as_mut()
            .and_then(|threads| threads.name(tgid, tid, now));
        Stats::inc(match name {
            Some(_) => &self.stats.java_thread_names_java,
            None => &self.stats.java_thread_names_comm,
        });
        name
    }

    /// The process executed a new image or exited.
    pub fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    /// Whether `tgid`'s image was looked at and holds no JVM.
    pub fn passed_over(&self, tgid: u32) -> bool {
        self.processes
            .get(&tgid)
            .is_some_and(|entry| matches!(entry.state, State::NotJava))
    }
}

/// The JVM's major version (`Abstract_VM_Version::_vm_major_version`),
/// if readable and sane.
fn major_version(memory: &mut dyn Memory, layout: &Layout) -> Option<u32> {
    let mut bytes = [0; 4];
    memory.read(layout.vm_major_version, &mut bytes).ok()?;
    let version = u32::from_ne_bytes(bytes);
    (1..1000).contains(&version).then_some(version)
}

/// `firn_java_frames_total`'s counter for frames of `kind`.
fn frame_counter(stats: &Stats, kind: FrameKind) -> &AtomicU64 {
    match kind {
        FrameKind::Interpreted => &stats.java_frames_interpreted,
        FrameKind::C1 => &stats.java_frames_c1,
        FrameKind::C2 => &stats.java_frames_c2,
        FrameKind::Inlined => &stats.java_frames_inlined,
        FrameKind::Native => &stats.java_frames_native,
    }
}

/// Whether naming failed because the frame's compiled method was gone or
/// replaced since the sample (rather than unreadable).
fn is_stale(error: &HotSpotError) -> bool {
    matches!(
        error,
        HotSpotError::Invalid {
            why: "gone since the sample",
            ..
        }
    )
}

fn kind_of(kind: FrameKind) -> JavaKind {
    match kind {
        FrameKind::Interpreted => JavaKind::Interpreted,
        FrameKind::C1 => JavaKind::C1,
        FrameKind::C2 => JavaKind::C2,
        FrameKind::Inlined => JavaKind::Inlined,
        FrameKind::Native => JavaKind::Native,
    }
}
