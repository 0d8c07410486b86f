//! A made-up 3.3 or 3.4 process: what its captures cannot show of the
//! layout those releases share (a class's path and a singleton class's
//! object as fields of its `rb_classext_t`, strings whose length is
//! always `len`, `first_lineno` an int, `Qnil` 0x04): modules, anonymous
//! classes, a path that is not permanent, an embedded string longer than
//! the header read ahead, heap strings, `FL_SINGLETON` of each release.

use agent_common::InterpreterFrame;

use super::image::{IMEMO_ISEQ, Image, METHOD, id};
use crate::ruby::{RubyFrame, RubyNamer, RubyProcess, RubyVersion};

const NIL: u64 = 0x04;
const T_CLASS: u64 = 0x02;
const T_MODULE: u64 = 0x03;
const T_STRING: u64 = 0x05;
const T_ARRAY: u64 = 0x07;
const NOEMBED: u64 = 0x2000;
const EMBED: u64 = 0x2000;
/// `FL_SINGLETON`: `FL_USER0` in 3.3, `FL_USER1` in 3.4.
const SINGLETON_3_3: u64 = 0x1000;
const SINGLETON_3_4: u64 = 0x2000;

/// Objects laid out as 3.3 and 3.4 lay them out.
trait Objects {
    fn string33(&mut self, text: &str) -> u64;
    fn array33(&mut self, elements: &[u64]) -> u64;
    fn symbols33(&mut self, names: &[(u64, &str)]) -> u64;
    fn class33(&mut self, flags: u64, path: Option<(&str, bool)>, attached: u64) -> u64;
    fn iseq33(&mut self, label: &str, path: u64, first_line: i32, lines: &[i32]) -> (u64, u64);
}

impl Objects for Image {
    /// Embedded in a slot of up to 640 bytes (`len` at 16, bytes at 24),
    /// else on the heap.
    fn string33(&mut self, text: &str) -> u64 {
        let embedded = 24 + text.len() < 640;
        let slot = [40, 80, 160, 320, 640]
            .into_iter()
            .find(|slot| !embedded || 24 + text.len() < *slot)
            .unwrap_or(40);
        let string = self.alloc(slot);
        self.word(string + 16, text.len() as u64);
        if embedded {
            self.word(string, T_STRING);
            self.put(string + 24, text.as_bytes());
        } else {
            let bytes = self.alloc(text.len());
            self.put(bytes, text.as_bytes());
            self.word(string, T_STRING | NOEMBED);
            self.word(string + 24, bytes);
        }
        string
    }

    /// Embedded up to 3 elements, else on the heap.
    fn array33(&mut self, elements: &[u64]) -> u64 {
        let array = self.alloc(40);
        let (flags, at) = if elements.len() <= 3 {
            (T_ARRAY | EMBED | (elements.len() as u64) << 15, array + 16)
        } else {
            let heap = self.alloc(elements.len() * 8);
            self.word(array + 16, elements.len() as u64);
            self.word(array + 32, heap);
            (T_ARRAY, heap)
        };
        self.word(array, flags);
        for (index, element) in (0..).zip(elements) {
            self.word(at + index * 8, *element);
        }
        array
    }

    fn symbols33(&mut self, names: &[(u64, &str)]) -> u64 {
        let mut values = vec![NIL; 1024];
        for (serial, name) in names {
            values[*serial as usize * 2] = self.string33(name);
            values[*serial as usize * 2 + 1] = id(*serial) << 8 | 0x0c;
        }
        let chunk = self.array33(&values);
        let ids = self.array33(&[chunk]);
        let table = self.alloc(32);
        let last = names.iter().map(|(serial, _)| *serial).max().unwrap_or(0);
        self.put(table, &(last as u32).to_le_bytes());
        self.word(table + 16, ids);
        table
    }

    /// A class or module in its 160-byte slot: `classpath` at 152,
    /// `permanent_classpath` bit 0 of byte 149, `attached_object` at 128.
    fn class33(&mut self, flags: u64, path: Option<(&str, bool)>, attached: u64) -> u64 {
        let path = path.map(|(text, permanent)| (self.string33(text), permanent));
        let class = self.alloc(160);
        self.word(class, flags);
        self.word(class + 128, attached);
        if let Some((path, permanent)) = path {
            self.word(class + 152, path);
            // `variation_count` shares the word: the bit alone is read.
            self.put(class + 148, &[7, u8::from(permanent) | 0xfe]);
        }
        class
    }

