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

/// An error and its causes on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

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
    let result = match &cli.command {
        Some(Command::Record(args)) => match RecordConfig::try_from(args) {
            Ok(config) => runtime.block_on(commands::record::run(&config)),
            Err(error) => {
                eprintln!("error: {}", error_chain(&error));
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => match AgentConfig::try_from(&cli.agent) {
            Ok(config) => runtime.block_on(commands::agent::run(&config)),
            Err(error) => {
                eprintln!("error: {}", error_chain(&error));
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
