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
                self.exits.push(now, tgid, self.processes.cap().get());
            }
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
        if self.exits.overflowed() {
            self.expire_walking(now);
        }
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

    /// `expire` after the exit queue overflowed: the whole table walked
    /// once, the queue rebuilt from the exited processes that stay.
    fn expire_walking(&mut self, now: Instant) {
        let grace = self.grace;
        let expired: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, entry)| {
                entry
                    .exited_at
                    .is_some_and(|at| now.duration_since(at) >= grace)
            })
            .map(|(&tgid, _)| tgid)
            .collect();
        for tgid in expired {
            self.processes.pop(&tgid);
        }
        self.exits.rebuild(
            self.processes
                .iter()
                .filter_map(|(&tgid, entry)| Some((entry.exited_at?, tgid))),
        );
    }
}

/// At most as long as the table (`cap`); beyond that the queue gives up
/// until the table is walked once and the queue rebuilt from it.
#[derive(Default)]
pub(super) struct ExitQueue {
    queue: VecDeque<(Instant, u32)>,
    overflowed: bool,
}

impl ExitQueue {
    pub(super) fn push(&mut self, at: Instant, tgid: u32, cap: usize) {
        if self.overflowed {
            return;
        }
        if self.queue.len() >= cap {
            self.overflowed = true;
            self.queue = VecDeque::new();
            return;
        }
        self.queue.push_back((at, tgid));
    }

    /// Whether exits were let go: the table is to be walked.
    pub(super) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The queue anew, from the exits of the processes the walk kept.
    pub(super) fn rebuild(&mut self, exits: impl Iterator<Item = (Instant, u32)>) {
        let mut exits: Vec<(Instant, u32)> = exits.collect();
        exits.sort_unstable();
        self.queue = exits.into();
        self.overflowed = false;
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
    fn hands_out_the_due_in_order_and_gives_up_beyond_its_bound() {
        let grace = Duration::from_secs(5);
        let start = Instant::now();
        let mut exits = ExitQueue::default();
        exits.push(start, 1, 3);
        exits.push(start + Duration::from_secs(1), 2, 3);
        assert_eq!(exits.pop_due(start + grace, grace), Some(1));
        assert_eq!(exits.pop_due(start + grace, grace), None, "2 not yet");
        exits.push(start + Duration::from_secs(2), 3, 3);
        exits.push(start + Duration::from_secs(2), 4, 3);
        assert!(!exits.overflowed());
        exits.push(start + Duration::from_secs(2), 5, 3);
        assert!(exits.overflowed());
        assert_eq!(exits.pop_due(start + 2 * grace, grace), None, "let go");
        exits.rebuild([(start + Duration::from_secs(3), 7), (start, 6)].into_iter());
        assert!(!exits.overflowed());
        assert_eq!(exits.pop_due(start + 2 * grace, grace), Some(6));
        assert_eq!(exits.pop_due(start + 2 * grace, grace), Some(7));
    }
}