    /// An instruction sequence of 8 VALUEs, one `insns_info` entry per
    /// position up to `lines`; its address and `iseq_encoded`.
    fn iseq33(&mut self, label: &str, path: u64, first_line: i32, lines: &[i32]) -> (u64, u64) {
        let body = self.alloc(144);
        let encoded = self.alloc(64);
        let entries = self.alloc(12 * lines.len().max(1));
        for (index, line) in (0..).zip(lines) {
            self.put(entries + index * 12, &line.to_le_bytes());
        }
        let positions = self.alloc(4 * lines.len().max(1));
        for index in 0..lines.len() as u32 {
            self.put(positions + u64::from(index) * 4, &index.to_le_bytes());
        }
        let label = self.string33(label);
        self.put(body + 4, &8u32.to_le_bytes());
        self.word(body + 8, encoded);
        self.word(body + 64, path);
        self.word(body + 72, label);
        self.word(body + 80, label);
        self.put(body + 88, &first_line.to_le_bytes());
        self.word(body + 112, entries);
        self.word(body + 120, positions);
        self.put(body + 128, &(lines.len() as u32).to_le_bytes());
        let iseq = self.alloc(24);
        self.word(iseq, IMEMO_ISEQ);
        self.word(iseq + 16, body);
        (iseq, encoded)
    }
}

/// A label longer than the 40 bytes read ahead, still embedded.
const LONG: &str = "a_method_whose_name_is_longer_than_a_string_header";
const FILE: &str = "/srv/app/lib/busy_worker.rb";

/// The frames of four methods named in a made-up process of `version`
/// whose singleton class is flagged `singleton`: a module's, a singleton
/// method, an anonymous class's (its label longer than a header), and one
/// of a module whose path is not permanent, its pc past its (empty) table.
fn name(version: (u8, u8), singleton: u64) -> Vec<RubyFrame> {
    let mut image = Image::default();
    image.alloc(16);
    let names = [(300, "work"), (301, "run"), (302, LONG), (303, "inner")];
    let symbols = image.symbols33(&names);
    let busy = image.class33(T_MODULE, Some(("Busy", true)), 0);
    let worker = image.class33(T_CLASS, Some(("Worker", true)), 0);
    let singleton = image.class33(T_CLASS | singleton, None, worker);
    let anonymous = image.class33(T_CLASS, None, 0);
    // `Class.new { const_set(:Inner, Module.new) }`'s module: a path that
    // is not permanent.
    let temporary = image.class33(T_MODULE, Some(("#<Class:0x1>::Inner", false)), 0);
    let path = image.string33(FILE);
    let real = image.string33("/srv/releases/42/lib/busy_worker.rb");
    let pathobj = image.array33(&[path, real]);
    let mut frames = Vec::new();
    for (owner, serial, label, lines, position) in [
        (busy, 300, "work", &[11, 12][..], Some(1)),
        (singleton, 301, "run", &[21][..], Some(0)),
        (anonymous, 302, LONG, &[31][..], Some(0)),
        (temporary, 303, "inner", &[][..], None),
    ] {
        let (iseq, encoded) = image.iseq33(label, pathobj, 40 + serial as i32, lines);
        let entry = image.method_entry(owner, id(serial), id(serial));
        frames.push(InterpreterFrame {
            code: iseq,
            stamp: entry,
            instruction: position.map_or(encoded + 64, |position| encoded + (position + 1) * 8),
            flags: 0,
            data: METHOD,
        });
    }
    let process = RubyProcess {
        key: 3,
        version: RubyVersion {
            major: version.0,
            minor: version.1,
            patch: 0,
        },
        symbols,
    };
    let mut namer = RubyNamer::new(1 << 20);
    frames
        .iter()
        .map(|frame| {
            namer
                .name(&process, &mut image, frame)
                .unwrap_or_else(|error| panic!("{frame:x?}: {error}"))
                .expect("shown")
        })
        .collect()
}

#[test]
fn classes_are_named_by_their_fields() {
    for (version, singleton) in [((3, 3), SINGLETON_3_3), ((3, 4), SINGLETON_3_4)] {
        let named: Vec<(String, String, u32)> = name(version, singleton)
            .into_iter()
            .map(|frame| {
                (
                    frame.function.to_string(),
                    frame.file.to_string(),
                    frame.line,
                )
            })
            .collect();
        assert_eq!(
            named,
            [
                ("Busy#work".into(), FILE.into(), 12),
                ("Worker.run".into(), FILE.into(), 21),
                // Anonymous: the bare name; read past the header.
                (LONG.into(), FILE.into(), 31),
                // Not a permanent path, no line table: the first line.
                ("inner".into(), FILE.into(), 343),
            ],
            "{version:?}"
        );
    }
}

#[test]
fn the_singleton_flag_is_the_release_s_own() {
    // 3.3's flag read as 3.4's (`RCLASS_IS_ROOT` there) is no singleton:
    // the class has no path of its own, the method its bare name.
    let named = name((3, 4), SINGLETON_3_3);
    assert_eq!(&*named[1].function, "run");
    let named = name((3, 3), SINGLETON_3_4);
    assert_eq!(&*named[1].function, "run");
}
