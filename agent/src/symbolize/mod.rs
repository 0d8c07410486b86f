//! The symbolizer stage: kernel addresses through kallsyms; user addresses
//! through the DWARF of the object or of its separate debug file (lines and
//! inline frames), falling back to its ELF symbols; JIT code through the
//! process's perf map. Runs when a profile is built, off the sampling path;
//! every cache is bounded in bytes and counts hits, misses and evictions.

mod demangle;
mod dwarf;
mod kallsyms;
mod perfmap;

use std::{fs::File, num::NonZeroUsize, os::unix::fs::MetadataExt, path::Path, sync::Arc};

use lru::LruCache;
use tracing::{debug, warn};

pub use demangle::{DemangleMode, demangle};
pub use dwarf::{Bytes, DwarfError, DwarfFrame, DwarfInfo, DwarfShape};
pub use kallsyms::{Kallsyms, KallsymsError, KernelSymbol, kernel_build_id, parse_build_id_note};
pub use perfmap::{PerfMapTable, ReadReport, parse_line as parse_perf_map_line};

use crate::{
    config::{Limits, SymbolConfig},
    process::{ContentKey, ObjectData, ObjectFile, ObjectKey, debug_file_matches},
    stats::Stats,
};
use agent_cache::ByteBoundedCache;
use agent_elf::{self as elf, BuildId, SymbolTable};

/// The name of an inlined function DWARF does not name.
const UNNAMED: &str = "??";
/// Objects whose debug file choice is remembered (the check reads the
/// whole file for a debuglink).
const DEBUG_CHOICES: usize = 4096;

/// One source-level frame of a location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// Human-readable (demangled) name.
    pub function: String,
    /// The name as the object spells it (mangled).
    pub system_name: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Line {
    /// A frame known by its symbol alone, demangled the default way.
    pub fn named(system_name: &str) -> Self {
        Self::demangled(system_name, DemangleMode::default())
    }

    pub fn demangled(system_name: &str, mode: DemangleMode) -> Self {
        Self {
            function: demangle(system_name, mode),
            system_name: system_name.to_owned(),
            file: None,
            line: None,
        }
    }
}

/// What the pprof builder needs from a symbolizer; a trait so the builder
/// is tested without the machine's objects.
pub trait FrameSymbolizer {
    /// The kernel function at `address`.
    fn kernel(&mut self, address: u64) -> Option<Line>;
    /// Source frames at link-time address `vaddr` of `object`, innermost
    /// (inlined) first, the function they were inlined into last; empty
    /// when unknown.
    fn user(&mut self, object: &ObjectFile, vaddr: u64) -> Vec<Line>;
    /// The JIT function at runtime `address`, from the process's perf map.
    fn jit(&mut self, perf_map: &File, address: u64) -> Option<Line>;
    /// The kernel's build id, for its pprof mapping.
    fn kernel_build_id(&self) -> Option<&BuildId>;
    /// A profile was built: caches may give back what the build made them
    /// grow beyond their size.
    fn end_of_profile(&mut self) {}
}

/// What the symbolizer's caches hold, in (estimated) heap bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheBytes {
    pub symbols: usize,
    pub debuginfo: usize,
    pub perf_maps: usize,
}

pub struct Symbolizer {
    kernel: Option<Kallsyms>,
    kernel_build_id: Option<BuildId>,
    demangle: DemangleMode,
    symbols: ByteBoundedCache<ContentKey, Arc<SymbolTable>>,
    /// `None`: the object has no usable DWARF (remembered, cheaply).
    dwarf: ByteBoundedCache<ContentKey, Option<DwarfInfo>>,
    /// Which of an object's debug file candidates matched, if any.
    debug_choices: LruCache<ObjectKey, Option<usize>>,
    /// By the perf map file's (device, inode).
    perf_maps: ByteBoundedCache<(u64, u64), PerfMapTable>,
    /// The most one object's DWARF may take (the whole cache).
    max_dwarf_bytes: usize,
    perf_map_max_bytes: u64,
    stats: Arc<Stats>,
}

impl Symbolizer {
    /// Loads kallsyms from `kallsyms_path`; without it kernel frames keep
    /// their addresses only (the reason is logged once).
    pub fn new(
        kallsyms_path: &Path,
        limits: &Limits,
        config: &SymbolConfig,
        stats: Arc<Stats>,
    ) -> Self {
        let kernel = match Kallsyms::read(kallsyms_path) {
            Ok(table) => {
                debug!(symbols = table.len(), "kernel symbols loaded");
                Some(table)
            }
            Err(error) => {
                warn!(%error, "kernel frames will not be symbolized");
                None
            }
        };
        Self {
            kernel,
            kernel_build_id: kernel_build_id(),
            demangle: config.demangle,
            symbols: ByteBoundedCache::new(limits.symbol_cache_bytes),
            dwarf: ByteBoundedCache::new(limits.debuginfo_cache_bytes),
            debug_choices: LruCache::new(
                NonZeroUsize::new(DEBUG_CHOICES).unwrap_or(NonZeroUsize::MIN),
            ),
            perf_maps: ByteBoundedCache::new(limits.perf_map_cache_bytes),
            max_dwarf_bytes: limits.debuginfo_cache_bytes,
            perf_map_max_bytes: limits.perf_map_cache_bytes as u64,
            stats,
        }
    }

