//! Go's own unwind table: the per-function stack pointer deltas (`pcsp`)
//! in `.gopclntab`, which the Go runtime unwinds with. A Go binary's CFI is
//! otherwise only a zlib-compressed `.debug_frame`, inflated whole and
//! indexed before its first row is read: for a 230 MB binary that was
//! 16 MB of heap and 20 ms. The table lies in the mapped file and is
//! searched where it is.
//!
//! The layout is the one Go 1.18 and later write (`runtime/symtab.go`,
//! `pcHeader`, `functab`, `_func`); older binaries keep their
//! `.debug_frame`.

use std::ops::Range;

use crate::cfi::{Cfa, Rule, UnwindRow};

/// `pcHeader.magic` of Go 1.18–1.19 and of Go 1.20 and later.
const MAGICS: [u32; 2] = [0xffff_fff0, 0xffff_fff1];
/// `magic`, two pad bytes, `minLC`, `ptrSize`, then eight words.
const HEADER_WORDS: usize = 8;
/// `_func` up to and including `pcsp`.
const FUNC_PCSP_END: usize = 20;
/// Most steps of one pc-value table, far beyond any real function.
const MAX_STEPS: usize = 1 << 20;

/// Where the parts of `.gopclntab` are, checked against its length.
#[derive(Clone, Debug)]
pub struct GoTable {
    /// The section's bytes within the object.
    section: Range<usize>,
    /// Link-time address the functions' entry offsets count from.
    text_start: u64,
    /// Bytes per instruction step in pc-value tables (1 on x86-64).
    quantum: u64,
    functions: usize,
    /// Offsets from the section's start.
    pctab: usize,
    functab: usize,
}

impl GoTable {
    /// The table in `data[section]`, if it is one firn reads (64-bit,
    /// Go 1.18 or later). Function entries count from the header's text
    /// address, or where the linker leaves it zero (Go 1.2x), from
    /// `text_base`: where `runtime.text` is.
    pub fn parse(data: &[u8], section: Range<usize>, text_base: Option<u64>) -> Option<Self> {
        let bytes = data.get(section.clone())?;
        let magic = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
        let (quantum, pointer_size) = (*bytes.get(6)?, *bytes.get(7)?);
        if !MAGICS.contains(&magic) || pointer_size != 8 || quantum == 0 {
            return None;
        }
        let word = |index: usize| read_u64(bytes, 8 + 8 * index);
        let functions = usize::try_from(word(0)?).ok()?;
        let text_start = match word(2)? {
            0 => text_base?,
            start => start,
        };
        let pctab = usize::try_from(word(6)?).ok()?;
        let functab = usize::try_from(word(7)?).ok()?;
        let table = Self {
            section,
            text_start,
            quantum: u64::from(quantum),
            functions,
            pctab,
            functab,
        };
        // The whole `functab` (one more entry than functions: the end of
        // the last) must be there; everything else is checked as read.
        let functab_end = functions
            .checked_add(1)?
            .checked_mul(8)?
            .checked_add(functab)?;
        (8 + 8 * HEADER_WORDS <= bytes.len() && functab_end <= bytes.len()).then_some(table)
    }

    /// The unwind rules at link-time address `vaddr`, if a Go function
    /// covers it.
    pub fn row(&self, data: &[u8], vaddr: u64) -> Option<UnwindRow> {
        let bytes = data.get(self.section.clone())?;
        let delta = self.sp_delta(bytes, vaddr)?;
        // Negative only in assembly that pops its own return address
        // (`syscall.rawVforkSyscall`); the row is then what Go's
        // `.debug_frame` says there, wrong as it is.
        let delta = i32::try_from(delta).ok()?;
        Some(UnwindRow {
            // The return address sits above the frame the function made.
            cfa: Cfa::RspOffset(delta.checked_add(8)?),
            ra: Rule::CfaOffset(-8),
            // A function with a frame pushes rbp first thing (`PUSHQ BP;
            // MOVQ SP, BP; SUBQ $n, SP`) and pops it last, so once the
            // stack has grown the caller's rbp is right below the return
            // address; before, rbp is still the caller's.
            rbp: if delta <= 0 {
                Rule::Same
            } else {
                Rule::CfaOffset(-16)
            },
        })
    }

