//! Call frame information (`.eh_frame`, else `.debug_frame`) compiled into a
//! compact, sorted row table: for each address range, how to find the CFA,
//! the return address and the caller's RBP on x86_64. Built once per object
//! with gimli, then looked up with a binary search per frame. Pure: bytes in,
//! table out.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};
use object::{Object, ObjectSection};

type Reader<'a> = EndianSlice<'a, LittleEndian>;

#[derive(Debug, thiserror::Error)]
pub enum CfiError {
    #[error("not a parsable ELF file")]
    Elf {
        #[source]
        source: object::Error,
    },
    #[error("malformed call frame information")]
    Dwarf {
        #[source]
        source: gimli::Error,
    },
}

/// How to compute the canonical frame address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cfa {
    RspOffset(i32),
    RbpOffset(i32),
    /// The expression every PLT uses:
    /// `rsp + 8 + ((rip & 15) >= threshold ? 8 : 0)`.
    Plt {
        threshold: u8,
    },
    /// Outside any FDE, or a rule firn does not evaluate.
    Unsupported,
}

/// Where a register's caller value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Unchanged by this frame.
    Same,
    /// Saved at CFA + offset.
    CfaOffset(i32),
    /// Not recoverable (for the return address: the outermost frame).
    Undefined,
    Unsupported,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindRow {
    /// First address (link-time vaddr) this row covers; it lasts until the
    /// next row's start.
    pub start: u64,
    pub cfa: Cfa,
    pub ra: Rule,
    pub rbp: Rule,
}

/// The compiled rows of one object.
#[derive(Debug, Default)]
pub struct UnwindTable {
    rows: Vec<UnwindRow>,
}

impl UnwindTable {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn heap_bytes(&self) -> usize {
        self.rows.capacity() * std::mem::size_of::<UnwindRow>()
    }

    /// The row covering `vaddr`, if any FDE covers it.
    pub fn lookup(&self, vaddr: u64) -> Option<&UnwindRow> {
        let index = self.rows.partition_point(|row| row.start <= vaddr);
        let row = self.rows.get(index.checked_sub(1)?)?;
        (row.cfa != Cfa::Unsupported || row.ra != Rule::Unsupported).then_some(row)
    }

    /// Compiles the CFI of the ELF object in `data`.
    pub fn from_elf(data: &[u8]) -> Result<Self, CfiError> {
        let file = object::File::parse(data).map_err(|source| CfiError::Elf { source })?;
        let section = |name: &str| {
            file.section_by_name(name)
                .and_then(|s| Some((s.address(), s.uncompressed_data().ok()?.into_owned())))
        };
        let mut bases = BaseAddresses::default();
        if let Some(text) = file.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(got) = file.section_by_name(".got") {
            bases = bases.set_got(got.address());
        }
        let mut rows = Vec::new();
        if let Some((address, bytes)) = section(".eh_frame") {
            let bases = bases.clone().set_eh_frame(address);
            let mut eh_frame = EhFrame::new(&bytes, LittleEndian);
            eh_frame.set_address_size(8);
            collect_rows(&eh_frame, &bases, &mut rows)?;
        }
        if rows.is_empty()
            && let Some((_, bytes)) = section(".debug_frame")
        {
            let mut debug_frame = DebugFrame::new(&bytes, LittleEndian);
            debug_frame.set_address_size(8);
            collect_rows(&debug_frame, &bases, &mut rows)?;
        }
        Ok(Self::from_rows(rows))
    }

    /// Sorts rows and drops those shadowed by a later one at the same start.
    fn from_rows(mut rows: Vec<UnwindRow>) -> Self {
        rows.sort_by_key(|row| row.start);
        // At equal starts the FDE's own first row wins over a gap marker
        // left by the previous FDE's end.
        let mut compact: Vec<UnwindRow> = Vec::with_capacity(rows.len());
        for row in rows {
            match compact.last_mut() {
                Some(last) if last.start == row.start => {
                    if last.cfa == Cfa::Unsupported && last.ra == Rule::Unsupported {
                        *last = row;
                    }
                }
                _ => compact.push(row),
            }
        }
        compact.shrink_to_fit();
        Self { rows: compact }
    }
}

const GAP: fn(u64) -> UnwindRow = |start| UnwindRow {
    start,
    cfa: Cfa::Unsupported,
    ra: Rule::Unsupported,
    rbp: Rule::Unsupported,
};

