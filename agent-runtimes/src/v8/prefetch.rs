//! What naming a sample's frames reads first, asked of the memory at
//! once ([`Memory::prefetch`]): the frames' JSFunctions and bytecode
//! arrays, then what they point at (maps, SharedFunctionInfos), then what
//! those point at (Scripts, names, sources), level by level. Nothing is
//! trusted from here: the namer reads and checks everything as before,
//! most of it now from blocks read here.

use super::{Layout, V8Namer, heap::tagged_field};
use crate::Memory;

impl V8Namer {
    /// Reads at once, level by level, the objects naming frames whose
    /// function slots hold `functions` (and whose bytecode array slots
    /// `bytecode_arrays`) will read.
    pub fn prefetch(&self, memory: &mut dyn Memory, functions: &[u64], bytecode_arrays: &[u64]) {
        let layout = self.layout();
        let fields = &layout.fields;
        let heap = |words: &mut Vec<u64>| {
            words.retain(|&word| layout.tagging.is_heap_object(word));
            words.sort_unstable();
            words.dedup();
        };
        let mut functions = functions.to_vec();
        heap(&mut functions);
        let mut arrays = bytecode_arrays.to_vec();
        heap(&mut arrays);
        let objects: Vec<u64> = functions.iter().chain(&arrays).copied().collect();
        fetch(memory, layout, &objects);
        // Their maps, the functions' SharedFunctionInfos.
        let maps = follow(memory, layout, &objects, &[fields.heap_object_map]);
        let shared = follow(memory, layout, &functions, &[fields.js_function_shared]);
        fetch(memory, layout, &[maps.as_slice(), &shared].concat());
        // The maps' own maps; the SharedFunctionInfos' maps, names (or
        // ScopeInfos) and Scripts.
        let metas = follow(memory, layout, &maps, &[fields.heap_object_map]);
        let named = follow(
            memory,
            layout,
            &shared,
            &[
                fields.heap_object_map,
                fields.sfi_name_or_scope_info,
                fields.sfi_script,
            ],
        );
        fetch(memory, layout, &[metas.as_slice(), &named].concat());
        // Their maps, the Scripts' sources and names.
        let next = follow(
            memory,
            layout,
            &named,
            &[
                fields.heap_object_map,
                fields.script_source,
                fields.script_name,
            ],
        );
        fetch(memory, layout, &next);
        // And those objects' maps.
        let last = follow(memory, layout, &next, &[fields.heap_object_map]);
        fetch(memory, layout, &last);
    }
}

/// The tagged fields at `offsets` of each object (tagged) that point at
/// heap objects, read from what was fetched (a field of an object of
/// another type is read all the same: a wasted block at worst).
fn follow(memory: &mut dyn Memory, layout: &Layout, objects: &[u64], offsets: &[u64]) -> Vec<u64> {
    let mut found: Vec<u64> = objects
        .iter()
        .flat_map(|&object| offsets.iter().map(move |&offset| (object, offset)))
        .filter_map(|(object, offset)| {
            tagged_field(memory, layout, layout.tagging.untag(object), offset).ok()
        })
        .filter(|&word| layout.tagging.is_heap_object(word))
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

fn fetch(memory: &mut dyn Memory, layout: &Layout, objects: &[u64]) {
    let addresses: Vec<u64> = objects
        .iter()
        .map(|&object| layout.tagging.untag(object))
        .collect();
    memory.prefetch(&addresses);
}
