//! The namer replayed over what `agent/examples/ruby_capture.rs` read of
//! live `ruby fixtures/ruby/chain.rb` processes (Debian's 3.1, and 2.7,
//! 3.3 and 3.4 in chroots): the frames the BPF walker would have recorded, and
//! every byte range read walking and naming them.

use agent_common::{InterpreterFrame, interpreter_frame_flags};
use agent_fixtures::memory::Regions;
use serde_json::Value;

use crate::{
    Memory, MemoryError, read_captured,
    ruby::{NameError, RubyFrame, RubyNamer, RubyProcess, RubyVersion},
};

/// `fixtures/ruby/MINOR/chain-N.json.gz`.
macro_rules! capture {
    ($minor:literal, $n:literal) => {
        (
            concat!($minor, "/chain-", $n),
            include_bytes!(concat!(
                "../../../../fixtures/ruby/",
                $minor,
                "/chain-",
                $n,
                ".json.gz"
            )) as &[u8],
        )
    };
}
const CAPTURES: [(&str, &[u8]); 12] = [
    capture!("2.7", "1"),
    capture!("2.7", "2"),
    capture!("2.7", "3"),
    capture!("3.1", "1"),
    capture!("3.1", "2"),
    capture!("3.1", "3"),
    capture!("3.3", "1"),
    capture!("3.3", "2"),
    capture!("3.3", "3"),
    capture!("3.4", "1"),
    capture!("3.4", "2"),
    capture!("3.4", "3"),
];

/// The chain's frames, innermost first, and their lines: the block's is
/// wherever its loop was stopped; `Integer#times` is [`Times`].
const CHAIN: [(&str, Option<u32>); 6] = [
    ("block in Chain#inner", None),
    ("Integer#times", Some(0)),
    ("Chain#inner", Some(22)),
    ("Chain.middle", Some(17)),
    ("Chain#outer", Some(13)),
    ("<main>", Some(32)),
];
/// The lines of the innermost block's loop.
const LOOP_LINES: std::ops::RangeInclusive<u32> = 23..=26;

/// What differs between releases: `Integer#times` is a C function until
/// 3.1 (no file, no line; the block it yields to is run by a call of the
/// interpreter loop of its own, an entry), Ruby code of `numeric.rb`
/// since 3.3 (run in the caller's loop: the block is no entry).
struct Times {
    file: &'static str,
    line: u32,
    entries: &'static [usize],
}

fn times(version: RubyVersion) -> Times {
    match (version.major, version.minor) {
        (2, 7) | (3, 1) => Times {
            file: "",
            line: 0,
            entries: &[0, 5, 6],
        },
        (3, 3) => Times {
            file: "<internal:numeric>",
            line: 237,
            entries: &[5, 6],
        },
        (3, 4) => Times {
            file: "<internal:numeric>",
            line: 257,
            entries: &[5, 6],
        },
        _ => panic!("no capture of {version}"),
    }
}

/// Captured memory, failing where nothing was captured.
#[derive(Clone)]
struct Captured(Regions);

impl Memory for Captured {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        read_captured(&self.0, address, buf)
    }
}

struct Capture {
    name: &'static str,
    process: RubyProcess,
    frames: Vec<InterpreterFrame>,
    memory: Captured,
    json: Value,
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

fn captures() -> Vec<Capture> {
    CAPTURES
        .iter()
        .map(|(name, gz)| {
            let json: Value =
                serde_json::from_slice(&agent_fixtures::inflate(gz).expect("gzip")).expect("JSON");
            let version =
                RubyVersion::parse(json["ruby"].as_str().expect("a version")).expect("a version");
            let frames = json["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|frame| InterpreterFrame {
                    code: hex(&frame["code"]),
                    stamp: hex(&frame["stamp"]),
                    instruction: hex(&frame["instruction"]),
                    flags: u32::try_from(frame["flags"].as_u64().expect("flags")).expect("u32"),
                    data: u32::try_from(hex(&frame["data"])).expect("u32"),
                })
                .collect();
            let regions = json["regions"]
                .as_array()
                .expect("regions")
                .iter()
                .map(|region| (hex(&region[0]), bytes(&region[1])))
                .collect();
            Capture {
                name,
                process: RubyProcess {
                    key: 1,
                    version,
                    symbols: hex(&json["symbols"]),
                },
                frames,
                memory: Captured(Regions(regions)),
                json,
            }
        })
        .collect()
}

