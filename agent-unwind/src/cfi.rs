//! Call frame information (`.eh_frame`, else `.debug_frame`) looked up per
//! address: through `.eh_frame_hdr`'s binary-search table when the object
//! has one, else through a compact FDE index built once. Nothing is compiled
//! up front, so a huge object (hundreds of MB of code) costs a header parse,
//! not seconds. Rows are turned into the few x86_64 rules the unwinder
//! applies. Pure: object bytes in, rows out.

use std::ops::{Deref, Range};

use agent_elf::gopclntab::GoTable;
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EhFrameHdr, EhFrameOffset, EndianSlice,
    FrameDescriptionEntry, LittleEndian, RegisterRule, UnwindContext, UnwindSection,
    UnwindTableRow, X86_64,
};
use object::{CompressionFormat, Object, ObjectSection};

pub(crate) type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// Scratch space gimli evaluates CFI programs in; reuse one per thread.
pub type CfiContext = UnwindContext<usize>;

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
    /// A signal trampoline (its CIE has the `S` augmentation, e.g. glibc's
    /// `__restore_rt`): the interrupted registers are in the `ucontext` the
    /// kernel pushed, which starts at rsp.
    Signal,
    /// A rule firn does not evaluate.
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

/// The unwind rules at one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindRow {
    pub cfa: Cfa,
    pub ra: Rule,
    pub rbp: Rule,
}

/// An FDE's address range and offset, for objects without a usable
/// `.eh_frame_hdr` table.
#[derive(Clone, Copy, Debug)]
struct FdeEntry {
    start: u64,
    end: u64,
    offset: usize,
}

#[derive(Clone, Debug)]
struct Section {
    range: Range<usize>,
}

/// Something done with the FDE covering an address, whichever section
/// holds it.
pub(crate) trait FdeVisitor {
    type Output;
    fn visit<'a, S: UnwindSection<Reader<'a>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        fde: &FrameDescriptionEntry<Reader<'a>>,
        context: &mut CfiContext,
    ) -> Option<Self::Output>;
}

/// Looks up the row at one address.
struct RowAt(u64);

impl FdeVisitor for RowAt {
    type Output = UnwindRow;

    fn visit<'a, S: UnwindSection<Reader<'a>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        fde: &FrameDescriptionEntry<Reader<'a>>,
        context: &mut CfiContext,
    ) -> Option<UnwindRow> {
        let row = fde
            .unwind_info_for_address(section, bases, context, self.0)
            .ok()?;
        Some(compile_row(row, section, fde.is_signal_trampoline()))
    }
}

/// The CFI of one object, over its bytes `D` (a memory map in the agent).
pub struct CfiSource<D> {
    data: D,
    bases: BaseAddresses,
    eh_frame: Option<Section>,
    eh_frame_hdr: Option<Section>,
    /// Used when `eh_frame_hdr` is missing or has no search table.
    eh_frame_index: Vec<FdeEntry>,
    /// `.debug_frame`, possibly decompressed, with its index.
    debug_frame: Option<(Vec<u8>, Vec<FdeEntry>)>,
    /// Go's own table, which stands in for its `.debug_frame`.
    go: Option<GoTable>,
    /// Link-time addresses of `.text`.
    text: Option<Range<u64>>,
}

impl CfiSource<agent_elf::Bytes> {
    /// Lets the object's pages this source touched leave firn's RSS; they
    /// are read back from the file when next needed.
    pub fn release_pages(&self) {
        self.data.release_pages();
    }
}

impl<D: Deref<Target = [u8]>> CfiSource<D> {
    /// Reads the section headers of the ELF object in `data`.
    pub fn new(data: D) -> Result<Self, CfiError> {
        Self::build(data, true, true)
    }

    /// Like [`Self::new`], but a Go binary is read from its `.debug_frame`
    /// rather than its own table (to check one against the other).
    pub fn without_go_table(data: D) -> Result<Self, CfiError> {
        Self::build(data, true, false)
    }

