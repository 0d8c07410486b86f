//! The code cache: which code blob holds a pc, and what kind it is.
//!
//! HotSpot allocates code in code heaps (one, or three with segmented code
//! cache: non-methods, profiled, non-profiled), each with a segment map: a
//! byte per segment (64 or 128 bytes of code) that is 0xFF for a free
//! segment, 0 for the first of a block and otherwise how many segments to
//! hop back towards the block's first. A block is a `HeapBlock` header
//! followed by the `CodeBlob`.

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
    ops::Range,
    sync::Arc,
};

use super::{
    HotSpotError, invalid,
    layout::{CodeBounds, DebugPlacement, Layout},
    read::{c_string, field, field_i32, field_u64, i32_at, read, u64_at},
};
use crate::Memory;

mod check;

/// Most code heaps believed (HotSpot has at most 3).
const MAX_HEAPS: usize = 8;

/// Most hops through a segment map (a block of 8 MiB of 128-byte segments
/// takes 260).
const MAX_HOPS: usize = 4096;

/// Longest blob name read.
const MAX_BLOB_NAME: usize = 96;

/// Largest blob believed (the code cache is at most 2 GiB; one blob of
/// more than 64 MiB is corruption).
const MAX_BLOB_SIZE: u64 = 64 << 20;

/// Blob names remembered.
const MAX_NAMES: usize = 256;

/// Blobs remembered where they were found, to be checked again by their
/// header alone.
const MAX_FOUND: usize = 1024;

/// A segment map byte for a free segment.
const FREE_SEGMENT: u8 = 0xff;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Heap {
    /// All the heap may hold (reserved): it commits more as it fills.
    code: Range<u64>,
    /// Its committed end when firn read it, for the walk of its blocks.
    committed: u64,
    segmap: u64,
    log2_segment_size: u32,
}

/// What kind of code a blob holds, as far as unwinding and naming care.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// The template interpreter: frames of interpreted methods, rbp-based.
    Interpreter,
    /// A Java method compiled by C1 (tiers 1 to 3) or C2 (tier 4).
    Compiled { tier: u8 },
    /// The wrapper compiled for a `native` Java method.
    Native,
    /// Generated code without a Java method: stubs, adapters, the call stub.
    Stub,
}

/// A code blob, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeBlob {
    pub start: u64,
    pub end: u64,
    pub code: Range<u64>,
    pub kind: BlobKind,
    /// The blob's name: `nmethod`, `Interpreter`, a stub's.
    pub name: Arc<str>,
    /// Frame size in bytes, return address and saved rbp included; 0 for
    /// blobs whose frames are rbp-based or that have none.
    pub frame_size: u64,
    /// From this pc on the frame is built; before it, the frame is not.
    pub frame_complete: Option<u64>,
    /// The compiled `Method*` (nmethods).
    pub method: u64,
    /// The compilation's id (nmethods): an nmethod freed and another
    /// compiled at the same place has another.
    pub compile_id: i32,
    /// Where the `PcDesc`s, scopes data and metadata are (nmethods): in
    /// the blob up to JDK 22, on the C heap from JDK 25 (the scopes data
    /// may run past its end there, to the end of the immutable data).
    pub pcs: Range<u64>,
    pub scopes_data: Range<u64>,
    pub metadata: Range<u64>,
}

/// The code heaps of one JVM.
#[derive(Clone, Debug)]
pub struct CodeCache {
    heaps: Vec<Heap>,
    /// Bounds of all heaps, as the JVM reserved them.
    bounds: Range<u64>,
    interpreter: Range<u64>,
    pub call_stub_return: u64,
    /// Bytes of a blob's header read: enough for every field read.
    header_bytes: usize,
    /// Blob names by address: they point at a few static strings of
    /// libjvm (`nmethod`, the stubs'), not worth a read per frame.
    names: RefCell<HashMap<u64, Arc<str>>>,
    /// Blobs found, by start: the next lookup of a pc in one reads its
    /// header again instead of walking the segment map, and believes it
    /// only if the header still says the same (a blob freed and another
    /// compiled there has another compile id, a free block is not used).
    /// Each with when it was last read (the caller's clock, 0: unknown): a
    /// sample taken before that read needs no other.
    found: RefCell<BTreeMap<u64, (CodeBlob, u64)>>,
    counts: std::cell::Cell<BlobCounts>,
}

