//! CFI extracts: an object cut down to what the unwinder and the naming of
//! its frames read, as a small ELF file. Kept as they are: the `PT_LOAD`
//! program headers (so file offsets in a maps text still translate to the
//! same addresses), the notes (build id, Go's), `.eh_frame`,
//! `.eh_frame_hdr`, `.debug_frame` (compressed or not) and Go's `.gopclntab`. The code
//! sections stay as headers without bytes (`SHT_NOBITS`, their addresses
//! and sizes), and `.symtab` holds function symbols: for each start
//! address, the one name firn's reader shows there.

use std::collections::BTreeSet;

use agent_elf::SymbolTable;
use anyhow::{Context, Result, bail};
use object::{
    Endianness, Object, ObjectSymbol, SymbolFlags, SymbolKind, elf,
    read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _},
    write::elf::{FileHeader, ProgramHeader, SectionHeader, SectionIndex, Sym, Writer},
};

/// A function symbol as an object file has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSymbol {
    pub name: Vec<u8>,
    pub address: u64,
    pub size: u64,
    pub info: u8,
    pub other: u8,
}

/// The function symbols of one object's files (the object, its debug
/// file), in their order, picked as `agent_elf::read_symbols` picks them.
pub fn function_symbols(files: &[&[u8]]) -> Result<Vec<FunctionSymbol>> {
    let mut symbols = Vec::new();
    for data in files {
        let file = object::File::parse(*data)?;
        for symbol in file.symbols().chain(file.dynamic_symbols()) {
            if symbol.kind() != SymbolKind::Text || !symbol.is_definition() || symbol.address() == 0
            {
                continue;
            }
            let Ok(name) = symbol.name_bytes() else {
                continue;
            };
            if name.is_empty() || std::str::from_utf8(name).is_err() {
                continue;
            }
            let SymbolFlags::Elf { st_info, st_other } = symbol.flags() else {
                continue;
            };
            symbols.push(FunctionSymbol {
                name: name.to_vec(),
                address: symbol.address(),
                size: symbol.size(),
                info: st_info.0,
                other: st_other.0,
            });
        }
    }
    Ok(symbols)
}

/// The symbols an extract keeps: the one `table` (read from the same
/// files) names each start address by, for every start address, or only
/// those naming `needed` (link-time addresses): for each, the closest start
/// at or below it, which alone decides how `table` names it.
pub fn chosen_symbols(
    symbols: &[FunctionSymbol],
    table: &SymbolTable,
    needed: Option<&BTreeSet<u64>>,
) -> Vec<FunctionSymbol> {
    let starts: BTreeSet<u64> = symbols.iter().map(|s| s.address).collect();
    let kept: BTreeSet<u64> = match needed {
        None => starts,
        Some(needed) => needed
            .iter()
            .filter_map(|&vaddr| starts.range(..=vaddr).next_back().copied())
            .collect(),
    };
    let mut chosen = Vec::new();
    for &start in &kept {
        let Some(hit) = table.lookup(start).filter(|hit| hit.address == start) else {
            continue;
        };
        let symbol = symbols
            .iter()
            .find(|s| s.address == start && s.name == hit.name.as_bytes());
        chosen.extend(symbol.cloned());
    }
    chosen
}

/// A section of the object the extract keeps.
struct KeptSection<'a> {
    name: &'a [u8],
    header: SectionHeader,
    /// `None`: the header alone, as `SHT_NOBITS`.
    bytes: Option<&'a [u8]>,
}

/// What of the object the extract keeps.
struct Parts<'a> {
    header: FileHeader,
    loads: Vec<ProgramHeader>,
    sections: Vec<KeptSection<'a>>,
}

impl Parts<'_> {
    /// The placeholder section holding `address`, else the first one.
    fn code_section(&self, indexes: &[SectionIndex], address: u64) -> SectionIndex {
        let mut code = self
            .sections
            .iter()
            .zip(indexes)
            .filter(|(section, _)| section.bytes.is_none())
            .peekable();
        let first = code.peek().map(|(_, index)| **index).unwrap_or_default();
        code.find(|(section, _)| {
            let header = &section.header;
            address >= header.sh_addr && address - header.sh_addr < header.sh_size
        })
        .map_or(first, |(_, index)| *index)
    }
}

