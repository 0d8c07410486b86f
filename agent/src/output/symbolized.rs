//! The symbolize step of the pipeline's tail: an aggregated interval ->
//! its stacks as indices into one table of distinct frames, each with its
//! mapping (path, build id, range), runtime address and source lines. The
//! objects behind the mappings ride along, so the frames firn could not
//! name tell which objects a server could symbolize instead.

mod frame_cache;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use agent_pprof::{Frame, Frames, Mapping, Origin};
use foldhash::{HashMap, HashSet};
pub use frame_cache::{FRAME_CACHE_BYTES, FrameCache};

use crate::{
    aggregate::{AggregatedProfile, StackKey, ThreadName},
    labels::ProcessMetadata,
    process::{MappingKind, ObjectFile, ProcessImage},
    runtimes::{InterpretedFrame, Runtime, UserFrame},
    symbolize::{FrameSymbolizer, Line},
};

/// One distinct stack of a process, symbolized.
#[derive(Debug)]
pub struct SymbolizedStack {
    pub image: Arc<ProcessImage>,
    pub metadata: Arc<ProcessMetadata>,
    pub tid: u32,
    /// Set when samples are labelled per thread.
    pub thread_name: Option<ThreadName>,
    /// Why an off-CPU sample's thread waited.
    pub reason: Option<&'static str>,
    pub count: u64,
    /// Indices into [`FrameTable::frames`], leaf first: kernel frames, then
    /// user frames.
    pub frames: Box<[usize]>,
}

/// The interval's distinct frames and mappings, and the object (if any)
/// behind each mapping.
#[derive(Debug, Default)]
pub struct FrameTable {
    pub frames: Frames,
    /// Parallel to `frames.mappings`.
    pub objects: Vec<Option<Arc<ObjectFile>>>,
}

impl FrameTable {
    /// The object a user frame lies in; the kernel has none here.
    pub fn object(&self, frame: usize) -> Option<&Arc<ObjectFile>> {
        let mapping = self.frames.frames.get(frame)?.mapping?;
        self.objects.get(mapping)?.as_ref()
    }

    /// Whether the frame lies in an object with a build id and has no name:
    /// what a server given that object's debug information could name.
    pub fn unnamed_in_object(&self, frame: usize) -> bool {
        self.frames.frames.get(frame).is_some_and(|f| {
            f.origin != Origin::Kernel
                && f.lines.is_empty()
                && self
                    .object(frame)
                    .is_some_and(|object| object.build_id().is_some())
        })
    }
}

/// An interval after the symbolize step.
#[derive(Debug)]
pub struct SymbolizedInterval {
    pub start: SystemTime,
    pub duration: Duration,
    pub table: FrameTable,
    pub stacks: Vec<SymbolizedStack>,
}

/// What makes a frame one pprof location: a kernel address, an address
/// outside every mapping, an address in one mapping of one image, or one
/// line of interpreted code.
#[derive(Clone, PartialEq, Eq, Hash)]
enum FrameKey {
    Kernel(u64),
    Unmapped(u64),
    Mapped {
        image: *const ProcessImage,
        index: usize,
        address: u64,
    },
    Interpreted(Arc<InterpretedFrame>),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum MappingKey {
    Kernel,
    User {
        image: *const ProcessImage,
        index: usize,
    },
    Interpreted(Runtime),
}

/// Where interpreted frames' locations lie: a mapping over the whole user
/// address space, so any location address (a small serial) fits.
const INTERPRETED_START: u64 = 1;
const INTERPRETED_LIMIT: u64 = 0x0000_8000_0000_0000;

struct Step<'a> {
    symbolizer: &'a mut dyn FrameSymbolizer,
    cache: &'a mut FrameCache,
    table: FrameTable,
    frame_ids: HashMap<FrameKey, usize>,
    mapping_ids: HashMap<MappingKey, usize>,
    /// User frames symbolized ahead, object by object.
    user_lines: HashMap<(*const ObjectFile, u64), Arc<[agent_pprof::Line]>>,
    unnamed: Arc<[agent_pprof::Line]>,
}

/// The address to symbolize for a user frame: return addresses (all but
/// the innermost frame) point after the call, which may be the first
/// instruction of the next function or line.
fn lookup_address(address: u64, is_return: bool) -> u64 {
    if is_return {
        address.saturating_sub(1)
    } else {
        address
    }
}

fn pprof_lines(lines: impl IntoIterator<Item = Line>) -> Arc<[agent_pprof::Line]> {
    lines
        .into_iter()
        .map(|line| agent_pprof::Line {
            function: line.function,
            system_name: line.system_name,
            file: line.file,
            line: line.line,
        })
        .collect()
}

