//! Entry points of the fuzz targets in `fuzz/` (`cargo xtask fuzz`), one per
//! parser fed by data another process controls. Each hands the bytes to the
//! real code path and then does with the result what firn's callers do
//! (lookups, checks), so a malformed input reaches the code that trusts the
//! parse. Built for the fuzz crate (feature `fuzzing`) and for the unit
//! tests, which replay every stored crash input (`fuzz/regressions/`).
//!
//! None may panic, hang or allocate without bound on any input.

use std::{
    cell::RefCell,
    path::{Path, PathBuf},
    sync::Arc,
};

use agent_common::UserRegs;

use crate::{
    config_file::ConfigFile,
    labels::relabel::{LabelSet, relabel},
    sampler,
};
use agent_config::pod::{PodInfo, PodObject};
use agent_elf::{
    self as elf, Bytes, ElfLayout,
    debug_files::{self, DebugFileKind},
    gopclntab::GoTable,
};
use agent_proc::{
    cgroup::CgroupInfo,
    maps::{self, parse_maps},
    mountinfo::FuseMounts,
};
use agent_symbolize::{
    DemangleMode, DwarfInfo, Kallsyms, PerfMapTable, demangle, parse_build_id_note,
    parse_perf_map_line,
};
use agent_unwind::{
    self as unwind, CfiContext, CfiSource, Code, CodeLookup, MAX_USER_FRAMES, StackCopy,
    repair_leaf, stitch, testing::FixtureCode,
};

/// A fuzz target: its name (the binary in `fuzz/fuzz_targets/` and the
/// directory of its corpus and regressions) and its entry point.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
}

/// Every target; `cargo xtask fuzz` and the regression replay use this list.
pub const TARGETS: &[Target] = &[
    Target {
        name: "elf_object",
        run: elf_object,
    },
    Target {
        name: "python_object",
        run: python_object,
    },
    Target {
        name: "python_frame",
        run: python_frame,
    },
    Target {
        name: "build_id_note",
        run: build_id_note,
    },
    Target {
        name: "dwarf_lines",
        run: dwarf_lines,
    },
    Target {
        name: "cfi_rows",
        run: cfi_rows,
    },
    Target {
        name: "unwind_stack",
        run: unwind_stack,
    },
    Target {
        name: "perf_map",
        run: perf_map,
    },
    Target {
        name: "proc_maps",
        run: proc_maps,
    },
    Target {
        name: "cgroup",
        run: cgroup,
    },
    Target {
        name: "mountinfo",
        run: mountinfo,
    },
    Target {
        name: "kallsyms",
        run: kallsyms,
    },
    Target {
        name: "ring_record",
        run: ring_record,
    },
    Target {
        name: "config_file",
        run: config_file,
    },
    Target {
        name: "relabel",
        run: relabel_labels,
    },
    Target {
        name: "kubernetes_pod",
        run: kubernetes_pod,
    },
    Target {
        name: "demangle",
        run: demangle_name,
    },
];

/// The DWARF budget of the default `--debuginfo-cache-size`.
const DWARF_LIMIT: usize = 16 << 20;

/// Addresses probed per object: enough to reach several functions, few
/// enough to keep an execution fast.
const PROBES: u64 = 32;

