//! Running commands, and the `run` / `test` tasks.

use std::{
    ffi::OsStr,
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, ExitStatus},
};

use anyhow::{Context, Result, bail};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `command`, failing with its command line when it does not succeed.
pub fn run(command: &mut Command) -> Result<()> {
    let status = status(command)?;
    if !status.success() {
        bail!("{} failed: {status}", describe(command));
    }
    Ok(())
}

pub fn status(command: &mut Command) -> Result<ExitStatus> {
    command
        .status()
        .with_context(|| format!("could not start {}", describe(command)))
}

pub fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// A `cargo` for the stable workspace, free of the variables the outer
/// `cargo xtask` set for itself.
pub fn cargo(root: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root);
    command
}

/// Re-runs the current command line under sudo when not root. Only returns
/// when already root.
pub fn become_root<I, S>(program: &Path, args: I) -> Result<()>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    if is_root() {
        return Ok(());
    }
    let error = Command::new("sudo")
        .arg("--preserve-env")
        .arg(program)
        .args(args)
        .exec();
    Err(error).context("firn needs root (CAP_BPF, CAP_PERFMON); sudo could not be started")
}

pub fn run_firn(root: &Path, args: &[String]) -> Result<()> {
    run(cargo(root).args(["build", "--release", "--package", "firn"]))?;
    let firn = root.join("target/release/firn");
    become_root(&firn, args)?;
    let error = Command::new(&firn).args(args).exec();
    Err(error).with_context(|| format!("could not start {}", firn.display()))
}

pub fn run_tests(root: &Path, args: &[String]) -> Result<()> {
    if !is_root() {
        bail!(
            "the tests load BPF programs and read every process's /proc: run them as root \
             (sudo -E cargo xtask test)"
        );
    }
    crate::libraries::check(root)?;
    let mut command = cargo(root);
    for (variable, version) in crate::setup::NODE_RELEASES {
        command.env(variable, crate::setup::node_path(version));
    }
    command.env("FIRN_JDK25_HOME", crate::setup::jdk25_home()?);
    run(command
        .env("FIRN_PARCA_BIN", crate::setup::parca_path())
        .env("FIRN_PYROSCOPE_BIN", crate::setup::pyroscope_path())
        .env("FIRN_OTELCOL_BIN", crate::setup::otelcol_path())
        .env("FIRN_TOOLS_VENV", crate::setup::tools_venv())
        .env("FIRN_IMAGE_BASES", crate::setup::image_bases_dir())
        .env("FIRN_RUBY_CHROOTS", crate::setup::ruby_chroots_dir())
        .args(["test", "--workspace", "--all-targets"])
        .args(args))
}
