//! Memory-mapped files of other processes (objects, debug files), and the
//! SIGBUS handler that keeps their truncation from killing firn.
//!
//! The process that owns a file may truncate it while firn has it mapped:
//! touching a page past the new end raises SIGBUS. Each mapping made
//! through [`MappedFile`] is registered (a fixed table of atomic ranges the
//! handler reads without locks); a SIGBUS inside a registered range gets a
//! page of zeros in place (the parsers see a malformed file and count it).
//! Any other SIGBUS, a bug of firn's own or one sent to it, takes the
//! default action and kills firn, as it would without the handler.

use std::{
    fs::File,
    io,
    ops::Deref,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
};

/// Mappings guarded at once. The process table keeps at most 4,096 objects
/// by default; each may be mapped by the unwinder and the symbolizer, and
/// some have debug files. Beyond this a mapping still works but is not
/// guarded (counted by [`unguarded_mappings`]).
const SLOTS: usize = 16_384;
/// A slot being filled; never a mapping's start (that is page-aligned).
const CLAIMED: usize = 1;

/// `[start, end)` of one registered mapping; `start` 0 when free.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
}

/// The registered mappings, read lock-free by the signal handler.
struct Ranges<const N: usize>([Slot; N]);

impl<const N: usize> Ranges<N> {
    const fn new() -> Self {
        Self(
            [const {
                Slot {
                    start: AtomicUsize::new(0),
                    end: AtomicUsize::new(0),
                }
            }; N],
        )
    }

    /// The slot now holding `[start, end)`, or `None` when all are taken.
    fn register(&self, start: usize, end: usize) -> Option<usize> {
        for (index, slot) in self.0.iter().enumerate() {
            if slot.start.load(Ordering::Relaxed) == 0
                && slot
                    .start
                    .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                slot.end.store(end, Ordering::Release);
                slot.start.store(start, Ordering::Release);
                return Some(index);
            }
        }
        None
    }

    fn unregister(&self, index: usize) {
        self.0[index].end.store(0, Ordering::Release);
        self.0[index].start.store(0, Ordering::Release);
    }

    /// Whether `address` lies in a registered range: atomics only, for the
    /// signal handler. The faulting thread holds the mapping it reads, so
    /// its range cannot be unregistered meanwhile.
    fn covers(&self, address: usize) -> bool {
        self.0.iter().any(|slot| {
            let start = slot.start.load(Ordering::Acquire);
            start > CLAIMED && start <= address && address < slot.end.load(Ordering::Acquire)
        })
    }
}

static RANGES: Ranges<SLOTS> = Ranges::new();
static UNGUARDED: AtomicU64 = AtomicU64::new(0);
/// Pages of mapped files found cut off.
static TRUNCATED_PAGES: AtomicU64 = AtomicU64::new(0);
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);

/// A read-only mapping of a whole file that another process controls,
/// registered with the SIGBUS handler while it lives.
pub struct MappedFile {
    map: memmap2::Mmap,
    slot: Option<usize>,
}

impl MappedFile {
    /// Maps `file` read-only and registers the mapping.
    pub fn map(file: &File) -> io::Result<Self> {
        // SAFETY: a read-only private mapping. The file may shrink
        // underneath; the pages past its end then fault with SIGBUS, which
        // the handler answers with zeros for registered mappings.
        let map = unsafe { memmap2::Mmap::map(file) }?;
        let slot = (!map.is_empty())
            .then(|| {
                let start = map.as_ptr() as usize;
                let page = PAGE_SIZE.load(Ordering::Relaxed);
                register(start, start + map.len().next_multiple_of(page))
            })
            .flatten();
        Ok(Self { map, slot })
    }

    /// Gives the mapping's pages back to the kernel; they are read from
    /// the file again when touched.
    pub fn release_pages(&self) {
        // SAFETY: a read-only private file mapping: dropping its pages
        // loses nothing.
        let _ = unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }
}

impl Deref for MappedFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for MappedFile {
    /// Unregisters before the mapping goes (the fields drop after this).
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            RANGES.unregister(slot);
        }
    }
}

fn register(start: usize, end: usize) -> Option<usize> {
    let slot = RANGES.register(start, end);
    if slot.is_none() {
        UNGUARDED.fetch_add(1, Ordering::Relaxed);
    }
    slot
}

/// Mappings made while every slot was taken: a truncation of one of them
/// would kill firn.
pub fn unguarded_mappings() -> u64 {
    UNGUARDED.load(Ordering::Relaxed)
}

/// Pages of mapped files replaced by zeros because their file shrank.
pub fn truncated_pages() -> u64 {
    TRUNCATED_PAGES.load(Ordering::Relaxed)
}

/// Installs the SIGBUS handler (once, at start).
pub fn guard_mapped_files() -> io::Result<()> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if let Ok(page) = usize::try_from(page)
        && page.is_power_of_two()
    {
        PAGE_SIZE.store(page, Ordering::Relaxed);
    }
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe
    // (atomics, mmap, signal and raise only).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let info = unsafe { &*info };
    // BUS_ADRERR: the page lies beyond the end of the mapped file.
    if info.si_code == libc::BUS_ADRERR {
        // SAFETY: si_addr is valid for SIGBUS.
        let address = unsafe { info.si_addr() } as usize;
        if RANGES.covers(address) {
            let page = PAGE_SIZE.load(Ordering::Relaxed);
            // SAFETY: replaces one page of firn's own read-only mapping of
            // a file with zeros; mmap is async-signal-safe.
            let mapped = unsafe {
                libc::mmap(
                    (address & !(page - 1)) as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if mapped != libc::MAP_FAILED {
                TRUNCATED_PAGES.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    // Anything else: the default action. Raised again here so that a
    // SIGBUS sent by another process kills too; one from a fault would
    // also on the faulting instruction's retry.
    // SAFETY: signal() and raise() are async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        libc::raise(libc::SIGBUS);
    }
}

#[cfg(test)]
mod tests;
