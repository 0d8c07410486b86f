//! Named user frames kept from one interval to the next, by object content
//! and address: in steady state a profile's frames are the last one's, and
//! naming a frame again (a DWARF lookup, a symbol table that may have been
//! evicted and must be rebuilt, demangling) costs far more than a lookup
//! here. Bounded in bytes; what it holds is counted on `/metrics` as the
//! `frames` cache.

use std::sync::Arc;

use agent_cache::ByteBoundedCache;
use agent_elf::ContentKey;
use agent_pprof::Line;

use crate::stats::Stats;

/// Default size: some 50 000 frames with typical names.
pub const FRAME_CACHE_BYTES: usize = 8 << 20;

/// Bookkeeping per entry beyond its strings: the key, the `Arc`, the
/// cache's own links.
const ENTRY_OVERHEAD: usize = 128;

pub struct FrameCache {
    lines: ByteBoundedCache<(ContentKey, u64), Arc<[Line]>>,
    stats: Arc<Stats>,
}

impl FrameCache {
    pub fn new(max_bytes: usize, stats: Arc<Stats>) -> Self {
        Self {
            lines: ByteBoundedCache::new(max_bytes),
            stats,
        }
    }

    /// The lines of `vaddr` in the object with content `key`, named by
    /// `name` unless an earlier interval did.
    pub fn get_or_name(
        &mut self,
        key: ContentKey,
        vaddr: u64,
        name: impl FnOnce() -> Arc<[Line]>,
    ) -> Arc<[Line]> {
        let key = (key, vaddr);
        if let Some(lines) = self.lines.get(&key) {
            Stats::inc(&self.stats.frame_cache_hits);
            return lines.clone();
        }
        Stats::inc(&self.stats.frame_cache_misses);
        let lines = name();
        let evicted = self.lines.insert(key, lines.clone(), cost(&lines));
        Stats::add(&self.stats.frame_cache_evictions, evicted as u64);
        lines
    }
}

fn cost(lines: &[Line]) -> usize {
    ENTRY_OVERHEAD
        + lines
            .iter()
            .map(|line| {
                std::mem::size_of::<Line>()
                    + line.function.len()
                    + line.system_name.len()
                    + line.file.as_ref().map_or(0, String::len)
            })
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use agent_elf::BuildId;

    use super::*;

    fn line(name: &str) -> Arc<[Line]> {
        Arc::from(vec![Line {
            function: name.into(),
            system_name: name.into(),
            file: None,
            line: Some(1),
        }])
    }

    #[test]
    fn a_frame_is_named_once_and_the_cache_stays_bounded() {
        let stats = Arc::new(Stats::default());
        let mut cache = FrameCache::new(4 * (ENTRY_OVERHEAD + 100), stats.clone());
        let key = ContentKey::BuildId(BuildId::new(&[1; 20]));
        let mut named = 0;
        for _ in 0..3 {
            let lines = cache.get_or_name(key.clone(), 0x10, || {
                named += 1;
                line("main")
            });
            assert_eq!(lines[0].function, "main");
        }
        assert_eq!(named, 1);
        for vaddr in 0..16 {
            cache.get_or_name(key.clone(), 0x1000 + vaddr, || line("f"));
        }
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.frame_cache_hits, 2);
        assert_eq!(snapshot.frame_cache_misses, 17);
        assert!(snapshot.frame_cache_evictions >= 13, "{snapshot:?}");
    }
}
