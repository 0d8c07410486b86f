//! The agent: samples continuously and writes one profile per interval.

use std::{
    sync::{Arc, OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use firn::{
    aggregate::AggregatedProfile,
    bpf::{BpfCounters, ProgramRunTime},
    config::{AgentConfig, DestinationConfig},
    http::{Health, HttpServer},
    labels::{KubernetesWatcher, Labeler, PodIndex, applies_early},
    metrics::Metrics,
    output::{
        Exporter, FRAME_CACHE_BYTES, FanOut, FrameCache, LocalStore, build_batch,
        build_off_cpu_batch, destination::Tally, label_interval, otlp::OtlpExporter,
        parca::ParcaExporter, pyroscope::PyroscopeExporter, symbolize_interval,
    },
    process::ProcessTableStats,
    session::{PipelineConfig, Session, ShutdownSignal},
    stats::{
        Stats, StatsSnapshot,
        cpu::{self, CpuStage},
    },
    symbolize::HostSymbolizer,
    watchdog::{self, Stage},
};
use tracing::{error, info, warn};

/// Marks a stage idle when dropped.
struct IdleOnDrop<'a>(&'a Stage);

impl Drop for IdleOnDrop<'_> {
    fn drop(&mut self) {
        self.0.idle();
    }
}

use super::{lost_samples, period_ns, stack_failures, unknown_frames};

/// Intervals waiting to be built; beyond this the newest is dropped and
/// counted rather than letting memory grow.
const BUILD_QUEUE: usize = 2;
/// From SIGINT/SIGTERM to exit: the last drain of the ring buffer, the
/// last profile built and written or pushed (with whatever else is still
/// queued for the server). Within the 10 s orchestrators usually allow.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(9);
/// What the exporter keeps of the budget to stop its thread and report.
const EXPORTER_MARGIN: Duration = Duration::from_millis(500);
/// Used only if the builder stops on its own (no shutdown deadline set).
const FLUSH_DEADLINE: Duration = Duration::from_secs(8);
/// From the signal to the watchdog ending the process, should the orderly
/// shutdown above hang: later than its budget, so a slow but orderly exit
/// still gets to finish, and (with the watchdog's 100 ms check) within
/// the 10 s orchestrators allow.
const FORCED_EXIT_AFTER: Duration = Duration::from_millis(9_800);
/// A drain step (one record) taking this long is a stall; this much
/// longer, a failure only a restart fixes.
const DRAIN_STALL: Duration = Duration::from_secs(5);
const DRAIN_FAILURE: Duration = Duration::from_secs(60);

/// One interval handed from the sampling loop to the builder thread.
struct Interval {
    aggregated: AggregatedProfile,
    /// With `--off-cpu`: where threads waited.
    off_cpu: Option<AggregatedProfile>,
    bpf: BpfCounters,
    run_time: Option<ProgramRunTime>,
    processes: ProcessTableStats,
}

