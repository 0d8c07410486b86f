//! Kernel symbols from the text of `/proc/kallsyms` and the kernel's build
//! id from the bytes of `/sys/kernel/notes`, both read by the caller.

use agent_elf::BuildId;

#[derive(Debug, thiserror::Error)]
pub enum KallsymsError {
    #[error(
        "kernel symbol addresses are hidden (kernel.kptr_restrict); kernel frames stay \
         unsymbolized. Run firn as root or with CAP_SYSLOG, or set kernel.kptr_restrict=0"
    )]
    Restricted,
    #[error("no kernel text symbols in kallsyms")]
    Empty,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    address: u64,
    name_start: u32,
    name_len: u16,
    /// Index into `modules`, or u16::MAX for the core kernel.
    module: u16,
}

/// Kernel text symbols, sorted by address.
#[derive(Debug, Default)]
pub struct Kallsyms {
    entries: Vec<Entry>,
    names: String,
    modules: Vec<String>,
}

/// A kernel symbol covering an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSymbol<'a> {
    pub name: &'a str,
    /// The module, for symbols outside the core kernel.
    pub module: Option<&'a str>,
    pub address: u64,
}

impl Kallsyms {
    /// Parses the text of /proc/kallsyms, keeping text (code) symbols.
    pub fn parse(text: &str) -> Result<Self, KallsymsError> {
        Self::parse_bytes(text.as_bytes())
    }

    /// Like [`Self::parse`], over bytes: the file is ~10 MB on a common
    /// kernel, and only the names kept need to be valid UTF-8.
    pub fn parse_bytes(text: &[u8]) -> Result<Self, KallsymsError> {
        let mut builder = KallsymsBuilder::default();
        builder.push_lines(text);
        builder.finish()
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Lowest and highest symbol addresses (the kernel mapping's range).
    pub fn range(&self) -> Option<(u64, u64)> {
        Some((self.entries.first()?.address, self.entries.last()?.address))
    }

    /// The symbol at or below `address`. Kallsyms has no sizes, so an
    /// address beyond the last symbol is not attributed.
    pub fn lookup(&self, address: u64) -> Option<KernelSymbol<'_>> {
        let index = self.entries.partition_point(|e| e.address <= address);
        if index == 0 || index == self.entries.len() {
            return None;
        }
        let entry = self.entries[index - 1];
        let start = entry.name_start as usize;
        Some(KernelSymbol {
            name: &self.names[start..start + usize::from(entry.name_len)],
            module: self
                .modules
                .get(usize::from(entry.module))
                .map(String::as_str),
            address: entry.address,
        })
    }
}

/// Builds a [`Kallsyms`] from the text of /proc/kallsyms a piece at a
/// time, so the caller never holds the whole file (5 MB and more) beside
/// the table.
#[derive(Debug, Default)]
pub struct KallsymsBuilder {
    table: Kallsyms,
    saw_symbols: bool,
}

impl KallsymsBuilder {
    /// Takes whole lines (a last line without its newline counts as one).
    pub fn push_lines(&mut self, text: &[u8]) {
        // One vectorised check of the whole piece spares a UTF-8 check of
        // each name (a tenth of the parse); kallsyms is ASCII.
        let ascii = text.is_ascii();
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', text).chain(std::iter::once(text.len())) {
            let line = &text[start..end];
            start = end + 1;
            self.push_line(line, ascii);
        }
    }

    fn push_line(&mut self, line: &[u8], ascii: bool) {
        let mut fields = Fields(line);
        let (address, kind, name, module) = match canonical_fields(line) {
            Some(parts) => parts,
            None => {
                let (Some(address), Some(kind), Some(name)) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    return;
                };
                (address, kind, name, fields.next())
            }
        };
        self.saw_symbols = true;
        if !matches!(kind, b"t" | b"T" | b"w" | b"W") {
            return;
        }
        let Some(address) = parse_hex(address) else {
            return;
        };
        let name = if ascii {
            // SAFETY: ASCII is valid UTF-8.
            unsafe { std::str::from_utf8_unchecked(name) }
        } else {
            let Ok(name) = std::str::from_utf8(name) else {
                return;
            };
            name
        };
        if address == 0 {
            return;
        }
        let table = &mut self.table;
        let module = module
            .and_then(|m| std::str::from_utf8(m).ok())
            .and_then(|m| m.strip_prefix('[')?.strip_suffix(']'))
            .map_or(u16::MAX, |module| table.module_index(module));
        let (Ok(name_start), Ok(name_len)) =
            (u32::try_from(table.names.len()), u16::try_from(name.len()))
        else {
            return;
        };
        table.names.push_str(name);
        table.entries.push(Entry {
            address,
            name_start,
            name_len,
            module,
        });
    }

    /// The table, sorted by address.
    pub fn finish(self) -> Result<Kallsyms, KallsymsError> {
        let mut table = self.table;
        if table.entries.is_empty() {
            return Err(if self.saw_symbols {
                KallsymsError::Restricted
            } else {
                KallsymsError::Empty
            });
        }
        // The kernel lists its own symbols in address order; only modules
        // may break it.
        if !table.entries.is_sorted_by_key(|e| e.address) {
            table.entries.sort_by_key(|e| e.address);
        }
        table.entries.shrink_to_fit();
        table.names.shrink_to_fit();
        Ok(table)
    }
}

