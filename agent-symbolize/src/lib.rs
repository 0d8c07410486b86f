//! The symbolizer stage: kernel addresses through kallsyms; user addresses
//! through the DWARF of the object or of its separate debug file (lines and
//! inline frames), falling back to its ELF symbols; JIT code through the
//! process's perf map or jitdump file. Runs when a profile is built, off the sampling path;
//! every cache is bounded in bytes.
//!
//! It does no I/O of its own: the caller reads kallsyms and hands over the
//! text, and hands over objects ([`ObjectSource`]) and perf maps
//! ([`PerfMapSource`]) it opened its own way. What the caches did and what
//! failed comes back as plain numbers ([`SymbolizerCounts`]), and the
//! objects it could not name as their keys, for the caller to publish.

mod demangle;
mod dwarf;
mod dwarf_lines;
mod dwarf_unit_index;
mod dwarf_units;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod jitdump;
mod kallsyms;
mod names;
mod perfmap;
mod symbolizer;

use std::{io, sync::Arc};

pub use agent_elf::{BuildId, Bytes, ElfLayout, ObjectKey, debug_files::DebugFileKind};
pub use demangle::{DemangleMode, demangle};
pub use dwarf::{DwarfError, DwarfFrame, DwarfInfo, DwarfShape};
pub use dwarf_units::UnitCounts;
pub use jitdump::{JitTable, JitdumpTable};
pub use kallsyms::{Kallsyms, KallsymsBuilder, KallsymsError, KernelSymbol, parse_build_id_note};
pub use perfmap::{
    PerfMapSource, PerfMapStat, PerfMapTable, ReadReport, parse_line as parse_perf_map_line,
};
pub use symbolizer::Symbolizer;

/// How frames are named, and how much memory naming them may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolConfig {
    pub demangle: DemangleMode,
    /// Bytes of ELF symbol tables kept in memory.
    pub symbol_cache_bytes: usize,
    /// Bytes of DWARF (line tables, inline trees; estimated) kept in
    /// memory; also the most one object's DWARF may take.
    pub debuginfo_cache_bytes: usize,
    /// Bytes of JIT perf maps kept in memory; also the most read of one map.
    pub perf_map_cache_bytes: usize,
}

impl Default for SymbolConfig {
    fn default() -> Self {
        Self {
            demangle: DemangleMode::Simplified,
            symbol_cache_bytes: 16 << 20,
            debuginfo_cache_bytes: 16 << 20,
            perf_map_cache_bytes: 8 << 20,
        }
    }
}

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

/// An ELF object to symbolize, opened by the caller: read only through
/// this, and only on a cache miss (mapping a file costs a system call).
pub trait ObjectSource {
    /// Which object it is: what its debug file choice is remembered by and
    /// what [`FrameSymbolizer::take_unnamed_objects`] reports.
    fn key(&self) -> ObjectKey;
    /// Where it is, for logs.
    fn path(&self) -> &str;
    fn layout(&self) -> &ElfLayout;
    /// The object's bytes.
    fn bytes(&self) -> io::Result<Bytes>;
    /// How many separate debug file candidates it has, in the order of
    /// [`agent_elf::debug_files::candidates`]; none when its DWARF is its own.
    fn debug_files(&self) -> usize;
    /// Candidate `index`, not yet checked against the object.
    fn debug_file(&self, index: usize) -> io::Result<DebugFileBytes>;
}

/// A debug file candidate's contents, as the caller opened it.
pub struct DebugFileBytes {
    /// How it was found, which says how it is checked.
    pub kind: DebugFileKind,
    /// Where it was found, for logs.
    pub path: String,
    pub bytes: Bytes,
}

/// Objects the caller shares are symbolized through the share.
impl<T: ObjectSource + ?Sized> ObjectSource for Arc<T> {
    fn key(&self) -> ObjectKey {
        (**self).key()
    }

    fn path(&self) -> &str {
        (**self).path()
    }

    fn layout(&self) -> &ElfLayout {
        (**self).layout()
    }

    fn bytes(&self) -> io::Result<Bytes> {
        (**self).bytes()
    }

    fn debug_files(&self) -> usize {
        (**self).debug_files()
    }

    fn debug_file(&self, index: usize) -> io::Result<DebugFileBytes> {
        (**self).debug_file(index)
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
    fn user(&mut self, object: &dyn ObjectSource, vaddr: u64) -> Vec<Line>;
    /// The JIT function at runtime `address`, from the process's perf map.
    fn jit(&mut self, perf_map: &dyn PerfMapSource, address: u64) -> Option<Line>;
    /// The kernel's build id, for its pprof mapping.
    fn kernel_build_id(&self) -> Option<&BuildId>;
    /// A profile was built: caches may give back what the build made them
    /// grow beyond their size.
    fn end_of_profile(&mut self) {}
}

/// One cache's lookups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// What the symbolizer did since these were last taken
/// ([`Symbolizer::take_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolizerCounts {
    /// ELF symbol tables.
    pub symbols: CacheCounts,
    /// DWARF contexts (line tables and inline trees).
    pub debuginfo: CacheCounts,
    pub perf_maps: CacheCounts,
    /// ELF symbol tables that could not be read (malformed objects).
    pub symbol_table_errors: u64,
    /// DWARF that could not be used: malformed or truncated sections.
    pub dwarf_errors: u64,
    /// Objects whose DWARF would take more than the whole DWARF cache.
    pub debuginfo_too_large: u64,
    /// Compilation units parsed for lookups, and let go when idle.
    pub dwarf_units: UnitCounts,
    /// Separate debug files that matched their object.
    pub debug_files_found: u64,
    /// Debug file candidates that did not match their object or did not
    /// parse.
    pub debug_files_rejected: u64,
    /// Perf map lines that did not parse.
    pub perf_map_parse_errors: u64,
    /// Perf maps larger than the cache may read.
    pub perf_maps_truncated: u64,
}

/// What the symbolizer's caches hold, in (estimated) heap bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheBytes {
    pub symbols: usize,
    pub debuginfo: usize,
    pub perf_maps: usize,
}

#[cfg(test)]
mod tests;
