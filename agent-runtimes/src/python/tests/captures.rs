//! The namer and the line table decoders replayed over what
//! `fixtures/python/capture_frames.py` copied out of live interpreters,
//! against what those interpreters said of their own frames.

use agent_common::InterpreterFrame;
use serde_json::Value;

use super::interpreters;
use crate::{
    Memory, MemoryError,
    python::{
        NameError, NamerCounts, PythonNamer, PythonVersion,
        layout::{Bytecode, Layout, OBJECT_TYPE},
        lines::LineTable,
    },
};

/// Process memory as captured: copies of regions, by address.
#[derive(Clone)]
pub(super) struct Regions(Vec<(u64, Vec<u8>)>);

impl Regions {
    fn of(capture: &Value) -> Self {
        let spans = capture["regions"]
            .as_array()
            .expect("regions")
            .iter()
            .map(|span| (hex(&span[0]), bytes(&span[1])))
            .collect();
        Self(spans)
    }

    pub(super) fn write(&mut self, address: u64, data: &[u8]) {
        for (start, bytes) in &mut self.0 {
            if address >= *start && address + data.len() as u64 <= *start + bytes.len() as u64 {
                let offset = (address - *start) as usize;
                bytes[offset..offset + data.len()].copy_from_slice(data);
                return;
            }
        }
        panic!("{address:#x} was not captured");
    }
}

impl Memory for Regions {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let found = self.0.iter().find_map(|(start, bytes)| {
            let offset = usize::try_from(address.checked_sub(*start)?).ok()?;
            bytes.get(offset..offset.checked_add(buf.len())?)
        });
        match found {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(MemoryError {
                address,
                length: buf.len(),
                source: None,
            }),
        }
    }
}

fn hex(value: &Value) -> u64 {
    let text = value.as_str().expect("a hex string");
    u64::from_str_radix(text.trim_start_matches("0x"), 16).expect("hex")
}

fn bytes(value: &Value) -> Vec<u8> {
    let text = value.as_str().expect("a hex string").as_bytes();
    text.chunks_exact(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).expect("ascii"), 16).expect("hex"))
        .collect()
}

fn number(value: &Value) -> u64 {
    value.as_u64().expect("a number")
}

/// Every capture file: its version, name and JSON.
fn captures() -> Vec<(PythonVersion, String, Value)> {
    interpreters()
        .flat_map(|(version, interpreter)| {
            interpreter.frames.iter().map(move |(name, json)| {
                let value: Value = serde_json::from_str(json).expect("JSON");
                (version, format!("{}/{name}", interpreter.minor), value)
            })
        })
        .collect()
}

/// A frame as the walker would record it: the stamp read from the code
/// object as captured.
fn walked(memory: &mut Regions, version: PythonVersion, frame: &Value) -> InterpreterFrame {
    let code = hex(&frame["code"]);
    let stamp_offset = Layout::of(version).expect("supported").code.stamp;
    let mut stamp = [0; 8];
    memory
        .read(code + stamp_offset, &mut stamp)
        .expect("captured");
    InterpreterFrame {
        code,
        stamp: u64::from_le_bytes(stamp),
        instruction: hex(&frame["instruction"]),
        flags: 0,
        data: 0,
    }
}

#[test]
fn frames_are_named_as_python_names_them() {
    for (version, file, json) in captures() {
        let mut namer = PythonNamer::new(1 << 20);
        let mut named = 0;
        for (thread, capture) in json["captures"]
            .as_array()
            .expect("captures")
            .iter()
            .enumerate()
        {
            let mut memory = Regions::of(capture);
            for frame in capture["frames"].as_array().expect("frames") {
                let walked = walked(&mut memory, version, frame);
                let got = namer
                    .name(1, version, &mut memory, &walked)
                    .unwrap_or_else(|error| panic!("{file}: {frame}: {error}"));
                let context = format!("{file}, thread {thread}: {frame}");
                assert_eq!(
                    &*got.function,
                    frame["function"].as_str().expect("a name"),
                    "{context}"
                );
                assert_eq!(
                    &*got.file,
                    frame["file"].as_str().expect("a file"),
                    "{context}"
                );
                assert_eq!(u64::from(got.line), number(&frame["line"]), "{context}");
                assert_eq!(
                    u64::from(got.first_line),
                    number(&frame["first_line"]),
                    "{context}"
                );
                // Named again: from the cache, the same.
                let again = namer
                    .name(1, version, &mut memory, &walked)
                    .expect("cached");
                assert_eq!(again, got);
                named += 1;
            }
        }
        let counts = namer.take_counts();
        assert!(named >= 20, "{file}: {named} frames");
        // The threads share their outer functions' code objects... or not:
        // every name is a hit or a miss, and the second naming always hits.
        assert_eq!(counts.hits + counts.misses, 2 * named, "{file}");
        assert!(counts.hits >= named, "{file}");
        assert_eq!(counts.stale + counts.read_failures + counts.evictions, 0);
        assert_eq!(namer.take_counts(), NamerCounts::default());
    }
}

