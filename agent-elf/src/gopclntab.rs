//! Go's own function table, `.gopclntab`, which the Go runtime unwinds and
//! names its frames with, read where the object is mapped:
//! - the stack pointer deltas (`pcsp`), for the unwinder: a Go binary's
//!   CFI is otherwise only a zlib-compressed `.debug_frame`, inflated whole
//!   and indexed before its first row is read (16 MB of heap and 20 ms for
//!   a 230 MB binary);
//! - function names, files and lines (`funcnametab`, `pcfile`, `pcln`), for
//!   the symbolizer: a stripped Go binary (`-ldflags=-s -w`) has no symbol
//!   table and no DWARF but keeps this table, and a large one's symbol
//!   table takes ~10 ms to sort where a lookup here is a binary search.
//!
//! The layout is the one Go 1.18 and later write (`runtime/symtab.go`,
//! `pcHeader`, `functab`, `_func`); older binaries are left to their
//! `.debug_frame` and symbol table.

use std::ops::Range;

use object::{Object, ObjectSection, ObjectSymbol};

/// `pcHeader.magic` of Go 1.18–1.19 and of Go 1.20 and later.
const MAGICS: [u32; 2] = [0xffff_fff0, 0xffff_fff1];
/// `magic`, two pad bytes, `minLC`, `ptrSize`, then eight words.
const HEADER_WORDS: usize = 8;
/// Fields of `_func`, by byte offset.
const FUNC_NAME: usize = 4;
const FUNC_PCSP: usize = 16;
const FUNC_PCFILE: usize = 20;
const FUNC_PCLN: usize = 24;
const FUNC_NPCDATA: usize = 28;
const FUNC_CU: usize = 32;
/// Where the `pcdata` offsets start: Go 1.20 added `startLine` before them.
const FUNC_PCDATA_GO118: usize = 40;
const FUNC_PCDATA_GO120: usize = 44;
/// `pcHeader.magic` of Go 1.20 and later.
const MAGIC_GO120: u32 = 0xffff_fff1;
/// The `pcdata` table giving the inlining tree index (-1: not inlined).
const PCDATA_INLINE_TREE_INDEX: usize = 2;
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
    /// Go 1.20 and later (`_func` has `startLine`).
    go120: bool,
    /// Offsets from the section's start.
    funcnametab: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    functab: usize,
}

