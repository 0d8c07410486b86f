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
    path::Path,
    sync::{Arc, atomic::AtomicU64},
    time::{Duration, Instant},
};

use agent_elf::ContentKey;
use agent_runtimes::{
    Memory,
    hotspot::{
        CodeCache, FrameKind, FrameRegs, HotSpotError, JavaFrame, JavaNamer, JvmObject, Layout,
        ObjectLayout, ThreadLayout, VmTables, inspect_object, java_threads, step,
    },
};
use agent_unwind::{ForeignFrame, ForeignStep, StackCopy};
use tracing::{debug, info};

use super::{InterpretedFrame, JavaKind, ProcessMemory, Runtime, UserFrame};
use crate::{
    process::{MappingKind, ProcessImage, ProcessTable},
    stats::Stats,
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
    threads: Option<JvmThreads>,
}

/// Most thread names remembered of one JVM.
const MAX_THREAD_NAMES: usize = 4096;

/// How long a JVM's thread names are believed (a thread may rename
/// itself), and how soon after a read an unknown thread reads them again.
const THREAD_NAMES_FRESH: Duration = Duration::from_secs(10);
const THREAD_NAMES_RETRY: Duration = Duration::from_secs(1);

/// The Java names of one JVM's threads, as last read.
struct JvmThreads {
    layout: ThreadLayout,
    /// Read once the JVM has loaded `Thread` and `String`.
    objects: Option<ObjectLayout>,
    names: HashMap<u32, Arc<str>>,
    read_at: Option<Instant>,
}

impl JvmThreads {
    fn name(&mut self, tgid: u32, tid: u32) -> Option<Arc<str>> {
        let age = self.read_at.map(|at| at.elapsed());
        let stale = match age {
            None => true,
            Some(age) => {
                age > THREAD_NAMES_FRESH
                    || (!self.names.contains_key(&tid) && age > THREAD_NAMES_RETRY)
            }
        };
        if stale {
            self.read_at = Some(Instant::now());
            self.names.clear();
            if let Err(error) = self.read(tgid) {
                debug!(tgid, %error, "Java thread names not read");
            }
        }
        self.names.get(&tid).cloned()
    }

    fn read(&mut self, tgid: u32) -> Result<(), HotSpotError> {
        let mut memory = ProcessMemory::new(tgid);
        let objects = match &self.objects {
            Some(objects) => objects,
            None => self
                .objects
                .insert(ObjectLayout::read(&mut memory, &self.layout)?),
        };
        for (tid, thread) in java_threads(&mut memory, &self.layout)? {
            if self.names.len() >= MAX_THREAD_NAMES {
                break;
            }
            if thread == 0 {
                continue;
            }
            match objects.thread_name(&mut memory, &self.layout, thread) {
                Ok(name) => {
                    self.names.insert(tid, name.into());
                }
                Err(error) => debug!(tgid, tid, %error, "Java thread name not read"),
            }
        }
        Ok(())
    }
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
    frames: Vec<(usize, u64, JavaFrame)>,
}

/// One process's JVM as the unwinder asks about its frames.
pub struct JvmUnwinder<'a> {
    jvm: &'a Jvm,
    memory: ProcessMemory,
    found: &'a mut JavaFrames,
    stats: &'a Stats,
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
        let blob = match jvm.cache.find(&mut self.memory, &jvm.layout, lookup) {
            Ok(Some(blob)) => blob,
            Ok(None) => {
                Stats::inc(&self.stats.java_unwind_failures);
                return Some(ForeignStep::Stop);
            }
            Err(error) => {
                debug!(%error, "no code blob for a Java frame");
                Stats::inc(&self.stats.java_unwind_failures);
                return Some(ForeignStep::Stop);
            }
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
                self.found.frames.push((frame.depth, frame.ip, step.frame));
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
            Ok(layout) => Some(JvmThreads {
                layout,
                objects: None,
                names: HashMap::new(),
                read_at: None,
            }),
            Err(error) => {
                debug!(tgid = image.tgid, %error, "Java thread names are not read");
                None
            }
        };
        State::Java(Box::new(Jvm {
            layout,
            cache,
            namer: JavaNamer::new(),
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
        })
    }

    /// `native` with the Java frames `found` named in place of their
    /// addresses (a compiled frame becomes one frame per scope).
    pub fn splice(&mut self, tgid: u32, native: Vec<u64>, found: &JavaFrames) -> Vec<UserFrame> {
        let Some(Entry {
            state: State::Java(jvm),
            ..
        }) = self.processes.get_mut(&tgid)
        else {
            return native.into_iter().map(UserFrame::Native).collect();
        };
        let mut memory = ProcessMemory::new(tgid);
        let mut out = Vec::with_capacity(native.len() + found.frames.len());
        let mut recorded = found.frames.iter().peekable();
        for (depth, &address) in native.iter().enumerate() {
            // Frames recorded at a depth whose address is not this one's
            // belong to an unwind that was not kept.
            let Some((_, _, frame)) =
                recorded.next_if(|(at, ip, _)| *at == depth && *ip == address)
            else {
                out.push(UserFrame::Native(address));
                continue;
            };
            if let JavaFrame::Stub { name } = frame {
                // Generated code of the JVM: named by its blob, a frame of
                // the JVM rather than of Java.
                out.push(UserFrame::Interpreted(Arc::new(InterpretedFrame {
                    runtime: Runtime::Java(JavaKind::Generated),
                    function: format!("[{name}]").into(),
                    file: "".into(),
                    line: 0,
                })));
                continue;
            }
            match jvm.namer.name(&mut memory, &jvm.layout, &jvm.cache, frame) {
                Ok(named) if named.is_empty() => out.push(UserFrame::Native(address)),
                Ok(named) => {
                    for frame in &named {
                        Stats::inc(frame_counter(&self.stats, frame.kind));
                    }
                    out.extend(named.into_iter().map(|named| {
                        UserFrame::Interpreted(Arc::new(InterpretedFrame {
                            runtime: Runtime::Java(kind_of(named.kind)),
                            function: named.method.function().into(),
                            file: named.method.file.clone(),
                            line: named.line,
                        }))
                    }));
                }
                Err(error) => {
                    debug!(tgid, %error, ?frame, "Java frame not named");
                    Stats::inc(match is_stale(&error) {
                        true => &self.stats.java_name_stale,
                        false => &self.stats.java_name_failures,
                    });
                    out.push(UserFrame::Interpreted(Arc::new(InterpretedFrame {
                        runtime: Runtime::Java(JavaKind::Generated),
                        function: "<unknown>".into(),
                        file: "".into(),
                        line: 0,
                    })));
                }
            }
        }
        let counts = jvm.namer.take_counts();
        Stats::add(&self.stats.java_method_cache_hits, counts.hits);
        Stats::add(&self.stats.java_method_cache_misses, counts.misses);
        out
    }

    /// The Java name of thread `tid` of `tgid`, if it is a JVM's thread
    /// whose name could be read; counted either way for a JVM.
    pub fn thread_name(&mut self, tgid: u32, tid: u32) -> Option<Arc<str>> {
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
            .and_then(|threads| threads.name(tgid, tid));
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

fn file_name(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or(path)
}

/// What to add to the object's link-time addresses to get the process's.
fn load_bias(image: &ProcessImage, index: usize) -> Option<u64> {
    let mapping = image.mappings.get(index)?;
    let object = mapping.object()?;
    let vaddr = object.layout.vaddr_for_file_offset(mapping.spec.offset)?;
    Some(mapping.spec.start.wrapping_sub(vaddr))
}
