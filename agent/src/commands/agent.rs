//! The agent: samples continuously and writes one profile per interval.

use std::{
    path::Path,
    sync::{Arc, mpsc},
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use firn::{
    aggregate::AggregatedProfile,
    bpf::{BpfCounters, ProgramRunTime},
    config::AgentConfig,
    output::LocalStore,
    pprof::{build_profile, encode_gzip, validate},
    process::ProcessTableStats,
    session::{Session, shutdown_signal},
    stats::Stats,
    symbolize::Symbolizer,
};
use tracing::{error, info, warn};

use super::{lost_samples, period_ns, stack_failures, unknown_frames};

/// Intervals waiting to be built; beyond this the newest is dropped and
/// counted rather than letting memory grow.
const BUILD_QUEUE: usize = 2;
/// How long shutdown waits for the last profile to be written.
const FLUSH_DEADLINE: Duration = Duration::from_secs(8);

/// One interval handed from the sampling loop to the builder thread.
struct Interval {
    aggregated: AggregatedProfile,
    bpf: BpfCounters,
    run_time: Option<ProgramRunTime>,
    processes: ProcessTableStats,
}

pub async fn run(config: &AgentConfig) -> Result<()> {
    let stats = Arc::new(Stats::default());
    let store = LocalStore::new(
        &config.local_store.directory,
        config.local_store.max_bytes,
        stats.clone(),
    )?;
    let mut session = Session::start(&config.sampling, &config.limits, stats.clone())?;
    info!(
        cpus = session.cpus(),
        frequency_hz = config.sampling.frequency_hz,
        profiling_duration = %humantime::format_duration(config.profiling_duration),
        local_store = %config.local_store.directory.display(),
        ring_buffer_bytes = session.ring_buffer_bytes(),
        "firn agent started"
    );

    let (sender, receiver) = mpsc::sync_channel::<Interval>(BUILD_QUEUE);
    let (done_sender, done_receiver) = mpsc::channel::<()>();
    let builder = {
        let stats = stats.clone();
        let period = period_ns(config.sampling.frequency_hz);
        let cache_bytes = config.limits.symbol_cache_bytes;
        thread::Builder::new()
            .name("firn-builder".into())
            .spawn(move || {
                build_loop(receiver, store, period, cache_bytes, stats);
                let _ = done_sender.send(());
            })
            .context("could not start the profile builder thread")?
    };

    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + config.profiling_duration,
        config.profiling_duration,
    );
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut counters_before = session.bpf_counters();
    loop {
        let stop = session
            .collect_until(async {
                tokio::select! {
                    _ = ticker.tick() => None,
                    signal = &mut shutdown => Some(signal),
                }
            })
            .await
            .context("reading the ring buffer failed")?;
        let counters = session.bpf_counters();
        let interval = Interval {
            aggregated: session.take_profile(),
            bpf: counters.since(&counters_before),
            run_time: session.sampler_run_time(),
            processes: session.process_table(),
        };
        counters_before = counters;
        match sender.try_send(interval) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                Stats::inc(&stats.profiles_dropped);
                warn!("profile dropped: the builder is still busy with earlier intervals");
            }
            Err(mpsc::TrySendError::Disconnected(_)) => bail!("the profile builder thread stopped"),
        }
        match stop {
            None => {}
            Some(Ok(signal)) => {
                info!(
                    signal,
                    "shutting down: BPF detached, writing the last profile"
                );
                break;
            }
            Some(Err(error)) => return Err(error).context("could not watch for SIGINT/SIGTERM"),
        }
    }
    // Detach the BPF programs first: nothing is sampled from here on.
    drop(session);
    drop(sender);
    match done_receiver.recv_timeout(FLUSH_DEADLINE) {
        Ok(()) => {
            let _ = builder.join();
        }
        Err(_) => warn!(deadline = ?FLUSH_DEADLINE, "the last profile was not written in time"),
    }
    Ok(())
}

fn build_loop(
    receiver: mpsc::Receiver<Interval>,
    store: LocalStore,
    period: i64,
    cache_bytes: usize,
    stats: Arc<Stats>,
) {
    let mut symbolizer = Symbolizer::new(Path::new("/proc/kallsyms"), cache_bytes, stats.clone());
    let mut before = stats.snapshot();
    while let Ok(interval) = receiver.recv() {
        if interval.aggregated.samples == 0 && interval.aggregated.dropped == 0 {
            tracing::debug!(
                lost = lost_samples(&interval.bpf),
                "no samples in this interval"
            );
            continue;
        }
        let (profile, summary) =
            build_profile(&interval.aggregated, period, &mut symbolizer, &stats);
        if let Err(error) = validate(&profile) {
            Stats::inc(&stats.profiles_dropped);
            error!(%error, "profile dropped: it breaks the pprof rules (a bug in firn)");
            continue;
        }
        let bytes = encode_gzip(&profile);
        let written = store.write(&bytes, interval.aggregated.start);
        let now = stats.snapshot();
        let delta = now.since(&before);
        before = now;
        let lost = lost_samples(&interval.bpf);
        match written {
            Ok(path) => {
                Stats::inc(&stats.profiles_written);
                info!(
                    file = %path.display(),
                    bytes = bytes.len(),
                    samples = summary.samples,
                    stacks = interval.aggregated.stacks.len(),
                    lost,
                    stack_failures = stack_failures(&interval.bpf),
                    dropped = interval.aggregated.dropped,
                    unknown_frames = unknown_frames(&delta),
                    dwarf_stacks = delta.unwind_dwarf_stacks,
                    dwarf_complete = delta.unwind_dwarf_complete,
                    processes = interval.processes.processes,
                    objects = interval.processes.objects,
                    bpf_mean_ns = interval.run_time.map(|r| r.run_time_ns / r.run_count.max(1)),
                    "profile written"
                );
            }
            Err(error) => {
                Stats::inc(&stats.profiles_dropped);
                error!(error = %anyhow::Error::from(error), "profile dropped");
            }
        }
    }
}
