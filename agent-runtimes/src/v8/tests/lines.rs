//! Lines and tiers of the chain, on every captured release
//! (`agent_fixtures::v8::CAPTURES`): each function where V8's own
//! profiler places it (`node --cpu-prof` reports the same, 0-based), and
//! the tier each frame ran in.

use agent_fixtures::v8::CAPTURES;

use super::frames::{Loaded, SCRIPT, load, stack_copy};
use crate::v8::{Position, StackCopy, Tier, V8Namer, heap::read_units, walk_chain};

/// Where each function of `tests/workloads/node_chain.js` starts: the
/// parameter list's `(` (column 1-based), the module wrapper at 1:1.
const STARTS: [(&str, u32, u32); 6] = [
    ("burnLeaf", 13, 18),
    ("levelThree", 21, 20),
    ("levelTwo", 27, 18),
    ("levelOne", 33, 18),
    ("main", 39, 14),
    ("(anonymous)", 1, 1),
];

/// burnLeaf's function slot.
fn burn_leaf(loaded: &mut Loaded) -> u64 {
    let mut namer = V8Namer::new(loaded.layout);
    for fp in loaded.frame_pointers.clone() {
        let slot = fp.wrapping_add_signed(loaded.layout.frame.function);
        let Some(function) = loaded.memory.word(slot) else {
            continue;
        };
        if namer
            .name(&mut loaded.memory, function)
            .is_ok_and(|named| &*named.name == "burnLeaf")
        {
            return function;
        }
    }
    panic!("no burnLeaf frame");
}

struct Frame {
    name: String,
    position: Option<Position>,
    tier: Tier,
}

/// The script's frames of a capture, walked over its stack copy.
fn script_frames(index: usize) -> Vec<Frame> {
    let capture = &CAPTURES[index];
    let mut loaded = load(capture);
    let (ip, bp, sp, bytes) = stack_copy(capture, &loaded);
    let chain = walk_chain(StackCopy { sp, bytes: &bytes }, &loaded.layout, ip, bp);
    let mut namer = V8Namer::new(loaded.layout);
    let mut frames = Vec::new();
    for frame in &chain {
        let Some(function) = frame.function else {
            continue;
        };
        let Ok(named) = namer.name(&mut loaded.memory, function) else {
            continue;
        };
        if !named.file.ends_with(SCRIPT) {
            continue;
        }
        let tier = namer
            .tier(&mut loaded.memory, frame, &loaded.builtins)
            .expect("a JavaScript frame's tier");
        frames.push(Frame {
            name: named.name.to_string(),
            position: named.position,
            tier,
        });
    }
    frames
}

#[test]
fn every_release_names_the_chain_with_lines() {
    for (index, capture) in CAPTURES.iter().enumerate() {
        let frames = script_frames(index);
        let expected: Vec<(&str, u32, u32)> = match capture.name {
            // Maglev inlined levelOne, levelTwo and levelThree into main.
            "node24-maglev" => vec![STARTS[0], STARTS[4], STARTS[5]],
            _ => STARTS.to_vec(),
        };
        let found: Vec<(&str, u32, u32)> = frames
            .iter()
            .map(|frame| {
                let at = frame
                    .position
                    .unwrap_or_else(|| panic!("{}: {} has no line", capture.name, frame.name));
                (frame.name.as_str(), at.line, at.column)
            })
            .collect();
        assert_eq!(found, expected, "{}", capture.name);
    }
}

#[test]
fn every_frame_has_the_tier_it_ran_in() {
    for (index, capture) in CAPTURES.iter().enumerate() {
        assert!(
            !load(capture).builtins.is_empty(),
            "{}: where the builtins ran",
            capture.name
        );
        let tiers: Vec<Tier> = script_frames(index)
            .iter()
            .map(|frame| frame.tier)
            .collect();
        let (kind, release) = (
            capture.name.split('-').nth(1).expect("a kind"),
            capture.name,
        );
        match kind {
            "interpreted" | "profiled" => assert!(
                tiers.iter().all(|&tier| tier == Tier::Interpreted),
                "{release}: {tiers:?}"
            ),
            "baseline" => assert!(
                tiers.iter().all(|&tier| tier == Tier::Baseline),
                "{release}: {tiers:?}"
            ),
            // burnLeaf to levelOne compiled on their own; main, entered
            // once, may have been replaced on the stack or not; the
            // module wrapper ran once, in the interpreter (or in baseline
            // code on Node 18, which compiles it early).
            "optimized" => {
                assert_eq!(tiers[..4], [Tier::Optimized; 4], "{release}");
                assert_ne!(tiers[5], Tier::Optimized, "{release}");
            }
            // main entered Maglev code by on-stack replacement: the
            // interpreter's frame, its pc outside the builtins.
            "maglev" => assert_eq!(
                tiers,
                [Tier::Optimized, Tier::Optimized, Tier::Interpreted],
                "{release}"
            ),
            _ => panic!("{release}: unknown kind"),
        }
    }
}

