//! The DWARF contexts' cache: bounded, evicting what does not fit, and
//! keeping what recent profiles used.

use super::*;

#[test]
fn the_dwarf_cache_is_bounded_and_counts_evictions() {
    // Room for one fixture's DWARF, lookups' units parsed, not two.
    let parsed = |elf: &[u8], function: &str| {
        let mut info =
            DwarfInfo::parse(Bytes::new(Arc::new(elf.to_vec())), usize::MAX).expect("indexes");
        let (start, _) = function_range(elf, function);
        info.frames(start).expect("frames");
        info.heap_bytes()
    };
    let limits = SymbolConfig {
        debuginfo_cache_bytes: parsed(INLINE_CHAIN, "burn_leaf")
            .max(parsed(TEMPLATES, "_ZN4firn3runEi"))
            + 1024,
        ..SymbolConfig::default()
    };
    let mut symbolizer = symbolizer_with(&limits);
    let chain = object(1, INLINE_CHAIN);
    let templates = object(2, TEMPLATES);
    let (leaf, _) = function_range(INLINE_CHAIN, "burn_leaf");
    let (run, _) = function_range(TEMPLATES, "_ZN4firn3runEi");
    let profiles = 4;
    // The larger first: a smaller one holding the room would be evicted
    // for it (rebuilding it costs less).
    assert!(parsed(TEMPLATES, "_ZN4firn3runEi") >= parsed(INLINE_CHAIN, "burn_leaf"));
    for _ in 0..profiles {
        for _ in 0..3 {
            assert!(!symbolizer.user(&templates, run).is_empty());
            assert!(!symbolizer.user(&chain, leaf).is_empty());
        }
        symbolizer.end_of_profile();
        assert!(symbolizer.cache_bytes().debuginfo <= limits.debuginfo_cache_bytes);
    }
    // Each fits alone with its lookups' units parsed; the two do not.
    let (chain_bytes, templates_bytes) = (
        parsed(INLINE_CHAIN, "burn_leaf"),
        parsed(TEMPLATES, "_ZN4firn3runEi"),
    );
    assert!(chain_bytes + templates_bytes > limits.debuginfo_cache_bytes);
    let counts = symbolizer.take_counts();
    assert_eq!(
        counts.debuginfo.misses,
        1 + profiles,
        "the first context stays; the second, grown past the room beside \
         it, is indexed once a profile and dropped at its end"
    );
    assert_eq!(counts.debuginfo.evictions, profiles);
    assert_eq!(counts.debuginfo_too_large, 0);

    // An object whose DWARF alone exceeds the cache is not indexed at all.
    let tiny = SymbolConfig {
        debuginfo_cache_bytes: 512,
        ..SymbolConfig::default()
    };
    let mut symbolizer = symbolizer_with(&tiny);
    assert_eq!(
        frames(&symbolizer.user(&chain, leaf + 0x20)),
        [("burn_leaf".to_owned(), None)],
        "the symbol table still names it"
    );
    assert_eq!(symbolizer.take_counts().debuginfo_too_large, 1);
}

#[test]
fn an_object_is_taken_only_if_its_dwarf_fits_the_cache_all_parsed() {
    let full = DwarfInfo::parse(Bytes::new(Arc::new(INLINE_CHAIN.to_vec())), usize::MAX)
        .expect("indexes")
        .shape()
        .full_cost();
    // The middle of burn_leaf is mix_step's loop, inlined there.
    let (leaf, size) = function_range(INLINE_CHAIN, "burn_leaf");
    let mut symbolizer = symbolizer_with(&SymbolConfig {
        debuginfo_cache_bytes: full - 1,
        ..SymbolConfig::default()
    });
    assert_eq!(
        frames(&symbolizer.user(&object(1, INLINE_CHAIN), leaf + size / 2)),
        [("burn_leaf".to_owned(), None)],
        "named by the symbol table"
    );
    assert_eq!(symbolizer.take_counts().debuginfo_too_large, 1);
    let limits = SymbolConfig {
        debuginfo_cache_bytes: full,
        ..SymbolConfig::default()
    };
    let mut symbolizer = symbolizer_with(&limits);
    assert_eq!(
        symbolizer
            .user(&object(1, INLINE_CHAIN), leaf + size / 2)
            .len(),
        2
    );
    let held = symbolizer.cache_bytes().debuginfo;
    assert!(0 < held && held <= limits.debuginfo_cache_bytes, "{held}");
    symbolizer.end_of_profile();
    assert_eq!(symbolizer.cache_bytes().debuginfo, held, "it stays");
    assert_eq!(symbolizer.take_counts().debuginfo.evictions, 0);
}

