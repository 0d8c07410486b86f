//! The unwinder with its caches: CFI sources by object (bounded in bytes),
//! the rows looked up recently, and whether each object keeps frame
//! pointers. The caller says which object is mapped where
//! ([`ObjectLookup`]); objects are named by a key of the caller's choosing
//! (a build id, say), so copies of one binary share their entries.

use std::{collections::HashSet, fmt::Debug, hash::Hash, num::NonZeroUsize, sync::Arc};

use agent_cache::ByteBoundedCache;
use agent_common::UserRegs;
use agent_elf::Bytes;
use foldhash::fast::RandomState;
use lru::LruCache;
use tracing::debug;

use crate::{
    MAX_USER_FRAMES,
    cfi::{CfiContext, CfiSource, UnwindRow},
    dwarf::{Code, CodeLookup, ForeignFrame, ForeignStep, Outcome, StackCopy, Stop, unwind},
    leaf::{LeafRepair, repair_leaf, stitch},
    recent::RecentRows,
    survey::{ObjectFrames, is_go, survey},
};

/// Memory for rows looked up recently, by object and address: stacks
/// repeat the same return addresses, so most lookups never reach the CFI.
const ROW_CACHE_BYTES: usize = 4 << 20;

/// Objects whose frame-pointer verdict is remembered.
const VERDICT_CACHE_ENTRIES: usize = 4_096;

/// What a CFI source costs beyond its own heap: the cache entry and the
/// parsed section headers.
const SOURCE_OVERHEAD_BYTES: usize = 512;

/// What the caller knows about the code at an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mapped<K> {
    /// Outside every mapping the caller knows of.
    Unmapped,
    /// Mapped, but with no object to read CFI from: JIT code, an object
    /// that could not be opened, an address outside its load segments.
    NoObject,
    /// In the object named `key`, at link-time address `vaddr`. `system`:
    /// the object is a system library, which the frame-pointer check
    /// leaves out.
    Object { key: K, vaddr: u64, system: bool },
}

/// The mapped objects of one process, as the unwinder asks about them.
pub trait ObjectLookup {
    /// Names an object in the caches.
    type Key: Clone + Eq + Hash + Debug;

    fn object(&mut self, address: u64) -> Mapped<Self::Key>;

    /// The bytes of the object mapped at `address`; asked only when its
    /// CFI is not cached.
    fn bytes(&mut self, address: u64) -> Option<Bytes>;

    /// A runtime's unwind of a frame in its JIT code
    /// ([`CodeLookup::foreign`]).
    fn foreign(&mut self, _frame: ForeignFrame, _stack: StackCopy<'_>) -> Option<ForeignStep> {
        None
    }
}

/// A sample's user side: its registers, the copy of its stack from `sp`
/// up, and the kernel's frame-pointer walk (interrupted instruction first).
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    pub regs: UserRegs,
    pub stack: &'a [u8],
    pub walk: &'a [u64],
}

/// A sample's user frames, innermost first (the interrupted instruction,
/// then return addresses), and what the unwind saw on the way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwound {
    pub frames: Vec<u64>,
    /// How the DWARF unwind went, whichever frames were kept.
    pub outcome: Outcome,
    /// The DWARF unwind stopped short and the walk continued it.
    pub stitched: bool,
    /// Frame pointers only: what became of the leaf's caller. `Repaired`
    /// when the kept frames differ from the walk's first two; `None` when
    /// there was nothing to repair (no walk or no copy).
    pub leaf: Option<LeafRepair>,
}

/// How the CFI caches fared since the unwinder was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Rows found in the row cache.
    pub hits: u64,
    /// Rows looked up in an object's CFI.
    pub misses: u64,
    /// Rows and CFI sources let go to stay within the bounds.
    pub evictions: u64,
}

impl CacheCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: CacheCounts) -> CacheCounts {
        CacheCounts {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            evictions: self.evictions.saturating_sub(earlier.evictions),
        }
    }
}

/// CFI sources by object (bounded in bytes) and a bounded row cache.
struct CfiCache<K: Hash + Eq> {
    sources: ByteBoundedCache<K, Arc<CfiSource<Bytes>>>,
    rows: LruCache<(K, u64), Option<UnwindRow>, RandomState>,
    /// The last rows found, in front of `rows`.
    recent: RecentRows<K>,
    context: Box<CfiContext>,
    counts: CacheCounts,
    /// Sources a row was read from since their pages were last released:
    /// only these have pages to give back (releasing a big object's whole
    /// mapping walks its page tables even when nothing is resident).
    read_since_release: HashSet<K, RandomState>,
}