impl Kallsyms {
    fn module_index(&mut self, module: &str) -> u16 {
        if let Some(index) = self.modules.iter().position(|m| m == module) {
            return u16::try_from(index).unwrap_or(u16::MAX);
        }
        if self.modules.len() >= usize::from(u16::MAX - 1) {
            return u16::MAX;
        }
        self.modules.push(module.to_owned());
        u16::try_from(self.modules.len() - 1).unwrap_or(u16::MAX)
    }
}

/// A line's address, type, name and module.
type LineFields<'a> = (&'a [u8], &'a [u8], &'a [u8], Option<&'a [u8]>);

/// The fields of a line as the kernel writes them on a 64-bit machine,
/// `%px %c %s` then `\t[%s]` for a module, cut at fixed places without
/// scanning for separators (a third of the parse time); `None` for any
/// other shape, which [`Fields`] splits.
fn canonical_fields(line: &[u8]) -> Option<LineFields<'_>> {
    const ADDRESS: usize = 16;
    if line.len() <= ADDRESS + 3 || line[ADDRESS] != b' ' || line[ADDRESS + 2] != b' ' {
        return None;
    }
    let rest = &line[ADDRESS + 3..];
    // One scan finds the tab before a module and refuses a name with a
    // space in it.
    let (name, module) = match memchr::memchr2(b'\t', b' ', rest) {
        Some(at) if rest[at] == b'\t' => (&rest[..at], Some(&rest[at + 1..])),
        Some(_) => return None,
        None => (rest, None),
    };
    if name.is_empty() {
        return None;
    }
    Some((
        &line[..ADDRESS],
        &line[ADDRESS + 1..ADDRESS + 2],
        name,
        module,
    ))
}

/// The fields of a kallsyms line, which the kernel separates with spaces
/// and a tab (before the module). A split with a per-byte predicate took
/// most of the parse time of a 3 MB file.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.0.iter().position(|b| !b.is_ascii_whitespace())?;
        let rest = &self.0[start..];
        let end = memchr::memchr3(b' ', b'\t', b'\n', rest).unwrap_or(rest.len());
        self.0 = &rest[end..];
        Some(&rest[..end])
    }
}

fn parse_hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &digit| {
        let nibble = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            b'A'..=b'F' => digit - b'A' + 10,
            _ => return None,
        };
        Some(value << 4 | u64::from(nibble))
    })
}