/// Names every distinct frame of the interval once. A location's lines are
/// those of its first frame in stack order (a return address and an
/// interrupted instruction at one address are one location).
pub fn symbolize_interval(
    aggregated: AggregatedProfile,
    symbolizer: &mut dyn FrameSymbolizer,
    cache: &mut FrameCache,
) -> SymbolizedInterval {
    let mut step = Step {
        symbolizer,
        cache,
        table: FrameTable::default(),
        frame_ids: HashMap::default(),
        mapping_ids: HashMap::default(),
        user_lines: HashMap::default(),
        unnamed: Arc::from(Vec::new()),
    };
    step.symbolize_user_frames(&aggregated.stacks);
    let stacks = aggregated
        .stacks
        .into_iter()
        .map(|(key, count)| SymbolizedStack {
            frames: step.stack_frames(&key),
            image: key.image.0,
            metadata: key.metadata.0,
            tid: key.tid,
            thread_name: key.thread_name,
            reason: key.reason,
            count,
        })
        .collect();
    step.symbolizer.end_of_profile();
    SymbolizedInterval {
        start: aggregated.start,
        duration: aggregated.duration,
        table: step.table,
        stacks,
    }
}

impl Step<'_> {
    /// Symbolizes every distinct user frame in object order first: each
    /// object's tables are then built at most once per interval, even when
    /// the caches cannot hold all of them at once (frames of big objects
    /// interleave in the stacks).
    fn symbolize_user_frames(&mut self, stacks: &[(StackKey, u64)]) {
        let mut seen = HashSet::default();
        let mut wanted: Vec<(Arc<ObjectFile>, u64)> = Vec::new();
        for (key, _) in stacks {
            let image = &key.image.0;
            for (depth, address) in key.user.iter().enumerate() {
                let Some(address) = address.native() else {
                    continue;
                };
                let Some(index) = image.mapping_index(address) else {
                    continue;
                };
                let mapping = &image.mappings[index];
                let lookup = lookup_address(address, depth > 0);
                if let (Some(object), Some(vaddr)) =
                    (mapping.object(), mapping.object_vaddr(lookup))
                    && seen.insert((Arc::as_ptr(object), vaddr))
                {
                    wanted.push((object.clone(), vaddr));
                }
            }
        }
        wanted.sort_unstable_by_key(|(object, vaddr)| (Arc::as_ptr(object), *vaddr));
        for (object, vaddr) in wanted {
            let lines = self.named_user_frame(&object, vaddr);
            self.user_lines.insert((Arc::as_ptr(&object), vaddr), lines);
        }
    }

    fn named_user_frame(
        &mut self,
        object: &Arc<ObjectFile>,
        vaddr: u64,
    ) -> Arc<[agent_pprof::Line]> {
        let symbolizer = &mut *self.symbolizer;
        self.cache.get_or_name(object.content_key(), vaddr, || {
            pprof_lines(symbolizer.user(object, vaddr))
        })
    }

    fn stack_frames(&mut self, key: &StackKey) -> Box<[usize]> {
        let kernel = key.kernel.iter().map(|&address| self.kernel_frame(address));
        let mut frames: Vec<usize> = kernel.collect();
        for (depth, frame) in key.user.iter().enumerate() {
            frames.push(match frame {
                UserFrame::Native(address) => self.user_frame(&key.image.0, *address, depth > 0),
                UserFrame::Interpreted(frame) => self.interpreted_frame(frame),
            });
        }
        frames.into_boxed_slice()
    }

    fn push_frame(&mut self, key: FrameKey, frame: Frame) -> usize {
        let id = self.table.frames.frames.len();
        self.table.frames.frames.push(frame);
        self.frame_ids.insert(key, id);
        id
    }

    fn kernel_frame(&mut self, address: u64) -> usize {
        let key = FrameKey::Kernel(address);
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let mapping = self.kernel_mapping();
        let lines = pprof_lines(self.symbolizer.kernel(address));
        let frame = Frame {
            mapping: Some(mapping),
            address,
            origin: Origin::Kernel,
            lines,
        };
        self.push_frame(key, frame)
    }

    /// `is_return`: the address is a return address; the call lies just
    /// before it, which matters when the call is a function's last
    /// instruction.
    fn user_frame(&mut self, image: &Arc<ProcessImage>, address: u64, is_return: bool) -> usize {
        let Some(index) = image.mapping_index(address) else {
            let key = FrameKey::Unmapped(address);
            if let Some(&id) = self.frame_ids.get(&key) {
                return id;
            }
            let frame = Frame {
                mapping: None,
                address,
                origin: Origin::NoObject,
                lines: self.unnamed.clone(),
            };
            return self.push_frame(key, frame);
        };
        let key = FrameKey::Mapped {
            image: Arc::as_ptr(image),
            index,
            address,
        };
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let mapping_id = self.user_mapping(image, index);
        let mapping = &image.mappings[index];
        let lookup = lookup_address(address, is_return);
        let (origin, lines) = match (mapping.object(), mapping.object_vaddr(lookup)) {
            (Some(object), Some(vaddr)) => {
                let lines = match self.user_lines.get(&(Arc::as_ptr(object), vaddr)) {
                    Some(lines) => lines.clone(),
                    None => {
                        let object = object.clone();
                        self.named_user_frame(&object, vaddr)
                    }
                };
                (Origin::Object, lines)
            }
            // JIT code: named by the process's perf map, if it keeps one.
            _ if mapping.spec.kind == MappingKind::Anonymous => {
                let line = image
                    .perf_map()
                    .and_then(|perf_map| self.symbolizer.jit(&perf_map, lookup));
                (Origin::NoObject, pprof_lines(line))
            }
            _ => (Origin::NoObject, self.unnamed.clone()),
        };
        let frame = Frame {
            mapping: Some(mapping_id),
            address,
            origin,
            lines,
        };
        self.push_frame(key, frame)
    }

    fn interpreted_frame(&mut self, frame: &Arc<InterpretedFrame>) -> usize {
        let key = FrameKey::Interpreted(frame.clone());
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let mapping = self.interpreted_mapping(frame.runtime);
        let function = frame.function.to_string();
        let line = agent_pprof::Line {
            system_name: function.clone(),
            function,
            file: (!frame.file.is_empty()).then(|| frame.file.to_string()),
            line: (frame.line > 0).then_some(frame.line),
        };
        let frame = Frame {
            mapping: Some(mapping),
            // Interpreted code has no address of its own; a serial keeps
            // the locations apart for readers that key them by address.
            address: INTERPRETED_START + self.table.frames.frames.len() as u64,
            origin: Origin::NoObject,
            lines: Arc::from([line]),
        };
        self.push_frame(key, frame)
    }

    fn interpreted_mapping(&mut self, runtime: Runtime) -> usize {
        let key = MappingKey::Interpreted(runtime);
        if let Some(&id) = self.mapping_ids.get(&key) {
            return id;
        }
        let mapping = Mapping {
            path: runtime.mapping_name().to_owned(),
            build_id: String::new(),
            start: INTERPRETED_START,
            limit: INTERPRETED_LIMIT,
            offset: 0,
            kernel: false,
        };
        self.push_mapping(key, mapping, None)
    }

    fn push_mapping(
        &mut self,
        key: MappingKey,
        mapping: Mapping,
        object: Option<Arc<ObjectFile>>,
    ) -> usize {
        let id = self.table.frames.mappings.len();
        self.table.frames.mappings.push(mapping);
        self.table.objects.push(object);
        self.mapping_ids.insert(key, id);
        id
    }

    fn kernel_mapping(&mut self) -> usize {
        if let Some(&id) = self.mapping_ids.get(&MappingKey::Kernel) {
            return id;
        }
        let build_id = self
            .symbolizer
            .kernel_build_id()
            .map(|id| id.to_hex())
            .unwrap_or_default();
        self.push_mapping(MappingKey::Kernel, Mapping::kernel(build_id), None)
    }

    fn user_mapping(&mut self, image: &Arc<ProcessImage>, index: usize) -> usize {
        let key = MappingKey::User {
            image: Arc::as_ptr(image),
            index,
        };
        if let Some(&id) = self.mapping_ids.get(&key) {
            return id;
        }
        let mapping = &image.mappings[index];
        let spec = &mapping.spec;
        let path = match spec.kind {
            MappingKind::File | MappingKind::Vdso => spec.path.clone(),
            MappingKind::Anonymous if spec.path.is_empty() => "[anon]".to_owned(),
            MappingKind::Anonymous => spec.path.clone(),
        };
        let object = mapping.object().cloned();
        let build_id = object
            .as_ref()
            .and_then(|object| object.build_id())
            .map(|id| id.to_hex())
            .unwrap_or_default();
        let pprof_mapping = Mapping {
            path,
            build_id,
            start: spec.start,
            limit: spec.end,
            offset: spec.offset,
            kernel: false,
        };
        self.push_mapping(key, pprof_mapping, object)
    }
}

#[cfg(test)]
mod tests;