    fn build(data: D, use_header_table: bool, use_go_table: bool) -> Result<Self, CfiError> {
        let (bases, eh_frame, eh_frame_hdr, debug_frame, text, go) = {
            let file = object::File::parse(&*data).map_err(|source| CfiError::Elf { source })?;
            let section = |name: &str| {
                let section = file.section_by_name(name)?;
                let (offset, size) = section.file_range()?;
                let start = usize::try_from(offset).ok()?;
                let end = start.checked_add(usize::try_from(size).ok()?)?;
                (end <= data.len()).then_some((Section { range: start..end }, section.address()))
            };
            let mut bases = BaseAddresses::default();
            let text = file.section_by_name(".text").map(|text| {
                bases = bases.clone().set_text(text.address());
                text.address()..text.address().saturating_add(text.size())
            });
            if let Some(got) = file.section_by_name(".got") {
                bases = bases.set_got(got.address());
            }
            let eh_frame = section(".eh_frame").map(|(section, address)| {
                bases = bases.clone().set_eh_frame(address);
                section
            });
            let eh_frame_hdr = section(".eh_frame_hdr").map(|(section, address)| {
                bases = bases.clone().set_eh_frame_hdr(address);
                section
            });
            let go = use_go_table
                .then(|| GoTable::find(&file, &data[..]))
                .flatten();
            let debug_frame = file
                .section_by_name(".debug_frame")
                .filter(|_| go.is_none())
                .filter(inflated_size_is_plausible)
                .and_then(|s| s.uncompressed_data().ok())
                .map(|bytes| bytes.into_owned());
            (bases, eh_frame, eh_frame_hdr, debug_frame, text, go)
        };
        let mut source = Self {
            data,
            bases,
            eh_frame,
            eh_frame_hdr: if use_header_table { eh_frame_hdr } else { None },
            eh_frame_index: Vec::new(),
            debug_frame: None,
            go,
            text,
        };
        if !source.has_header_table() {
            source.eh_frame_hdr = None;
        }
        if source.eh_frame.is_some() && source.eh_frame_hdr.is_none() {
            let eh_frame = source.eh_frame_section();
            source.eh_frame_index = index_fdes(&eh_frame, &source.bases)?;
        }
        if let Some(bytes) = debug_frame {
            let mut section = DebugFrame::new(&bytes, LittleEndian);
            section.set_address_size(8);
            let index = index_fdes(&section, &source.bases)?;
            source.debug_frame = Some((bytes, index));
        }
        Ok(source)
    }

    /// Heap bytes beyond the object's own (mapped) bytes.
    pub fn heap_bytes(&self) -> usize {
        let entry = std::mem::size_of::<FdeEntry>();
        self.eh_frame_index.capacity() * entry
            + self.debug_frame.as_ref().map_or(0, |(bytes, index)| {
                bytes.capacity() + index.capacity() * entry
            })
    }

    fn eh_frame_section(&self) -> EhFrame<Reader<'_>> {
        let range = self.eh_frame.as_ref().map_or(0..0, |s| s.range.clone());
        let mut section = EhFrame::new(&self.data[range], LittleEndian);
        section.set_address_size(8);
        section
    }

    /// Whether `.eh_frame_hdr` has a search table that can be true: gimli's
    /// binary search multiplies the header's FDE count by the row size
    /// unchecked, so a count the section cannot hold (corrupt) would
    /// overflow.
    fn has_header_table(&self) -> bool {
        let Some(header) = &self.eh_frame_hdr else {
            return false;
        };
        let bytes = &self.data[header.range.clone()];
        EhFrameHdr::new(bytes, LittleEndian)
            .parse(&self.bases, 8)
            .is_ok_and(|parsed| {
                parsed.table().is_some_and(|table| {
                    let (rows, _) = table.iter(&self.bases).size_hint();
                    rows > 0 && rows <= bytes.len() / MIN_TABLE_ROW_BYTES
                })
            })
    }

    /// The rules at link-time address `vaddr`, if any FDE (or Go's table)
    /// covers it.
    pub fn row(&self, vaddr: u64, context: &mut CfiContext) -> Option<UnwindRow> {
        self.visit_fde(vaddr, context, &mut RowAt(vaddr))
            .or_else(|| go_row(self.go.as_ref()?.sp_delta(&self.data[..], vaddr)?))
    }

    /// Whether Go's table stands in for the object's `.debug_frame`.
    pub fn has_go_table(&self) -> bool {
        self.go.is_some()
    }

    /// The object's bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The link-time range of `.text`, where the object's functions are.
    pub fn text(&self) -> Option<Range<u64>> {
        self.text.clone()
    }

    /// Runs `visitor` on the FDE covering `vaddr`: from `.eh_frame`, else
    /// from `.debug_frame`.
    pub(crate) fn visit_fde<V: FdeVisitor>(
        &self,
        vaddr: u64,
        context: &mut CfiContext,
        visitor: &mut V,
    ) -> Option<V::Output> {
        if self.eh_frame.is_some() {
            let eh_frame = self.eh_frame_section();
            let found = match &self.eh_frame_hdr {
                Some(header) if self.eh_frame_index.is_empty() => {
                    let parsed = EhFrameHdr::new(&self.data[header.range.clone()], LittleEndian)
                        .parse(&self.bases, 8)
                        .ok()?;
                    // gimli's `fde_for_address` subtracts the table's
                    // pointer from `.eh_frame`'s unchecked (it panics in a
                    // build with overflow checks): the same steps, checked.
                    let pointer = parsed.table()?.lookup(vaddr, &self.bases).ok()?;
                    let base = parsed.eh_frame_ptr().direct().ok()?;
                    let offset = pointer.direct().ok()?.checked_sub(base)?;
                    eh_frame
                        .fde_from_offset(
                            &self.bases,
                            EhFrameOffset(usize::try_from(offset).ok()?),
                            EhFrame::cie_from_offset,
                        )
                        .ok()
                        .filter(|fde| fde.contains(vaddr))
                        .and_then(|fde| visitor.visit(&eh_frame, &self.bases, &fde, context))
                }
                _ => fde_from_index(&eh_frame, &self.bases, &self.eh_frame_index, vaddr)
                    .and_then(|fde| visitor.visit(&eh_frame, &self.bases, &fde, context)),
            };
            if found.is_some() {
                return found;
            }
        }
        let (bytes, index) = self.debug_frame.as_ref()?;
        let mut debug_frame = DebugFrame::new(bytes, LittleEndian);
        debug_frame.set_address_size(8);
        let fde = fde_from_index(&debug_frame, &self.bases, index, vaddr)?;
        visitor.visit(&debug_frame, &self.bases, &fde, context)
    }
}

