//! Small ids for the contents of objects: the unwinder's caches are keyed
//! by them, not by a build id that would be hashed and compared for every
//! frame unwound.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
};

use agent_elf::ContentKey;

/// The next id handed out, by any registry or opened object: ids are never
/// reused in the agent's life, so rows cached under one always belong to
/// the code it named.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Names an object's content (its [`ContentKey`]) in the unwinder's
/// caches. Objects with the same content share an id while the registry
/// holds one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentId(u64);

impl ContentId {
    /// An id no other object has (an object opened outside a registry).
    pub fn fresh() -> Self {
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The id as a number, for keys outside the agent (never reused, so
    /// equal numbers name equal contents).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// The ids of the contents of a registry's objects, each with how many of
/// them have it. Bounded by the registry: an entry goes with the last
/// object of its content.
#[derive(Debug, Default)]
pub struct ContentIds {
    ids: HashMap<ContentKey, (ContentId, usize)>,
}

impl ContentIds {
    /// The id of `key`, for one more registered object with it.
    pub fn acquire(&mut self, key: ContentKey) -> ContentId {
        let (id, objects) = self
            .ids
            .entry(key)
            .or_insert_with(|| (ContentId::fresh(), 0));
        *objects += 1;
        *id
    }

    /// A registered object with content `key` was let go; the id is
    /// forgotten with the last of them (a later object with that content
    /// gets a new one).
    pub fn release(&mut self, key: &ContentKey) {
        if let Some((_, objects)) = self.ids.get_mut(key) {
            *objects = objects.saturating_sub(1);
            if *objects == 0 {
                self.ids.remove(key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use agent_elf::{BuildId, ObjectKey};

    use super::*;

    fn build_id(byte: u8) -> ContentKey {
        ContentKey::BuildId(BuildId::new(&[byte; 20]))
    }

    #[test]
    fn copies_of_one_content_share_an_id_while_one_is_held() {
        let mut ids = ContentIds::default();
        let first = ids.acquire(build_id(1));
        let copy = ids.acquire(build_id(1));
        let other = ids.acquire(build_id(2));
        let inode = ids.acquire(ContentKey::Object(ObjectKey::File { dev: 1, inode: 2 }));
        assert_eq!(first, copy);
        assert_ne!(first, other);
        assert_ne!(other, inode);
        assert_eq!(ids.len(), 3);

        ids.release(&build_id(1));
        assert_eq!(ids.acquire(build_id(1)), first, "one copy is still held");
        ids.release(&build_id(1));
        ids.release(&build_id(1));
        ids.release(&build_id(2));
        assert_eq!(ids.len(), 1, "entries go with their last object");
        // Releasing what is not held changes nothing.
        ids.release(&build_id(9));
        assert_eq!(ids.len(), 1);
    }

    #[test]
    fn ids_are_not_reused() {
        let mut ids = ContentIds::default();
        let before = ids.acquire(build_id(1));
        ids.release(&build_id(1));
        assert_eq!(ids.len(), 0);
        let after = ids.acquire(build_id(1));
        assert_ne!(before, after, "an id let go is not handed out again");
        assert_ne!(ContentId::fresh(), ContentId::fresh());
    }
}
