//! `firn record`: one recording, one profile, optionally a flame graph;
//! with a command, the recording follows it and what it starts.

mod live;

use std::{
    io::IsTerminal,
    sync::Arc,
    time::{Duration, Instant},
};

use agent_pprof::{BuildSummary, encode_gzip, proto, validate};
use anyhow::{Context, Result, bail};
use firn::{
    aggregate::AggregatedProfile,
    bpf::{BpfCounters, ProgramRunTime},
    config::RecordConfig,
    labels::{Labeler, applies_early},
    launch::{Held, LaunchConfig, Running, TargetUser, shell_status},
    output::{build_whole_profile, check_writable, write_flamegraph},
    report::{SampleFilter, Summary, render_summary},
    session::{PipelineConfig, Session, ShutdownSignal},
    stats::Stats,
    symbolize::HostSymbolizer,
    watchdog::{self, Stage},
};
use tracing::{info, warn};

use self::live::{StatusLine, Stop};
use super::{lost_samples, period_ns, pid_problem, stack_failures, unknown_frames};

/// From SIGINT/SIGTERM/SIGHUP to the watchdog ending a recording whose
/// last profile is still not written (a big profile takes seconds to
/// symbolize; a hung one never ends).
const FORCED_EXIT_AFTER: Duration = Duration::from_secs(30);
/// A drain step this long is logged as a stall.
const RECORD_DRAIN_STALL: Duration = Duration::from_secs(5);
/// A recording without a command, and without --duration.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Functions the summary at the end lists.
const SUMMARY_FUNCTIONS: usize = 10;
/// Threads in the wall-clock summary of `record --off-cpu`.
const SUMMARY_THREADS: usize = 10;

/// Records; the exit status firn ends with (the command's, with one).
pub async fn run(config: &RecordConfig) -> Result<u8> {
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
    // From here on a signal is kept for the loop (or the command).
    let mut signals = ShutdownSignal::install().context("could not catch signals")?;
    let held = match config.command.split_first() {
        Some((program, args)) => Some(
            Held::spawn(&LaunchConfig {
                program: program.clone(),
                args: args.to_vec(),
                user: TargetUser::from_sudo(|name| std::env::var(name).ok())?,
            })
            .context("nothing recorded")?,
        ),
        None => None,
    };
    let stats = Arc::new(Stats::default());
    let mut sampling = config.sampling.clone();
    sampling.pids.extend(held.as_ref().map(Held::pid));
    // A failure here drops `held`: the command gives up without running.
    let pipeline = PipelineConfig {
        exclusion: applies_early(&config.metadata).then(|| config.metadata.clone()),
        ..config.pipeline.clone()
    };
    let session = Session::start(&sampling, &pipeline, &config.sampling.pids, stats.clone())?;
    let command = held
        .map(Held::release)
        .transpose()
        .context("the command did not start")?;
    let mut exited = live::command_exit(command.as_ref());
    let limit = match (&command, config.duration) {
        (_, Some(duration)) => Some(duration),
        (Some(_), None) => None,
        (None, None) => Some(DEFAULT_DURATION),
    };
    let recording = record(
        session,
        config,
        limit,
        command.as_ref(),
        &mut exited,
        &mut signals,
        &stats,
    )
    .await?;
    write_profiles(
        config,
        recording.aggregated,
        recording.off_cpu,
        &recording.bpf,
        recording.run_time,
        &stats,
    )?;
    let Some(command) = command else {
        return Ok(0);
    };
    if recording.stop != Stop::Exited {
        live::until_exit(&command, &mut exited, &mut signals).await;
    }
    let status = command
        .reap()
        .context("could not read the command's exit status")?;
    info!(%status, "the command exited");
    Ok(shell_status(status))
}

/// Writes the CPU profile and, with `--off-cpu`, the off-CPU one beside
/// it, each with its flame graph and summary.
fn write_profiles(
    config: &RecordConfig,
    aggregated: AggregatedProfile,
    off_cpu: Option<AggregatedProfile>,
    bpf: &BpfCounters,
    run_time: Option<ProgramRunTime>,
    stats: &Arc<Stats>,
) -> Result<()> {
    let cpu = Target {
        output: config.output.clone(),
        flamegraph: config.flamegraph.clone(),
        period_ns: period_ns(config.sampling.frequency_hz),
        off_cpu: false,
    };
    let written = write_profile(config, &cpu, aggregated, stats)?;
    report(config, bpf, run_time, &written, stats);
    if config.summary {
        print_summary(&cpu, &written.profile);
    }
    if let (Some(aggregated), Some(period)) = (off_cpu, config.sampling.off_cpu_period) {
        let off_cpu = Target {
            output: firn::offcpu::beside(&config.output),
            flamegraph: config.flamegraph.as_deref().map(firn::offcpu::beside),
            period_ns: i64::try_from(period.as_nanos()).unwrap_or(i64::MAX),
            off_cpu: true,
        };
        let off_cpu_written = write_profile(config, &off_cpu, aggregated, stats)?;
        report_off_cpu(&off_cpu, bpf, &off_cpu_written);
        if config.summary {
            print_summary(&off_cpu, &off_cpu_written.profile);
        }
        write_wall(config, &written.profile, &off_cpu_written.profile)?;
    }
    Ok(())
}