    /// The stack pointer's distance below where it was at the function's
    /// entry, at `vaddr`: the function's `pcsp` table evaluated there.
    fn sp_delta(&self, bytes: &[u8], vaddr: u64) -> Option<i64> {
        let offset = vaddr.checked_sub(self.text_start)?;
        let entry_offset = |index: usize| read_u32(bytes, self.functab + 8 * index);
        // The last function whose entry is at or below `vaddr`; the extra
        // entry at `functions` is where the last one ends.
        let (mut low, mut high) = (0, self.functions);
        while low < high {
            let middle = low + (high - low) / 2;
            if u64::from(entry_offset(middle)?) <= offset {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        let index = low.checked_sub(1)?;
        if u64::from(entry_offset(index + 1)?) <= offset {
            return None;
        }
        let function_offset = read_u32(bytes, self.functab + 8 * index + 4)?;
        let function = self
            .functab
            .checked_add(usize::try_from(function_offset).ok()?)?;
        let entry = self.text_start + u64::from(read_u32(bytes, function)?);
        let pcsp = read_u32(bytes, function.checked_add(FUNC_PCSP_END - 4)?)?;
        let table = bytes.get(self.pctab.checked_add(usize::try_from(pcsp).ok()?)?..)?;
        self.value_at(table, entry, vaddr)
    }

    /// Runs the pc-value table from `entry` up to `vaddr` (the runtime's
    /// `pcvalue`): pairs of a zigzag value delta and a pc delta, ending at
    /// a zero value delta after the first.
    fn value_at(&self, mut table: &[u8], entry: u64, vaddr: u64) -> Option<i64> {
        let mut pc = entry;
        let mut value: i64 = -1;
        for step in 0..MAX_STEPS {
            let (value_delta, rest) = read_varint(table)?;
            if value_delta == 0 && step > 0 {
                return None;
            }
            let (pc_delta, rest) = read_varint(rest)?;
            table = rest;
            value += i64::from((value_delta >> 1) as i32 ^ -((value_delta & 1) as i32));
            pc = pc.checked_add(u64::from(pc_delta).checked_mul(self.quantum)?)?;
            if vaddr < pc {
                return Some(value);
            }
        }
        None
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// An unsigned LEB128 of at most 32 bits, and what follows it.
fn read_varint(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let mut value = 0u32;
    for (index, byte) in bytes.iter().enumerate().take(5) {
        value |= u32::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[index + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table with one function at 0x1000..0x1010 whose pcsp says 0 for
    /// four bytes, 8 for four, then 24 to the end.
    fn table() -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xffff_fff1u32.to_le_bytes());
        bytes.extend_from_slice(&[0, 0, 1, 8]);
        let header_end = 8 + 8 * HEADER_WORDS as u64;
        let pctab = header_end;
        // pcsp: (+1 → 0, 4), (+8 → 8, 4), (+16 → 24, 8), end.
        let pcsp = [0x02, 4, 0x10, 4, 0x20, 8, 0];
        let functab = pctab + pcsp.len() as u64;
        for word in [1, 0, 0x1000, 0, 0, 0, pctab, functab] {
            bytes.extend_from_slice(&u64::to_le_bytes(word));
        }
        bytes.extend_from_slice(&pcsp);
        // functab: the function, then the end.
        let func = 16u32;
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&func.to_le_bytes());
        bytes.extend_from_slice(&0x10u32.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        // _func: entryOff, nameOff, args, deferreturn, pcsp.
        for field in [0u32, 0, 0, 0, 0] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn rows_follow_the_stack_pointer_deltas() {
        let bytes = table();
        let go = GoTable::parse(&bytes, 0..bytes.len(), None).expect("a table");
        let cfa = |vaddr| go.row(&bytes, vaddr).map(|row| (row.cfa, row.rbp));
        assert_eq!(cfa(0x1000), Some((Cfa::RspOffset(8), Rule::Same)));
        assert_eq!(cfa(0x1003), Some((Cfa::RspOffset(8), Rule::Same)));
        assert_eq!(
            cfa(0x1004),
            Some((Cfa::RspOffset(16), Rule::CfaOffset(-16)))
        );
        assert_eq!(
            cfa(0x100f),
            Some((Cfa::RspOffset(32), Rule::CfaOffset(-16)))
        );
        assert_eq!(cfa(0x1010), None);
        assert_eq!(cfa(0xfff), None);
    }

    #[test]
    fn truncated_or_foreign_tables_are_refused_or_answer_nothing() {
        let bytes = table();
        for end in 0..bytes.len() {
            let cut = &bytes[..end];
            if let Some(go) = GoTable::parse(cut, 0..cut.len(), None) {
                // Whatever is missing is a `None`, never a panic.
                for vaddr in 0x0ff0..0x1020 {
                    let _ = go.row(cut, vaddr);
                }
            }
        }
        let mut foreign = bytes.clone();
        foreign[0] = 0xfb;
        assert!(GoTable::parse(&foreign, 0..foreign.len(), None).is_none());
        assert!(GoTable::parse(&bytes, 0..bytes.len() + 1, None).is_none());
        // A header without its text address needs one from the object.
        let mut unplaced = bytes.clone();
        unplaced[24..32].fill(0);
        assert!(GoTable::parse(&unplaced, 0..unplaced.len(), None).is_none());
        let placed = GoTable::parse(&unplaced, 0..unplaced.len(), Some(0x1000)).expect("a table");
        assert!(placed.row(&unplaced, 0x1004).is_some());
    }
}
