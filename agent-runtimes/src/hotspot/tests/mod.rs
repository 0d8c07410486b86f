//! The HotSpot reader replayed over the memory it read of live JVMs
//! (`agent_fixtures::hotspot`), against what the JVM's own tables said
//! (dumped apart from firn) and the lines of `Chain.java`.

use agent_fixtures::{
    hotspot::{CAPTURES, CHAIN_SOURCE, JvmCapture},
    memory::Regions,
};

use super::*;
use crate::{Memory, MemoryError};

struct Replay(Regions);

impl Memory for Replay {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        crate::read_captured(&self.0, address, buf)
    }
}

impl Replay {
    fn write(&mut self, address: u64, data: &[u8]) {
        assert!(
            self.0.get(address, data.len()).is_some(),
            "{address:#x} was not captured"
        );
        self.0.add(address, data);
    }
}

struct Loaded {
    memory: Replay,
    symbols: JvmObject,
    nmethods: Vec<u64>,
    stacks: Vec<Stopped>,
}

/// The Java main thread stopped in the chain: its registers and the part
/// of its stack the capture's unwind read, from `sp` up.
struct Stopped {
    ip: u64,
    sp: u64,
    bp: u64,
    stack: Vec<u8>,
}

fn load(capture: &JvmCapture) -> Loaded {
    let memory = Replay(Regions::parse(capture.memory).expect("the regions parse"));
    let mut symbols = Vec::new();
    let mut nmethods = Vec::new();
    let mut stacks = Vec::new();
    for line in capture.meta.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let hex = |text: &str| u64::from_str_radix(text.trim_start_matches("0x"), 16).expect("hex");
        match fields.as_slice() {
            ["symbol", name, address] => {
                let name = object::SYMBOLS
                    .iter()
                    .find(|known| *known == name)
                    .expect("a known symbol");
                symbols.push((*name, hex(address)));
            }
            ["nmethod", address] => nmethods.push(hex(address)),
            ["stack", ip, sp, bp, bytes] => stacks.push(Stopped {
                ip: hex(ip),
                sp: hex(sp),
                bp: hex(bp),
                stack: (0..bytes.len() / 2)
                    .map(|at| u8::from_str_radix(&bytes[at * 2..at * 2 + 2], 16).expect("hex"))
                    .collect(),
            }),
            _ => panic!("{}: unexpected line {line:?}", capture.name),
        }
    }
    Loaded {
        memory,
        symbols: JvmObject::from_symbols(symbols),
        nmethods,
        stacks,
    }
}

fn layout_of(loaded: &mut Loaded) -> (VmTables, Layout) {
    let tables = VmTables::read(&mut loaded.memory, &loaded.symbols).expect("tables read");
    let layout = Layout::new(&tables).expect("every field firn needs");
    (tables, layout)
}

/// The line of `Chain.java` marked `// line: NAME`.
fn marked_line(name: &str) -> u32 {
    let marker = format!("// line: {name}");
    CHAIN_SOURCE
        .lines()
        .position(|line| line.trim_end().ends_with(&marker))
        .map(|index| index as u32 + 1)
        .unwrap_or_else(|| panic!("no marker {marker}"))
}

/// The captures whose name ends with `suffix` (`c1`, `c2`), one per JDK.
fn captures(suffix: &str) -> impl Iterator<Item = &'static JvmCapture> + '_ {
    CAPTURES
        .iter()
        .filter(move |capture| capture.name.ends_with(suffix))
}

