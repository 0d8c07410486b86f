//! What `firn record` does while it records: stop at the deadline, the
//! command's exit or a signal; forward signals to the command; keep the
//! status line on a terminal up to date.

use std::{
    future::Future,
    io::{IsTerminal, Write},
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use crossterm::{
    QueueableCommand,
    terminal::{Clear, ClearType},
};
use firn::{bpf::BpfProbe, launch::Running, session::ShutdownSignal, stats::Stats};
use tracing::{debug, info};

use crate::commands::lost_samples;

/// How often the status line is redrawn.
const STATUS_INTERVAL: Duration = Duration::from_millis(250);

/// Why the recording stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The command exited.
    Exited,
    /// `--duration` passed.
    Deadline,
    /// A signal, without a command to forward it to.
    Signal(&'static str),
}

pub type Pending = Pin<Box<dyn Future<Output = ()>>>;

/// Completes when the command has exited (not reaped, so its pid can
/// still be signalled); never without a command.
pub fn command_exit(command: Option<&Running>) -> Pending {
    match command {
        Some(command) => {
            let pid = command.pid;
            Box::pin(async move {
                match tokio::task::spawn_blocking(move || Running::wait_exited(pid)).await {
                    Ok(Ok(())) => {}
                    // Nothing left to wait on: treat it as gone.
                    Ok(Err(error)) => debug!(%error, "waiting for the command failed"),
                    Err(error) => debug!(%error, "the waiting thread failed"),
                }
            })
        }
        None => Box::pin(std::future::pending()),
    }
}

fn deadline(limit: Option<Duration>) -> Pending {
    match limit {
        Some(limit) => Box::pin(tokio::time::sleep(limit)),
        None => Box::pin(std::future::pending()),
    }
}

/// Waits for the first reason to stop, forwarding signals to the command.
pub async fn until_stop(
    limit: Option<Duration>,
    command: Option<&Running>,
    exited: &mut Pending,
    signals: &mut ShutdownSignal,
    mut status: Option<&mut StatusLine>,
) -> Stop {
    let mut deadline = deadline(limit);
    let mut tick = tokio::time::interval(STATUS_INTERVAL);
    loop {
        tokio::select! {
            () = &mut *exited => return Stop::Exited,
            () = &mut deadline => return Stop::Deadline,
            signal = signals.recv() => match command {
                Some(command) => forward(command, signal),
                None => return Stop::Signal(signal),
            },
            _ = tick.tick(), if status.is_some() => {
                if let Some(status) = status.as_deref_mut() {
                    status.draw();
                }
            }
        }
    }
}

/// After the recording: waits for the command still running, forwarding
/// signals.
pub async fn until_exit(command: &Running, exited: &mut Pending, signals: &mut ShutdownSignal) {
    info!(pid = command.pid, "waiting for the command to exit");
    loop {
        tokio::select! {
            () = &mut *exited => return,
            signal = signals.recv() => forward(command, signal),
        }
    }
}

fn forward(command: &Running, signal: &'static str) {
    let number = match signal {
        "SIGINT" => libc::SIGINT,
        "SIGTERM" => libc::SIGTERM,
        "SIGHUP" => libc::SIGHUP,
        _ => return,
    };
    // Ctrl-C reaches the whole foreground process group, the command
    // with firn: a second SIGINT could cut short its own handling of the first.
    if number == libc::SIGINT && in_terminal_foreground() {
        debug!("SIGINT from the terminal reached the command directly");
        return;
    }
    debug!(
        signal,
        pid = command.pid,
        "forwarding the signal to the command"
    );
    command.signal(number);
}

/// Whether firn (and so the command, in its process group) is the
/// foreground job of the terminal it was started from.
fn in_terminal_foreground() -> bool {
    [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO]
        .into_iter()
        .any(|fd| {
            // SAFETY: tcgetpgrp and getpgrp only read kernel state; a
            // descriptor that is no terminal makes tcgetpgrp fail (-1).
            let (foreground, own) = unsafe { (libc::tcgetpgrp(fd), libc::getpgrp()) };
            foreground > 0 && foreground == own
        })
}

/// `recording 3.2s/10s  1234 samples  0 lost`, redrawn in place on the
/// terminal (standard error) and cleared at the end.
pub struct StatusLine {
    started: Instant,
    limit: Option<Duration>,
    stats: Arc<Stats>,
    probe: Option<BpfProbe>,
    drawn: bool,
}

impl StatusLine {
    /// `None` unless standard error is a terminal.
    pub fn on_terminal(
        limit: Option<Duration>,
        stats: Arc<Stats>,
        probe: Option<BpfProbe>,
    ) -> Option<Self> {
        std::io::stderr().is_terminal().then(|| Self {
            started: Instant::now(),
            limit,
            stats,
            probe,
            drawn: false,
        })
    }

    fn text(&self) -> String {
        let elapsed = self.started.elapsed().as_secs_f64();
        let time = match self.limit {
            Some(limit) => format!("{elapsed:.1}s/{}", humantime::format_duration(limit)),
            None => format!("{elapsed:.1}s"),
        };
        let samples = self.stats.samples_received.load(Ordering::Relaxed);
        let lost = self
            .probe
            .as_ref()
            .map_or(0, |probe| lost_samples(&probe.counters()));
        format!("firn: recording {time}  {samples} samples  {lost} lost")
    }

    pub fn draw(&mut self) {
        let text = self.text();
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r");
        let _ = stderr.queue(Clear(ClearType::UntilNewLine));
        // Back to the line's start: a log line written before the next
        // redraw covers the status instead of following it.
        let _ = write!(stderr, "{text}\r");
        let _ = stderr.flush();
        self.drawn = true;
    }

    /// Removes the line, leaving the cursor where it started.
    pub fn clear(&mut self) {
        if !self.drawn {
            return;
        }
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r");
        let _ = stderr.queue(Clear(ClearType::UntilNewLine));
        let _ = stderr.flush();
        self.drawn = false;
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.clear();
    }
}
