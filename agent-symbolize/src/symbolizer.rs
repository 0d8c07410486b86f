//! [`Symbolizer`]: the caches of symbol tables, DWARF contexts and perf
//! maps, each bounded in bytes, and the rules choosing between them.

use std::{num::NonZeroUsize, sync::Arc};

use agent_cache::{ByteBoundedCache, Found, ResidentCache};
use agent_elf::{self as elf, BuildId, Bytes, ContentKey, ObjectKey, SymbolTable, debug_files};
use lru::LruCache;
use tracing::debug;

use crate::{
    CacheBytes, DemangleMode, FrameSymbolizer, Kallsyms, Line, ObjectSource, PerfMapSource,
    SymbolConfig, SymbolizerCounts, demangle,
    dwarf::{DwarfError, DwarfFrame, DwarfInfo},
    jitdump::JitTable,
    names::{FunctionName, FunctionNames},
};

/// The name of an inlined function DWARF does not name.
const UNNAMED: &str = "??";
/// Objects whose debug file choice is remembered (the check reads the
/// whole file for a debuglink).
const DEBUG_CHOICES: usize = 4096;
/// Objects remembered as having no DWARF firn can use.
const WITHOUT_DWARF: usize = 4096;

/// What came of indexing an object's DWARF.
enum LoadedDwarf {
    Indexed(Box<DwarfInfo>),
    /// None, none that matches, too large for the cache, or malformed.
    Unusable,
    /// The object could not be read, which may not last: its process may
    /// have gone while another maps the same file.
    Unreadable,
}

pub struct Symbolizer {
    kernel: Option<Kallsyms>,
    kernel_build_id: Option<BuildId>,
    demangle: DemangleMode,
    /// Names where DWARF gives none: a Go binary's own table, else the
    /// ELF symbols.
    /// Kept like the DWARF contexts: libc's table is not pushed out by
    /// the tables of a few compilers that came and went.
    symbols: ResidentCache<ContentKey, Arc<FunctionNames>>,
    /// Contexts used in the last two profiles stay: a profile that needs
    /// more than the budget rebuilds only what does not fit, not every
    /// context (least-recently-used order would evict each one just before
    /// the next profile needs it).
    dwarf: ResidentCache<ContentKey, DwarfInfo>,
    /// Objects without DWARF, with DWARF too large for the cache, or with
    /// DWARF that failed to index. Kept apart from `dwarf`, so that a
    /// context that outgrows the cache does not push them out: each would
    /// be read and refused again at the next profile.
    without_dwarf: LruCache<ContentKey, ()>,
    /// Which of an object's debug file candidates matched, if any.
    debug_choices: LruCache<ObjectKey, Option<usize>>,
    /// By the perf map's or jitdump file's (device, inode).
    perf_maps: ByteBoundedCache<(u64, u64), JitTable>,
    /// The most one object's DWARF may take (the whole cache).
    max_dwarf_bytes: usize,
    perf_map_max_bytes: u64,
    counts: SymbolizerCounts,
}

impl Symbolizer {
    /// `kernel`: the parsed kallsyms, if they could be read; without them
    /// kernel frames keep their addresses only.
    pub fn new(
        config: &SymbolConfig,
        kernel: Option<Kallsyms>,
        kernel_build_id: Option<BuildId>,
    ) -> Self {
        Self {
            kernel,
            kernel_build_id,
            demangle: config.demangle,
            symbols: ResidentCache::new(config.symbol_cache_bytes),
            dwarf: ResidentCache::new(config.debuginfo_cache_bytes),
            without_dwarf: LruCache::new(
                NonZeroUsize::new(WITHOUT_DWARF).unwrap_or(NonZeroUsize::MIN),
            ),
            debug_choices: LruCache::new(
                NonZeroUsize::new(DEBUG_CHOICES).unwrap_or(NonZeroUsize::MIN),
            ),
            perf_maps: ByteBoundedCache::new(config.perf_map_cache_bytes),
            max_dwarf_bytes: config.debuginfo_cache_bytes,
            perf_map_max_bytes: config.perf_map_cache_bytes as u64,
            counts: SymbolizerCounts::default(),
        }
    }

    /// Bytes held by each cache, for summaries and benchmarks.
    pub fn cache_bytes(&self) -> CacheBytes {
        CacheBytes {
            symbols: self.symbols.bytes(),
            debuginfo: self.dwarf.bytes(),
            perf_maps: self.perf_maps.bytes(),
        }
    }

    /// What happened since the last call, for the caller to publish.
    pub fn take_counts(&mut self) -> SymbolizerCounts {
        std::mem::take(&mut self.counts)
    }

