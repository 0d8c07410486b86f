//! What the BPF programs say through `aya-log`: why a read, a walk or a
//! write failed. Off by default, and then free: the programs' log level
//! (`AYA_LOG_LEVEL`, read-only data) is zero, so the verifier drops the
//! logging branches and nothing is ever written, and no reader runs. Only
//! when the log filter enables debug for [`LOG_TARGET`] does the level go
//! up and a thread forward the records to tracing.

use std::{
    io,
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use agent_common::LOG_TARGET;
use aya::Ebpf;
use aya_log::EbpfLogger;
use tracing::warn;

/// How long the reader sleeps between looks when the programs are quiet;
/// also how long it may take to notice it should stop.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The programs' log ring buffer (aya-log-ebpf's `AYA_LOGS`).
pub const LOG_MAP: &str = "AYA_LOGS";

/// Size of the log ring buffer while logging is off: nothing is ever
/// written to it then, so it gets the smallest the kernel takes, one page.
pub fn map_bytes_when_off() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(page)
        .ok()
        .filter(|page| page.is_power_of_two())
        .unwrap_or(4096)
}

/// The value of `AYA_LOG_LEVEL` (`aya_log::LEVEL`) for the current log
/// filter: the programs log at debug level only, so it is debug or off.
/// Asks the subscriber, so it must be installed first.
pub fn level() -> u8 {
    if tracing::enabled!(target: LOG_TARGET, tracing::Level::DEBUG) {
        aya_log::Level::Debug as u8
    } else {
        0
    }
}

/// Hands `aya-log`'s records to tracing as events of their own under
/// [`LOG_TARGET`]. (`tracing-log`'s bridge would give them the target `log`
/// in the logfmt output, which does not normalize log records.)
struct ToTracing;

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: LOG_TARGET, "{message}"),
            log::Level::Warn => tracing::warn!(target: LOG_TARGET, "{message}"),
            log::Level::Info => tracing::info!(target: LOG_TARGET, "{message}"),
            log::Level::Debug => tracing::debug!(target: LOG_TARGET, "{message}"),
            log::Level::Trace => tracing::trace!(target: LOG_TARGET, "{message}"),
        }
    }

    fn flush(&self) {}
}

/// The thread that forwards the programs' log records; stops when dropped.
pub struct ProgramLog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProgramLog {
    /// Takes the log ring buffer out of `ebpf` and starts forwarding.
    pub fn start(ebpf: &mut Ebpf) -> Result<Self, ProgramLogError> {
        let mut logger = EbpfLogger::init_with_logger(ebpf, ToTracing)
            .map_err(|source| ProgramLogError::Open { source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("firn-bpf-log".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    if let Err(error) = wait_readable(&logger) {
                        warn!(%error, "stopped reading the BPF programs' log");
                        return;
                    }
                    logger.flush();
                }
            })
            .map_err(|source| ProgramLogError::Thread { source })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ProgramLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits until the ring buffer has records or [`POLL_INTERVAL`] passed.
fn wait_readable(logger: &EbpfLogger<ToTracing>) -> io::Result<()> {
    let mut poll = libc::pollfd {
        fd: logger.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = i32::try_from(POLL_INTERVAL.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd, and its count is 1; the descriptor stays
    // open while `logger` is borrowed.
    let ready = unsafe { libc::poll(&mut poll, 1, timeout) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ProgramLogError {
    #[error("could not open the BPF programs' log ring buffer")]
    Open {
        #[source]
        source: aya_log::Error,
    },
    #[error("could not start the thread reading the BPF programs' log")]
    Thread {
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    fn level_under(filter: &str) -> u8 {
        let filter = crate::logging::filter(filter).expect("a valid filter");
        let subscriber = tracing_subscriber::registry().with(filter);
        tracing::subscriber::with_default(subscriber, level)
    }

    #[test]
    fn the_programs_log_only_when_their_target_has_debug_on() {
        let debug = aya_log::Level::Debug as u8;
        assert_eq!(level_under("info"), 0);
        assert_eq!(level_under("off"), 0);
        assert_eq!(level_under("info,firn::output=debug"), 0);
        assert_eq!(level_under("info,firn::bpf=debug"), debug);
        assert_eq!(level_under("warn,firn=trace"), debug);
        assert_eq!(level_under("debug"), debug);
    }
}