/// Every frame of `capture` named by `namer` over `memory`.
fn name_all(
    namer: &mut RubyNamer,
    capture: &Capture,
    memory: &mut Captured,
) -> Vec<Result<Option<RubyFrame>, NameError>> {
    capture
        .frames
        .iter()
        .map(|frame| namer.name(&capture.process, memory, frame))
        .collect()
}

#[test]
fn the_chain_is_named_as_ruby_names_it() {
    for mut capture in captures() {
        let name = capture.name;
        let mut namer = RubyNamer::new(1 << 20);
        let mut memory = capture.memory.clone();
        let named: Vec<RubyFrame> = name_all(&mut namer, &capture, &mut memory)
            .into_iter()
            .filter_map(|named| named.unwrap_or_else(|error| panic!("{name}: {error}")))
            .collect();
        let functions: Vec<&str> = named.iter().map(|frame| &*frame.function).collect();
        let expected: Vec<&str> = CHAIN.iter().map(|(function, _)| *function).collect();
        assert_eq!(functions, expected, "{name}");
        let times = times(capture.process.version);
        for (frame, (function, line)) in named.iter().zip(CHAIN) {
            match line {
                Some(0) => assert_eq!(
                    (&*frame.file, frame.line),
                    (times.file, times.line),
                    "{name}: {function}"
                ),
                _ => assert!(
                    frame.file.ends_with("fixtures/ruby/chain.rb"),
                    "{name}: {function} in {}",
                    frame.file
                ),
            }
            match line {
                Some(0) => {}
                Some(line) => assert_eq!(frame.line, line, "{name}: {function}"),
                None => assert!(LOOP_LINES.contains(&frame.line), "{name}: {}", frame.line),
            }
        }
        // What the capture printed, from the same reads.
        for (frame, json) in capture
            .frames
            .iter()
            .zip(capture.json["frames"].as_array().expect("frames"))
        {
            let again = namer
                .name(&capture.process, &mut memory, frame)
                .expect("named from the cache");
            let printed = &json["named"];
            match again {
                Some(again) => {
                    assert_eq!(
                        printed["function"].as_str(),
                        Some(&*again.function),
                        "{name}"
                    );
                    assert_eq!(
                        printed["line"].as_u64(),
                        Some(u64::from(again.line)),
                        "{name}"
                    );
                }
                None => assert!(printed.is_null(), "{name}"),
            }
        }
        let counts = namer.take_counts();
        assert_eq!(counts.hits, 6, "{name}: the second naming of each frame");
        assert_eq!(counts.stale + counts.read_failures, 0, "{name}");
        capture.memory = memory;
    }
}

#[test]
fn the_walk_holds_the_chain_and_its_entries() {
    for capture in captures() {
        let name = capture.name;
        // The chain, a dummy frame under it; entries (a frame run by a
        // call of `rb_vm_exec` from C) at <main>, at the dummy frame and,
        // in 3.1, at the block the C function Integer#times yields to.
        assert_eq!(capture.frames.len(), 7, "{name}");
        let entries: Vec<usize> = (0..)
            .zip(&capture.frames)
            .filter(|(_, frame)| frame.flags & interpreter_frame_flags::ENTRY != 0)
            .map(|(index, _)| index)
            .collect();
        let times = times(capture.process.version);
        assert_eq!(entries, times.entries, "{name}");
        // A C function has no iseq; every frame has its method entry (or
        // a cref) as stamp.
        assert_eq!(capture.frames[1].code == 0, times.line == 0, "{name}");
        assert!(
            capture.frames.iter().all(|frame| frame.stamp != 0),
            "{name}"
        );
        let eval_loop = capture.json["eval_loop"].as_array().expect("a range");
        assert!(hex(&eval_loop[0]) < hex(&eval_loop[1]), "{name}");
        let mut namer = RubyNamer::new(1 << 20);
        let mut memory = capture.memory.clone();
        let hidden = name_all(&mut namer, &capture, &mut memory)
            .into_iter()
            .filter(|named| matches!(named, Ok(None)))
            .count();
        assert_eq!(hidden, 1, "{name}: the dummy frame");
    }
}

