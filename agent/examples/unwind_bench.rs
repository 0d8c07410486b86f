//! Unwinding measurements behind `cargo xtask bench --unwind dwarf`, run as
//! root against a live workload:
//!
//! - `replay --pid PID`: captures that process's samples with the real BPF
//!   program (DWARF stack copies), stops sampling, then feeds the captured
//!   records through firn's pipeline (decode, process table, unwinding,
//!   aggregation) again and again: samples per second on one core.
//! - `share --profile FILE --comm NAME --chain a,b,c`: the share of a
//!   profile's samples of NAME (in `--within`, if given) that hold the
//!   chain; with `--interpreted MAPPING` (`[python]`, `[ruby]`), whose
//!   frames of that runtime's mapping are the chain exactly.
//! - `capture --pid PID --output PREFIX`: one sample's registers and stack
//!   copy plus the process's maps, for unit test fixtures.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use agent_pprof::{Reader, decode};
use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use firn::{
    bpf::BpfSampler,
    sampler::{self, Record, SamplingConfig, UnwindMode},
    session::{Pipeline, PipelineConfig},
    stats::Stats,
    unwind::UnwindPolicy,
};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Replay {
        #[arg(long)]
        pid: u32,
        /// Seconds of sampling to capture.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value_t = 100)]
        frequency: u64,
        /// Times the captured records are replayed.
        #[arg(long, default_value_t = 20)]
        passes: usize,
    },
    Share {
        #[arg(long)]
        profile: PathBuf,
        #[arg(long)]
        comm: String,
        /// Frames, leaf first, comma-separated.
        #[arg(long, value_delimiter = ',')]
        chain: Vec<String>,
        /// Only samples holding this frame count.
        #[arg(long)]
        within: Option<String>,
        /// Match the chain against the sample's frames of this runtime's
        /// mapping (`[python]`, `[ruby]`), all of them.
        #[arg(long, value_name = "MAPPING")]
        interpreted: Option<String>,
        /// Prints up to this many of the samples that miss the chain, one
        /// frame a line (name, mapping, line), to see what they are.
        #[arg(long, default_value_t = 0)]
        misses: usize,
    },
    Capture {
        #[arg(long)]
        pid: u32,
        /// Writes PREFIX.stack (the copy) and PREFIX.regs (text).
        #[arg(long)]
        output: PathBuf,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Replay {
            pid,
            seconds,
            frequency,
            passes,
        } => replay(pid, seconds, frequency, passes),
        Command::Share {
            profile,
            comm,
            chain,
            within,
            interpreted,
            misses,
        } => share(
            &profile,
            &comm,
            &chain,
            within.as_deref(),
            interpreted.as_deref(),
            misses,
        ),
        Command::Capture { pid, output } => capture(pid, &output),
    }
}

/// The raw ring buffer records of `pid` over `seconds`.
fn capture_records(pid: u32, seconds: u64, frequency: u64) -> Result<Vec<Vec<u8>>> {
    let sampling = SamplingConfig {
        frequency_hz: frequency,
        pids: vec![pid],
        unwind: UnwindMode::Dwarf,
        ..SamplingConfig::default()
    };
    Ok(BpfSampler::record(&sampling, Duration::from_secs(seconds))?)
}

fn replay(pid: u32, seconds: u64, frequency: u64, passes: usize) -> Result<()> {
    let records = capture_records(pid, seconds, frequency)?;
    let samples = records
        .iter()
        .filter(|r| matches!(sampler::decode(r), Ok(Record::Sample(_))))
        .count();
    if samples == 0 {
        bail!("no samples of process {pid} were captured");
    }
    let stats = Arc::new(Stats::default());
    let config = PipelineConfig::default();
    let policy = UnwindPolicy::new(
        UnwindMode::Dwarf,
        16 * 1024,
        config.processes.max_processes,
        stats.clone(),
    );
    let mut pipeline = Pipeline::new(&config, stats.clone()).with_unwind(policy);
    let mut rates = Vec::new();
    for _ in 0..passes.max(2) {
        let started = Instant::now();
        for record in &records {
            pipeline.handle(record);
        }
        let elapsed = started.elapsed().as_secs_f64();
        pipeline.take_profile();
        rates.push(samples as f64 / elapsed);
    }
    let first = rates.remove(0);
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    let snapshot = stats.snapshot();
    println!("samples={samples}");
    println!("first_pass_samples_per_second={first:.0}");
    println!("warm_samples_per_second={median:.0}");
    println!(
        "dwarf_complete_share={:.4}",
        snapshot.unwind_dwarf_complete as f64 / snapshot.unwind_dwarf_stacks.max(1) as f64
    );
    Ok(())
}

fn share(
    profile: &PathBuf,
    comm: &str,
    chain: &[String],
    within: Option<&str>,
    interpreted: Option<&str>,
    mut misses: usize,
) -> Result<()> {
    let bytes =
        std::fs::read(profile).with_context(|| format!("could not read {}", profile.display()))?;
    let profile = decode(&bytes)?;
    let (mut total, mut complete) = (0i64, 0i64);
    for sample in Reader::new(&profile).samples() {
        if sample.label("comm") != Some(comm) {
            continue;
        }
        let names = sample.function_names();
        if within.is_some_and(|within| !names.iter().any(|name| name == within)) {
            continue;
        }
        total += sample.count();
        let holds = match interpreted {
            Some(mapping) => interpreted_names(&sample, mapping) == chain,
            None => names.windows(chain.len()).any(|window| window == chain),
        };
        if holds {
            complete += sample.count();
        } else if misses > 0 {
            misses -= 1;
            print_miss(&sample);
        }
    }
    println!("complete={complete} total={total}");
    Ok(())
}

/// A sample that missed the chain, leaf first.
fn print_miss(sample: &agent_pprof::SampleView<'_>) {
    println!("miss: {} sample(s)", sample.count());
    for frame in sample.frames() {
        println!(
            "  {:#x} {} [{}] line {}",
            frame.address,
            frame.display_name(),
            frame.mapping.map_or("", |m| m.filename),
            frame.line
        );
    }
}

/// The names of the sample's frames in `mapping` (a runtime's), innermost
/// first.
fn interpreted_names(sample: &agent_pprof::SampleView<'_>, mapping: &str) -> Vec<String> {
    sample
        .frames()
        .iter()
        .filter(|frame| frame.mapping.is_some_and(|m| m.filename == mapping))
        .map(|frame| frame.display_name())
        .collect()
}

fn capture(pid: u32, output: &std::path::Path) -> Result<()> {
    let records = capture_records(pid, 1, 100)?;
    let sample = records
        .iter()
        .find_map(|record| match sampler::decode(record) {
            Ok(Record::Sample(sample)) if sample.user_regs.is_some() => Some(sample),
            _ => None,
        })
        .context("no sample with user registers was captured")?;
    let regs = sample.user_regs.context("registers")?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    std::fs::write(output.with_extension("stack"), sample.stack_copy)?;
    std::fs::write(
        output.with_extension("regs"),
        format!(
            "ip={:#x} sp={:#x} bp={:#x}\n{maps}",
            regs.ip, regs.sp, regs.bp
        ),
    )?;
    Ok(())
}
