//! `firn`: the agent (no subcommand), `firn record`, `firn report` and
//! `firn top`.

mod commands;

use std::process::ExitCode;

use firn::{
    cli::{ArgsError, Command, parse_args},
    config::{AgentConfig, RecordConfig, TopConfig},
    logging::{self, error_chain},
    report::ReportConfig,
};

/// Exit status for bad flags or configuration (as clap uses).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    firn::allocator::tune();
    // The main thread drains the ring buffer and runs the stages up to
    // aggregation, for every command.
    firn::stats::cpu::account_thread(firn::stats::cpu::CpuStage::Sample);
    let cli = match parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        // Usage errors exit 2, --help and --version 0.
        Err(ArgsError::Clap(error)) => error.exit(),
        Err(ArgsError::ConfigFile(error)) => {
            eprintln!("error: {}", error_chain(&error));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let filter = match logging::filter(&cli.log_level) {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Err(error) = logging::init(filter, cli.log_format.into()) {
        eprintln!("error: {}", error_chain(&error));
        return ExitCode::FAILURE;
    }

    if let Err(error) = firn::untrusted::guard_mapped_files() {
        eprintln!("error: could not install the SIGBUS handler: {error}");
        return ExitCode::FAILURE;
    }
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
        Some(Command::Report(args)) => commands::report::run(&ReportConfig::from(args)).map(|()| 0),
        Some(Command::Top(args)) => runtime
            .block_on(commands::top::run(&TopConfig::from(args)))
            .map(|()| 0),
        None => match AgentConfig::try_from(&cli.agent) {
            Ok(config) => runtime.block_on(commands::agent::run(&config)).map(|()| 0),
            Err(error) => {
                eprintln!("error: {}", error_chain(&error));
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    match result {
        Ok(status) => ExitCode::from(status),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