/// How the lookups of blobs fared: `hits` were checked by their header
/// alone, `misses` walked the segment map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlobCounts {
    pub hits: u64,
    pub misses: u64,
}

impl CodeCache {
    /// Reads the heaps' bounds and segment maps' places.
    pub fn read(memory: &mut dyn Memory, layout: &Layout) -> Result<Self, HotSpotError> {
        let array = u64_at(memory, layout.code_heaps)?;
        if array == 0 {
            return Err(invalid("CodeCache::_heaps", layout.code_heaps, "null"));
        }
        let count = i32_at(memory, array.wrapping_add(layout.growable_array_len))?;
        let count = usize::try_from(count)
            .ok()
            .filter(|&count| (1..=MAX_HEAPS).contains(&count))
            .ok_or_else(|| invalid("the code heaps", array, "an implausible count"))?;
        let data = u64_at(memory, array.wrapping_add(layout.growable_array_data))?;
        let mut heaps = Vec::with_capacity(count);
        for index in 0..count as u64 {
            let heap = u64_at(memory, data.wrapping_add(index * 8))?;
            heaps.push(read_heap(memory, layout, heap)?);
        }
        let bounds =
            u64_at(memory, layout.code_low_bound)?..u64_at(memory, layout.code_high_bound)?;
        let queue = u64_at(memory, layout.interpreter_code)?;
        let interpreter = if queue == 0 {
            0..0
        } else {
            let buffer = u64_at(memory, queue.wrapping_add(layout.stub_queue_buffer))?;
            let limit = i32_at(memory, queue.wrapping_add(layout.stub_queue_limit))?;
            buffer..buffer.wrapping_add(limit.max(0) as u64)
        };
        let call_stub_return = u64_at(memory, layout.call_stub_return_address)?;
        let nmethod = &layout.nmethod;
        let mut last = [
            layout.code_blob_name,
            layout.code_blob_size,
            layout.code_blob_frame_size,
            layout.code_blob_frame_complete.0,
            layout.code_blob_kind.map_or(0, |(at, _)| at),
            nmethod.method,
            nmethod.comp_level.0,
            nmethod.compile_id,
        ]
        .into_iter()
        .chain(nmethod.debug.offsets())
        .max()
        .unwrap_or(0);
        match layout.code_bounds {
            CodeBounds::Addresses { begin, end } => last = last.max(begin).max(end),
            CodeBounds::Offsets { code, data } => last = last.max(code).max(data),
        }
        Ok(Self {
            heaps,
            bounds,
            interpreter,
            call_stub_return,
            header_bytes: last as usize + 8,
            names: RefCell::new(HashMap::new()),
            found: RefCell::new(BTreeMap::new()),
            counts: Default::default(),
        })
    }

    /// Whether `pc` is in the code cache at all (cheap, no reads).
    pub fn contains(&self, pc: u64) -> bool {
        self.bounds.contains(&pc) || self.interpreter.contains(&pc)
    }

    /// The template interpreter's first byte.
    pub fn interpreter_start(&self) -> u64 {
        self.interpreter.start
    }

    /// Whether `pc` is in the template interpreter.
    pub fn is_interpreter(&self, pc: u64) -> bool {
        self.interpreter.contains(&pc)
    }

    /// The name at `address`, read once.
    fn name(&self, memory: &mut dyn Memory, address: u64) -> Result<Arc<str>, HotSpotError> {
        if let Some(name) = self.names.borrow().get(&address) {
            return Ok(name.clone());
        }
        let name: Arc<str> = c_string(memory, address, MAX_BLOB_NAME)?.into();
        let mut names = self.names.borrow_mut();
        if names.len() >= MAX_NAMES {
            names.clear();
        }
        names.insert(address, name.clone());
        Ok(name)
    }