/// What one recording sampled.
struct Recording {
    aggregated: AggregatedProfile,
    /// With `--off-cpu`: where the threads waited.
    off_cpu: Option<AggregatedProfile>,
    bpf: BpfCounters,
    run_time: Option<ProgramRunTime>,
    stop: Stop,
}

/// Samples until `limit`, the command's exit or a signal, then detaches.
async fn record(
    mut session: Session,
    config: &RecordConfig,
    limit: Option<Duration>,
    command: Option<&Running>,
    exited: &mut live::Pending,
    signals: &mut ShutdownSignal,
    stats: &Arc<Stats>,
) -> Result<Recording> {
    let drain_stage = Stage::new("drain", RECORD_DRAIN_STALL, Duration::MAX, |stats| {
        &stats.stage_stalled_drain
    });
    session.watch_drain(drain_stage.clone());
    // With a command, signals are the command's to act on: firn ends when
    // it does, however long that takes.
    let forced_exit_after = match command {
        Some(_) => Duration::MAX,
        None => FORCED_EXIT_AFTER,
    };
    watchdog::spawn(vec![drain_stage], None, stats.clone(), forced_exit_after)
        .context("could not start the watchdog")?;
    info!(
        cpus = session.cpus(),
        frequency_hz = config.sampling.frequency_hz,
        duration = %limit.map_or_else(|| "until the command exits".to_owned(), |limit| humantime::format_duration(limit).to_string()),
        pids = ?config.sampling.pids,
        command_pid = command.map(|command| command.pid),
        "recording"
    );
    let mut status = if config.summary {
        StatusLine::on_terminal(limit, stats.clone(), session.bpf_probe().ok())
    } else {
        None
    };
    let started = Instant::now();
    let stop = session
        .collect_until(live::until_stop(
            limit,
            command,
            exited,
            signals,
            status.as_mut(),
        ))
        .await
        .context("reading the ring buffer failed")?;
    drop(status);
    if let Stop::Signal(signal) = stop {
        info!(signal, elapsed = ?started.elapsed(), "stopping early");
    }
    Ok(Recording {
        aggregated: session.take_profile(),
        off_cpu: config
            .sampling
            .off_cpu_period
            .map(|_| session.take_off_cpu_profile()),
        bpf: session.bpf_counters(),
        run_time: session.sampler_run_time(),
        stop,
    })
}

/// The hottest functions and the files written, on standard output.
fn print_summary(target: &Target, profile: &proto::Profile) {
    let width = std::io::stdout()
        .is_terminal()
        .then(|| crossterm::terminal::size().ok())
        .flatten()
        .map(|(columns, _)| usize::from(columns));
    let summary = Summary::of(profile, &SampleFilter::default());
    let mut text = render_summary(&summary, SUMMARY_FUNCTIONS, width);
    let what = if target.off_cpu {
        "off-CPU profile"
    } else {
        "profile"
    };
    text.push_str(&format!("# {what}: {}\n", target.output.display()));
    if let Some(path) = &target.flamegraph {
        text.push_str(&format!("# flame graph: {}\n", path.display()));
    }
    print!("{text}");
}

/// The profile as written.
struct Written {
    profile: proto::Profile,
    bytes: usize,
    stacks: usize,
    dropped: u64,
    summary: BuildSummary,
}

/// Where one profile goes and what it holds.
struct Target {
    output: std::path::PathBuf,
    flamegraph: Option<std::path::PathBuf>,
    /// What one sample stands for: the CPU sampling period, or the
    /// off-CPU one.
    period_ns: i64,
    /// Time waited (`off_cpu`/`nanoseconds`) rather than CPU time.
    off_cpu: bool,
}

