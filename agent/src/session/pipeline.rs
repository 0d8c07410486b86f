//! The stages after the ring buffer: each record decoded, each sample
//! unwound, labelled and added to its interval's profile, and the process
//! events that keep the process table, the unwind policy and the runtimes
//! current.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use agent_common::MAX_STACK_DEPTH;
use tracing::debug;

use self::plain::PlainExecutables;
use super::hold::{HeldSamples, Released, page_size};

mod loading;
mod plain;
use crate::{
    aggregate::{AggregateConfig, AggregatedProfile, Aggregator, ThreadName, UnwoundSample},
    host::Host,
    labels::{MetadataConfig, MetadataLimits, MetadataReader, ProcessFilter},
    process::{DebugFileConfig, ProcessImage, ProcessTable, ProcessTableConfig},
    runtimes::{RuntimeSupport, RuntimesConfig, Spliced, UserFrame, registry},
    sampler::{self, RawSample, Record, SamplingConfig},
    stats::Stats,
    unwind::{ProcessUnwinding, UnwindPolicy, Unwinder, UnwinderConfig, UserFrames},
};

/// How often exited processes are forgotten (and the exit walk's counters
/// mirrored).
pub(super) const EXPIRE_INTERVAL: Duration = Duration::from_secs(1);
/// How long after a sample of a runtime's process the reader keeps
/// draining promptly.
pub(super) const PROMPT_AFTER_RUNTIME_SAMPLE: Duration = Duration::from_secs(2);
/// How often map entries of vanished processes are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// The configs of the stages after the ring buffer, each handed to its own
/// stage.
#[derive(Clone, Debug, Default)]
pub struct PipelineConfig {
    /// Where `/proc` and `/sys` are.
    pub host: Host,
    pub processes: ProcessTableConfig,
    pub debug_files: DebugFileConfig,
    pub unwinder: UnwinderConfig,
    pub aggregate: AggregateConfig,
    /// Which runtimes' frames are named, and how.
    pub runtimes: RuntimesConfig,
    /// Label every sample with its thread's id and name (`thread_id`,
    /// `thread_name`), not only other threads' ids.
    pub thread_labels: bool,
    /// Relabeling's configuration, when its keep and drop rules are
    /// applied to each process on its first sample
    /// (`labels::applies_early`).
    pub exclusion: Option<MetadataConfig>,
}

/// The stages after the ring buffer, apart from it so they can be fed
/// records directly.
pub struct Pipeline {
    pub processes: ProcessTable,
    metadata: MetadataReader,
    unwinder: Unwinder,
    policy: UnwindPolicy,
    aggregator: Aggregator,
    /// Off-CPU samples, apart: their stacks count time waited.
    off_cpu: Aggregator,
    /// The runtimes whose frames are named, those turned on; the first to
    /// claim a sample's process names its frames.
    runtimes: Vec<Box<dyn RuntimeSupport>>,
    pub(super) stats: Arc<Stats>,
    last_expire: Instant,
    /// Until when the reader drains promptly: a while after the last
    /// sample of a process a runtime names (see [`Self::wants_prompt_drain`]).
    prompt_until: Instant,
    last_sweep: Instant,
    host: Host,
    thread_labels: bool,
    /// Relabeling's keep and drop rules, where they apply at once.
    pub(super) filter: Option<ProcessFilter>,
    /// Samples waiting for their process's maps (see `hold`).
    pub(super) held: HeldSamples,
    pub(super) page_size: u64,
    /// Executables whose processes' maps wait for their first sample.
    plain: PlainExecutables,
    /// The time of the batch of records being handled ([`Self::begin_batch`]).
    clock: Option<Instant>,
}