#[test]
#[expect(clippy::too_many_lines, reason = "one assertion per field, by JDK")]
fn tables_give_the_layout_the_jvm_had() {
    use layout::{CodeBounds, DebugPlacement};
    for capture in CAPTURES {
        let mut loaded = load(capture);
        let (tables, layout) = layout_of(&mut loaded);
        let mut major = [0; 4];
        loaded
            .memory
            .read(layout.vm_major_version, &mut major)
            .expect("captured");
        let major = i32::from_le_bytes(major);
        assert_eq!(tables.major_version(), Some(i64::from(major)));
        // What a dump of the same JVM's tables (read with its own reader,
        // not firn's) listed.
        let counts = tables.counts();
        // The same in both JDKs.
        assert_eq!(layout.method_const_method, 0x8);
        assert_eq!(layout.const_method_constants, 0x8);
        assert_eq!(layout.constant_pool_size, 72);
        assert_eq!(layout.constant_pool_holder, 0x18);
        assert_eq!(layout.klass_name, 0x18);
        assert_eq!((layout.symbol_length, layout.symbol_body), (4, 6));
        assert_eq!(layout.has_line_number_table, 1);
        match major {
            17 => {
                assert_eq!(counts, (788, 768, 484), "{}", capture.name);
                assert_eq!(layout.const_method_flags, (0x1c, 2));
                assert_eq!(layout.const_method_name_index, 0x22);
                assert_eq!(layout.const_method_size, 48);
                assert_eq!(layout.method_access_flags, (0x28, 4));
                assert_eq!(layout.code_heap_segmap, 0x78);
                assert_eq!(layout.code_heap_log2_segment_size, 0x100);
                assert_eq!(layout.heap_block_size, 16);
                assert_eq!(layout.heap_block_length, (0, 8));
                assert_eq!(layout.nmethod.method, 0x70);
                assert_eq!(layout.nmethod.comp_level, (0x134, 4));
                assert_eq!(
                    layout.nmethod.debug,
                    DebugPlacement::InBlob {
                        scopes_data_begin: 0x78,
                        scopes_pcs_offset: 0x10c,
                        dependencies_offset: 0x110,
                        metadata_offset: 0x104,
                    }
                );
                assert_eq!(
                    layout.code_bounds,
                    CodeBounds::Addresses {
                        begin: 0x20,
                        end: 0x28
                    }
                );
                assert_eq!(layout.code_blob_kind, None);
                assert_eq!(layout.coding, Coding::Pack200);
            }
            25 => {
                assert_eq!(counts, (585, 335, 443), "{}", capture.name);
                assert_eq!(layout.const_method_flags, (0x1c, 4));
                assert_eq!(layout.const_method_name_index, 0x24);
                assert_eq!(layout.const_method_size, 56);
                assert_eq!(layout.method_access_flags, (0x2c, 2));
                assert_eq!(layout.code_heap_segmap, 0x70);
                assert_eq!(layout.code_heap_log2_segment_size, 0xf8);
                assert_eq!(layout.heap_block_size, 8);
                assert_eq!(layout.heap_block_length, (0, 4));
                assert_eq!(layout.nmethod.method, 0x50);
                assert_eq!(layout.nmethod.comp_level, (0xd8, 1));
                assert_eq!(
                    layout.nmethod.debug,
                    DebugPlacement::Separate {
                        immutable_data: 0x60,
                        immutable_data_size: 0xa0,
                        scopes_pcs_offset: 0xc4,
                        scopes_data_offset: 0xc8,
                        mutable_data: 0x10,
                        mutable_data_size: 0x30,
                        relocation_size: 0x1c,
                    }
                );
                assert_eq!(
                    layout.code_bounds,
                    CodeBounds::Offsets {
                        code: 0x24,
                        data: 0x28
                    }
                );
                assert_eq!(layout.code_blob_kind, Some((0x38, 1)));
                assert_eq!(layout.coding, Coding::NoZeroBytes);
            }
            other => panic!("{}: JDK {other}", capture.name),
        }
    }
}

#[test]
fn a_missing_field_is_named() {
    for capture in CAPTURES {
        a_missing_field_is_named_in(capture);
    }
}

fn a_missing_field_is_named_in(capture: &JvmCapture) {
    let mut loaded = load(capture);
    let (mut tables, _) = layout_of(&mut loaded);
    tables
        .fields
        .remove(&("ConstMethod".to_owned(), "_name_index".to_owned()));
    tables.types.remove("ConstantPool");
    let error = Layout::new(&tables).expect_err("a field is missing");
    let text = error.to_string();
    assert!(text.contains("ConstMethod::_name_index"), "{text}");
    assert!(text.contains("the size of ConstantPool"), "{text}");
    // Without the major version, the streams' coding is unknown.
    tables.major_version = None;
    let text = Layout::new(&tables).expect_err("no version").to_string();
    assert!(text.contains("major version"), "{text}");
}

#[test]
fn uninitialized_tables_are_an_error() {
    let mut loaded = load(&CAPTURES[0]);
    let address = loaded
        .symbols
        .symbol("gHotSpotVMStructs")
        .expect("the symbol");
    loaded.memory.write(address, &[0; 8]);
    let error = VmTables::read(&mut loaded.memory, &loaded.symbols).expect_err("null table");
    assert!(
        matches!(error, TableError::NotInitialized { .. }),
        "{error}"
    );
}