/// Symbolizes, labels and writes the profile (and the flame graph).
fn write_profile(
    config: &RecordConfig,
    target: &Target,
    aggregated: AggregatedProfile,
    stats: &Arc<Stats>,
) -> Result<Written> {
    let mut symbolizer = HostSymbolizer::new(&config.pipeline.host, &config.symbols, stats.clone());
    let stacks = aggregated.stacks.len();
    let dropped = aggregated.dropped;
    let (mut profile, summary) = build_whole_profile(
        aggregated,
        target.period_ns,
        &Labeler::new(&config.metadata, &config.pipeline.host, None),
        &mut symbolizer,
        stats,
    );
    if target.off_cpu {
        firn::offcpu::mark_profile(&mut profile);
    }
    validate(&profile).context("firn built a profile that breaks the pprof rules (a bug)")?;
    let bytes = encode_gzip(&profile);
    std::fs::write(&target.output, &bytes)
        .with_context(|| format!("could not write {}", target.output.display()))?;
    let title = match target.off_cpu {
        true => "firn record: off-CPU",
        false => "firn record",
    };
    if let Some(path) = &target.flamegraph {
        write_flamegraph(&profile, title, path)
            .with_context(|| format!("could not write the flame graph {}", path.display()))?;
    }
    Ok(Written {
        profile,
        bytes: bytes.len(),
        stacks,
        dropped,
        summary,
    })
}

/// The wall-clock view (`NAME.wall.pb.gz` and its flame graph): each
/// thread's CPU and off-CPU time under it, and the split per thread in
/// the summary.
fn write_wall(config: &RecordConfig, cpu: &proto::Profile, off_cpu: &proto::Profile) -> Result<()> {
    let output = firn::offcpu::beside_as(&config.output, "wall");
    let profile = firn::wall::wall_profile(cpu, off_cpu);
    validate(&profile)
        .context("firn built a wall-clock profile that breaks the pprof rules (a bug)")?;
    let bytes = encode_gzip(&profile);
    std::fs::write(&output, &bytes)
        .with_context(|| format!("could not write {}", output.display()))?;
    let flamegraph = config
        .flamegraph
        .as_deref()
        .map(|path| firn::offcpu::beside_as(path, "wall"));
    if let Some(path) = &flamegraph {
        write_flamegraph(&profile, "firn record: wall-clock (on-CPU + off-CPU)", path)
            .with_context(|| format!("could not write the flame graph {}", path.display()))?;
    }
    let threads = firn::wall::thread_times(&profile);
    info!(
        output = %output.display(),
        bytes = bytes.len(),
        threads = threads.len(),
        on_cpu_ms = threads.iter().map(|t| t.on_cpu_ns).sum::<i64>() / 1_000_000,
        off_cpu_ms = threads.iter().map(|t| t.off_cpu_ns).sum::<i64>() / 1_000_000,
        "wall-clock profile written"
    );
    if config.summary {
        let mut text = firn::wall::render_thread_times(&threads, SUMMARY_THREADS);
        text.push_str(&format!("# wall-clock profile: {}\n", output.display()));
        if let Some(path) = &flamegraph {
            text.push_str(&format!("# flame graph: {}\n", path.display()));
        }
        print!("{text}");
    }
    Ok(())
}

/// The off-CPU profile's line: how much waiting it holds and what was not
/// kept.
fn report_off_cpu(target: &Target, bpf: &BpfCounters, written: &Written) {
    use agent_common::Counter;
    let lost = bpf.get(Counter::OffCpuLostRingFull);
    if lost > 0 {
        warn!(
            lost,
            "off-CPU samples were lost (ring buffer full); consider --ring-buffer-size"
        );
    }
    info!(
        output = %target.output.display(),
        bytes = written.bytes,
        periods = written.summary.samples,
        waited_ms = written.summary.samples.saturating_mul(target.period_ns.max(0) as u64) / 1_000_000,
        stacks = written.stacks,
        waits_followed = bpf.get(Counter::OffCpuWaits),
        waits_not_kept = bpf.get(Counter::OffCpuNotKept),
        samples_written = bpf.get(Counter::OffCpuWritten),
        map_full = bpf.get(Counter::OffCpuMapFull),
        outside_syscalls = bpf.get(Counter::OffCpuOutsideSyscall),
        lost,
        "off-CPU profile written"
    );
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
        exec_presets_set = snapshot.unwind_exec_presets_set,
        exec_presets_applied = bpf.get(agent_common::Counter::ExecPresetsApplied),
        bpf_mean_ns = run_time.map(|r| r.run_time_ns / r.run_count.max(1)),
        "profile written"
    );
}
