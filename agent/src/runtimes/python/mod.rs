//! CPython: finds interpreter processes in their images, hands the BPF
//! walker each one's layout (`PYTHON_PROCESSES`), and names the frames it
//! recorded from the process's memory, through `agent_runtimes::python`.
//! A process caught before its loader ran is read again shortly (`loading`).

mod loading;
mod shared;
mod thread_pointer;

use std::{
    collections::{HashMap, HashSet},
    ops::Range,
    sync::Arc,
};

use agent_common::{ExecutableKey, InterpreterFrame, InterpreterProcess, interpreter_frame_flags};
use agent_elf::{ContentKey, SharedBytes};
use agent_runtimes::{
    libc::{LibcKind, glibc_thread_specific_offset, libc_kind},
    python::{
        NameError, PythonNamer, PythonObject, PythonVersion, SharedObject, inspect_mapped_object,
        walker_layout,
    },
};
use loading::{Loading, WAKE_FOR, loader_pending, wake_until_ms};
pub use thread_pointer::ThreadPointerLookup;
use tracing::{debug, info};

use super::{
    InterpretedFrame, InterpreterMap, MAX_REMEMBERED_OBJECTS, NamedFrame, ProcessMemory, Runtime,
    file_name, find_runtime_object, load_bias, remember,
};
use crate::{
    process::{MappingKind, ProcessImage, ProcessTable},
    stats::Stats,
};

/// What the Python support does.
#[derive(Clone, Debug)]
pub struct PythonConfig {
    /// Walk and name Python frames (`--python`).
    pub enabled: bool,
    /// Bytes of decoded code objects kept (names, files, line tables).
    pub code_cache_bytes: usize,
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            code_cache_bytes: 16 << 20,
        }
    }
}

/// Why a Python process's frames are not walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SkipReason {
    UnsupportedVersion,
    MissingSymbols,
    Musl,
    LibcUnknown,
    MapFull,
    Unreadable,
    NoThreadPointer,
}

/// A process as the runtime last saw it.
enum ProcessState {
    NotPython,
    Python(Registered),
    Skipped,
    /// An interpreter (or an executable that loads `libpython`) whose
    /// loader had not run: read again `reads` times since.
    Loading {
        reads: u32,
    },
}

struct Registered {
    version: PythonVersion,
    /// Runtime addresses of the native interpreter loop.
    eval_loop: Range<u64>,
    /// Unique per registration: keys the namer's cache, so a reused pid
    /// never hits the previous process's code objects.
    key: u64,
    /// The interpreter object, for the code objects in its data that the
    /// namer shares with the object's other processes of the same owner.
    shared: Option<SharedObject>,
}

struct Entry {
    /// The image looked at (by identity): a new image (after an exec, or
    /// maps re-read after a library was loaded) is looked at again.
    image: *const ProcessImage,
    state: ProcessState,
}

pub struct PythonRuntime {
    map: Box<dyn InterpreterMap>,
    /// `task_struct`'s thread pointer offset, read from the kernel's BTF
    /// on a thread of its own (parsing it takes a good part of a second of
    /// CPU, which neither start-up nor the drain should wait for); `None`
    /// inside once the BTF did not tell.
    thread_pointer: ThreadPointerLookup,
    processes: HashMap<u32, Entry>,
    max_processes: usize,
    interpreters: HashMap<ContentKey, Result<Option<PythonObject>, SkipReason>>,
    libcs: HashMap<ContentKey, Result<u32, SkipReason>>,
    /// Executables that load `libpython3.*`, by object.
    launchers: HashMap<ContentKey, bool>,
    /// Executables whose layout the BPF program sets at their exec.
    registered_at_exec: HashSet<ExecutableKey>,
    loading: Loading,
    namer: PythonNamer,
    next_key: u64,
    stats: Arc<Stats>,
}

