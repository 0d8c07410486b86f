//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for the
//! symbolizer's inputs: DWARF, the kernel's notes and symbols, JIT perf
//! maps and jitdump files, mangled names. None may panic, hang or allocate without bound on
//! any input.

use agent_elf::fuzzing::{probe_addresses, shared};

use std::{cell::Cell, io};

use crate::{
    DemangleMode, DwarfInfo, JitTable, Kallsyms, PerfMapSource, PerfMapStat, PerfMapTable,
    demangle, parse_build_id_note, parse_perf_map_line,
};

/// The DWARF budget of the default `--debuginfo-cache-size`.
const DWARF_LIMIT: usize = 16 << 20;

/// The kernel's `/sys/kernel/notes`.
pub fn build_id_note(data: &[u8]) {
    let _ = parse_build_id_note(data);
}

/// DWARF line tables and inline frames of an object.
pub fn dwarf_lines(data: &[u8]) {
    let Ok(mut info) = DwarfInfo::parse(shared(data), DWARF_LIMIT) else {
        return;
    };
    let layout = agent_elf::read_layout(data).unwrap_or_default();
    for address in probe_addresses(&layout) {
        if info.frames(address).is_err() {
            break;
        }
    }
}

/// A JIT perf map (`/tmp/perf-PID.map`), read in two parts as an
/// incremental read would, then looked up at every function it names.
pub fn perf_map(data: &[u8]) {
    let mut table = PerfMapTable::default();
    let split = data.len() / 2;
    let (consumed, _) = table.extend(&data[..split]);
    let _ = table.extend(&data[consumed..]);
    for line in data.split(|&b| b == b'\n') {
        let parsed = std::str::from_utf8(line).ok().and_then(parse_perf_map_line);
        if let Some((start, size, _)) = parsed {
            let _ = table.lookup(start);
            let _ = table.lookup(start.saturating_add(size));
        }
    }
    let _ = table.lookup(0);
    let _ = table.lookup(u64::MAX);
}

/// A file that grows: `len` of `data` is written so far.
struct Growing<'a> {
    data: &'a [u8],
    len: Cell<usize>,
}

impl PerfMapSource for Growing<'_> {
    fn stat(&self) -> io::Result<PerfMapStat> {
        Ok(PerfMapStat {
            identity: (1, 1),
            len: self.len.get() as u64,
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let written = &self.data[..self.len.get()];
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(written.len());
        let read = buf.len().min(written.len() - start);
        buf[..read].copy_from_slice(&written[start..start + read]);
        Ok(read)
    }
}

/// The bound of the default `--perf-map-max-bytes` is larger; a small one
/// here also checks reads that stop at the bound.
const JITDUMP_LIMIT: u64 = 1 << 20;

/// A jitdump file (`/tmp/jit-PID.dump`), as a JIT appends it: read when
/// half of it is written, then whole, then looked up at the addresses
/// its words could be.
pub fn jitdump(data: &[u8]) {
    let file = Growing {
        data,
        len: Cell::new(data.len() / 2),
    };
    let Some(mut table) = JitTable::for_file(&file).or_else(|| {
        file.len.set(data.len());
        JitTable::for_file(&file)
    }) else {
        return;
    };
    let _ = table.refresh(&file, JITDUMP_LIMIT);
    file.len.set(data.len());
    let _ = table.refresh(&file, JITDUMP_LIMIT);
    let _ = table.refresh(&file, JITDUMP_LIMIT);
    for word in data.chunks_exact(8).take(512) {
        let address = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let _ = table.lookup(address);
    }
    let _ = table.lookup(0);
    let _ = table.lookup(u64::MAX);
}

/// `/proc/kallsyms`.
pub fn kallsyms(data: &[u8]) {
    let Ok(table) = Kallsyms::parse_bytes(data) else {
        return;
    };
    if let Some((low, high)) = table.range() {
        for address in [low, low.wrapping_add(1), high.wrapping_sub(1), high] {
            let _ = table.lookup(address);
        }
    }
    let _ = table.lookup(0);
    let _ = table.lookup(u64::MAX);
}

/// A symbol name from an object or a perf map, demangled every way.
pub fn demangle_name(data: &[u8]) {
    if let Ok(name) = std::str::from_utf8(data) {
        for mode in [
            DemangleMode::Simplified,
            DemangleMode::Templates,
            DemangleMode::Full,
        ] {
            let _ = demangle(name, mode);
        }
    }
}

#[cfg(test)]
agent_fixtures::replays! {
    "build_id_note" => build_id_note,
    "dwarf_lines" => dwarf_lines,
    "perf_map" => perf_map,
    "jitdump" => jitdump,
    "kallsyms" => kallsyms,
    "demangle" => demangle_name,
}