/// Each frame of every pc desc of `nmethod`, named `Class.method:line`,
/// innermost first.
fn scope_names(
    loaded: &mut Loaded,
    layout: &Layout,
    cache: &CodeCache,
    namer: &mut MethodNamer,
    nmethod: u64,
) -> (CodeBlob, Vec<Vec<String>>) {
    let blob = cache
        .find(&mut loaded.memory, layout, nmethod)
        .expect("readable")
        .expect("a blob");
    let debug =
        NmethodDebug::read(&mut loaded.memory, layout, &blob).expect("its debug information");
    let mut all = Vec::new();
    for offset in debug.pc_offsets().collect::<Vec<_>>() {
        let Ok(scopes) = debug.scopes_at(i64::from(offset), true) else {
            continue;
        };
        let names = scopes
            .iter()
            .map(|scope| {
                let (method, _) = namer
                    .method(&mut loaded.memory, layout, scope.method)
                    .expect("named");
                format!("{}:{}", method.function(), method.line(scope.bci))
            })
            .collect::<Vec<_>>();
        if !names.is_empty() {
            all.push(names);
        }
    }
    (blob, all)
}

#[test]
fn compiled_methods_are_found_and_their_scopes_named() {
    let accumulate = format!("Chain.accumulate:{}", marked_line("accumulate") - 1);
    let reconcile = format!("Chain.reconcile:{}", marked_line("reconcile"));
    let settle = format!("Chain.settle:{}", marked_line("settle"));
    for capture in CAPTURES {
        let mut loaded = load(capture);
        let (_, layout) = layout_of(&mut loaded);
        let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
        let mut namer = MethodNamer::new();
        let mut calls = Vec::new();
        for nmethod in loaded.nmethods.clone() {
            let (blob, scopes) = scope_names(&mut loaded, &layout, &cache, &mut namer, nmethod);
            assert!(matches!(blob.kind, BlobKind::Compiled { .. }), "{blob:?}");
            assert_eq!(blob.code.start, nmethod);
            assert!(
                blob.frame_size >= 16 && blob.frame_size % 16 == 0,
                "{blob:?}"
            );
            // An interior pc finds the same blob.
            let inside = cache
                .find(&mut loaded.memory, &layout, nmethod + 0x10)
                .expect("readable")
                .expect("a blob");
            assert_eq!(inside, blob);
            let (method, _) = namer
                .method(&mut loaded.memory, &layout, blob.method)
                .expect("named");
            assert_eq!(&*method.file, "Chain.java");
            assert_eq!(&*method.class, "Chain");
            calls.extend(scopes);
        }
        // The call of accumulate in reconcile in reconcile's own nmethod;
        // inlined, with settle's call of reconcile below it (C1 inlines
        // reconcile into settle; C2 the whole chain, accumulate's back
        // branch the innermost scope).
        let has = |chain: &[&str]| calls.iter().any(|scopes| scopes == chain);
        assert!(has(&[&reconcile]), "{}: {calls:?}", capture.name);
        if capture.name.ends_with("c2") {
            assert!(has(&[&accumulate, &reconcile, &settle]), "{calls:?}");
            assert!(has(&[&accumulate, &reconcile]), "{calls:?}");
        } else {
            assert!(has(&[&reconcile, &settle]), "{calls:?}");
        }
        let counts = namer.take_counts();
        assert!(counts.hits > counts.misses, "{counts:?}");
    }
}

#[test]
fn a_blob_found_again_is_believed_only_while_its_header_says_the_same() {
    for capture in CAPTURES {
        let mut loaded = load(capture);
        let (_, layout) = layout_of(&mut loaded);
        let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
        let nmethod = loaded.nmethods[0];
        let find = |loaded: &mut Loaded, pc: u64| {
            cache
                .find(&mut loaded.memory, &layout, pc)
                .expect("readable")
                .expect("a blob")
        };
        let blob = find(&mut loaded, nmethod);
        assert_eq!(cache.take_counts(), BlobCounts { hits: 0, misses: 1 });
        assert_eq!(find(&mut loaded, nmethod + 0x10), blob);
        assert_eq!(cache.take_counts(), BlobCounts { hits: 1, misses: 0 });
        // Another compilation at the same place: the header says so, and
        // the segment map is walked again.
        let other = blob.compile_id + 1;
        loaded
            .memory
            .write(blob.start + layout.nmethod.compile_id, &other.to_le_bytes());
        let again = find(&mut loaded, nmethod + 0x10);
        assert_eq!(again.compile_id, other, "{}", capture.name);
        assert_eq!(cache.take_counts(), BlobCounts { hits: 0, misses: 1 });
        assert_eq!(find(&mut loaded, nmethod), again);
        assert_eq!(cache.take_counts(), BlobCounts { hits: 1, misses: 0 });
        // Taken unread, then checked with the sample's others.
        let remembered = cache.remembered(nmethod + 0x20).expect("remembered");
        assert_eq!(remembered, again);
        let pcs = [(nmethod + 0x20, &remembered), (nmethod, &remembered)];
        assert_eq!(cache.check(&mut loaded.memory, &layout, &pcs), None);
        assert_eq!(cache.take_counts(), BlobCounts { hits: 2, misses: 0 });
        loaded.memory.write(
            blob.start + layout.nmethod.compile_id,
            &blob.compile_id.to_le_bytes(),
        );
        assert_eq!(cache.check(&mut loaded.memory, &layout, &pcs), Some(0));
        assert_eq!(cache.remembered(nmethod), None, "forgotten");
        assert_eq!(find(&mut loaded, nmethod), blob);
    }
}

