//! The symbolizer on checked-in fixtures (see fixtures/README.md) and on
//! corrupt copies of them: no root, no compiler, no file opened.

use object::{Object, ObjectSection, ObjectSymbol};

use super::*;
use crate::perfmap::MemoryPerfMap;

mod against_addr2line;
mod dwarf_cache;

const INLINE_CHAIN: &[u8] = agent_fixtures::INLINE_CHAIN;
const INLINE_CHAIN_STRIPPED: &[u8] = agent_fixtures::INLINE_CHAIN_STRIPPED;
const INLINE_CHAIN_DEBUG: &[u8] = agent_fixtures::INLINE_CHAIN_DEBUG;
const INLINE_CHAIN_COMPRESSED: &[u8] = agent_fixtures::INLINE_CHAIN_COMPRESSED;
const TEMPLATES: &[u8] = agent_fixtures::TEMPLATES;
const LOCAL_CLASS: &[u8] = agent_fixtures::LOCAL_CLASS;
const NESTED: &[u8] = agent_fixtures::NESTED;
const SOURCE: &str = include_str!("../../tests/workloads/inline_chain.c");

/// The 1-based line of `inline_chain.c` holding `marker`.
fn line_of(marker: &str) -> u32 {
    SOURCE
        .lines()
        .position(|line| line.contains(marker))
        .map(|index| index as u32 + 1)
        .unwrap_or_else(|| panic!("no `{marker}` in inline_chain.c"))
}

/// Start and size of a function symbol.
fn function_range(elf: &[u8], name: &str) -> (u64, u64) {
    let file = object::File::parse(elf).expect("fixture parses");
    file.symbols()
        .find(|s| s.name() == Ok(name))
        .map(|s| (s.address(), s.size()))
        .unwrap_or_else(|| panic!("{name} not in the fixture"))
}

/// An object in memory, with its debug file candidates.
struct FixtureObject {
    key: ObjectKey,
    layout: ElfLayout,
    bytes: Bytes,
    debug_files: Vec<(DebugFileKind, &'static [u8])>,
}

impl ObjectSource for FixtureObject {
    fn key(&self) -> ObjectKey {
        self.key
    }

    fn path(&self) -> &str {
        "/fixtures/object"
    }

    fn layout(&self) -> &ElfLayout {
        &self.layout
    }

    fn bytes(&self) -> io::Result<Bytes> {
        Ok(self.bytes.clone())
    }

    fn debug_files(&self) -> usize {
        self.debug_files.len()
    }

