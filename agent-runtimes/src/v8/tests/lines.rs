//! Lines and tiers of the chain, on every captured release
//! (`agent_fixtures::v8::CAPTURES`): each function where V8's own
//! profiler places it (`node --cpu-prof` reports the same, 0-based), and
//! the tier each frame ran in.

use agent_fixtures::v8::CAPTURES;

use super::frames::{SCRIPT, load, stack_copy};
use crate::v8::{Position, StackCopy, Tier, V8Namer, walk_chain};

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
            .tier(&mut loaded.memory, frame, loaded.builtins.as_ref())
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
        let tiers: Vec<Tier> = script_frames(index)
            .iter()
            .map(|frame| frame.tier)
            .collect();
        let (kind, release) = (
            capture.name.split('-').nth(1).expect("a kind"),
            capture.name,
        );
        match kind {
            "interpreted" => assert!(
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
            "maglev" => assert_eq!(tiers[0], Tier::Optimized, "{release}"),
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