fn parts(data: &[u8]) -> Result<Parts<'_>> {
    let header = elf::FileHeader64::<Endianness>::parse(data).context("not a 64-bit ELF file")?;
    let endian = header.endian()?;
    if endian != Endianness::Little {
        bail!("not a little-endian ELF file");
    }
    let loads = header
        .program_headers(endian, data)?
        .iter()
        .filter(|segment| segment.p_type(endian) == elf::PT_LOAD)
        .map(|segment| ProgramHeader::from_raw(endian, segment))
        .collect();
    let table = header.sections(endian, data)?;
    // `.gopclntab` is Go's own unwind table, read in place of its
    // `.debug_frame`.
    let copied = [
        &b".eh_frame"[..],
        b".eh_frame_hdr",
        b".debug_frame",
        b".gopclntab",
    ];
    let mut sections = Vec::new();
    for section in table.iter() {
        let name = table.section_name(endian, section)?;
        let executable = section.sh_flags(endian).0 & elf::SHF_EXECINSTR.0 != 0;
        let bytes = if section.sh_type(endian) == elf::SHT_NOTE || copied.contains(&name) {
            Some(section.data(endian, data)?)
        } else if executable || name == b".got" {
            None
        } else {
            continue;
        };
        sections.push(KeptSection {
            name,
            header: SectionHeader::from_raw(endian, section),
            bytes,
        });
    }
    if sections.iter().all(|section| section.bytes.is_some()) {
        bail!("no code sections");
    }
    Ok(Parts {
        header: FileHeader::from_raw(endian, header),
        loads,
        sections,
    })
}

/// The extract of the 64-bit little-endian ELF object `data`, naming its
/// functions by `symbols`.
pub fn extract(data: &[u8], symbols: &[FunctionSymbol]) -> Result<Vec<u8>> {
    let parts = parts(data)?;
    // ELF wants the local symbols first.
    let is_local = |s: &FunctionSymbol| s.info >> 4 == elf::STB_LOCAL.0;
    let mut symbols: Vec<&FunctionSymbol> = symbols.iter().collect();
    symbols.sort_by_key(|s| !is_local(s));
    let locals = symbols.iter().filter(|s| is_local(s)).count();

    let mut out = Vec::new();
    let mut writer = Writer::new(Endianness::Little, true, &mut out);
    writer.reserve_file_header();
    writer.reserve_program_headers(parts.loads.len() as u32);
    let mut placed = Vec::with_capacity(parts.sections.len());
    for section in &parts.sections {
        let name = writer.add_section_name(section.name);
        let index = writer.reserve_section_index();
        let align = section.header.sh_addralign.max(1);
        let offset = section
            .bytes
            .map_or(0, |bytes| writer.reserve(bytes.len() as u64, align));
        placed.push((name, index, offset));
    }
    let indexes: Vec<SectionIndex> = placed.iter().map(|(_, index, _)| *index).collect();
    let names: Vec<_> = symbols.iter().map(|s| writer.add_string(&s.name)).collect();
    writer.reserve_null_symbol_index();
    for symbol in &symbols {
        writer.reserve_symbol_index(Some(parts.code_section(&indexes, symbol.address)));
    }
    writer.reserve_symtab_section_index();
    writer.reserve_symtab();
    writer.reserve_strtab_section_index();
    writer.reserve_strtab()?;
    writer.reserve_shstrtab_section_index();
    writer.reserve_shstrtab()?;
    writer.reserve_section_headers();

    writer.write_file_header(&parts.header)?;
    writer.write_align_program_headers();
    for load in &parts.loads {
        writer.write_program_header(load);
    }
    for section in &parts.sections {
        if let Some(bytes) = section.bytes {
            writer.write_align(section.header.sh_addralign.max(1));
            writer.write(bytes);
        }
    }
    writer.write_null_symbol();
    for (symbol, name) in symbols.iter().zip(&names) {
        writer.write_symbol(&Sym {
            section: Some(parts.code_section(&indexes, symbol.address).0),
            st_name: writer.string_offset(Some(*name)),
            st_info: elf::SymbolInfo(symbol.info),
            st_other: elf::SymbolOther(symbol.other),
            st_shndx: elf::SymbolSection(0),
            st_value: symbol.address,
            st_size: symbol.size,
        });
    }
    writer.write_strtab();
    writer.write_shstrtab();
    writer.write_null_section_header();
    for (section, (name, _, offset)) in parts.sections.iter().zip(&placed) {
        writer.write_section_header(&SectionHeader {
            sh_name: writer.section_name_offset(Some(*name)),
            sh_type: section
                .bytes
                .map_or(elf::SHT_NOBITS, |_| section.header.sh_type),
            sh_offset: *offset,
            sh_link: 0,
            sh_info: 0,
            ..section.header.clone()
        });
    }
    writer.write_symtab_section_header(1 + locals as u32);
    writer.write_strtab_section_header();
    writer.write_shstrtab_section_header();
    Ok(out)
}
