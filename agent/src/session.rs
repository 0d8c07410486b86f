//! A sampling session: the BPF programs attached, and the stages from the
//! ring buffer to the aggregator driven as records arrive.

use std::{
    future::Future,
    io,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use agent_common::MAX_STACK_DEPTH;
use tracing::{debug, warn};

use crate::{
    aggregate::{AggregateConfig, AggregatedProfile, Aggregator, ThreadName, UnwoundSample},
    bpf::{BpfCounters, BpfError, BpfProbe, BpfSampler, ProgramRunTime},
    host::Host,
    labels::{MetadataConfig, MetadataLimits, MetadataReader, ProcessFilter},
    process::{DebugFileConfig, ProcessImage, ProcessTable, ProcessTableConfig, ProcessTableStats},
    runtimes::{
        JavaConfig, JavaRuntime, JavaSupport, NodeConfig, NodeRuntime, PythonConfig, PythonRuntime,
        PythonSupport, RuntimeSupport, Spliced, ThreadPointerLookup, UserFrame,
    },
    sampler::{self, RawSample, Record, RingReader, SamplingConfig, UnwindMode},
    stats::Stats,
    unwind::{ProcessUnwinding, UnwindPolicy, Unwinder, UnwinderConfig, UserFrames},
    watchdog::Stage,
};

mod hold;
use hold::{HeldSamples, Released, mirror_exit_maps, page_size};

/// The reader drains at least this often: the BPF side only wakes it once
/// the ring buffer is an eighth full.
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);
const EXPIRE_INTERVAL: Duration = Duration::from_secs(1);
/// Records handled between checks of the clock.
const DRAIN_BATCH: usize = 256;
/// Longest stretch of record handling before the loop looks at its
/// deadline again: slow records (a first look at a huge object) must not
/// hold a recording or an interval open.
const DRAIN_SLICE: Duration = Duration::from_millis(50);
/// Longest the final drain may take after the deadline.
const FINAL_DRAIN: Duration = Duration::from_secs(2);
/// How often map entries of vanished processes are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error("could not watch the ring buffer")]
    Ring {
        #[source]
        source: io::Error,
    },
}