    /// The bytes of the object's separate debug file, the first candidate
    /// that matches the object (see [`debug_files::matches`]).
    fn debug_data(&mut self, object: &dyn ObjectSource) -> Option<Bytes> {
        let candidates = object.debug_files();
        if candidates == 0 {
            return None;
        }
        if let Some(&choice) = self.debug_choices.get(&object.key()) {
            return Some(object.debug_file(choice?).ok()?.bytes);
        }
        let mut chosen = None;
        for index in 0..candidates {
            let Ok(candidate) = object.debug_file(index) else {
                continue;
            };
            let (object_path, path) = (object.path(), candidate.path.as_str());
            match debug_files::matches(object.layout(), candidate.kind, &candidate.bytes) {
                Ok(true) => {
                    self.counts.debug_files_found += 1;
                    debug!(object = object_path, debug_file = path, "debug file");
                    chosen = Some((index, candidate.bytes));
                    break;
                }
                Ok(false) => {
                    self.counts.debug_files_rejected += 1;
                    debug!(
                        object = object_path,
                        candidate = path,
                        "debug file does not match"
                    );
                }
                Err(error) => {
                    self.counts.debug_files_rejected += 1;
                    debug!(object = object_path, candidate = path, %error, "debug file unusable");
                }
            }
        }
        self.debug_choices
            .put(object.key(), chosen.as_ref().map(|(index, _)| *index));
        chosen.map(|(_, bytes)| bytes)
    }

    fn names(&mut self, object: &dyn ObjectSource) -> Option<Arc<FunctionNames>> {
        let key = ContentKey::of(object.key(), object.layout());
        if let Some(names) = self.symbols.get_mut(&key) {
            self.counts.symbols.hits += 1;
            return Some(names.into_value().clone());
        }
        self.counts.symbols.misses += 1;
        let bytes = match object.bytes() {
            Ok(bytes) => bytes,
            Err(error) => {
                debug!(path = object.path(), %error, "could not read object");
                return None;
            }
        };
        let names = match FunctionNames::go(&bytes) {
            Some(names) => names,
            None => FunctionNames::symbols(self.symbol_table(object, bytes)),
        };
        let names = Arc::new(names);
        debug!(
            path = object.path(),
            bytes = names.heap_bytes(),
            "symbol table read"
        );
        let evicted = self
            .symbols
            .insert(key, names.clone(), names.heap_bytes() + 64);
        self.counts.symbols.evictions += evicted as u64;
        Some(names)
    }

    fn symbol_table(&mut self, object: &dyn ObjectSource, bytes: Bytes) -> SymbolTable {
        let mut inputs = vec![bytes];
        // A stripped object keeps its full symbol table in the debug file.
        if !object.layout().has_symtab
            && let Some(debug) = self.debug_data(object)
        {
            inputs.push(debug);
        }
        let table = elf::read_symbols_from(&inputs);
        // Reading touched every symbol; lookups touch a few names.
        for input in &inputs {
            input.release_pages();
        }
        match table {
            Ok(table) => table,
            Err(error) => {
                self.counts.symbol_table_errors += 1;
                debug!(path = object.path(), %error, "no symbols");
                SymbolTable::default()
            }
        }
    }

    /// The function at `vaddr` as its object's tables name it.
    fn function_name(&mut self, object: &dyn ObjectSource, vaddr: u64) -> Option<FunctionName> {
        let names = self.names(object)?;
        let held = names.heap_bytes();
        let found = names.lookup(vaddr);
        // A Go binary's symbol table, read for its C code, counts from now.
        if names.heap_bytes() != held {
            let key = ContentKey::of(object.key(), object.layout());
            let evicted = self.symbols.set_bytes(&key, names.heap_bytes() + 64);
            self.counts.symbols.evictions += evicted as u64;
        }
        found
    }

    fn load_dwarf(&mut self, object: &dyn ObjectSource) -> LoadedDwarf {
        let bytes = if object.layout().has_debug_info {
            match object.bytes() {
                Ok(bytes) => bytes,
                Err(_) => return LoadedDwarf::Unreadable,
            }
        } else {
            match self.debug_data(object) {
                Some(bytes) => bytes,
                None => return LoadedDwarf::Unusable,
            }
        };
        let path = object.path();
        match DwarfInfo::parse(bytes, self.max_dwarf_bytes) {
            Ok(info) => {
                debug!(path, shape = ?info.shape(), bytes = info.heap_bytes(), "DWARF indexed");
                LoadedDwarf::Indexed(Box::new(info))
            }
            Err(error @ DwarfError::TooLarge { .. }) => {
                self.counts.debuginfo_too_large += 1;
                debug!(path, %error, "DWARF too large for --debuginfo-cache-size");
                LoadedDwarf::Unusable
            }
            Err(error) => {
                self.counts.dwarf_errors += 1;
                debug!(
                    path,
                    error = &error as &dyn std::error::Error,
                    "DWARF unusable"
                );
                LoadedDwarf::Unusable
            }
        }
    }

