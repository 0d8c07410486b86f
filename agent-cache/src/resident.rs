//! A byte-bounded cache for values that are expensive to rebuild and are
//! used in rounds (the symbolizer's DWARF contexts, used once per profile,
//! object after object). Plain LRU is at its worst there: when one round
//! needs a little more than the budget, each newcomer pushes out the value
//! used longest ago, which is the one the next round needs first, and
//! every value is rebuilt every round. Here values used in the current or
//! the previous round stay; what does not fit beside them is held alone,
//! as the transient value, until the round ends. Only the overflow is then
//! rebuilt each round, and the overflow is the cheaper side: a value's
//! rebuild grows with its bytes (a DWARF context's index and the units
//! parsed into it), so a value that needs room pushes out smaller ones
//! used in these rounds when together they hold fewer bytes than it does.
//! Otherwise the largest context, used every round for the few addresses
//! new in it, would be the one rebuilt each round.

use std::hash::Hash;

use lru::LruCache;

struct Held<V> {
    value: V,
    bytes: usize,
    /// The last round the value was used in.
    round: u64,
}

pub struct ResidentCache<K: Hash + Eq, V> {
    /// Least recently used first: also the oldest round first, since a use
    /// marks both.
    residents: LruCache<K, Held<V>>,
    /// Bytes of the residents; at most `max_bytes`.
    bytes: usize,
    /// A value that did not fit beside the residents, kept for the rest
    /// of the round.
    transient: Option<(K, Held<V>)>,
    max_bytes: usize,
    round: u64,
}

/// What [`ResidentCache::get_mut`] found.
pub enum Found<'a, V> {
    /// Kept from an earlier use.
    Resident(&'a mut V),
    /// The value held for this round only.
    Transient(&'a mut V),
}

impl<'a, V> Found<'a, V> {
    pub fn into_value(self) -> &'a mut V {
        match self {
            Self::Resident(value) | Self::Transient(value) => value,
        }
    }
}

