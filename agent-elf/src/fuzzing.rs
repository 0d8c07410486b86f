//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for ELF
//! objects, and what the other crates' object targets share: the
//! addresses lookups are probed at. Each hands the bytes to the real code
//! and then does with the result what firn does with it, so a malformed
//! input reaches the code that trusts the parse. None may panic, hang or
//! allocate without bound on any input.

use std::{io::Cursor, path::PathBuf, sync::Arc};

use crate::{
    Bytes, ElfLayout,
    debug_files::{self, DebugFileKind},
    gopclntab::GoTable,
    read_layout, read_symbols,
};

/// Addresses probed per segment: enough to reach several functions, few
/// enough to keep an execution fast.
const PROBES: u64 = 32;

/// Link-time addresses spread over the object's load segments, plus their
/// edges: where lookups go in practice.
pub fn probe_addresses(layout: &ElfLayout) -> Vec<u64> {
    let mut addresses = Vec::new();
    for segment in layout.segments.iter().take(8) {
        let step = (segment.file_size / PROBES).max(1);
        for probe in 0..PROBES {
            addresses.push(segment.vaddr.wrapping_add(probe.wrapping_mul(step)));
        }
        addresses.push(segment.vaddr.wrapping_add(segment.file_size));
    }
    addresses.extend([0, 1, u64::MAX]);
    addresses
}

/// The input as the shared bytes tables keep pointing into.
pub fn shared(data: &[u8]) -> Bytes {
    Bytes::new(Arc::new(data.to_vec()))
}

/// An ELF object: its layout (build id, segments, debug link), its symbol
/// tables, Go's own table, and the debug-file checks the symbolizer runs
/// on it.
pub fn elf_object(data: &[u8]) {
    let layout = read_layout(data);
    if let Ok(layout) = &layout {
        for segment in &layout.segments {
            let _ = layout.vaddr_for_file_offset(segment.file_offset);
            let _ = layout.vaddr_for_file_offset(segment.file_offset.wrapping_add(1));
        }
        let directories = [PathBuf::from("/usr/lib/debug")];
        let _ = debug_files::candidates("/usr/bin/app", layout, &directories);
        // The object checked as its own debug file, both ways one is found,
        // from memory and read in pieces as the uploader reads it.
        let mut kinds = vec![DebugFileKind::BuildId];
        kinds.extend(
            layout
                .debug_link
                .as_ref()
                .map(|link| DebugFileKind::DebugLink { crc: link.crc }),
        );
        for kind in kinds {
            let _ = debug_files::matches(layout, kind, data);
            let _ = debug_files::matches_file(layout, kind, Cursor::new(data));
        }
    }
    let addresses = layout.as_ref().map(probe_addresses).unwrap_or_default();
    if let Ok(table) = read_symbols(&shared(data)) {
        for &address in &addresses {
            let _ = table.lookup(address);
        }
    }
    // A Go binary's own table names its functions, files and lines.
    if let Ok(file) = object::File::parse(data)
        && let Some(go) = GoTable::find(&file, data)
    {
        for &address in &addresses {
            let _ = go.function(data, address);
            let _ = go.sp_delta(data, address);
        }
    }
}

#[cfg(test)]
agent_fixtures::replays! { "elf_object" => elf_object }
