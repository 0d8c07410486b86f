//! Where the DWARF unwind and the kernel's frame-pointer walk meet: the
//! leaf's caller put back into a walk that skipped it, and a short unwind
//! continued by the walk.

use crate::{
    MAX_USER_FRAMES,
    cfi::{Cfa, Rule, UnwindRow},
};

/// What leaf repair did to one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafRepair {
    /// The walk already held the leaf's caller.
    NotNeeded,
    /// The caller was missing and was inserted.
    Repaired,
    /// Could not tell: no registers, no CFI, or the slot lay beyond the copy.
    Unavailable,
}

/// Reads a little-endian u64 at `address` from a copy of the stack that
/// starts at `sp`.
pub(crate) fn read_stack_u64(stack: &[u8], sp: u64, address: u64) -> Option<u64> {
    let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
    let bytes = stack.get(offset..offset.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// The return address of the frame executing at `row`, if the stack copy
/// holds it.
pub(crate) fn return_address(row: &UnwindRow, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> Option<u64> {
    let cfa = match row.cfa {
        Cfa::RspOffset(offset) => sp.checked_add_signed(i64::from(offset))?,
        Cfa::RbpOffset(offset) => bp.checked_add_signed(i64::from(offset))?,
        Cfa::Plt { threshold } => {
            let extra = if ip & 15 >= u64::from(threshold) {
                8
            } else {
                0
            };
            sp.checked_add(8 + extra)?
        }
        Cfa::Signal | Cfa::Unsupported => return None,
    };
    match row.ra {
        Rule::CfaOffset(offset) => {
            read_stack_u64(stack, sp, cfa.checked_add_signed(i64::from(offset))?)
        }
        Rule::Same | Rule::Undefined | Rule::Unsupported => None,
    }
}

/// Inserts the leaf's caller into a frame-pointer walk when the walk lacks
/// it. `frames[0]` must be the interrupted instruction.
pub fn repair_leaf(
    frames: &mut Vec<u64>,
    row: &UnwindRow,
    regs: (u64, u64, u64),
    stack: &[u8],
) -> LeafRepair {
    let (ip, sp, bp) = regs;
    if frames.first() != Some(&ip) {
        return LeafRepair::Unavailable;
    }
    let Some(caller) = return_address(row, ip, sp, bp, stack) else {
        return LeafRepair::Unavailable;
    };
    if caller == 0 || frames.get(1) == Some(&caller) {
        return LeafRepair::NotNeeded;
    }
    frames.insert(1, caller);
    frames.truncate(MAX_USER_FRAMES);
    LeafRepair::Repaired
}

/// Joins a DWARF unwind that stopped short to the kernel's frame-pointer
/// walk: where the walk holds the last address the unwind reached, the
/// walk's frames beyond it continue the stack. True if frames were added.
pub fn stitch(frames: &mut Vec<u64>, walk: &[u64]) -> bool {
    if frames.len() >= MAX_USER_FRAMES {
        return false;
    }
    let Some(&last) = frames.last() else {
        return false;
    };
    // The interrupted instruction only matches the walk's first entry; a
    // return address never does.
    let from = usize::from(frames.len() > 1);
    let Some(position) = walk.iter().skip(from).position(|&a| a == last) else {
        return false;
    };
    let rest = &walk[from + position + 1..];
    let room = MAX_USER_FRAMES.saturating_sub(frames.len());
    frames.extend(rest.iter().take(room));
    !rest.is_empty() && room > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEAF: UnwindRow = UnwindRow {
        cfa: Cfa::RspOffset(8),
        ra: Rule::CfaOffset(-8),
        rbp: Rule::Same,
    };

    fn stack(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn frameless_leaf_gets_its_caller_back() {
        // The FP walk went ip -> caller's caller, skipping level_three.
        let mut frames = vec![0x1010, 0x2222, 0x3333];
        let copy = stack(&[0x1111, 0xdead]);
        let outcome = repair_leaf(&mut frames, &LEAF, (0x1010, 0x7000, 0x7100), &copy);
        assert_eq!(outcome, LeafRepair::Repaired);
        assert_eq!(frames, vec![0x1010, 0x1111, 0x2222, 0x3333]);
    }

    #[test]
    fn framed_leaf_is_left_alone() {
        let framed = UnwindRow {
            cfa: Cfa::RbpOffset(16),
            ..LEAF
        };
        let mut frames = vec![0x1010, 0x1111, 0x2222];
        // rbp = sp + 8: [rbp] saved rbp, [rbp + 8] return address.
        let copy = stack(&[0, 0xbeef, 0x1111]);
        let outcome = repair_leaf(&mut frames, &framed, (0x1010, 0x7000, 0x7008), &copy);
        assert_eq!(outcome, LeafRepair::NotNeeded);
        assert_eq!(frames, vec![0x1010, 0x1111, 0x2222]);
    }

    #[test]
    fn slot_beyond_the_copy_is_unavailable() {
        let deep = UnwindRow {
            cfa: Cfa::RspOffset(4096),
            ..LEAF
        };
        let mut frames = vec![0x1010, 0x2222];
        let outcome = repair_leaf(&mut frames, &deep, (0x1010, 0x7000, 0), &stack(&[1, 2]));
        assert_eq!(outcome, LeafRepair::Unavailable);
        assert_eq!(frames, vec![0x1010, 0x2222]);
    }

    #[test]
    fn plt_cfa_depends_on_the_instruction_offset() {
        let plt = UnwindRow {
            cfa: Cfa::Plt { threshold: 11 },
            ..LEAF
        };
        let copy = stack(&[0xaaaa, 0xbbbb]);
        // rip & 15 < 11: CFA = rsp + 8, return address at rsp.
        assert_eq!(return_address(&plt, 0x1004, 0x7000, 0, &copy), Some(0xaaaa));
        // rip & 15 >= 11: one more word was pushed.
        assert_eq!(return_address(&plt, 0x100b, 0x7000, 0, &copy), Some(0xbbbb));
    }

    #[test]
    fn stack_reads_are_bounds_checked() {
        let copy = stack(&[7, 8]);
        assert_eq!(read_stack_u64(&copy, 0x100, 0x108), Some(8));
        assert_eq!(read_stack_u64(&copy, 0x100, 0x10c), None);
        assert_eq!(read_stack_u64(&copy, 0x100, 0x80), None);
        assert_eq!(read_stack_u64(&copy, 0x100, u64::MAX), None);
    }
}