    pub fn kernel_range(&self) -> Option<(u64, u64)> {
        self.kernel.as_ref()?.range()
    }

    /// Bytes held by each cache, for summaries and benchmarks.
    pub fn cache_bytes(&self) -> CacheBytes {
        CacheBytes {
            symbols: self.symbols.bytes(),
            debuginfo: self.dwarf.bytes(),
            perf_maps: self.perf_maps.bytes(),
        }
    }

    /// The bytes of the object's separate debug file, the first candidate
    /// that matches the object (build id, or debuglink CRC).
    fn debug_data(&mut self, object: &ObjectFile) -> Option<ObjectData> {
        if object.debug_files.is_empty() {
            return None;
        }
        if let Some(&choice) = self.debug_choices.get(&object.key) {
            return object.debug_files.get(choice?)?.data().ok();
        }
        let mut chosen = None;
        for (index, candidate) in object.debug_files.iter().enumerate() {
            let Ok(data) = candidate.data() else { continue };
            match debug_file_matches(&object.layout, candidate.kind, &data) {
                Ok(true) => {
                    Stats::inc(&self.stats.debug_files_found);
                    debug!(object = object.path, debug_file = %candidate.path.display(), "debug file");
                    chosen = Some((index, data));
                    break;
                }
                Ok(false) => {
                    Stats::inc(&self.stats.debug_files_rejected);
                    debug!(object = object.path, candidate = %candidate.path.display(), "debug file does not match");
                }
                Err(error) => {
                    Stats::inc(&self.stats.debug_files_rejected);
                    debug!(object = object.path, candidate = %candidate.path.display(), %error, "debug file unusable");
                }
            }
        }
        self.debug_choices
            .put(object.key, chosen.as_ref().map(|(index, _)| *index));
        chosen.map(|(_, data)| data)
    }

    fn symbols(&mut self, object: &ObjectFile) -> Option<Arc<SymbolTable>> {
        let key = object.content_key();
        if let Some(table) = self.symbols.get(&key) {
            Stats::inc(&self.stats.symbol_cache_hits);
            return Some(table.clone());
        }
        Stats::inc(&self.stats.symbol_cache_misses);
        let data = match object.data() {
            Ok(data) => data,
            Err(error) => {
                debug!(path = object.path, %error, "could not read object");
                return None;
            }
        };
        let mut inputs = vec![Bytes::new(Arc::new(data))];
        // A stripped object keeps its full symbol table in the debug file.
        if !object.layout.has_symtab
            && let Some(debug) = self.debug_data(object)
        {
            inputs.push(Bytes::new(Arc::new(debug)));
        }
        let table = elf::read_symbols_from(&inputs);
        // Reading touched every symbol; lookups touch a few names.
        for input in &inputs {
            input.release_pages();
        }
        let table = match table {
            Ok(table) => table,
            Err(error) => {
                Stats::inc(&self.stats.symbol_table_errors);
                debug!(path = object.path, %error, "no symbols");
                SymbolTable::default()
            }
        };
        let table = Arc::new(table);
        let evicted = self
            .symbols
            .insert(key, table.clone(), table.heap_bytes() + 64);
        Stats::add(&self.stats.symbol_cache_evictions, evicted as u64);
        Some(table)
    }

    fn load_dwarf(&mut self, object: &ObjectFile) -> Option<DwarfInfo> {
        let data = if object.layout.has_debug_info {
            object.data().ok()?
        } else {
            self.debug_data(object)?
        };
        match DwarfInfo::parse(Bytes::new(Arc::new(data)), self.max_dwarf_bytes) {
            Ok(info) => {
                debug!(path = object.path, shape = ?info.shape(), bytes = info.heap_bytes(), "DWARF indexed");
                Some(info)
            }
            Err(error @ DwarfError::TooLarge { .. }) => {
                Stats::inc(&self.stats.debuginfo_too_large);
                debug!(path = object.path, %error, "DWARF too large for --debuginfo-cache-size");
                None
            }
            Err(error) => {
                Stats::inc(&self.stats.dwarf_errors);
                debug!(path = object.path, error = %error_chain(&error), "DWARF unusable");
                None
            }
        }
    }

