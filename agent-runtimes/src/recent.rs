//! Reads of a process's memory made after a sample was taken, believed
//! for that sample: the samples of a batch, handled together, read each
//! small block of memory once.
//!
//! A namer reads what a sample's frames point at after the sample was
//! taken, and checks it (types, links) as it is then. Bytes read at any
//! time after the sample are as good for that as bytes read now: a block
//! read while handling one sample of a batch is taken for every other
//! sample of the batch taken before that read, and read again for a
//! sample taken after it. Objects are small and close together (an
//! object, its map, its neighbours), so reads are made by aligned block:
//! the header and fields of an object come in one read. A block never
//! crosses a page, so it is readable whenever the bytes asked for are;
//! where it is not (memory that is only partly known), the bytes asked
//! for are read alone, as without the store.

use std::collections::HashMap;

use crate::{Memory, MemoryError};

/// Bytes read at once, aligned (a power of two, at most a page).
pub const BLOCK: u64 = 256;
/// Calls a prefetch makes at most: each stops at a block that cannot be
/// read, and the next goes on past it.
const PREFETCH_CALLS: usize = 4;
/// Blocks kept per process at most (256 KiB), a batch's worth for deep
/// stacks.
const MAX_BLOCKS: usize = 1024;

/// Reads whose answer came from the store or from the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecentCounts {
    /// Reads answered from blocks read after their sample.
    pub hits: u64,
    /// Blocks read from the process (and reads passed on whole: larger
    /// than a block, or whose block could not be read).
    pub reads: u64,
}

struct Block {
    /// When it was read (at the latest; the caller's monotonic clock).
    read_at: u64,
    /// `None`: it could not be read whole; the bytes asked for are read
    /// alone, without trying the block again.
    bytes: Option<Box<[u8; BLOCK as usize]>>,
}

/// The blocks of one process read lately.
#[derive(Default)]
pub struct RecentReads {
    blocks: HashMap<u64, Block>,
    counts: RecentCounts,
}

impl RecentReads {
    pub fn new() -> Self {
        Self::default()
    }

    /// `memory` read through the store for a sample taken at
    /// `sampled_at`, the reads made at or after `now` (both on the same
    /// monotonic clock; `now` taken before the first read).
    pub fn for_sample<'a>(
        &'a mut self,
        memory: &'a mut dyn Memory,
        sampled_at: u64,
        now: u64,
    ) -> RecentMemory<'a> {
        RecentMemory {
            reads: self,
            memory,
            sampled_at,
            now,
        }
    }

    /// The counts since the last call.
    pub fn take_counts(&mut self) -> RecentCounts {
        std::mem::take(&mut self.counts)
    }

    fn insert(&mut self, start: u64, block: Block, sampled_at: u64) {
        if self.blocks.len() >= MAX_BLOCKS {
            // Blocks read before this sample serve no later one.
            self.blocks.retain(|_, kept| kept.read_at >= sampled_at);
            if self.blocks.len() >= MAX_BLOCKS {
                self.blocks.clear();
            }
        }
        self.blocks.insert(start, block);
    }
}

/// A process's memory as read for one sample ([`RecentReads::for_sample`]).
pub struct RecentMemory<'a> {
    reads: &'a mut RecentReads,
    memory: &'a mut dyn Memory,
    sampled_at: u64,
    now: u64,
}

impl RecentMemory<'_> {
    /// The block starting at `start`, read after the sample; `None` when
    /// it cannot be read whole.
    fn block(&mut self, start: u64) -> Option<&[u8; BLOCK as usize]> {
        let fresh = self
            .reads
            .blocks
            .get(&start)
            .map(|block| (block.read_at >= self.sampled_at, block.bytes.is_some()));
        if let Some((true, readable)) = fresh {
            self.reads.counts.hits += u64::from(readable);
        } else {
            let mut bytes = Box::new([0; BLOCK as usize]);
            self.reads.counts.reads += 1;
            let read = self.memory.read(start, &mut bytes[..]).is_ok();
            let block = Block {
                read_at: self.now,
                bytes: read.then_some(bytes),
            };
            self.reads.insert(start, block, self.sampled_at);
        }
        self.reads.blocks.get(&start)?.bytes.as_deref()
    }

    /// Fills `buf` from the blocks it spans, if each can be read.
    fn read_blocks(&mut self, address: u64, buf: &mut [u8]) -> Option<()> {
        let end = address.checked_add(buf.len() as u64)?;
        let mut at = address;
        while at < end {
            let start = at & !(BLOCK - 1);
            let upto = end.min(start + BLOCK);
            let block = self.block(start)?;
            let from = (at - start) as usize;
            let to = (upto - start) as usize;
            let into = (at - address) as usize;
            buf[into..into + (to - from)].copy_from_slice(&block[from..to]);
            at = upto;
        }
        Some(())
    }
}

