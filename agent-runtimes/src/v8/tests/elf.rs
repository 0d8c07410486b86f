//! `inspect_object` over a small ELF file written here: constants in
//! `.data` and in `.bss`, of the wrong size, and other symbols.

use crate::v8::{Constants, FileMapping, V8Object, inspect_object};

const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_NOBITS: u32 = 8;
const SHF_WRITE_ALLOC: u64 = 3;
const DATA_ADDRESS: u64 = 0x40_0000;
const BSS_ADDRESS: u64 = 0x50_0000;

struct Symbol {
    name: &'static str,
    section: u16,
    address: u64,
    size: u64,
    function: bool,
}

/// A section header: name, type, flags, address, offset, size, link,
/// info, alignment, entry size.
type Header = (u32, u32, u64, u64, u64, u64, u32, u32, u64, u64);

/// `.symtab` and its `.strtab`.
fn symbol_table(symbols: &[Symbol]) -> (Vec<u8>, Vec<u8>) {
    let mut strtab = vec![0u8];
    let mut symtab = vec![0u8; 24];
    for symbol in symbols {
        let name = strtab.len() as u32;
        strtab.extend_from_slice(symbol.name.as_bytes());
        strtab.push(0);
        symtab.extend_from_slice(&name.to_le_bytes());
        // STB_GLOBAL with STT_FUNC or STT_OBJECT.
        symtab.push(if symbol.function { 0x12 } else { 0x11 });
        symtab.push(0);
        symtab.extend_from_slice(&symbol.section.to_le_bytes());
        symtab.extend_from_slice(&symbol.address.to_le_bytes());
        symtab.extend_from_slice(&symbol.size.to_le_bytes());
    }
    (symtab, strtab)
}

/// An ELF64 relocatable-style file with `.data` (holding `data` at
/// `DATA_ADDRESS`), a 64-byte `.bss` and a `.symtab` of `symbols`.
fn elf(data: &[u8], symbols: &[Symbol]) -> Vec<u8> {
    let (symtab, strtab) = symbol_table(symbols);
    let shstrtab = b"\0.data\0.bss\0.symtab\0.strtab\0.shstrtab\0".to_vec();
    let mut file = vec![0u8; 64];
    let place = |file: &mut Vec<u8>, bytes: &[u8]| {
        while !file.len().is_multiple_of(8) {
            file.push(0);
        }
        let offset = file.len() as u64;
        file.extend_from_slice(bytes);
        offset
    };
    let data_offset = place(&mut file, data);
    let symtab_offset = place(&mut file, &symtab);
    let strtab_offset = place(&mut file, &strtab);
    let shstrtab_offset = place(&mut file, &shstrtab);
    while !file.len().is_multiple_of(8) {
        file.push(0);
    }
    let section_headers = file.len() as u64;
    // A table is clearer than one field per line.
    #[rustfmt::skip]
    let headers: [Header; 6] = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, SHT_PROGBITS, SHF_WRITE_ALLOC, DATA_ADDRESS, data_offset, data.len() as u64, 0, 0, 8, 0),
        (7, SHT_NOBITS, SHF_WRITE_ALLOC, BSS_ADDRESS, 0, 64, 0, 0, 8, 0),
        (12, SHT_SYMTAB, 0, 0, symtab_offset, symtab.len() as u64, 4, 1, 8, 24),
        (20, SHT_STRTAB, 0, 0, strtab_offset, strtab.len() as u64, 0, 0, 1, 0),
        (28, SHT_STRTAB, 0, 0, shstrtab_offset, shstrtab.len() as u64, 0, 0, 1, 0),
    ];
    write_headers(&mut file, &headers, section_headers);
    file
}