    /// DWARF frames at `vaddr`; empty when the object has no DWARF for it.
    fn dwarf_frames(&mut self, object: &ObjectFile, vaddr: u64) -> Vec<DwarfFrame> {
        let key = object.content_key();
        if self.dwarf.get(&key).is_some() {
            Stats::inc(&self.stats.debuginfo_cache_hits);
        } else {
            Stats::inc(&self.stats.debuginfo_cache_misses);
            let info = self.load_dwarf(object);
            let bytes = info.as_ref().map_or(64, DwarfInfo::heap_bytes);
            let evicted = self.dwarf.insert(key.clone(), info, bytes);
            Stats::add(&self.stats.debuginfo_cache_evictions, evicted as u64);
        }
        let Some(Some(info)) = self.dwarf.get_mut(&key) else {
            return Vec::new();
        };
        let result = info.frames(vaddr);
        let bytes = info.heap_bytes();
        let evicted = self.dwarf.set_bytes(&key, bytes);
        Stats::add(&self.stats.debuginfo_cache_evictions, evicted as u64);
        result.unwrap_or_else(|error| {
            Stats::inc(&self.stats.dwarf_errors);
            debug!(path = object.path, vaddr, error = %error_chain(&error), "DWARF lookup failed");
            Vec::new()
        })
    }
}

/// An error with its sources, for one log field.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl FrameSymbolizer for Symbolizer {
    fn kernel(&mut self, address: u64) -> Option<Line> {
        let symbol = self.kernel.as_ref()?.lookup(address)?;
        Some(Line {
            function: symbol.name.to_owned(),
            system_name: symbol.name.to_owned(),
            file: symbol.module.map(|m| format!("[{m}]")),
            line: None,
        })
    }

    fn user(&mut self, object: &ObjectFile, vaddr: u64) -> Vec<Line> {
        let frames = self.dwarf_frames(object, vaddr);
        // The symbol table names what DWARF does not: code without debug
        // info, or a unit with line tables but no function entries.
        let symbol = if frames.last().is_none_or(|frame| frame.name.is_none()) {
            self.symbols(object)
                .and_then(|table| table.lookup(vaddr).map(|hit| hit.name.to_owned()))
        } else {
            None
        };
        let mode = self.demangle;
        if frames.is_empty() {
            return symbol
                .map(|name| vec![Line::demangled(&name, mode)])
                .unwrap_or_default();
        }
        let outermost = frames.len() - 1;
        frames
            .into_iter()
            .enumerate()
            .map(|(depth, frame)| {
                let system_name = frame
                    .name
                    .or_else(|| (depth == outermost).then(|| symbol.clone()).flatten())
                    .unwrap_or_else(|| UNNAMED.to_owned());
                Line {
                    function: demangle(&system_name, mode),
                    system_name,
                    file: frame.file,
                    line: frame.line,
                }
            })
            .collect()
    }

    fn jit(&mut self, perf_map: &File, address: u64) -> Option<Line> {
        let meta = perf_map.metadata().ok()?;
        let key = (meta.dev(), meta.ino());
        if self.perf_maps.get(&key).is_some() {
            Stats::inc(&self.stats.perf_map_cache_hits);
        } else {
            Stats::inc(&self.stats.perf_map_cache_misses);
            let evicted = self.perf_maps.insert(key, PerfMapTable::default(), 0);
            Stats::add(&self.stats.perf_map_cache_evictions, evicted as u64);
        }
        let table = self.perf_maps.get_mut(&key)?;
        if table.lookup(address).is_none() {
            // JIT code newer than what was read: read what was appended.
            match table.refresh(perf_map, self.perf_map_max_bytes) {
                Ok(report) => {
                    Stats::add(&self.stats.perf_map_parse_errors, report.errors as u64);
                    if report.truncated {
                        Stats::inc(&self.stats.perf_maps_truncated);
                    }
                }
                Err(error) => debug!(%error, "could not read a perf map"),
            }
        }
        let line = table
            .lookup(address)
            .map(|name| Line::demangled(name, self.demangle));
        let bytes = table.heap_bytes();
        let evicted = self.perf_maps.set_bytes(&key, bytes);
        Stats::add(&self.stats.perf_map_cache_evictions, evicted as u64);
        line
    }

    fn kernel_build_id(&self) -> Option<&BuildId> {
        self.kernel_build_id.as_ref()
    }

    /// A context that grew past the whole cache while one profile was
    /// built (its units parsed) is kept for that build only.
    fn end_of_profile(&mut self) {
        let evicted = self.dwarf.trim();
        Stats::add(&self.stats.debuginfo_cache_evictions, evicted as u64);
        // What a profile's lookups read stays parsed in the heap; the file
        // pages behind it need not stay in firn's RSS until the next one.
        for info in self.dwarf.values().flatten() {
            info.release_pages();
        }
        for table in self.symbols.values() {
            table.release_pages();
        }
        // Every profile frees what building it took (its DWARF units,
        // symbol tables evicted): give it back each time, not
        // only after a large free, or it accumulates as fragmentation.
        crate::allocator::release_freed_heap();
    }
}

#[cfg(test)]
mod tests;
