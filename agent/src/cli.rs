//! Command line: clap derive types, converted into the plain `config`
//! structs. Bad flags make clap exit with status 2 and a usage message.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{
    AgentConfig, Limits, LocalStoreConfig, RecordConfig, SamplingConfig, UnwindMode,
};

#[derive(Parser, Debug)]
#[command(
    name = "firn",
    version,
    about = "Whole-system sampling profiler for Linux (eBPF).",
    long_about = "Whole-system sampling profiler for Linux (eBPF).\n\n\
        With no subcommand firn runs as an agent: it samples every CPU and writes one \
        gzipped pprof profile per --profiling-duration into --local-store-directory.\n\
        `firn record` makes a single recording, like `perf record`.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub agent: AgentArgs,

    /// Log level: error, warn, info, debug or trace (or a tracing filter
    /// directive such as `firn=debug`).
    #[arg(long, global = true, default_value = "info", env = "FIRN_LOG_LEVEL")]
    pub log_level: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record for a while and write one profile (and optionally a flame graph).
    Record(RecordArgs),
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Samples per second on each CPU.
    #[arg(
        long = "frequency",
        visible_alias = "profiling-cpu-sampling-frequency",
        value_name = "HZ",
        default_value_t = 100,
        value_parser = clap::value_parser!(u64).range(1..=10_000)
    )]
    pub frequency: u64,

    /// Profile only this process (repeatable); filtered in the kernel.
    #[arg(long = "pid", value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pub pids: Vec<u32>,

    /// Ring buffer size between the BPF program and firn (e.g. 8MiB); a
    /// power of two. Default: 1 MiB per CPU, at least 4 MiB.
    #[arg(long, value_name = "BYTES", value_parser = parse_ring_buffer_size)]
    pub ring_buffer_size: Option<u32>,

    /// Bytes of user stack copied per sample to unwind leaf frames with CFI
    /// (a multiple of 512; 0 disables leaf repair).
    #[arg(long, value_name = "BYTES", default_value_t = 1024, value_parser = parse_stack_copy_bytes)]
    pub leaf_stack_copy_bytes: u32,

    /// How user stacks are unwound: `auto` decides per process (DWARF where
    /// its code lacks frame pointers), `fp` walks frame pointers only,
    /// `dwarf` unwinds every process with DWARF CFI.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = UnwindArg::Auto)]
    pub unwind: UnwindArg,

    /// Bytes of user stack copied per sample of a process unwound with
    /// DWARF (e.g. 16KiB; a multiple of 512, at most 29.5 KiB).
    #[arg(long, value_name = "BYTES", default_value = "16KiB", value_parser = parse_stack_copy_bytes)]
    pub stack_copy_bytes: u32,

    /// Most distinct stacks in one profile; samples beyond are counted as dropped.
    #[arg(long, value_name = "N", default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_stacks_per_profile: u64,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnwindArg {
    Auto,
    Fp,
    Dwarf,
}

impl From<UnwindArg> for UnwindMode {
    fn from(arg: UnwindArg) -> Self {
        match arg {
            UnwindArg::Auto => Self::Auto,
            UnwindArg::Fp => Self::FramePointers,
            UnwindArg::Dwarf => Self::Dwarf,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// Length of each profile.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub profiling_duration: Duration,

    /// Where profiles go when no remote store is configured.
    #[arg(long, value_name = "DIR", default_value = "firn-profiles")]
    pub local_store_directory: PathBuf,

    /// Oldest local profiles are deleted beyond this total size (e.g. 1GiB).
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_bytes)]
    pub local_store_max_bytes: u64,
}

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// How long to record.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,

    /// The gzipped pprof profile to write.
    #[arg(long, short, value_name = "FILE", default_value = "profile.pb.gz")]
    pub output: PathBuf,

    /// Also write a flame graph (SVG) here.
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
}

impl SamplingArgs {
    fn sampling(&self) -> SamplingConfig {
        SamplingConfig {
            frequency_hz: self.frequency,
            pids: self.pids.clone(),
            ring_buffer_bytes: self.ring_buffer_size,
            leaf_stack_copy_bytes: self.leaf_stack_copy_bytes,
            unwind: self.unwind.into(),
            stack_copy_bytes: self.stack_copy_bytes,
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_stacks_per_profile: usize::try_from(self.max_stacks_per_profile)
                .unwrap_or(usize::MAX),
            ..Limits::default()
        }
    }
}

impl From<&RecordArgs> for RecordConfig {
    fn from(args: &RecordArgs) -> Self {
        Self {
            sampling: args.sampling.sampling(),
            limits: args.sampling.limits(),
            duration: args.duration,
            output: args.output.clone(),
            flamegraph: args.flamegraph.clone(),
        }
    }
}