    /// DWARF frames at `vaddr`; empty when the object has no DWARF for it.
    fn dwarf_frames(&mut self, object: &dyn ObjectSource, vaddr: u64) -> Vec<DwarfFrame> {
        let key = ContentKey::of(object.key(), object.layout());
        if self.without_dwarf.get(&key).is_some() {
            self.counts.debuginfo.hits += 1;
            return Vec::new();
        }
        if self.dwarf.get_mut(&key).is_some() {
            self.counts.debuginfo.hits += 1;
        } else {
            self.counts.debuginfo.misses += 1;
            let info = match self.load_dwarf(object) {
                LoadedDwarf::Indexed(info) => info,
                LoadedDwarf::Unusable => {
                    self.without_dwarf.put(key, ());
                    return Vec::new();
                }
                LoadedDwarf::Unreadable => return Vec::new(),
            };
            let bytes = info.heap_bytes();
            let evicted = self.dwarf.insert(key.clone(), *info, bytes);
            self.counts.debuginfo.evictions += evicted as u64;
        }
        let Some(info) = self.dwarf.get_mut(&key).map(Found::into_value) else {
            return Vec::new();
        };
        let result = info.frames(vaddr);
        self.counts.dwarf_units.parsed += info.take_unit_counts().parsed;
        let bytes = info.heap_bytes();
        let evicted = self.dwarf.set_bytes(&key, bytes);
        self.counts.debuginfo.evictions += evicted as u64;
        result.unwrap_or_else(|error| {
            self.counts.dwarf_errors += 1;
            let error = &error as &dyn std::error::Error;
            debug!(path = object.path(), vaddr, error, "DWARF lookup failed");
            Vec::new()
        })
    }

    fn user_frames(&mut self, object: &dyn ObjectSource, vaddr: u64) -> Vec<Line> {
        let frames = self.dwarf_frames(object, vaddr);
        // The symbol table names what DWARF does not: code without debug
        // info, or a unit with line tables but no function entries.
        let symbol = if frames.last().is_none_or(|frame| frame.name.is_none()) {
            self.function_name(object, vaddr)
        } else {
            None
        };
        let mode = self.demangle;
        if frames.is_empty() {
            return symbol
                .map(|symbol| {
                    vec![Line {
                        function: demangle(&symbol.name, mode),
                        system_name: symbol.name,
                        file: symbol.file,
                        line: symbol.line,
                    }]
                })
                .unwrap_or_default();
        }
        let symbol = symbol.map(|symbol| symbol.name);
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

    fn user(&mut self, object: &dyn ObjectSource, vaddr: u64) -> Vec<Line> {
        self.user_frames(object, vaddr)
    }

    fn jit(&mut self, perf_map: &dyn PerfMapSource, address: u64) -> Option<Line> {
        let key = perf_map.stat().ok()?.identity;
        if self.perf_maps.get(&key).is_some() {
            self.counts.perf_maps.hits += 1;
        } else {
            self.counts.perf_maps.misses += 1;
            let evicted = self.perf_maps.insert(key, JitTable::for_file(perf_map)?, 0);
            self.counts.perf_maps.evictions += evicted as u64;
        }
        let table = self.perf_maps.get_mut(&key)?;
        if table.lookup(address).is_none() {
            // JIT code newer than what was read: read what was appended.
            match table.refresh(perf_map, self.perf_map_max_bytes) {
                Ok(report) => {
                    self.counts.perf_map_parse_errors += report.errors as u64;
                    if report.truncated {
                        self.counts.perf_maps_truncated += 1;
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
        self.counts.perf_maps.evictions += evicted as u64;
        line
    }

    fn kernel_build_id(&self) -> Option<&BuildId> {
        self.kernel_build_id.as_ref()
    }

    /// A context that did not fit beside those in use (or grew past the
    /// whole cache) while one profile was built is kept for that build only.
    fn end_of_profile(&mut self) {
        debug!(
            contexts = self.dwarf.len(),
            bytes = self.dwarf.bytes(),
            "DWARF contexts at the end of the profile"
        );
        let evicted = self.dwarf.end_round_shedding(DwarfInfo::stale_bytes);
        self.counts.debuginfo.evictions += evicted as u64;
        for info in self.dwarf.values_mut() {
            info.end_round();
            self.counts.dwarf_units.dropped += info.take_unit_counts().dropped;
        }
        let evicted = self.symbols.end_round();
        self.counts.symbols.evictions += evicted as u64;
        // What a profile's lookups read stays parsed in the heap; the file
        // pages behind it need not stay in the caller's RSS until the next.
        for info in self.dwarf.values() {
            info.release_pages();
        }
        for names in self.symbols.values() {
            names.release_pages();
        }
    }
}
