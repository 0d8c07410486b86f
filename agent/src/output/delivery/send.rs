//! Sends the queued requests, oldest first: a timeout on each push,
//! exponential backoff with jitter between failed attempts, a failed
//! request back at the head of the queue (where it is the first to go if
//! the queue fills), and at shutdown a last flush bounded by a deadline.
//! The same for every kind of server: what differs is the [`Pusher`].

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tonic::{Code, Status};
use tracing::{debug, error, info, warn};

use super::{
    Pusher,
    queue::{Pending, SharedQueue},
};
use crate::{backoff::Backoff, output::destination::Tally};

/// The shutdown signal: `Some(deadline)` once the agent stops.
pub type ShutdownReceiver = watch::Receiver<Option<Instant>>;

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What one failed push means for the request.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// The server or the network may do better later.
    Retry,
    /// The server refused this request and would refuse it again.
    Reject,
}

/// The gRPC reading of a status, which the Connect protocol shares.
pub fn classify(code: Code) -> Failure {
    match code {
        Code::InvalidArgument
        | Code::Unauthenticated
        | Code::PermissionDenied
        | Code::Unimplemented
        | Code::NotFound
        | Code::FailedPrecondition
        | Code::AlreadyExists
        | Code::OutOfRange => Failure::Reject,
        _ => Failure::Retry,
    }
}

/// A status and every cause below it on one line: tonic's own text for
/// connection failures is a bare "transport error".
pub fn describe(status: &Status) -> String {
    let mut parts = vec![format!("{:?}", status.code())];
    if !status.message().is_empty() {
        parts.push(status.message().to_owned());
    }
    causes(parts, std::error::Error::source(status))
}

