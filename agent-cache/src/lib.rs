//! Caches bounded by the bytes their values use: least recently used
//! ([`ByteBoundedCache`]), or keeping what each round uses
//! ([`ResidentCache`]).

mod resident;

use std::hash::Hash;

use foldhash::fast::RandomState;
use lru::LruCache;

pub use resident::{Found, ResidentCache};

/// The byte bound is the real limit; this only keeps tiny values from
/// piling up without end.
const MAX_ENTRIES: usize = 65_536;

pub struct ByteBoundedCache<K: Hash + Eq, V> {
    entries: LruCache<K, (V, usize), RandomState>,
    bytes: usize,
    max_bytes: usize,
}

impl<K: Hash + Eq + Clone, V> ByteBoundedCache<K, V> {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            // Grows with use: a bounded LruCache would allocate its whole
            // table up front.
            entries: LruCache::unbounded_with_hasher(RandomState::default()),
            bytes: 0,
            max_bytes,
        }
    }

    pub fn get(&mut self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(value, _)| value)
    }

    /// The value at `key`, without touching recency.
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.entries.peek(key).map(|(value, _)| value)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.entries.get_mut(key).map(|(value, _)| value)
    }

    /// The values, most recently used first, without touching recency.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, (value, _))| value)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Inserts and evicts least recently used entries until the cache fits;
    /// returns how many were evicted. An entry larger than the whole budget
    /// is still kept (alone), so a huge object is usable once.
    pub fn insert(&mut self, key: K, value: V, bytes: usize) -> usize {
        let mut evicted = 0;
        // `push` hands back the old value of the same key, if any.
        if let Some((_, (_, old_bytes))) = self.entries.push(key, (value, bytes)) {
            self.bytes = self.bytes.saturating_sub(old_bytes);
        }
        self.bytes += bytes;
        while self.entries.len() > MAX_ENTRIES
            && let Some((_, (_, freed))) = self.entries.pop_lru()
        {
            self.bytes = self.bytes.saturating_sub(freed);
            evicted += 1;
        }
        evicted + self.shrink()
    }

    /// Records that the value at `key` now uses `bytes` (values that grow
    /// as they are used), marks it most recently used and evicts others
    /// until the cache fits; returns how many were evicted.
    pub fn set_bytes(&mut self, key: &K, bytes: usize) -> usize {
        let Some((_, charged)) = self.entries.get_mut(key) else {
            return 0;
        };
        let old = std::mem::replace(charged, bytes);
        self.bytes = self.bytes.saturating_sub(old) + bytes;
        self.shrink()
    }

    /// Evicts least recently used entries until the cache fits, even the
    /// last one; returns how many were evicted.
    pub fn trim(&mut self) -> usize {
        let mut evicted = 0;
        while self.bytes > self.max_bytes {
            match self.entries.pop_lru() {
                Some((_, (_, freed))) => {
                    self.bytes = self.bytes.saturating_sub(freed);
                    evicted += 1;
                }
                None => break,
            }
        }
        evicted
    }

    /// Evicts least recently used entries until the cache fits, keeping at
    /// least one.
    fn shrink(&mut self) -> usize {
        let mut evicted = 0;
        while self.bytes > self.max_bytes && self.entries.len() > 1 {
            match self.entries.pop_lru() {
                Some((_, (_, freed))) => {
                    self.bytes = self.bytes.saturating_sub(freed);
                    evicted += 1;
                }
                None => break,
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_beyond_the_byte_budget() {
        let mut cache = ByteBoundedCache::new(100);
        assert_eq!(cache.insert("a", 1, 40), 0);
        assert_eq!(cache.insert("b", 2, 40), 0);
        assert_eq!(cache.get(&"a"), Some(&1));
        assert_eq!(cache.insert("c", 3, 40), 1, "b was least recently used");
        assert_eq!(cache.get(&"b"), None);
        assert_eq!(cache.bytes(), 80);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn growing_values_push_out_the_least_recently_used() {
        let mut cache = ByteBoundedCache::new(100);
        cache.insert("a", 1, 30);
        cache.insert("b", 2, 30);
        assert_eq!(cache.set_bytes(&"missing", 500), 0);
        *cache.get_mut(&"a").expect("present") = 10;
        assert_eq!(cache.set_bytes(&"a", 60), 0, "90 bytes still fit");
        assert_eq!(cache.set_bytes(&"a", 80), 1, "b goes");
        assert_eq!(cache.get(&"b"), None);
        assert_eq!(cache.get(&"a"), Some(&10));
        assert_eq!(cache.bytes(), 80);
    }

    #[test]
    fn an_oversized_entry_is_kept_alone() {
        let mut cache = ByteBoundedCache::new(10);
        cache.insert("small", 1, 5);
        assert_eq!(cache.insert("huge", 2, 500), 1);
        assert_eq!(cache.get(&"huge"), Some(&2));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.trim(), 1, "trimming lets even the last one go");
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
    }
}
