//! Reading what firn needs from ELF files: build id, load segments, where
//! the debug info is, function symbols, separate debug files. Pure
//! functions over bytes (no I/O), so they are tested on checked-in fixtures
//! and corrupt inputs without root.

pub mod debug_files;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod gopclntab;
mod pages;

use std::{fmt, io, ops::Deref, sync::Arc};

use object::{
    Endianness, Object, ObjectSection, ObjectSegment, ReadRef, elf,
    read::elf::{FileHeader, Sym},
};

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not a parsable ELF file")]
    Parse {
        #[source]
        source: object::Error,
    },
    #[error("not an ELF file (format {format:?})")]
    NotElf { format: object::BinaryFormat },
    #[error("no ELF data given")]
    NoInput,
    #[error("could not read the file")]
    Read {
        #[source]
        source: io::Error,
    },
}

/// Bytes that tables read from an object keep pointing into.
pub trait SharedBytes: AsRef<[u8]> + Send + Sync {
    /// Lets the kernel drop the pages of a file mapping from this process
    /// (they stay in the page cache and fault back in when touched), so a
    /// one-pass read of a large object does not stay in its RSS. A no-op
    /// for bytes in memory.
    fn release_pages(&self) {}
}

impl SharedBytes for Vec<u8> {}
impl SharedBytes for &'static [u8] {}

/// The bytes of an object (memory-mapped, or in memory), shared by the
/// tables read from it so they need not copy what they point into.
#[derive(Clone)]
pub struct Bytes(Arc<dyn SharedBytes>);

impl Bytes {
    pub fn new(bytes: Arc<dyn SharedBytes>) -> Self {
        Self(bytes)
    }

    pub fn from_static(bytes: &'static [u8]) -> Self {
        Self(Arc::new(bytes))
    }

    pub fn release_pages(&self) {
        self.0.release_pages();
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

// SAFETY: the bytes live behind an `Arc` (a mapping or a heap buffer that is
// never resized), so moving or cloning a `Bytes` never moves them, and
// `deref` returns the same slice for the life of the value.
unsafe impl gimli::StableDeref for Bytes {}
// SAFETY: as above; clones share the same allocation.
unsafe impl gimli::CloneStableDeref for Bytes {}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

/// Which object a process maps, as the caller knows it: what per-object
/// choices are remembered by and what reports name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKey {
    File {
        dev: u64,
        inode: u64,
    },
    /// The vDSO image, the same for every 64-bit process on this kernel.
    Vdso,
}

/// What caches of parsed object contents are keyed by: the build id when
/// the object has one (copies of one binary in different places share an
/// entry), else the object's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ContentKey {
    BuildId(BuildId),
    Object(ObjectKey),
}

impl ContentKey {
    pub fn of(key: ObjectKey, layout: &ElfLayout) -> Self {
        match &layout.build_id {
            Some(build_id) => Self::BuildId(build_id.clone()),
            None => Self::Object(key),
        }
    }
}

/// The GNU build id of an object, as bytes (cheap to clone: cache keys).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BuildId(Arc<[u8]>);

impl BuildId {
    pub fn new(bytes: &[u8]) -> Self {
        Self(bytes.into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A PT_LOAD program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub file_size: u64,
    pub vaddr: u64,
}

/// A `.gnu_debuglink`: the file name of the separate debug file and the
/// CRC-32 of its whole contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugLink {
    pub name: String,
    pub crc: u32,
}

/// What the process table keeps about an object.
#[derive(Clone, Debug, Default)]
pub struct ElfLayout {
    pub build_id: Option<BuildId>,
    pub segments: Vec<LoadSegment>,
    pub debug_link: Option<DebugLink>,
    /// The object carries its own DWARF (`.debug_info` with contents).
    pub has_debug_info: bool,
    /// The object has a `.symtab` (not stripped).
    pub has_symtab: bool,
}

impl ElfLayout {
    /// The link-time virtual address of a byte at `file_offset`.
    pub fn vaddr_for_file_offset(&self, file_offset: u64) -> Option<u64> {
        // Segment fields come from the file: a vaddr near the top of the
        // address space must not wrap.
        self.segments
            .iter()
            .find(|s| file_offset >= s.file_offset && file_offset - s.file_offset < s.file_size)
            .and_then(|s| s.vaddr.checked_add(file_offset - s.file_offset))
    }
}

fn parse<'data, R: ReadRef<'data>>(data: R) -> Result<object::File<'data, R>, ElfError> {
    let file = object::File::parse(data).map_err(|source| ElfError::Parse { source })?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(ElfError::NotElf {
            format: file.format(),
        });
    }
    Ok(file)
}

