//! The jitdump reader over files written here record by record, as a JIT
//! appends them.

use super::*;
use crate::perfmap::MemoryPerfMap;

fn header() -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&MAGIC.to_le_bytes());
    bytes.extend_from_slice(&1u32.to_le_bytes()); // version
    bytes.extend_from_slice(&40u32.to_le_bytes()); // header size
    bytes.extend_from_slice(&62u32.to_le_bytes()); // EM_X86_64
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&4242u32.to_le_bytes()); // pid
    bytes.extend_from_slice(&0u64.to_le_bytes()); // timestamp
    bytes.extend_from_slice(&0u64.to_le_bytes()); // flags
    bytes
}

fn record(id: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&(16 + body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&7u64.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn load(address: u64, size: u64, name: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&4242u32.to_le_bytes());
    body.extend_from_slice(&4243u32.to_le_bytes());
    body.extend_from_slice(&address.to_le_bytes()); // vma
    body.extend_from_slice(&address.to_le_bytes());
    body.extend_from_slice(&size.to_le_bytes());
    body.extend_from_slice(&1u64.to_le_bytes()); // code index
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    // The code itself, which the reader skips.
    body.extend(std::iter::repeat_n(0xcc, size as usize));
    record(CODE_LOAD, &body)
}

fn moved(old: u64, new: u64, size: u64) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&4242u32.to_le_bytes());
    body.extend_from_slice(&4243u32.to_le_bytes());
    body.extend_from_slice(&new.to_le_bytes());
    body.extend_from_slice(&old.to_le_bytes());
    body.extend_from_slice(&new.to_le_bytes());
    body.extend_from_slice(&size.to_le_bytes());
    body.extend_from_slice(&1u64.to_le_bytes());
    record(CODE_MOVE, &body)
}

#[test]
fn loads_and_moves_are_read_as_they_are_appended() {
    let file = MemoryPerfMap::default();
    let mut table = JitdumpTable::default();
    // Half a header: nothing yet.
    let head = header();
    file.append(&head[..20]);
    assert_eq!(table.refresh(&file, 1 << 20).expect("reads").entries, 0);
    file.append(&head[20..]);
    file.append(&load(0x1000, 0x40, "LazyCompile:*settle /app/ledger.js:3"));
    // A debug-info record (id 2): skipped.
    file.append(&record(2, &[0; 24]));
    let second = load(0x2000, 0x20, "Builtin:InterpreterEntryTrampoline");
    file.append(&second[..30]);
    let report = table.refresh(&file, 1 << 20).expect("reads");
    assert_eq!((report.entries, report.errors), (1, 0));
    assert_eq!(
        table.lookup(0x1020),
        Some("LazyCompile:*settle /app/ledger.js:3")
    );
    assert_eq!(table.lookup(0x2000), None, "the record is not whole yet");
    file.append(&second[30..]);
    file.append(&moved(0x1000, 0x5000, 0x40));
    let report = table.refresh(&file, 1 << 20).expect("reads");
    assert_eq!((report.entries, report.errors), (2, 0));
    assert_eq!(
        table.lookup(0x2010),
        Some("Builtin:InterpreterEntryTrampoline")
    );
    assert_eq!(
        table.lookup(0x503f),
        Some("LazyCompile:*settle /app/ledger.js:3")
    );
    assert_eq!(table.lookup(0x5040), None);
    assert_eq!(table.len(), 3);
}

#[test]
fn newer_code_at_the_same_address_wins() {
    let file = MemoryPerfMap::default();
    file.append(&header());
    file.append(&load(0x1000, 0x40, "old"));
    let mut table = JitdumpTable::default();
    table.refresh(&file, 1 << 20).expect("reads");
    file.append(&load(0x1000, 0x40, "new"));
    table.refresh(&file, 1 << 20).expect("reads");
    assert_eq!(table.lookup(0x1000), Some("new"));
}

#[test]
fn a_file_that_is_not_a_jitdump_is_left_alone() {
    let file = MemoryPerfMap::default();
    let mut bad = header();
    bad[..4].copy_from_slice(&MAGIC.swap_bytes().to_le_bytes());
    file.append(&bad);
    file.append(&load(0x1000, 0x40, "f"));
    let mut table = JitdumpTable::default();
    assert_eq!(table.refresh(&file, 1 << 20).expect("reads").errors, 1);
    assert!(table.is_empty());
    // A record claiming to be shorter than its own prefix ends the read.
    let file = MemoryPerfMap::default();
    file.append(&header());
    file.append(&load(0x1000, 0x40, "f"));
    file.append(&[0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    file.append(&load(0x2000, 0x40, "g"));
    let mut table = JitdumpTable::default();
    let report = table.refresh(&file, 1 << 20).expect("reads");
    assert_eq!((report.entries, report.errors), (1, 1));
    assert_eq!(table.lookup(0x2000), None);
}

#[test]
fn reading_stops_at_the_bound_and_starts_over_on_a_new_file() {
    let file = MemoryPerfMap::default();
    file.append(&header());
    let first = load(0x1000, 0x40, "f");
    let bound = (header().len() + first.len()) as u64;
    file.append(&first);
    file.append(&load(0x2000, 0x40, "g"));
    let mut table = JitdumpTable::default();
    let report = table.refresh(&file, bound).expect("reads");
    assert!(report.truncated);
    assert_eq!(table.len(), 1);
    // The JIT started over (a new process with the same pid): a shorter
    // file is read from its start.
    file.replace(&header());
    file.append(&load(0x3000, 0x10, "h"));
    let report = table.refresh(&file, 1 << 20).expect("reads");
    assert_eq!(report.entries, 1);
    assert_eq!(table.lookup(0x1000), None);
    assert_eq!(table.lookup(0x3000), Some("h"));
}

#[test]
fn either_kind_of_file_is_recognized() {
    let file = MemoryPerfMap::default();
    assert!(JitTable::for_file(&file).is_none(), "empty: not yet known");
    file.append(&header());
    file.append(&load(0x1000, 0x40, "f"));
    let mut table = JitTable::for_file(&file).expect("a jitdump");
    assert!(matches!(table, JitTable::Jitdump(_)));
    table.refresh(&file, 1 << 20).expect("reads");
    assert_eq!(table.lookup(0x1000), Some("f"));
    let file = MemoryPerfMap::default();
    file.append(b"1000 40 g\n");
    let mut table = JitTable::for_file(&file).expect("a perf map");
    assert!(matches!(table, JitTable::PerfMap(_)));
    table.refresh(&file, 1 << 20).expect("reads");
    assert_eq!(table.lookup(0x1000), Some("g"));
}
