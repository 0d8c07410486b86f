//! `firn report` and `firn top`: looking at profiles rather than writing them.

use std::{path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};

use super::{SamplingArgs, SymbolArgs, bounds::parse_duration, pipeline};
use crate::{
    config::TopConfig,
    labels::MetadataConfig,
    report::{ReportConfig, ReportFormat, SampleFilter},
};

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A pprof profile (gzipped or not), from firn or any other profiler.
    #[arg(value_name = "PROFILE")]
    pub profile: PathBuf,

    /// How many functions the text summary lists.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,

    /// Only samples of this process (its `pid` label; repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Only samples of processes with this name (their `comm` label;
    /// repeatable).
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,

    /// `text`: the hottest functions by self and total share; `folded`:
    /// collapsed stacks (`comm;root;...;leaf count`) for inferno, FlameGraph
    /// or speedscope; `flamegraph`: an SVG.
    #[arg(long, value_enum, default_value_t = ReportFormatArg::Text)]
    pub format: ReportFormatArg,

    /// Write here instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportFormatArg {
    Text,
    Folded,
    Flamegraph,
}

#[derive(Args, Debug, Clone)]
pub struct TopArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,

    #[command(flatten)]
    pub symbols: SymbolArgs,

    /// How often the view is redrawn.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub refresh: Duration,
}

impl From<&ReportArgs> for ReportConfig {
    fn from(args: &ReportArgs) -> Self {
        Self {
            profile: args.profile.clone(),
            top: args.top,
            filter: SampleFilter {
                pids: args.pids.clone(),
                comms: args.comms.clone(),
            },
            format: match args.format {
                ReportFormatArg::Text => ReportFormat::Text,
                ReportFormatArg::Folded => ReportFormat::Folded,
                ReportFormatArg::Flamegraph => ReportFormat::Flamegraph,
            },
            output: args.output.clone(),
        }
    }
}

impl From<&TopArgs> for TopConfig {
    fn from(args: &TopArgs) -> Self {
        Self {
            // `top` shows CPU time only: no off-CPU programs attached.
            sampling: crate::sampler::SamplingConfig {
                off_cpu_period: None,
                ..args.sampling.sampling()
            },
            pipeline: pipeline(&args.sampling, &args.symbols),
            symbols: args.symbols.symbols(),
            metadata: MetadataConfig {
                node: super::remote::host_name().unwrap_or_else(|_| "localhost".into()),
                external_labels: Vec::new(),
                relabel_rules: Vec::new(),
                kubernetes: None,
                runtime_sockets: crate::labels::runtime::DEFAULT_SOCKETS
                    .iter()
                    .map(std::path::PathBuf::from)
                    .collect(),
            },
            refresh: args.refresh,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn report_flags_become_a_config() {
        let cli = Cli::try_parse_from([
            "firn", "report", "p.pb.gz", "--top", "5", "--pid", "7", "--comm", "app", "--format",
            "folded",
        ])
        .expect("valid flags");
        let Some(Command::Report(args)) = cli.command else {
            panic!("expected the report subcommand");
        };
        let config = ReportConfig::from(&args);
        assert_eq!(config.top, 5);
        assert_eq!(config.filter.pids, [7]);
        assert_eq!(config.filter.comms, ["app"]);
        assert_eq!(config.format, ReportFormat::Folded);
        assert!(
            Cli::try_parse_from(["firn", "report"]).is_err(),
            "a profile is required"
        );
        assert!(Cli::try_parse_from(["firn", "report", "p", "--format", "svg"]).is_err());
    }

    #[test]
    fn top_flags_become_a_config() {
        let cli = Cli::try_parse_from(["firn", "top", "--pid", "9", "--refresh", "2s"])
            .expect("valid flags");
        let Some(Command::Top(args)) = cli.command else {
            panic!("expected the top subcommand");
        };
        let config = TopConfig::from(&args);
        assert_eq!(config.sampling.pids, [9]);
        assert_eq!(config.refresh, Duration::from_secs(2));
    }
}