/// Link-time addresses spread over the object's load segments, plus their
/// edges: where lookups go in practice.
fn probe_addresses(layout: &ElfLayout) -> Vec<u64> {
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

fn shared(data: &[u8]) -> Bytes {
    Bytes::new(Arc::new(data.to_vec()))
}

/// An ELF object: its layout (build id, segments, debug link), its symbol
/// tables, and the debug-file checks the symbolizer runs on it.
pub fn elf_object(data: &[u8]) {
    let layout = elf::read_layout(data);
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
            let _ = debug_files::matches_file(layout, kind, std::io::Cursor::new(data));
        }
    }
    let _ = unwind::is_go(data);
    let addresses = layout.as_ref().map(probe_addresses).unwrap_or_default();
    if let Ok(table) = elf::read_symbols(&shared(data)) {
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

/// The kernel's `/sys/kernel/notes`.
pub fn build_id_note(data: &[u8]) {
    let _ = parse_build_id_note(data);
}

/// DWARF line tables and inline frames of an object.
pub fn dwarf_lines(data: &[u8]) {
    let Ok(mut info) = DwarfInfo::parse(shared(data), DWARF_LIMIT) else {
        return;
    };
    let layout = elf::read_layout(data).unwrap_or_default();
    for address in probe_addresses(&layout) {
        if info.frames(address).is_err() {
            break;
        }
    }
}

/// An object's CFI: rows at addresses across its code, and the survey of
/// whether it keeps frame pointers.
pub fn cfi_rows(data: &[u8]) {
    let Ok(source) = CfiSource::new(data) else {
        return;
    };
    let mut context = CfiContext::new();
    let layout = elf::read_layout(data).unwrap_or_default();
    for address in probe_addresses(&layout) {
        let _ = source.row(address, &mut context);
    }
    let _ = unwind::survey(&source, &mut context);
}

thread_local! {
    /// The sample the unwinder's fixture tests use: `chain_inline` (no
    /// frame pointers) and the maps of the process it was captured from.
    static FIXTURE_CODE: RefCell<Option<FixtureCode>> = RefCell::new(FixtureCode::chain_inline());
}

/// Size of the registers at the start of an `unwind_stack` input.
const REGS_BYTES: usize = 24;

fn le_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

/// A sample's registers (`ip`, `sp`, `bp`, little-endian) followed by its
/// stack copy, unwound against the fixture's real CFI the way the agent
/// does: the DWARF unwind, the join with a frame-pointer walk, leaf repair.
pub fn unwind_stack(data: &[u8]) {
    let Some((regs, stack)) = data.split_at_checked(REGS_BYTES) else {
        return;
    };
    let regs = UserRegs {
        ip: le_u64(regs),
        sp: le_u64(&regs[8..]),
        bp: le_u64(&regs[16..]),
    };
    FIXTURE_CODE.with_borrow_mut(|code| {
        let Some(code) = code else { return };
        let mut frames = Vec::new();
        let copy = StackCopy {
            sp: regs.sp,
            bytes: stack,
        };
        unwind::unwind(regs, copy, code, MAX_USER_FRAMES, &mut frames);
        assert!(
            !frames.is_empty() && frames.len() <= MAX_USER_FRAMES,
            "{} frames",
            frames.len()
        );
        // A walk from the same words, as if the kernel had followed them.
        let walk: Vec<u64> = stack.chunks_exact(8).take(16).map(le_u64).collect();
        let mut joined = frames.clone();
        stitch(&mut joined, &walk);
        assert!(joined.len() <= MAX_USER_FRAMES);
        if let Code::Row { row, .. } = code.code(regs.ip) {
            let mut walk = walk;
            walk.insert(0, regs.ip);
            repair_leaf(&mut walk, &row, (regs.ip, regs.sp, regs.bp), stack);
        }
    });
}

/// An object a process maps, looked at as a CPython interpreter and as a
/// libc (`pthread_getspecific`), then asked for a walker layout.
pub fn python_object(data: &[u8]) {
    use agent_runtimes::{libc::glibc_thread_specific_offset, python};
    let _ = glibc_thread_specific_offset(data);
    for name in ["libpython3.11.so.1.0", "python3.8", "python"] {
        if let Ok(Some(object)) = python::inspect_object(name, data) {
            let _ = python::walker_layout(object.version, object.runtime, object.code_type, 0x310);
        }
    }
}

/// A process's memory as a hostile process leaves it: a sampled frame's
/// code object, its strings and line table, all at will. The first bytes
/// choose the version and the sampled fields; the rest is memory from
/// `PYTHON_MEMORY_BASE` on. Named twice: the second time from the cache.
pub fn python_frame(data: &[u8]) {
    use agent_common::InterpreterFrame;
    use agent_runtimes::{
        Memory, MemoryError,
        python::{self, PythonNamer, PythonVersion},
    };
    const PYTHON_MEMORY_BASE: u64 = 0x10_0000;
    struct Flat<'a>(&'a [u8]);
    impl Memory for Flat<'_> {
        fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
            let fail = || MemoryError {
                address,
                length: buf.len(),
                source: None,
            };
            let start = usize::try_from(address.checked_sub(PYTHON_MEMORY_BASE).ok_or_else(fail)?)
                .map_err(|_| fail())?;
            let bytes = start
                .checked_add(buf.len())
                .and_then(|end| self.0.get(start..end))
                .ok_or_else(fail)?;
            buf.copy_from_slice(bytes);
            Ok(())
        }
    }
    let Some((head, memory)) = data.split_first_chunk::<24>() else {
        return;
    };
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
    let version = PythonVersion {
        major: 3,
        minor: 8 + head[0] % 6,
        patch: 0,
    };
    let code = PYTHON_MEMORY_BASE + (word(0) >> 8) % 4096;
    // The stamp as the BPF walker would have read it, so that inputs get
    // past the staleness check to the decoding behind it.
    let stamp_at = python::walker_layout(version, 0, 0, 0)
        .map(|layout| code + u64::from(layout.code_stamp))
        .unwrap_or(code);
    let mut stamp = [0u8; 8];
    let stamp = match Flat(memory).read(stamp_at, &mut stamp) {
        Ok(()) => u64::from_le_bytes(stamp),
        Err(_) => word(8),
    };
    let frame = InterpreterFrame {
        code,
        stamp,
        instruction: word(16),
        flags: 0,
        reserved: 0,
    };
    let mut namer = PythonNamer::new(64 << 10);
    for _ in 0..2 {
        let _ = namer.name(1, version, &mut Flat(memory), &frame);
    }
    let _ = namer.take_counts();
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