/// The loader's frames below the script: a script whose source is not on
/// the heap (Node's own modules, external strings from Node 20 on) has no
/// line rather than a guessed one, and the count says so.
#[test]
fn functions_without_a_readable_source_have_no_line() {
    let index = CAPTURES
        .iter()
        .position(|capture| capture.name == "node20-interpreted")
        .expect("the capture");
    let capture = &CAPTURES[index];
    let mut loaded = load(capture);
    let mut namer = V8Namer::new(loaded.layout);
    let mut loader = Vec::new();
    for fp in loaded.frame_pointers.clone() {
        let slot = fp.wrapping_add_signed(loaded.layout.frame.function);
        let function = loaded.memory.word(slot).expect("captured");
        if let Ok(named) = namer.name(&mut loaded.memory, function)
            && named.file.starts_with("node:internal/modules/cjs/")
        {
            loader.push(named);
        }
    }
    assert!(!loader.is_empty());
    assert!(loader.iter().all(|named| named.position.is_none()));
    assert!(namer.counts().without_line >= loader.len() as u64);
}

/// A start position the source does not confirm (one past the `(`, as a
/// slot misread would give) is no line, not a wrong one.
#[test]
fn a_start_the_source_does_not_confirm_is_no_line() {
    let index = CAPTURES
        .iter()
        .position(|capture| capture.name == "node20-interpreted")
        .expect("the capture");
    let mut loaded = load(&CAPTURES[index]);
    let layout = loaded.layout;
    let function = burn_leaf(&mut loaded);
    let named = V8Namer::new(layout)
        .name(&mut loaded.memory, function)
        .expect("named");
    assert_eq!(
        named.position,
        Some(Position {
            line: 13,
            column: 18
        })
    );
    // The absolute start, from the captured source.
    let untag = |tagged| layout.tagging.untag(tagged);
    let shared = loaded
        .memory
        .word(untag(function) + layout.fields.js_function_shared)
        .expect("captured");
    let scope_info = loaded
        .memory
        .word(untag(shared) + layout.fields.sfi_name_or_scope_info)
        .expect("captured");
    let script = loaded
        .memory
        .word(untag(shared) + layout.fields.sfi_script)
        .expect("captured");
    let source = loaded
        .memory
        .word(untag(script) + layout.fields.script_source)
        .expect("captured");
    let text = read_units(&mut loaded.memory, &layout, source, 1 << 20).expect("the source");
    let text = String::from_utf16_lossy(&text);
    let line_start: usize = text.split_inclusive('\n').take(12).map(str::len).sum();
    let start = (line_start + 17) as i64;
    assert_eq!(&text[start as usize..start as usize + 7], "(rounds");
    let slot = (1..24)
        .map(|index| untag(scope_info) + 8 * index)
        .find(|&at| {
            loaded
                .memory
                .word(at)
                .and_then(|word| layout.tagging.smi(word))
                == Some(start)
        })
        .expect("the ScopeInfo's start position");
    loaded.memory.write(slot, ((start + 1) as u64) << 32);
    let named = V8Namer::new(layout)
        .name(&mut loaded.memory, function)
        .expect("named");
    assert_eq!(&*named.name, "burnLeaf");
    assert_eq!(named.position, None);
}

/// Under V8's profiler every script's line ends are kept
/// (`Script::line_ends`): lines come from them, without reading the
/// source (the capture does not hold it).
#[test]
fn lines_come_from_the_line_ends_v8_keeps() {
    let index = CAPTURES
        .iter()
        .position(|capture| capture.name == "node20-profiled")
        .expect("the capture");
    let frames = script_frames(index);
    let found: Vec<(&str, Option<Position>)> = frames
        .iter()
        .map(|frame| (frame.name.as_str(), frame.position))
        .collect();
    let expected: Vec<(&str, Option<Position>)> = STARTS
        .iter()
        .map(|&(name, line, column)| (name, Some(Position { line, column })))
        .collect();
    assert_eq!(found, expected);
    let mut loaded = load(&CAPTURES[index]);
    let layout = loaded.layout;
    let untag = |tagged| layout.tagging.untag(tagged);
    let word = |memory: &mut super::frames::Replay, at| memory.word(at).expect("captured");
    let function = burn_leaf(&mut loaded);
    let shared = word(
        &mut loaded.memory,
        untag(function) + layout.fields.js_function_shared,
    );
    let script = word(&mut loaded.memory, untag(shared) + layout.fields.sfi_script);
    let source = word(
        &mut loaded.memory,
        untag(script) + layout.fields.script_source,
    );
    let error = read_units(&mut loaded.memory, &layout, source, 1 << 20)
        .expect_err("the source was not read whole");
    assert_eq!(error.reason(), "read");
}
