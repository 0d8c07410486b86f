//! A made-up CRuby 3.1 process's memory, object by object, from
//! `fuzzing::MEMORY_BASE` on: what the captures of a real process cannot
//! show (modules, singleton methods of a class, anonymous classes, aliases,
//! both kinds of line table, heap strings), and the seeds of the
//! `ruby_frame` fuzz target.

use agent_common::InterpreterFrame;

use crate::{
    Memory, MemoryError,
    fuzzing::{MEMORY_BASE, RUBY_FRAME_HEAD},
    ruby::{RubyProcess, RubyVersion, lines::tests::build_succinct},
};

pub(super) const NIL: u64 = 0x08;
const T_CLASS: u64 = 0x02;
const T_MODULE: u64 = 0x03;
const T_STRING: u64 = 0x05;
const T_ARRAY: u64 = 0x07;
const T_IMEMO: u64 = 0x1a;
pub(super) const FL_SINGLETON: u64 = 0x1000;
pub(super) const IMEMO_CREF: u64 = T_IMEMO | 1 << 12;
pub(super) const IMEMO_MENT: u64 = T_IMEMO | 6 << 12;
pub(super) const IMEMO_ISEQ: u64 = T_IMEMO | 7 << 12;
/// `id__attached__` in 3.1.
const ATTACHED: u64 = 3089;

pub(super) const METHOD: u32 = 0x1111_0003;
pub(super) const BLOCK: u32 = 0x2222_0001;
pub(super) const TOP: u32 = 0x4444_0021;
pub(super) const CFUNC: u32 = 0x5555_0083;
pub(super) const IFUNC: u32 = 0x6666_0001;
pub(super) const DUMMY: u32 = 0x7999_082f;

/// The ID of a symbol of serial `serial` (a local name, static).
pub(super) fn id(serial: u64) -> u64 {
    serial << 4 | 1
}

/// Bytes, from `MEMORY_BASE` on.
#[derive(Clone, Default)]
pub(super) struct Image {
    pub bytes: Vec<u8>,
}