#[test]
fn the_walker_chain_holds_the_frames() {
    for (version, file, json) in captures() {
        for capture in json["captures"].as_array().expect("captures") {
            let frames: Vec<u64> = capture["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|frame| hex(&frame["code"]))
                .collect();
            // Shim frames (3.12+, owner 3) are skipped by the walker.
            let chain: Vec<u64> = capture["chain"]
                .as_array()
                .expect("chain")
                .iter()
                .filter(|link| !(version.minor >= 12 && link[1].as_u64() == Some(3)))
                .map(|link| hex(&link[0]))
                .collect();
            assert_eq!(chain, frames, "{file}");
            let checks = &capture["checks"];
            let layout = Layout::of(version).expect("supported");
            assert_eq!(
                number(&checks["runtime_tss_offset"]),
                layout.runtime_tss_key
            );
            assert!(number(&checks["tss_key"]) < 32, "{file}");
        }
    }
}

#[test]
fn line_tables_decode_as_python_reads_them() {
    for (version, file, json) in captures() {
        let format = Layout::of(version).expect("supported").code.line_format;
        let objects = json["code_objects"].as_array().expect("code objects");
        assert!(objects.len() >= 15, "{file}");
        for object in objects {
            let first_line = u32::try_from(number(&object["first_line"])).expect("a line");
            let lines = LineTable::decode(format, &bytes(&object["table"]), first_line);
            let mut covered = 0;
            for range in object["lines"].as_array().expect("lines") {
                let (start, end) = (number(&range[0]), number(&range[1]));
                assert_eq!(start, covered, "{file}: {}: contiguous", object["name"]);
                let expected = range[2]
                    .as_u64()
                    .map(|line| u32::try_from(line).expect("a line"));
                for offset in (start..end).step_by(2) {
                    let offset = u32::try_from(offset).expect("small");
                    assert_eq!(
                        lines.line(offset),
                        expected,
                        "{file}: {}: {offset}",
                        object["name"]
                    );
                }
                covered = end;
            }
            assert_eq!(
                covered,
                number(&object["code_bytes"]),
                "{file}: {}",
                object["name"]
            );
        }
    }
}

/// The first capture of `minor`, its memory and its innermost frame.
pub(super) fn innermost(minor: u8) -> (PythonVersion, Regions, InterpreterFrame, Value) {
    let (version, _, json) = captures()
        .into_iter()
        .find(|(version, _, _)| version.minor == minor)
        .expect("a capture");
    let capture = &json["captures"][0];
    let mut memory = Regions::of(capture);
    let frame = capture["frames"][0].clone();
    let walked = walked(&mut memory, version, &frame);
    (version, memory, walked, frame)
}

#[test]
fn a_changed_stamp_is_stale() {
    for minor in [8, 10, 11, 13] {
        let (version, mut memory, frame, _) = innermost(minor);
        let mut namer = PythonNamer::new(1 << 20);
        namer.name(1, version, &mut memory, &frame).expect("named");
        // The same address with another stamp: not the cached object, and
        // memory does not hold the sampled one either.
        let other = InterpreterFrame {
            stamp: frame.stamp ^ 1,
            ..frame
        };
        assert!(matches!(
            namer.name(1, version, &mut memory, &other),
            Err(NameError::Stale { .. })
        ));
        let counts = namer.take_counts();
        assert_eq!((counts.misses, counts.stale), (2, 1));
        // Memory now holds a code object with the new stamp (the old one
        // was freed, a new one made there): the cache is not trusted.
        let stamp_offset = Layout::of(version).expect("supported").code.stamp;
        memory.write(frame.code + stamp_offset, &other.stamp.to_le_bytes());
        namer
            .name(1, version, &mut memory, &other)
            .expect("re-read");
        assert_eq!(namer.take_counts().misses, 1);
        // And the old stamp no longer names anything.
        assert!(namer.name(1, version, &mut memory, &frame).is_err());
    }
}

#[test]
fn objects_of_another_type_are_not_code() {
    let (version, mut memory, frame, _) = innermost(12);
    let mut namer = PythonNamer::new(1 << 20);
    // A type pointer to where nothing is: no type at all.
    memory.write(frame.code + OBJECT_TYPE, &0x10u64.to_le_bytes());
    assert!(matches!(
        namer.name(1, version, &mut memory, &frame),
        Err(NameError::NotCode { .. })
    ));
    // A type pointer to a string object: its "tp_name" is not "code".
    let file = {
        let mut pointer = [0; 8];
        let offset = Layout::of(version).expect("supported").code.file;
        memory
            .read(frame.code + offset, &mut pointer)
            .expect("captured");
        u64::from_le_bytes(pointer)
    };
    memory.write(frame.code + OBJECT_TYPE, &file.to_le_bytes());
    assert!(namer.name(1, version, &mut memory, &frame).is_err());
    assert_eq!(namer.take_counts().stale, 2);
}

#[test]
fn unreadable_memory_is_counted() {
    let (version, _, frame, _) = innermost(9);
    let mut namer = PythonNamer::new(1 << 20);
    let mut nothing = Regions(Vec::new());
    assert!(matches!(
        namer.name(1, version, &mut nothing, &frame),
        Err(NameError::Read { .. })
    ));
    assert_eq!(namer.take_counts().read_failures, 1);
    let old = PythonVersion {
        major: 3,
        minor: 7,
        patch: 0,
    };
    assert!(matches!(
        namer.name(1, old, &mut nothing, &frame),
        Err(NameError::UnsupportedVersion { .. })
    ));
}

#[test]
fn instructions_outside_the_code_give_the_first_line() {
    for minor in [8, 10, 11, 12, 13] {
        let (version, mut memory, frame, expected) = innermost(minor);
        let mut namer = PythonNamer::new(1 << 20);
        let first_line = u32::try_from(number(&expected["first_line"])).expect("a line");
        let adaptive = match Layout::of(version).expect("supported").code.bytecode {
            Bytecode::Inline { adaptive } => adaptive,
            Bytecode::Object { .. } => 0,
        };
        let outside = if minor >= 11 {
            // Not started: one code unit before the code.
            [frame.code + adaptive - 2, frame.code, u64::MAX]
        } else {
            // f_lasti -1 (in the low half), and far past the end.
            [0xffff_ffff, 0x1234_ffff_ffff, 0x7fff_0000]
        };
        for instruction in outside {
            let frame = InterpreterFrame {
                instruction,
                ..frame
            };
            let named = namer.name(1, version, &mut memory, &frame).expect("named");
            assert_eq!(named.line, first_line, "{version}: {instruction:#x}");
        }
    }
}

#[test]
fn the_cache_stays_within_its_bytes() {
    let (version, _, json) = captures()
        .into_iter()
        .find(|(version, _, _)| version.minor == 11)
        .expect("a capture");
    let capture = &json["captures"][0];
    let mut memory = Regions::of(capture);
    let frames: Vec<InterpreterFrame> = capture["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|frame| walked(&mut memory, version, frame))
        .collect();
    // Room for one code object at a time.
    let mut namer = PythonNamer::new(1);
    for frame in &frames {
        namer.name(1, version, &mut memory, frame).expect("named");
    }
    namer
        .name(1, version, &mut memory, &frames[0])
        .expect("named");
    let counts = namer.take_counts();
    assert_eq!(counts.hits, 0);
    assert_eq!(counts.misses, frames.len() as u64 + 1);
    assert_eq!(counts.evictions, frames.len() as u64);
    // Processes are apart: the same code address in another process is
    // read again, and forgetting a process is no error.
    let mut roomy = PythonNamer::new(1 << 20);
    roomy
        .name(1, version, &mut memory, &frames[0])
        .expect("named");
    roomy
        .name(2, version, &mut memory, &frames[0])
        .expect("named");
    roomy.forget(1);
    roomy
        .name(2, version, &mut memory, &frames[0])
        .expect("named");
    let counts = roomy.take_counts();
    assert_eq!((counts.misses, counts.hits), (2, 1));
}

/// The captured regions in a process whose memory around them is mapped
/// (zeros where nothing was captured), counting system calls: a read, or
/// one batch of reads.
struct Mapped {
    regions: Regions,
    calls: usize,
}

impl Memory for Mapped {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.calls += 1;
        for (offset, byte) in (0u64..).zip(buf.iter_mut()) {
            let mut captured = [0];
            let address = address.wrapping_add(offset);
            *byte = match self.regions.read(address, &mut captured) {
                Ok(()) => captured[0],
                Err(_) => 0,
            };
        }
        Ok(())
    }

    fn read_many(&mut self, reads: &mut [(u64, &mut [u8])]) -> usize {
        for (address, buf) in reads.iter_mut() {
            self.read(*address, buf).expect("mapped");
        }
        self.calls -= reads.len().saturating_sub(1);
        reads.len()
    }
}

#[test]
fn a_code_object_is_read_in_a_few_system_calls() {
    for minor in [8, 10, 11, 12, 13] {
        let (version, regions, frame, _) = innermost(minor);
        let expected = PythonNamer::new(1 << 20)
            .name(1, version, &mut regions.clone(), &frame)
            .expect("named from the exact reads");
        let mut memory = Mapped { regions, calls: 0 };
        let mut namer = PythonNamer::new(1 << 20);
        let named = namer.name(1, version, &mut memory, &frame).expect("named");
        assert_eq!(named, expected, "{version}");
        // The header, the type's name (its pointer, then the name), the
        // file, function and line table together, and before 3.11 the
        // bytecode's size.
        let bytecode = usize::from(minor < 11);
        assert_eq!(memory.calls, 4 + bytecode, "{version}");
    }
}