/// A method read after a sample is named for it without another read;
/// one read before the sample is read again, and a change found then is
/// the sample's.
#[test]
fn a_method_read_after_the_sample_is_not_read_again() {
    for capture in CAPTURES {
        let mut loaded = load(capture);
        let (_, layout) = layout_of(&mut loaded);
        let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
        let blob = cache
            .find(&mut loaded.memory, &layout, loaded.nmethods[0])
            .expect("readable")
            .expect("a blob");
        let mut namer = MethodNamer::new();
        let (method, _) = namer
            .method_at(&mut loaded.memory, &layout, blob.method, (50, 100))
            .expect("named");
        namer.take_counts();
        // Its Method* reused for another method, but read at 100, after a
        // sample at 90: not read again, so the change is not seen.
        let at = blob.method + layout.method_const_method;
        loaded.memory.write(at, &8u64.to_le_bytes());
        let (again, _) = namer
            .method_at(&mut loaded.memory, &layout, blob.method, (90, 200))
            .expect("believed");
        assert!(std::sync::Arc::ptr_eq(&again, &method));
        assert_eq!(namer.take_counts(), NamerCounts { hits: 1, misses: 0 });
        // A sample at 150, after that read: read again, changed.
        assert!(
            namer
                .method_at(&mut loaded.memory, &layout, blob.method, (150, 200))
                .is_err(),
            "{}",
            capture.name
        );
    }
}

/// A blob read after a sample is believed for it without another read;
/// one last read before the sample is read again, and a change found then
/// is the sample's.
#[test]
fn a_blob_read_after_the_sample_is_not_read_again() {
    for capture in CAPTURES {
        let mut loaded = load(capture);
        let (_, layout) = layout_of(&mut loaded);
        let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
        let nmethod = loaded.nmethods[0];
        let blob = cache
            .find_at(&mut loaded.memory, &layout, nmethod, 100)
            .expect("readable")
            .expect("a blob");
        cache.take_counts();
        let pcs = [(nmethod + 0x10, &blob)];
        // Changed in memory, but read at 100, after a sample at 90: the
        // header is not read again, so the change is not seen.
        let other = blob.compile_id + 1;
        loaded
            .memory
            .write(blob.start + layout.nmethod.compile_id, &other.to_le_bytes());
        assert_eq!(
            cache.check_at(&mut loaded.memory, &layout, &pcs, 90, 200),
            None
        );
        assert_eq!(cache.take_counts(), BlobCounts { hits: 1, misses: 0 });
        assert_eq!(cache.remembered(nmethod), Some(blob.clone()));
        // A sample at 150, after that read: read again, changed.
        assert_eq!(
            cache.check_at(&mut loaded.memory, &layout, &pcs, 150, 200),
            Some(0),
            "{}",
            capture.name
        );
        assert_eq!(cache.remembered(nmethod), None, "forgotten");
        // Checked at 300 as the same: believed for samples up to then.
        loaded.memory.write(
            blob.start + layout.nmethod.compile_id,
            &blob.compile_id.to_le_bytes(),
        );
        let blob = cache
            .find_at(&mut loaded.memory, &layout, nmethod, 250)
            .expect("readable")
            .expect("a blob");
        let pcs = [(nmethod + 0x10, &blob)];
        assert_eq!(
            cache.check_at(&mut loaded.memory, &layout, &pcs, 260, 300),
            None
        );
        loaded
            .memory
            .write(blob.start + layout.nmethod.compile_id, &other.to_le_bytes());
        assert_eq!(
            cache.check_at(&mut loaded.memory, &layout, &pcs, 290, 400),
            None
        );
        assert_eq!(
            cache.check_at(&mut loaded.memory, &layout, &pcs, 310, 400),
            Some(0)
        );
    }
}