    /// The start of every blob in use, heap by heap in address order (for
    /// tools and tests: it reads a header per block).
    pub fn blobs(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
    ) -> Result<Vec<u64>, HotSpotError> {
        let mut blobs = Vec::new();
        let (length_at, length_width) = layout.heap_block_length;
        for heap in &self.heaps {
            let mut block = heap.code.start;
            while block < heap.committed {
                let mut header = [0u8; 16];
                read(memory, block, &mut header)?;
                let segments = field(&header, length_at, length_width);
                if segments == 0 {
                    // The committed part ends before the heap's.
                    break;
                }
                if header[layout.heap_block_used as usize % 16] != 0 {
                    blobs.push(block + layout.heap_block_size);
                }
                block = block.saturating_add(segments << heap.log2_segment_size);
            }
        }
        Ok(blobs)
    }

    /// How the lookups fared since the last call.
    pub fn take_counts(&self) -> BlobCounts {
        self.counts.take()
    }

    /// The blob holding `pc`: `Ok(None)` when `pc` is in no heap or in a
    /// free block.
    pub fn find(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        pc: u64,
    ) -> Result<Option<CodeBlob>, HotSpotError> {
        self.find_at(memory, layout, pc, 0)
    }

    /// [`Self::find`], its reads made at or after `now` (the caller's
    /// monotonic clock), which the blob is remembered as read at.
    pub fn find_at(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        pc: u64,
        now: u64,
    ) -> Result<Option<CodeBlob>, HotSpotError> {
        let Some(heap) = self.heaps.iter().find(|heap| heap.code.contains(&pc)) else {
            return Ok(None);
        };
        if let Some(blob) = self.found_again(memory, layout, pc, now) {
            let mut counts = self.counts.get();
            counts.hits += 1;
            self.counts.set(counts);
            return Ok(Some(blob));
        }
        let mut counts = self.counts.get();
        counts.misses += 1;
        self.counts.set(counts);
        let Some(block) = block_start(memory, heap, pc)? else {
            return Ok(None);
        };
        let blob = self.read_blob(memory, layout, block, pc)?;
        if let Some(blob) = &blob {
            let mut found = self.found.borrow_mut();
            if found.len() >= MAX_FOUND {
                found.clear();
            }
            found.insert(blob.start, (blob.clone(), now));
        }
        Ok(blob)
    }

    /// The blob remembered around `pc`, if its header read again says the
    /// same as when it was found; forgotten if not.
    fn found_again(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        pc: u64,
        now: u64,
    ) -> Option<CodeBlob> {
        let start = {
            let found = self.found.borrow();
            let (&start, (blob, _)) = found.range(..=pc).next_back()?;
            if pc >= blob.end {
                return None;
            }
            start
        };
        let block = start.wrapping_sub(layout.heap_block_size);
        let again = self.read_blob(memory, layout, block, pc).ok().flatten();
        let mut found = self.found.borrow_mut();
        match (again, found.get_mut(&start)) {
            (Some(blob), Some((known, read_at))) if *known == blob => {
                *read_at = now;
                Some(blob)
            }
            _ => {
                found.remove(&start);
                None
            }
        }
    }

    /// The blob remembered around `pc`, not read again: its header is to
    /// be checked ([`Self::check`]) before what was made of it is
    /// believed.
    pub fn remembered(&self, pc: u64) -> Option<CodeBlob> {
        let found = self.found.borrow();
        let (_, (blob, _)) = found.range(..=pc).next_back()?;
        let same_kind = (blob.kind == BlobKind::Interpreter) == self.is_interpreter(pc);
        (pc < blob.end && same_kind).then(|| blob.clone())
    }

