//! `firn report PROFILE`: a profile summarized for a person, or turned into
//! folded stacks or a flame graph.

use std::{
    fs::File,
    io::{BufWriter, IsTerminal, Write},
};

use anyhow::{Context, Result};
use firn::{
    output::render_flamegraph,
    report::{ReportConfig, ReportFormat, Summary, folded_stacks, render_summary},
};

/// Larger files are refused rather than read into memory.
const MAX_PROFILE_BYTES: u64 = 1 << 30;

pub fn run(config: &ReportConfig) -> Result<()> {
    match write_report(config) {
        // `firn report ... | head`: the reader had enough.
        Err(error)
            if error
                .chain()
                .filter_map(|cause| cause.downcast_ref::<std::io::Error>())
                .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        other => other,
    }
}

fn write_report(config: &ReportConfig) -> Result<()> {
    let path = &config.profile;
    let size = std::fs::metadata(path)
        .with_context(|| format!("could not read {}", path.display()))?
        .len();
    anyhow::ensure!(
        size <= MAX_PROFILE_BYTES,
        "{} is {size} bytes, more than a profile firn reads ({MAX_PROFILE_BYTES})",
        path.display()
    );
    let bytes =
        std::fs::read(path).with_context(|| format!("could not read {}", path.display()))?;
    let profile = agent_pprof::decode(&bytes)
        .with_context(|| format!("could not read the profile {}", path.display()))?;
    let mut out: Box<dyn Write> = match &config.output {
        Some(path) => {
            Box::new(BufWriter::new(File::create(path).with_context(|| {
                format!("could not write {}", path.display())
            })?))
        }
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    match config.format {
        ReportFormat::Text => {
            let width = (config.output.is_none() && std::io::stdout().is_terminal())
                .then(|| crossterm::terminal::size().ok())
                .flatten()
                .map(|(columns, _)| usize::from(columns));
            let summary = Summary::of(&profile, &config.filter);
            out.write_all(render_summary(&summary, config.top, width).as_bytes())
                .context("could not write the report")?;
        }
        ReportFormat::Folded => {
            for line in folded_stacks(&profile, &config.filter) {
                writeln!(out, "{line}").context("could not write the report")?;
            }
        }
        ReportFormat::Flamegraph => {
            let lines = folded_stacks(&profile, &config.filter);
            let title = path
                .file_name()
                .map_or_else(|| "profile".into(), |name| name.to_string_lossy());
            render_flamegraph(&lines, &title, &mut out)
                .context("could not draw the flame graph")?;
        }
    }
    out.flush().context("could not write the report")?;
    Ok(())
}
