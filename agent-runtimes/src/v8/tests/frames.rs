//! The namer replayed over the memory it read of live Node.js processes
//! (`agent_fixtures::v8::CAPTURES`), walking their frame pointers from the
//! registers they were stopped with, against the functions of
//! `tests/workloads/node_chain.js`.

use agent_fixtures::{
    memory::Regions,
    v8::{CAPTURES, NODE_CONSTANTS, V8Capture},
};

use crate::{
    Memory, MemoryError,
    v8::{ChainFrame, Constants, JsFunction, Layout, NameError, StackCopy, V8Namer, walk_chain},
};

pub(super) struct Replay(pub(super) Regions);

impl Memory for Replay {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        crate::read_captured(&self.0, address, buf)
    }
}

impl Replay {
    pub(super) fn word(&mut self, address: u64) -> Option<u64> {
        let mut bytes = [0; 8];
        self.read(address, &mut bytes).ok()?;
        Some(u64::from_le_bytes(bytes))
    }

    pub(super) fn write(&mut self, address: u64, value: u64) {
        assert!(
            self.0.get(address, 8).is_some(),
            "{address:#x} was not captured"
        );
        self.0.add(address, &value.to_le_bytes());
    }
}

pub(super) struct Loaded {
    pub(super) memory: Replay,
    pub(super) layout: Layout,
    /// The frame pointer of each frame, innermost first.
    pub(super) frame_pointers: Vec<u64>,
    /// Where the builtins were.
    pub(super) builtins: Vec<std::ops::Range<u64>>,
}

fn hex(word: &str) -> u64 {
    u64::from_str_radix(word.trim_start_matches("0x"), 16).expect("hex")
}

pub(super) fn load(capture: &V8Capture) -> Loaded {
    let constants = NODE_CONSTANTS
        .iter()
        .find(|(major, _)| *major == capture.node)
        .map(|(_, text)| Constants::parse(text).expect("the constants parse"))
        .expect("the capture's Node version");
    let layout = Layout::new(&constants).expect("every constant");
    let mut memory = Replay(Regions::parse(capture.memory).expect("the regions parse"));
    let mut lines = capture.meta.lines();
    let fields: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ["registers", _rip, rbp, _rsp] = fields.as_slice() else {
        panic!("{}: unexpected meta {:?}", capture.name, capture.meta);
    };
    let builtins = lines
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let ["builtins", start, end] = fields.as_slice() else {
                panic!("{}: unexpected meta {line:?}", capture.name);
            };
            hex(start)..hex(end)
        })
        .collect();
    let mut fp = hex(rbp);
    let mut frame_pointers = Vec::new();
    while let Some(caller) = memory.word(fp) {
        frame_pointers.push(fp);
        if caller <= fp {
            break;
        }
        fp = caller;
    }
    Loaded {
        memory,
        layout,
        frame_pointers,
        builtins,
    }
}

fn function_slot(loaded: &mut Loaded, fp: u64) -> u64 {
    let slot = fp.wrapping_add_signed(loaded.layout.frame.function);
    loaded
        .memory
        .word(slot)
        .expect("the function slot was captured")
}

/// Every frame, named or the reason it is not.
fn name_all(loaded: &mut Loaded, namer: &mut V8Namer) -> Vec<Result<JsFunction, NameError>> {
    let frame_pointers = loaded.frame_pointers.clone();
    frame_pointers
        .into_iter()
        .map(|fp| {
            let function = function_slot(loaded, fp);
            namer.name(&mut loaded.memory, function)
        })
        .collect()
}

pub(super) const SCRIPT: &str = "tests/workloads/node_chain.js";