#[test]
fn a_method_whose_pool_is_not_its_class_is_refused() {
    for capture in captures("c1") {
        a_method_whose_pool_is_not_its_class_is_refused_in(capture);
    }
}

fn a_method_whose_pool_is_not_its_class_is_refused_in(capture: &JvmCapture) {
    let mut loaded = load(capture);
    let (_, layout) = layout_of(&mut loaded);
    let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
    let nmethod = loaded.nmethods[0];
    let blob = cache
        .find(&mut loaded.memory, &layout, nmethod)
        .expect("readable")
        .expect("a blob");
    let mut namer = MethodNamer::new();
    namer
        .method(&mut loaded.memory, &layout, blob.method)
        .expect("named before");
    // The ConstMethod moved to another pool (the method freed and its
    // memory reused): the class's own pool no longer matches.
    let mut const_method = [0; 8];
    loaded
        .memory
        .read(blob.method + layout.method_const_method, &mut const_method)
        .expect("captured");
    let const_method = u64::from_le_bytes(const_method);
    let at = const_method + layout.const_method_constants;
    let mut pool = [0; 8];
    loaded.memory.read(at, &mut pool).expect("captured");
    let moved = u64::from_le_bytes(pool) + 8;
    loaded.memory.write(at, &moved.to_le_bytes());
    // The cache still answers for the same ConstMethod* (a change of the
    // pointer itself is what it checks) ...
    assert!(
        namer
            .method(&mut loaded.memory, &layout, blob.method)
            .is_ok()
    );
    // ... a fresh namer refuses.
    let error = MethodNamer::new()
        .method(&mut loaded.memory, &layout, blob.method)
        .expect_err("refused");
    assert!(
        error.to_string().contains("not its class's") || matches!(error, HotSpotError::Read { .. }),
        "{error}"
    );
}

#[test]
fn pcs_outside_the_code_cache_find_nothing() {
    let mut loaded = load(&CAPTURES[3]);
    let (_, layout) = layout_of(&mut loaded);
    let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
    assert!(!cache.contains(0x1000));
    assert_eq!(
        cache
            .find(&mut loaded.memory, &layout, 0x1000)
            .expect("no read"),
        None
    );
}
mod unwind;

#[test]
fn hostile_pointers_and_tables_are_errors_not_panics() {
    for capture in CAPTURES {
        hostile_pointers_and_tables_are_errors_not_panics_in(capture);
    }
}

fn hostile_pointers_and_tables_are_errors_not_panics_in(capture: &JvmCapture) {
    let mut loaded = load(capture);
    let (mut tables, layout) = layout_of(&mut loaded);
    let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
    let mut namer = JavaNamer::new();
    for pointer in [8, 0x1000, u64::MAX - 7, u64::MAX - 15, 1 << 63] {
        let frames = [
            JavaFrame::Interpreted {
                method: pointer,
                bcp: pointer,
            },
            JavaFrame::Native { method: pointer },
            JavaFrame::Compiled {
                code: pointer,
                method: pointer,
                compile_id: 1,
                pc: pointer,
                exact: false,
                tier: 4,
            },
        ];
        for frame in frames {
            assert!(
                namer
                    .name(&mut loaded.memory, &layout, &cache, &frame)
                    .is_err(),
                "{frame:?}"
            );
        }
    }
    // A blob's frame at the very top of the address space.
    let blob = cache
        .find(&mut loaded.memory, &layout, loaded.nmethods[0])
        .expect("readable")
        .expect("a blob");
    for sp in [u64::MAX - 7, 0, 8] {
        let regs = FrameRegs {
            ip: blob.code.start,
            sp,
            bp: Some(u64::MAX - 7),
        };
        let _ = step(&cache, &layout, &blob, regs, true, &|_| Some(u64::MAX));
        let _ = step(&cache, &layout, &blob, regs, false, &|_| Some(u64::MAX));
    }
    // A table saying a type is 4 GiB: refused, not allocated.
    tables.types.insert("ConstMethod".to_owned(), 1 << 32);
    let error = Layout::new(&tables).expect_err("implausible");
    assert!(error.to_string().contains("size of ConstMethod"), "{error}");
}
