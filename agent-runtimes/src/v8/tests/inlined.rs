//! The code an optimized frame runs and the functions inlined into it,
//! over a small heap and code page laid out here with Node 22's layout
//! (InstructionStream and Code apart, tables in the Code's first fields):
//! found where every link holds, refused where one does not.

use agent_fixtures::{memory::Regions, v8::NODE22_CONSTANTS};

use crate::{
    Memory, MemoryError,
    v8::{
        CodeLayout, Constants, Layout,
        code::CodeFinder,
        inlined::{InlineError, Inliner, inlining_id, script_offset},
    },
};

struct Heap {
    regions: Regions,
    layout: Layout,
    code: CodeLayout,
    next: u64,
    meta_map: u64,
}

impl Memory for Heap {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        crate::read_captured(&self.regions, address, buf)
    }
}

fn smi(value: u64) -> u64 {
    value << 32
}

fn position(offset: u64, inlining: u16) -> u64 {
    ((offset + 1) << 1) | (u64::from(inlining) << 31)
}

fn vlq(value: i64, out: &mut Vec<u8>) {
    let mut bits = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let byte = (bits & 0x7f) as u8;
        bits >>= 7;
        if bits == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

impl Heap {
    fn new() -> Self {
        let layout = Layout::new(&Constants::parse(NODE22_CONSTANTS).expect("parses"))
            .expect("every constant");
        let code = layout.code.expect("a code layout");
        let mut heap = Self {
            regions: Regions::default(),
            layout,
            code,
            next: 0x1000_0000,
            meta_map: 0,
        };
        let meta = heap.allocate(64);
        heap.meta_map = meta + 1;
        heap.put(meta, &(meta + 1).to_le_bytes());
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

    fn word(&mut self, address: u64, value: u64) {
        self.put(address, &value.to_le_bytes());
    }

    fn map(&mut self, instance_type: u16) -> u64 {
        let map = self.allocate(64);
        self.word(map, self.meta_map);
        self.put(
            map + self.layout.fields.map_instance_type,
            &instance_type.to_le_bytes(),
        );
        map + 1
    }

    /// An object of `instance_type`, tagged, its fields after the map.
    fn object(&mut self, instance_type: u16, fields: &[u64]) -> u64 {
        let map = self.map(instance_type);
        let object = self.allocate(8 + 8 * fields.len() as u64);
        self.word(object, map);
        for (index, &field) in fields.iter().enumerate() {
            self.word(object + 8 + 8 * index as u64, field);
        }
        object + 1
    }

    fn byte_array(&mut self, instance_type: u16, bytes: &[u8]) -> u64 {
        let map = self.map(instance_type);
        let object = self.allocate(16 + bytes.len() as u64);
        self.word(object, map);
        self.word(object + 8, smi(bytes.len() as u64));
        self.put(object + 16, bytes);
        object + 1
    }
}

/// A TurboFan Code of `outer` with `inner` inlined into it, its
/// InstructionStream on a code page.
struct Optimized {
    heap: Heap,
    code: u64,
    start: u64,
    outer: u64,
    inner: u64,
}

const CODE_PAGE: u64 = 0x2000_0000;
const INSTRUCTIONS: u64 = 256;

fn optimized() -> Optimized {
    let mut heap = Heap::new();
    let types = heap.layout.types;
    let outer = heap.object(types.shared_function_info, &[0; 4]);
    let inner = heap.object(types.shared_function_info, &[0; 4]);
    let [_, trusted_fixed_array, _] = heap.code.fixed_arrays;
    let [_, trusted_byte_array] = heap.code.byte_arrays;
    // pc offsets 0.. in mix, 16.. in blend inlined at mix's offset 95,
    // 48.. in mix again.
    let mut table = Vec::new();
    let mut last = (-1i64, 0i64);
    for (pc, value) in [
        (0, position(10, 0)),
        (16, position(30, 1)),
        (48, position(50, 0)),
    ] {
        vlq(pc - last.0, &mut table);
        vlq(value as i64 - last.1, &mut table);
        last = (pc, value as i64);
    }
    let positions = heap.byte_array(trusted_byte_array, &table);
    let mut inlining = position(95, 0).to_le_bytes().to_vec();
    inlining.extend_from_slice(&[0; 8]);
    let inlinings = heap.byte_array(trusted_byte_array, &inlining);
    let literals = heap.object(heap.layout.types.fixed_array, &[smi(1), inner]);
    let deopt = heap.code.deopt;
    let mut slots = vec![smi(0); 10];
    slots[deopt.inlined_count as usize] = smi(1);
    slots[deopt.literal_array as usize] = literals;
    slots[deopt.shared.expect("exported") as usize] = outer;
    slots[deopt.inlining_positions.expect("exported") as usize] = inlinings;
    let mut data = vec![smi(slots.len() as u64)];
    data.extend(slots);
    let data = heap.object(trusted_fixed_array, &data);
    // The code page: an InstructionStream whose instructions start
    // aligned, its Code apart.
    heap.regions.add(CODE_PAGE, &[0xcc; 8192]);
    let stream = CODE_PAGE + 0x400 - heap.code.header;
    let start = stream + heap.code.header;
    let stream_map = heap.map(heap.code.stream_type.expect("V8 12"));
    let code_map = heap.map(heap.code.code_type);
    let code = heap.allocate(96);
    heap.word(code, code_map);
    heap.word(code + 8, data);
    heap.word(code + 16, positions);
    heap.word(code + heap.code.code_stream.expect("exported"), stream + 1);
    heap.word(code + 40, start);
    let size = heap.code.instruction_size.expect("exported");
    heap.put(code + size, &(INSTRUCTIONS as u32).to_le_bytes());
    heap.word(stream, stream_map);
    heap.word(stream + 8, code + 1);
    Optimized {
        heap,
        code: code + 1,
        start,
        outer,
        inner,
    }
}

#[test]
fn the_code_holding_a_pc_and_the_function_inlined_there_are_found() {
    let mut optimized = optimized();
    let layout = optimized.heap.layout;
    let mut finder = CodeFinder::new(optimized.heap.code);
    let mut inliner = Inliner::new(optimized.heap.code);
    for pc in [optimized.start + 20, optimized.start + 50] {
        let found = finder
            .find(&mut optimized.heap, &layout, pc)
            .expect("reads")
            .expect("found");
        assert_eq!((found.code, found.start), (optimized.code, optimized.start));
        assert!(!found.baseline);
        let run = inliner
            .run(
                &mut optimized.heap,
                &layout,
                &found,
                optimized.outer,
                pc - found.start,
            )
            .expect("decodes");
        let inlined: Vec<(u64, Option<u64>)> = run
            .inlined
            .iter()
            .map(|&(sfi, position)| (sfi, script_offset(position)))
            .collect();
        let own = run.position.map(|position| {
            assert_eq!(inlining_id(position), 0);
            script_offset(position)
        });
        if pc == optimized.start + 20 {
            assert_eq!(inlined, [(optimized.inner, Some(30))]);
            assert_eq!(own, Some(Some(95)));
        } else {
            assert!(inlined.is_empty());
            assert_eq!(own, Some(Some(50)));
        }
    }
}

#[test]
fn code_that_does_not_link_back_or_is_another_functions_is_refused() {
    // The pc past the instructions.
    let mut optimized = optimized();
    let layout = optimized.heap.layout;
    let pc = optimized.start + INSTRUCTIONS + 8;
    let found = CodeFinder::new(optimized.heap.code).find(&mut optimized.heap, &layout, pc);
    assert_eq!(found.expect("reads"), None);

    // The Code pointing at another InstructionStream.
    let mut optimized = self::optimized();
    let field = optimized.heap.code.code_stream.expect("exported");
    let code = optimized.code - 1;
    optimized.heap.word(code + field, CODE_PAGE + 0x1001);
    let found = CodeFinder::new(optimized.heap.code).find(
        &mut optimized.heap,
        &layout,
        optimized.start + 20,
    );
    assert_eq!(found.expect("reads"), None);

    // The frame's function is not the code's.
    let mut optimized = self::optimized();
    let mut finder = CodeFinder::new(optimized.heap.code);
    let pc = optimized.start + 20;
    let found = finder
        .find(&mut optimized.heap, &layout, pc)
        .expect("reads")
        .expect("found");
    let other = optimized.inner;
    let run =
        Inliner::new(optimized.heap.code).run(&mut optimized.heap, &layout, &found, other, 20);
    assert!(
        matches!(run, Err(InlineError::NoDeoptimizationData)),
        "{run:?}"
    );
}
