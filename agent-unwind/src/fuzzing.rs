//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for the
//! unwinder: an object's CFI, and a sample's registers and stack copy
//! unwound against real CFI. None may panic, hang or allocate without
//! bound on any input.

use std::cell::RefCell;

use agent_common::UserRegs;
use agent_elf::fuzzing::probe_addresses;

use crate::{
    CfiContext, CfiSource, Code, CodeLookup, MAX_USER_FRAMES, StackCopy, is_go, repair_leaf,
    stitch, survey, testing::FixtureCode, unwind,
};

/// An object's CFI: rows at addresses across its code, the survey of
/// whether it keeps frame pointers, and whether it is a Go binary.
pub fn cfi_rows(data: &[u8]) {
    let _ = is_go(data);
    let Ok(source) = CfiSource::new(data) else {
        return;
    };
    let mut context = CfiContext::new();
    let layout = agent_elf::read_layout(data).unwrap_or_default();
    for address in probe_addresses(&layout) {
        let _ = source.row(address, &mut context);
    }
    let _ = survey(&source, &mut context);
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
        unwind(regs, copy, code, MAX_USER_FRAMES, &mut frames);
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

#[cfg(test)]
agent_fixtures::replays! {
    "cfi_rows" => cfi_rows,
    "unwind_stack" => unwind_stack,
}

#[cfg(test)]
#[test]
fn the_unwind_fixture_loads() {
    assert!(FixtureCode::chain_inline().is_some());
}
