//! `firn top`: the hottest functions of the host (or of `--pid`), redrawn
//! every `--refresh` like `perf top`. Shares decay by [`DECAY`] per
//! refresh, so the view follows what runs now without jumping.

use std::{
    collections::HashMap,
    io::{IsTerminal, Write},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use crossterm::{
    QueueableCommand, cursor,
    event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    terminal,
};
use firn::{
    config::TopConfig,
    labels::Labeler,
    output::build_whole_profile,
    report::{FunctionKey, SampleFilter, Summary, strip_control},
    session::{Session, ShutdownSignal},
    stats::Stats,
    symbolize::HostSymbolizer,
};

use super::{lost_samples, period_ns, pid_problem};

/// Weight an earlier refresh's samples keep at each new one (perf top's 7/8).
const DECAY: f64 = 0.875;
/// Functions whose decayed samples fall below this are forgotten.
const FORGET_BELOW: f64 = 0.05;
/// Most functions remembered between refreshes.
const MAX_FUNCTIONS: usize = 20_000;
/// How often keys are looked for.
const KEY_POLL: Duration = Duration::from_millis(50);

pub async fn run(config: &TopConfig) -> Result<()> {
    if let Some(problem) = config
        .sampling
        .pids
        .iter()
        .find_map(|&pid| pid_problem(&config.pipeline.host, pid))
    {
        bail!("{problem}");
    }
    let mut signals = ShutdownSignal::install().context("could not catch signals")?;
    let stats = Arc::new(Stats::default());
    let mut session = Session::start(
        &config.sampling,
        &config.pipeline,
        &config.sampling.pids,
        stats.clone(),
    )?;
    let probe = session.bpf_probe().ok();
    let mut symbolizer = HostSymbolizer::new(&config.pipeline.host, &config.symbols, stats.clone());
    let labeler = Labeler::new(&config.metadata, &config.pipeline.host, None);
    let mut screen = Screen::open()?;
    let mut table = Table::default();
    let started = Instant::now();
    loop {
        let quit = session
            .collect_until(wait_refresh(
                config.refresh,
                &mut signals,
                screen.interactive,
            ))
            .await
            .context("reading the ring buffer failed")?;
        let (profile, _) = build_whole_profile(
            session.take_profile(),
            period_ns(config.sampling.frequency_hz),
            &labeler,
            &mut symbolizer,
            &stats,
        );
        table.add(&Summary::of(&profile, &SampleFilter::default()));
        let header = format!(
            "firn top: {} samples in {:.0}s, {} lost; {}",
            stats.samples_received.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64(),
            probe
                .as_ref()
                .map_or(0, |probe| lost_samples(&probe.counters())),
            if screen.interactive {
                "q to quit"
            } else {
                "Ctrl-C to quit"
            }
        );
        screen.draw(&header, &table)?;
        if quit {
            return Ok(());
        }
    }
}

/// Waits one refresh; true when the user asked to quit.
async fn wait_refresh(refresh: Duration, signals: &mut ShutdownSignal, keys: bool) -> bool {
    let deadline = tokio::time::sleep(refresh);
    tokio::pin!(deadline);
    let mut poll = tokio::time::interval(KEY_POLL);
    loop {
        tokio::select! {
            () = &mut deadline => return false,
            _ = signals.recv() => return true,
            _ = poll.tick(), if keys => if quit_pressed() {
                return true;
            },
        }
    }
}

/// `q`, Esc or Ctrl-C (raw mode turns that into a key, not a signal).
fn quit_pressed() -> bool {
    while event::poll(Duration::ZERO).unwrap_or(false) {
        let Ok(Event::Key(key)) = event::read() else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        let control_c =
            key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
        if control_c || matches!(key.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc) {
            return true;
        }
    }
    false
}

/// Decayed self and total samples per function.
#[derive(Default)]
struct Table {
    functions: HashMap<FunctionKey, (f64, f64)>,
    total: f64,
}

impl Table {
    #[allow(clippy::cast_precision_loss)]
    fn add(&mut self, summary: &Summary) {
        self.total = self.total * DECAY + summary.total as f64;
        for (self_count, total_count) in self.functions.values_mut() {
            *self_count *= DECAY;
            *total_count *= DECAY;
        }
        for share in &summary.functions {
            let entry = self.functions.entry(share.function.clone()).or_default();
            entry.0 += share.self_count as f64;
            entry.1 += share.total_count as f64;
        }
        self.functions
            .retain(|_, (_, total)| *total >= FORGET_BELOW);
        if self.functions.len() > MAX_FUNCTIONS {
            let mut rows = self.rows();
            rows.truncate(MAX_FUNCTIONS);
            let kept: Vec<FunctionKey> = rows.into_iter().map(|(key, ..)| key.clone()).collect();
            let mut functions = std::mem::take(&mut self.functions);
            self.functions = kept
                .into_iter()
                .filter_map(|key| functions.remove_entry(&key))
                .collect();
        }
    }

    /// Hottest by self, then total.
    fn rows(&self) -> Vec<(&FunctionKey, f64, f64)> {
        let mut rows: Vec<_> = self
            .functions
            .iter()
            .map(|(key, (self_count, total_count))| (key, *self_count, *total_count))
            .collect();
        rows.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(b.2.total_cmp(&a.2))
                .then(a.0.cmp(b.0))
        });
        rows
    }

    fn lines(&self, count: usize, width: usize) -> Vec<String> {
        let percent = |part: f64| {
            if self.total > 0.0 {
                part * 100.0 / self.total
            } else {
                0.0
            }
        };
        self.rows()
            .into_iter()
            .take(count)
            .map(|(key, self_count, total_count)| {
                let mut name = strip_control(&key.name);
                if key.kernel {
                    name.push_str(" [kernel]");
                } else if !key.object.is_empty() && !key.name.starts_with('[') {
                    name = format!("{name}  ({})", strip_control(&key.object));
                }
                let line = format!(
                    "  {:6.2}%  {:6.2}%  {name}",
                    percent(total_count),
                    percent(self_count)
                );
                line.chars().take(width).collect()
            })
            .collect()
    }
}

