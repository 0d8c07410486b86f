//! Code objects in an interpreter object's data, named once for every
//! process of that object and owner.

use agent_common::InterpreterFrame;

use super::captures::{Regions, innermost};
use crate::{
    Memory, MemoryError,
    python::{PythonNamer, SharedObject, layout::Layout},
};

/// A process's memory that counts the reads made of it.
struct Counted<M> {
    memory: M,
    reads: usize,
}

impl<M> Counted<M> {
    fn new(memory: M) -> Self {
        Self { memory, reads: 0 }
    }
}

impl<M: Memory> Memory for Counted<M> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.reads += 1;
        self.memory.read(address, buf)
    }
}

/// A process whose memory holds nothing: any read fails.
struct Nothing;

impl Memory for Nothing {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        Err(MemoryError {
            address,
            length: buf.len(),
            source: None,
        })
    }
}

/// The interpreter object of a process, mapped so that `code` lies in its
/// data at file offset 0x5000.
fn object(owner: u32, content: u64, code: u64) -> SharedObject {
    SharedObject {
        owner,
        content,
        ranges: vec![(code - 0x1000..code + 0x1000, 0x4000)],
    }
}

/// The same frame in a process where the object is mapped `delta` higher.
fn moved(frame: &InterpreterFrame, delta: u64) -> InterpreterFrame {
    InterpreterFrame {
        code: frame.code + delta,
        instruction: frame.instruction + delta,
        ..*frame
    }
}

#[test]
fn a_code_object_in_the_object_is_read_once_for_its_processes() {
    for minor in [11, 12, 13] {
        let (version, memory, frame, _) = innermost(minor);
        let mut namer = PythonNamer::new(1 << 20);
        let mut first = Counted::new(memory);
        let here = object(1000, 7, frame.code);
        let named = namer
            .name_shared(1, Some(&here), version, &mut first, &frame)
            .expect("named");
        assert!(first.reads > 0);
        namer
            .name_shared(1, Some(&here), version, &mut first, &frame)
            .expect("named");
        // Another process of the same file and user, with the object
        // mapped elsewhere: named without reading its memory.
        let delta = 0x7000_0000;
        let elsewhere = object(1000, 7, frame.code + delta);
        let mut second = Counted::new(Nothing);
        let again = namer
            .name_shared(
                2,
                Some(&elsewhere),
                version,
                &mut second,
                &moved(&frame, delta),
            )
            .expect("named from the first process's read");
        assert_eq!(second.reads, 0, "3.{minor}");
        assert_eq!(again, named, "3.{minor}");
        let counts = namer.take_counts();
        assert_eq!(
            (counts.misses, counts.hits, counts.shared_hits),
            (1, 1, 1),
            "3.{minor}"
        );
    }
}

#[test]
fn another_owner_object_or_heap_address_reads_again() {
    let (version, memory, frame, _) = innermost(11);
    let mut namer = PythonNamer::new(1 << 20);
    let mut first = Counted::new(memory.clone());
    let here = object(1000, 7, frame.code);
    namer
        .name_shared(1, Some(&here), version, &mut first, &frame)
        .expect("named");
    let others = [
        // A process of another user: it could have planted nothing here,
        // nor may what its own copy holds name this one's frames.
        Some(object(1001, 7, frame.code)),
        // Another object (another libpython build).
        Some(object(1000, 8, frame.code)),
        // The code object is on the heap, outside the object.
        Some(SharedObject {
            ranges: vec![(frame.code + 0x1000..frame.code + 0x2000, 0)],
            ..object(1000, 7, frame.code)
        }),
        // Nothing known of the object.
        None,
    ];
    for (process, shared) in (2..).zip(&others) {
        let mut other = Counted::new(memory.clone());
        namer
            .name_shared(process, shared.as_ref(), version, &mut other, &frame)
            .expect("named");
        assert!(other.reads > 0, "{shared:?}");
    }
    let counts = namer.take_counts();
    assert_eq!((counts.shared_hits, counts.hits), (0, 0));
    assert_eq!(counts.misses, 1 + others.len() as u64);
}

#[test]
fn a_shared_entry_of_another_stamp_is_read_again() {
    let (version, memory, frame, _) = innermost(11);
    let mut namer = PythonNamer::new(1 << 20);
    let shared = object(1000, 7, frame.code);
    namer
        .name_shared(1, Some(&shared), version, &mut memory.clone(), &frame)
        .expect("named");
    // In the second process the object at that offset has another stamp
    // (its copy was written to): its own read names it, and is shared.
    let stamp_offset = Layout::of(version).expect("supported").code.stamp;
    let mut changed: Regions = memory.clone();
    let stamp = frame.stamp ^ 0x1_0000_0000;
    changed.write(frame.code + stamp_offset, &stamp.to_le_bytes());
    let restamped = InterpreterFrame { stamp, ..frame };
    let mut second = Counted::new(changed);
    namer
        .name_shared(2, Some(&shared), version, &mut second, &restamped)
        .expect("named");
    assert!(second.reads > 0, "the cached entry has another stamp");
    let mut third = Counted::new(Nothing);
    namer
        .name_shared(3, Some(&shared), version, &mut third, &restamped)
        .expect("named from the second process's read");
    assert_eq!(third.reads, 0);
    // The first stamp's entry was replaced.
    assert!(
        namer
            .name_shared(4, Some(&shared), version, &mut Nothing, &frame)
            .is_err()
    );
    let counts = namer.take_counts();
    assert_eq!((counts.misses, counts.shared_hits), (3, 1));
}
