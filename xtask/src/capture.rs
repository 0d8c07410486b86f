//! `cargo xtask capture`: fixtures for the unwinder's tests from live
//! processes and real objects (`agent/examples/capture/`): samples of a
//! running process taken by firn's BPF program (as root), the CFI extracts
//! of the objects their frames are in, the frames expected of each. Written
//! into `fixtures/`; `fixtures/README.md` says how each was made.

use std::{os::unix::process::CommandExt, path::Path};

use anyhow::{Context, Result};

use crate::util::{self, cargo};

#[derive(Clone, clap::Args)]
pub struct CaptureArgs {
    /// The process to sample (needs root).
    #[arg(long, requires = "output")]
    pid: Option<u32>,
    /// The capture's name: `fixtures/captures/NAME/`.
    #[arg(long, requires = "pid")]
    output: Option<String>,
    /// Samples kept, evenly spread over the recording.
    #[arg(long, default_value_t = 4)]
    samples: usize,
    /// Seconds of sampling the samples are picked from.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// An object to extract with all its function symbols (repeatable).
    #[arg(long)]
    object: Vec<String>,
}

pub fn run(root: &Path, args: &CaptureArgs) -> Result<()> {
    util::run(cargo(root).args(["build", "--package", "firn", "--example", "capture"]))?;
    let example = root.join("target/debug/examples/capture");
    let mut command_line = vec!["--fixtures".to_owned()];
    command_line.push(root.join("fixtures").to_string_lossy().into_owned());
    if let (Some(pid), Some(output)) = (args.pid, &args.output) {
        command_line.extend([
            "--pid".to_owned(),
            pid.to_string(),
            "--output".to_owned(),
            output.clone(),
            "--samples".to_owned(),
            args.samples.to_string(),
            "--seconds".to_owned(),
            args.seconds.to_string(),
        ]);
    }
    for object in &args.object {
        command_line.extend(["--object".to_owned(), object.clone()]);
    }
    if args.pid.is_some() {
        util::become_root(&example, &command_line)?;
    }
    let error = std::process::Command::new(&example)
        .args(&command_line)
        .exec();
    Err(error).with_context(|| format!("could not start {}", example.display()))
}