pub fn read_layout(data: &[u8]) -> Result<ElfLayout, ElfError> {
    layout_of(data)
}

/// [`read_layout`] over bytes in memory or a file read through a cache.
fn layout_of<'data, R: ReadRef<'data>>(data: R) -> Result<ElfLayout, ElfError> {
    let file = parse(data)?;
    let build_id = file.build_id().ok().flatten().map(BuildId::new);
    let segments = file
        .segments()
        .map(|segment| {
            let (file_offset, file_size) = segment.file_range();
            LoadSegment {
                file_offset,
                file_size,
                vaddr: segment.address(),
            }
        })
        .collect();
    // A link whose name is not UTF-8 or holds a path separator cannot name
    // a file next to the object; GDB ignores such links too.
    let debug_link = file.gnu_debuglink().ok().flatten().and_then(|(name, crc)| {
        let name = std::str::from_utf8(name).ok()?;
        (!name.is_empty() && !name.contains('/') && name != "." && name != "..").then(|| {
            DebugLink {
                name: name.to_owned(),
                crc,
            }
        })
    });
    // Debug files stripped of DWARF keep the section header with no bytes.
    let has_debug_info = file
        .section_by_name(".debug_info")
        .is_some_and(|section| section.file_range().is_some_and(|(_, size)| size > 0));
    Ok(ElfLayout {
        build_id,
        segments,
        debug_link,
        has_debug_info,
        has_symtab: file.symbol_table().is_some(),
    })
}

/// One function symbol, 16 bytes: a large library has hundreds of
/// thousands, and the symbol cache holds as many tables as fit.
#[derive(Clone, Copy, Debug)]
struct SymbolEntry {
    address: u64,
    /// The function's size (saturated: none is 4 GiB), 0 when unknown.
    size: u32,
    /// Where the name starts in its source file's string table; the top
    /// bit says which source (0: the object, 1: its debug file). The name
    /// runs to the string table's NUL.
    name: u32,
}

const _: () = assert!(std::mem::size_of::<SymbolEntry>() == 16);

/// The bit of [`SymbolEntry::name`] that says which source holds the name.
const SECOND_SOURCE: u32 = 1 << 31;

impl SymbolEntry {
    fn source(&self) -> usize {
        usize::from(self.name & SECOND_SOURCE != 0)
    }

    fn name_offset(&self) -> usize {
        (self.name & !SECOND_SOURCE) as usize
    }
}

/// Function symbols of one object, sorted by address. Names are not
/// copied: they are read from the files' string tables, which stay mapped
/// (a large C++ or Rust library has megabytes of them).
#[derive(Debug, Default)]
pub struct SymbolTable {
    entries: Vec<SymbolEntry>,
    sources: Vec<Bytes>,
}

/// A symbol that covers an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymbolHit<'a> {
    pub name: &'a str,
    pub address: u64,
}