/// `capture`'s memory with the 8 bytes at `address` replaced.
fn overwritten(capture: &Capture, address: u64, value: u64) -> Captured {
    let mut regions = capture.memory.0.clone();
    assert!(regions.get(address, 8).is_some(), "{address:#x} captured");
    regions.add(address, &value.to_le_bytes());
    Captured(regions)
}

#[test]
fn an_overwritten_iseq_is_an_error_not_a_misnaming() {
    for capture in captures() {
        let name = capture.name;
        let innermost = capture.frames[0];
        let mut flags = [0; 8];
        let mut memory = capture.memory.clone();
        memory.read(innermost.code, &mut flags).expect("captured");
        // Its type flags say a String now (the slot was freed and reused).
        let reused = overwritten(&capture, innermost.code, 0x0000_4005);
        // Named before (cached) or not: the frame is not named.
        let mut warm = RubyNamer::new(1 << 20);
        warm.name(&capture.process, &mut memory, &innermost)
            .expect("named");
        for namer in [&mut warm, &mut RubyNamer::new(1 << 20)] {
            assert!(
                matches!(
                    namer.name(&capture.process, &mut reused.clone(), &innermost),
                    Err(NameError::NotIseq { flags: 0x4005, .. })
                ),
                "{name}"
            );
            assert_eq!(namer.take_counts().stale, 1, "{name}");
        }
        // Its method entry replaced by a cref: the label alone, not the
        // cached method's class.
        let cref = u64::from_le_bytes(flags) & !0xf000 | 1 << 12;
        let recrefed = overwritten(&capture, innermost.stamp, cref);
        let named = warm
            .name(&capture.process, &mut recrefed.clone(), &innermost)
            .expect("named")
            .expect("shown");
        assert_eq!(&*named.function, "block in inner", "{name}");
    }
}

#[test]
fn truncated_memory_gives_errors_never_panics_nor_other_names() {
    for capture in captures() {
        let name = capture.name;
        let mut full = capture.memory.clone();
        let expected = name_all(&mut RubyNamer::new(1 << 20), &capture, &mut full);
        let regions = &capture.memory.0.0;
        let mut errors = 0;
        // Each region cut short, then left out.
        for index in 0..regions.len() {
            for keep in [regions[index].1.len() / 2, 0] {
                let mut cut = regions.clone();
                cut[index].1.truncate(keep);
                let mut memory = Captured(Regions(cut));
                let named = name_all(&mut RubyNamer::new(1 << 20), &capture, &mut memory);
                for (got, expected) in named.iter().zip(&expected) {
                    match (got, expected) {
                        (Err(_), _) => errors += 1,
                        (Ok(Some(got)), Ok(Some(expected))) => {
                            // Only a line may go (to the first line) with its
                            // table: the name and file stay.
                            assert_eq!(got.function, expected.function, "{name}: region {index}");
                            assert_eq!(got.file, expected.file, "{name}: region {index}");
                        }
                        (got, expected) => {
                            assert_eq!(got.is_ok(), expected.is_ok(), "{name}: region {index}");
                        }
                    }
                }
            }
        }
        assert!(errors > regions.len(), "{name}: {errors} errors");
    }
}