pub async fn run(config: &AgentConfig) -> Result<()> {
    // First, so a signal while the BPF programs load is not fatal.
    let mut signals = ShutdownSignal::install().context("could not watch for SIGINT/SIGTERM")?;
    // A warning, not an error as for `firn record`: a service restarted
    // after its process ended should keep serving /metrics, not crash-loop.
    for problem in config
        .sampling
        .pids
        .iter()
        .filter_map(|&pid| super::pid_problem(&config.pipeline.host, pid))
    {
        warn!("{problem}: nothing of it will be sampled");
    }
    let stats = Arc::new(Stats::default());
    let metrics = Arc::new(Metrics::new(stats.clone()));
    let health = Arc::new(Health::default());
    let http = HttpServer::start(config.http_address, metrics.clone(), health.clone())?;
    info!(
        address = %http.local_addr(),
        "serving /metrics, /healthy and /ready"
    );
    let (exporter, destination) = exporter(config, &stats, &metrics)?;
    let (labeler, _kubernetes) = labeler(config, &stats);
    let (drain_stage, build_stage) = watch_stages(config, &health, &stats)?;
    let mut session = Session::start(
        &config.sampling,
        &pipeline_config(config),
        &config.sampling.pids,
        stats.clone(),
    )?;
    session.watch_drain(drain_stage);
    match session.bpf_probe() {
        Ok(probe) => metrics.attach_bpf(probe),
        Err(error) => warn!(
            error = %format!("{:#}", anyhow::Error::from(error)),
            "the BPF counters will be missing from /metrics"
        ),
    }
    info!(
        cpus = session.cpus(),
        frequency_hz = config.sampling.frequency_hz,
        profiling_duration = %humantime::format_duration(config.profiling_duration),
        destination,
        node = config.metadata.node,
        ring_buffer_bytes = session.ring_buffer_bytes(),
        "firn agent started"
    );
    // Session::start returns once the sampler is attached on every CPU.
    health.set_ready(true);

    let (sender, receiver) = mpsc::sync_channel::<Interval>(BUILD_QUEUE);
    let builder = Builder {
        receiver,
        exporter,
        labeler,
        period: period_ns(config.sampling.frequency_hz),
        off_cpu_period: config
            .sampling
            .off_cpu_period
            .map(|period| i64::try_from(period.as_nanos()).unwrap_or(i64::MAX)),
        symbolizer: {
            let host = config.pipeline.host.clone();
            let symbols = config.symbols.clone();
            let stats = stats.clone();
            // On the builder's thread: reading kallsyms must not hold up
            // the first drain.
            Box::new(move || HostSymbolizer::new(&host, &symbols, stats))
        },
        stats: stats.clone(),
        stage: build_stage,
    }
    .spawn()?;
    let stopping_at = sample_intervals(
        &mut session,
        &mut signals,
        config.profiling_duration,
        &sender,
        &health,
        &stats,
    )
    .await?;
    // Detach the BPF programs first: nothing is sampled from here on.
    drop(session);
    builder.finish(sender, stopping_at + SHUTDOWN_BUDGET);
    log_totals(&stats.snapshot());
    Ok(())
}

/// Where profiles go, and how to name that in the log: the local store,
/// one server, or several at once.
fn exporter(
    config: &AgentConfig,
    stats: &Arc<Stats>,
    metrics: &Metrics,
) -> Result<(Box<dyn Exporter>, String)> {
    if config.destinations.is_empty() {
        let store = LocalStore::new(&config.local_store, stats.clone())?;
        let destination = config.local_store.directory.display().to_string();
        return Ok((Box::new(store), destination));
    }
    let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
    let mut names = Vec::new();
    for destination in &config.destinations {
        let (exporter, name) = remote_exporter(destination, config, stats, metrics)?;
        exporters.push(exporter);
        names.push(name);
    }
    let exporter = if exporters.len() == 1 {
        exporters.remove(0)
    } else {
        Box::new(FanOut::new(exporters))
    };
    Ok((exporter, names.join(", ")))
}

fn remote_exporter(
    destination: &DestinationConfig,
    config: &AgentConfig,
    stats: &Arc<Stats>,
    metrics: &Metrics,
) -> Result<(Box<dyn Exporter>, String)> {
    let transport = |tls: bool| if tls { "TLS" } else { "plaintext" };
    match destination {
        DestinationConfig::Parca {
            store: remote,
            name,
        } => {
            let tally = Tally::new(stats.clone(), metrics.destination(name));
            let exporter =
                ParcaExporter::start(remote, &config.debuginfo, tally, metrics.push_duration())
                    .context("could not set up the remote store")?;
            Ok((
                Box::new(exporter),
                format!("{} ({})", remote.address, transport(remote.tls.is_some())),
            ))
        }
        DestinationConfig::Pyroscope(pyroscope) => {
            let tally = Tally::new(stats.clone(), metrics.destination(&pyroscope.name));
            let exporter = PyroscopeExporter::start(pyroscope, tally, metrics.push_duration())
                .context("could not set up the Pyroscope exporter")?;
            Ok((Box::new(exporter), pyroscope.url.clone()))
        }
        DestinationConfig::Otlp(otlp) => {
            let tally = Tally::new(stats.clone(), metrics.destination(&otlp.name));
            let exporter = OtlpExporter::start(otlp, tally, metrics.push_duration())
                .context("could not set up the OTLP exporter")?;
            Ok((
                Box::new(exporter),
                format!(
                    "{} (OTLP over {}, profiles messages {})",
                    otlp.endpoint,
                    otlp.protocol.as_str(),
                    otlp.version.as_str()
                ),
            ))
        }
    }
}

