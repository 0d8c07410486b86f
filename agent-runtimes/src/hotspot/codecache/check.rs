//! Checking remembered code blobs against their headers as they are now,
//! the reads of a sample's blobs made at once, and none for a blob read
//! after the sample.

use super::{CodeBlob, CodeCache};
use crate::{Memory, hotspot::layout::Layout};

impl CodeCache {
    /// Checks blobs [`Self::remembered`] at their pcs against their headers
    /// as they are now, all read at once: the index of the first that no
    /// longer says the same (forgotten, as is any after it), if any.
    pub fn check(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        blobs: &[(u64, &CodeBlob)],
    ) -> Option<usize> {
        self.check_at(memory, layout, blobs, u64::MAX, 0)
    }

    /// [`Self::check`] for a sample taken at `sampled_at`, its read made at
    /// or after `now` (both on the caller's monotonic clock). A blob whose
    /// header was read after the sample (looked up or checked for a later
    /// one) is believed without reading it again: it said the same when it
    /// was first found, before the sample, and after it, and a blob freed
    /// and compiled again in between would have another compile id. So a
    /// batch of samples handled together reads each blob once.
    pub fn check_at(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        blobs: &[(u64, &CodeBlob)],
        sampled_at: u64,
        now: u64,
    ) -> Option<usize> {
        let stale: Vec<usize> = {
            let found = self.found.borrow();
            (0..blobs.len())
                .filter(|&index| {
                    let blob = blobs[index].1;
                    !found
                        .get(&blob.start)
                        .is_some_and(|(known, read_at)| *read_at >= sampled_at && known == blob)
                })
                .collect()
        };
        let size = layout.heap_block_size as usize + self.header_bytes;
        let mut bytes = vec![0; size * stale.len()];
        let mut reads: Vec<(u64, &mut [u8])> = bytes
            .chunks_mut(size)
            .zip(&stale)
            .map(|(chunk, &index)| {
                let start = blobs[index].1.start;
                (start.wrapping_sub(layout.heap_block_size), chunk)
            })
            .collect();
        let read = match reads.is_empty() {
            true => 0,
            false => memory.read_many(&mut reads),
        };
        drop(reads);
        let mut counts = self.counts.get();
        let mut bad = None;
        let mut chunks = bytes.chunks(size).enumerate();
        for (index, (pc, blob)) in blobs.iter().enumerate() {
            if stale.binary_search(&index).is_ok() {
                let Some((nth, chunk)) = chunks.next() else {
                    break;
                };
                let block = blob.start.wrapping_sub(layout.heap_block_size);
                let same = nth < read
                    && self
                        .parse_blob(memory, layout, block, chunk, *pc)
                        .ok()
                        .flatten()
                        .is_some_and(|again| again == **blob);
                let mut found = self.found.borrow_mut();
                if !same {
                    bad = Some(index);
                    for (_, blob) in &blobs[index..] {
                        found.remove(&blob.start);
                    }
                    break;
                }
                if let Some((_, read_at)) = found.get_mut(&blob.start) {
                    *read_at = (*read_at).max(now);
                }
            }
            counts.hits += 1;
        }
        self.counts.set(counts);
        bad
    }
}