#[test]
fn the_chain_is_named_in_order() {
    for capture in &CAPTURES {
        let mut loaded = load(capture);
        let mut namer = V8Namer::new(loaded.layout);
        let named = name_all(&mut loaded, &mut namer);
        let chain: Vec<&str> = named
            .iter()
            .filter_map(|frame| frame.as_ref().ok())
            .filter(|frame| frame.file.ends_with(SCRIPT))
            .map(|frame| &*frame.name)
            .collect();
        let expected: &[&str] = match capture.name {
            // Maglev inlined levelOne, levelTwo and levelThree into main.
            "node24-maglev" => &["burnLeaf", "main", "(anonymous)"],
            _ => &[
                "burnLeaf",
                "levelThree",
                "levelTwo",
                "levelOne",
                "main",
                "(anonymous)",
            ],
        };
        assert_eq!(chain, expected, "{}", capture.name);
        // Below the script, Node's own loader, named from its internal
        // modules.
        let loader = named
            .iter()
            .filter_map(|frame| frame.as_ref().ok())
            .find(|frame| frame.file.starts_with("node:internal/modules/"));
        assert!(
            loader.is_some(),
            "{}: no loader frame in {named:?}",
            capture.name
        );
        // Native frames' slots hold no JSFunction: refused, not named.
        assert!(
            named.iter().any(Result::is_err),
            "{}: every frame named",
            capture.name
        );
    }
}

#[test]
fn names_are_cached_by_shared_function_info() {
    let mut loaded = load(&CAPTURES[0]);
    let mut namer = V8Namer::new(loaded.layout);
    let first = name_all(&mut loaded, &mut namer);
    let misses = namer.counts().misses;
    let again = name_all(&mut loaded, &mut namer);
    assert_eq!(format!("{first:?}"), format!("{again:?}"));
    assert_eq!(
        namer.counts().misses,
        misses,
        "the second pass read no name again"
    );
    assert!(namer.counts().hits >= misses);
}

#[test]
fn an_object_that_changed_is_not_named_from_the_cache() {
    let mut loaded = load(&CAPTURES[0]);
    let layout = loaded.layout;
    let mut namer = V8Namer::new(layout);
    let fp = loaded.frame_pointers.clone();
    let burn_leaf = fp
        .iter()
        .copied()
        .find(|&fp| {
            let function = function_slot(&mut loaded, fp);
            namer
                .name(&mut loaded.memory, function)
                .is_ok_and(|named| &*named.name == "burnLeaf")
        })
        .expect("burnLeaf's frame");
    let function = function_slot(&mut loaded, burn_leaf);
    let shared = loaded
        .memory
        .word(layout.tagging.untag(function) + layout.fields.js_function_shared)
        .expect("captured");
    // The SharedFunctionInfo's name field now says "no name": the cache
    // key changes with it, and the function is read again.
    let name_field = layout.tagging.untag(shared) + layout.fields.sfi_name_or_scope_info;
    loaded.memory.write(name_field, 0);
    let renamed = namer.name(&mut loaded.memory, function).expect("named");
    assert_eq!(&*renamed.name, "(anonymous)");
    // The frame's slot now points at the SharedFunctionInfo itself, as if
    // the collector had moved the function and put something else there:
    // refused by type.
    let error = namer
        .name(&mut loaded.memory, shared)
        .expect_err("not a JSFunction");
    assert_eq!(error.reason(), "wrong_type");
    // A word that is not a heap pointer at all.
    let error = namer.name(&mut loaded.memory, 42 << 32).expect_err("a Smi");
    assert_eq!(error.reason(), "not_an_object");
}

/// The capture's stack as the BPF program would have copied it: from the
/// stack pointer to past the outermost frame, the bytes the namer read in
/// place and zeros between.
pub(super) fn stack_copy(capture: &V8Capture, loaded: &Loaded) -> (u64, u64, u64, Vec<u8>) {
    let words: Vec<u64> = capture
        .meta
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(hex)
        .collect();
    let [ip, bp, sp] = words.as_slice() else {
        panic!("registers");
    };
    let end = loaded.frame_pointers.last().expect("frames") + 16;
    let mut bytes = vec![0; (end - sp) as usize];
    for (address, data) in &loaded.memory.0.0 {
        for (index, byte) in data.iter().enumerate() {
            let at = address + index as u64;
            if (*sp..end).contains(&at) {
                bytes[(at - sp) as usize] = *byte;
            }
        }
    }
    (*ip, *bp, *sp, bytes)
}