#[test]
fn units_no_lookup_used_for_two_rounds_are_stale() {
    let mut info =
        DwarfInfo::parse(Bytes::new(Arc::new(INLINE_CHAIN.to_vec())), usize::MAX).expect("indexes");
    let indexed = info.heap_bytes();
    let (leaf, size) = function_range(INLINE_CHAIN, "burn_leaf");
    info.frames(leaf + size / 2).expect("looks up");
    let parsed = info.heap_bytes() - indexed;
    assert!(parsed > 0, "the unit was parsed");
    info.end_round();
    assert_eq!(info.stale_bytes(), 0, "used in the round just ended");
    info.end_round();
    assert_eq!(
        info.stale_bytes(),
        parsed,
        "not used in the last two rounds"
    );
    info.frames(leaf).expect("looks up");
    assert_eq!(info.stale_bytes(), 0, "used again");
    assert_eq!(info.heap_bytes() - indexed, parsed, "and not parsed again");
    for _ in 0..crate::dwarf_units::IDLE_ROUNDS {
        info.end_round();
    }
    assert_eq!(
        info.heap_bytes() - indexed,
        parsed,
        "kept while idle a few rounds"
    );
    info.end_round();
    assert_eq!(info.heap_bytes(), indexed, "idle longer: let go");
    assert_eq!(info.frames(leaf + size / 2).expect("looks up").len(), 2);
    assert_eq!(info.heap_bytes() - indexed, parsed, "parsed again");
    // What `firn_dwarf_units_total` shows: parsed twice, dropped once.
    assert_eq!(
        info.take_unit_counts(),
        crate::UnitCounts {
            parsed: 2,
            dropped: 1
        }
    );
}

#[test]
fn dwarf_refused_once_stays_refused_while_contexts_come_and_go() {
    let full_cost = |elf: &[u8]| {
        DwarfInfo::parse(Bytes::new(Arc::new(elf.to_vec())), usize::MAX)
            .expect("indexes")
            .shape()
            .full_cost()
    };
    // The same DWARF, plain and compressed: only the plain one fits.
    let limits = SymbolConfig {
        debuginfo_cache_bytes: full_cost(INLINE_CHAIN) + 64,
        ..SymbolConfig::default()
    };
    assert!(full_cost(INLINE_CHAIN_COMPRESSED) > limits.debuginfo_cache_bytes);
    let mut symbolizer = symbolizer_with(&limits);
    let compressed = object(1, INLINE_CHAIN_COMPRESSED);
    let plain = object(2, INLINE_CHAIN);
    let (leaf, _) = function_range(INLINE_CHAIN_COMPRESSED, "burn_leaf");
    let (plain_leaf, _) = function_range(INLINE_CHAIN, "burn_leaf");
    let named_by_symbols = [("burn_leaf".to_owned(), None)];
    assert_eq!(
        frames(&symbolizer.user(&compressed, leaf + 0x20)),
        named_by_symbols
    );
    assert_eq!(
        symbolizer.take_counts().debuginfo_too_large,
        1,
        "the inflated sections do not fit beside nothing"
    );
    // Another object's context comes and stays.
    assert!(!symbolizer.user(&plain, plain_leaf).is_empty());
    assert!(symbolizer.cache_bytes().debuginfo <= limits.debuginfo_cache_bytes);
    symbolizer.end_of_profile();
    assert_eq!(
        frames(&symbolizer.user(&compressed, leaf + 0x40)),
        named_by_symbols
    );
    let counts = symbolizer.take_counts();
    assert_eq!(
        (counts.debuginfo_too_large, counts.debuginfo.hits),
        (0, 1),
        "not read and refused again"
    );
}

/// A unit's abbreviation table runs to the next table or the section's
/// end; units sharing one (dwz, some linkers) each count it, since each
/// parses it.
#[test]
fn each_unit_counts_its_whole_abbreviation_table() {
    use crate::dwarf_unit_index::abbrev_table_sizes;
    assert_eq!(
        abbrev_table_sizes(&[0, 100, 0, 250], 300),
        [100, 150, 100, 50]
    );
    assert_eq!(abbrev_table_sizes(&[], 300), Vec::<u32>::new());
    // A start past the section's end (corrupt) counts nothing.
    assert_eq!(abbrev_table_sizes(&[400], 300), [0]);
}

/// The estimate a parsed unit is charged with covers its abbreviations:
/// glibc's debug file (many small units, each with its own table) parsed
/// more than twice what line rows and entries alone predicted.
#[test]
fn the_full_cost_counts_abbreviations_each_unit_parses() {
    let shape = DwarfShape {
        units: 10,
        abbrev_bytes: 1000,
        abbrev_parsed_bytes: 4000,
        ..DwarfShape::default()
    };
    let without = DwarfShape {
        abbrev_parsed_bytes: 0,
        ..shape
    };
    assert_eq!(
        shape.full_cost() - without.full_cost(),
        4000 * crate::dwarf_units::COST_PER_ABBREV_BYTE
    );
}
