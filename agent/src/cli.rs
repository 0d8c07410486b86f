//! Command line: clap derive types, converted into the plain `config`
//! structs. Bad flags make clap exit with status 2 and a usage message.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

mod bounds;
mod destinations;
mod file;
mod http_auth;
mod inspect;
mod labels;
mod otlp;
mod pyroscope;
mod record;
mod remote;

use bounds::{parse_log_level, parse_off_cpu_period, parse_period, parse_store_bytes};
pub use file::{ArgsError, parse_args};
pub use inspect::{ReportArgs, ReportFormatArg, TopArgs};
pub use labels::KubernetesArgs;
pub use otlp::OtlpArgs;
pub use pyroscope::PyroscopeArgs;
pub use record::RecordArgs;
pub use remote::{ConfigError, DebuginfoArgs, KeyValues, MetadataArgs, RemoteStoreArgs};

use agent_symbolize::{DemangleMode, SymbolConfig};

use crate::{
    aggregate::AggregateConfig,
    config::{AgentConfig, DestinationConfig},
    labels::Rule,
    output::LocalStoreConfig,
    process::DebugFileConfig,
    sampler::{SamplingConfig, UnwindMode},
    session::PipelineConfig,
};

#[derive(Parser, Debug)]
#[command(
    name = "firn",
    version,
    about = "Whole-system sampling profiler for Linux (eBPF).",
    long_about = "Whole-system sampling profiler for Linux (eBPF).\n\n\
        With no subcommand firn runs as an agent: it samples every CPU and pushes one \
        profile per process per --profiling-duration to the Parca server at \
        --remote-store-address, or without one writes one gzipped pprof per interval \
        into --local-store-directory.\n\
        `firn record` makes a single recording, like `perf record` (`firn record -- CMD` \
        profiles a command and what it starts); `firn report` summarizes a profile and \
        `firn top` shows the hottest functions live.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub agent: AgentArgs,

    /// Log level: off, error, warn, info, debug or trace, or tracing filter
    /// directives each a level or `target=level` (`info,firn::output=debug`).
    #[arg(long, global = true, default_value = "info", env = "FIRN_LOG_LEVEL", value_parser = parse_log_level)]
    pub log_level: String,

    /// Log lines as logfmt (`key=value`) or JSON objects, on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormatArg::Logfmt, env = "FIRN_LOG_FORMAT")]
    pub log_format: LogFormatArg,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormatArg {
    Logfmt,
    Json,
}

impl From<LogFormatArg> for crate::logging::LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Logfmt => Self::Logfmt,
            LogFormatArg::Json => Self::Json,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record for a while, or while a command runs, and write one profile
    /// (and optionally a flame graph).
    Record(RecordArgs),
    /// Summarize a pprof profile: hottest functions, folded stacks or a
    /// flame graph.
    Report(ReportArgs),
    /// Show the hottest functions of the host (or --pid) live, like `perf top`.
    Top(TopArgs),
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

    /// Profile only this process and those it starts (repeatable);
    /// filtered in the kernel.
    #[arg(long = "pid", value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pub pids: Vec<u32>,

    /// Ring buffer size between the BPF program and firn (e.g. 8MiB); a
    /// power of two. Default: 1 MiB per CPU, at least 2 MiB.
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

    /// Bytes of user stack first copied per sample of a process unwound
    /// with DWARF, then fitted to its stacks (e.g. 16KiB; a multiple of
    /// 512, at most 64KiB). The copy stops at the end of the stack, so a
    /// shallow stack costs only what it holds.
    #[arg(long, value_name = "BYTES", default_value = "64KiB", value_parser = parse_stack_copy_bytes)]
    pub stack_copy_bytes: u32,

    /// Walk and name the frames of CPython 3.8-3.13 processes, spliced into
    /// their native stacks (`--python=false`: native frames only).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub python: bool,

    /// Walk and name the frames of CRuby 2.7, 3.1, 3.3 and 3.4 processes
    /// (methods, blocks, C functions called from Ruby), spliced into their
    /// native stacks (`--ruby=false`: native frames only).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub ruby: bool,

    /// Unwind and name the Java frames of HotSpot JVMs (JDK 17 and 25
    /// tested), interpreted and compiled, inlined methods as frames of
    /// their own
    /// (`--java=false`: native frames only).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub java: bool,

    /// Name the JavaScript frames of Node.js (V8) processes from V8's heap,
    /// without `--perf-basic-prof` (`--nodejs=false`: native frames, and
    /// perf maps where a process writes them).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub nodejs: bool,

    /// Walk kernel stacks (off: the BPF program skips the walk, and samples
    /// of kernel threads are not taken).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub collect_kernel_profile: bool,

    /// Walk, copy and unwind user stacks (off: kernel frames only, at the
    /// least cost).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub collect_user_profile: bool,

    /// Off-CPU profiling: where threads wait (sleeps, I/O, locks), weighted
    /// by how long, as a second profile beside the CPU one. Each sample
    /// stands for PERIOD waited (`--off-cpu=1ms`; `--off-cpu` alone:
    /// 10ms): a wait of d is kept as d/PERIOD samples on average, so
    /// totals estimate the time waited per stack without bias, and a
    /// thread yields at most 1s/PERIOD samples a second however often it
    /// switches. Off: nothing is attached to the scheduler.
    #[arg(
        long,
        value_name = "PERIOD",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "10ms",
        value_parser = parse_off_cpu_period
    )]
    pub off_cpu: Option<Duration>,

    /// Most distinct stacks in one profile; samples beyond are counted as dropped.
    #[arg(long, value_name = "N", default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_stacks_per_profile: u64,
}