impl Pipeline {
    /// Unwinds with `--unwind auto` and no BPF map until
    /// [`Self::with_unwind`] says otherwise.
    pub fn new(config: &PipelineConfig, stats: Arc<Stats>) -> Self {
        let defaults = SamplingConfig::default();
        let max_processes = config.processes.max_processes;
        Self {
            processes: ProcessTable::new(
                config.host.proc().to_path_buf(),
                &config.processes,
                &config.debug_files,
                stats.clone(),
            ),
            metadata: MetadataReader::new(
                &config.host,
                &MetadataLimits {
                    max_processes,
                    ..MetadataLimits::default()
                },
                stats.clone(),
            ),
            unwinder: Unwinder::new(&config.unwinder, stats.clone()),
            policy: UnwindPolicy::new(
                defaults.unwind,
                defaults.stack_copy_bytes,
                max_processes,
                stats.clone(),
            ),
            aggregator: Aggregator::new(&config.aggregate, stats.clone()),
            off_cpu: Aggregator::new(&config.aggregate, stats.clone()),
            // Those walked in BPF come with the session's map
            // (`with_runtimes`).
            runtimes: registry::build(&config.runtimes, None, max_processes, &stats),
            filter: config.exclusion.as_ref().map(|metadata| {
                ProcessFilter::new(metadata, &config.host, max_processes, stats.clone())
            }),
            stats: stats.clone(),
            last_expire: Instant::now(),
            // Processes running at the start are not known yet.
            prompt_until: Instant::now() + PROMPT_AFTER_RUNTIME_SAMPLE,
            last_sweep: Instant::now(),
            host: config.host.clone(),
            thread_labels: config.thread_labels,
            held: HeldSamples::default(),
            page_size: page_size(),
            plain: PlainExecutables::new(stats.clone()),
            clock: None,
        }
    }

    /// The records handled until [`Self::end_batch`] are timed by one
    /// read of the clock, not one (or several) each: a batch is handled
    /// within a drain slice, far shorter than anything timed per sample
    /// (metadata kept, perf maps looked for again).
    pub fn begin_batch(&mut self) {
        let now = Instant::now();
        self.clock = Some(now);
        self.processes.set_clock(Some(now));
    }

    /// Records handled from now on read the clock as they need it.
    pub fn end_batch(&mut self) {
        self.clock = None;
        self.processes.set_clock(None);
    }

    /// The kernel captures exiting processes' mappings (`Record::Mapping`):
    /// samples of processes whose maps firn could not read in time wait
    /// for them.
    pub fn with_exit_maps(mut self, on: bool) -> Self {
        self.processes.set_captures_exit_maps(on);
        self
    }

