//! What naming one sample costs in reads of the process's memory: the
//! frames of each capture named as the agent names a sample's (function,
//! class, tier, then the line run or the functions inlined), counted
//! where they are read.

use std::collections::BTreeMap;

use agent_fixtures::v8::CAPTURES;

use super::frames::{Replay, load, stack_copy};
use crate::recent::RecentReads;
use crate::{
    Memory, MemoryError,
    v8::{Layout, StackCopy, Tier, V8Namer, walk_chain},
};

/// Counts reads by where they come from (the namer's functions on the
/// way, innermost first).
struct BySite<'a> {
    memory: &'a mut dyn Memory,
    sites: BTreeMap<String, usize>,
}

impl Memory for BySite<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        let names: Vec<&str> = trace
            .lines()
            .filter_map(|line| {
                let name = line.trim().split_once(": ")?.1;
                let name = name.strip_prefix("agent_runtimes::v8::")?;
                Some(name.rsplit_once("::h").map_or(name, |(name, _)| name))
            })
            .filter(|name| !name.starts_with("tests::"))
            .collect();
        // The helper that read, and the first caller outside the heap
        // helpers.
        let caller = names
            .iter()
            .find(|name| !name.starts_with("heap::"))
            .unwrap_or(&"?");
        let site = [names.first().copied().unwrap_or("?"), caller];
        *self.sites.entry(site.join(" < ")).or_default() += 1;
        self.memory.read(address, buf)
    }
}

/// One sample's frames named as the agent names them.
fn name_sample(
    memory: &mut dyn Memory,
    namer: &mut V8Namer,
    layout: &Layout,
    stack: StackCopy<'_>,
    ip: u64,
    bp: u64,
) -> usize {
    let word = |address: u64| {
        let offset = usize::try_from(address.checked_sub(stack.sp)?).ok()?;
        let bytes = stack.bytes.get(offset..offset + 8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    };
    let chain = walk_chain(stack, layout, ip, bp);
    let functions: Vec<u64> = chain.iter().filter_map(|frame| frame.function).collect();
    let arrays: Vec<u64> = chain.iter().filter_map(|frame| frame.bytecode[0]).collect();
    namer.prefetch(memory, &functions, &arrays);
    let mut named = 0;
    for (depth, frame) in chain.iter().enumerate() {
        // The captures hold no context slot (the agent skips frames
        // whose slot holds a frame marker): every frame is tried.
        let Some(function) = frame.function else {
            continue;
        };
        let receiver = layout
            .receivers
            .and_then(|receivers| word(frame.fp.wrapping_add_signed(receivers.slot)));
        if namer.name_method(memory, function, receiver).is_err() {
            continue;
        }
        named += 1;
        match namer.tier(memory, frame, &[]) {
            Ok(Tier::Interpreted) => {
                namer.interpreted_line(memory, function, frame.bytecode);
            }
            Ok(Tier::Optimized) => {
                let _ = namer.optimized(memory, function, frame.pc, depth == 0);
            }
            _ => {}
        }
    }
    named
}

#[test]
#[ignore = "prints where a sample's reads come from"]
fn reads_by_site() {
    for capture in &CAPTURES {
        let mut loaded = load(capture);
        let layout = loaded.layout;
        let (ip, bp, sp, bytes) = stack_copy(capture, &loaded);
        let stack = StackCopy { sp, bytes: &bytes };
        let mut namer = V8Namer::new(layout);
        name_sample(&mut loaded.memory, &mut namer, &layout, stack, ip, bp);
        let mut counted = BySite {
            memory: &mut loaded.memory,
            sites: BTreeMap::new(),
        };
        let named = name_sample(&mut counted, &mut namer, &layout, stack, ip, bp);
        let total: usize = counted.sites.values().sum();
        println!(
            "{}: {total} reads, {named} frames named (caches warm)",
            capture.name
        );
        let mut sites: Vec<_> = counted.sites.into_iter().collect();
        sites.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
        for (site, count) in sites {
            println!("  {count:5}  {site}");
        }
    }
}

/// A capture as a live process's pages: any range within a page the
/// namer read some of is readable, zeros where nothing was captured (the
/// namer reads what it read when captured; the store reads whole blocks
/// around it).
struct Paged<'a>(&'a Replay);