/// `--demangle`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemangleArg {
    /// Names as the objects spell them.
    None,
    /// Rust without hashes, C++ without parameters and template arguments.
    Simplified,
    /// As simplified, but C++ keeps its template arguments.
    Templates,
    /// Everything the demangler produces.
    Full,
}

#[derive(Args, Debug, Clone)]
pub struct SymbolArgs {
    /// How much of demangled Rust and C++ names to show (the mangled name is
    /// always kept as the pprof system name).
    #[arg(long, value_enum, value_name = "MODE", default_value = "simplified")]
    pub demangle: DemangleArg,

    /// Directories holding separate debug files (comma-separated or
    /// repeated), searched inside each process's root, then on the host.
    #[arg(
        long,
        value_name = "DIR",
        value_delimiter = ',',
        default_value = "/usr/lib/debug"
    )]
    pub debuginfo_directories: Vec<PathBuf>,

    /// Memory for ELF symbol tables (e.g. 32MiB).
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = parse_cache_bytes)]
    pub symbol_cache_size: usize,

    /// Memory for parsed DWARF line tables and inline trees. An object whose
    /// DWARF, all parsed, would need more than this is named from its symbol
    /// table.
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = parse_cache_bytes)]
    pub debuginfo_cache_size: usize,

    /// Memory for JIT perf maps (/tmp/perf-PID.map); also the most read of
    /// one map.
    #[arg(long, value_name = "BYTES", default_value = "8MiB", value_parser = parse_cache_bytes)]
    pub perf_map_cache_size: usize,
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

    #[command(flatten)]
    pub symbols: SymbolArgs,

    /// Length of each profile (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_period)]
    pub profiling_duration: Duration,

    /// Where profiles go when no remote store is configured.
    #[arg(long, value_name = "DIR", default_value = "firn-profiles")]
    pub local_store_directory: PathBuf,

    /// Oldest local profiles are deleted beyond this total size (e.g. 1GiB;
    /// at least 1KiB).
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_store_bytes)]
    pub local_store_max_bytes: u64,

    #[command(flatten)]
    pub remote_store: RemoteStoreArgs,

    #[command(flatten)]
    pub pyroscope: PyroscopeArgs,

    #[command(flatten)]
    pub otlp: OtlpArgs,

    #[command(flatten)]
    pub metadata: MetadataArgs,

    #[command(flatten)]
    pub kubernetes: KubernetesArgs,

    /// A YAML configuration file: `relabel_configs` (Prometheus
    /// relabeling, applied to every series) and any of these flags, keyed
    /// by name without the dashes (`profiling-duration: 10s`); flags given
    /// on the command line win.
    #[arg(long, value_name = "FILE")]
    pub config_path: Option<PathBuf>,

    /// The config file's `relabel_configs`, checked: `parse_args` reads the
    /// file once, for its flags and these.
    #[arg(skip)]
    pub relabel_rules: Vec<Rule>,

    /// The config file's `destinations`, each read by the flags' parsers.
    #[arg(skip)]
    pub destinations: Vec<destinations::DestinationArgs>,

    #[command(flatten)]
    pub debuginfo: DebuginfoArgs,

    /// Label every sample with its thread's id and name (`thread_id`,
    /// `thread_name`); off, only threads other than a process's main one
    /// carry `thread_id`. One series per thread is more data to store.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub thread_labels: bool,

    /// Where /metrics (Prometheus), /healthy and /ready are served.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7071")]
    pub http_address: SocketAddr,
}