fn write_headers(file: &mut Vec<u8>, headers: &[Header], section_headers: u64) {
    for (name, kind, flags, address, offset, size, link, info, align, entsize) in
        headers.iter().copied()
    {
        file.extend_from_slice(&name.to_le_bytes());
        file.extend_from_slice(&kind.to_le_bytes());
        for word in [flags, address, offset, size] {
            file.extend_from_slice(&word.to_le_bytes());
        }
        file.extend_from_slice(&link.to_le_bytes());
        file.extend_from_slice(&info.to_le_bytes());
        file.extend_from_slice(&align.to_le_bytes());
        file.extend_from_slice(&entsize.to_le_bytes());
    }
    file[..16].copy_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    file[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    file[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    file[20..24].copy_from_slice(&1u32.to_le_bytes());
    file[40..48].copy_from_slice(&section_headers.to_le_bytes());
    file[52..54].copy_from_slice(&64u16.to_le_bytes());
    file[58..60].copy_from_slice(&64u16.to_le_bytes());
    file[60..62].copy_from_slice(&(headers.len() as u16).to_le_bytes());
    file[62..64].copy_from_slice(&5u16.to_le_bytes());
}

#[test]
fn constants_are_read_from_data_and_bss() {
    let mut data = Vec::new();
    data.extend_from_slice(&(-16i32).to_le_bytes());
    data.extend_from_slice(&2066i32.to_le_bytes());
    data.extend_from_slice(&7u64.to_le_bytes());
    let symbols = [
        Symbol {
            name: "v8dbg_off_fp_function",
            section: 1,
            address: DATA_ADDRESS,
            size: 4,
            function: false,
        },
        Symbol {
            name: "v8dbg_type_JSFunction__JS_FUNCTION_TYPE",
            section: 1,
            address: DATA_ADDRESS + 4,
            size: 4,
            function: false,
        },
        Symbol {
            name: "v8dbg_wide",
            section: 1,
            address: DATA_ADDRESS + 8,
            size: 8,
            function: false,
        },
        Symbol {
            name: "v8dbg_SmiTag",
            section: 2,
            address: BSS_ADDRESS,
            size: 4,
            function: false,
        },
        Symbol {
            name: "not_a_constant",
            section: 1,
            address: DATA_ADDRESS,
            size: 4,
            function: false,
        },
    ];
    let object = inspect_object(&elf(&data, &symbols))
        .expect("parses")
        .expect("has constants");
    assert_eq!(object.builtins, None);
    let constants = object.constants;
    assert_eq!(constants.get("off_fp_function"), Some(-16));
    assert_eq!(
        constants.get("type_JSFunction__JS_FUNCTION_TYPE"),
        Some(2066)
    );
    assert_eq!(constants.get("SmiTag"), Some(0));
    assert_eq!(constants.get("wide"), None);
    assert_eq!(constants.skipped, 1);
    assert_eq!(constants.len(), 3);
}

#[test]
fn the_builtins_range_spans_their_symbols() {
    let symbols = [
        Symbol {
            name: "v8dbg_SmiTag",
            section: 2,
            address: BSS_ADDRESS,
            size: 4,
            function: false,
        },
        Symbol {
            name: "Builtins_InterpreterEntryTrampoline",
            section: 1,
            address: DATA_ADDRESS + 0x20,
            size: 0x10,
            function: true,
        },
        Symbol {
            name: "Builtins_CallFunction",
            section: 1,
            address: DATA_ADDRESS + 0x8,
            size: 0x8,
            function: true,
        },
        // Not code: not a builtin.
        Symbol {
            name: "Builtins_table",
            section: 1,
            address: DATA_ADDRESS,
            size: 0x40,
            function: false,
        },
    ];
    let bytes = elf(&[0; 0x40], &symbols);
    let object = inspect_object(&bytes)
        .expect("parses")
        .expect("has constants");
    assert_eq!(
        object.builtins,
        Some(DATA_ADDRESS + 0x8..DATA_ADDRESS + 0x30)
    );
    let file = object::File::parse(&*bytes).expect("parses");
    let data_offset = object::Object::sections(&file)
        .find(|section| object::ObjectSection::address(section) == DATA_ADDRESS)
        .and_then(|section| object::ObjectSection::file_range(&section))
        .expect("the data section")
        .0;
    assert_eq!(object.builtins_file_offset, Some(data_offset + 0x8));
}

/// Node 24's mappings of its executable: the text segment, and the
/// builtins' pages mapped again next to the generated code.
#[test]
fn the_builtins_are_found_in_every_mapping_of_them() {
    let object = V8Object {
        constants: Constants::default(),
        builtins: Some(0x1a2_7000..0x1c2_bd78),
        builtins_file_offset: Some(0x162_7000),
    };
    let text = FileMapping {
        addresses: 0x74_a000..0x304_4000,
        offset: 0x34_a000,
    };
    let copy = FileMapping {
        addresses: 0x7f47_a1d8_0000..0x7f47_a1f8_5000,
        offset: 0x162_7000,
    };
    let data = FileMapping {
        addresses: 0x320_1000..0x6b5_1000,
        offset: 0x2e0_1000,
    };
    assert_eq!(
        object.builtins_in_process(&[data.clone(), text.clone(), copy.clone()]),
        [0x1a2_7000..0x1c2_bd78, 0x7f47_a1d8_0000..0x7f47_a1f8_4d78]
    );
    assert_eq!(object.builtins_in_process(&[data]), []);
    let unknown = V8Object {
        builtins_file_offset: None,
        ..object
    };
    assert_eq!(unknown.builtins_in_process(&[text, copy]), []);
}

#[test]
fn objects_without_constants_are_not_v8() {
    let symbols = [Symbol {
        name: "main",
        section: 1,
        address: DATA_ADDRESS,
        size: 4,
        function: false,
    }];
    assert!(
        inspect_object(&elf(&[0; 8], &symbols))
            .expect("parses")
            .is_none()
    );
    // The prefix in the bytes but no such symbol.
    let data = b"v8dbg_ in a string\0";
    assert!(
        inspect_object(&elf(data, &symbols))
            .expect("parses")
            .is_none()
    );
    // Not ELF at all: no prefix, no parse.
    assert!(inspect_object(b"#!/bin/sh\n").expect("not read").is_none());
    assert!(inspect_object(b"v8dbg_ but not ELF").is_err());
}
