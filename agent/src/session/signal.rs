//! Stopping on a signal.

use std::io;

use tokio::sync::mpsc;

/// Signals received but not yet asked for: a few, as a burst of Ctrl-C
/// comes; beyond, the loop is told of one of them, which is all it acts on.
const PENDING_SIGNALS: usize = 8;

/// Completes on SIGINT, SIGTERM or SIGHUP.
pub async fn shutdown_signal() -> io::Result<&'static str> {
    Ok(ShutdownSignal::install()?.recv().await)
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment this is made: a
/// signal that comes while the BPF programs load is kept for the loop
/// (rather than killing the process before it can clean up). SIGHUP (a
/// closed terminal, or an operator used to reloading daemons with it)
/// stops firn the same way: its default action would kill it unflushed.
///
/// A task of its own waits on the three signals and passes their names
/// on: the drain loop polls its future at every wakeup, and one channel
/// costs less to poll than three signal streams.
pub struct ShutdownSignal {
    names: mpsc::Receiver<&'static str>,
}

impl ShutdownSignal {
    /// Must be called within a tokio runtime.
    pub fn install() -> io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let (sender, names) = mpsc::channel(PENDING_SIGNALS);
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = interrupt.recv() => "SIGINT",
                    _ = terminate.recv() => "SIGTERM",
                    _ = hangup.recv() => "SIGHUP",
                };
                // Full: the loop has signals enough to act on.
                if let Err(mpsc::error::TrySendError::Closed(_)) = sender.try_send(name) {
                    return;
                }
            }
        });
        Ok(Self { names })
    }

    /// The name of the next signal; cancel-safe.
    pub async fn recv(&mut self) -> &'static str {
        match self.names.recv().await {
            Some(name) => name,
            // The task ends only with the runtime.
            None => std::future::pending().await,
        }
    }
}