impl SamplingArgs {
    /// With both stacks off there would be nothing to sample.
    pub(crate) fn check_stacks(&self) -> Result<(), ConfigError> {
        if self.collect_kernel_profile || self.collect_user_profile {
            Ok(())
        } else {
            Err(ConfigError::NoStacks)
        }
    }

    fn sampling(&self) -> SamplingConfig {
        SamplingConfig {
            frequency_hz: self.frequency,
            pids: self.pids.clone(),
            ring_buffer_bytes: self.ring_buffer_size,
            leaf_stack_copy_bytes: self.leaf_stack_copy_bytes,
            unwind: self.unwind.into(),
            stack_copy_bytes: self.stack_copy_bytes,
            kernel_stacks: self.collect_kernel_profile,
            user_stacks: self.collect_user_profile,
            off_cpu_period: self.off_cpu,
        }
    }

    fn aggregate(&self) -> AggregateConfig {
        AggregateConfig {
            max_stacks_per_profile: usize::try_from(self.max_stacks_per_profile)
                .unwrap_or(usize::MAX),
        }
    }
}

/// The stages after the ring buffer: what the flags set, defaults for the rest.
fn pipeline(sampling: &SamplingArgs, symbols: &SymbolArgs) -> PipelineConfig {
    PipelineConfig {
        debug_files: symbols.debug_files(),
        aggregate: sampling.aggregate(),
        runtimes: crate::runtimes::RuntimesConfig {
            python: crate::runtimes::PythonConfig {
                enabled: sampling.python,
                ..Default::default()
            },
            ruby: crate::runtimes::RubyConfig {
                enabled: sampling.ruby,
                ..Default::default()
            },
            java: crate::runtimes::JavaConfig {
                enabled: sampling.java,
            },
            node: crate::runtimes::NodeConfig {
                enabled: sampling.nodejs,
            },
        },
        ..PipelineConfig::default()
    }
}

impl SymbolArgs {
    fn symbols(&self) -> SymbolConfig {
        SymbolConfig {
            demangle: match self.demangle {
                DemangleArg::None => DemangleMode::None,
                DemangleArg::Simplified => DemangleMode::Simplified,
                DemangleArg::Templates => DemangleMode::Templates,
                DemangleArg::Full => DemangleMode::Full,
            },
            symbol_cache_bytes: self.symbol_cache_size,
            debuginfo_cache_bytes: self.debuginfo_cache_size,
            perf_map_cache_bytes: self.perf_map_cache_size,
        }
    }

    fn debug_files(&self) -> DebugFileConfig {
        DebugFileConfig {
            directories: self.debuginfo_directories.clone(),
        }
    }
}

impl TryFrom<&AgentArgs> for AgentConfig {
    type Error = ConfigError;

    /// Reads the files the flags name (token, CA), so that a bad one stops
    /// firn at start rather than failing every push.
    fn try_from(args: &AgentArgs) -> Result<Self, ConfigError> {
        args.sampling.check_stacks()?;
        Ok(Self {
            sampling: args.sampling.sampling(),
            pipeline: PipelineConfig {
                thread_labels: args.thread_labels,
                ..pipeline(&args.sampling, &args.symbols)
            },
            symbols: args.symbols.symbols(),
            profiling_duration: args.profiling_duration,
            local_store: LocalStoreConfig {
                directory: args.local_store_directory.clone(),
                max_bytes: args.local_store_max_bytes,
            },
            destinations: destinations(args)?,
            metadata: {
                let mut metadata = args.metadata.config()?;
                metadata.relabel_rules = args.relabel_rules.clone();
                metadata.kubernetes = args.kubernetes.config(&metadata.node)?;
                metadata
            },
            debuginfo: args.debuginfo.config(),
            http_address: args.http_address,
        })
    }
}