/// The terminal in full-screen mode, restored on drop; or, when standard
/// output is no terminal, plain tables one after the other.
struct Screen {
    interactive: bool,
}

impl Screen {
    fn open() -> Result<Self> {
        let interactive = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
        if interactive {
            terminal::enable_raw_mode().context("could not set up the terminal")?;
            let mut stdout = std::io::stdout();
            stdout.queue(terminal::EnterAlternateScreen)?;
            stdout.queue(cursor::Hide)?;
            stdout.flush()?;
        }
        Ok(Self { interactive })
    }

    fn draw(&mut self, header: &str, table: &Table) -> Result<()> {
        let mut stdout = std::io::stdout().lock();
        if !self.interactive {
            let mut text = format!("{header}\n#   Total     Self  Function\n");
            for line in table.lines(usize::MAX, usize::MAX).into_iter().take(40) {
                text.push_str(&line);
                text.push('\n');
            }
            text.push('\n');
            stdout.write_all(text.as_bytes())?;
            stdout.flush()?;
            return Ok(());
        }
        let (columns, rows) = terminal::size().unwrap_or((80, 24));
        let width = usize::from(columns);
        stdout.queue(cursor::MoveTo(0, 0))?;
        stdout.queue(terminal::Clear(terminal::ClearType::All))?;
        let mut lines = vec![
            header.chars().take(width).collect::<String>(),
            "#   Total     Self  Function".to_owned(),
        ];
        lines.extend(table.lines(usize::from(rows).saturating_sub(3), width));
        // Raw mode: a line feed alone does not return the carriage.
        stdout.write_all(lines.join("\r\n").as_bytes())?;
        stdout.flush()?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if self.interactive {
            let mut stdout = std::io::stdout();
            let _ = stdout.queue(cursor::Show);
            let _ = stdout.queue(terminal::LeaveAlternateScreen);
            let _ = stdout.flush();
            let _ = terminal::disable_raw_mode();
        }
    }
}

#[cfg(test)]
mod tests {
    use firn::report::FunctionShare;

    use super::*;

    fn summary(shares: &[(&str, i64, i64)]) -> Summary {
        Summary {
            total: shares.iter().map(|(_, own, _)| own).sum(),
            unit: "samples".into(),
            processes: 1,
            functions: shares
                .iter()
                .map(|&(name, self_count, total_count)| FunctionShare {
                    function: FunctionKey {
                        name: name.into(),
                        object: "app".into(),
                        kernel: false,
                    },
                    self_count,
                    total_count,
                })
                .collect(),
        }
    }

    #[test]
    fn earlier_refreshes_fade_and_the_hottest_comes_first() {
        let mut table = Table::default();
        table.add(&summary(&[("old", 100, 100)]));
        assert_eq!(table.lines(5, 80), ["  100.00%  100.00%  old  (app)"]);
        table.add(&summary(&[("new", 100, 100)]));
        let lines = table.lines(5, 80);
        assert!(lines[0].ends_with("new  (app)"), "{lines:?}");
        assert!(lines[1].ends_with("old  (app)"), "{lines:?}");
        // 87.5 of 187.5 decayed samples.
        assert!(lines[1].starts_with("   46.67%"), "{lines:?}");
        for _ in 0..80 {
            table.add(&summary(&[("new", 1, 1)]));
        }
        assert_eq!(
            table.lines(5, 80).len(),
            1,
            "a function long gone is forgotten"
        );
        let line = &table.lines(1, 12)[0];
        assert_eq!(line.chars().count(), 12, "cut to the width: {line:?}");
        assert!(line.starts_with("   99.9"), "{line:?}");
    }
}
