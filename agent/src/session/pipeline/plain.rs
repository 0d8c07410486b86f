//! Executables whose new processes need nothing before their first
//! sample: every runtime looked at one of their processes at its exec and
//! found it was not its own (what a runtime decides there comes from the
//! executable: an interpreter in it, or one it links). Their next
//! processes' maps are read at their first sample, if any, not at their
//! exec (`ProcessTable::on_exec`), keyed by the executable the exec event
//! carries.

use std::{num::NonZeroUsize, sync::Arc};

use agent_common::ExecutableKey;
use lru::LruCache;

use crate::{stats::Stats, unwind::Preset};

/// Executables remembered: a host runs far fewer distinct programs; one
/// forgotten is read at its next exec again and remembered anew.
const MAX_PLAIN_EXECUTABLES: usize = 4096;

pub(super) struct PlainExecutables {
    /// With the unwinding each one's processes get at their exec.
    known: LruCache<ExecutableKey, Preset>,
    stats: Arc<Stats>,
}

impl PlainExecutables {
    pub(super) fn new(stats: Arc<Stats>) -> Self {
        Self {
            known: LruCache::new(
                NonZeroUsize::new(MAX_PLAIN_EXECUTABLES).unwrap_or(NonZeroUsize::MIN),
            ),
            stats,
        }
    }

    /// Whether a new process of `executable` can wait for its first
    /// sample, and how it is unwound meanwhile.
    pub(super) fn get(&mut self, executable: &ExecutableKey) -> Option<Preset> {
        self.known.get(executable).copied()
    }

    pub(super) fn insert(&mut self, executable: ExecutableKey, preset: Preset) {
        if let Some((evicted, _)) = self.known.push(executable, preset)
            && evicted != executable
        {
            Stats::inc(&self.stats.plain_executables_forgotten);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(inode: u64) -> ExecutableKey {
        ExecutableKey {
            inode,
            dev: 0x80_0001,
            reserved: 0,
        }
    }

    #[test]
    fn bounded_and_counts_what_it_forgets() {
        let stats = Arc::new(Stats::default());
        let mut plain = PlainExecutables::new(stats.clone());
        assert_eq!(plain.get(&key(1)), None);
        plain.insert(key(1), Preset::frame_pointers());
        plain.insert(key(1), Preset::frame_pointers());
        assert_eq!(plain.get(&key(1)), Some(Preset::frame_pointers()));
        assert_eq!(stats.snapshot().plain_executables_forgotten, 0);
        for inode in 2..=MAX_PLAIN_EXECUTABLES as u64 + 1 {
            plain.insert(key(inode), Preset::frame_pointers());
        }
        assert_eq!(plain.get(&key(1)), None, "the least recently used");
        assert!(plain.get(&key(2)).is_some());
        assert_eq!(stats.snapshot().plain_executables_forgotten, 1);
    }
}
