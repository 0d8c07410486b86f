//! The symbolizer stage: kernel addresses through kallsyms, user addresses
//! through the ELF symbols of the object they fall in, with byte-bounded
//! caches keyed by object.

mod kallsyms;

use std::{path::Path, sync::Arc};

use tracing::{debug, warn};

pub use kallsyms::{Kallsyms, KallsymsError, KernelSymbol, kernel_build_id, parse_build_id_note};

use crate::{
    cache::ByteBoundedCache,
    elf::{self, BuildId, SymbolTable},
    process::{ContentKey, ObjectFile},
    stats::Stats,
};

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
    pub fn named(system_name: &str) -> Self {
        Self {
            function: demangle(system_name),
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
    /// first; empty when unknown.
    fn user(&mut self, object: &ObjectFile, vaddr: u64) -> Vec<Line>;
    /// The kernel's build id, for its pprof mapping.
    fn kernel_build_id(&self) -> Option<&BuildId>;
}

/// Rust symbols demangled without their hash; anything else as is.
pub fn demangle(name: &str) -> String {
    match rustc_demangle::try_demangle(name) {
        Ok(demangled) => format!("{demangled:#}"),
        Err(_) => name.to_owned(),
    }
}

pub struct Symbolizer {
    kernel: Option<Kallsyms>,
    kernel_build_id: Option<BuildId>,
    symbols: ByteBoundedCache<ContentKey, Arc<SymbolTable>>,
    stats: Arc<Stats>,
}

impl Symbolizer {
    /// Loads kallsyms from `kallsyms_path`; without it kernel frames keep
    /// their addresses only (the reason is logged once).
    pub fn new(kallsyms_path: &Path, cache_bytes: usize, stats: Arc<Stats>) -> Self {
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
            symbols: ByteBoundedCache::new(cache_bytes),
            stats,
        }
    }

    pub fn kernel_range(&self) -> Option<(u64, u64)> {
        self.kernel.as_ref()?.range()
    }

    fn symbols(&mut self, object: &ObjectFile) -> Option<Arc<SymbolTable>> {
        let key = object.content_key();
        if let Some(table) = self.symbols.get(&key) {
            Stats::inc(&self.stats.symbol_cache_hits);
            return Some(table.clone());
        }
        Stats::inc(&self.stats.symbol_cache_misses);
        let table = match object.data() {
            Ok(data) => match elf::read_symbols(&data) {
                Ok(table) => table,
                Err(error) => {
                    debug!(path = object.path, %error, "no symbols");
                    SymbolTable::default()
                }
            },
            Err(error) => {
                debug!(path = object.path, %error, "could not read object");
                return None;
            }
        };
        let table = Arc::new(table);
        let evicted = self
            .symbols
            .insert(key, table.clone(), table.heap_bytes() + 64);
        Stats::add(&self.stats.symbol_cache_evictions, evicted as u64);
        Some(table)
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

    fn user(&mut self, object: &ObjectFile, vaddr: u64) -> Vec<Line> {
        let Some(table) = self.symbols(object) else {
            return Vec::new();
        };
        table
            .lookup(vaddr)
            .map(|hit| vec![Line::named(hit.name)])
            .unwrap_or_default()
    }

    fn kernel_build_id(&self) -> Option<&BuildId> {
        self.kernel_build_id.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{elf::tests::CHAIN, process::ObjectFile};

    #[test]
    fn rust_names_are_demangled_without_hash() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs1234_5chain9level_one"), "chain::level_one");
        assert_eq!(demangle("level_one"), "level_one");
    }

    #[test]
    fn user_frames_resolve_through_the_object_symbols() {
        let stats = Arc::new(Stats::default());
        let mut symbolizer = Symbolizer::new(Path::new("/nonexistent"), 1 << 20, stats.clone());
        let object = ObjectFile::from_memory(
            crate::process::ObjectKey::File { dev: 1, inode: 1 },
            "/fixtures/chain",
            CHAIN.into(),
        )
        .expect("fixture");
        let main = {
            use object::{Object, ObjectSymbol};
            let file = object::File::parse(CHAIN).expect("parses");
            file.symbols()
                .find(|s| s.name() == Ok("level_two"))
                .map(|s| s.address())
                .expect("level_two")
        };
        let lines = symbolizer.user(&object, main + 2);
        assert_eq!(
            lines.first().map(|l| l.function.as_str()),
            Some("level_two")
        );
        assert!(symbolizer.user(&object, 0).is_empty());
        let snapshot = stats.snapshot();
        assert_eq!(
            (snapshot.symbol_cache_misses, snapshot.symbol_cache_hits),
            (1, 1)
        );
        assert!(
            symbolizer.kernel(0xffffffff81000000).is_none(),
            "no kallsyms loaded"
        );
    }
}