impl<K: Clone + Eq + Hash + Debug> CfiCache<K> {
    fn new(max_bytes: usize) -> Self {
        // What one cached row costs: its key and value, the LRU's two
        // links and hash slot (a key pointer and a node pointer, at most
        // half the buckets used), and the allocator's header and rounding.
        let entry_bytes = size_of::<(K, u64)>()
            + size_of::<Option<UnwindRow>>()
            + 2 * size_of::<usize>()
            + 2 * 2 * size_of::<usize>()
            + 16;
        Self {
            sources: ByteBoundedCache::new(max_bytes),
            rows: LruCache::with_hasher(
                entries(ROW_CACHE_BYTES / entry_bytes),
                RandomState::default(),
            ),
            recent: RecentRows::new(),
            context: Box::new(CfiContext::new()),
            counts: CacheCounts::default(),
            read_since_release: HashSet::default(),
        }
    }

    /// The unwind rules at `vaddr` of the object `key`.
    fn row(
        &mut self,
        key: K,
        vaddr: u64,
        bytes: impl FnOnce() -> Option<Bytes>,
    ) -> Option<UnwindRow> {
        if let Some(row) = self.recent.get(&key, vaddr) {
            self.counts.hits += 1;
            return row;
        }
        let slot = (key, vaddr);
        if let Some(&row) = self.rows.get(&slot) {
            self.counts.hits += 1;
            self.recent.put(&slot.0, vaddr, row);
            return row;
        }
        self.counts.misses += 1;
        if !self.read_since_release.contains(&slot.0) {
            self.read_since_release.insert(slot.0.clone());
        }
        let row = self
            .source(&slot.0, bytes)
            .and_then(|source| source.row(vaddr, &mut self.context));
        self.recent.put(&slot.0, vaddr, row);
        // `push` hands back the least recently used row it let go.
        if self.rows.push(slot, row).is_some() {
            self.counts.evictions += 1;
        }
        row
    }

    fn source(
        &mut self,
        key: &K,
        bytes: impl FnOnce() -> Option<Bytes>,
    ) -> Option<Arc<CfiSource<Bytes>>> {
        if let Some(source) = self.sources.get(key) {
            return Some(source.clone());
        }
        let source = match CfiSource::new(bytes()?) {
            Ok(source) => Arc::new(source),
            Err(error) => {
                debug!(?key, %error, "no usable CFI");
                return None;
            }
        };
        // Indexing it (and the survey that may follow) read its pages.
        self.read_since_release.insert(key.clone());
        let cost = source.heap_bytes() + SOURCE_OVERHEAD_BYTES;
        let evicted = self.sources.insert(key.clone(), source.clone(), cost);
        self.counts.evictions += evicted as u64;
        Some(source)
    }
}

fn entries(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

/// The process's code, with rows through the caches.
struct CachedCode<'a, L: ObjectLookup> {
    objects: &'a mut L,
    cfi: &'a mut CfiCache<L::Key>,
}

impl<L: ObjectLookup> CodeLookup for CachedCode<'_, L> {
    fn code(&mut self, address: u64) -> Code {
        let (key, vaddr, system) = match self.objects.object(address) {
            Mapped::Unmapped => return Code::Unmapped,
            Mapped::NoObject => return Code::NoCfi,
            Mapped::Object { key, vaddr, system } => (key, vaddr, system),
        };
        let objects = &mut *self.objects;
        match self.cfi.row(key, vaddr, || objects.bytes(address)) {
            Some(row) => Code::Row { row, system },
            None => Code::NoCfi,
        }
    }

    fn foreign(&mut self, frame: ForeignFrame, stack: StackCopy<'_>) -> Option<ForeignStep> {
        self.objects.foreign(frame, stack)
    }
}

/// Unwinds samples; owns the CFI caches.
pub struct Unwinder<K: Hash + Eq> {
    cfi: CfiCache<K>,
    verdicts: LruCache<K, ObjectFrames, RandomState>,
}