impl SymbolTable {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Approximate heap bytes, for cache accounting.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<SymbolEntry>()
            + self.sources.capacity() * std::mem::size_of::<Bytes>()
    }

    /// Lets the kernel drop the file pages lookups have touched.
    pub fn release_pages(&self) {
        for source in &self.sources {
            source.release_pages();
        }
    }

    fn name(&self, entry: &SymbolEntry) -> &str {
        self.sources
            .get(entry.source())
            .and_then(|source| source.get(entry.name_offset()..))
            .and_then(|tail| {
                let end = memchr::memchr(0, tail)?;
                std::str::from_utf8(&tail[..end]).ok()
            })
            .unwrap_or_default()
    }

    /// The function containing `vaddr`: the closest symbol at or below it,
    /// when its size covers the address (size 0: up to the next symbol).
    pub fn lookup(&self, vaddr: u64) -> Option<SymbolHit<'_>> {
        let index = self.entries.partition_point(|e| e.address <= vaddr);
        let entry = self.entries.get(index.checked_sub(1)?)?;
        let covered = if entry.size > 0 {
            vaddr - entry.address < u64::from(entry.size)
        } else {
            true
        };
        covered.then(|| SymbolHit {
            name: self.name(entry),
            address: entry.address,
        })
    }
}

/// Ordering key among names at one address: lower is preferred.
type Preference = u64;

/// Which of several names at one address to show: global before weak
/// before local, then fewer leading underscores, then the shorter name
/// (`write` rather than `__libc_write`). Packed in one integer: the
/// candidates of a large library are hundreds of thousands.
fn preference(name: &[u8], global: bool, weak: bool) -> Preference {
    let binding: u64 = if global && !weak {
        0
    } else if weak {
        1
    } else {
        2
    };
    let underscores = name.iter().take_while(|&&b| b == b'_').count().min(0xffff) as u64;
    let len = name.len().min(0xffff_ffff) as u64;
    binding << 48 | underscores << 32 | len
}

/// Function symbols from `.symtab` and `.dynsym`.
pub fn read_symbols(input: &Bytes) -> Result<SymbolTable, ElfError> {
    read_symbols_from(std::slice::from_ref(input))
}