/// `/proc/PID/maps`, and the lookups of a process image built from it.
pub fn proc_maps(data: &[u8]) {
    let Ok(specs) = parse_maps(1, data) else {
        return;
    };
    let probes: Vec<u64> = specs
        .iter()
        .flat_map(|spec| [spec.start, spec.end, spec.end.wrapping_sub(1)])
        .collect();
    for address in probes {
        let _ = maps::mapping_index(&specs, address);
    }
    let _ = maps::executable(&specs);
}

/// `/proc/PID/cgroup`.
pub fn cgroup(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = CgroupInfo::parse(text);
    }
}

/// `/proc/PID/mountinfo`: mount points are names a process chooses.
pub fn mountinfo(data: &[u8]) {
    let mounts = FuseMounts::parse(&String::from_utf8_lossy(data));
    for path in [
        "/",
        "/usr/lib/debug/.build-id/ab/cd.debug",
        "tmp/perf-1.map",
    ] {
        let _ = mounts.covers(Path::new(path));
    }
    let _ = mounts.has_device(0);
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

/// One BPF ring buffer record.
pub fn ring_record(data: &[u8]) {
    let _ = sampler::decode(data);
}

/// The labels a process typically has when the relabel rules run.
fn typical_labels() -> LabelSet {
    [
        ("comm", "java"),
        ("executable", "/usr/bin/java"),
        ("pid", "4242"),
        ("cgroup", "/system.slice/app.service"),
        ("systemd_unit", "app.service"),
        ("__meta_kubernetes_pod_label_app", "checkout"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .collect()
}

fn rules_of(text: &str) -> Vec<crate::labels::relabel::Rule> {
    let path = Path::new("firn.yaml");
    ConfigFile::parse(text, path)
        .and_then(|config| config.relabel_rules(path))
        .unwrap_or_default()
}

/// The `--config-path` file, its relabel rules applied to typical labels.
pub fn config_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let rules = rules_of(text);
    let _ = relabel(&rules, typical_labels());
}

/// Relabel rules (a config file) and the labels they rewrite (label values
/// come from processes: names, cgroup paths, pod labels): the config, a NUL
/// byte, then `name=value` lines.
pub fn relabel_labels(data: &[u8]) {
    let (config, labels) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let Ok(config) = std::str::from_utf8(config) else {
        return;
    };
    let rules = rules_of(config);
    let mut set = typical_labels();
    for line in String::from_utf8_lossy(labels).lines() {
        if let Some((name, value)) = line.split_once('=') {
            set.insert(name.to_owned(), value.to_owned());
        }
    }
    let _ = relabel(&rules, set);
}

/// Kubernetes API answers as kube parses them (a pod list, a watch event
/// line), then firn's reading of each pod in them.
pub fn kubernetes_pod(data: &[u8]) {
    use kube::core::{ObjectList, WatchEvent};

    if let Ok(list) = serde_json::from_slice::<ObjectList<PodObject>>(data) {
        for pod in list.items {
            let _ = PodInfo::try_from(pod);
        }
    }
    if let Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod) | WatchEvent::Deleted(pod)) =
        serde_json::from_slice::<WatchEvent<PodObject>>(data)
    {
        let _ = PodInfo::try_from(pod);
    }
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
mod tests {
    use std::fs;

    use super::*;

    fn fuzz_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
    }

    /// Every crash the fuzzers found, stored under
    /// `fuzz/regressions/<target>/`, runs through its target again.
    #[test]
    fn stored_crash_inputs_no_longer_fail() {
        let regressions = fuzz_dir().join("regressions");
        let Ok(directories) = fs::read_dir(&regressions) else {
            return;
        };
        let mut failing = Vec::new();
        for directory in directories {
            let directory = directory.expect("readable directory").path();
            if !directory.is_dir() {
                continue;
            }
            let name = directory.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let target = TARGETS
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("{} names no fuzz target", directory.display()));
            for input in fs::read_dir(&directory).expect("readable directory") {
                let path = input.expect("readable entry").path();
                let data = fs::read(&path).expect("readable input");
                let replay = std::panic::AssertUnwindSafe(|| (target.run)(&data));
                if std::panic::catch_unwind(replay).is_err() {
                    failing.push(path.display().to_string());
                }
            }
        }
        assert!(failing.is_empty(), "still failing: {failing:#?}");
    }

    /// The committed seeds run too: a target that fails on its own seeds
    /// is caught without a fuzzer.
    #[test]
    fn seed_corpora_run_cleanly() {
        for target in TARGETS {
            let corpus = fuzz_dir().join("corpus").join(target.name);
            let inputs = fs::read_dir(&corpus)
                .unwrap_or_else(|_| panic!("{} has no seed corpus", target.name));
            for input in inputs {
                let data = fs::read(input.expect("readable entry").path()).expect("readable");
                (target.run)(&data);
            }
        }
    }

    #[test]
    fn the_unwind_fixture_loads() {
        assert!(FixtureCode::chain_inline().is_some());
    }
}
