//! Where each thread's stack ends, learned from its complete DWARF
//! unwinds, so that the BPF program copies a thread's stack only as far
//! as its own stacks reach (`THREAD_STACKS`). A process's copy is fitted
//! to its deepest thread: a JVM whose compiler thread once needed 20 KiB
//! had its main thread copied 64 KiB a sample (all readable memory above
//! its stack pointer), though its unwinds end 2 KiB above it. A thread's
//! stack ends at the same address whatever its depth (its outermost
//! frames are always the same), so the end its unwinds reached, with a
//! margin, bounds what it needs.

use std::num::NonZeroUsize;

use agent_common::MAX_THREAD_STACKS;
use lru::LruCache;

use super::StackNeed;

/// Complete unwinds of a thread before its stack's end is written.
const LEARN_AFTER: u32 = 16;

/// Bytes beyond the furthest its unwinds reached that a thread's copy
/// takes: a signal frame, a deeper variant of its outermost frames.
const MARGIN: u64 = 512;

/// What the BPF map of stack ends is to be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadChange {
    /// The thread's copy ends here.
    Set { tid: u32, end: u64 },
    /// The thread gets its process's copy again.
    Remove { tid: u32 },
}

#[derive(Clone, Copy, Debug, Default)]
struct ThreadStack {
    tgid: u32,
    /// The furthest (highest address) a complete unwind reached.
    reached: u64,
    complete: u32,
    /// The end written into the map, if any.
    end: Option<u64>,
}

pub struct ThreadStacks {
    threads: LruCache<u32, ThreadStack>,
}

impl Default for ThreadStacks {
    fn default() -> Self {
        let capacity = NonZeroUsize::new(MAX_THREAD_STACKS as usize).unwrap_or(NonZeroUsize::MIN);
        Self {
            threads: LruCache::new(capacity),
        }
    }
}

impl ThreadStacks {
    /// One DWARF unwind of thread `tid` of `tgid` from stack pointer `sp`
    /// over `copied` bytes: what the map is to be told, if anything.
    pub fn observe(
        &mut self,
        (tgid, tid): (u32, u32),
        sp: u64,
        need: StackNeed,
        copied: usize,
    ) -> Option<ThreadChange> {
        let thread = self.threads.get_or_insert_mut(tid, || ThreadStack {
            tgid,
            ..ThreadStack::default()
        });
        // The tid reused by another process: its end says nothing of this
        // thread's.
        let mut change = None;
        if thread.tgid != tgid {
            if thread.end.is_some() {
                change = Some(ThreadChange::Remove { tid });
            }
            *thread = ThreadStack {
                tgid,
                ..ThreadStack::default()
            };
        }
        match need {
            StackNeed::Used(bytes) => {
                thread.reached = thread.reached.max(sp.saturating_add(bytes));
                thread.complete = thread.complete.saturating_add(1);
                if thread.end.is_none() && thread.complete >= LEARN_AFTER {
                    let end = thread.reached.saturating_add(MARGIN).next_multiple_of(8);
                    thread.end = Some(end);
                    return Some(ThreadChange::Set { tid, end });
                }
            }
            // Cut where the thread's end said: it was wrong (a deeper
            // outermost frame, another thread with the tid); learned anew.
            StackNeed::MoreThanCopied => {
                if let Some(end) = thread.end
                    && sp.saturating_add(copied as u64) >= end
                {
                    *thread = ThreadStack {
                        tgid,
                        ..ThreadStack::default()
                    };
                    return Some(ThreadChange::Remove { tid });
                }
            }
        }
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_copied_up_to_where_its_unwinds_end() {
        let mut stacks = ThreadStacks::default();
        let end = 0x7000_2000;
        for index in 1..LEARN_AFTER {
            let sp = end - 1000 - u64::from(index) * 8;
            assert_eq!(
                stacks.observe((1, 2), sp, StackNeed::Used(end - sp), 65536),
                None
            );
        }
        assert_eq!(
            stacks.observe((1, 2), end - 100, StackNeed::Used(100), 65536),
            Some(ThreadChange::Set {
                tid: 2,
                end: end + MARGIN
            })
        );
        // A stack short of the end is none of its business.
        let sp = end - 4000;
        assert_eq!(
            stacks.observe((1, 2), sp, StackNeed::MoreThanCopied, 100),
            None
        );
        // Cut at the end: learned again.
        let copied = (end + MARGIN - sp) as usize;
        assert_eq!(
            stacks.observe((1, 2), sp, StackNeed::MoreThanCopied, copied),
            Some(ThreadChange::Remove { tid: 2 })
        );
        assert_eq!(
            stacks.observe((1, 2), sp, StackNeed::Used(4000), 65536),
            None
        );
    }

    #[test]
    fn a_reused_tid_starts_afresh() {
        let mut stacks = ThreadStacks::default();
        for _ in 0..LEARN_AFTER {
            stacks.observe((1, 2), 0x1000, StackNeed::Used(64), 65536);
        }
        assert_eq!(
            stacks.observe((3, 2), 0x1000, StackNeed::Used(64), 65536),
            Some(ThreadChange::Remove { tid: 2 })
        );
    }
}
