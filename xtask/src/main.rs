//! Developer tasks for firn: `cargo xtask <command>`.

mod bench;
mod bench_agent;
mod bench_java;
mod bench_java_cost;
mod bench_node;
mod bench_offcpu;
mod bench_python;
mod bench_ruby;
mod bench_unwind;
mod capture;
mod ebpf;
mod fuzz;
mod install;
mod libraries;
mod setup;
mod soak;
mod util;

use std::path::PathBuf;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, parser::ValueSource};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "firn developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what building the BPF object and running the tests need:
    /// the pinned nightly with rust-src, bpf-linker, cargo-fuzz, Debian
    /// packages, the Parca server, the container test's base images, the
    /// Node.js releases.
    /// Idempotent.
    Setup {
        /// Only the Debian packages the tests and benchmarks use.
        #[arg(long)]
        packages_only: bool,
    },
    /// Rebuild the BPF object from agent-ebpf/ and store it where the
    /// daemon embeds it.
    BuildEbpf {
        /// Fail if the committed object differs from a fresh build.
        #[arg(long)]
        check: bool,
    },
    /// Build firn (release) and run it as root with the given arguments.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build firn (release) and install it with its systemd unit, config
    /// and environment file (see `deploy/systemd/`).
    Install(install::InstallArgs),
    /// Install test prerequisites, run the library crates' tests as an
    /// unprivileged user, then the whole test suite as root.
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the fuzz targets in fuzz/ and run each for a bounded time;
    /// failing inputs become regression fixtures.
    Fuzz(fuzz::FuzzArgs),
    /// Measure firn against `perf record` on a busy workload (or, with
    /// `--python`, against py-spy on a Python one; with `--agent`, firn's
    /// own cost as an agent pushing to Parca) and print the figures.
    Bench(bench::BenchArgs),
    /// Fixtures for the unwinder's tests: samples of a running process
    /// (as root) and CFI extracts of real objects, into `fixtures/`.
    Capture(capture::CaptureArgs),
    /// Run firn through faults (exec churn, the server down, killed or
    /// silent, a full store, hostile files, a 200+ MB binary) and print
    /// its memory, CPU, losses and deliveries.
    Soak(soak::SoakArgs),
}

fn main() -> Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let root = workspace_root();
    match cli.command {
        Command::Setup { packages_only } => {
            setup::debian_packages()?;
            if !packages_only {
                setup::bpf_toolchain()?;
                setup::fuzz_toolchain(&setup::pinned_nightly()?)?;
                setup::parca_server()?;
                setup::pyroscope_server(&root)?;
                setup::otelcol(&root)?;
                setup::python_tools()?;
                setup::container_bases(&root)?;
                setup::node_releases()?;
                setup::ruby_chroots()?;
                setup::jdk25_home()?;
            }
            Ok(())
        }
        Command::BuildEbpf { check } => ebpf::build(&root, check),
        Command::Run { args } => util::run_firn(&root, &args),
        Command::Test { args } => {
            setup::debian_packages()?;
            setup::parca_server()?;
            setup::pyroscope_server(&root)?;
            setup::otelcol(&root)?;
            setup::python_tools()?;
            setup::container_bases(&root)?;
            setup::node_releases()?;
            setup::ruby_chroots()?;
            util::run_tests(&root, &args)
        }
        Command::Install(args) => install::run(&root, &args),
        Command::Fuzz(args) => fuzz::run_targets(&root, &args),
        Command::Bench(args) => {
            setup::debian_packages()?;
            if args.agent || args.deep {
                setup::parca_server()?;
                let given = |id: &str| {
                    matches
                        .subcommand_matches("bench")
                        .and_then(|bench| bench.value_source(id))
                        == Some(ValueSource::CommandLine)
                };
                let given = bench_agent::Given {
                    frequency: given("frequency"),
                    seconds: given("seconds"),
                };
                return bench_agent::run(&root, &args, given);
            }
            if args.python {
                setup::python_tools()?;
            }
            bench::run(&root, &args)
        }
        Command::Capture(args) => capture::run(&root, &args),
        Command::Soak(args) => {
            setup::parca_server()?;
            soak::run(&root, &args)
        }
    }
}

fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}
