//! The symbolizer stage on this host: the `agent-symbolize` crate fed with
//! what only the agent may read (kallsyms, the kernel's notes, objects and
//! perf maps opened through [`crate::untrusted`]), its counts published
//! into [`Stats`], and the heap given back after every profile.

use std::{io, path::Path, sync::Arc};

use agent_elf::BuildId;
pub use agent_symbolize::{FrameSymbolizer, Line, ObjectSource, PerfMapSource};
use agent_symbolize::{
    Kallsyms, KallsymsError, SymbolConfig, Symbolizer, SymbolizerCounts, parse_build_id_note,
};
use tracing::{debug, warn};

use crate::{host::Host, stats::Stats};

#[derive(Debug, thiserror::Error)]
enum KernelSymbolsError {
    #[error("could not read {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Parse(#[from] KallsymsError),
}

/// Kernel symbols from the kallsyms file at `path`.
fn read_kallsyms(path: &Path) -> Result<Kallsyms, KernelSymbolsError> {
    let text = std::fs::read(path).map_err(|source| KernelSymbolsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Kallsyms::parse_bytes(&text)?)
}

/// The running kernel's build id, from its notes.
fn kernel_build_id(host: &Host) -> Option<BuildId> {
    parse_build_id_note(&host.kernel_notes().ok()?)
}

/// The symbolizer as the agent runs it.
pub struct HostSymbolizer {
    symbolizer: Symbolizer,
    stats: Arc<Stats>,
}

impl HostSymbolizer {
    /// Loads the host's kallsyms; without them kernel frames keep their
    /// addresses only (the reason is logged once).
    pub fn new(host: &Host, config: &SymbolConfig, stats: Arc<Stats>) -> Self {
        let kernel = match read_kallsyms(&host.kallsyms_path()) {
            Ok(table) => {
                debug!(symbols = table.len(), "kernel symbols loaded");
                Some(table)
            }
            Err(error) => {
                warn!(error = %format!("{:#}", anyhow::Error::from(error)), "kernel frames will not be symbolized");
                None
            }
        };
        Self {
            symbolizer: Symbolizer::new(config, kernel, kernel_build_id(host)),
            stats,
        }
    }

    /// Adds what the symbolizer counted since last time to [`Stats`].
    fn publish_counts(&mut self) {
        publish(&self.stats, &self.symbolizer.take_counts());
    }
}

/// Adds `counts` to the counters `/metrics` shows.
fn publish(stats: &Stats, counts: &SymbolizerCounts) {
    for (counter, value) in [
        (&stats.symbol_cache_hits, counts.symbols.hits),
        (&stats.symbol_cache_misses, counts.symbols.misses),
        (&stats.symbol_cache_evictions, counts.symbols.evictions),
        (&stats.symbol_table_errors, counts.symbol_table_errors),
        (&stats.debuginfo_cache_hits, counts.debuginfo.hits),
        (&stats.debuginfo_cache_misses, counts.debuginfo.misses),
        (&stats.debuginfo_cache_evictions, counts.debuginfo.evictions),
        (&stats.dwarf_errors, counts.dwarf_errors),
        (&stats.debuginfo_too_large, counts.debuginfo_too_large),
        (&stats.debug_files_found, counts.debug_files_found),
        (&stats.debug_files_rejected, counts.debug_files_rejected),
        (&stats.perf_map_cache_hits, counts.perf_maps.hits),
        (&stats.perf_map_cache_misses, counts.perf_maps.misses),
        (&stats.perf_map_cache_evictions, counts.perf_maps.evictions),
        (&stats.perf_map_parse_errors, counts.perf_map_parse_errors),
        (&stats.perf_maps_truncated, counts.perf_maps_truncated),
    ] {
        Stats::add(counter, value);
    }
}

impl FrameSymbolizer for HostSymbolizer {
    fn kernel(&mut self, address: u64) -> Option<Line> {
        self.symbolizer.kernel(address)
    }

    fn user(&mut self, object: &dyn ObjectSource, vaddr: u64) -> Vec<Line> {
        self.symbolizer.user(object, vaddr)
    }

    fn jit(&mut self, perf_map: &dyn PerfMapSource, address: u64) -> Option<Line> {
        self.symbolizer.jit(perf_map, address)
    }

    fn kernel_build_id(&self) -> Option<&BuildId> {
        self.symbolizer.kernel_build_id()
    }

    /// The counts reach `/metrics` once per profile: the symbolizer runs
    /// only while one is built.
    fn end_of_profile(&mut self) {
        self.symbolizer.end_of_profile();
        self.publish_counts();
        // Every profile frees what building it took (its DWARF units,
        // symbol tables evicted): give it back each time, not only after a
        // large free, or it accumulates as fragmentation.
        crate::allocator::release_freed_heap();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::process::{ObjectFile, PerfMapFile};

    #[test]
    fn this_kernel_has_symbols() {
        let table =
            read_kallsyms(&Host::system().kallsyms_path()).expect("kallsyms readable as root");
        assert!(table.len() > 1000);
        assert!(matches!(
            read_kallsyms(Path::new("/nonexistent/kallsyms")),
            Err(KernelSymbolsError::Read { .. })
        ));
    }

    /// Counts reach the stats when a profile ends.
    #[test]
    fn counts_are_published_at_the_end_of_each_profile() {
        let stats = Arc::new(Stats::default());
        let nowhere = Host::at("/nonexistent/proc".into(), "/nonexistent/sys".into());
        let mut symbolizer = HostSymbolizer::new(&nowhere, &SymbolConfig::default(), stats.clone());
        let object = ObjectFile::open(&agent_fixtures::dir().join("chain.stripped"), &[])
            .expect("fixture opens");
        let object = Arc::new(object);
        assert!(symbolizer.user(&object, 0x1).is_empty());
        assert_eq!(stats.snapshot().debuginfo_cache_misses, 0, "not yet");
        symbolizer.end_of_profile();
        let snapshot = stats.snapshot();
        assert_eq!(
            (
                snapshot.debuginfo_cache_misses,
                snapshot.symbol_cache_misses
            ),
            (1, 1)
        );

        let mut map = tempfile::NamedTempFile::new().expect("tempfile");
        map.write_all(b"1000 10 jitted\n").expect("write");
        let file = PerfMapFile(map.reopen().expect("reopen"));
        let line = symbolizer.jit(&file, 0x1004).expect("named");
        assert_eq!(line.function, "jitted");
        symbolizer.end_of_profile();
        assert_eq!(stats.snapshot().perf_map_cache_misses, 1);
    }
}
