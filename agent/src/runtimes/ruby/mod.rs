//! CRuby: finds Ruby processes in their images, hands the BPF walker each
//! one's layout (`INTERPRETER_PROCESSES`, kind Ruby), and names the
//! control frames it recorded from the process's memory, through
//! `agent_runtimes::ruby`, spliced where the native interpreter loop
//! (`vm_exec_core`) ran them.

use std::{collections::HashMap, ops::Range, sync::Arc};

use agent_common::{InterpreterFrame, InterpreterProcess, interpreter_frame_flags};
use agent_elf::{ContentKey, SharedBytes};
use agent_runtimes::ruby::{
    NameError, RubyError, RubyNamer, RubyObject, RubyProcess, RubyVersion, inspect_object,
    walker_layout,
};
use tracing::{debug, info};

use super::{
    InterpretedFrame, InterpreterMap, NamedFrame, ProcessMemory, Runtime, RuntimeSupport, Spliced,
    ThreadPointerLookup, file_name, find_runtime_object, load_bias, splice_leaf_settling,
};
use crate::{
    process::{ProcessImage, ProcessTable},
    sampler::RawSample,
    stats::Stats,
};

/// What the Ruby support does.
#[derive(Clone, Debug)]
pub struct RubyConfig {
    /// Walk and name Ruby frames (`--ruby`).
    pub enabled: bool,
    /// Bytes of decoded instruction sequences and names kept.
    pub cache_bytes: usize,
}

impl Default for RubyConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            cache_bytes: 16 << 20,
        }
    }
}

/// Why a Ruby process's frames are not walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SkipReason {
    UnsupportedVersion,
    MissingSymbols,
    MapFull,
    Unreadable,
    NoThreadPointer,
}

enum ProcessState {
    NotRuby,
    Ruby(Registered),
    Skipped,
}

struct Registered {
    process: RubyProcess,
    /// Runtime addresses of the native interpreter loop.
    eval_loop: Range<u64>,
}

struct Entry {
    /// The image looked at (by identity): a new image is looked at again.
    image: *const ProcessImage,
    state: ProcessState,
}

pub struct RubyRuntime {
    map: Box<dyn InterpreterMap>,
    thread_pointer: ThreadPointerLookup,
    processes: HashMap<u32, Entry>,
    max_processes: usize,
    interpreters: HashMap<ContentKey, Result<Option<RubyObject>, SkipReason>>,
    namer: RubyNamer,
    next_key: u64,
    stats: Arc<Stats>,
}

impl RubyRuntime {
    pub fn new(
        config: &RubyConfig,
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
            namer: RubyNamer::new(config.cache_bytes),
            next_key: 1,
            stats,
        }
    }

    fn inspect(
        &mut self,
        image: &ProcessImage,
        processes: &mut ProcessTable,
        thread_pointer: Option<u32>,
    ) -> ProcessState {
        let Some((index, found)) = find_runtime_object(
            image,
            processes,
            &mut self.interpreters,
            |path| file_name(path).contains("ruby"),
            |path, object| match object.data() {
                Ok(data) => {
                    let found = inspect_object(file_name(path), &data);
                    data.release_pages();
                    found.map_err(|error| {
                        debug!(path, %error, "not a CRuby firn can walk");
                        skip_reason(&error)
                    })
                }
                Err(error) => {
                    debug!(path, %error, "could not read object");
                    Err(SkipReason::Unreadable)
                }
            },
            |found| !matches!(found, Ok(None)),
        ) else {
            return ProcessState::NotRuby;
        };
        let object = match found {
            Ok(Some(object)) => object,
            Ok(None) => return ProcessState::NotRuby,
            Err(reason) => return self.skip(image, reason, None),
        };
        let Some(thread_pointer) = thread_pointer else {
            return self.skip(image, SkipReason::NoThreadPointer, Some(object.version));
        };
        let Some(bias) = load_bias(image, index) else {
            return self.skip(image, SkipReason::Unreadable, Some(object.version));
        };
        let layout = match walker_layout(object.version, object.context_global.wrapping_add(bias)) {
            Ok(layout) => InterpreterProcess::ruby(thread_pointer, 0, layout),
            Err(_) => {
                return self.skip(image, SkipReason::UnsupportedVersion, Some(object.version));
            }
        };
        if let Err(error) = self.map.set(image.tgid, layout) {
            debug!(error = %crate::logging::error_chain(&error), "Ruby process not registered");
            return self.skip(image, SkipReason::MapFull, Some(object.version));
        }
        self.count_version(object.version);
        processes.settled(image.tgid);
        debug!(
            tgid = image.tgid,
            comm = image.comm,
            version = %object.version,
            "walking the Ruby frames of a process"
        );
        let key = self.next_key;
        self.next_key += 1;
        ProcessState::Ruby(Registered {
            process: RubyProcess {
                key,
                version: object.version,
                symbols: object.symbols.wrapping_add(bias),
            },
            eval_loop: object.eval_loop.start.wrapping_add(bias)
                ..object.eval_loop.end.wrapping_add(bias),
        })
    }

    fn skip(
        &mut self,
        image: &ProcessImage,
        reason: SkipReason,
        version: Option<RubyVersion>,
    ) -> ProcessState {
        let stats = &self.stats;
        Stats::inc(match reason {
            SkipReason::UnsupportedVersion => &stats.ruby_skipped_version,
            SkipReason::MissingSymbols => &stats.ruby_skipped_symbols,
            SkipReason::MapFull => &stats.ruby_skipped_map_full,
            SkipReason::Unreadable => &stats.ruby_skipped_unreadable,
            SkipReason::NoThreadPointer => &stats.ruby_skipped_thread_pointer,
        });
        info!(
            tgid = image.tgid,
            comm = image.comm,
            version = version.map(|v| v.to_string()).unwrap_or_default(),
            reason = ?reason,
            "Ruby frames of this process are not walked; its native frames are"
        );
        ProcessState::Skipped
    }

    fn count_version(&self, version: RubyVersion) {
        let stats = &self.stats;
        Stats::inc(match (version.major, version.minor) {
            (2, 7) => &stats.ruby_processes_2_7,
            (3, 1) => &stats.ruby_processes_3_1,
            (3, 3) => &stats.ruby_processes_3_3,
            (3, 4) => &stats.ruby_processes_3_4,
            _ => &stats.ruby_processes_other,
        });
    }

    /// The recorded frames of a sample, named now, while the process is
    /// alive: those a Ruby user sees, innermost first, each run of one
    /// interpreter loop call ending at an entry.
    fn name(
        &mut self,
        registered: &Registered,
        tgid: u32,
        frames: &[InterpreterFrame],
    ) -> Vec<NamedFrame> {
        let mut memory = ProcessMemory::new(tgid);
        let mut named: Vec<NamedFrame> = Vec::with_capacity(frames.len());
        for frame in frames {
            let entry = frame.flags & interpreter_frame_flags::ENTRY != 0;
            let interpreted = match self.namer.name(&registered.process, &mut memory, frame) {
                Ok(Some(ruby)) => InterpretedFrame {
                    runtime: Runtime::Ruby,
                    function: ruby.function,
                    file: ruby.file,
                    line: ruby.line,
                },
                // A frame users do not see (the VM's own): an entry it
                // marks ends the run of the frames before it.
                Ok(None) => {
                    if entry && let Some(last) = named.last_mut() {
                        last.entry = true;
                    }
                    continue;
                }
                Err(error) => {
                    debug!(tgid, %error, "Ruby frame not named");
                    Stats::inc(match error {
                        NameError::NotIseq { .. } | NameError::NotMethodEntry { .. } => {
                            &self.stats.ruby_name_stale
                        }
                        _ => &self.stats.ruby_name_failures,
                    });
                    InterpretedFrame {
                        runtime: Runtime::Ruby,
                        function: "<unknown>".into(),
                        file: "".into(),
                        line: 0,
                    }
                }
            };
            named.push(NamedFrame {
                frame: Arc::new(interpreted),
                entry,
            });
        }
        let counts = self.namer.take_counts();
        Stats::add(&self.stats.ruby_cache_hits, counts.hits);
        Stats::add(&self.stats.ruby_cache_misses, counts.misses);
        Stats::add(&self.stats.ruby_cache_evictions, counts.evictions);
        named
    }
}

