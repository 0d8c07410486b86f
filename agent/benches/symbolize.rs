//! First-sample cost of symbolizing a large object with full DWARF: time,
//! heap and peak RSS for the first address (context built, one unit
//! parsed), then for many more addresses spread over the object, and the
//! cache's estimate of what it holds against the heap really used.
//!
//! `cargo bench -p firn --bench symbolize -- [OBJECT]` (default: firn's own
//! debug build, `cargo build -p firn` first). Under `cargo test` it runs
//! once on a small fixture, as a smoke test. Prints figures, asserts nothing
//! about speed.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use agent_elf::Bytes;
use agent_symbolize::{DwarfInfo, FrameSymbolizer, SymbolConfig, Symbolizer};
use firn::process::{DebugFileConfig, ObjectFile};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(pointer, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let live = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// Peak resident set (VmHWM) in bytes, and the file-backed part now.
fn rss() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
            .map_or(0, |kib| kib << 10)
    };
    (field("VmHWM:"), field("RssFile:"))
}

fn reset_peak_rss() {
    // Writing 5 resets VmHWM to the current RSS (Linux >= 4.0).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Middle addresses of up to `count` functions spread over the object.
fn function_addresses(path: &Path, count: usize) -> Vec<u64> {
    let bytes = std::fs::read(path).expect("object readable");
    let file = object::File::parse(bytes.as_slice()).expect("an ELF object");
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.address() > 0)
        .map(|s| (s.address(), s.size()))
        .collect();
    functions.sort_unstable();
    functions.dedup_by_key(|f| f.0);
    let step = (functions.len() / count.max(1)).max(1);
    let dwarf: u64 = file
        .sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
        .map(|s| s.size())
        .sum();
    println!(
        "object: {} ({} on disk, {} of DWARF sections, {} functions)",
        path.display(),
        mib(bytes.len()),
        mib(dwarf as usize),
        functions.len()
    );
    functions
        .iter()
        .step_by(step)
        .take(count)
        .map(|(start, size)| start + size / 2)
        .collect()
}

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let benchmarking = arguments.iter().any(|a| a == "--bench");
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let object_path = match arguments.iter().find(|a| !a.starts_with("--")) {
        Some(path) => PathBuf::from(path),
        None if benchmarking => manifest.join("../target/debug/firn"),
        None => agent_fixtures::dir().join("inline_chain"),
    };
    if !object_path.exists() {
        eprintln!(
            "{} does not exist: build it first (cargo build -p firn) or name an object",
            object_path.display()
        );
        std::process::exit(1);
    }
    let addresses = function_addresses(&object_path, if benchmarking { 2000 } else { 20 });
    end_to_end(&object_path, &addresses);
    phase_by_phase(&object_path, &addresses);
}

