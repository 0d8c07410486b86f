//! The rows of the last few thousand (object, address) pairs looked up, in
//! a direct-mapped table in front of the row LRU. A DWARF unwind looks up
//! a row per frame (dozens per stack of a shell or compiler); found in the
//! LRU, each costs a hash probe and a node dereference, both cache misses
//! once the LRU has outgrown the CPU's caches. This table stays small
//! enough to stay in them: a hit is one hash and one compare.
//!
//! Keys name object contents that are never reused for other contents, so
//! an entry is never wrong, only overwritten.

use std::hash::{BuildHasher, Hash};

use foldhash::fast::FixedState;

use crate::cfi::UnwindRow;

/// Entries: a power of two. Some 40 KiB with 16-byte keys.
const SLOTS: usize = 1 << 10;

/// An object, an address in it, and its row (`None`: it has none).
type Slot<K> = Option<(K, u64, Option<UnwindRow>)>;

pub(crate) struct RecentRows<K> {
    slots: Box<[Slot<K>]>,
    hasher: FixedState,
}

impl<K: Clone + Eq + Hash> RecentRows<K> {
    pub(crate) fn new() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| None).collect(),
            hasher: FixedState::default(),
        }
    }

    fn slot(&self, key: &K, vaddr: u64) -> usize {
        (self.hasher.hash_one((key, vaddr)) as usize) & (SLOTS - 1)
    }

    /// The row of `vaddr` in `key` if it was looked up recently (`None` for
    /// an address without one is `Some(None)`).
    pub(crate) fn get(&self, key: &K, vaddr: u64) -> Option<Option<UnwindRow>> {
        match &self.slots[self.slot(key, vaddr)] {
            Some((held_key, held_vaddr, row)) if *held_vaddr == vaddr && held_key == key => {
                Some(*row)
            }
            _ => None,
        }
    }

    pub(crate) fn put(&mut self, key: &K, vaddr: u64, row: Option<UnwindRow>) {
        let slot = self.slot(key, vaddr);
        self.slots[slot] = Some((key.clone(), vaddr, row));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cfi::{Cfa, Rule};

    fn row(offset: i32) -> UnwindRow {
        UnwindRow {
            cfa: Cfa::RspOffset(offset),
            ra: Rule::CfaOffset(-8),
            rbp: Rule::Same,
        }
    }

    #[test]
    fn a_row_is_found_only_under_its_own_object_and_address() {
        let mut recent = RecentRows::new();
        assert_eq!(recent.get(&1u64, 0x1000), None);
        recent.put(&1u64, 0x1000, Some(row(16)));
        recent.put(&1u64, 0x2000, None);
        assert_eq!(recent.get(&1u64, 0x1000), Some(Some(row(16))));
        assert_eq!(recent.get(&1u64, 0x2000), Some(None), "no row, remembered");
        assert_eq!(recent.get(&2u64, 0x1000), None, "another object");
        assert_eq!(recent.get(&1u64, 0x1001), None, "another address");
    }

    #[test]
    fn a_colliding_pair_replaces_the_one_before() {
        let mut recent = RecentRows::new();
        // More pairs than slots: some share a slot, and the last one in
        // each slot is the one found there.
        for vaddr in 0..(2 * SLOTS as u64) {
            recent.put(&7u64, vaddr, Some(row(vaddr as i32)));
        }
        let found = (0..(2 * SLOTS as u64))
            .filter(|&vaddr| recent.get(&7u64, vaddr) == Some(Some(row(vaddr as i32))))
            .count();
        assert!(found <= SLOTS, "{found} found in {SLOTS} slots");
        assert!(found > SLOTS / 2, "only {found} of the last pairs kept");
        let last = 2 * SLOTS as u64 - 1;
        assert_eq!(recent.get(&7u64, last), Some(Some(row(last as i32))));
    }
}