/// The drain and build stages, watched for stalls from here on.
fn watch_stages(
    config: &AgentConfig,
    health: &Arc<Health>,
    stats: &Arc<Stats>,
) -> Result<(Arc<Stage>, Arc<Stage>)> {
    let drain_stage = Stage::new("drain", DRAIN_STALL, DRAIN_FAILURE, |stats| {
        &stats.stage_stalled_drain
    });
    // Building one interval may take up to an interval before firn falls
    // behind.
    let build_stall = config.profiling_duration.max(Duration::from_secs(10));
    let build_stage = Stage::new(
        "build",
        build_stall,
        build_stall.saturating_mul(6),
        |stats| &stats.stage_stalled_build,
    );
    watchdog::spawn(
        vec![drain_stage.clone(), build_stage.clone()],
        Some(health.clone()),
        stats.clone(),
        FORCED_EXIT_AFTER,
    )
    .context("could not start the watchdog")?;
    Ok((drain_stage, build_stage))
}

/// Hands one interval after another to the builder until a signal comes;
/// returns when it came.
async fn sample_intervals(
    session: &mut Session,
    signals: &mut ShutdownSignal,
    profiling_duration: Duration,
    sender: &mpsc::SyncSender<Interval>,
    health: &Health,
    stats: &Stats,
) -> Result<Instant> {
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + profiling_duration,
        profiling_duration,
    );
    let mut counters_before = session.bpf_counters();
    let off_cpu = session.off_cpu();
    loop {
        let stop = session
            .collect_until(async {
                tokio::select! {
                    _ = ticker.tick() => None,
                    signal = signals.recv() => Some((signal, Instant::now())),
                }
            })
            .await
            .context("reading the ring buffer failed")?;
        let counters = session.bpf_counters();
        let interval = Interval {
            aggregated: session.take_profile(),
            off_cpu: off_cpu.then(|| session.take_off_cpu_profile()),
            bpf: counters.since(&counters_before),
            run_time: session.sampler_run_time(),
            processes: session.process_table(),
        };
        counters_before = counters;
        if stop.is_some() {
            health.set_ready(false);
        }
        match sender.try_send(interval) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                Stats::inc(&stats.profiles_dropped);
                warn!("profile dropped: the builder is still busy with earlier intervals");
            }
            Err(mpsc::TrySendError::Disconnected(_)) => bail!("the profile builder thread stopped"),
        }
        if let Some((signal, at)) = stop {
            info!(
                signal,
                "shutting down: BPF detached, writing the last profile"
            );
            return Ok(at);
        }
    }
}

/// What the builder thread is given.
struct Builder {
    receiver: mpsc::Receiver<Interval>,
    exporter: Box<dyn Exporter>,
    labeler: Labeler,
    period: i64,
    /// The off-CPU period, with `--off-cpu`.
    off_cpu_period: Option<i64>,
    symbolizer: Box<dyn FnOnce() -> HostSymbolizer + Send>,
    stats: Arc<Stats>,
    stage: Arc<Stage>,
}

/// The builder thread, running.
struct RunningBuilder {
    thread: thread::JoinHandle<()>,
    /// Set once, at shutdown: when the builder and the exporter must be done.
    deadline: Arc<OnceLock<Instant>>,
    done: mpsc::Receiver<()>,
}

impl Builder {
    /// Builds and exports each interval it receives until the sender is
    /// dropped, then has the exporter finish by the deadline.
    fn spawn(self) -> Result<RunningBuilder> {
        let (done_sender, done) = mpsc::channel::<()>();
        let deadline = Arc::new(OnceLock::<Instant>::new());
        let thread = {
            let deadline = deadline.clone();
            thread::Builder::new()
                .name("firn-builder".into())
                .spawn(move || {
                    let mut exporter = self.exporter;
                    build_loop(
                        self.receiver,
                        exporter.as_mut(),
                        &self.labeler,
                        (self.period, self.off_cpu_period),
                        (self.symbolizer)(),
                        self.stats,
                        &self.stage,
                    );
                    let deadline = deadline
                        .get()
                        .copied()
                        .unwrap_or_else(|| Instant::now() + FLUSH_DEADLINE);
                    exporter.finish(deadline);
                    let _ = done_sender.send(());
                })
                .context("could not start the profile builder thread")?
        };
        Ok(RunningBuilder {
            thread,
            deadline,
            done,
        })
    }
}