/// A Go function covering an address, as `.gopclntab` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoFunction<'a> {
    /// As Go spells it: `main.main`, `net/http.(*conn).serve`.
    pub name: &'a str,
    /// The function's entry (link-time address).
    pub entry: u64,
    /// File and line of the address; none inside code inlined from
    /// another function, whose name the table would need the inlining
    /// tree (in `go:func.*`) to give.
    pub file: Option<&'a str>,
    pub line: Option<u32>,
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
        let offset = |index: usize| usize::try_from(word(index)?).ok();
        let table = Self {
            section,
            text_start,
            quantum: u64::from(quantum),
            functions,
            go120: magic == MAGIC_GO120,
            funcnametab: offset(3)?,
            cutab: offset(4)?,
            filetab: offset(5)?,
            pctab: offset(6)?,
            functab: offset(7)?,
        };
        // The whole `functab` (one more entry than functions: the end of
        // the last) must be there; everything else is checked as read.
        let functab_end = functions
            .checked_add(1)?
            .checked_mul(8)?
            .checked_add(table.functab)?;
        (8 + 8 * HEADER_WORDS <= bytes.len() && functab_end <= bytes.len()).then_some(table)
    }

    /// The table of an ELF object, if it has one firn reads. The text
    /// address the header leaves out (Go 1.2x) is, in a binary Go linked
    /// alone (no C objects, so no `.eh_frame`), the start of `.text`, where
    /// Go's linker puts `runtime.text`; with C code linked in, where the
    /// symbol `runtime.text` is (a walk of the symbol table: 250k symbols
    /// in a large binary); a binary with C code and no symbols gets none:
    /// its C text may come first.
    pub fn find(file: &object::File<'_>, data: &[u8]) -> Option<Self> {
        let section = file.section_by_name(".gopclntab")?;
        let (offset, size) = section.file_range()?;
        let start = usize::try_from(offset).ok()?;
        let range = start..start.checked_add(usize::try_from(size).ok()?)?;
        let bytes = data.get(range.clone())?;
        // Most binaries write the text address: only look for the symbol
        // (a walk of the whole symbol table) when the header has none.
        let text_base = match bytes.get(24..32) {
            Some(text_start) if text_start.iter().any(|&byte| byte != 0) => None,
            _ => match file.section_by_name(".eh_frame") {
                None => file.section_by_name(".text").map(|text| text.address()),
                Some(_) => file
                    .symbol_by_name("runtime.text")
                    .map(|symbol| symbol.address()),
            },
        };
        Self::parse(data, range, text_base)
    }

    /// The stack pointer's distance below where it was at the function's
    /// entry, at link-time address `vaddr` of `data` (the object's bytes):
    /// the function's `pcsp` table evaluated there.
    pub fn sp_delta(&self, data: &[u8], vaddr: u64) -> Option<i64> {
        let bytes = data.get(self.section.clone())?;
        let (function, entry) = self.function_at(bytes, vaddr)?;
        self.pc_value(bytes, function, FUNC_PCSP, entry, vaddr)
    }

    /// The Go function covering link-time address `vaddr` of `data` (the
    /// object's bytes), its file and line there.
    pub fn function<'a>(&self, data: &'a [u8], vaddr: u64) -> Option<GoFunction<'a>> {
        let bytes = data.get(self.section.clone())?;
        let (function, entry) = self.function_at(bytes, vaddr)?;
        let name_offset = read_u32(bytes, function.checked_add(FUNC_NAME)?)?;
        let name = c_string(bytes, self.funcnametab, name_offset)?;
        let inlined = self
            .pcdata(bytes, function, PCDATA_INLINE_TREE_INDEX)
            .and_then(|table| self.value_at(table, entry, vaddr))
            .is_some_and(|index| index >= 0);
        let (file, line) = if inlined {
            (None, None)
        } else {
            let line = self
                .pc_value(bytes, function, FUNC_PCLN, entry, vaddr)
                .and_then(|line| u32::try_from(line).ok())
                .filter(|&line| line > 0);
            (self.file(bytes, function, entry, vaddr), line)
        };
        Some(GoFunction {
            name,
            entry,
            file,
            line,
        })
    }

    /// The `_func` (its offset in the section) and entry address of the
    /// function covering `vaddr`.
    fn function_at(&self, bytes: &[u8], vaddr: u64) -> Option<(usize, u64)> {
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
        Some((function, entry))
    }

    /// The value at `vaddr` of the pc-value table whose offset is the
    /// `_func` field at `field`.
    fn pc_value(
        &self,
        bytes: &[u8],
        function: usize,
        field: usize,
        entry: u64,
        vaddr: u64,
    ) -> Option<i64> {
        let table = read_u32(bytes, function.checked_add(field)?)?;
        let table = bytes.get(self.pctab.checked_add(usize::try_from(table).ok()?)?..)?;
        self.value_at(table, entry, vaddr)
    }

    /// The function's `pcdata` table `index`, if it has one.
    fn pcdata<'a>(&self, bytes: &'a [u8], function: usize, index: usize) -> Option<&'a [u8]> {
        let count = read_u32(bytes, function.checked_add(FUNC_NPCDATA)?)?;
        if index >= usize::try_from(count).ok()? {
            return None;
        }
        let first = if self.go120 {
            FUNC_PCDATA_GO120
        } else {
            FUNC_PCDATA_GO118
        };
        let offset = read_u32(bytes, function.checked_add(first + 4 * index)?)?;
        if offset == 0 {
            return None;
        }
        bytes.get(self.pctab.checked_add(usize::try_from(offset).ok()?)?..)
    }

    /// The file at `vaddr`: `pcfile` gives its index among its compilation
    /// unit's files, `cutab` where that file's name is in `filetab`.
    fn file<'a>(
        &self,
        bytes: &'a [u8],
        function: usize,
        entry: u64,
        vaddr: u64,
    ) -> Option<&'a str> {
        let index = self.pc_value(bytes, function, FUNC_PCFILE, entry, vaddr)?;
        let unit = read_u32(bytes, function.checked_add(FUNC_CU)?)?;
        let slot = u64::from(unit).checked_add(u64::try_from(index).ok()?)?;
        let at = self
            .cutab
            .checked_add(usize::try_from(slot.checked_mul(4)?).ok()?)?;
        match read_u32(bytes, at)? {
            u32::MAX => None,
            offset => c_string(bytes, self.filetab, offset).filter(|file| !file.is_empty()),
        }
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

