//! The unwinder on a real sample: the registers and stack copy the BPF
//! program captured from `fixtures/chain_inline` (built without frame
//! pointers), with that binary's real CFI. Then the same input corrupted
//! every which way: stops with a reason, never a panic.

use agent_common::UserRegs;
use agent_elf as elf;

use crate::{
    MAX_USER_FRAMES, Outcome, StackCopy, Stop, stitch,
    testing::{Capture, FixtureCode},
    unwind,
};

const BINARY: &[u8] = agent_fixtures::CHAIN_INLINE;
const STACK: &[u8] = agent_fixtures::CHAIN_INLINE_STACK;

const CHAIN: [&str; 5] = ["burn_leaf", "level_three", "level_two", "level_one", "main"];

fn regs() -> UserRegs {
    Capture::chain_inline().regs
}

fn names(code: &FixtureCode, frames: &[u64]) -> Vec<String> {
    let symbols = elf::read_symbols(&elf::Bytes::from_static(BINARY)).expect("fixture symbols");
    frames
        .iter()
        .enumerate()
        .map(|(depth, &address)| {
            let lookup = if depth == 0 { address } else { address - 1 };
            code.vaddr(lookup)
                .and_then(|vaddr| symbols.lookup(vaddr))
                .map_or_else(|| format!("{address:#x}"), |hit| hit.name.to_owned())
        })
        .collect()
}

fn run(regs: UserRegs, stack: &[u8]) -> (Vec<u64>, Outcome, FixtureCode) {
    let mut code = FixtureCode::chain_inline().expect("the fixture parses");
    let mut frames = Vec::new();
    let copy = StackCopy {
        sp: regs.sp,
        bytes: stack,
    };
    let outcome = unwind(regs, copy, &mut code, MAX_USER_FRAMES, &mut frames);
    (frames, outcome, code)
}

#[test]
fn captured_sample_unwinds_through_the_whole_chain() {
    let (frames, outcome, code) = run(regs(), STACK);
    let names = names(&code, &frames);
    assert_eq!(
        names.get(..5),
        Some(&CHAIN.map(String::from)[..]),
        "{names:?}"
    );
    // main returns into libc, which has no CFI here: the rbp chain takes
    // over and stops where it no longer looks like frames.
    assert!(frames.len() > 5, "{names:?}");
    assert_ne!(outcome.stop, Stop::Complete);
    assert_eq!(
        outcome.frameless_callers, 3,
        "level_three..main have frames"
    );
}

#[test]
fn a_short_copy_keeps_the_frames_it_holds() {
    let regs = regs();
    // level_two's 3 KB frame does not fit in 1 KiB.
    let (frames, outcome, code) = run(regs, &STACK[..1024]);
    assert_eq!(outcome.stop, Stop::Truncated);
    assert_eq!(names(&code, &frames), CHAIN[..3]);
}

#[test]
fn corrupt_samples_stop_without_panicking() {
    let regs = regs();
    // Every prefix of the copy.
    for len in (0..STACK.len()).step_by(40) {
        let (frames, _, _) = run(regs, &STACK[..len]);
        assert!(!frames.is_empty() && frames.len() <= MAX_USER_FRAMES);
    }
    // Words overwritten with values that look like code, stack or nothing.
    let interesting = [
        0,
        1,
        regs.ip,
        regs.ip + 0x40,
        regs.sp,
        regs.sp + 8,
        u64::MAX,
    ];
    for (index, &value) in interesting.iter().cycle().take(7 * 40).enumerate() {
        let mut stack = STACK.to_vec();
        let word = (index * 37) % (stack.len() / 8);
        stack[word * 8..word * 8 + 8].copy_from_slice(&value.to_le_bytes());
        let (frames, _, _) = run(regs, &stack);
        assert!(frames.len() <= MAX_USER_FRAMES);
        // Joining with a walk that shares nothing, or everything, is safe.
        let mut joined = frames.clone();
        stitch(&mut joined, &frames);
        stitch(&mut joined, &[]);
        assert!(joined.len() <= MAX_USER_FRAMES);
    }
    // Registers that point nowhere useful.
    for (ip, sp, bp) in [
        (0, 0, 0),
        (u64::MAX, u64::MAX, u64::MAX),
        (regs.ip, regs.sp + 3, regs.bp),
        (regs.ip, u64::MAX - 4, 0),
        (1, regs.sp, regs.sp),
    ] {
        let (frames, outcome, _) = run(UserRegs { ip, sp, bp }, STACK);
        assert!(frames.len() <= MAX_USER_FRAMES, "{outcome:?}");
    }
}

#[test]
fn stitching_joins_the_walk_where_the_two_meet() {
    // The unwind reached 0x30 and stopped; the walk holds 0x30 and more.
    let mut frames = vec![0x10, 0x20, 0x30];
    assert!(stitch(&mut frames, &[0x10, 0x30, 0x40, 0x50]));
    assert_eq!(frames, [0x10, 0x20, 0x30, 0x40, 0x50]);
    // No meeting point: nothing is added.
    let mut frames = vec![0x10, 0x20];
    assert!(!stitch(&mut frames, &[0x10, 0x99]));
    assert_eq!(frames, [0x10, 0x20]);
    // Only the interrupted instruction: the walk continues it.
    let mut frames = vec![0x10];
    assert!(stitch(&mut frames, &[0x10, 0x99]));
    assert_eq!(frames, [0x10, 0x99]);
    // A return address equal to the interrupted instruction is no match.
    let mut frames = vec![0x10, 0x20];
    assert!(!stitch(&mut frames, &[0x20, 0x99]));
}