impl From<&AgentArgs> for AgentConfig {
    fn from(args: &AgentArgs) -> Self {
        Self {
            sampling: args.sampling.sampling(),
            limits: args.sampling.limits(),
            profiling_duration: args.profiling_duration,
            local_store: LocalStoreConfig {
                directory: args.local_store_directory.clone(),
                max_bytes: args.local_store_max_bytes,
            },
        }
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|error| format!("`{text}` is not a duration such as 10s or 1m30s ({error})"))?;
    if duration.is_zero() {
        return Err("the duration must be longer than zero".into());
    }
    Ok(duration)
}

/// `4096`, `64KiB`, `8MiB`, `1GiB` (also `KB`/`MB`/`GB` as powers of 1024).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as 4096, 64KiB or 8MiB"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` in `{text}`")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("`{text}` is too large"))
}

fn parse_ring_buffer_size(text: &str) -> Result<u32, String> {
    let bytes = parse_bytes(text)?;
    if !bytes.is_power_of_two() || !(4096..=(1 << 30)).contains(&bytes) {
        return Err(format!(
            "the ring buffer size must be a power of two between 4KiB and 1GiB, not {bytes} bytes"
        ));
    }
    u32::try_from(bytes).map_err(|_| format!("`{text}` is too large"))
}

fn parse_stack_copy_bytes(text: &str) -> Result<u32, String> {
    let bytes = parse_bytes(text)?;
    let chunk = agent_common::STACK_COPY_CHUNK as u64;
    let max = agent_common::MAX_STACK_COPY as u64;
    if bytes % chunk != 0 || bytes > max {
        return Err(format!(
            "the stack copy must be a multiple of {chunk} bytes, at most {max}, not {bytes}"
        ));
    }
    u32::try_from(bytes).map_err(|_| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("8MiB"), Ok(8 << 20));
        assert_eq!(parse_bytes("1gb"), Ok(1 << 30));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("99999999999999999999GiB").is_err());
    }

    #[test]
    fn ring_buffer_size_must_be_a_power_of_two() {
        assert_eq!(parse_ring_buffer_size("8MiB"), Ok(8 << 20));
        assert!(parse_ring_buffer_size("3MiB").is_err());
        assert!(parse_ring_buffer_size("1KiB").is_err());
    }

    #[test]
    fn durations_reject_zero_and_garbage() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn record_flags_become_a_config() {
        let cli = Cli::try_parse_from([
            "firn",
            "record",
            "--duration",
            "3s",
            "--pid",
            "42",
            "--pid",
            "43",
            "--frequency",
            "99",
            "--output",
            "out.pb.gz",
        ])
        .expect("valid flags");
        let Some(Command::Record(args)) = cli.command else {
            panic!("expected the record subcommand");
        };
        let config = RecordConfig::from(&args);
        assert_eq!(config.duration, Duration::from_secs(3));
        assert_eq!(config.sampling.pids, vec![42, 43]);
        assert_eq!(config.sampling.frequency_hz, 99);
        assert_eq!(config.output, PathBuf::from("out.pb.gz"));
        assert_eq!(config.sampling.unwind, UnwindMode::Auto);
        assert_eq!(config.sampling.stack_copy_bytes, 16384);
    }

    #[test]
    fn unwind_flags_become_a_config() {
        let cli = Cli::try_parse_from(["firn", "--unwind", "dwarf", "--stack-copy-bytes", "8KiB"])
            .expect("valid flags");
        let config = AgentConfig::from(&cli.agent);
        assert_eq!(config.sampling.unwind, UnwindMode::Dwarf);
        assert_eq!(config.sampling.stack_copy_bytes, 8192);
        let cli = Cli::try_parse_from(["firn", "--unwind", "fp"]).expect("valid flags");
        assert_eq!(
            AgentConfig::from(&cli.agent).sampling.unwind,
            UnwindMode::FramePointers
        );
        for args in [
            vec!["firn", "--unwind", "lbr"],
            vec!["firn", "--stack-copy-bytes", "1000"],
            vec!["firn", "--stack-copy-bytes", "64KiB"],
        ] {
            assert!(Cli::try_parse_from(&args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn parca_agent_flag_names_are_accepted() {
        let cli = Cli::try_parse_from([
            "firn",
            "--profiling-cpu-sampling-frequency",
            "19",
            "--profiling-duration",
            "5s",
        ])
        .expect("valid flags");
        let config = AgentConfig::from(&cli.agent);
        assert_eq!(config.sampling.frequency_hz, 19);
        assert_eq!(config.profiling_duration, Duration::from_secs(5));
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for args in [
            vec!["firn", "--frequency", "0"],
            vec!["firn", "--frequency", "fast"],
            vec!["firn", "record", "--duration", "forever"],
            vec!["firn", "record", "--pid", "-3"],
            vec!["firn", "--no-such-flag"],
        ] {
            let error = Cli::try_parse_from(&args).expect_err("must be rejected");
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
    }
}