#[test]
fn the_chain_walked_over_a_stack_copy_is_named() {
    for capture in &CAPTURES {
        let mut loaded = load(capture);
        let (ip, bp, sp, bytes) = stack_copy(capture, &loaded);
        let stack = StackCopy { sp, bytes: &bytes };
        let chain = walk_chain(stack, &loaded.layout, ip, bp);
        let fps: Vec<u64> = chain.iter().map(|frame| frame.fp).collect();
        assert_eq!(fps, loaded.frame_pointers, "{}", capture.name);
        assert_eq!(chain[0].pc, ip);
        let mut namer = V8Namer::new(loaded.layout);
        let names: Vec<String> = chain
            .iter()
            .filter_map(|frame| namer.name(&mut loaded.memory, frame.function?).ok())
            .filter(|named| named.file.ends_with(SCRIPT))
            .map(|named| named.name.to_string())
            .collect();
        assert_eq!(
            names.first().map(String::as_str),
            Some("burnLeaf"),
            "{}",
            capture.name
        );
        assert_eq!(
            names.last().map(String::as_str),
            Some("(anonymous)"),
            "{}",
            capture.name
        );
        // Each frame's pc is the return address its callee saved.
        for pair in chain.windows(2) {
            let saved = loaded.memory.word(pair[0].fp + 8).expect("captured");
            assert_eq!(pair[1].pc, saved);
        }
    }
}

#[test]
fn the_walk_stops_where_the_copy_or_the_chain_does() {
    let layout = load(&CAPTURES[0]).layout;
    let sp = 0x7ffc_0000_1000;
    let mut bytes = vec![0u8; 0x100];
    let mut put = |at: u64, value: u64| {
        let offset = (at - sp) as usize;
        bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    };
    // Frame at sp+0x40 whose caller is at sp+0x80, whose caller points
    // down the stack (a frame pointer used as a general register).
    put(sp + 0x40, sp + 0x80);
    put(sp + 0x48, 0x1111);
    put(sp + 0x30, 0xf00d);
    put(sp + 0x80, sp + 0x10);
    put(sp + 0x88, 0x2222);
    let stack = StackCopy { sp, bytes: &bytes };
    let chain = walk_chain(stack, &layout, 0x42, sp + 0x40);
    assert_eq!(
        chain,
        [
            ChainFrame {
                pc: 0x42,
                fp: sp + 0x40,
                function: Some(0xf00d),
                bytecode: [Some(0), Some(0)],
            },
            ChainFrame {
                pc: 0x1111,
                fp: sp + 0x80,
                function: Some(0),
                bytecode: [Some(0), Some(0)],
            },
        ]
    );
    // A frame pointer past the copy: the frame, with no slot to read.
    let chain = walk_chain(stack, &layout, 0x42, sp + 0x1000);
    assert_eq!(
        chain,
        [ChainFrame {
            pc: 0x42,
            fp: sp + 0x1000,
            function: None,
            bytecode: [None, None],
        }]
    );
    // Below the stack pointer: nothing.
    assert!(walk_chain(stack, &layout, 0x42, sp - 0x100).is_empty());
}

/// Counts the reads it passes on.
struct Counted<'a> {
    memory: &'a mut Replay,
    reads: usize,
}

impl Memory for Counted<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.reads += 1;
        self.memory.read(address, buf)
    }
}

#[test]
fn a_function_named_before_costs_four_reads_and_is_checked() {
    for capture in &CAPTURES {
        let mut loaded = load(capture);
        let layout = loaded.layout;
        let mut namer = V8Namer::new(layout);
        let slots: Vec<u64> = loaded
            .frame_pointers
            .clone()
            .into_iter()
            .map(|fp| function_slot(&mut loaded, fp))
            .collect();
        let functions: Vec<u64> = slots
            .into_iter()
            .filter(|&function| namer.name(&mut loaded.memory, function).is_ok())
            .collect();
        assert!(!functions.is_empty(), "{}", capture.name);
        let mut counted = Counted {
            memory: &mut loaded.memory,
            reads: 0,
        };
        for &function in &functions {
            namer.name(&mut counted, function).expect("named again");
        }
        assert_eq!(counted.reads, 4 * functions.len(), "{}", capture.name);
        // The function moved: the collector left a forwarding word (not a
        // map) where its map was. Not named from the cache.
        let function = functions[0];
        let map = layout.tagging.untag(function) + layout.fields.heap_object_map;
        loaded.memory.write(map, function + 0x1000);
        assert!(
            namer.name(&mut loaded.memory, function).is_err(),
            "{}",
            capture.name
        );
    }
}
