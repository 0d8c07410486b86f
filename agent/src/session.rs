//! A sampling session: the BPF programs attached, and the stages from the
//! ring buffer to the aggregator (`pipeline`) driven as records arrive.

use std::{
    future::Future,
    io,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tracing::warn;

use crate::{
    aggregate::AggregatedProfile,
    bpf::{BpfCounters, BpfError, BpfProbe, BpfSampler, ProgramRunTime},
    process::ProcessTableStats,
    runtimes::{BpfWalkers, InterpreterMap, ThreadPointerLookup, registry},
    sampler::{RingReader, SamplingConfig, UnwindMode},
    stats::Stats,
    unwind::UnwindPolicy,
    watchdog::Stage,
};

mod hold;
mod pipeline;
mod signal;
mod timer;
use hold::mirror_exit_maps;
use pipeline::EXPIRE_INTERVAL;
pub use pipeline::{Pipeline, PipelineConfig};
pub use signal::{ShutdownSignal, shutdown_signal};
use timer::DrainTimer;

/// The reader drains at least this often: the BPF side only wakes it once
/// the ring buffer is an eighth full (or at once for what must be seen
/// while a process lives: a new interpreter's exec and first samples).
/// Each wakeup costs firn CPU even with nothing to drain, but a runtime's
/// frames are named from its memory when drained, and the longer after
/// the sample, the more a JIT has moved (V8's interpreted frames lost
/// their names more often at 250 ms).
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);
/// The tick when nothing needs a prompt drain (no runtime's process
/// sampled lately, nothing held, see `Pipeline::wants_prompt_drain`):
/// each wakeup costs some 25-80 µs of CPU on a virtual machine whose
/// timer interrupts exit to the host, and an agent on a quiet host drains
/// little else.
const QUIET_DRAIN_INTERVAL: Duration = Duration::from_millis(500);
/// Records handled between checks of the clock.
const DRAIN_BATCH: usize = 256;
/// Longest stretch of record handling before the loop looks at its
/// deadline again: slow records (a first look at a huge object) must not
/// hold a recording or an interval open.
const DRAIN_SLICE: Duration = Duration::from_millis(50);
/// Longest the final drain may take after the deadline.
const FINAL_DRAIN: Duration = Duration::from_secs(2);

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
        let thread_pointer = pipeline
            .runtimes
            .walks_in_bpf()
            .then(ThreadPointerLookup::start);
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
        let interpreters = match thread_pointer {
            Some(_) => Some(bpf.take_interpreter_map()?),
            None => None,
        };
        let walkers = match (thread_pointer, &interpreters) {
            (Some(thread_pointer), Some(map)) => Some(BpfWalkers {
                map: Box::new(|kind| Box::new(map.for_kind(kind)) as Box<dyn InterpreterMap>),
                thread_pointer,
            }),
            _ => None,
        };
        let runtimes = registry::build(
            &pipeline.runtimes,
            walkers,
            pipeline.processes.max_processes,
            &stats,
        );
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
        pipeline = pipeline.with_runtimes(runtimes);
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
        let mut drain = DrainTimer::new(DRAIN_INTERVAL)?;
        tokio::pin!(until);
        let mut pending = false;
        loop {
            let period = match self.pipeline.wants_prompt_drain(Instant::now()) {
                true => DRAIN_INTERVAL,
                false => QUIET_DRAIN_INTERVAL,
            };
            if period != drain.period() {
                drain.set_period(period)?;
            }
            // A process a runtime waits for is read again when due, not at
            // the next drain.
            let loading = self.pipeline.next_loading();
            let read_loading = tokio::time::sleep_until(
                loading.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std),
            );
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
                ticked = drain.tick() => {
                    ticked?;
                    pending = self.drain(DRAIN_SLICE);
                }
                () = read_loading, if loading.is_some() => pending = self.drain(DRAIN_SLICE),
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
        // The records are timed once a batch; the watchdog still sees each
        // step, so one record stuck (on a deadline) is told from many slow.
        let pending = drain_for(slice, |limit| {
            pipeline.begin_batch();
            reader.drain(limit, |bytes| {
                pipeline.handle(bytes);
                step();
            })
        });
        pipeline.end_batch();
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

#[cfg(test)]
mod tests;