impl Memory for Image {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let held = address
            .checked_sub(MEMORY_BASE)
            .and_then(|offset| usize::try_from(offset).ok())
            .and_then(|start| self.bytes.get(start..start.checked_add(buf.len())?));
        match held {
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

impl Image {
    /// `size` zero bytes, 16-aligned as Ruby's heap slots.
    pub(super) fn alloc(&mut self, size: usize) -> u64 {
        let start = self.bytes.len().next_multiple_of(16);
        self.bytes.resize(start + size.max(8), 0);
        MEMORY_BASE + start as u64
    }

    fn offset(&self, address: u64) -> usize {
        usize::try_from(address - MEMORY_BASE).expect("small")
    }

    pub(super) fn put(&mut self, address: u64, bytes: &[u8]) {
        let at = self.offset(address);
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
    }

    pub(super) fn word(&mut self, address: u64, value: u64) {
        self.put(address, &value.to_le_bytes());
    }

    pub(super) fn get(&self, address: u64) -> u64 {
        let at = self.offset(address);
        u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8 bytes"))
    }

    /// A String: embedded up to 23 bytes, else on the heap.
    pub(super) fn string(&mut self, text: &str) -> u64 {
        let string = self.alloc(40);
        if text.len() <= 23 {
            self.word(string, T_STRING | (text.len() as u64) << 14);
            self.put(string + 16, text.as_bytes());
        } else {
            let bytes = self.alloc(text.len());
            self.put(bytes, text.as_bytes());
            self.word(string, T_STRING | 0x2000);
            self.word(string + 16, text.len() as u64);
            self.word(string + 24, bytes);
        }
        string
    }

    /// An Array: embedded up to 3 elements, else on the heap.
    pub(super) fn array(&mut self, elements: &[u64]) -> u64 {
        let array = self.alloc(40);
        let (flags, at) = if elements.len() <= 3 {
            (T_ARRAY | 0x2000 | (elements.len() as u64) << 15, array + 16)
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

    /// `ruby_global_symbols` with the IDs of `names` (serials below 512).
    pub(super) fn symbols(&mut self, names: &[(u64, &str)]) -> u64 {
        let mut values = vec![NIL; 1024];
        for (serial, name) in names {
            values[*serial as usize * 2] = self.string(name);
            values[*serial as usize * 2 + 1] = id(*serial) << 8 | 0x0c;
        }
        let chunk = self.array(&values);
        let ids = self.array(&[chunk]);
        let table = self.alloc(32);
        let last = names.iter().map(|(serial, _)| *serial).max().unwrap_or(0);
        self.put(table, &(last as u32).to_le_bytes());
        self.word(table + 16, ids);
        table
    }

    /// A class or module (`flags`) with the instance variables `ivars`;
    /// a deleted entry of the first one's ID before them.
    pub(super) fn class(&mut self, flags: u64, ivars: &[(u64, u64)]) -> u64 {
        let entries = self.alloc(24 * (ivars.len() + 1));
        if let Some((id, _)) = ivars.first() {
            self.word(entries, u64::MAX);
            self.word(entries + 8, *id);
            self.word(entries + 16, NIL);
        }
        for (index, (id, value)) in (1..).zip(ivars) {
            self.word(entries + index * 24, 0x1234);
            self.word(entries + index * 24 + 8, *id);
            self.word(entries + index * 24 + 16, *value);
        }
        let table = self.alloc(56);
        self.word(table + 32, 0);
        self.word(table + 40, ivars.len() as u64 + 1);
        self.word(table + 48, entries);
        let ext = self.alloc(16);
        self.word(ext + 8, if ivars.is_empty() { 0 } else { table });
        let class = self.alloc(40);
        self.word(class, flags);
        self.word(class + 24, ext);
        class
    }

    pub(super) fn named_class(&mut self, flags: u64, class_path: u64, path: &str) -> u64 {
        let path = self.string(path);
        self.class(flags, &[(class_path, path)])
    }

    pub(super) fn method_entry(&mut self, owner: u64, original: u64, called: u64) -> u64 {
        let definition = self.alloc(40);
        self.word(definition + 32, original);
        let entry = self.alloc(40);
        self.word(entry, IMEMO_MENT);
        self.word(entry + 16, definition);
        self.word(entry + 24, called);
        self.word(entry + 32, owner);
        entry
    }

    /// An instruction sequence of `size` VALUEs whose `insns_info` entries
    /// start at `starts` on `lines`, indexed by positions or (`succinct`)
    /// by CRuby's bit vector; its address and `iseq_encoded`.
    #[expect(clippy::too_many_arguments, reason = "one per field set")]
    pub(super) fn iseq(
        &mut self,
        label: &str,
        base_label: &str,
        path: u64,
        first_line: u64,
        size: u64,
        starts: &[u32],
        lines: &[i32],
        succinct: bool,
    ) -> (u64, u64) {
        let body = self.alloc(152);
        let encoded = self.alloc(size as usize * 8);
        let entries = self.alloc(12 * lines.len());
        for (index, line) in (0..).zip(lines) {
            self.put(entries + index * 12, &line.to_le_bytes());
        }
        let base_label = self.string(base_label);
        let label = self.string(label);
        self.put(body + 4, &(size as u32).to_le_bytes());
        self.word(body + 8, encoded);
        self.word(body + 64, path);
        self.word(body + 72, base_label);
        self.word(body + 80, label);
        self.word(body + 88, first_line << 1 | 1);
        self.word(body + 120, entries);
        self.put(body + 136, &(lines.len() as u32).to_le_bytes());
        if succinct {
            let table = build_succinct(size, starts);
            let at = self.alloc(table.len());
            self.put(at, &table);
            self.word(body + 144, at);
        } else {
            let at = self.alloc(4 * starts.len());
            for (index, start) in (0..).zip(starts) {
                self.put(at + index * 4, &start.to_le_bytes());
            }
            self.word(body + 128, at);
        }
        let iseq = self.alloc(24);
        self.word(iseq, IMEMO_ISEQ);
        self.word(iseq + 16, body);
        (iseq, encoded)
    }
}

/// The made-up process: a module `Busy` whose `work` a class `Worker`
/// includes, `Worker.run`, an anonymous class's `helper`, `Integer#times`.
pub(super) struct World {
    pub image: Image,
    pub process: RubyProcess,
    /// Frames of each kind, as the walker would record them.
    pub work: InterpreterFrame,
    pub block: InterpreterFrame,
    pub run: InterpreterFrame,
    pub helper: InterpreterFrame,
    pub times: InterpreterFrame,
    pub main: InterpreterFrame,
    pub aliased: InterpreterFrame,
}

/// The file every instruction sequence is in: longer than an embedded
/// String, and given as `[path, realpath]`.
pub(super) const FILE: &str = "/srv/app/lib/busy_worker.rb";

pub(super) fn world() -> World {
    let mut image = Image::default();
    // Nothing at offset 0: a fuzz input's 0 is no address.
    image.alloc(16);
    let names = [
        (240, "__classpath__"),
        (300, "work"),
        (301, "times"),
        (302, "helper"),
        (303, "run"),
        (304, "work_alias"),
    ];
    let symbols = image.symbols(&names);
    let class_path = id(240);
    let busy = image.named_class(T_MODULE, class_path, "Busy");
    let worker = image.named_class(T_CLASS, class_path, "Worker");
    let singleton = image.class(T_CLASS | FL_SINGLETON, &[(ATTACHED, worker)]);
    let anonymous = image.class(T_CLASS, &[]);
    let integer = image.named_class(T_CLASS, class_path, "Integer");
    let path = image.string(FILE);
    let real = image.string("/srv/releases/42/lib/busy_worker.rb");
    let pathobj = image.array(&[path, real]);
    let at = |encoded: u64, position: u64| encoded + (position + 1) * 8;
    let frame = |code, stamp, instruction, data| InterpreterFrame {
        code,
        stamp,
        instruction,
        flags: 0,
        data,
    };
    // `def work` on line 10: lines 11, 12, 13, 15 from positions 0, 2,
    // 9, 20.
    let starts = [0, 2, 9, 20];
    let (work, work_code) = image.iseq(
        "work",
        "work",
        pathobj,
        10,
        30,
        &starts,
        &[11, 12, 13, 15],
        false,
    );
    let work_entry = image.method_entry(busy, id(300), id(300));
    // Its block's block, on line 13: 700 VALUEs, two blocks of the
    // succinct bit vector past its immediate part.
    let (block, block_code) = image.iseq(
        "block (2 levels) in work",
        "work",
        pathobj,
        13,
        700,
        &[0, 60, 600],
        &[13, 15, 16],
        true,
    );
    let (run, run_code) = image.iseq("run", "run", path, 20, 8, &[0], &[21], true);
    let run_entry = image.method_entry(singleton, id(303), id(303));
    let (helper, helper_code) =
        image.iseq("helper", "helper", path, 30, 8, &[0, 4], &[31, 32], true);
    let helper_entry = image.method_entry(anonymous, id(302), id(302));
    let times_entry = image.method_entry(integer, id(301), id(301));
    let (main, main_code) = image.iseq("<main>", "<main>", path, 0, 8, &[0], &[40], false);
    let cref = image.alloc(40);
    image.word(cref, IMEMO_CREF);
    // `alias work_alias work`: called by the alias, named by the original.
    let alias_entry = image.method_entry(busy, id(300), id(304));
    World {
        process: RubyProcess {
            key: 7,
            version: RubyVersion {
                major: 3,
                minor: 1,
                patch: 2,
            },
            symbols,
        },
        work: frame(work, work_entry, at(work_code, 10), METHOD),
        block: frame(block, work_entry, at(block_code, 65), BLOCK),
        run: frame(run, run_entry, at(run_code, 1), METHOD),
        helper: frame(helper, helper_entry, at(helper_code, 5), METHOD),
        times: frame(0, times_entry, 0, CFUNC),
        main: frame(main, cref, at(main_code, 3), TOP),
        aliased: frame(work, alias_entry, at(work_code, 1), METHOD),
        image,
    }
}

/// A `ruby_frame` fuzz input naming `frame` in `world`.
pub(super) fn fuzz_input(world: &World, frame: &InterpreterFrame) -> Vec<u8> {
    let offset = |address: u64| address.saturating_sub(MEMORY_BASE);
    let mut input = Vec::with_capacity(RUBY_FRAME_HEAD + world.image.bytes.len());
    for word in [
        frame.code,
        frame.stamp,
        frame.instruction,
        world.process.symbols,
    ] {
        input.extend_from_slice(&offset(word).to_le_bytes());
    }
    input.extend_from_slice(&frame.data.to_le_bytes());
    input.extend_from_slice(&frame.flags.to_le_bytes());
    input.extend_from_slice(&world.image.bytes);
    input
}