    fn debug_file(&self, index: usize) -> io::Result<DebugFileBytes> {
        let (kind, bytes) = self.debug_files.get(index).ok_or(io::ErrorKind::NotFound)?;
        Ok(DebugFileBytes {
            kind: *kind,
            path: "/fixtures/debug".into(),
            bytes: Bytes::from_static(bytes),
        })
    }
}

fn object(inode: u64, bytes: &[u8]) -> FixtureObject {
    FixtureObject {
        key: ObjectKey::File { dev: 1, inode },
        layout: agent_elf::read_layout(bytes).expect("fixture"),
        bytes: Bytes::new(Arc::new(bytes.to_vec())),
        debug_files: Vec::new(),
    }
}

fn symbolizer_with(config: &SymbolConfig) -> Symbolizer {
    Symbolizer::new(config, None, None)
}

fn fresh() -> Symbolizer {
    symbolizer_with(&SymbolConfig::default())
}

fn demangling(demangle: DemangleMode) -> SymbolConfig {
    SymbolConfig {
        demangle,
        ..SymbolConfig::default()
    }
}

/// (function, line) of each frame, innermost first.
fn frames(lines: &[Line]) -> Vec<(String, Option<u32>)> {
    lines.iter().map(|l| (l.function.clone(), l.line)).collect()
}

/// Every address of `function` symbolized.
fn sweep(symbolizer: &mut Symbolizer, object: &FixtureObject, function: &str) -> Vec<Vec<Line>> {
    let (start, size) = function_range(INLINE_CHAIN, function);
    (start..start + size)
        .map(|vaddr| symbolizer.user(object, vaddr))
        .collect()
}

#[test]
fn inline_frames_come_innermost_first_with_files_and_lines() {
    let mut symbolizer = fresh();
    let object = object(1, INLINE_CHAIN);
    let leaf = sweep(&mut symbolizer, &object, "burn_leaf");
    let (begin, end) = (line_of("begin:mix_step"), line_of("end:mix_step"));
    let inlined: Vec<&Vec<Line>> = leaf.iter().filter(|lines| lines.len() == 2).collect();
    assert!(inlined.len() >= 5, "most of the loop is mix_step: {leaf:?}");
    for lines in &inlined {
        assert_eq!(lines[0].function, "mix_step");
        let line = lines[0].line.expect("a line");
        assert!((begin..=end).contains(&line), "mix_step line {line}");
        assert_eq!(
            (lines[1].function.as_str(), lines[1].line),
            ("burn_leaf", Some(line_of("line:burn_leaf"))),
            "the caller frame is the call site"
        );
        for line in lines.iter() {
            let file = line.file.as_deref().expect("a file");
            assert!(file.ends_with("tests/workloads/inline_chain.c"), "{file}");
        }
    }
    assert!(
        leaf.iter()
            .all(|lines| lines.last().is_some_and(|l| l.function == "burn_leaf")),
        "every address of burn_leaf ends in burn_leaf: {leaf:?}"
    );

    for caller in ["level_three", "level_two", "level_one"] {
        let swept = sweep(&mut symbolizer, &object, caller);
        assert!(
            swept
                .iter()
                .all(|lines| lines.len() == 1 && lines[0].function == caller)
        );
        let call = Some(line_of(&format!("line:{caller}")));
        assert!(
            swept.iter().any(|lines| lines[0].line == call),
            "{caller} has its call line {call:?}: {:?}",
            swept.iter().map(|l| frames(l)).collect::<Vec<_>>()
        );
    }
    let counts = symbolizer.take_counts();
    assert_eq!(counts.debuginfo.misses, 1, "one context per object");
    assert!(counts.debuginfo.hits > 10);
    assert_eq!(counts.dwarf_errors, 0);
    assert_eq!(
        counts.symbols.misses, 0,
        "DWARF named everything, the symbol table was not needed"
    );
}

#[test]
fn stripped_binary_gets_names_and_lines_from_its_debug_file() {
    let mut symbolizer = fresh();
    let full = sweep(&mut symbolizer, &object(1, INLINE_CHAIN), "burn_leaf");

    let mut stripped = object(2, INLINE_CHAIN_STRIPPED);
    assert!(!stripped.layout.has_debug_info && !stripped.layout.has_symtab);
    let link = stripped.layout.debug_link.clone().expect("a debuglink");
    assert_eq!(link.name, "inline_chain.debug");
    // A stale candidate first: another program's debug file.
    stripped.debug_files = vec![
        (DebugFileKind::BuildId, agent_fixtures::CHAIN),
        (
            DebugFileKind::DebugLink { crc: link.crc },
            INLINE_CHAIN_DEBUG,
        ),
    ];
    assert_eq!(sweep(&mut symbolizer, &stripped, "burn_leaf"), full);
    // Code without DWARF (crt) is named from the debug file's .symtab.
    let (helper, _) = function_range(INLINE_CHAIN, "deregister_tm_clones");
    assert_eq!(
        frames(&symbolizer.user(&stripped, helper)),
        [("deregister_tm_clones".to_owned(), None)]
    );
    let counts = symbolizer.take_counts();
    assert_eq!(
        (counts.debug_files_found, counts.debug_files_rejected),
        (1, 1),
        "checked once, remembered"
    );

    // Another copy of the binary (same build id) shares what was read.
    let copy = object(3, INLINE_CHAIN_STRIPPED);
    assert_eq!(sweep(&mut symbolizer, &copy, "burn_leaf"), full);
    // Without its debug file the stripped binary cannot name burn_leaf.
    let mut symbolizer = fresh();
    let (start, _) = function_range(INLINE_CHAIN, "burn_leaf");
    assert!(symbolizer.user(&copy, start).is_empty());
}

#[test]
fn a_debug_file_with_a_wrong_crc_is_rejected() {
    let mut symbolizer = fresh();
    let mut stripped = object(2, INLINE_CHAIN_STRIPPED);
    // Neither build id can be trusted here: no build id on our side.
    stripped.layout.build_id = None;
    let crc = stripped.layout.debug_link.as_ref().expect("link").crc;
    stripped.debug_files = vec![(
        DebugFileKind::DebugLink { crc: crc ^ 1 },
        INLINE_CHAIN_DEBUG,
    )];
    let (start, _) = function_range(INLINE_CHAIN, "burn_leaf");
    assert!(symbolizer.user(&stripped, start).is_empty());
    assert_eq!(symbolizer.take_counts().debug_files_rejected, 1);

    let mut symbolizer = fresh();
    stripped.debug_files = vec![(DebugFileKind::DebugLink { crc }, INLINE_CHAIN_DEBUG)];
    assert_eq!(
        symbolizer
            .user(&stripped, start)
            .last()
            .map(|l| l.function.as_str()),
        Some("burn_leaf")
    );
    assert_eq!(symbolizer.take_counts().debug_files_found, 1);
}

#[test]
fn compressed_dwarf_is_decompressed_within_its_budget() {
    let mut symbolizer = fresh();
    let plain = sweep(&mut symbolizer, &object(1, INLINE_CHAIN), "burn_leaf");
    let compressed = sweep(
        &mut symbolizer,
        &object(2, INLINE_CHAIN_COMPRESSED),
        "burn_leaf",
    );
    assert_eq!(compressed, plain);

    // A budget smaller than the decompressed sections: counted, and the
    // symbol table still names the function.
    let tiny = SymbolConfig {
        debuginfo_cache_bytes: 256,
        ..SymbolConfig::default()
    };
    let mut symbolizer = symbolizer_with(&tiny);
    let (start, _) = function_range(INLINE_CHAIN, "burn_leaf");
    assert_eq!(
        frames(&symbolizer.user(&object(2, INLINE_CHAIN_COMPRESSED), start + 0x20)),
        [("burn_leaf".to_owned(), None)]
    );
    let counts = symbolizer.take_counts();
    assert_eq!((counts.debuginfo_too_large, counts.dwarf_errors), (1, 0));
}

/// Copies of `elf` with the bytes of `section` damaged in several ways.
fn damaged(elf: &[u8], section: &str) -> Vec<Vec<u8>> {
    let file = object::File::parse(elf).expect("fixture parses");
    let Some((offset, size)) = file.section_by_name(section).and_then(|s| s.file_range()) else {
        return Vec::new();
    };
    let (offset, size) = (offset as usize, size as usize);
    let mut copies = Vec::new();
    for stride in [1, 3, 7, 29] {
        let mut copy = elf.to_vec();
        for byte in copy[offset..offset + size].iter_mut().step_by(stride) {
            *byte ^= 0x5a;
        }
        copies.push(copy);
    }
    let mut zeroed = elf.to_vec();
    zeroed[offset..offset + size].fill(0);
    copies.push(zeroed);
    let mut ones = elf.to_vec();
    ones[offset..offset + size].fill(0xff);
    copies.push(ones);
    // The file ends inside the section.
    copies.push(elf[..offset + size / 2].to_vec());
    copies
}

#[test]
fn corrupt_elf_and_dwarf_are_counted_never_a_panic() {
    let (start, size) = function_range(INLINE_CHAIN, "burn_leaf");
    let mut failures = 0;
    let mut inputs = Vec::new();
    for section in [
        ".debug_info",
        ".debug_abbrev",
        ".debug_line",
        ".debug_str",
        ".debug_line_str",
        ".debug_aranges",
        ".debug_rnglists",
        ".symtab",
        ".strtab",
    ] {
        inputs.extend(damaged(INLINE_CHAIN, section));
        inputs.extend(damaged(INLINE_CHAIN_COMPRESSED, section));
    }
    for len in (0..INLINE_CHAIN.len()).step_by(211) {
        inputs.push(INLINE_CHAIN[..len].to_vec());
    }
    for (index, input) in inputs.iter().enumerate() {
        let Ok(layout) = agent_elf::read_layout(input) else {
            continue;
        };
        let object = FixtureObject {
            key: ObjectKey::File {
                dev: 9,
                inode: index as u64,
            },
            layout,
            bytes: Bytes::new(Arc::new(input.clone())),
            debug_files: Vec::new(),
        };
        let mut symbolizer = fresh();
        for vaddr in (start..start + size).chain([0, u64::MAX, 1 << 40]) {
            let _ = symbolizer.user(&object, vaddr);
        }
        let counts = symbolizer.take_counts();
        failures += counts.dwarf_errors + counts.symbol_table_errors;
    }
    assert!(
        failures >= 10,
        "damaged inputs are counted as failures, got {failures} over {} inputs",
        inputs.len()
    );
    for garbage in [&b""[..], b"\x7fELF", &[0xff; 4096]] {
        assert!(DwarfInfo::parse(Bytes::new(Arc::new(garbage.to_vec())), 1 << 20).is_err());
    }
}

/// Functions whose entries lie inside other entries (a class local to a
/// function, a lambda, a GNU C nested function in a block) are found when
/// the unit's functions are gathered, though most of what lies under a
/// function is skipped there.
#[test]
fn functions_defined_inside_other_entries_are_named_from_dwarf() {
    for (elf, symbol, name, source) in [
        (
            LOCAL_CLASS,
            "_ZZ5scaleiENK5Local5applyEi",
            "apply",
            "local_class.cpp",
        ),
        (
            LOCAL_CLASS,
            "_ZZ5scaleiENKUliE_clEi",
            "operator()",
            "local_class.cpp",
        ),
        (NESTED, "inner.0", "inner", "nested.c"),
    ] {
        let (start, _) = function_range(elf, symbol);
        let mut dwarf = DwarfInfo::parse(Bytes::new(Arc::new(elf.to_vec())), 1 << 20)
            .expect("the fixture's DWARF");
        let frames = dwarf.frames(start + 4).expect("a lookup");
        let outer = frames
            .last()
            .unwrap_or_else(|| panic!("{symbol}: no frames"));
        assert_eq!(outer.name.as_deref(), Some(name), "{symbol}");
        assert!(
            outer
                .file
                .as_deref()
                .is_some_and(|file| file.ends_with(source)),
            "{symbol}: {:?}",
            outer.file
        );
    }
}

#[test]
fn cpp_names_follow_the_demangle_mode() {
    let mangled = "_ZN4firn11AccumulatorImE3addEmi";
    let (start, _) = function_range(TEMPLATES, mangled);
    for (mode, expected) in [
        (DemangleMode::None, mangled),
        (DemangleMode::Simplified, "firn::Accumulator::add"),
        (
            DemangleMode::Full,
            "firn::Accumulator<unsigned long>::add(unsigned long, int)",
        ),
    ] {
        let mut symbolizer = symbolizer_with(&demangling(mode));
        let lines = symbolizer.user(&object(1, TEMPLATES), start + 4);
        let outer = lines.last().expect("symbolized");
        assert_eq!(outer.function, expected, "{mode:?}");
        assert_eq!(outer.system_name, mangled, "{mode:?}");
        assert!(outer.line.is_some());
    }
}

#[test]
fn jit_frames_come_from_the_perf_map_and_its_growth() {
    let mut symbolizer = fresh();
    let map = MemoryPerfMap::default();
    map.append(b"7f0000001000 100 JS:*hotLoop /app.js:1:17\ngarbage\n");
    let name = |line: Option<Line>| line.map(|l| l.function);
    assert_eq!(
        name(symbolizer.jit(&map, 0x7f00_0000_1010)),
        Some("JS:*hotLoop /app.js:1:17".to_owned())
    );
    assert_eq!(name(symbolizer.jit(&map, 0x7f00_0000_2010)), None);
    map.append(b"7f0000002000 80 JS:*later /app.js:9:1\n");
    assert_eq!(
        name(symbolizer.jit(&map, 0x7f00_0000_2010)),
        Some("JS:*later /app.js:9:1".to_owned()),
        "a miss re-reads what was appended"
    );
    let counts = symbolizer.take_counts();
    assert_eq!(counts.perf_map_parse_errors, 1);
    assert_eq!((counts.perf_maps.misses, counts.perf_maps.hits), (1, 2));
}

/// Processes map one object through files of their own (another mount
/// namespace, another inode); the same build id is the same object: its
/// DWARF and symbols are read once, whatever the process.
#[test]
fn one_object_mapped_by_many_processes_is_read_once() {
    let mut symbolizer = fresh();
    let (leaf, _) = function_range(INLINE_CHAIN, "burn_leaf");
    let first = symbolizer.user(&object(1, INLINE_CHAIN), leaf);
    assert!(!first.is_empty());
    for inode in 2..50 {
        assert_eq!(symbolizer.user(&object(inode, INLINE_CHAIN), leaf), first);
        if inode % 10 == 0 {
            symbolizer.end_of_profile();
        }
    }
    let counts = symbolizer.take_counts();
    assert_eq!((counts.debuginfo.misses, counts.debuginfo.hits), (1, 48));
    assert_eq!(counts.debuginfo.evictions, 0);
}

#[test]
fn kernel_frames_need_kallsyms() {
    let mut symbolizer = fresh();
    assert!(
        symbolizer.kernel(0xffffffff81000000).is_none(),
        "no kallsyms loaded"
    );
}

/// The units `.debug_aranges` lists count before anything large is
/// inflated: an object over the limit is refused at that bound, which the
/// full estimate never undercuts.
#[test]
fn dwarf_over_the_limit_is_refused_before_its_sections_are_inflated() {
    let file = object::File::parse(INLINE_CHAIN_COMPRESSED).expect("fixture parses");
    let endian = gimli::RunTimeEndian::Little;
    assert_eq!(crate::dwarf::listed_units(&file, endian), 1);
    let bound = crate::dwarf::full_cost_lower_bound(&file, endian);
    let parse = |limit| {
        DwarfInfo::parse(
            Bytes::new(Arc::new(INLINE_CHAIN_COMPRESSED.to_vec())),
            limit,
        )
    };
    let full = parse(usize::MAX).expect("parses").shape().full_cost() as u64;
    assert!(bound <= full, "{bound} > {full}");
    match parse(bound as usize - 1) {
        Err(DwarfError::TooLarge { bytes, .. }) => assert_eq!(bytes, bound),
        other => panic!("not refused at the bound: {other:?}"),
    }
}

/// A Go binary is named by its `.gopclntab`, file and line included, and
/// its 4,000-entry symbol table is never read: a lookup is a search in the
/// mapped table.
#[test]
fn go_functions_are_named_by_the_go_table_with_file_and_line() {
    let data = agent_fixtures::inflate(agent_fixtures::GO_CHAIN_PCLNTAB_EXTRACT)
        .expect("go_chain extract");
    let (address, size) = function_range(&data, "main.level_three");
    let go = object(41, &data);
    let mut symbolizer = fresh();
    for vaddr in [address, address + size / 2] {
        let lines = symbolizer.user(&go, vaddr);
        let [line] = lines.as_slice() else {
            panic!("one frame expected: {lines:?}");
        };
        assert_eq!(line.function, "main.level_three");
        assert!(
            line.file
                .as_deref()
                .is_some_and(|f| f.ends_with("/main.go")),
            "{line:?}"
        );
        assert!(line.line.is_some_and(|l| l > 0), "{line:?}");
    }
    assert!(
        symbolizer.cache_bytes().symbols < 4096,
        "no symbol table held: {:?}",
        symbolizer.cache_bytes().symbols
    );
}

/// Bytes in memory that count the releases of their pages.
struct CountedBytes {
    bytes: Vec<u8>,
    releases: std::sync::atomic::AtomicUsize,
}

impl AsRef<[u8]> for CountedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl agent_elf::SharedBytes for CountedBytes {
    fn release_pages(&self) {
        self.releases
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A large DWARF (this test's own debug build, many MB of `.debug_info`)
/// lets its pages go after every lookup that parsed a unit, not only after
/// a MiB of units: the names one unit's functions read lie all over
/// `.debug_str`.
#[test]
fn a_large_dwarf_lets_its_pages_go_after_each_unit_parsed() {
    use std::sync::atomic::Ordering;
    let exe = std::fs::read(std::env::current_exe().expect("the test binary")).expect("readable");
    let file = object::File::parse(&*exe).expect("ELF");
    let info = file
        .section_by_name(".debug_info")
        .map_or(0, |section| section.size());
    assert!(
        info >= 4 << 20,
        "the test binary has {info} bytes of .debug_info: build the tests with debug info"
    );
    // Functions of two crates (not generic: those are instantiated in the
    // caller's units): at least two units, each parsed by its lookup.
    let addresses_of = |prefix: &str| {
        file.symbols()
            .filter(|symbol| {
                symbol.kind() == object::SymbolKind::Text
                    && symbol.address() != 0
                    && symbol.name().is_ok_and(|name| name.starts_with(prefix))
            })
            .map(|symbol| symbol.address())
            .take(20)
            .collect::<Vec<_>>()
    };
    let addresses = [
        addresses_of("_ZN5gimli"),
        addresses_of("_ZN15agent_symbolize"),
    ]
    .concat();
    let counted = Arc::new(CountedBytes {
        bytes: exe.clone(),
        releases: Default::default(),
    });
    let mut dwarf = DwarfInfo::parse(Bytes::new(counted.clone()), 1 << 30).expect("indexed");
    let mut units_parsed = 0;
    for address in addresses {
        let before = counted.releases.load(Ordering::Relaxed);
        let frames = dwarf.frames(address).expect("a lookup");
        assert!(!frames.is_empty(), "{address:#x} is in a unit");
        let parsed = dwarf.take_unit_counts().parsed;
        units_parsed += parsed;
        let released = counted.releases.load(Ordering::Relaxed) > before;
        // A unit parsed lets its pages go; one parsed before has nothing to.
        assert_eq!(
            released,
            parsed > 0,
            "pages let go after a lookup at {address:#x} that parsed {parsed} units"
        );
    }
    assert!(units_parsed >= 2, "the lookups parsed {units_parsed} units");
}
