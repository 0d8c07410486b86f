//! Profiles waiting for a server, bounded in bytes: when a new
//! request does not fit, the oldest waiting ones are dropped (and counted),
//! so a server that is down costs memory up to the bound and no more.

#[cfg(test)]
use std::sync::Arc;
use std::{collections::VecDeque, sync::Mutex};

use tokio::sync::Notify;

use crate::output::destination::Tally;

/// One push: a request (Parca's or Pyroscope's) and what it weighs.
#[derive(Clone, Debug)]
pub struct Pending<R> {
    pub request: R,
    pub bytes: usize,
    /// Profiles (series) in the request.
    pub profiles: usize,
    /// Failed attempts so far.
    pub attempts: u32,
}

/// What had to go to make room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub requests: usize,
    pub profiles: usize,
}

/// The bookkeeping, apart from locking and waking so it is tested alone.
#[derive(Debug)]
pub struct ByteQueue<R> {
    items: VecDeque<Pending<R>>,
    bytes: usize,
    limit: usize,
    /// Profiles in `items`.
    profiles: usize,
    /// Profiles taken by the sender and not yet sent, refused or put back:
    /// still owed to `profiles_written = sent + dropped + queued`.
    in_flight: usize,
}

impl<R> ByteQueue<R> {
    pub fn new(limit: usize) -> Self {
        Self {
            items: VecDeque::new(),
            bytes: 0,
            limit,
            profiles: 0,
            in_flight: 0,
        }
    }

    /// Profiles waiting or being sent.
    pub fn profiles(&self) -> usize {
        self.profiles + self.in_flight
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds the newest request, dropping the oldest ones while it does not
    /// fit; a request larger than the whole bound is dropped itself.
    pub fn push_back(&mut self, item: Pending<R>) -> Dropped {
        let mut dropped = Dropped::default();
        if item.bytes > self.limit {
            dropped.requests += 1;
            dropped.profiles += item.profiles;
            return dropped;
        }
        while self.bytes + item.bytes > self.limit {
            let Some(oldest) = self.pop_front() else {
                break;
            };
            dropped.requests += 1;
            dropped.profiles += oldest.profiles;
        }
        self.bytes += item.bytes;
        self.profiles += item.profiles;
        self.items.push_back(item);
        dropped
    }

    /// Puts back a request whose push failed: it is the oldest, so it is
    /// the first to go if newer ones need the room.
    pub fn push_front(&mut self, item: Pending<R>) -> Dropped {
        if self.bytes + item.bytes > self.limit {
            return Dropped {
                requests: 1,
                profiles: item.profiles,
            };
        }
        self.bytes += item.bytes;
        self.profiles += item.profiles;
        self.items.push_front(item);
        Dropped::default()
    }

    pub fn pop_front(&mut self) -> Option<Pending<R>> {
        let item = self.items.pop_front()?;
        self.bytes -= item.bytes;
        self.profiles -= item.profiles;
        Some(item)
    }
}

/// The queue shared by the builder thread (which pushes, never waiting on
/// the network) and the delivery task (which waits for work).
/// Keeps the destination's queue gauges, and its share of the
/// `remote_queue_bytes` and `remote_queue_profiles` totals, up to date.
pub struct SharedQueue<R> {
    inner: Mutex<ByteQueue<R>>,
    ready: Notify,
    tally: Tally,
}

impl<R> SharedQueue<R> {
    pub fn new(limit: usize, tally: Tally) -> Self {
        Self {
            inner: Mutex::new(ByteQueue::new(limit)),
            ready: Notify::new(),
            tally,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut ByteQueue<R>) -> T) -> T {
        let mut queue = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = f(&mut queue);
        self.tally
            .queue_level(queue.bytes() as u64, queue.profiles() as u64);
        result
    }

    pub fn push_back(&self, item: Pending<R>) -> Dropped {
        let dropped = self.with(|queue| queue.push_back(item));
        self.ready.notify_one();
        dropped
    }

    /// Puts back a request [`Self::next`] handed out whose push failed.
    pub fn push_front(&self, item: Pending<R>) -> Dropped {
        self.with(|queue| {
            queue.in_flight = queue.in_flight.saturating_sub(item.profiles);
            queue.push_front(item)
        })
    }

    /// A request [`Self::next`] handed out was sent or refused for good.
    pub fn settled(&self, profiles: usize) {
        self.with(|queue| queue.in_flight = queue.in_flight.saturating_sub(profiles));
    }