/// The symbolizer as the profile builder uses it: the object's first
/// sample, then many, then the caches' counts.
fn end_to_end(object_path: &Path, addresses: &[u64]) {
    // Measure the whole cost: no cache limit in the way.
    let unlimited = SymbolConfig {
        debuginfo_cache_bytes: 1 << 40,
        ..SymbolConfig::default()
    };

    // End to end first, while the process is fresh (clean peak RSS): as
    // the profile builder meets the object, its first sample, then many.
    reset_peak_rss();
    let (rss_before, _) = rss();
    let heap_before = LIVE.load(Ordering::Relaxed);
    PEAK.store(heap_before, Ordering::Relaxed);
    let started = Instant::now();
    let object = ObjectFile::open(object_path, &DebugFileConfig::default().directories)
        .expect("object opens");
    let mut symbolizer = Symbolizer::new(&unlimited, None, None);
    // A function in the middle of the object, as a sample would hit it.
    let first_address = addresses[addresses.len() / 2];
    let first = symbolizer.user(&object, first_address);
    let cold = started.elapsed();
    let heap_first = LIVE.load(Ordering::Relaxed) - heap_before;
    let peak_first = PEAK.load(Ordering::Relaxed) - heap_before;
    let (rss_first, file_first) = rss();
    let estimate = symbolizer.cache_bytes();
    println!(
        "first sample: {:.1} ms, heap {} (peak {}; caches estimate {}), peak RSS +{} (file-backed now {})",
        cold.as_secs_f64() * 1e3,
        mib(heap_first),
        mib(peak_first),
        mib(estimate.symbols + estimate.debuginfo),
        mib(rss_first.saturating_sub(rss_before)),
        mib(file_first)
    );
    println!("  -> {first:?}");

    let started = Instant::now();
    let named = addresses
        .iter()
        .filter(|&&vaddr| !symbolizer.user(&object, vaddr).is_empty())
        .count();
    let spread = started.elapsed();
    let heap_all = LIVE.load(Ordering::Relaxed) - heap_before;
    let (rss_all, file_all) = rss();
    let estimate = symbolizer.cache_bytes();
    println!(
        "{} addresses in other functions: {:.1} ms ({:.1} us each, {named} named), heap {} \
         (peak {}; caches estimate {}), peak RSS +{} (file-backed now {})",
        addresses.len(),
        spread.as_secs_f64() * 1e3,
        spread.as_secs_f64() * 1e6 / addresses.len() as f64,
        mib(heap_all),
        mib(PEAK.load(Ordering::Relaxed) - heap_before),
        mib(estimate.symbols + estimate.debuginfo),
        mib(rss_all.saturating_sub(rss_before)),
        mib(file_all)
    );
    let started = Instant::now();
    for &vaddr in addresses {
        let _ = symbolizer.user(&object, vaddr);
    }
    println!(
        "again, all parsed: {:.2} us per address",
        started.elapsed().as_secs_f64() * 1e6 / addresses.len() as f64
    );
    symbolizer.end_of_profile();
    let (_, file_released) = rss();
    println!("after the profile: file-backed RSS {}", mib(file_released));
    let counts = symbolizer.take_counts();
    println!(
        "debuginfo cache: {} hits, {} misses, {} evictions, {} DWARF errors",
        counts.debuginfo.hits,
        counts.debuginfo.misses,
        counts.debuginfo.evictions,
        counts.dwarf_errors
    );
    assert!(!first.is_empty(), "the first address was symbolized");
    drop(symbolizer);
    drop(object);
}

/// Symbol table and DWARF index on their own: heap really used against
/// the estimates the caches are charged with.
fn phase_by_phase(object_path: &Path, addresses: &[u64]) {
    // Phase by phase, on the bare parts: heap really used against the
    // estimates the caches are charged with.
    let data = Arc::new(std::fs::read(object_path).expect("object readable"));
    let heap = || LIVE.load(Ordering::Relaxed);
    let base = heap();
    let started = Instant::now();
    let table = agent_elf::read_symbols(&Bytes::new(data.clone())).expect("symbols");
    println!(
        "symbol table: {:.1} ms, heap {}, estimate {}",
        started.elapsed().as_secs_f64() * 1e3,
        mib(heap() - base),
        mib(table.heap_bytes())
    );
    drop(table);
    let base = heap();
    let started = Instant::now();
    let Ok(mut dwarf) = DwarfInfo::parse(Bytes::new(data.clone()), usize::MAX) else {
        println!("no usable DWARF");
        return;
    };
    let fits = dwarf.heap_bytes() <= SymbolConfig::default().debuginfo_cache_bytes;
    println!(
        "DWARF unit index: {:.1} ms, heap {}, estimate {} ({}within the default cache; {:?})",
        started.elapsed().as_secs_f64() * 1e3,
        mib(heap() - base),
        mib(dwarf.heap_bytes()),
        if fits { "" } else { "NOT " },
        dwarf.shape()
    );
    let index_estimate = dwarf.heap_bytes();
    let index_heap = heap() - base;
    let started = Instant::now();
    for &vaddr in addresses {
        let _ = dwarf.frames(vaddr);
    }
    println!(
        "{} lookups spread over the object: {:.1} ms, heap +{}, estimate +{}",
        addresses.len(),
        started.elapsed().as_secs_f64() * 1e3,
        mib(heap() - base - index_heap),
        mib(dwarf.heap_bytes() - index_estimate)
    );
}
