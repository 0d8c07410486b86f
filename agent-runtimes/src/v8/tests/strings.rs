//! Strings of every representation, over a small heap laid out here with
//! Node 20's layout: sequential one- and two-byte, cons, thin and sliced
//! strings are read; external ones and non-strings are refused.

use agent_fixtures::{memory::Regions, v8::NODE20_CONSTANTS};

use crate::{
    Memory, MemoryError,
    v8::{
        Constants, Layout,
        heap::{read_string, read_units, unit_at},
    },
};

struct Heap {
    regions: Regions,
    layout: Layout,
    next: u64,
    meta_map: u64,
}

impl Memory for Heap {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        crate::read_captured(&self.regions, address, buf)
    }
}

impl Heap {
    fn new() -> Self {
        let layout = Layout::new(&Constants::parse(NODE20_CONSTANTS).expect("parses"))
            .expect("every constant");
        let mut heap = Self {
            regions: Regions::default(),
            layout,
            next: 0x1000_0000,
            meta_map: 0,
        };
        // The meta map is its own map.
        let meta = heap.allocate(64);
        heap.meta_map = meta + 1;
        heap.put(
            meta + heap.layout.fields.heap_object_map,
            &(meta + 1).to_le_bytes(),
        );
        let map_type = heap.layout.types.map;
        heap.put(
            meta + heap.layout.fields.map_instance_type,
            &map_type.to_le_bytes(),
        );
        heap
    }

    fn allocate(&mut self, size: u64) -> u64 {
        let address = self.next;
        self.regions.add(address, &vec![0; size as usize]);
        self.next += size.next_multiple_of(16) + 16;
        address
    }

    fn put(&mut self, address: u64, bytes: &[u8]) {
        self.regions.add(address, bytes);
    }

    /// A map of `instance_type`, tagged.
    fn map(&mut self, instance_type: u16) -> u64 {
        let map = self.allocate(64);
        let meta = self.meta_map;
        self.put(
            map + self.layout.fields.heap_object_map,
            &meta.to_le_bytes(),
        );
        self.put(
            map + self.layout.fields.map_instance_type,
            &instance_type.to_le_bytes(),
        );
        map + 1
    }

    /// An object of `instance_type` with `size` bytes, tagged.
    fn object(&mut self, instance_type: u16, size: u64) -> u64 {
        let map = self.map(instance_type);
        let object = self.allocate(size);
        self.put(
            object + self.layout.fields.heap_object_map,
            &map.to_le_bytes(),
        );
        object + 1
    }

    fn field(&mut self, tagged: u64, offset: u64, value: u64) {
        self.put(tagged - 1 + offset, &value.to_le_bytes());
    }

    fn length(&mut self, tagged: u64, length: u32) {
        let offset = self.layout.fields.string_length;
        self.put(tagged - 1 + offset, &length.to_le_bytes());
    }

    fn one_byte(&mut self, text: &str) -> u64 {
        let strings = self.layout.strings;
        let string = self.object(strings.seq | strings.one_byte, 64 + text.len() as u64);
        self.length(string, text.len() as u32);
        let chars = self.layout.fields.seq_one_byte_chars;
        self.put(string - 1 + chars, text.as_bytes());
        string
    }

    fn two_byte(&mut self, text: &str) -> u64 {
        let units: Vec<u16> = text.encode_utf16().collect();
        let kind = self.layout.strings.seq;
        let string = self.object(kind, 64 + 2 * units.len() as u64);
        self.length(string, units.len() as u32);
        let bytes: Vec<u8> = units.iter().flat_map(|unit| unit.to_le_bytes()).collect();
        let chars = self.layout.fields.seq_two_byte_chars;
        self.put(string - 1 + chars, &bytes);
        string
    }

    fn string(&mut self, tagged: u64) -> Result<String, &'static str> {
        let layout = self.layout;
        read_string(self, &layout, tagged)
            .map(|text| text.to_string())
            .map_err(|error| error.reason())
    }
}