pub struct Session {
    bpf: BpfSampler,
    reader: RingReader,
    pipeline: Pipeline,
    /// Where the drain reports its steps, for the watchdog.
    drain_stage: Option<Arc<Stage>>,
    /// When the exit walk's BPF counters were last copied into the stats.
    last_mirror: Instant,
}

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
    pub python: PythonConfig,
    pub java: JavaConfig,
    pub node: NodeConfig,
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
    stats: Arc<Stats>,
    last_expire: Instant,
    last_sweep: Instant,
    host: Host,
    thread_labels: bool,
    /// Relabeling's keep and drop rules, where they apply at once.
    filter: Option<ProcessFilter>,
    /// Samples waiting for their process's maps (see `hold`).
    held: HeldSamples,
    page_size: u64,
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
                config.host.proc().to_path_buf(),
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
            runtimes: [
                config.java.enabled.then(|| {
                    Box::new(JavaSupport::new(JavaRuntime::new(stats.clone())))
                        as Box<dyn RuntimeSupport>
                }),
                config
                    .node
                    .enabled
                    .then(|| Box::new(NodeRuntime::new(stats.clone())) as Box<dyn RuntimeSupport>),
            ]
            .into_iter()
            .flatten()
            .collect(),
            filter: config.exclusion.as_ref().map(|metadata| {
                ProcessFilter::new(metadata, &config.host, max_processes, stats.clone())
            }),
            stats,
            last_expire: Instant::now(),
            last_sweep: Instant::now(),
            host: config.host.clone(),
            thread_labels: config.thread_labels,
            held: HeldSamples::default(),
            page_size: page_size(),
        }
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

    /// Handles one ring buffer record.
    pub fn handle(&mut self, bytes: &[u8]) {
        match sampler::decode(bytes) {
            Ok(Record::Sample(sample)) => {
                let comm = sample.comm.to_string();
                // A sample without user frames (a kernel thread's) needs
                // no maps.
                if !sample.user_stack.is_empty() && self.processes.holds(sample.tgid, &comm) {
                    if self.held.hold(sample.tgid, &comm, bytes) {
                        return;
                    }
                    Stats::inc(&self.stats.held_dropped);
                }
                self.count_truncated(&sample);
                self.sample(sample);
            }
            Ok(Record::Mapping(mapping)) => self.held.capture(mapping, self.page_size),
            Ok(Record::Exec(event)) => {
                Stats::inc(&self.stats.process_events);
                // Samples of the image before: placed with what firn has
                // of it.
                self.release(event.tgid, Released::NoMaps);
                self.processes.on_exec(event.tgid, &event.comm.to_string());
                self.metadata.forget(event.tgid);
                self.policy.on_exec(event.tgid);
                self.forget(event.tgid);
                // Decide now, while the new image is fresh: until then the
                // BPF program copies its whole stack.
                if let Some(image) = self.processes.lookup(event.tgid) {
                    self.prepare_image(&image);
                }
            }
            Ok(Record::Exit(event)) => {
                Stats::inc(&self.stats.process_events);
                // The mappings the kernel captured came just before: the
                // process's held samples are placed with them.
                match self.held.captured(event.tgid) {
                    Some(specs) => {
                        self.processes
                            .install_captured(event.tgid, &event.comm.to_string(), specs);
                        self.release(event.tgid, Released::ExitMaps);
                    }
                    None => self.release(event.tgid, Released::NoMaps),
                }
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

    /// Every runtime looks at `image`.
    fn observe(&mut self, image: &Arc<ProcessImage>) {
        for runtime in &mut self.runtimes {
            runtime.observe(image, &mut self.processes);
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
        let comm = sample.comm.to_string();
        let image = match sample.user_stack.first() {
            Some(&ip) => self.processes.image_covering(sample.tgid, &comm, ip),
            None => self.processes.image(sample.tgid, &comm),
        };
        let (metadata, fresh) = self.metadata.get(sample.tgid, sample.cgroup_id);
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
        let (native, image) = self.unwind(&sample, image);
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
                self.processes.object(&image, index);
            }
        }
        let user = self.with_runtime_frames(&sample, native);
        let thread_name = self.thread_labels.then(|| self.thread_name(&sample));
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
        self.runtimes
            .iter_mut()
            .find_map(|runtime| runtime.thread_name(sample.tgid, sample.tid))
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
    fn count_truncated(&self, sample: &RawSample) {
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
        let mut jit = self
            .runtimes
            .iter_mut()
            .find_map(|runtime| runtime.unwinder(sample.tgid));
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
            let fresh =
                self.processes
                    .image_covering(image.tgid, &sample.comm.to_string(), address);
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
        } = self.unwinder.finish(attempt, unwinding);
        if needs_dwarf {
            self.policy.require_dwarf(&image);
        }
        if let Some(need) = stack_need {
            self.policy
                .observe_stack(&image, need, sample.stack_copy.len());
        }
        (frames, image)
    }

    fn housekeeping(&mut self) {
        self.release_waiting();
        let now = Instant::now();
        if now.duration_since(self.last_expire) >= EXPIRE_INTERVAL {
            self.processes.expire(now);
            self.last_expire = now;
        }
        if now.duration_since(self.last_sweep) >= SWEEP_INTERVAL {
            self.policy.sweep(self.host.proc());
            self.last_sweep = now;
        }
    }

    pub fn take_profile(&mut self) -> AggregatedProfile {
        self.unwinder.release_pages();
        self.aggregator.take()
    }

    /// The off-CPU samples since the last call (`--off-cpu`), each stack
    /// counted in periods waited.
    pub fn take_off_cpu_profile(&mut self) -> AggregatedProfile {
        self.off_cpu.take()
    }
}

impl Session {
    /// Loads and attaches the BPF programs and readies the stages, and the
    /// processes in `ready` (those named with `--pid`) before sampling.
    pub fn start(
        sampling: &SamplingConfig,
        pipeline: &PipelineConfig,
        ready: &[u32],
        stats: Arc<Stats>,
    ) -> Result<Self, SessionError> {
        raise_open_file_limit();
        // Beside the BPF verification, which takes about as long.
        let thread_pointer = pipeline.python.enabled.then(ThreadPointerLookup::start);
        let mut bpf = BpfSampler::load(sampling)?;
        if bpf.children_not_followed() {
            stats.following_unavailable.fetch_add(1, Ordering::Relaxed);
        }
        let ring = bpf.take_ring_buffer()?;
        let reader = RingReader::new(ring).map_err(|source| SessionError::Ring { source })?;
        let mut policy = UnwindPolicy::new(
            sampling.unwind,
            sampling.stack_copy_bytes,
            pipeline.processes.max_processes,
            stats.clone(),
        );
        if sampling.unwind == UnwindMode::Auto {
            policy = policy.with_map(
                Box::new(bpf.take_copy_size_map()?),
                sampling.leaf_stack_copy_bytes,
            );
        }
        // Nothing else is looked at before sampling starts: a process is
        // decided (and an interpreter registered) on its first sample, and
        // the BPF program gives an undecided process the full stack copy,
        // so its first samples unwind whole. Firn is ready sooner, and
        // processes that are never sampled cost nothing. The few processes
        // named with `--pid` are readied first, below: an interpreter's
        // samples before its registration would carry no Python frames. (A
        // command `record` starts is not: before its exec it is a copy of
        // firn, and its exec readies it.)
        let python = match thread_pointer {
            Some(thread_pointer) => Some(PythonRuntime::new(
                &pipeline.python,
                thread_pointer,
                Box::new(bpf.take_python_map()?),
                pipeline.processes.max_processes,
                stats.clone(),
            )),
            None => None,
        };
        let captures = bpf.captures_exit_maps();
        if !captures && sampling.user_stacks {
            Stats::set(&stats.exit_maps_unavailable, 1);
        }
        let mut pipeline = Pipeline::new(pipeline, stats)
            .with_unwind(policy)
            .with_exit_maps(captures);
        if pipeline.filter.is_some() {
            let map = bpf.take_exclusion_map()?;
            pipeline.filter = pipeline.filter.map(|filter| filter.with_map(Box::new(map)));
        }
        if let Some(python) = python {
            pipeline = pipeline.with_runtime(Box::new(PythonSupport::new(python)));
        }
        for &pid in ready {
            pipeline.prepare(pid);
        }
        bpf.start_sampling(sampling.frequency_hz)?;
        Ok(Self {
            bpf,
            reader,
            pipeline,
            drain_stage: None,
            last_mirror: Instant::now(),
        })
    }

    /// Reports each record handled to `stage`, so a record that never
    /// finishes is noticed.
    pub fn watch_drain(&mut self, stage: Arc<Stage>) {
        self.drain_stage = Some(stage);
    }

    pub fn cpus(&self) -> usize {
        self.bpf.cpus().len()
    }

    pub fn ring_buffer_bytes(&self) -> u32 {
        self.bpf.ring_buffer_bytes()
    }

    pub fn bpf_counters(&self) -> BpfCounters {
        self.bpf.counters()
    }

    /// Read access to the BPF counters for another thread (metrics).
    pub fn bpf_probe(&self) -> Result<BpfProbe, BpfError> {
        self.bpf.probe()
    }

    pub fn sampler_run_time(&self) -> Option<ProgramRunTime> {
        self.bpf.sampler_run_time()
    }

    pub fn process_table(&self) -> ProcessTableStats {
        self.pipeline.processes.sizes()
    }

    /// Processes records until `until` completes, then drains what is left
    /// and returns its output.
    pub async fn collect_until<F: Future>(&mut self, until: F) -> io::Result<F::Output> {
        let mut drain = tokio::time::interval(DRAIN_INTERVAL);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(until);
        let mut pending = false;
        loop {
            tokio::select! {
                // The deadline first: it must win over a busy ring buffer.
                biased;
                output = &mut until => {
                    if self.drain(FINAL_DRAIN) {
                        warn!("records were still waiting in the ring buffer at the deadline");
                    }
                    return Ok(output);
                }
                () = std::future::ready(()), if pending => pending = self.drain(DRAIN_SLICE),
                readable = self.reader.readable() => {
                    readable?;
                    pending = self.drain(DRAIN_SLICE);
                }
                _ = drain.tick() => pending = self.drain(DRAIN_SLICE),
            }
        }
    }

    /// Handles waiting records for at most `slice`; true if some are left.
    fn drain(&mut self, slice: Duration) -> bool {
        let Self {
            bpf,
            reader,
            pipeline,
            drain_stage,
            last_mirror,
        } = self;
        let drain_stage = drain_stage.as_deref();
        let step = || {
            if let Some(stage) = drain_stage {
                stage.step();
            }
        };
        step();
        let pending = drain_for(slice, |limit| {
            reader.drain(limit, |bytes| {
                pipeline.handle(bytes);
                step();
            })
        });
        pipeline.housekeeping();
        if last_mirror.elapsed() >= EXPIRE_INTERVAL {
            *last_mirror = Instant::now();
            mirror_exit_maps(bpf, &pipeline.stats);
        }
        if let Some(stage) = drain_stage {
            stage.idle();
        }
        pending
    }

    pub fn take_profile(&mut self) -> AggregatedProfile {
        self.pipeline.take_profile()
    }

    pub fn take_off_cpu_profile(&mut self) -> AggregatedProfile {
        self.pipeline.take_off_cpu_profile()
    }

    /// Whether off-CPU samples are taken (`--off-cpu`).
    pub fn off_cpu(&self) -> bool {
        self.bpf.off_cpu()
    }
}

/// Calls `next_batch(DRAIN_BATCH)` (which handles up to that many records
/// and returns how many it handled) until a batch comes back short or
/// `slice` has passed. True when it stopped with records left.
fn drain_for(slice: Duration, mut next_batch: impl FnMut(usize) -> usize) -> bool {
    let started = Instant::now();
    loop {
        if next_batch(DRAIN_BATCH) < DRAIN_BATCH {
            return false;
        }
        if started.elapsed() >= slice {
            return true;
        }
    }
}

/// Every object firn keeps open is a file descriptor; the soft limit is
/// often 1024 while the hard limit is far higher.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Completes on SIGINT, SIGTERM or SIGHUP.
pub async fn shutdown_signal() -> io::Result<&'static str> {
    Ok(ShutdownSignal::install()?.recv().await)
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment this is made: a
/// signal that comes while the BPF programs load is kept for the loop
/// (rather than killing the process before it can clean up). SIGHUP (a
/// closed terminal, or an operator used to reloading daemons with it)
/// stops firn the same way: its default action would kill it unflushed.
pub struct ShutdownSignal {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    /// Must be called within a tokio runtime.
    pub fn install() -> io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The name of the next signal; cancel-safe.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

#[cfg(test)]
mod tests;