impl<K: Hash + Eq + Clone, V> ResidentCache<K, V> {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            // Grows with use, bounded by the bytes.
            residents: LruCache::unbounded(),
            bytes: 0,
            transient: None,
            max_bytes,
            round: 0,
        }
    }

    /// The value at `key`, marked as used in this round.
    pub fn get_mut(&mut self, key: &K) -> Option<Found<'_, V>> {
        let round = self.round;
        if let Some(held) = self.residents.get_mut(key) {
            held.round = round;
            return Some(Found::Resident(&mut held.value));
        }
        match &mut self.transient {
            Some((held_key, held)) if held_key == key => Some(Found::Transient(&mut held.value)),
            _ => None,
        }
    }

    /// Bytes held, the transient value's included.
    pub fn bytes(&self) -> usize {
        self.bytes + self.transient.as_ref().map_or(0, |(_, held)| held.bytes)
    }

    pub fn len(&self) -> usize {
        self.residents.len() + usize::from(self.transient.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value held, mutably, without marking any as used.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.residents
            .iter_mut()
            .map(|(_, held)| &mut held.value)
            .chain(self.transient.as_mut().map(|(_, held)| &mut held.value))
    }

    /// Every value held, without marking any as used.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.residents
            .iter()
            .map(|(_, held)| &held.value)
            .chain(self.transient.as_ref().map(|(_, held)| &held.value))
    }

    /// Inserts a value of `bytes`: as a resident if it fits once values
    /// unused for a whole round are evicted, or once residents that together
    /// hold fewer bytes than it are (rebuilding them costs less than
    /// rebuilding it), else as the transient value
    /// (replacing the one before). Returns how many values were evicted.
    pub fn insert(&mut self, key: K, value: V, bytes: usize) -> usize {
        let mut evicted = self.remove(&key);
        evicted += self.evict_stale(bytes);
        evicted += self.evict_cheaper(None, bytes);
        let held = Held {
            value,
            bytes,
            round: self.round,
        };
        if self.bytes.saturating_add(bytes) <= self.max_bytes {
            self.bytes += bytes;
            self.residents.put(key, held);
        } else {
            evicted += usize::from(self.transient.replace((key, held)).is_some());
        }
        evicted
    }

    /// Records that the value at `key` now takes `bytes` (values that grow
    /// as they are used). A resident that no longer fits once values unused
    /// for a whole round, and smaller ones that together hold fewer bytes,
    /// are evicted becomes the transient value itself. Returns how many
    /// values were evicted.
    pub fn set_bytes(&mut self, key: &K, bytes: usize) -> usize {
        if let Some((held_key, held)) = &mut self.transient
            && held_key == key
        {
            held.bytes = bytes;
            return 0;
        }
        let Some(held) = self.residents.peek_mut(key) else {
            return 0;
        };
        let old = std::mem::replace(&mut held.bytes, bytes);
        self.bytes = self.bytes.saturating_sub(old) + bytes;
        if self.bytes <= self.max_bytes {
            return 0;
        }
        // The grown value is the most recently used: stale ones go first,
        // then smaller ones worth less than it.
        let mut evicted = self.evict_stale(0);
        if self.bytes > self.max_bytes {
            self.bytes -= bytes;
            evicted += self.evict_cheaper(Some(key), bytes);
            self.bytes += bytes;
        }
        if self.bytes > self.max_bytes
            && let Some(held) = self.residents.pop(key)
        {
            self.bytes = self.bytes.saturating_sub(held.bytes);
            evicted += usize::from(self.transient.replace((key.clone(), held)).is_some());
        }
        evicted
    }

    /// The round is over: the transient value goes, and values used in it
    /// are kept through the next one. Returns how many values were evicted.
    pub fn end_round(&mut self) -> usize {
        self.round += 1;
        usize::from(self.transient.take().is_some())
    }

    /// [`Self::end_round`], and when a value was transient this round, the
    /// resident holding the most bytes that recent rounds did not use
    /// (`stale`) goes too if those are at least the transient's bytes:
    /// rebuilt once, it holds only what later rounds use, and the two may
    /// fit side by side. Otherwise a value grown with what a few rounds
    /// used long ago would keep the other out, rebuilt every round.
    /// Returns how many values were evicted.
    pub fn end_round_shedding(&mut self, stale: impl Fn(&V) -> usize) -> usize {
        let Some(transient) = self.transient.as_ref().map(|(_, held)| held.bytes) else {
            return self.end_round();
        };
        let grown = self
            .residents
            .iter()
            .map(|(key, held)| (stale(&held.value), key))
            .max_by_key(|(grown, _)| *grown)
            .filter(|(grown, _)| *grown >= transient)
            .map(|(_, key)| key.clone());
        let mut evicted = 0;
        if let Some(key) = grown
            && let Some(held) = self.residents.pop(&key)
        {
            self.bytes = self.bytes.saturating_sub(held.bytes);
            evicted += 1;
        }
        evicted + self.end_round()
    }

    /// Removes `key`, resident or transient; returns whether it was held.
    fn remove(&mut self, key: &K) -> usize {
        if let Some(held) = self.residents.pop(key) {
            self.bytes = self.bytes.saturating_sub(held.bytes);
            return 1;
        }
        match &self.transient {
            Some((held_key, _)) if held_key == key => {
                self.transient = None;
                1
            }
            _ => 0,
        }
    }

    /// Makes room for `bytes` more by evicting the smallest residents
    /// (other than `keep`), if together they hold fewer bytes than that:
    /// they are cheaper to rebuild each round than the value needing the
    /// room. All or none: a value that would not fit even then evicts
    /// nothing. Returns how many values were evicted.
    fn evict_cheaper(&mut self, keep: Option<&K>, bytes: usize) -> usize {
        let need = self
            .bytes
            .saturating_add(bytes)
            .saturating_sub(self.max_bytes);
        if need == 0 || bytes > self.max_bytes {
            return 0;
        }
        // Least recently used first among values of one size.
        let mut sizes: Vec<(usize, &K)> = self
            .residents
            .iter()
            .rev()
            .filter(|(key, _)| Some(*key) != keep)
            .map(|(key, held)| (held.bytes, key))
            .collect();
        sizes.sort_by_key(|(size, _)| *size);
        let mut freed = 0usize;
        let mut victims = Vec::new();
        for (size, key) in sizes {
            if freed >= need {
                break;
            }
            freed = freed.saturating_add(size);
            victims.push(key.clone());
        }
        if freed < need || freed >= bytes {
            return 0;
        }
        for key in &victims {
            if let Some(held) = self.residents.pop(key) {
                self.bytes = self.bytes.saturating_sub(held.bytes);
            }
        }
        victims.len()
    }

    /// Evicts residents unused in this round and the one before, least
    /// recently used first, until `room` more bytes fit.
    fn evict_stale(&mut self, room: usize) -> usize {
        let mut evicted = 0;
        while self.bytes.saturating_add(room) > self.max_bytes {
            let stale = self
                .residents
                .peek_lru()
                .is_some_and(|(_, held)| held.round.saturating_add(1) < self.round);
            if !stale {
                break;
            }
            if let Some((_, held)) = self.residents.pop_lru() {
                self.bytes = self.bytes.saturating_sub(held.bytes);
                evicted += 1;
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_resident<V>(found: Option<Found<'_, V>>) -> Option<bool> {
        found.map(|found| matches!(found, Found::Resident(_)))
    }

    /// Three values of 40 bytes used in turn, round after round, in a
    /// budget of 100: plain LRU rebuilds all three each round; here two
    /// stay and only the third is rebuilt.
    #[test]
    fn a_round_larger_than_the_budget_rebuilds_only_the_overflow() {
        let mut cache = ResidentCache::new(100);
        let mut rebuilt = 0;
        let mut evicted = 0;
        for _ in 0..5 {
            for key in ["a", "b", "c"] {
                if cache.get_mut(&key).is_none() {
                    rebuilt += 1;
                    evicted += cache.insert(key, 0, 40);
                }
            }
            assert!(cache.bytes() <= 120);
            evicted += cache.end_round();
        }
        assert_eq!(rebuilt, 3 + 4, "c each round, a and b once");
        assert_eq!(evicted, 5, "c dropped at each round's end");
        assert_eq!(is_resident(cache.get_mut(&"a")), Some(true));
        assert_eq!(is_resident(cache.get_mut(&"b")), Some(true));
        assert_eq!(cache.bytes(), 80);
    }

    #[test]
    fn values_unused_for_a_whole_round_make_room() {
        let mut cache = ResidentCache::new(100);
        cache.insert("old", 1, 60);
        assert_eq!(cache.end_round(), 0);
        assert_eq!(
            cache.insert("new", 2, 60),
            0,
            "transient: nothing is stale yet"
        );
        assert_eq!(is_resident(cache.get_mut(&"new")), Some(false));
        assert_eq!(cache.end_round(), 1, "the transient value goes");
        assert_eq!(cache.get_mut(&"new").map(|_| ()), None);
        // `old` was last used two rounds ago.
        assert_eq!(cache.insert("new", 2, 60), 1, "old is evicted");
        assert_eq!(is_resident(cache.get_mut(&"new")), Some(true));
        assert_eq!(cache.get_mut(&"old").map(|_| ()), None);
        assert_eq!(cache.bytes(), 60);
    }

    #[test]
    fn a_value_that_grows_past_the_budget_becomes_the_transient_one() {
        let mut cache = ResidentCache::new(100);
        cache.insert("a", 1, 60);
        cache.insert("b", 2, 20);
        assert_eq!(cache.set_bytes(&"b", 40), 0, "100 bytes fit");
        assert_eq!(cache.set_bytes(&"b", 50), 0, "a is larger: b goes");
        assert_eq!(is_resident(cache.get_mut(&"b")), Some(false));
        assert_eq!(is_resident(cache.get_mut(&"a")), Some(true), "a stays");
        assert_eq!(cache.bytes(), 110);
        assert_eq!(cache.set_bytes(&"b", 500), 0);
        assert_eq!(cache.set_bytes(&"missing", 500), 0);
        assert_eq!(cache.end_round(), 1);
        assert_eq!(cache.bytes(), 60);
        assert_eq!(cache.len(), 1);
        // A value larger than the whole budget is usable for one round.
        assert_eq!(cache.insert("huge", 3, 1000), 0);
        assert_eq!(
            cache.get_mut(&"huge").map(|found| *found.into_value()),
            Some(3)
        );
        assert_eq!(cache.values().count(), 2);
        assert_eq!(cache.end_round(), 1);
    }

    /// A context that grows to most of the budget, used every round beside
    /// two small ones: the small ones are rebuilt each round (one of them),
    /// not the large one with everything parsed into it.
    #[test]
    fn the_smaller_values_are_the_overflow() {
        let mut cache = ResidentCache::new(100);
        let mut rebuilt_bytes = 0;
        let mut evicted = 0;
        for round in 0..5 {
            for (key, first, grown) in [("s1", 20, 20), ("s2", 20, 20), ("big", 30, 70)] {
                if cache.get_mut(&key).is_none() {
                    rebuilt_bytes += grown;
                    evicted += cache.insert(key, 0, first);
                }
                evicted += cache.set_bytes(&key, grown);
            }
            assert!(
                cache.bytes() <= 100 + 20,
                "round {round}: {}",
                cache.bytes()
            );
            assert_eq!(is_resident(cache.get_mut(&"big")), Some(true));
            evicted += cache.end_round();
        }
        assert_eq!(
            rebuilt_bytes,
            110 + 4 * 20,
            "only s1 again after the first round"
        );
        assert_eq!(
            evicted,
            1 + 4,
            "s1 pushed out once, then dropped as the transient"
        );
        assert_eq!(is_resident(cache.get_mut(&"s2")), Some(true));
        assert_eq!(cache.bytes(), 90);
    }

    /// A value grown with what earlier rounds used (stale), beside a small
    /// one it keeps transient: it is rebuilt once, then both stay. Values
    /// are (bytes now, bytes stale).
    #[test]
    fn a_value_grown_stale_is_rebuilt_once_rather_than_the_other_each_round() {
        let mut cache: ResidentCache<&str, (usize, usize)> = ResidentCache::new(100);
        let stale = |value: &(usize, usize)| value.1;
        cache.insert("big", (90, 60), 90);
        let mut rebuilds = Vec::new();
        for round in 0..4 {
            for (key, size) in [("big", 30), ("small", 20)] {
                if cache.get_mut(&key).is_none() {
                    rebuilds.push((round, key));
                    cache.insert(key, (size, 0), size);
                }
            }
            cache.end_round_shedding(stale);
        }
        assert_eq!(
            rebuilds,
            [(0, "small"), (1, "big"), (1, "small")],
            "once each, then both resident"
        );
        assert_eq!(cache.bytes(), 50);

        // What recent rounds used is not stale: nothing is shed.
        let mut cache: ResidentCache<&str, (usize, usize)> = ResidentCache::new(100);
        cache.insert("big", (90, 0), 90);
        cache.insert("small", (20, 0), 20);
        assert_eq!(cache.end_round_shedding(stale), 1, "only the transient");
        assert_eq!(is_resident(cache.get_mut(&"big")), Some(true));
    }

    /// Making room is all or none, and never for what outgrows the budget.
    #[test]
    fn a_value_too_large_for_the_budget_evicts_nothing() {
        let mut cache = ResidentCache::new(100);
        cache.insert("a", 1, 10);
        cache.insert("b", 2, 10);
        assert_eq!(cache.insert("huge", 3, 101), 0);
        assert_eq!(is_resident(cache.get_mut(&"huge")), Some(false));
        assert_eq!(cache.insert("fits", 4, 95), 2, "a and b hold fewer bytes");
        assert_eq!(is_resident(cache.get_mut(&"fits")), Some(true));
        assert_eq!(cache.bytes(), 95 + 101);
    }
}