/// The GNU build id among the ELF notes in `/sys/kernel/notes`.
pub fn parse_build_id_note(notes: &[u8]) -> Option<BuildId> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let mut rest = notes;
    while rest.len() >= 12 {
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(rest.get(at..at + 4)?.try_into().ok()?))
        };
        let (name_size, desc_size, kind) = (word(0)? as usize, word(4)? as usize, word(8)?);
        let name_end = 12 + name_size.next_multiple_of(4);
        let desc_end = name_end.checked_add(desc_size.next_multiple_of(4))?;
        if desc_end > rest.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && rest.get(12..12 + name_size)? == b"GNU\0" {
            return Some(BuildId::new(&rest[name_end..name_end + desc_size]));
        }
        rest = &rest[desc_end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 t do_one_initcall
ffffffff81002000 D some_data
ffffffff81003000 T ksys_write
ffffffff81003400 W weak_thing
ffffffffc0a00000 t ext4_file_write_iter\t[ext4]
ffffffffc0a01000 t ext4_end\t[ext4]
";

    #[test]
    fn looks_up_text_symbols_with_modules() {
        let table = Kallsyms::parse(KALLSYMS).expect("parses");
        assert_eq!(table.len(), 6, "data symbols are skipped");
        let hit = table.lookup(0xffffffff81003010).expect("covered");
        assert_eq!((hit.name, hit.module), ("ksys_write", None));
        // Data symbols do not split the text symbol before them.
        assert_eq!(
            table.lookup(0xffffffff81002010).map(|s| s.name),
            Some("do_one_initcall")
        );
        let module = table.lookup(0xffffffffc0a00010).expect("module symbol");
        assert_eq!(
            (module.name, module.module),
            ("ext4_file_write_iter", Some("ext4"))
        );
        assert_eq!(table.lookup(0x1000), None);
        assert_eq!(table.lookup(u64::MAX), None, "beyond the last symbol");
    }

    #[test]
    fn out_of_order_lines_are_sorted_and_bad_addresses_skipped() {
        let text = "ffffffffc0001000 t mod_fn\t[m]\nffffffff81000000 T early\nzzzz T bad\nffffffff81000100 T later\n";
        let table = Kallsyms::parse(text).expect("parses");
        assert_eq!(table.len(), 3);
        assert_eq!(
            table.lookup(0xffffffff81000010).map(|s| s.name),
            Some("early")
        );
        assert_eq!(
            table.lookup(0xffffffff81000110).map(|s| s.name),
            Some("later")
        );
        assert_eq!(parse_hex(b"ff"), Some(255));
        assert_eq!(parse_hex(b""), None);
        assert_eq!(parse_hex(b"12345678901234567"), None);
        assert_eq!(parse_hex(b"xyz"), None);
    }

    /// A piece that is not all ASCII has each name checked on its own: a
    /// name that is not UTF-8 is skipped, the others are kept.
    #[test]
    fn names_outside_ascii_are_checked_one_by_one() {
        let mut text = b"ffffffff81000000 T caf\xc3\xa9\n".to_vec();
        text.extend_from_slice(b"ffffffff81000100 T bad\xff\nffffffff81000200 T plain\n");
        text.extend_from_slice(b"ffffffff81000300 T end\n");
        let table = Kallsyms::parse_bytes(&text).expect("parses");
        assert_eq!(table.len(), 3);
        assert_eq!(
            table.lookup(0xffffffff81000010).map(|s| s.name),
            Some("caf\u{e9}")
        );
        assert_eq!(
            table.lookup(0xffffffff81000210).map(|s| s.name),
            Some("plain")
        );
    }

    /// The fixed cut and the general split read a canonical line alike; a
    /// line of another shape goes to the split.
    #[test]
    fn canonical_lines_are_cut_as_the_split_reads_them() {
        for line in KALLSYMS.lines() {
            let line = line.as_bytes();
            let mut fields = Fields(line);
            let split = (fields.next(), fields.next(), fields.next(), fields.next());
            let (address, kind, name, module) = canonical_fields(line).expect("canonical");
            assert_eq!(split, (Some(address), Some(kind), Some(name), module));
        }
        for odd in [
            "ffffffff81000000  T  two_spaces",
            "ffffffff81000000 T",
            "81000000 T short_address",
            "ffffffff81000000 T name with spaces",
        ] {
            assert_eq!(canonical_fields(odd.as_bytes()), None, "{odd}");
        }
        let table = Kallsyms::parse("ffffffff81000000  T  spaced\nffffffff81000100 T next\n")
            .expect("parses");
        assert_eq!(
            table.lookup(0xffffffff81000010).map(|s| s.name),
            Some("spaced")
        );
    }

    #[test]
    fn hidden_addresses_are_reported_as_restricted() {
        let hidden = "0000000000000000 T _stext\n0000000000000000 T ksys_write\n";
        assert!(matches!(
            Kallsyms::parse(hidden),
            Err(KallsymsError::Restricted)
        ));
        assert!(matches!(Kallsyms::parse(""), Err(KallsymsError::Empty)));
        assert!(Kallsyms::parse("garbage\nzz T\n").is_err());
    }

    #[test]
    fn build_id_note_is_found_after_other_notes() {
        let mut notes = Vec::new();
        // A "Linux" note first, then the GNU build id.
        for (name, kind, desc) in [
            (&b"Linux\0"[..], 6u32, &[1u8, 2, 3, 4][..]),
            (b"GNU\0", 3, &[0xab; 20]),
        ] {
            notes.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            notes.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
            notes.extend_from_slice(&kind.to_ne_bytes());
            notes.extend_from_slice(name);
            notes.resize(notes.len().next_multiple_of(4), 0);
            notes.extend_from_slice(desc);
            notes.resize(notes.len().next_multiple_of(4), 0);
        }
        let id = parse_build_id_note(&notes).expect("found");
        assert_eq!(id.as_bytes(), &[0xab; 20]);
        assert_eq!(parse_build_id_note(&notes[..30]), None);
        assert_eq!(parse_build_id_note(&[]), None);
    }
}