    pub fn pop_front(&self) -> Option<Pending<R>> {
        self.with(ByteQueue::pop_front)
    }

    /// Waits for a request and takes it; it counts as queued until
    /// [`Self::settled`] or [`Self::push_front`].
    pub async fn next(&self) -> Pending<R> {
        loop {
            // Registered before looking, so a push in between still wakes us.
            let notified = self.ready.notified();
            let taken = self.with(|queue| {
                let item = queue.pop_front()?;
                queue.in_flight += item.profiles;
                Some(item)
            });
            if let Some(item) = taken {
                return item;
            }
            notified.await;
        }
    }
}

impl<R> Drop for SharedQueue<R> {
    /// The totals over all destinations lose this queue's share.
    fn drop(&mut self) {
        self.tally.queue_level(0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{output::destination::DestinationStats, stats::Stats};

    fn item(bytes: usize, profiles: usize) -> Pending<()> {
        Pending {
            request: (),
            bytes,
            profiles,
            attempts: 0,
        }
    }

    #[test]
    fn the_oldest_go_first_when_full() {
        let mut queue = ByteQueue::new(100);
        assert_eq!(queue.push_back(item(40, 1)), Dropped::default());
        assert_eq!(queue.push_back(item(40, 2)), Dropped::default());
        let dropped = queue.push_back(item(40, 3));
        assert_eq!(
            dropped,
            Dropped {
                requests: 1,
                profiles: 1
            }
        );
        assert_eq!((queue.len(), queue.bytes()), (2, 80));
        assert_eq!(queue.pop_front().map(|p| p.profiles), Some(2));
    }

    #[test]
    fn a_request_larger_than_the_bound_is_dropped_itself() {
        let mut queue = ByteQueue::new(100);
        queue.push_back(item(60, 1));
        let dropped = queue.push_back(item(101, 7));
        assert_eq!(dropped.profiles, 7);
        assert_eq!(queue.len(), 1, "what was waiting stays");
    }

    #[test]
    fn a_failed_request_goes_back_to_the_front() {
        let mut queue = ByteQueue::new(100);
        queue.push_back(item(30, 1));
        queue.push_back(item(30, 2));
        let first = queue.pop_front().expect("item");
        queue.push_back(item(30, 3));
        assert_eq!(queue.push_front(first), Dropped::default());
        assert_eq!(queue.pop_front().map(|p| p.profiles), Some(1));
        // No room left: the returning request, the oldest, is the one dropped.
        let mut full = ByteQueue::new(50);
        full.push_back(item(40, 1));
        assert_eq!(full.push_front(item(20, 9)).profiles, 9);
        assert!(!full.is_empty());
    }

    #[tokio::test]
    async fn the_consumer_wakes_for_a_push_and_the_gauge_follows() {
        let stats = Arc::new(Stats::default());
        let queue = Arc::new(SharedQueue::new(1000, tally(&stats)));
        let waiter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.next().await.profiles })
        };
        tokio::task::yield_now().await;
        queue.push_back(item(10, 5));
        queue.push_back(item(7, 1));
        assert_eq!(waiter.await.expect("joins"), 5);
        assert_eq!(stats.snapshot().remote_queue_bytes, 7);
    }

    #[tokio::test]
    async fn profiles_being_sent_still_count_as_queued() {
        let stats = Arc::new(Stats::default());
        let queue = SharedQueue::new(1000, tally(&stats));
        queue.push_back(item(10, 3));
        queue.push_back(item(10, 2));
        let queued = || stats.snapshot().remote_queue_profiles;
        assert_eq!(queued(), 5);
        let first = queue.next().await;
        assert_eq!(queued(), 5, "in flight");
        queue.push_front(first);
        assert_eq!(queued(), 5, "put back");
        let first = queue.next().await;
        queue.settled(first.profiles);
        assert_eq!(queued(), 2, "sent");
        // Dropped to make room: out of the gauge (the caller counts it).
        let small = SharedQueue::new(15, tally(&stats));
        small.push_back(item(10, 4));
        assert_eq!(small.push_back(item(10, 1)).profiles, 4);
        assert_eq!(queued(), 3, "the total over both queues");
        drop(queue);
        assert_eq!(queued(), 1, "a queue gone takes its share along");
    }

    fn tally(stats: &Arc<Stats>) -> Tally {
        Tally::new(stats.clone(), Arc::new(DestinationStats::new("test")))
    }
}