#[test]
fn every_representation_reads() {
    let mut heap = Heap::new();
    let strings = heap.layout.strings;
    let fields = heap.layout.fields;
    let module = heap.one_byte("Module.");
    let load = heap.two_byte("load\u{e9}");
    assert_eq!(heap.string(module), Ok("Module.".to_owned()));
    assert_eq!(heap.string(load), Ok("load\u{e9}".to_owned()));

    let cons = heap.object(strings.cons | strings.one_byte, 64);
    heap.field(cons, fields.cons_first, module);
    heap.field(cons, fields.cons_second, load);
    assert_eq!(heap.string(cons), Ok("Module.load\u{e9}".to_owned()));

    let thin = heap.object(strings.thin | strings.one_byte, 64);
    heap.field(thin, fields.thin_actual, cons);
    assert_eq!(heap.string(thin), Ok("Module.load\u{e9}".to_owned()));

    let sliced = heap.object(strings.sliced | strings.one_byte, 64);
    heap.field(sliced, fields.sliced_parent, module);
    heap.field(sliced, fields.sliced_offset, 2 << 32);
    heap.length(sliced, 3);
    assert_eq!(heap.string(sliced), Ok("dul".to_owned()));

    let external = heap.object(strings.external | strings.one_byte, 64);
    assert_eq!(heap.string(external), Err("external_string"));
}

#[test]
fn what_is_not_a_string_is_refused() {
    let mut heap = Heap::new();
    let script = heap.layout.types.script;
    let not_a_string = heap.object(script, 64);
    assert_eq!(heap.string(not_a_string), Err("wrong_type"));
    // An object whose map's map is not the meta map.
    let fake = heap.allocate(64);
    let fake_map = heap.allocate(64);
    heap.put(fake, &(fake_map + 1).to_le_bytes());
    heap.put(fake_map, &(fake_map + 1).to_le_bytes());
    assert_eq!(heap.string(fake + 1), Err("not_an_object"));
    // A cons string that contains itself ends at the depth bound.
    let strings = heap.layout.strings;
    let fields = heap.layout.fields;
    let cons = heap.object(strings.cons | strings.one_byte, 64);
    heap.field(cons, fields.cons_first, cons);
    heap.field(cons, fields.cons_second, cons);
    assert_eq!(heap.string(cons), Err("bad_string"));
    // Unmapped memory.
    assert_eq!(heap.string(0x5000_0001), Err("read"));
}

/// Source positions count UTF-16 code units: each unit of a string of
/// every representation, one at a time, matches the string read whole.
#[test]
fn code_units_are_found_one_by_one() {
    let mut heap = Heap::new();
    let strings = heap.layout.strings;
    let fields = heap.layout.fields;
    let layout = heap.layout;
    let head = heap.one_byte("function f(");
    let tail = heap.two_byte("x\u{1f600}) {}");
    let cons = heap.object(strings.cons, 64);
    heap.field(cons, fields.cons_first, head);
    heap.field(cons, fields.cons_second, tail);
    heap.length(cons, 11 + 8);
    let thin = heap.object(strings.thin, 64);
    heap.field(thin, fields.thin_actual, cons);
    heap.length(thin, 19);
    let sliced = heap.object(strings.sliced, 64);
    heap.field(sliced, fields.sliced_parent, thin);
    heap.field(sliced, fields.sliced_offset, 9 << 32);
    heap.length(sliced, 6);
    for (string, expected) in [
        (cons, "function f(x\u{1f600}) {}"),
        (sliced, "f(x\u{1f600})"),
    ] {
        let whole = read_units(&mut heap, &layout, string, 1 << 20).expect("reads");
        assert_eq!(String::from_utf16_lossy(&whole), expected);
        let one_by_one: Vec<u16> = (0..whole.len() as u64)
            .map(|index| unit_at(&mut heap, &layout, string, index).expect("a unit"))
            .collect();
        assert_eq!(one_by_one, whole);
        let past = unit_at(&mut heap, &layout, string, whole.len() as u64);
        assert_eq!(past.map_err(|error| error.reason()), Err("bad_string"));
    }
    let external = heap.object(strings.external | strings.one_byte, 64);
    heap.length(external, 4);
    let error = unit_at(&mut heap, &layout, external, 1).expect_err("external");
    assert_eq!(error.reason(), "external_string");
}