    pub fn with_unwind(mut self, policy: UnwindPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Names the frames of one more runtime, kept in the order of
    /// [`Runtime::order`]: Java first (a process embedding both a JVM and CPython
    /// keeps its Java frames, as before), then Python (registered with the
    /// BPF walker before a new process's image is searched for V8).
    pub fn with_runtime(mut self, runtime: Box<dyn RuntimeSupport>) -> Self {
        self.runtimes.push(runtime);
        self.runtimes
            .sort_by_key(|runtime| runtime.runtime().order());
        self
    }

    /// Names the frames of these runtimes, in place of those built
    /// without BPF ([`registry::build`]).
    pub fn with_runtimes(mut self, runtimes: Vec<Box<dyn RuntimeSupport>>) -> Self {
        self.runtimes = runtimes;
        self
    }

    /// Handles one ring buffer record.
    pub fn handle(&mut self, bytes: &[u8]) {
        match sampler::decode(bytes) {
            Ok(Record::Sample(sample)) => {
                let comm = sample.comm.to_str();
                // A kernel thread's sample needs no maps.
                if sample.has_user_side() && self.processes.holds(sample.tgid, &comm) {
                    if self.held.hold(sample.tgid, &comm, bytes) {
                        return;
                    }
                    Stats::inc(&self.stats.held_dropped);
                }
                // A new program's first sample handled now: its maps are
                // read and its unwinding decided (not at its exec, see
                // `ProcessTable::on_exec`; a held one's when it settles).
                if sample.has_user_side() && self.processes.unread(sample.tgid) {
                    self.prepare(sample.tgid);
                }
                self.count_truncated(&sample);
                self.sample(sample);
            }
            Ok(Record::Mapping(mapping)) => self.held.capture(mapping, self.page_size),
            Ok(Record::Exec(event)) => {
                Stats::inc(&self.stats.process_events);
                // Samples of the image before: placed with its mappings
                // the kernel captured as the exec began, else with what
                // firn has of it (never with the new image's maps or
                // metadata).
                self.metadata.image_ended(event.tgid);
                self.release_image(event.tgid, &event.comm.to_string(), Released::ExecMaps);
                let preset = event
                    .executable
                    .and_then(|executable| self.plain.get(&executable));
                self.processes
                    .on_exec(event.tgid, &event.comm.to_string(), preset.is_some());
                self.metadata.forget(event.tgid);
                self.policy.on_exec(event.tgid);
                if let Some(preset) = preset
                    && self.processes.unread(event.tgid)
                {
                    self.policy.apply_preset(event.tgid, preset);
                }
                // What the executable's processes taught since reaches
                // the BPF program's preset too.
                if let (Some(preset), Some(executable)) = (preset, event.executable) {
                    self.policy.publish_preset(executable, preset);
                }
                self.forget(event.tgid);
                // Decide now, while the new image is fresh: until then the
                // BPF program copies its whole stack. (A deferred read is
                // decided at the process's first sample.)
                if let Some(image) = self.processes.lookup(event.tgid) {
                    self.prepare_image(&image);
                    if let Some(executable) = event.executable
                        && !image.gone
                        && self
                            .runtimes
                            .iter()
                            .all(|runtime| runtime.passed_over(event.tgid))
                        && let Some(preset) = self.policy.preset_of(&image)
                    {
                        self.plain.insert(executable, preset);
                        self.policy.publish_preset(executable, preset);
                    }
                }
            }
            Ok(Record::Exit(event)) => {
                Stats::inc(&self.stats.process_events);
                // The mappings the kernel captured came just before: the
                // process's held samples are placed with them.
                self.release_image(event.tgid, &event.comm.to_string(), Released::ExitMaps);
                self.processes.on_exit(event.tgid);
                // Its samples came before this event and hold their
                // metadata; a process reusing the pid must not inherit it.
                self.metadata.forget(event.tgid);
                self.policy.on_exit(event.tgid);
                self.forget(event.tgid);
            }
            Err(error) => {
                Stats::inc(&self.stats.records_malformed);
                debug!(%error, "malformed ring buffer record");
            }
        }
    }

    /// Readies a process before its first sample: its unwind decided and,
    /// when it is an interpreter, its frames walked from the first sample
    /// on. A process that is gone is left for its samples, if any.
    pub fn prepare(&mut self, tgid: u32) {
        let image = self.processes.image(tgid, "");
        if !image.gone {
            self.prepare_image(&image);
        }
    }

    fn prepare_image(&mut self, image: &Arc<ProcessImage>) {
        self.decide_unwinding(image);
    }

    /// How `image` is unwound, once every runtime looked at it: with
    /// DWARF over a stack copy when a runtime finds its frames there.
    fn decide_unwinding(&mut self, image: &Arc<ProcessImage>) -> ProcessUnwinding {
        let unwinding = self
            .policy
            .decide(image, &mut self.processes, &mut self.unwinder);
        self.observe(image);
        if unwinding == ProcessUnwinding::FramePointers
            && self
                .runtimes
                .iter()
                .any(|runtime| runtime.unwinds_over_stack(image.tgid))
        {
            self.policy.require_dwarf(image);
            return self
                .policy
                .decide(image, &mut self.processes, &mut self.unwinder);
        }
        unwinding
    }

    /// Every runtime looks at `image`, until all passed it over: most
    /// processes' samples then cost no runtime a look.
    fn observe(&mut self, image: &Arc<ProcessImage>) {
        if image.passed_over() {
            return;
        }
        for runtime in &mut self.runtimes {
            runtime.observe(image, &mut self.processes);
        }
        // An image the runtimes could not look at (gone, nothing mapped)
        // holds no verdict of theirs.
        if !image.gone
            && !image.mappings.is_empty()
            && self
                .runtimes
                .iter()
                .all(|runtime| runtime.passed_over(image.tgid))
        {
            image.set_passed_over();
        }
    }

    /// The process executed a new image or exited.
    fn forget(&mut self, tgid: u32) {
        for runtime in &mut self.runtimes {
            runtime.forget(tgid);
        }
        if let Some(filter) = &mut self.filter {
            filter.forget(tgid);
        }
    }

    pub fn sample(&mut self, sample: RawSample<'_>) {
        Stats::inc(&self.stats.samples_received);
        let comm = sample.comm.to_str();
        let image = match sample.user_stack.first() {
            Some(&ip) => self.processes.image_covering(sample.tgid, &comm, ip),
            None => self.processes.image(sample.tgid, &comm),
        };
        let now = self.clock.unwrap_or_else(Instant::now);
        let (metadata, fresh) = self.metadata.get_at(sample.tgid, sample.cgroup_id, now);
        if fresh && let Some(executable) = &metadata.executable {
            // The executable's build id is a relabeling input even when
            // no sample lands in its own code.
            if let Some(index) = image
                .mappings
                .iter()
                .position(|mapping| mapping.spec.path == *executable)
            {
                self.processes.object(&image, index);
            }
        }
        // A process relabeling drops costs nothing more: not unwound, not
        // symbolized, no runtime looks at it.
        if let Some(filter) = &mut self.filter
            && !filter.kept(&image, &metadata)
        {
            return;
        }
        // A sample without user frames (a kernel thread's) has nothing to
        // unwind and nothing a runtime could name: it must not keep the
        // drain at the prompt tick (a kernel thread's image is never
        // passed over, it has no mappings to look at).
        let user_side = sample.has_user_side();
        let (native, image) = match user_side {
            true => self.unwind(&sample, image),
            false => (Vec::new(), image),
        };
        // Open every object (and debug file, and JIT perf map) now, while
        // the process is surely alive; the profile is symbolized later,
        // possibly after it exited.
        // Once per mapping in a row: a JVM's stack has its Java frames in
        // one mapping of the code cache, each of which would look for a
        // perf map again.
        let mut last = None;
        for &address in &native {
            if let Some(index) = image.mapping_index(address)
                && last != Some(index)
            {
                last = Some(index);
                if image.mappings[index].object().is_none() {
                    self.processes.object(&image, index);
                }
            }
        }
        let runtime = user_side && !image.passed_over();
        if runtime {
            self.prompt_until = now + PROMPT_AFTER_RUNTIME_SAMPLE;
        }
        let user = match runtime {
            true => self.with_runtime_frames(&sample, native),
            false => native.into_iter().map(UserFrame::Native).collect(),
        };
        let thread_name = self.thread_labels.then(|| match runtime {
            true => self.thread_name(&sample),
            false => ThreadName::Comm(sample.comm),
        });
        let unwound = UnwoundSample {
            image,
            metadata,
            tid: sample.tid,
            thread_name,
            kernel: sample.kernel_stack,
            user,
            weight: sample.off_cpu.map_or(1, |wait| wait.periods),
            reason: sample.off_cpu.map(|wait| crate::offcpu::reason(&wait)),
        };
        match sample.off_cpu {
            Some(_) => {
                Stats::inc(&self.stats.off_cpu_samples_received);
                self.off_cpu.add(unwound);
            }
            None => self.aggregator.add(unwound),
        }
    }

    /// A thread's name for its labels: its runtime's (a Java thread's
    /// whole name) where one has it, else the OS thread's.
    fn thread_name(&mut self, sample: &RawSample) -> ThreadName {
        let now = self.clock.unwrap_or_else(Instant::now);
        self.runtimes
            .iter_mut()
            .find_map(|runtime| runtime.thread_name(sample.tgid, sample.tid, now))
            .map_or(ThreadName::Comm(sample.comm), ThreadName::Runtime)
    }

    /// The user stack with the runtime frames the sample recorded or its
    /// unwind found named (now, while the process is alive) and spliced
    /// in: by the first runtime that claims the process.
    fn with_runtime_frames(&mut self, sample: &RawSample, mut native: Vec<u64>) -> Vec<UserFrame> {
        for runtime in &mut self.runtimes {
            match runtime.splice(sample, native) {
                Spliced::Named(frames) => return frames,
                Spliced::NotMine(frames) => native = frames,
            }
        }
        native.into_iter().map(UserFrame::Native).collect()
    }

    /// Stacks that filled the BPF stack walk's buffer were most likely cut
    /// there (the outermost frames are missing).
    pub(super) fn count_truncated(&self, sample: &RawSample) {
        if sample.kernel_stack.len() >= MAX_STACK_DEPTH {
            Stats::inc(&self.stats.stacks_truncated_kernel);
        }
        if sample.user_stack.len() >= MAX_STACK_DEPTH {
            Stats::inc(&self.stats.stacks_truncated_user);
        }
    }

    /// The sample's user frames, and the image they belong to: the one
    /// given, or a fresh read of the process's maps if the stack ran into
    /// code outside it.
    fn unwind(
        &mut self,
        sample: &RawSample,
        mut image: Arc<ProcessImage>,
    ) -> (Vec<u64>, Arc<ProcessImage>) {
        // A new image (first sample, or maps re-read) may be a new
        // runtime's process: this sample on gets its frames named.
        let unwinding = self.decide_unwinding(&image);
        let mut reread = false;
        let mut jit = match image.passed_over() {
            true => None,
            false => self
                .runtimes
                .iter_mut()
                .find_map(|runtime| runtime.unwinder(sample.tgid)),
        };
        let mut attempt = self.unwinder.attempt(
            sample,
            &image,
            &mut self.processes,
            unwinding,
            jit.as_deref_mut(),
        );
        // The maps may predate a library being mapped (read right after
        // exec, or before a dlopen): re-read them, once per unwind and at
        // most once a second per process, and unwind again over them.
        if let Some(address) = attempt.unmapped() {
            let fresh = self
                .processes
                .image_covering(image.tgid, &sample.comm.to_str(), address);
            if !Arc::ptr_eq(&fresh, &image) {
                image = fresh;
                reread = true;
                attempt = self.unwinder.attempt(
                    sample,
                    &image,
                    &mut self.processes,
                    unwinding,
                    jit.as_deref_mut(),
                );
            }
        }
        drop(jit);
        if reread {
            self.observe(&image);
        }
        let UserFrames {
            frames,
            needs_dwarf,
            stack_need,
            walk,
        } = self.unwinder.finish(attempt, unwinding);
        if needs_dwarf {
            self.policy.require_dwarf(&image);
        }
        if let Some(need) = stack_need {
            self.policy
                .observe_stack(&image, need, sample.stack_copy.len());
            if let Some(regs) = sample.user_regs {
                self.policy.observe_thread(
                    &image,
                    (sample.tid, regs.sp),
                    need,
                    sample.stack_copy.len(),
                );
            }
        }
        if let Some(walk) = walk {
            self.policy.observe_walk(&image, walk);
        }
        (frames, image)
    }

    /// Whether records should be drained at the prompt tick rather than
    /// the quiet one: a process a runtime names was sampled lately (its
    /// frames are named from its memory when drained, and the later, the
    /// more a JIT has moved), samples are held (they settle, or their
    /// process is read, at a drain), or an interpreter's maps are due to
    /// be read again.
    pub fn wants_prompt_drain(&self, now: Instant) -> bool {
        now < self.prompt_until || !self.held.is_empty() || self.next_loading().is_some()
    }

    pub(super) fn housekeeping(&mut self) {
        self.read_loading();
        self.release_waiting();
        let now = Instant::now();
        if now.duration_since(self.last_expire) >= EXPIRE_INTERVAL {
            self.processes.expire(now);
            self.last_expire = now;
            // The CFI pages new processes' objects were read for would
            // otherwise pile up in RSS until the profile is taken: on a
            // host starting compilers, tens of MB over the first interval,
            // on top of what building that profile reads. The rows that
            // matter are cached; pages touched again fault back in.
            self.unwinder.release_pages();
        }
        if now.duration_since(self.last_sweep) >= SWEEP_INTERVAL {
            self.policy.sweep(self.host.proc());
            self.last_sweep = now;
        }
    }

    pub fn take_profile(&mut self) -> AggregatedProfile {
        self.aggregator.take()
    }

    /// The off-CPU samples since the last call (`--off-cpu`), each stack
    /// counted in periods waited.
    pub fn take_off_cpu_profile(&mut self) -> AggregatedProfile {
        self.off_cpu.take()
    }
}
