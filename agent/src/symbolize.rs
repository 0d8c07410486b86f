//! The symbolizer stage on this host: the `agent-symbolize` crate fed with
//! what only the agent may read (kallsyms, the kernel's notes, objects and
//! perf maps opened through [`crate::untrusted`]), its counts published
//! into [`Stats`], and the heap given back after every profile.

use std::{
    io::{self, Read},
    path::Path,
    sync::Arc,
};

use agent_elf::BuildId;
pub use agent_symbolize::{FrameSymbolizer, Line, ObjectSource, PerfMapSource};
use agent_symbolize::{
    Kallsyms, KallsymsBuilder, KallsymsError, SymbolConfig, Symbolizer, SymbolizerCounts,
    parse_build_id_note,
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

/// Most of a kallsyms file read: the largest kernels list a few hundred
/// thousand symbols, tens of MB.
const MAX_KALLSYMS_BYTES: u64 = 256 << 20;
/// Kallsyms is read and parsed this much at a time, never held whole.
const KALLSYMS_CHUNK: usize = 256 << 10;

/// Kernel symbols from the kallsyms file at `path`.
fn read_kallsyms(path: &Path) -> Result<Kallsyms, KernelSymbolsError> {
    let read_error = |source| KernelSymbolsError::Read {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::File::open(path)
        .map_err(read_error)?
        .take(MAX_KALLSYMS_BYTES);
    let mut builder = KallsymsBuilder::default();
    let mut buffer = vec![0u8; KALLSYMS_CHUNK];
    let mut filled = 0;
    loop {
        let read = match file.read(&mut buffer[filled..]) {
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(read_error(error)),
        };
        if read == 0 {
            builder.push_lines(&buffer[..filled]);
            break;
        }
        filled += read;
        // Whole lines go to the table; the last, partial one waits for the
        // rest of it.
        match buffer[..filled].iter().rposition(|&byte| byte == b'\n') {
            Some(newline) => {
                builder.push_lines(&buffer[..newline]);
                buffer.copy_within(newline + 1..filled, 0);
                filled -= newline + 1;
            }
            // A line longer than the buffer is no kallsyms line.
            None if filled == buffer.len() => filled = 0,
            None => {}
        }
    }
    Ok(builder.finish()?)
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
        (&stats.dwarf_units_parsed, counts.dwarf_units.parsed),
        (&stats.dwarf_units_dropped, counts.dwarf_units.dropped),
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
        let path = Host::system().kallsyms_path();
        let table = read_kallsyms(&path).expect("kallsyms readable as root");
        assert!(table.len() > 1000);
        // Read a piece at a time, it is the table of the whole text.
        let whole =
            Kallsyms::parse_bytes(&std::fs::read(&path).expect("readable")).expect("parses");
        assert_eq!(table.len(), whole.len());
        assert_eq!(table.range(), whole.range());
        assert!(matches!(
            read_kallsyms(Path::new("/nonexistent/kallsyms")),
            Err(KernelSymbolsError::Read { .. })
        ));
    }

    /// Lines cut by the chunk boundaries are put back together, and a
    /// last line without its newline counts.
    #[test]
    fn kallsyms_read_in_chunks_keeps_every_line() {
        let mut text = String::new();
        let lines = 3 * KALLSYMS_CHUNK / 40;
        for index in 0..lines {
            text.push_str(&format!(
                "{:016x} T function_{index}\n",
                0x1000 + 16 * index
            ));
        }
        text.push_str(&format!("{:016x} t last_one [module]", 0x1000 + 16 * lines));
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(text.as_bytes()).expect("written");
        let table = read_kallsyms(file.path()).expect("parses");
        assert_eq!(table.len(), lines + 1);
        for index in (0..lines).step_by(997) {
            let symbol = table.lookup(0x1000 + 16 * index as u64).expect("found");
            assert_eq!(symbol.name, format!("function_{index}"));
        }
        let last = table.lookup(0x1000 + 16 * lines as u64 - 8).expect("found");
        assert_eq!(last.name, format!("function_{}", lines - 1));
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