    /// The blob whose block starts at `block`, read and checked; `None`
    /// when the block is free or ends before `pc`.
    fn read_blob(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        block: u64,
        pc: u64,
    ) -> Result<Option<CodeBlob>, HotSpotError> {
        // The block's header and the blob's, in one read.
        let skip = layout.heap_block_size as usize;
        let mut both = vec![0; skip + self.header_bytes];
        read(memory, block, &mut both)?;
        self.parse_blob(memory, layout, block, &both, pc)
    }

    /// The blob whose block (its header and the blob's, `both`) starts at
    /// `block`; `None` when the block is free or ends before `pc`.
    fn parse_blob(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        block: u64,
        both: &[u8],
        pc: u64,
    ) -> Result<Option<CodeBlob>, HotSpotError> {
        let skip = layout.heap_block_size as usize;
        if field(both, layout.heap_block_used, 1) == 0 {
            return Ok(None);
        }
        let start = block + layout.heap_block_size;
        let header = both.get(skip..).unwrap_or_default();
        let size = field_i32(header, layout.code_blob_size);
        let size = u64::try_from(size)
            .ok()
            .filter(|&size| size >= layout.code_blob_header && size <= MAX_BLOB_SIZE)
            .ok_or_else(|| invalid("a code blob", start, "an implausible size"))?;
        let end = start + size;
        if pc >= end {
            return Ok(None);
        }
        let code = match layout.code_bounds {
            CodeBounds::Addresses { begin, end } => {
                field_u64(header, begin)..field_u64(header, end)
            }
            CodeBounds::Offsets { code, data } => {
                start.wrapping_add(field_i32(header, code) as u64)
                    ..start.wrapping_add(field_i32(header, data) as u64)
            }
        };
        if code.start < start || code.end > end || code.start > code.end {
            return Err(invalid("a code blob", start, "code outside the blob"));
        }
        // Blobs without frames of their own (buffer blobs) say -1.
        let frame_words = field_i32(header, layout.code_blob_frame_size).max(0);
        if frame_words > 1 << 16 {
            return Err(invalid("a code blob", start, "an implausible frame size"));
        }
        let (complete_at, complete_width) = layout.code_blob_frame_complete;
        let complete = field(header, complete_at, complete_width);
        let complete = match complete_width {
            2 => i64::from(complete as u16 as i16),
            _ => i64::from(complete as u32 as i32),
        };
        let name = self.name(memory, field_u64(header, layout.code_blob_name))?;
        let mut blob = CodeBlob {
            start,
            end,
            code: code.clone(),
            kind: BlobKind::Stub,
            name,
            frame_size: frame_words as u64 * 8,
            frame_complete: u64::try_from(complete)
                .ok()
                .map(|offset| code.start.wrapping_add(offset)),
            method: 0,
            compile_id: 0,
            pcs: 0..0,
            scopes_data: 0..0,
            metadata: 0..0,
        };
        let is_nmethod = match layout.code_blob_kind {
            Some((at, nmethod)) => field(header, at, 1) == nmethod,
            None => blob.name.contains("nmethod"),
        };
        if self.is_interpreter(pc) {
            blob.kind = BlobKind::Interpreter;
        } else if is_nmethod {
            nmethod_fields(&mut blob, header, layout)?;
        }
        Ok(Some(blob))
    }
}

/// A `CodeHeap`: its bounds and segment map.
fn read_heap(memory: &mut dyn Memory, layout: &Layout, heap: u64) -> Result<Heap, HotSpotError> {
    let mut word = |offset: u64| u64_at(memory, heap.wrapping_add(offset));
    let low = word(layout.code_heap_memory + layout.virtual_space_low)?;
    let high = word(layout.code_heap_memory + layout.virtual_space_high)?;
    let reserved = word(layout.code_heap_memory + layout.virtual_space_high_boundary)?;
    let segmap = word(layout.code_heap_segmap + layout.virtual_space_low)?;
    let log2 = i32_at(
        memory,
        heap.wrapping_add(layout.code_heap_log2_segment_size),
    )?;
    if low >= high || high > reserved || !(4..=16).contains(&log2) || segmap == 0 {
        return Err(invalid("a code heap", heap, "implausible bounds"));
    }
    Ok(Heap {
        code: low..reserved,
        committed: high,
        segmap,
        log2_segment_size: log2 as u32,
    })
}