impl Memory for RecentMemory<'_> {
    /// The blocks holding `addresses` not yet read after the sample, read
    /// in one call up to the first that cannot be (remembered as such),
    /// then the rest in another, up to [`PREFETCH_CALLS`].
    fn prefetch(&mut self, addresses: &[u64]) {
        let mut starts: Vec<u64> = addresses
            .iter()
            .map(|address| address & !(BLOCK - 1))
            .filter(|start| {
                self.reads
                    .blocks
                    .get(start)
                    .is_none_or(|block| block.read_at < self.sampled_at)
            })
            .collect();
        starts.sort_unstable();
        starts.dedup();
        if starts.is_empty() {
            return;
        }
        let mut left = starts.as_slice();
        for _ in 0..PREFETCH_CALLS {
            if left.is_empty() {
                break;
            }
            let mut bytes: Vec<Box<[u8; BLOCK as usize]>> =
                left.iter().map(|_| Box::new([0; BLOCK as usize])).collect();
            let mut reads: Vec<(u64, &mut [u8])> = left
                .iter()
                .zip(bytes.iter_mut())
                .map(|(&start, block)| (start, &mut block[..]))
                .collect();
            self.reads.counts.reads += 1;
            let done = self.memory.read_many(&mut reads);
            drop(reads);
            for (index, (&start, block)) in left.iter().zip(bytes).enumerate().take(done + 1) {
                let block = Block {
                    read_at: self.now,
                    bytes: (index < done).then_some(block),
                };
                self.reads.insert(start, block, self.sampled_at);
            }
            left = left.get(done + 1..).unwrap_or_default();
        }
    }

    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        if buf.is_empty() {
            return Ok(());
        }
        // Large reads (strings, tables, code) are cached by what decodes
        // them.
        if buf.len() as u64 <= BLOCK && self.read_blocks(address, buf).is_some() {
            return Ok(());
        }
        self.reads.counts.reads += 1;
        self.memory.read(address, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory whose bytes are their address's low byte, readable from
    /// 0x1000 to `end`, counting reads.
    struct Pages {
        end: u64,
        reads: usize,
    }

    impl Memory for Pages {
        fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
            self.reads += 1;
            let end = address + buf.len() as u64;
            if address < 0x1000 || end > self.end {
                return Err(MemoryError {
                    address,
                    length: buf.len(),
                    source: None,
                });
            }
            for (index, byte) in buf.iter_mut().enumerate() {
                *byte = (address + index as u64) as u8;
            }
            Ok(())
        }
    }

    fn read(memory: &mut dyn Memory, address: u64, length: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; length];
        memory.read(address, &mut buf).ok()?;
        Some(buf)
    }

    #[test]
    fn a_block_read_after_a_sample_serves_it_and_earlier_ones() {
        let mut pages = Pages {
            end: 0x3000,
            reads: 0,
        };
        let mut recent = RecentReads::new();
        let mut memory = recent.for_sample(&mut pages, 100, 200);
        assert_eq!(read(&mut memory, 0x1010, 8), Some((0x10..0x18).collect()));
        assert_eq!(read(&mut memory, 0x1020, 2), Some(vec![0x20, 0x21]));
        // A sample taken before the read: the same block.
        let mut memory = recent.for_sample(&mut pages, 150, 300);
        assert_eq!(read(&mut memory, 0x10f8, 8), Some((0xf8..=0xff).collect()));
        assert_eq!(pages.reads, 1);
        // A sample taken after it: read again.
        let mut memory = recent.for_sample(&mut pages, 250, 300);
        assert_eq!(read(&mut memory, 0x1010, 8), Some((0x10..0x18).collect()));
        assert_eq!(pages.reads, 2);
        assert_eq!(recent.take_counts(), RecentCounts { hits: 2, reads: 2 });
    }

    #[test]
    fn reads_across_blocks_large_ones_and_unreadable_blocks() {
        let mut pages = Pages {
            end: 0x3000,
            reads: 0,
        };
        let mut recent = RecentReads::new();
        let mut memory = recent.for_sample(&mut pages, 0, 1);
        // Across two blocks: both read.
        let bytes = read(&mut memory, 0x10fc, 8).expect("readable");
        assert_eq!(bytes, [0xfc, 0xfd, 0xfe, 0xff, 0, 1, 2, 3]);
        // Larger than a block: passed on.
        assert_eq!(
            read(&mut memory, 0x1200, 512).map(|bytes| bytes.len()),
            Some(512)
        );
        // Unreadable: the block, then the bytes alone, both fail; the
        // block is not tried again.
        assert_eq!(read(&mut memory, 0x3000, 8), None);
        assert_eq!(read(&mut memory, 0x3010, 8), None);
        assert_eq!(pages.reads, 2 + 1 + 3);
    }

    #[test]
    fn blocks_prefetched_at_once_serve_the_reads() {
        let mut pages = Pages {
            end: 0x3000,
            reads: 0,
        };
        let mut recent = RecentReads::new();
        // In address order, up to the first block that cannot be read
        // (the default read_many reads one by one), remembered so, then
        // past it.
        let mut memory = recent.for_sample(&mut pages, 0, 1);
        memory.prefetch(&[0x5000, 0x1010, 0x1020, 0x1210, 0x2f00, 0x1400, 0x800]);
        assert_eq!(pages.reads, 6);
        let mut memory = recent.for_sample(&mut pages, 0, 1);
        assert_eq!(read(&mut memory, 0x1018, 8), Some((0x18..0x20).collect()));
        assert_eq!(read(&mut memory, 0x2f08, 8), Some((0x08..0x10).collect()));
        assert!(read(&mut memory, 0x1400, 8).is_some());
        // The unreadable blocks: the bytes alone.
        assert_eq!(read(&mut memory, 0x5000, 8), None);
        assert_eq!(read(&mut memory, 0x800, 8), None);
        assert_eq!(pages.reads, 8);
    }

    #[test]
    fn the_store_stays_bounded() {
        let mut pages = Pages {
            end: 0x10_0000,
            reads: 0,
        };
        let mut recent = RecentReads::new();
        for sample in 0..100u64 {
            let mut memory = recent.for_sample(&mut pages, sample * 10, sample * 10 + 5);
            for block in 0..16 {
                let address = 0x1000 + (sample * 16 + block) * BLOCK;
                read(&mut memory, address, 8).expect("readable");
            }
            assert!(recent.blocks.len() <= MAX_BLOCKS);
        }
    }
}