/// The servers the flags name: a Parca server, a Pyroscope server, an OTLP
/// receiver, any of them together.
fn destinations(args: &AgentArgs) -> Result<Vec<DestinationConfig>, ConfigError> {
    let mut destinations = Vec::new();
    if let Some(store) = args.remote_store.config()? {
        destinations.push(DestinationConfig::Parca {
            store,
            name: "parca".into(),
        });
    }
    if let Some(pyroscope) = args.pyroscope.config("pyroscope")? {
        destinations.push(DestinationConfig::Pyroscope(pyroscope));
    }
    if let Some(otlp) = args.otlp.config("otlp")? {
        destinations.push(DestinationConfig::Otlp(otlp));
    }
    for (index, entry) in args.destinations.iter().enumerate() {
        destinations.push(entry.config(index)?);
    }
    Ok(destinations)
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

fn parse_cache_bytes(text: &str) -> Result<usize, String> {
    let bytes = parse_bytes(text)?;
    if bytes < 1 << 20 {
        return Err(format!("a cache needs at least 1MiB, not {bytes} bytes"));
    }
    usize::try_from(bytes).map_err(|_| format!("`{text}` is too large"))
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
    use super::{bounds::parse_duration, *};

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
        assert!(parse_duration("1000y").is_err());
    }

    #[test]
    fn symbol_flags_become_a_config() {
        let cli = Cli::try_parse_from([
            "firn",
            "--demangle",
            "full",
            "--debuginfo-directories",
            "/a,/b",
            "--debuginfo-directories",
            "/c",
            "--debuginfo-cache-size",
            "8MiB",
            "--perf-map-cache-size",
            "2MiB",
            "--symbol-cache-size",
            "4MiB",
        ])
        .expect("valid flags");
        let config = AgentConfig::try_from(&cli.agent).expect("valid configuration");
        assert_eq!(config.symbols.demangle, DemangleMode::Full);
        assert_eq!(
            config.pipeline.debug_files.directories,
            ["/a", "/b", "/c"].map(PathBuf::from)
        );
        assert_eq!(config.symbols.debuginfo_cache_bytes, 8 << 20);
        assert_eq!(config.symbols.perf_map_cache_bytes, 2 << 20);
        assert_eq!(config.symbols.symbol_cache_bytes, 4 << 20);
        for (flag, value) in [("--demangle", "pretty"), ("--debuginfo-cache-size", "1KiB")] {
            let error = Cli::try_parse_from(["firn", flag, value]).expect_err("rejected");
            assert_eq!(error.exit_code(), 2, "{flag} {value}");
        }
    }

    #[test]
    fn unwind_flags_become_a_config() {
        let cli = Cli::try_parse_from(["firn", "--unwind", "dwarf", "--stack-copy-bytes", "8KiB"])
            .expect("valid flags");
        let config = AgentConfig::try_from(&cli.agent).expect("valid configuration");
        assert_eq!(config.sampling.unwind, UnwindMode::Dwarf);
        assert_eq!(config.sampling.stack_copy_bytes, 8192);
        let cli = Cli::try_parse_from(["firn", "--unwind", "fp"]).expect("valid flags");
        assert_eq!(
            AgentConfig::try_from(&cli.agent)
                .expect("valid configuration")
                .sampling
                .unwind,
            UnwindMode::FramePointers
        );
        for args in [
            vec!["firn", "--unwind", "lbr"],
            vec!["firn", "--stack-copy-bytes", "1000"],
            vec!["firn", "--stack-copy-bytes", "65KiB"],
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
        let config = AgentConfig::try_from(&cli.agent).expect("a usable config");
        assert_eq!(config.sampling.frequency_hz, 19);
        assert_eq!(config.profiling_duration, Duration::from_secs(5));
        assert!(config.destinations.is_empty(), "local store by default");
        assert!(
            !config.metadata.node.is_empty(),
            "node defaults to the host name"
        );
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for args in [
            vec!["firn", "--frequency", "0"],
            vec!["firn", "--frequency", "fast"],
            vec!["firn", "record", "--duration", "forever"],
            vec!["firn", "record", "--pid", "-3"],
            vec!["firn", "--no-such-flag"],
            vec!["firn", "--remote-store-address", "nohostport"],
            vec!["firn", "--metadata-external-labels", "9=x"],
            vec![
                "firn",
                "--remote-store-insecure",
                "--remote-store-ca-file",
                "x.pem",
            ],
        ] {
            let error = Cli::try_parse_from(&args).expect_err("must be rejected");
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
    }
}