/// `parts` and the text of `source` and each cause below it that does not
/// repeat what is there already, on one line.
pub fn causes(
    mut parts: Vec<String>,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

pub struct Delivery<P: Pusher> {
    pub client: P,
    pub queue: Arc<SharedQueue<P::Request>>,
    pub shutdown: ShutdownReceiver,
    pub request_timeout: Duration,
    pub address: String,
    pub tally: Tally,
    pub push_duration: Histogram,
    /// The refusal last logged at error level, until a push succeeds: a
    /// server that refuses every push says so once, not every interval.
    pub refused: Option<Code>,
}

impl<P: Pusher> Delivery<P> {
    /// Runs until shutdown, then flushes until the queue is empty or the
    /// deadline passes; what is left is counted as dropped.
    pub async fn run(mut self) {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut deadline: Option<Instant> = None;
        loop {
            let item = match deadline {
                None => tokio::select! {
                    changed = self.shutdown.changed() => {
                        deadline = Some(self.deadline_after(changed.is_ok()));
                        backoff.reset(FIRST_BACKOFF);
                        continue;
                    }
                    item = self.queue.next() => item,
                },
                Some(deadline) if Instant::now() < deadline => match self.queue.pop_front() {
                    Some(item) => item,
                    None => break,
                },
                Some(_) => break,
            };
            let timeout = deadline.map_or(self.request_timeout, |deadline| {
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(self.request_timeout)
            });
            let Some(wait) = self.attempt(item, timeout, &mut backoff).await else {
                continue;
            };
            match deadline {
                None => tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    changed = self.shutdown.changed() => {
                        // Flush now, with short waits, rather than after a
                        // long outage's backoff.
                        deadline = Some(self.deadline_after(changed.is_ok()));
                        backoff.reset(FIRST_BACKOFF);
                    }
                },
                Some(deadline) => {
                    if Instant::now() + wait >= deadline {
                        break;
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
        self.drop_leftovers();
    }

    fn deadline_after(&self, signalled: bool) -> Instant {
        let sent = if signalled {
            *self.shutdown.borrow()
        } else {
            None
        };
        // A vanished sender means the agent is gone: no time to flush.
        sent.unwrap_or_else(Instant::now)
    }

    /// One push. Returns how long to wait before the next when it failed
    /// and the request went back into the queue.
    async fn attempt(
        &mut self,
        mut item: Pending<P::Request>,
        timeout: Duration,
        backoff: &mut Backoff,
    ) -> Option<Duration> {
        if item.attempts > 0 {
            self.tally.retry();
        }
        let request = item.request.clone();
        let started = Instant::now();
        let answer = tokio::time::timeout(timeout, self.client.push(request)).await;
        self.push_duration.observe(started.elapsed().as_secs_f64());
        let status = match answer {
            Ok(Ok(_)) => {
                self.tally.sent(item.profiles as u64);
                self.queue.settled(item.profiles);
                if item.attempts > 0 {
                    info!(
                        destination = self.tally.name(),
                        server = self.address,
                        profiles = item.profiles,
                        failed_attempts = item.attempts,
                        "profiles delivered after retrying"
                    );
                } else {
                    debug!(
                        server = self.address,
                        profiles = item.profiles,
                        bytes = item.bytes,
                        "profiles sent"
                    );
                }
                backoff.reset(FIRST_BACKOFF);
                self.refused = None;
                return None;
            }
            Ok(Err(status)) => status,
            Err(_) => Status::deadline_exceeded(format!("no answer within {timeout:?}")),
        };
        self.tally.failure();
        let reason = describe(&status);
        if self.client.classify(status.code()) == Failure::Reject {
            self.refuse(&item, status.code(), &reason);
            return None;
        }
        item.attempts += 1;
        let wait = backoff.wait();
        warn!(
            destination = self.tally.name(),
            server = self.address,
            profiles = item.profiles,
            attempt = item.attempts,
            retry_in = ?wait,
            error = %reason,
            "could not push profiles; will retry"
        );
        let profiles = item.profiles;
        let dropped = self.queue.push_front(item);
        if dropped.profiles > 0 {
            self.tally.dropped(profiles as u64);
            warn!(
                destination = self.tally.name(),
                profiles, "profiles dropped: the destination's queue is full"
            );
        }
        Some(wait)
    }

    /// A refusal: the profiles are counted as rejected, not retried, and
    /// logged at error level unless the last refusal was of the same kind.
    fn refuse(&mut self, item: &Pending<P::Request>, code: Code, reason: &str) {
        self.tally.rejected(item.profiles as u64);
        self.queue.settled(item.profiles);
        let hint = self.client.hint(code);
        if self.refused == Some(code) {
            debug!(
                destination = self.tally.name(),
                server = self.address,
                profiles = item.profiles,
                error = %reason,
                "the server rejected the profiles again{hint}"
            );
        } else {
            self.refused = Some(code);
            error!(
                destination = self.tally.name(),
                server = self.address,
                profiles = item.profiles,
                error = %reason,
                "the server rejected the profiles{hint}; \
                 later refusals of the same kind are counted (rejected) without a log line"
            );
        }
    }

    fn drop_leftovers(&self) {
        let mut profiles = 0;
        while let Some(item) = self.queue.pop_front() {
            profiles += item.profiles;
        }
        if profiles > 0 {
            self.tally.dropped(profiles as u64);
            warn!(
                destination = self.tally.name(),
                server = self.address,
                profiles,
                "profiles not sent before the shutdown deadline"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_final_and_outages_are_retried() {
        assert_eq!(classify(Code::Unauthenticated), Failure::Reject);
        assert_eq!(classify(Code::InvalidArgument), Failure::Reject);
        assert_eq!(classify(Code::Unavailable), Failure::Retry);
        assert_eq!(classify(Code::DeadlineExceeded), Failure::Retry);
        assert_eq!(classify(Code::ResourceExhausted), Failure::Retry);
    }

    #[test]
    fn descriptions_carry_the_causes() {
        let cause = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let status = Status::from_error(Box::new(cause));
        let text = describe(&status);
        assert!(text.contains("UnknownIssuer"), "{text}");
    }
}
