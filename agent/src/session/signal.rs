//! Stopping on a signal.

use std::io;

/// Completes on SIGINT, SIGTERM or SIGHUP.
pub async fn shutdown_signal() -> io::Result<&'static str> {
    Ok(ShutdownSignal::install()?.recv().await)
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment this is made: a
/// signal that comes while the BPF programs load is kept for the loop
/// (rather than killing the process before it can clean up). SIGHUP (a
/// closed terminal, or an operator used to reloading daemons with it)
/// stops firn the same way: its default action would kill it unflushed.
pub struct ShutdownSignal {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    /// Must be called within a tokio runtime.
    pub fn install() -> io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The name of the next signal; cancel-safe.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}