impl RunningBuilder {
    /// Closes the intervals' channel and waits until `exit_by` for the
    /// last profiles.
    fn finish(self, sender: mpsc::SyncSender<Interval>, exit_by: Instant) {
        // Before the channel closes: the builder reads it once it has
        // built the last interval.
        let _ = self.deadline.set(exit_by - EXPORTER_MARGIN);
        drop(sender);
        match self
            .done
            .recv_timeout(exit_by.saturating_duration_since(Instant::now()))
        {
            Ok(()) => {
                let _ = self.thread.join();
            }
            Err(_) => warn!(
                budget = ?SHUTDOWN_BUDGET,
                "the last profiles were not delivered in time"
            ),
        }
    }
}

/// The pipeline's stages as configured, with relabeling's keep and drop
/// rules applied on each process's first sample where they can be.
fn pipeline_config(config: &AgentConfig) -> PipelineConfig {
    PipelineConfig {
        exclusion: applies_early(&config.metadata).then(|| config.metadata.clone()),
        ..config.pipeline.clone()
    }
}

fn log_totals(totals: &StatsSnapshot) {
    info!(
        profiles_written = totals.profiles_written,
        profiles_dropped = totals.profiles_dropped,
        remote_profiles_sent = totals.remote_profiles_sent,
        remote_send_failures = totals.remote_send_failures,
        remote_send_retries = totals.remote_send_retries,
        remote_profiles_dropped = totals.remote_profiles_dropped,
        remote_profiles_rejected = totals.remote_profiles_rejected,
        debuginfo_uploads = totals.debuginfo_uploads,
        debuginfo_upload_failures = totals.debuginfo_upload_failures,
        debuginfo_uploads_skipped = totals.debuginfo_uploads_skipped,
        samples_dropped_relabel = totals.samples_dropped_relabel,
        processes_excluded = totals.processes_excluded,
        samples_excluded = totals.samples_excluded,
        kubernetes_watch_errors = totals.kubernetes_watch_errors,
        "firn agent stopped"
    );
}

/// The labeler and, in Kubernetes, the watch that feeds it pods (kept
/// alive for as long as the agent runs).
fn labeler(config: &AgentConfig, stats: &Arc<Stats>) -> (Labeler, Option<KubernetesWatcher>) {
    let metadata = &config.metadata;
    let host = &config.pipeline.host;
    let Some(kubernetes) = &metadata.kubernetes else {
        info!(
            "not running in Kubernetes (no KUBERNETES_SERVICE_HOST or --kubernetes-api-server): \
             no pod labels"
        );
        return (Labeler::new(metadata, host, None), None);
    };
    let pods = Arc::new(PodIndex::new());
    match KubernetesWatcher::start(kubernetes, pods.clone(), stats.clone()) {
        Ok(watcher) => {
            info!(
                api_server = kubernetes.api_server,
                node = kubernetes.node,
                "reading pod metadata from the Kubernetes API server"
            );
            (Labeler::new(metadata, host, Some(pods)), Some(watcher))
        }
        Err(error) => {
            warn!(error = %format!("{:#}", anyhow::Error::from(error)), "no pod labels: the Kubernetes watch could not start");
            (Labeler::new(metadata, host, None), None)
        }
    }
}