/// Function symbols of several files describing one object (a stripped
/// binary and its separate debug file: at most two are used); fails only
/// when none parses. Reads the ELF symbol tables directly: names are
/// checked only when a lookup returns them, and each symbol is looked at
/// once.
pub fn read_symbols_from(inputs: &[Bytes]) -> Result<SymbolTable, ElfError> {
    let inputs = &inputs[..inputs.len().min(2)];
    let mut candidates: Vec<(SymbolEntry, Preference)> = Vec::new();
    let mut first_error = None;
    let mut parsed = 0;
    for (source, data) in inputs.iter().enumerate() {
        let release = || data.release_pages();
        let result = match object::FileKind::parse(&data[..]) {
            Ok(object::FileKind::Elf64) => function_symbols::<elf::FileHeader64<Endianness>>(
                data,
                source,
                &mut candidates,
                &release,
                SYMBOLS_PER_RELEASE,
            ),
            Ok(object::FileKind::Elf32) => function_symbols::<elf::FileHeader32<Endianness>>(
                data,
                source,
                &mut candidates,
                &release,
                SYMBOLS_PER_RELEASE,
            ),
            // The error the general parser gives for anything else.
            _ => parse(&data[..]).map(|_| ()),
        };
        match result {
            Ok(()) => parsed += 1,
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if parsed == 0 {
        return Err(first_error.unwrap_or(ElfError::NoInput));
    }
    candidates.sort_unstable_by_key(|&(entry, rank)| (entry.address, rank));
    candidates.dedup_by_key(|c| c.0.address);
    // Reuses the candidates' allocation; shrinking it gives the rest back.
    let mut entries: Vec<SymbolEntry> = candidates.into_iter().map(|(entry, _)| entry).collect();
    entries.shrink_to_fit();
    Ok(SymbolTable {
        entries,
        sources: inputs.to_vec(),
    })
}

/// Symbols read between two releases of the file's pages: about 1.5 MB of
/// symbol entries and names. A large library's tables (tens of MB) would
/// otherwise all be resident at the end of the read, a peak of RSS though
/// they are let go right after.
const SYMBOLS_PER_RELEASE: usize = 1 << 15;

/// Appends the defined functions of `.symtab` and `.dynsym` of one file,
/// each with its preference rank. The vector is grown once per table, to
/// its exact bound: doubling a vector of a few hundred thousand candidates
/// would briefly hold both copies. `release` lets the pages read so far go.
fn function_symbols<Elf: FileHeader<Endian = Endianness>>(
    data: &[u8],
    source: usize,
    candidates: &mut Vec<(SymbolEntry, Preference)>,
    release: &dyn Fn(),
    per_release: usize,
) -> Result<(), ElfError> {
    let parse_error = |source| ElfError::Parse { source };
    let header = Elf::parse(data).map_err(parse_error)?;
    let endian = header.endian().map_err(parse_error)?;
    let sections = header.sections(endian, data).map_err(parse_error)?;
    let source_bit = if source == 0 { 0 } else { SECOND_SOURCE };
    for kind in [elf::SHT_SYMTAB, elf::SHT_DYNSYM] {
        let table = sections.symbols(endian, data, kind).map_err(parse_error)?;
        let strings = table.strings();
        // What `object` calls a defined text symbol.
        let is_function = |symbol: &Elf::Sym| {
            let shndx = symbol.st_shndx(endian);
            symbol.st_type() == elf::STT_FUNC
                && (!shndx.is_special() || shndx == elf::SHN_XINDEX)
                && symbol.st_value(endian).into() != 0
        };
        // Functions only: a library's table holds as many other symbols
        // (objects, sections, files), and the candidates take 24 bytes each.
        // Counted a chunk at a time with the pages let go between: the
        // count alone reads the whole table (a Go server's is 6 MB).
        let functions: usize = table
            .symbols()
            .chunks(per_release)
            .map(|chunk| {
                let count = chunk.iter().filter(|s| is_function(s)).count();
                release();
                count
            })
            .sum();
        candidates.reserve(functions);
        for (index, symbol) in table.symbols().iter().enumerate() {
            if index % per_release == per_release - 1 {
                release();
            }
            if !is_function(symbol) {
                continue;
            }
            let address: u64 = symbol.st_value(endian).into();
            let Ok(name) = symbol.name(endian, strings) else {
                continue;
            };
            // Names are slices of the file's string table; one beyond
            // 2 GiB into a file cannot be recorded and is left out.
            let Some(offset) = (name.as_ptr() as usize)
                .checked_sub(data.as_ptr() as usize)
                .and_then(|offset| u32::try_from(offset).ok())
                .filter(|&offset| offset & SECOND_SOURCE == 0)
            else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let size: u64 = symbol.st_size(endian).into();
            let rank = preference(
                name,
                symbol.st_bind() != elf::STB_LOCAL,
                symbol.st_bind() == elf::STB_WEAK,
            );
            let entry = SymbolEntry {
                address,
                size: u32::try_from(size).unwrap_or(u32::MAX),
                name: offset | source_bit,
            };
            candidates.push((entry, rank));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use agent_fixtures::{CHAIN, CHAIN_STRIPPED};

    use super::*;

    fn address_of(table: &SymbolTable, wanted: &str) -> u64 {
        table
            .entries
            .iter()
            .find(|e| table.name(e) == wanted)
            .map(|e| e.address)
            .unwrap_or_else(|| panic!("{wanted} not in the symbol table"))
    }

    fn symbols(elf: &'static [u8]) -> Result<SymbolTable, ElfError> {
        read_symbols(&Bytes::from_static(elf))
    }

    #[test]
    fn layout_has_build_id_and_text_segment() {
        let layout = read_layout(CHAIN).expect("fixture parses");
        let build_id = layout.build_id.as_ref().expect("gcc writes a build id");
        assert_eq!(build_id.as_bytes().len(), 20);
        let text = symbols(CHAIN).expect("symbols");
        let main = address_of(&text, "main");
        // A PIE's text is mapped at its vaddr's file offset.
        let segment = layout
            .segments
            .iter()
            .find(|s| main >= s.vaddr && main - s.vaddr < s.file_size)
            .expect("main is inside a load segment");
        let offset = main - segment.vaddr + segment.file_offset;
        assert_eq!(layout.vaddr_for_file_offset(offset), Some(main));
        assert_eq!(layout.vaddr_for_file_offset(u64::MAX), None);
        let wrapping = ElfLayout {
            segments: vec![LoadSegment {
                file_offset: 0,
                file_size: 0x1000,
                vaddr: u64::MAX - 1,
            }],
            ..ElfLayout::default()
        };
        assert_eq!(wrapping.vaddr_for_file_offset(1), Some(u64::MAX));
        assert_eq!(wrapping.vaddr_for_file_offset(2), None);
    }

    #[test]
    fn symbols_cover_their_functions() {
        let table = symbols(CHAIN).expect("symbols");
        for name in ["main", "level_one", "level_two", "level_three", "burn_leaf"] {
            let start = address_of(&table, name);
            assert_eq!(table.lookup(start).map(|h| h.name), Some(name));
            assert_eq!(table.lookup(start + 1).map(|h| h.name), Some(name));
        }
        assert_eq!(table.lookup(0), None);
    }

    #[test]
    fn stripped_binary_keeps_only_dynamic_symbols() {
        let table = symbols(CHAIN_STRIPPED).expect("symbols");
        assert!(
            table.entries.iter().all(|e| table.name(e) != "level_two"),
            "a local function survived stripping"
        );
        let layout = read_layout(CHAIN_STRIPPED).expect("layout");
        assert_eq!(
            layout.build_id,
            read_layout(CHAIN).expect("layout").build_id,
            "stripping keeps the build id"
        );
    }

    #[test]
    fn corrupt_input_is_an_error() {
        assert!(read_layout(b"").is_err());
        assert!(read_layout(b"\x7fELF garbage").is_err());
        assert!(symbols(&CHAIN[..64]).is_err());
        // Every truncation either parses or fails; none panics.
        for len in (0..CHAIN.len()).step_by(97) {
            let _ = read_layout(&CHAIN[..len]);
            if let Ok(table) = symbols(&CHAIN[..len]) {
                let _ = table.lookup(0x1139);
            }
        }
        let mut flipped = CHAIN.to_vec();
        for index in (64..flipped.len()).step_by(61) {
            flipped[index] ^= 0xa5;
        }
        let _ = read_layout(&flipped);
        if let Ok(table) = read_symbols(&Bytes::new(Arc::new(flipped))) {
            for entry in &table.entries {
                let _ = table.lookup(entry.address);
            }
        }
    }

    /// Both passes over a table (counting its functions, then reading
    /// them) let the pages go every `per_release` symbols: a server's
    /// table of several MB is never resident whole.
    #[test]
    fn reading_symbols_lets_pages_go_every_chunk_of_both_passes() {
        use std::cell::Cell;
        let per_release = 4;
        let releases = Cell::new(0);
        let mut candidates = Vec::new();
        function_symbols::<elf::FileHeader64<Endianness>>(
            CHAIN,
            0,
            &mut candidates,
            &|| releases.set(releases.get() + 1),
            per_release,
        )
        .expect("symbols");
        let file = object::File::parse(CHAIN).expect("fixture parses");
        let expected: usize = [file.symbols().count(), file.dynamic_symbols().count()]
            .into_iter()
            // `object` leaves out the null symbol each table starts with.
            .map(|listed| listed + 1)
            .map(|count| count.div_ceil(per_release) + count / per_release)
            .sum();
        assert!(
            file.symbols().count() > 4 * per_release,
            "too few symbols to test"
        );
        assert_eq!(releases.get(), expected);
        assert!(!candidates.is_empty());
    }

    #[test]
    fn aliases_prefer_the_plain_global_name() {
        assert!(preference(b"write", true, false) < preference(b"__libc_write", true, false));
        assert!(preference(b"write", true, true) > preference(b"__write", true, false));
        assert!(preference(b"a", false, false) > preference(b"zzz", true, true));
    }
}