const PAGE: u64 = 4096;

impl Memory for Paged<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let end = address + buf.len() as u64;
        let pages = (address / PAGE)..end.div_ceil(PAGE);
        let mapped = pages.clone().all(|page| {
            (self.0).0.0.iter().any(|(start, bytes)| {
                let last = start + bytes.len() as u64;
                *start < (page + 1) * PAGE && last > page * PAGE
            })
        });
        if !mapped {
            return Err(MemoryError {
                address,
                length: buf.len(),
                source: None,
            });
        }
        buf.fill(0);
        for (start, bytes) in &(self.0).0.0 {
            let last = start + bytes.len() as u64;
            let (from, to) = (address.max(*start), end.min(last));
            if from < to {
                buf[(from - address) as usize..(to - address) as usize]
                    .copy_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
            }
        }
        Ok(())
    }
}

/// Counts the reads it passes on.
struct Counted<'a> {
    memory: &'a mut dyn Memory,
    reads: usize,
}

impl Memory for Counted<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.reads += 1;
        self.memory.read(address, buf)
    }

    /// One call, as a process's memory makes it.
    fn read_many(&mut self, reads: &mut [(u64, &mut [u8])]) -> usize {
        self.reads += 1;
        self.memory.read_many(reads)
    }
}

/// Samples in a batch: 100 ms of a thread sampled at 100 Hz.
const BATCH: u64 = 10;

/// The reads of a batch of samples of each capture, its names cached
/// (one earlier batch), through the store of recent reads as the agent
/// reads them: (frames named per sample, reads of the first sample, of
/// all).
fn batch_reads() -> Vec<(&'static str, usize, usize, usize)> {
    let mut figures = Vec::new();
    for capture in &CAPTURES {
        let loaded = load(capture);
        let layout = loaded.layout;
        let (ip, bp, sp, bytes) = stack_copy(capture, &loaded);
        let stack = StackCopy { sp, bytes: &bytes };
        let mut paged = Paged(&loaded.memory);
        let mut namer = V8Namer::new(layout);
        let mut recent = RecentReads::new();
        let mut memory = recent.for_sample(&mut paged, 0, 1);
        name_sample(&mut memory, &mut namer, &layout, stack, ip, bp);
        let mut counted = Counted {
            memory: &mut paged,
            reads: 0,
        };
        let mut first = 0;
        let mut named = 0;
        // Samples 10 ms apart, all handled at once after the last.
        let now = 1_000 + BATCH * 10;
        for sample in 0..BATCH {
            let mut memory = recent.for_sample(&mut counted, 1_000 + sample * 10, now);
            named += name_sample(&mut memory, &mut namer, &layout, stack, ip, bp);
            if sample == 0 {
                first = counted.reads;
            }
        }
        figures.push((capture.name, named / BATCH as usize, first, counted.reads));
    }
    figures
}

#[test]
#[ignore = "prints what a batch of samples reads"]
fn reads_of_a_batch() {
    for (name, frames, first, all) in batch_reads() {
        println!(
            "{name}: {frames} frames named per sample; {first} reads for the first sample of a batch, {all} for {BATCH}"
        );
    }
}

/// Reads a sample's frames cost at most when every block is read anew
/// (the first sample of a batch): a few calls reading the blocks of each
/// level of objects at once, and the blocks those left out. Without the
/// store of recent reads they took 250 to 380 reads, every sample; by
/// block without reading ahead, 42 to 49.
const MOST_FIRST_SAMPLE_READS: usize = 16;

#[test]
fn a_batch_of_samples_reads_each_block_once() {
    for (name, frames, first, all) in batch_reads() {
        assert!(frames >= 10, "{name}: {frames} frames named");
        assert!(
            first <= MOST_FIRST_SAMPLE_READS,
            "{name}: {first} reads for the first sample"
        );
        // The later samples, taken before those reads, read nothing anew
        // but what could not be read (a frame's slot pointing outside the
        // capture: one read each).
        assert!(all - first < BATCH as usize, "{name}: {first} then {all}");
    }
}