fn collect_rows<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    rows: &mut Vec<UnwindRow>,
) -> Result<(), CfiError>
where
    S: UnwindSection<Reader<'a>>,
{
    let mut context = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            // A malformed entry ends the walk; keep what was compiled.
            Err(source) if rows.is_empty() => return Err(CfiError::Dwarf { source }),
            Err(_) => break,
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            continue;
        };
        let Ok(mut table) = fde.rows(section, bases, &mut context) else {
            continue;
        };
        while let Ok(Some(row)) = table.next_row() {
            rows.push(UnwindRow {
                start: row.start_address(),
                cfa: compile_cfa(row.cfa(), section),
                ra: compile_rule(row.register(X86_64::RA)),
                rbp: compile_rule(row.register(X86_64::RBP)),
            });
        }
        rows.push(GAP(fde.end_address()));
    }
    Ok(())
}

fn compile_cfa<'a, S>(rule: &CfaRule<usize>, section: &S) -> Cfa
where
    S: UnwindSection<Reader<'a>>,
{
    match *rule {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(offset) = i32::try_from(offset) else {
                return Cfa::Unsupported;
            };
            match register {
                X86_64::RSP => Cfa::RspOffset(offset),
                X86_64::RBP => Cfa::RbpOffset(offset),
                _ => Cfa::Unsupported,
            }
        }
        CfaRule::Expression(expression) => match expression.get(section) {
            Ok(expression) => plt_threshold(expression.0.slice())
                .map_or(Cfa::Unsupported, |threshold| Cfa::Plt { threshold }),
            Err(_) => Cfa::Unsupported,
        },
    }
}

/// Recognizes the PLT CFA expression binutils and lld emit:
/// `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_litN;
/// DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`.
fn plt_threshold(expression: &[u8]) -> Option<u8> {
    const DW_OP_LIT0: u8 = 0x30;
    match expression {
        [
            0x77,
            0x08,
            0x80,
            0x00,
            0x3f,
            0x1a,
            lit,
            0x2a,
            0x33,
            0x24,
            0x22,
        ] if (DW_OP_LIT0..DW_OP_LIT0 + 32).contains(lit) => Some(lit - DW_OP_LIT0),
        _ => None,
    }
}

fn compile_rule(rule: Option<RegisterRule<usize>>) -> Rule {
    match rule {
        None | Some(RegisterRule::SameValue) => Rule::Same,
        Some(RegisterRule::Offset(offset)) => {
            i32::try_from(offset).map_or(Rule::Unsupported, Rule::CfaOffset)
        }
        Some(RegisterRule::Undefined) => Rule::Undefined,
        Some(_) => Rule::Unsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::tests::CHAIN;

    fn function(name: &str) -> u64 {
        object_symbol(name).unwrap_or_else(|| panic!("{name} is not in the fixture"))
    }

    fn object_symbol(name: &str) -> Option<u64> {
        use object::ObjectSymbol;
        let file = object::File::parse(CHAIN).ok()?;
        file.symbols()
            .find(|s| s.name() == Ok(name))
            .map(|s| s.address())
    }

    #[test]
    fn leaf_without_frame_pointer_has_rsp_based_cfa() {
        let table = UnwindTable::from_elf(CHAIN).expect("CFI compiles");
        assert!(!table.is_empty());
        let leaf = function("burn_leaf");
        let row = table.lookup(leaf + 4).expect("burn_leaf has an FDE");
        // No frame: the return address sits right at the stack pointer.
        assert_eq!(row.cfa, Cfa::RspOffset(8));
        assert_eq!(row.ra, Rule::CfaOffset(-8));
    }

    #[test]
    fn framed_function_switches_to_rbp_after_the_prologue() {
        let table = UnwindTable::from_elf(CHAIN).expect("CFI compiles");
        let start = function("level_three");
        assert_eq!(table.lookup(start).map(|r| r.cfa), Some(Cfa::RspOffset(8)));
        // push %rbp; mov %rsp,%rbp: 1 + 3 bytes.
        let body = table.lookup(start + 4).expect("covered");
        assert_eq!(body.cfa, Cfa::RbpOffset(16));
        assert_eq!(body.rbp, Rule::CfaOffset(-16));
    }

    #[test]
    fn addresses_outside_every_fde_have_no_row() {
        let table = UnwindTable::from_elf(CHAIN).expect("CFI compiles");
        assert!(table.lookup(0).is_none());
        assert!(table.lookup(u64::MAX).is_none());
    }

    #[test]
    fn plt_expression_is_recognized() {
        let expression = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(plt_threshold(&expression), Some(11));
        assert_eq!(plt_threshold(&expression[..5]), None);
    }

    #[test]
    fn corrupt_objects_fail_without_panicking() {
        assert!(UnwindTable::from_elf(b"not elf").is_err());
        let mut corrupt = CHAIN.to_vec();
        for index in (512..corrupt.len()).step_by(37) {
            corrupt[index] = corrupt[index].wrapping_add(0x5b);
        }
        let _ = UnwindTable::from_elf(&corrupt);
        for len in (0..CHAIN.len()).step_by(211) {
            let _ = UnwindTable::from_elf(&CHAIN[..len]);
        }
    }
}
