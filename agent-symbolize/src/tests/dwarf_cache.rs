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
    for _ in 0..profiles {
        for _ in 0..3 {
            assert!(!symbolizer.user(&chain, leaf).is_empty());
            assert!(!symbolizer.user(&templates, run).is_empty());
        }
        symbolizer.end_of_profile();
        assert!(symbolizer.cache_bytes().debuginfo <= limits.debuginfo_cache_bytes);
    }
    // The templates' context, even just indexed, is larger than the
    // chain's with its lookups parsed: it takes the room.
    let templates_index = DwarfInfo::parse(Bytes::new(Arc::new(TEMPLATES.to_vec())), usize::MAX)
        .expect("indexes")
        .heap_bytes();
    assert!(templates_index > parsed(INLINE_CHAIN, "burn_leaf"));
    let counts = symbolizer.take_counts();
    assert_eq!(
        counts.debuginfo.misses,
        2 + profiles,
        "the larger context stays once indexed; the smaller, which does not \
         fit beside it, is indexed once a profile and dropped at its end"
    );
    assert_eq!(counts.debuginfo.evictions, 1 + profiles);
    assert_eq!(counts.debuginfo_too_large, 0);

    // An object whose DWARF alone exceeds the cache is not indexed at all.
    let tiny = SymbolConfig {
        debuginfo_cache_bytes: 1024,
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
fn a_context_grown_past_the_cache_is_dropped_after_the_profile() {
    let base = DwarfInfo::parse(Bytes::new(Arc::new(INLINE_CHAIN.to_vec())), usize::MAX)
        .expect("indexes")
        .heap_bytes();
    let limits = SymbolConfig {
        debuginfo_cache_bytes: base + 1,
        ..SymbolConfig::default()
    };
    let mut symbolizer = symbolizer_with(&limits);
    // The middle of burn_leaf is mix_step's loop, inlined there.
    let (leaf, size) = function_range(INLINE_CHAIN, "burn_leaf");
    assert_eq!(
        symbolizer
            .user(&object(1, INLINE_CHAIN), leaf + size / 2)
            .len(),
        2
    );
    assert!(
        symbolizer.cache_bytes().debuginfo > limits.debuginfo_cache_bytes,
        "parsing a unit made it grow"
    );
    symbolizer.end_of_profile();
    assert_eq!(symbolizer.cache_bytes().debuginfo, 0);
    assert_eq!(symbolizer.take_counts().debuginfo.evictions, 1);
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
}

#[test]
fn dwarf_refused_once_stays_refused_while_contexts_come_and_go() {
    let templates_index = DwarfInfo::parse(Bytes::new(Arc::new(TEMPLATES.to_vec())), usize::MAX)
        .expect("indexes")
        .heap_bytes();
    let limits = SymbolConfig {
        debuginfo_cache_bytes: templates_index + 64,
        ..SymbolConfig::default()
    };
    let mut symbolizer = symbolizer_with(&limits);
    let compressed = object(1, INLINE_CHAIN_COMPRESSED);
    let templates = object(2, TEMPLATES);
    let (leaf, _) = function_range(INLINE_CHAIN_COMPRESSED, "burn_leaf");
    let (run, _) = function_range(TEMPLATES, "_ZN4firn3runEi");
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
    // A context that grows past the cache pushes out everything else in
    // it, and is dropped itself after the profile.
    assert!(!symbolizer.user(&templates, run).is_empty());
    assert!(symbolizer.cache_bytes().debuginfo > limits.debuginfo_cache_bytes);
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
