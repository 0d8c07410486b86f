//! The unit-at-a-time lookups name the same frames, files and lines as
//! addr2line (the reference the project used before them) at addresses all
//! over each fixture; `FIRN_DWARF_DIFF=PATH:PATH..` with `--ignored` adds
//! objects of the machine (a debug build, libpython, a `-dbg` package's
//! debug file).

use std::borrow::Cow;

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::*;

type Frames = Vec<(Option<String>, Option<String>, Option<u32>)>;

fn addr2line_frames(
    context: &addr2line::Context<gimli::EndianRcSlice<gimli::RunTimeEndian>>,
    vaddr: u64,
) -> Frames {
    let mut frames = Vec::new();
    let Ok(mut iter) = context.find_frames(vaddr).skip_all_loads() else {
        return frames;
    };
    while let Ok(Some(frame)) = iter.next() {
        let name = frame
            .function
            .as_ref()
            .and_then(|function| function.raw_name().ok())
            .map(|name| name.into_owned())
            .filter(|name| !name.is_empty());
        let (file, line) = frame.location.map_or((None, None), |location| {
            (location.file.map(str::to_owned), location.line)
        });
        frames.push((name, file, line));
    }
    frames
}

fn reference(elf: &[u8]) -> addr2line::Context<gimli::EndianRcSlice<gimli::RunTimeEndian>> {
    let file = object::File::parse(elf).expect("parses");
    let dwarf = gimli::Dwarf::load(|id| -> Result<_, gimli::Error> {
        let data = file
            .section_by_name(id.name())
            .and_then(|section| section.uncompressed_data().ok())
            .unwrap_or(Cow::Borrowed(&[]));
        Ok(gimli::EndianRcSlice::new(
            std::rc::Rc::from(&*data),
            gimli::RunTimeEndian::Little,
        ))
    })
    .expect("loads");
    addr2line::Context::from_dwarf(dwarf).expect("indexes")
}

/// Addresses at the start, a third and two thirds into every function, and
/// up to `stride`-spaced ones through it.
fn addresses(elf: &[u8], per_function: u64) -> Vec<u64> {
    let file = object::File::parse(elf).expect("parses");
    let mut addresses = Vec::new();
    for symbol in file.symbols() {
        if symbol.kind() != SymbolKind::Text || symbol.size() == 0 {
            continue;
        }
        let (start, size) = (symbol.address(), symbol.size());
        let step = (size / per_function).max(1);
        addresses.extend(
            (0..size)
                .step_by(step as usize)
                .map(|offset| start + offset),
        );
    }
    addresses.sort_unstable();
    addresses.dedup();
    addresses
}

/// The addresses looked up, how many had frames, and those where the two
/// differ, with both answers.
fn differences(debug: &[u8], per_function: u64) -> (usize, usize, Vec<(u64, Frames, Frames)>) {
    let context = reference(debug);
    let mut info =
        DwarfInfo::parse(Bytes::new(Arc::new(debug.to_vec())), usize::MAX).expect("indexes");
    let addresses = addresses(debug, per_function);
    let mut differ = Vec::new();
    let mut named = 0;
    for (n, &vaddr) in addresses.iter().enumerate() {
        let ours: Frames = info
            .frames(vaddr)
            .expect("frames")
            .into_iter()
            .map(|frame| (frame.name, frame.file, frame.line))
            .collect();
        let theirs = addr2line_frames(&context, vaddr);
        named += usize::from(!theirs.is_empty());
        if ours != theirs {
            differ.push((vaddr, ours, theirs));
        }
        // Rounds pass, units are let go and parsed again.
        if n % 500 == 499 {
            info.end_round();
        }
    }
    (addresses.len(), named, differ)
}

#[test]
fn frames_match_addr2line_on_the_fixtures() {
    for (name, debug) in [
        ("inline_chain", INLINE_CHAIN),
        ("inline_chain.debug", INLINE_CHAIN_DEBUG),
        ("inline_chain.compressed", INLINE_CHAIN_COMPRESSED),
        ("templates", TEMPLATES),
        ("local_class", LOCAL_CLASS),
        ("nested", NESTED),
    ] {
        let (looked_up, named, differ) = differences(debug, u64::MAX);
        assert!(looked_up > 20, "{name}: {looked_up} addresses");
        assert!(
            named * 2 > looked_up,
            "{name}: {named} of {looked_up} named"
        );
        assert!(
            differ.is_empty(),
            "{name}: {:#x?}",
            &differ[..differ.len().min(5)]
        );
    }
}

#[test]
#[ignore = "compares objects of this machine: FIRN_DWARF_DIFF=PATH:.. cargo test -p agent-symbolize --release against_addr2line -- --ignored"]
fn frames_match_addr2line_on_the_objects_named() {
    let paths = std::env::var("FIRN_DWARF_DIFF")
        .expect("FIRN_DWARF_DIFF=PATH:PATH.. names the objects to compare");
    for path in paths.split(':') {
        let elf = std::fs::read(path).expect("readable");
        let (looked_up, named, differ) = differences(&elf, 8);
        eprintln!(
            "{path}: {looked_up} addresses, {named} with frames, {} differ",
            differ.len()
        );
        for (vaddr, ours, theirs) in differ.iter().take(5) {
            eprintln!("  {vaddr:#x}\n    ours   {ours:?}\n    theirs {theirs:?}");
        }
        assert!(differ.is_empty(), "{path}");
    }
}