impl RuntimeSupport for RubyRuntime {
    fn runtime(&self) -> Runtime {
        Runtime::Ruby
    }

    fn observe(&mut self, image: &Arc<ProcessImage>, processes: &mut ProcessTable) {
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
            // Keep the interpreters (at most the BPF map's size); the rest
            // are cheap to look at again.
            self.processes
                .retain(|_, entry| matches!(entry.state, ProcessState::Ruby(_)));
        }
        if let Some(Entry {
            state: ProcessState::Ruby(old),
            ..
        }) = self.processes.remove(&tgid)
        {
            self.namer.forget(old.process.key);
        }
        let state = self.inspect(image, processes, thread_pointer);
        if !matches!(state, ProcessState::Ruby(_)) {
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

    fn forget(&mut self, tgid: u32) {
        if let Some(Entry {
            state: ProcessState::Ruby(registered),
            ..
        }) = self.processes.remove(&tgid)
        {
            self.namer.forget(registered.process.key);
        }
    }

    fn passed_over(&self, tgid: u32) -> bool {
        self.processes
            .get(&tgid)
            .is_some_and(|entry| matches!(entry.state, ProcessState::NotRuby))
    }

    fn splice(&mut self, sample: &RawSample, native: Vec<u64>) -> Spliced {
        if sample.interpreter.is_empty() {
            return Spliced::NotMine(native);
        }
        // Taken out for the namer's borrow, put back after.
        let Some(Entry {
            state: ProcessState::Ruby(registered),
            image,
        }) = self.processes.remove(&sample.tgid)
        else {
            return Spliced::NotMine(native);
        };
        let named = self.name(&registered, sample.tgid, &sample.interpreter);
        let stack =
            splice_leaf_settling(&native, &named, std::slice::from_ref(&registered.eval_loop));
        self.processes.insert(
            sample.tgid,
            Entry {
                image,
                state: ProcessState::Ruby(registered),
            },
        );
        Spliced::Named(stack)
    }
}

fn skip_reason(error: &RubyError) -> SkipReason {
    match error {
        RubyError::UnsupportedVersion { .. } | RubyError::UnknownVersion { .. } => {
            SkipReason::UnsupportedVersion
        }
        RubyError::MissingSymbol { .. }
        | RubyError::UnreadableSymbol { .. }
        | RubyError::SymbolTableNotFound { .. }
        | RubyError::ContextNotFound { .. }
        | RubyError::EvalLoopNotFound { .. } => SkipReason::MissingSymbols,
        _ => SkipReason::Unreadable,
    }
}
