//! `firn record`'s flags.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{ConfigError, SamplingArgs, SymbolArgs, bounds::parse_duration, pipeline, remote};
use crate::{
    config::RecordConfig,
    labels::{MetadataConfig, Rule},
    session::PipelineConfig,
};

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,

    #[command(flatten)]
    pub symbols: SymbolArgs,

    /// How long to record (default 10s); with a command, at most this
    /// long (default: until the command exits).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// The gzipped pprof profile to write.
    #[arg(long, short, value_name = "FILE", default_value = "profile.pb.gz")]
    pub output: PathBuf,

    /// Also write a flame graph (SVG) here.
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,

    /// A YAML configuration file: `relabel_configs` apply to the samples'
    /// labels (a dropped process is left out), and any of these flags,
    /// keyed by name without the dashes; the command line wins.
    #[arg(long, value_name = "FILE")]
    pub config_path: Option<PathBuf>,

    /// The config file's `relabel_configs`, checked (see `AgentArgs`).
    #[arg(skip)]
    pub relabel_rules: Vec<Rule>,

    /// Label every sample with its thread's id and name (`thread_id`,
    /// `thread_name`).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub thread_labels: bool,

    /// Show a live status line and a summary on a terminal (`false`: only
    /// the log lines).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub summary: bool,

    /// The command to start and profile with everything it starts, until it
    /// exits (`firn record -- CMD ARGS...`); firn exits with its status.
    #[arg(
        value_name = "COMMAND",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<std::ffi::OsString>,
}

impl TryFrom<&RecordArgs> for RecordConfig {
    type Error = ConfigError;

    fn try_from(args: &RecordArgs) -> Result<Self, ConfigError> {
        args.sampling.check_stacks()?;
        Ok(Self {
            sampling: args.sampling.sampling(),
            pipeline: PipelineConfig {
                thread_labels: args.thread_labels,
                ..pipeline(&args.sampling, &args.symbols)
            },
            symbols: args.symbols.symbols(),
            metadata: MetadataConfig {
                node: remote::host_name().unwrap_or_else(|_| "localhost".into()),
                external_labels: Vec::new(),
                relabel_rules: args.relabel_rules.clone(),
                kubernetes: None,
                runtime_sockets: crate::labels::runtime::DEFAULT_SOCKETS
                    .iter()
                    .map(PathBuf::from)
                    .collect(),
            },
            duration: args.duration,
            output: args.output.clone(),
            flamegraph: args.flamegraph.clone(),
            command: args.command.clone(),
            summary: args.summary,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{
        cli::{AgentConfig, Cli, Command},
        sampler::UnwindMode,
    };
    use agent_symbolize::DemangleMode;

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
        let config = RecordConfig::try_from(&args).expect("a usable config");
        assert_eq!(config.duration, Some(Duration::from_secs(3)));
        assert!(config.command.is_empty());
        assert_eq!(config.sampling.pids, vec![42, 43]);
        assert_eq!(config.sampling.frequency_hz, 99);
        assert_eq!(config.output, PathBuf::from("out.pb.gz"));
        assert_eq!(config.sampling.unwind, UnwindMode::Auto);
        assert_eq!(config.sampling.stack_copy_bytes, 65536);
        assert_eq!(config.symbols.demangle, DemangleMode::Simplified);
        assert_eq!(
            config.pipeline.debug_files.directories,
            [PathBuf::from("/usr/lib/debug")]
        );
        assert_eq!(config.symbols.debuginfo_cache_bytes, 16 << 20);
        assert!(
            config.pipeline.thread_labels,
            "on by default in a recording"
        );
        let agent = Cli::try_parse_from(["firn"]).expect("no flags");
        let agent = AgentConfig::try_from(&agent.agent).expect("a usable config");
        assert!(!agent.pipeline.thread_labels, "off by default in the agent");
        let agent = Cli::try_parse_from(["firn", "--thread-labels=true"]).expect("valid flags");
        let agent = AgentConfig::try_from(&agent.agent).expect("a usable config");
        assert!(agent.pipeline.thread_labels);
    }

    #[test]
    fn record_takes_a_command_after_its_flags() {
        for args in [
            &[
                "firn", "record", "-o", "p.pb.gz", "--", "./prog", "--flag", "x",
            ][..],
            &["firn", "record", "-o", "p.pb.gz", "./prog", "--flag", "x"][..],
        ] {
            let cli = Cli::try_parse_from(args).expect("valid flags");
            let Some(Command::Record(args)) = cli.command else {
                panic!("expected the record subcommand");
            };
            let config = RecordConfig::try_from(&args).expect("a usable config");
            assert_eq!(config.command, ["./prog", "--flag", "x"]);
            assert_eq!(config.output, PathBuf::from("p.pb.gz"));
            assert_eq!(config.duration, None);
        }
    }
}