impl<K: Clone + Eq + Hash + Debug> Unwinder<K> {
    /// `max_bytes`: the CFI sources' budget (their indexes and inflated
    /// `.debug_frame`s; the objects' own bytes are the caller's).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            cfi: CfiCache::new(max_bytes),
            verdicts: LruCache::with_hasher(entries(VERDICT_CACHE_ENTRIES), RandomState::default()),
        }
    }

    /// Lets the object pages unwinding touched (CFI sections, an index
    /// built over `.eh_frame`) leave the caller's RSS; the rows that matter
    /// are cached. Only the sources read since the last call are released.
    pub fn release_pages(&mut self) {
        let cfi = &mut self.cfi;
        for key in cfi.read_since_release.drain() {
            if let Some(source) = cfi.sources.peek(&key) {
                source.release_pages();
            }
        }
    }

    /// The caches' counts since the unwinder was made.
    pub fn cache_counts(&self) -> CacheCounts {
        self.cfi.counts
    }

    /// Unwinds a sample whose whole stack was copied: the DWARF unwind,
    /// continued by the walk if it stopped short where the two meet.
    pub fn dwarf(
        &mut self,
        sample: Sample<'_>,
        objects: &mut impl ObjectLookup<Key = K>,
    ) -> Unwound {
        let mut frames = Vec::with_capacity(32);
        let mut code = CachedCode {
            objects,
            cfi: &mut self.cfi,
        };
        let stack = StackCopy {
            sp: sample.regs.sp,
            bytes: sample.stack,
        };
        let outcome = unwind(sample.regs, stack, &mut code, MAX_USER_FRAMES, &mut frames);
        let stitched = outcome.stop != Stop::Complete && stitch(&mut frames, sample.walk);
        Unwound {
            frames,
            outcome,
            stitched,
            leaf: None,
        }
    }

    /// Unwinds a sample of a process left to frame pointers: the DWARF
    /// unwind of the small copy where it meets the walk, else the walk
    /// with the leaf's caller recovered.
    pub fn frame_pointers(
        &mut self,
        sample: Sample<'_>,
        objects: &mut impl ObjectLookup<Key = K>,
    ) -> Unwound {
        let mut unwound = self.dwarf(sample, objects);
        if unwound.outcome.stop == Stop::Complete || unwound.stitched {
            let changed = unwound.frames.get(..2) != sample.walk.get(..2);
            unwound.leaf = Some(if changed {
                LeafRepair::Repaired
            } else {
                LeafRepair::NotNeeded
            });
            return unwound;
        }
        // The unwind and the walk do not meet: the walk, leaf repaired.
        unwound.frames.clear();
        unwound.frames.extend_from_slice(sample.walk);
        if !unwound.frames.is_empty() && !sample.stack.is_empty() {
            let UserRegs { ip, sp, bp } = sample.regs;
            let repair = self
                .leaf_row(ip, objects)
                .map_or(LeafRepair::Unavailable, |row| {
                    repair_leaf(&mut unwound.frames, &row, (ip, sp, bp), sample.stack)
                });
            unwound.leaf = Some(repair);
        }
        unwound
    }

    fn leaf_row(&mut self, ip: u64, objects: &mut impl ObjectLookup<Key = K>) -> Option<UnwindRow> {
        let Mapped::Object { key, vaddr, .. } = objects.object(ip) else {
            return None;
        };
        self.cfi.row(key, vaddr, || objects.bytes(ip))
    }

    /// Whether the object `key` (whose bytes `bytes` reads) keeps frame
    /// pointers; looked at once per object, with bounded work (`survey`).
    pub fn object_frames(
        &mut self,
        key: &K,
        bytes: impl FnOnce() -> Option<Bytes>,
    ) -> ObjectFrames {
        if let Some(&verdict) = self.verdicts.get(key) {
            return verdict;
        }
        let data = bytes();
        // Go first: its CFI need not be read (or decompressed) to judge.
        let verdict = if data.as_deref().is_some_and(is_go) {
            ObjectFrames::FramePointers
        } else {
            match self.cfi.source(key, || data) {
                Some(source) => survey(&source, &mut self.cfi.context).verdict(),
                None => ObjectFrames::Unknown,
            }
        };
        debug!(?key, ?verdict, "frame pointers");
        self.verdicts.put(key.clone(), verdict);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FixtureCode;

    /// The captured process's objects: `chain_inline` under one key, the
    /// rest mapped without an object.
    struct FixtureObjects {
        code: FixtureCode,
        reads: usize,
        bytes: Bytes,
    }

    impl ObjectLookup for FixtureObjects {
        type Key = &'static str;

        fn object(&mut self, address: u64) -> Mapped<&'static str> {
            match self.code.vaddr(address) {
                Some(vaddr) => Mapped::Object {
                    key: "chain_inline",
                    vaddr,
                    system: false,
                },
                None if self.code.is_mapped(address) => Mapped::NoObject,
                None => Mapped::Unmapped,
            }
        }

        fn bytes(&mut self, _address: u64) -> Option<Bytes> {
            self.reads += 1;
            Some(self.bytes.clone())
        }
    }

    fn fixture() -> (FixtureObjects, crate::testing::Capture) {
        let capture = crate::testing::Capture::chain_inline();
        let objects = FixtureObjects {
            code: FixtureCode::chain_inline().expect("the fixture parses"),
            reads: 0,
            bytes: Bytes::from_static(agent_fixtures::CHAIN_INLINE),
        };
        (objects, capture)
    }

    #[test]
    fn cached_rows_unwind_as_the_cfi_does() {
        let (mut objects, capture) = fixture();
        let mut expected = Vec::new();
        let stack = StackCopy {
            sp: capture.regs.sp,
            bytes: capture.stack,
        };
        let mut code = FixtureCode::chain_inline().expect("parses");
        let outcome = unwind(
            capture.regs,
            stack,
            &mut code,
            MAX_USER_FRAMES,
            &mut expected,
        );

        let mut unwinder = Unwinder::new(1 << 20);
        let sample = Sample {
            regs: capture.regs,
            stack: capture.stack,
            walk: &[],
        };
        let cold = unwinder.dwarf(sample, &mut objects);
        assert_eq!((&cold.frames, cold.outcome), (&expected, outcome));
        let counts = unwinder.cache_counts();
        assert_eq!(counts.hits, 0);
        assert_eq!(objects.reads, 1, "the object is read once");

        let warm = unwinder.dwarf(sample, &mut objects);
        assert_eq!(warm, cold);
        let since = unwinder.cache_counts().since(counts);
        assert_eq!((since.hits, since.misses), (counts.misses, 0));
    }

    /// The fixture's bytes, counting how often their pages are released.
    struct Counted {
        releases: std::sync::atomic::AtomicUsize,
    }

    impl AsRef<[u8]> for Counted {
        fn as_ref(&self) -> &[u8] {
            agent_fixtures::CHAIN_INLINE
        }
    }

    impl agent_elf::SharedBytes for Counted {
        fn release_pages(&self) {
            self.releases
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn only_objects_read_since_are_released() {
        let (mut objects, capture) = fixture();
        let counted = Arc::new(Counted {
            releases: std::sync::atomic::AtomicUsize::new(0),
        });
        let releases = || counted.releases.load(std::sync::atomic::Ordering::Relaxed);
        let mut unwinder = Unwinder::new(1 << 20);
        let sample = Sample {
            regs: capture.regs,
            stack: capture.stack,
            walk: &[],
        };
        objects.bytes = Bytes::new(counted.clone());
        unwinder.dwarf(sample, &mut objects);
        unwinder.release_pages();
        assert_eq!(releases(), 1, "read since: released");
        // Every row from the cache: the object's CFI was not read again.
        unwinder.dwarf(sample, &mut objects);
        unwinder.release_pages();
        assert_eq!(releases(), 1, "nothing read since: left alone");
    }

    #[test]
    fn a_walk_that_is_not_met_gets_its_leaf_repaired() {
        let (mut objects, capture) = fixture();
        let mut unwinder = Unwinder::new(1 << 20);
        // The walk skipped burn_leaf's caller and holds nothing the unwind
        // reaches.
        let walk = [capture.regs.ip, 0x10, 0x20];
        let sample = Sample {
            regs: capture.regs,
            stack: &capture.stack[..1024],
            walk: &walk,
        };
        let unwound = unwinder.frame_pointers(sample, &mut objects);
        assert_eq!(unwound.outcome.stop, Stop::Truncated);
        assert_eq!(unwound.leaf, Some(LeafRepair::Repaired));
        assert_eq!(unwound.frames.len(), 4);
        assert_eq!(unwound.frames[2..], [0x10, 0x20]);

        // No copy: the unwind holds the interrupted instruction alone, which
        // the walk continues.
        let bare = Sample {
            stack: &[],
            ..sample
        };
        let unwound = unwinder.frame_pointers(bare, &mut objects);
        assert!(unwound.stitched);
        assert_eq!(unwound.frames, walk);
        assert_eq!(unwound.leaf, Some(LeafRepair::NotNeeded));
        // A walk from elsewhere and no copy: nothing to repair with.
        let elsewhere = [0x99, 0x10];
        let unwound = unwinder.frame_pointers(
            Sample {
                walk: &elsewhere,
                ..bare
            },
            &mut objects,
        );
        assert_eq!(
            (unwound.frames.as_slice(), unwound.leaf),
            (&elsewhere[..], None)
        );
    }

    #[test]
    fn verdicts_are_taken_once_per_object() {
        let mut unwinder = Unwinder::new(1 << 20);
        let mut reads = 0;
        for _ in 0..3 {
            let verdict = unwinder.object_frames(&"chain", || {
                reads += 1;
                Some(Bytes::from_static(agent_fixtures::CHAIN))
            });
            assert_eq!(verdict, ObjectFrames::FramePointers);
        }
        assert_eq!(reads, 1);
        let verdict = unwinder.object_frames(&"chain_inline", || {
            Some(Bytes::from_static(agent_fixtures::CHAIN_INLINE))
        });
        assert_eq!(verdict, ObjectFrames::NoFramePointers);
        assert_eq!(
            unwinder.object_frames(&"gone", || None),
            ObjectFrames::Unknown
        );
    }
}