/// What an nmethod's header says of its method and debug information.
fn nmethod_fields(blob: &mut CodeBlob, header: &[u8], layout: &Layout) -> Result<(), HotSpotError> {
    let nmethod = &layout.nmethod;
    let start = blob.start;
    let offset = |base: u64, at: u64| base.wrapping_add(field_i32(header, at) as u64);
    blob.method = field_u64(header, nmethod.method);
    blob.compile_id = field_i32(header, nmethod.compile_id);
    match nmethod.debug {
        DebugPlacement::InBlob {
            scopes_data_begin,
            scopes_pcs_offset,
            dependencies_offset,
            metadata_offset,
        } => {
            blob.pcs = offset(start, scopes_pcs_offset)..offset(start, dependencies_offset);
            blob.scopes_data = field_u64(header, scopes_data_begin)..blob.pcs.start;
            blob.metadata = offset(start, metadata_offset)..blob.scopes_data.start;
            if blob.pcs.end > blob.end || blob.metadata.start < start {
                return Err(invalid("an nmethod", start, "debug information outside it"));
            }
        }
        DebugPlacement::Separate {
            immutable_data,
            immutable_data_size,
            scopes_pcs_offset,
            scopes_data_offset,
            mutable_data,
            mutable_data_size,
            relocation_size,
        } => {
            let immutable = field_u64(header, immutable_data);
            blob.pcs = offset(immutable, scopes_pcs_offset)..offset(immutable, scopes_data_offset);
            blob.scopes_data = blob.pcs.end..offset(immutable, immutable_data_size);
            let mutable = field_u64(header, mutable_data);
            blob.metadata = offset(mutable, relocation_size)..offset(mutable, mutable_data_size);
        }
    }
    let (tier_at, tier_width) = nmethod.comp_level;
    let tier = match tier_width {
        1 => i64::from(field(header, tier_at, 1) as u8 as i8),
        _ => i64::from(field_i32(header, tier_at)),
    };
    blob.kind = if blob.name.starts_with("native") || tier == 0 {
        BlobKind::Native
    } else {
        BlobKind::Compiled {
            tier: tier.clamp(0, 4) as u8,
        }
    };
    let ordered = |range: &Range<u64>| range.start <= range.end;
    if blob.method == 0
        || !(ordered(&blob.pcs) && ordered(&blob.scopes_data) && ordered(&blob.metadata))
    {
        return Err(invalid(
            "an nmethod",
            start,
            "implausible debug information",
        ));
    }
    Ok(())
}

/// The block holding `pc`, by its segment map; `None` if its segment is
/// free. The map is read in windows ending at the segment looked at, so a
/// hop back usually lands in bytes already read.
fn block_start(memory: &mut dyn Memory, heap: &Heap, pc: u64) -> Result<Option<u64>, HotSpotError> {
    const WINDOW: u64 = 512;
    let mut segment = (pc - heap.code.start) >> heap.log2_segment_size;
    let mut window = [0u8; WINDOW as usize];
    // The segments `window` holds: `first..=last`.
    let mut first = u64::MAX;
    let mut last = 0;
    for _ in 0..MAX_HOPS {
        if segment < first || segment > last {
            first = segment.saturating_sub(WINDOW - 1);
            last = segment;
            let length = (last - first + 1) as usize;
            read(
                memory,
                heap.segmap.wrapping_add(first),
                &mut window[..length],
            )?;
        }
        match window[(segment - first) as usize] {
            FREE_SEGMENT => return Ok(None),
            0 => return Ok(Some(heap.code.start + (segment << heap.log2_segment_size))),
            hop => {
                segment = segment
                    .checked_sub(u64::from(hop))
                    .ok_or_else(|| invalid("a segment map", heap.segmap, "hops before the heap"))?;
            }
        }
    }
    Err(invalid("a segment map", heap.segmap, "too many hops"))
}
