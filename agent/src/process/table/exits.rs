//! Exits in the order they were seen, so that the table forgets the
//! processes due without walking all of them each time (most entries of a
//! busy host are exited processes).

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use super::{Entry, ProcessTable};
use crate::stats::Stats;

impl ProcessTable {
    /// The process exited: keep it resolvable for the grace period.
    pub fn on_exit(&mut self, tgid: u32) {
        if let Some(entry) = self.processes.peek_mut(&tgid) {
            entry.exit_seen = true;
            if entry.exited_at.is_none() {
                let now = Instant::now();
                entry.exited_at = Some(now);
                self.queue_exit(now, tgid);
            }
        }
    }

    /// Queues an exit; a full queue (as many exits within the grace period
    /// as the table holds processes) forgets its oldest at once, as the
    /// table's own bound would.
    pub(super) fn queue_exit(&mut self, at: Instant, tgid: u32) {
        let Some(oldest) = self.exits.push(at, tgid, self.processes.cap().get()) else {
            return;
        };
        // Only an exited process: the pid may be a live one's by now.
        if self
            .processes
            .peek(&oldest)
            .is_some_and(|entry| entry.exited_at.is_some())
        {
            self.processes.pop(&oldest);
            Stats::inc(&self.stats.processes_evicted);
        }
    }

    /// Forgets processes that exited more than the grace period ago.
    pub fn expire(&mut self, now: Instant) {
        let grace = self.grace;
        let due = |entry: &Entry| {
            entry
                .exited_at
                .is_some_and(|at| now.duration_since(at) >= grace)
        };
        while let Some(tgid) = self.exits.pop_due(now, grace) {
            // The entry may have been replaced since (a new process
            // reusing the pid) or evicted: only its own exit counts.
            if self.processes.peek(&tgid).is_some_and(due) {
                self.processes.pop(&tgid);
            }
        }
        // Called every second: often enough for the gauges.
        Stats::set(&self.stats.processes_tracked, self.processes.len() as u64);
        Stats::set(&self.stats.objects_tracked, self.objects.len() as u64);
    }
}

/// Exits in order, at most as many as the table holds (`cap`): beyond
/// that the oldest is handed back to be forgotten before its grace ends
/// (a host exiting more processes per grace period than the table holds
/// would push them out of the table anyway).
#[derive(Default)]
pub(super) struct ExitQueue {
    queue: VecDeque<(Instant, u32)>,
}

impl ExitQueue {
    /// Queues `tgid`'s exit; returns the oldest exit let go to make room.
    pub(super) fn push(&mut self, at: Instant, tgid: u32, cap: usize) -> Option<u32> {
        let oldest = if self.queue.len() >= cap {
            self.queue.pop_front().map(|(_, tgid)| tgid)
        } else {
            None
        };
        self.queue.push_back((at, tgid));
        oldest
    }

    /// The next process that exited `grace` or longer before `now`, taken
    /// off the queue (its entry may have been replaced since).
    pub(super) fn pop_due(&mut self, now: Instant, grace: Duration) -> Option<u32> {
        let &(at, tgid) = self.queue.front()?;
        if now.duration_since(at) < grace {
            return None;
        }
        self.queue.pop_front();
        Some(tgid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_due_in_order_and_lets_the_oldest_go_beyond_its_bound() {
        let grace = Duration::from_secs(5);
        let start = Instant::now();
        let mut exits = ExitQueue::default();
        assert_eq!(exits.push(start, 1, 3), None);
        assert_eq!(exits.push(start + Duration::from_secs(1), 2, 3), None);
        assert_eq!(exits.pop_due(start + grace, grace), Some(1));
        assert_eq!(exits.pop_due(start + grace, grace), None, "2 not yet");
        assert_eq!(exits.push(start + Duration::from_secs(2), 3, 3), None);
        assert_eq!(exits.push(start + Duration::from_secs(2), 4, 3), None);
        assert_eq!(exits.push(start + Duration::from_secs(2), 5, 3), Some(2));
        assert_eq!(exits.pop_due(start + 2 * grace, grace), Some(3));
        assert_eq!(exits.pop_due(start + 2 * grace, grace), Some(4));
        assert_eq!(exits.pop_due(start + 2 * grace, grace), Some(5));
        assert_eq!(exits.pop_due(start + 2 * grace, grace), None);
    }
}