/// The unwind rules where a Go function's stack pointer is `delta` below
/// where it was at its entry (`.gopclntab`'s `pcsp`).
fn go_row(delta: i64) -> Option<UnwindRow> {
    // Negative only in assembly that pops its own return address
    // (`syscall.rawVforkSyscall`); the row is then what Go's `.debug_frame`
    // says there, wrong as it is.
    let delta = i32::try_from(delta).ok()?;
    Some(UnwindRow {
        // The return address sits above the frame the function made.
        cfa: Cfa::RspOffset(delta.checked_add(8)?),
        ra: Rule::CfaOffset(-8),
        // A function with a frame pushes rbp first thing (`PUSHQ BP; MOVQ
        // SP, BP; SUBQ $n, SP`) and pops it last, so once the stack has
        // grown the caller's rbp is right below the return address;
        // before, rbp is still the caller's.
        rbp: if delta <= 0 {
            Rule::Same
        } else {
            Rule::CfaOffset(-16)
        },
    })
}

/// The smallest `.eh_frame_hdr` table row: two 2-byte pointers.
const MIN_TABLE_ROW_BYTES: usize = 4;

/// Most a compressed section may inflate: deflate's limit is 1032 to 1,
/// and real CFI compresses a few times at best.
const MAX_COMPRESSION_RATIO: u64 = 1032;
/// Most `.debug_frame` firn inflates; the largest real ones are tens of MB.
const MAX_INFLATED_BYTES: u64 = 256 << 20;

/// Whether a compressed section's claimed size can be true. The inflated
/// buffer is allocated at the claimed size before a byte is inflated, so a
/// corrupt header claiming gigabytes would otherwise allocate them.
fn inflated_size_is_plausible(section: &object::Section<'_, '_>) -> bool {
    section.compressed_file_range().is_ok_and(|range| {
        range.format == CompressionFormat::None
            || (range.uncompressed_size <= MAX_INFLATED_BYTES
                && range.uncompressed_size
                    <= range.compressed_size.saturating_mul(MAX_COMPRESSION_RATIO))
    })
}

fn index_fdes<'a, S>(section: &S, bases: &BaseAddresses) -> Result<Vec<FdeEntry>, CfiError>
where
    S: UnwindSection<Reader<'a>>,
{
    let mut index = Vec::new();
    let mut entries = section.entries(bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            // A malformed entry ends the walk; keep what was indexed.
            Err(source) if index.is_empty() => return Err(CfiError::Dwarf { source }),
            Err(_) => break,
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            continue;
        };
        index.push(FdeEntry {
            start: fde.initial_address(),
            end: fde.end_address(),
            offset: fde.offset(),
        });
    }
    index.sort_unstable_by_key(|entry| entry.start);
    index.shrink_to_fit();
    Ok(index)
}