/// The NUL-terminated UTF-8 string at `offset` in the table at `table`.
fn c_string(bytes: &[u8], table: usize, offset: u32) -> Option<&str> {
    let start = table.checked_add(usize::try_from(offset).ok()?)?;
    let rest = bytes.get(start..)?;
    let end = rest.iter().position(|&byte| byte == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
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

    /// A table with one function, `main.work` at 0x1000..0x1010 in
    /// `/src/work.go`: its pcsp says 0 for four bytes, 8 for four, then 24;
    /// its lines are 10 for eight bytes then 12; its last four bytes are
    /// inlined code. `go120`: the layout of Go 1.20 and later, else 1.18.
    fn table(go120: bool) -> Vec<u8> {
        let header_end = 8 + 8 * HEADER_WORDS;
        let funcnametab = b"\0main.work\0";
        let cutab = 1u32.to_le_bytes();
        let filetab = b"\0/src/work.go\0";
        // Offset 0 of pctab is no table.
        let pcsp: &[u8] = &[0x02, 4, 0x10, 4, 0x20, 8, 0];
        let pcfile: &[u8] = &[0x02, 16, 0];
        let pcln: &[u8] = &[0x16, 8, 0x04, 8, 0];
        let inline: &[u8] = &[0x00, 12, 0x02, 4, 0];
        let mut pctab = vec![0u8];
        let mut place = |table: &[u8]| {
            pctab.extend_from_slice(table);
            (pctab.len() - table.len()) as u32
        };
        let (pcsp, pcfile, pcln, inline) = (place(pcsp), place(pcfile), place(pcln), place(inline));
        let funcnametab_at = header_end;
        let cutab_at = funcnametab_at + funcnametab.len();
        let filetab_at = cutab_at + cutab.len();
        let pctab_at = filetab_at + filetab.len();
        let functab_at = pctab_at + pctab.len();

        let mut bytes = Vec::new();
        let magic: u32 = if go120 { MAGIC_GO120 } else { 0xffff_fff0 };
        bytes.extend_from_slice(&magic.to_le_bytes());
        bytes.extend_from_slice(&[0, 0, 1, 8]);
        for word in [
            1,
            1,
            0x1000,
            funcnametab_at,
            cutab_at,
            filetab_at,
            pctab_at,
            functab_at,
        ] {
            bytes.extend_from_slice(&(word as u64).to_le_bytes());
        }
        bytes.extend_from_slice(funcnametab);
        bytes.extend_from_slice(&cutab);
        bytes.extend_from_slice(filetab);
        bytes.extend_from_slice(&pctab);
        // functab: the function, then the end.
        for word in [0u32, 16, 0x10, 0] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        // _func: entryOff, nameOff, args, deferreturn, pcsp, pcfile, pcln,
        // npcdata, cuOffset, [startLine,] funcID/flag/pad/nfuncdata, pcdata.
        let mut func = vec![0, 1, 0, 0, pcsp, pcfile, pcln, 3, 0];
        if go120 {
            func.push(7);
        }
        func.extend([0, 0, 0, inline]);
        for field in func {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn stack_pointer_deltas_follow_the_table() {
        let bytes = table(true);
        let go = GoTable::parse(&bytes, 0..bytes.len(), None).expect("a table");
        let delta = |vaddr| go.sp_delta(&bytes, vaddr);
        assert_eq!(delta(0x1000), Some(0));
        assert_eq!(delta(0x1003), Some(0));
        assert_eq!(delta(0x1004), Some(8));
        assert_eq!(delta(0x100f), Some(24));
        assert_eq!(delta(0x1010), None);
        assert_eq!(delta(0xfff), None);
    }

    #[test]
    fn functions_are_named_with_file_and_line_outside_inlined_code() {
        for go120 in [true, false] {
            let bytes = table(go120);
            let go = GoTable::parse(&bytes, 0..bytes.len(), None).expect("a table");
            let function = |vaddr| go.function(&bytes, vaddr);
            let work = |file, line| {
                Some(GoFunction {
                    name: "main.work",
                    entry: 0x1000,
                    file,
                    line,
                })
            };
            assert_eq!(function(0x1000), work(Some("/src/work.go"), Some(10)));
            assert_eq!(function(0x1007), work(Some("/src/work.go"), Some(10)));
            assert_eq!(function(0x1008), work(Some("/src/work.go"), Some(12)));
            assert_eq!(function(0x100c), work(None, None), "inlined code");
            assert_eq!(function(0x1010), None);
        }
    }

    #[test]
    fn truncated_or_foreign_tables_are_refused_or_answer_nothing() {
        let bytes = table(true);
        for end in 0..bytes.len() {
            let cut = &bytes[..end];
            if let Some(go) = GoTable::parse(cut, 0..cut.len(), None) {
                // Whatever is missing is a `None`, never a panic.
                for vaddr in 0x0ff0..0x1020 {
                    let _ = go.sp_delta(cut, vaddr);
                    let _ = go.function(cut, vaddr);
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
        assert_eq!(placed.sp_delta(&unplaced, 0x1004), Some(8));
    }

    /// Every function of a real Go 1.26 binary's symbol table is named
    /// alike by its `.gopclntab`, at its entry and at its last byte.
    #[test]
    fn a_real_table_names_every_function_as_the_symbol_table_does() {
        let data = agent_fixtures::inflate(agent_fixtures::GO_CHAIN_PCLNTAB_EXTRACT)
            .expect("go_chain extract");
        let file = object::File::parse(&data[..]).expect("ELF");
        let go = GoTable::find(&file, &data).expect("a table");
        let mut named = 0;
        for symbol in file.symbols() {
            let (address, size) = (symbol.address(), symbol.size());
            let Ok(name) = symbol.name() else {
                continue;
            };
            if symbol.kind() != object::SymbolKind::Text || size == 0 {
                continue;
            }
            for vaddr in [address, address + size - 1] {
                let function = go
                    .function(&data, vaddr)
                    .unwrap_or_else(|| panic!("{name}+{:#x} not in the table", vaddr - address));
                // The symbol table marks assembly with its ABI, and spells
                // the runtime's `·` as `.`.
                let name = name.strip_suffix(".abi0").unwrap_or(name);
                let table_name = function.name.replace('·', ".");
                assert_eq!((table_name.as_str(), function.entry), (name, address));
            }
            named += 1;
        }
        assert!(named > 1000, "{named} functions compared");
        let main = go
            .function(&data, symbol_address(&file, "main.level_three"))
            .expect("main.level_three");
        assert!(
            main.file.is_some_and(|file| file.ends_with("/main.go")),
            "{main:?}"
        );
        assert!(main.line.is_some_and(|line| line > 0), "{main:?}");
    }

    fn symbol_address(file: &object::File<'_>, name: &str) -> u64 {
        file.symbols()
            .find(|symbol| symbol.name() == Ok(name))
            .map(|symbol| symbol.address())
            .unwrap_or_else(|| panic!("no symbol {name}"))
    }
}