fn build_loop(
    receiver: mpsc::Receiver<Interval>,
    exporter: &mut dyn Exporter,
    labeler: &Labeler,
    (period, off_cpu_period): (i64, Option<i64>),
    mut symbolizer: HostSymbolizer,
    stats: Arc<Stats>,
    stage: &Stage,
) {
    let mut before = stats.snapshot();
    let mut frame_cache = FrameCache::new(FRAME_CACHE_BYTES, stats.clone());
    while let Ok(mut interval) = receiver.recv() {
        stage.step();
        // Idle again however this interval ends.
        let _idle = IdleOnDrop(stage);
        if let (Some(off_cpu), Some(period)) = (interval.off_cpu.take(), off_cpu_period) {
            export_off_cpu(
                off_cpu,
                exporter,
                labeler,
                period,
                (&mut symbolizer, &mut frame_cache),
                &stats,
            );
        }
        if interval.aggregated.samples == 0 && interval.aggregated.dropped == 0 {
            tracing::debug!(
                lost = lost_samples(&interval.bpf),
                "no samples in this interval"
            );
            continue;
        }
        let stacks = interval.aggregated.stacks.len();
        let dropped = interval.aggregated.dropped;
        let symbolized = cpu::measure(CpuStage::Symbolize, || {
            symbolize_interval(interval.aggregated, &mut symbolizer, &mut frame_cache)
        });
        let grouping = exporter.grouping();
        let labelled = cpu::measure(CpuStage::Label, || {
            label_interval(symbolized, grouping, labeler, &stats)
        });
        let (batch, summary) =
            cpu::measure(CpuStage::Encode, || build_batch(labelled, period, &stats));
        let profiles = batch.profiles.len();
        let unsymbolized_objects = batch.unsymbolized_objects;
        let exported = cpu::measure(CpuStage::Export, || exporter.export(batch));
        let now = stats.snapshot();
        let delta = now.since(&before);
        before = now;
        let lost = lost_samples(&interval.bpf);
        match exported {
            Ok(receipt) => {
                info!(
                    destination = receipt.destination,
                    bytes = receipt.bytes,
                    profiles,
                    samples = summary.samples,
                    stacks,
                    lost,
                    stack_failures = stack_failures(&interval.bpf),
                    dropped,
                    unknown_frames = unknown_frames(&delta),
                    unsymbolized_objects,
                    dwarf_stacks = delta.unwind_dwarf_stacks,
                    dwarf_complete = delta.unwind_dwarf_complete,
                    processes = interval.processes.processes,
                    objects = interval.processes.objects,
                    bpf_mean_ns = interval
                        .run_time
                        .map(|r| r.run_time_ns / r.run_count.max(1)),
                    remote_sent = delta.remote_profiles_sent,
                    remote_failures = delta.remote_send_failures,
                    remote_dropped = delta.remote_profiles_dropped,
                    remote_queue_bytes = now.remote_queue_bytes,
                    dropped_relabel = delta.samples_dropped_relabel,
                    "{}",
                    receipt.action
                );
            }
            Err(error) => {
                Stats::inc(&stats.profiles_dropped);
                error!(error = %format!("{:#}", anyhow::Error::from(error)), "profile dropped");
            }
        }
    }
}

/// The off-CPU samples of one interval, built and handed to the exporter
/// as a batch of their own (each server gets them under its off-CPU
/// profile type).
fn export_off_cpu(
    aggregated: AggregatedProfile,
    exporter: &mut dyn Exporter,
    labeler: &Labeler,
    period: i64,
    (symbolizer, frame_cache): (&mut HostSymbolizer, &mut FrameCache),
    stats: &Arc<Stats>,
) {
    if aggregated.samples == 0 && aggregated.dropped == 0 {
        return;
    }
    let (stacks, dropped) = (aggregated.stacks.len(), aggregated.dropped);
    let symbolized = cpu::measure(CpuStage::Symbolize, || {
        symbolize_interval(aggregated, symbolizer, frame_cache)
    });
    let grouping = exporter.grouping();
    let labelled = cpu::measure(CpuStage::Label, || {
        label_interval(symbolized, grouping, labeler, stats)
    });
    let (batch, summary) = cpu::measure(CpuStage::Encode, || {
        build_off_cpu_batch(labelled, period, stats)
    });
    let profiles = batch.profiles.len();
    match cpu::measure(CpuStage::Export, || exporter.export(batch)) {
        Ok(receipt) => info!(
            destination = receipt.destination,
            bytes = receipt.bytes,
            profiles,
            periods = summary.samples,
            waited_ms = summary.samples.saturating_mul(period.max(0) as u64) / 1_000_000,
            stacks,
            dropped,
            "off-CPU {}",
            receipt.action
        ),
        Err(error) => {
            Stats::inc(&stats.profiles_dropped);
            error!(error = %format!("{:#}", anyhow::Error::from(error)), "off-CPU profile dropped");
        }
    }
}