fn fde_from_index<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    index: &[FdeEntry],
    vaddr: u64,
) -> Option<FrameDescriptionEntry<Reader<'a>>>
where
    S: UnwindSection<Reader<'a>>,
{
    let position = index.partition_point(|entry| entry.start <= vaddr);
    let entry = index.get(position.checked_sub(1)?)?;
    if vaddr >= entry.end {
        return None;
    }
    let offset = S::Offset::from(entry.offset);
    section
        .fde_from_offset(bases, offset, S::cie_from_offset)
        .ok()
}

fn compile_row<'a, S>(row: &UnwindTableRow<usize>, section: &S, signal: bool) -> UnwindRow
where
    S: UnwindSection<Reader<'a>>,
{
    UnwindRow {
        cfa: if signal {
            Cfa::Signal
        } else {
            compile_cfa(row.cfa(), section)
        },
        ra: compile_rule(row.register(X86_64::RA)),
        rbp: compile_rule(row.register(X86_64::RBP)),
    }
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

    #[test]
    fn go_rows_follow_the_stack_pointer_delta() {
        let row = |delta| go_row(delta).map(|row| (row.cfa, row.ra, row.rbp));
        let ra = Rule::CfaOffset(-8);
        assert_eq!(row(0), Some((Cfa::RspOffset(8), ra, Rule::Same)));
        assert_eq!(
            row(24),
            Some((Cfa::RspOffset(32), ra, Rule::CfaOffset(-16)))
        );
        assert_eq!(row(-8), Some((Cfa::RspOffset(0), ra, Rule::Same)));
        assert_eq!(row(i64::from(i32::MAX)), None);
    }
    use agent_fixtures::CHAIN;

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

    fn row(source: &CfiSource<&[u8]>, vaddr: u64) -> Option<UnwindRow> {
        source.row(vaddr, &mut CfiContext::new())
    }

    #[test]
    fn leaf_without_frame_pointer_has_rsp_based_cfa() {
        for source in [CfiSource::new(CHAIN), CfiSource::build(CHAIN, false, true)] {
            let source = source.expect("CFI parses");
            let leaf = function("burn_leaf");
            let row = row(&source, leaf + 4).expect("burn_leaf has an FDE");
            // No frame: the return address sits right at the stack pointer.
            assert_eq!(row.cfa, Cfa::RspOffset(8));
            assert_eq!(row.ra, Rule::CfaOffset(-8));
        }
    }

    #[test]
    fn header_table_and_index_agree() {
        let with_header = CfiSource::new(CHAIN).expect("parses");
        let with_index = CfiSource::build(CHAIN, false, true).expect("parses");
        assert!(
            with_header.eh_frame_index.is_empty(),
            "the header table is used"
        );
        assert!(!with_index.eh_frame_index.is_empty());
        let start = function("level_one");
        for vaddr in start..start + 32 {
            assert_eq!(
                row(&with_header, vaddr),
                row(&with_index, vaddr),
                "at {vaddr:#x}"
            );
        }
    }

    #[test]
    fn framed_function_switches_to_rbp_after_the_prologue() {
        let source = CfiSource::new(CHAIN).expect("parses");
        let start = function("level_three");
        assert_eq!(row(&source, start).map(|r| r.cfa), Some(Cfa::RspOffset(8)));
        // push %rbp; mov %rsp,%rbp: 1 + 3 bytes.
        let body = row(&source, start + 4).expect("covered");
        assert_eq!(body.cfa, Cfa::RbpOffset(16));
        assert_eq!(body.rbp, Rule::CfaOffset(-16));
    }

    #[test]
    fn addresses_outside_every_fde_have_no_row() {
        let source = CfiSource::new(CHAIN).expect("parses");
        assert!(row(&source, 0).is_none());
        assert!(row(&source, u64::MAX).is_none());
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
        assert!(CfiSource::new(&b"not elf"[..]).is_err());
        let mut corrupt = CHAIN.to_vec();
        for index in (512..corrupt.len()).step_by(37) {
            corrupt[index] = corrupt[index].wrapping_add(0x5b);
        }
        let probe = |data: &[u8]| {
            for use_header in [true, false] {
                if let Ok(source) = CfiSource::build(data, use_header, true) {
                    for vaddr in (0..0x3000).step_by(7) {
                        let _ = row(&source, vaddr);
                    }
                }
            }
        };
        probe(&corrupt);
        for len in (0..CHAIN.len()).step_by(211) {
            probe(&CHAIN[..len]);
        }
    }
}
