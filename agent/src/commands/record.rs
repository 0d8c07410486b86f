//! `firn record`: one recording, one profile, optionally a flame graph.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use agent_pprof::{BuildSummary, encode_gzip, validate};
use anyhow::{Context, Result, bail};
use firn::{
    aggregate::AggregatedProfile,
    bpf::{BpfCounters, ProgramRunTime},
    config::RecordConfig,
    labels::Labeler,
    output::{build_whole_profile, check_writable, write_flamegraph},
    session::{Session, shutdown_signal},
    stats::Stats,
    symbolize::HostSymbolizer,
    watchdog::{self, Stage},
};
use tracing::{info, warn};

use super::{lost_samples, period_ns, pid_problem, stack_failures, unknown_frames};

/// From SIGINT/SIGTERM/SIGHUP to the watchdog ending a recording whose
/// last profile is still not written (a big profile takes seconds to
/// symbolize; a hung one never ends).
const FORCED_EXIT_AFTER: Duration = Duration::from_secs(30);
/// A drain step this long is logged as a stall.
const RECORD_DRAIN_STALL: Duration = Duration::from_secs(5);

pub async fn run(config: &RecordConfig) -> Result<()> {
    // Before sampling: a typo must not cost the whole recording.
    for path in std::iter::once(&config.output).chain(&config.flamegraph) {
        check_writable(path).context("nothing recorded")?;
    }
    // As `perf record -p`: a pid that is no running process is an error,
    // not an empty profile.
    if let Some(problem) = config
        .sampling
        .pids
        .iter()
        .find_map(|&pid| pid_problem(&config.pipeline.host, pid))
    {
        bail!("{problem}; nothing recorded");
    }
    let stats = Arc::new(Stats::default());
    let recording = record(config, &stats).await?;
    let written = write_profile(config, recording.aggregated, &stats)?;
    report(config, &recording.bpf, recording.run_time, &written, &stats);
    Ok(())
}

/// What one recording sampled.
struct Recording {
    aggregated: AggregatedProfile,
    bpf: BpfCounters,
    run_time: Option<ProgramRunTime>,
}

/// Samples for `config.duration` or until a signal, then detaches.
async fn record(config: &RecordConfig, stats: &Arc<Stats>) -> Result<Recording> {
    let mut session = Session::start(&config.sampling, &config.pipeline, stats.clone())?;
    let drain_stage = Stage::new("drain", RECORD_DRAIN_STALL, Duration::MAX, |stats| {
        &stats.stage_stalled_drain
    });
    session.watch_drain(drain_stage.clone());
    watchdog::spawn(vec![drain_stage], None, stats.clone(), FORCED_EXIT_AFTER)
        .context("could not start the watchdog")?;
    info!(
        cpus = session.cpus(),
        frequency_hz = config.sampling.frequency_hz,
        duration = %humantime::format_duration(config.duration),
        pids = ?config.sampling.pids,
        "recording"
    );
    let started = Instant::now();
    let interrupted = session
        .collect_until(async {
            tokio::select! {
                () = tokio::time::sleep(config.duration) => None,
                signal = shutdown_signal() => signal.ok(),
            }
        })
        .await
        .context("reading the ring buffer failed")?;
    if let Some(signal) = interrupted {
        info!(signal, elapsed = ?started.elapsed(), "stopping early");
    }
    Ok(Recording {
        aggregated: session.take_profile(),
        bpf: session.bpf_counters(),
        run_time: session.sampler_run_time(),
    })
}

/// The profile as written.
struct Written {
    bytes: usize,
    stacks: usize,
    dropped: u64,
    summary: BuildSummary,
}

/// Symbolizes, labels and writes the profile (and the flame graph).
fn write_profile(
    config: &RecordConfig,
    aggregated: AggregatedProfile,
    stats: &Arc<Stats>,
) -> Result<Written> {
    let mut symbolizer = HostSymbolizer::new(&config.pipeline.host, &config.symbols, stats.clone());
    let stacks = aggregated.stacks.len();
    let dropped = aggregated.dropped;
    let (profile, summary) = build_whole_profile(
        aggregated,
        period_ns(config.sampling.frequency_hz),
        &Labeler::new(&config.metadata, &config.pipeline.host, None),
        &mut symbolizer,
        stats,
    );
    validate(&profile).context("firn built a profile that breaks the pprof rules (a bug)")?;
    let bytes = encode_gzip(&profile);
    std::fs::write(&config.output, &bytes)
        .with_context(|| format!("could not write {}", config.output.display()))?;
    if let Some(path) = &config.flamegraph {
        write_flamegraph(&profile, "firn record", path)
            .with_context(|| format!("could not write the flame graph {}", path.display()))?;
    }
    Ok(Written {
        bytes: bytes.len(),
        stacks,
        dropped,
        summary,
    })
}

/// What was lost, and the summary line.
fn report(
    config: &RecordConfig,
    bpf: &BpfCounters,
    run_time: Option<ProgramRunTime>,
    written: &Written,
    stats: &Stats,
) {
    let snapshot = stats.snapshot();
    tracing::debug!(?bpf, "BPF counters");
    let lost = lost_samples(bpf);
    if lost > 0 {
        warn!(
            lost,
            "samples were lost (ring buffer full); consider --ring-buffer-size"
        );
    }
    if written.dropped > 0 {
        warn!(
            dropped = written.dropped,
            "samples dropped at the --max-stacks-per-profile limit"
        );
    }
    info!(
        output = %config.output.display(),
        bytes = written.bytes,
        samples = written.summary.samples,
        stacks = written.stacks,
        samples_dropped_relabel = snapshot.samples_dropped_relabel,
        locations = written.summary.locations,
        lost,
        stack_failures = stack_failures(bpf),
        unknown_frames = unknown_frames(&snapshot),
        leaf_frames_repaired = snapshot.leaf_frames_repaired,
        dwarf_stacks = snapshot.unwind_dwarf_stacks,
        dwarf_complete = snapshot.unwind_dwarf_complete,
        dwarf_truncated = snapshot.unwind_truncated,
        bpf_mean_ns = run_time.map(|r| r.run_time_ns / r.run_count.max(1)),
        "profile written"
    );
}
