//! `firn`: the agent (no subcommand) and `firn record`.

mod commands;

use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use firn::{
    cli::{Cli, Command},
    config::{AgentConfig, RecordConfig},
};
use tracing_subscriber::EnvFilter;

/// Exit status for bad flags or configuration (as clap uses).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match EnvFilter::try_new(&cli.log_level) {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("error: invalid --log-level `{}`: {error}", cli.log_level);
            return ExitCode::from(EXIT_USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: could not start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
            Some(Command::Record(args)) => commands::record::run(&RecordConfig::from(args)).await,
            None => commands::agent::run(&AgentConfig::from(&cli.agent)).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