impl PythonRuntime {
    pub fn new(
        config: &PythonConfig,
        thread_pointer: ThreadPointerLookup,
        map: Box<dyn InterpreterMap>,
        max_processes: usize,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            map,
            thread_pointer,
            processes: HashMap::new(),
            max_processes,
            interpreters: HashMap::new(),
            libcs: HashMap::new(),
            launchers: HashMap::new(),
            registered_at_exec: HashSet::new(),
            loading: Loading::default(),
            namer: PythonNamer::new(config.code_cache_bytes),
            next_key: 1,
            stats,
        }
    }

    /// Looks at a process image once: registers it with the walker if it
    /// runs a supported CPython.
    pub fn observe(&mut self, image: &Arc<ProcessImage>, processes: &mut ProcessTable) {
        if image.gone || image.mappings.is_empty() {
            return;
        }
        // Until the thread pointer's offset is known nothing can be
        // registered; the process is looked at again on its next sample.
        let Some(thread_pointer) = self.thread_pointer.get() else {
            return;
        };
        let tgid = image.tgid;
        if let Some(entry) = self.processes.get(&tgid)
            && std::ptr::eq(entry.image, Arc::as_ptr(image))
        {
            return;
        }
        if !self.processes.contains_key(&tgid) && self.processes.len() >= self.max_processes {
            // Keep the interpreters (at most the BPF map's size, far below
            // the table's); forget the rest, they are cheap to look at again.
            self.processes.retain(|_, entry| {
                matches!(
                    entry.state,
                    ProcessState::Python(_) | ProcessState::Loading { .. }
                )
            });
        }
        // The image before this one was registered under its own key: its
        // cached code objects are of no use to the new one.
        let reads = match self.processes.remove(&tgid) {
            Some(Entry {
                state: ProcessState::Python(old),
                ..
            }) => {
                self.namer.forget(old.key);
                0
            }
            Some(Entry {
                state: ProcessState::Loading { reads },
                ..
            }) => reads,
            _ => 0,
        };
        let state = self.inspect(image, processes, thread_pointer, reads);
        if !matches!(state, ProcessState::Python(_)) {
            // An entry of an earlier image must not walk this one.
            self.map.remove(tgid);
        }
        self.processes.insert(
            tgid,
            Entry {
                image: Arc::as_ptr(image),
                state,
            },
        );
    }

    fn inspect(
        &mut self,
        image: &ProcessImage,
        processes: &mut ProcessTable,
        thread_pointer: Option<u32>,
        reads: u32,
    ) -> ProcessState {
        let Some((index, object)) = self.find_interpreter(image, processes) else {
            if loader_pending(image) && self.launches_libpython(image, processes) {
                return self.wait_for_loader(image.tgid, reads);
            }
            return ProcessState::NotPython;
        };
        let object = match object {
            Ok(object) => object,
            Err(reason) => return self.skip(image, reason, None),
        };
        let Some(thread_pointer) = thread_pointer else {
            return self.skip(image, SkipReason::NoThreadPointer, Some(object.version));
        };
        if loader_pending(image) {
            return self.wait_for_loader(image.tgid, reads);
        }
        let tsd_first_block = match self.find_libc(image, processes) {
            Ok(offset) => offset,
            Err(reason) => return self.skip(image, reason, Some(object.version)),
        };
        let Some(bias) = load_bias(image, index) else {
            return self.skip(image, SkipReason::Unreadable, Some(object.version));
        };
        let layout = match walker_layout(
            object.version,
            object.runtime.wrapping_add(bias),
            object.code_type.wrapping_add(bias),
            tsd_first_block,
        ) {
            Ok(layout) => {
                InterpreterProcess::python(thread_pointer, wake_until_ms(WAKE_FOR), layout)
            }
            Err(_) => {
                return self.skip(image, SkipReason::UnsupportedVersion, Some(object.version));
            }
        };
        if let Err(error) = self.map.set(image.tgid, layout) {
            debug!(error = %crate::logging::error_chain(&error), "Python process not registered");
            return self.skip(image, SkipReason::MapFull, Some(object.version));
        }
        self.register_executable(image, index, bias, layout);
        self.count_version(object.version);
        // Its samples need not wait for better maps: what the walker and
        // the namer need is mapped, and its frames are named only while it
        // lives.
        processes.settled(image.tgid);
        debug!(
            tgid = image.tgid,
            comm = image.comm,
            version = %object.version,
            "walking the Python frames of a process"
        );
        let key = self.next_key;
        self.next_key += 1;
        ProcessState::Python(Registered {
            version: object.version,
            eval_loop: object.eval_loop.start.wrapping_add(bias)
                ..object.eval_loop.end.wrapping_add(bias),
            key,
            shared: shared::shared_object(processes.proc_root(), image, index, bias),
        })
    }

    /// The mapping of the image's CPython interpreter (the executable or a
    /// `libpython`), and what it is.
    #[allow(clippy::type_complexity)]
    fn find_interpreter(
        &mut self,
        image: &ProcessImage,
        processes: &mut ProcessTable,
    ) -> Option<(usize, Result<PythonObject, SkipReason>)> {
        let (index, found) = find_runtime_object(
            image,
            processes,
            &mut self.interpreters,
            |path| file_name(path).contains("python"),
            |path, object| match object.data() {
                Ok(data) => inspect_mapped_object(file_name(path), &data, &|| data.release_pages())
                    .map_err(|error| {
                        debug!(path, %error, "not a CPython firn can walk");
                        skip_reason(&error)
                    }),
                Err(error) => {
                    debug!(path, %error, "could not read object");
                    Err(SkipReason::Unreadable)
                }
            },
            |found| !matches!(found, Ok(None)),
        )?;
        match found {
            Ok(None) => None,
            Ok(Some(object)) => Some((index, Ok(object))),
            Err(reason) => Some((index, Err(reason))),
        }
    }

    /// glibc's thread-specific data offset, read off `pthread_getspecific`:
    /// in `libpthread.so.0` before glibc 2.34, in `libc.so.6` since (where
    /// libpthread is an empty stub), in the executable of a static build.
    fn find_libc(
        &mut self,
        image: &ProcessImage,
        processes: &mut ProcessTable,
    ) -> Result<u32, SkipReason> {
        let mut libc = None;
        let mut libpthread = None;
        for (index, mapping) in image.mappings.iter().enumerate() {
            if mapping.spec.kind != MappingKind::File {
                continue;
            }
            let name = file_name(&mapping.spec.path);
            match libc_kind(name) {
                Some(LibcKind::Musl) => return Err(SkipReason::Musl),
                Some(LibcKind::Glibc) if libc.is_none() => libc = Some(index),
                _ if name.starts_with("libpthread") && libpthread.is_none() => {
                    libpthread = Some(index);
                }
                _ => {}
            }
        }
        let executable = image
            .mappings
            .iter()
            .position(|m| Some(m.spec.path.as_str()) == image.executable());
        let candidates = match libc {
            Some(libc) => [libpthread, Some(libc)],
            None => [libpthread, executable],
        };
        let mut outcome = Err(SkipReason::LibcUnknown);
        for index in candidates.into_iter().flatten() {
            outcome = self.thread_specific_offset(image, index, processes);
            if outcome.is_ok() {
                break;
            }
        }
        outcome
    }

    fn thread_specific_offset(
        &mut self,
        image: &ProcessImage,
        index: usize,
        processes: &mut ProcessTable,
    ) -> Result<u32, SkipReason> {
        let object = processes
            .object(image, index)
            .ok_or(SkipReason::Unreadable)?;
        let key = object.content_key();
        if let Some(found) = self.libcs.get(&key) {
            return *found;
        }
        let found = match object.data() {
            Ok(data) => glibc_thread_specific_offset(&data).map_err(|error| {
                debug!(path = object.path, %error, "no pthread_getspecific firn can read");
                SkipReason::LibcUnknown
            }),
            Err(_) => Err(SkipReason::Unreadable),
        };
        remember(&mut self.libcs, key, found);
        found
    }

    fn skip(
        &mut self,
        image: &ProcessImage,
        reason: SkipReason,
        version: Option<PythonVersion>,
    ) -> ProcessState {
        let stats = &self.stats;
        Stats::inc(match reason {
            SkipReason::UnsupportedVersion => &stats.python_skipped_version,
            SkipReason::MissingSymbols => &stats.python_skipped_symbols,
            SkipReason::Musl => &stats.python_skipped_musl,
            SkipReason::LibcUnknown => &stats.python_skipped_libc,
            SkipReason::MapFull => &stats.python_skipped_map_full,
            SkipReason::Unreadable => &stats.python_skipped_unreadable,
            SkipReason::NoThreadPointer => &stats.python_skipped_thread_pointer,
        });
        info!(
            tgid = image.tgid,
            comm = image.comm,
            version = version.map(|v| v.to_string()).unwrap_or_default(),
            reason = ?reason,
            "Python frames of this process are not walked; its native frames are"
        );
        ProcessState::Skipped
    }

    fn count_version(&self, version: PythonVersion) {
        let stats = &self.stats;
        let counter = match version.minor {
            8 => &stats.python_processes_3_8,
            9 => &stats.python_processes_3_9,
            10 => &stats.python_processes_3_10,
            11 => &stats.python_processes_3_11,
            12 => &stats.python_processes_3_12,
            _ => &stats.python_processes_3_13,
        };
        Stats::inc(counter);
    }

    /// The recorded frames of a sample of `tgid`, named now, while the
    /// process is alive; empty if it is not a registered interpreter.
    pub fn name(&mut self, tgid: u32, frames: &[InterpreterFrame]) -> Vec<NamedFrame> {
        let Some(Entry {
            state: ProcessState::Python(registered),
            ..
        }) = self.processes.get(&tgid)
        else {
            return Vec::new();
        };
        let mut memory = ProcessMemory::new(tgid);
        let named = frames
            .iter()
            .map(|frame| {
                let named = match self.namer.name_shared(
                    registered.key,
                    registered.shared.as_ref(),
                    registered.version,
                    &mut memory,
                    frame,
                ) {
                    Ok(python) => InterpretedFrame {
                        runtime: Runtime::Python,
                        function: python.function,
                        file: python.file,
                        line: python.line,
                    },
                    Err(error) => {
                        debug!(tgid, %error, "Python frame not named");
                        if matches!(error, NameError::Stale { .. } | NameError::NotCode { .. }) {
                            Stats::inc(&self.stats.python_name_stale);
                        } else {
                            Stats::inc(&self.stats.python_name_failures);
                        }
                        unknown_frame()
                    }
                };
                NamedFrame {
                    frame: Arc::new(named),
                    entry: frame.flags & interpreter_frame_flags::ENTRY != 0,
                }
            })
            .collect();
        let counts = self.namer.take_counts();
        Stats::add(&self.stats.python_code_cache_hits, counts.hits);
        Stats::add(
            &self.stats.python_code_cache_shared_hits,
            counts.shared_hits,
        );
        Stats::add(&self.stats.python_code_cache_misses, counts.misses);
        Stats::add(&self.stats.python_code_cache_evictions, counts.evictions);
        named
    }

    /// Runtime addresses of the native interpreter loop of `tgid`.
    pub fn eval_loop(&self, tgid: u32) -> Option<Range<u64>> {
        match &self.processes.get(&tgid)?.state {
            ProcessState::Python(registered) => Some(registered.eval_loop.clone()),
            _ => None,
        }
    }

    /// The process executed a new image (the BPF program dropped its entry
    /// already) or exited.
    /// Whether `tgid`'s image was looked at and runs no CPython, nor
    /// waits for its loader to map one.
    pub fn passed_over(&self, tgid: u32) -> bool {
        self.processes
            .get(&tgid)
            .is_some_and(|entry| matches!(entry.state, ProcessState::NotPython))
    }

    pub fn forget(&mut self, tgid: u32) {
        self.loading.forget(tgid);
        if let Some(Entry {
            state: ProcessState::Python(registered),
            ..
        }) = self.processes.remove(&tgid)
        {
            self.namer.forget(registered.key);
        }
    }
}

/// A frame whose code object could not be read, or had changed.
fn unknown_frame() -> InterpretedFrame {
    InterpretedFrame {
        runtime: Runtime::Python,
        function: "<unknown>".into(),
        file: "".into(),
        line: 0,
    }
}

fn skip_reason(error: &agent_runtimes::python::PythonError) -> SkipReason {
    use agent_runtimes::python::PythonError;
    match error {
        PythonError::UnsupportedVersion { .. }
        | PythonError::UnknownVersion
        | PythonError::UnsupportedBuild { .. } => SkipReason::UnsupportedVersion,
        PythonError::MissingSymbol { .. } => SkipReason::MissingSymbols,
        _ => SkipReason::Unreadable,
    }
}
