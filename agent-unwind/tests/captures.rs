//! Samples captured from live C, Rust, Go and Node processes by `cargo
//! xtask capture` (firn's BPF program, DWARF stack copies), replayed: the
//! unwinder over each sample's registers and stack copy, with the CFI of
//! the objects as they were mapped, must give the frames recorded beside
//! the capture, function by function. Frames are named as the capture tool
//! named them: a function symbol per frame (or the JIT perf map entry),
//! demangled without parameters.

use std::collections::HashMap;

use agent_common::UserRegs;
use agent_elf::{self as elf, Bytes, ElfLayout, SymbolTable};
use agent_fixtures::{
    Capture,
    capture::{ExecMapping, PerfMapEntry, SampleLine},
};
use agent_unwind::{Mapped, ObjectLookup, Sample, Stop, Unwinder, Unwound};

struct Object {
    bytes: Bytes,
    layout: ElfLayout,
    symbols: SymbolTable,
}

/// A captured process: its code mappings, its objects' extracts by the
/// path they were mapped from, its JIT perf map.
struct Process {
    mappings: Vec<ExecMapping>,
    objects: HashMap<&'static str, Object>,
    perf_map: Vec<PerfMapEntry<'static>>,
}

enum Place<'a> {
    Unmapped,
    Anonymous,
    NoObject(&'a str),
    Object(&'a str, &'a Object, u64),
}

impl Process {
    fn new(capture: &Capture) -> Self {
        let objects = capture
            .objects()
            .expect("the capture's objects")
            .into_iter()
            .map(|(extract, path)| {
                let bytes = Bytes::new(std::sync::Arc::new(extract));
                let object = Object {
                    layout: elf::read_layout(&bytes).expect("the extract's layout"),
                    symbols: elf::read_symbols(&bytes).expect("the extract's symbols"),
                    bytes,
                };
                (path, object)
            })
            .collect();
        Self {
            mappings: capture.maps().expect("the capture's maps"),
            objects,
            perf_map: capture.perf_map().expect("the capture's perf map"),
        }
    }

    fn place(&self, address: u64) -> Place<'_> {
        let Some(mapping) = self.mappings.iter().find(|m| m.contains(address)) else {
            return Place::Unmapped;
        };
        if mapping.path.is_empty() {
            return Place::Anonymous;
        }
        let path = mapping.path.as_str();
        self.objects
            .get(path)
            .and_then(|object| {
                let vaddr = object
                    .layout
                    .vaddr_for_file_offset(mapping.file_offset(address))?;
                Some(Place::Object(path, object, vaddr))
            })
            .unwrap_or(Place::NoObject(path))
    }

    /// The function of the frame at `depth`: a return address is named by
    /// its call, one byte back.
    fn frame_name(&self, depth: usize, address: u64) -> String {
        let lookup = if depth == 0 {
            address
        } else {
            address.wrapping_sub(1)
        };
        let file_name = |path: &str| path.rsplit('/').next().unwrap_or(path).to_owned();
        match self.place(lookup) {
            Place::Unmapped => "[unmapped]".to_owned(),
            Place::Anonymous => self
                .perf_map
                .iter()
                .rev()
                .find(|entry| entry.contains(lookup))
                .map_or_else(|| "[unknown JIT code]".to_owned(), |e| e.name.to_owned()),
            Place::NoObject(path) => format!("[unknown in {}]", file_name(path)),
            Place::Object(path, object, vaddr) => object.symbols.lookup(vaddr).map_or_else(
                || format!("[unknown in {}]", file_name(path)),
                |hit| demangle(hit.name),
            ),
        }
    }

    fn names(&self, frames: &[u64]) -> Vec<String> {
        frames
            .iter()
            .enumerate()
            .map(|(depth, &address)| self.frame_name(depth, address))
            .collect()
    }
}

impl ObjectLookup for Process {
    type Key = String;

    fn object(&mut self, address: u64) -> Mapped<String> {
        match self.place(address) {
            Place::Unmapped => Mapped::Unmapped,
            Place::Anonymous | Place::NoObject(_) => Mapped::NoObject,
            Place::Object(path, _, vaddr) => Mapped::Object {
                key: path.to_owned(),
                vaddr,
                system: false,
            },
        }
    }

    fn bytes(&mut self, address: u64) -> Option<Bytes> {
        match self.place(address) {
            Place::Object(_, object, _) => Some(object.bytes.clone()),
            _ => None,
        }
    }
}

/// Rust and C++ names without hashes, parameters or return types.
fn demangle(name: &str) -> String {
    if let Ok(demangled) = rustc_demangle::try_demangle(name) {
        return format!("{demangled:#}");
    }
    let options = cpp_demangle::DemangleOptions::new()
        .no_params()
        .no_return_type();
    name.starts_with("_Z")
        .then(|| cpp_demangle::Symbol::new(name).ok())
        .flatten()
        .and_then(|symbol| symbol.demangle_with_options(&options).ok())
        .unwrap_or_else(|| name.to_owned())
}

fn regs(sample: &SampleLine) -> UserRegs {
    UserRegs {
        ip: sample.ip,
        sp: sample.sp,
        bp: sample.bp,
    }
}

/// Each sample of `capture` unwound as the agent unwinds a DWARF-mode
/// process, with its frames by name.
fn replay(capture: &Capture) -> Vec<(Unwound, Vec<String>)> {
    let mut process = Process::new(capture);
    let mut unwinder = Unwinder::new(64 << 20);
    let samples = capture.samples().expect("the capture's samples");
    let stacks = capture.stacks().expect("the capture's stack copies");
    samples
        .iter()
        .zip(&stacks)
        .map(|(sample, stack)| {
            let sample = Sample {
                regs: regs(sample),
                stack,
                walk: &sample.walk,
            };
            let unwound = unwinder.dwarf(sample, &mut process);
            let names = process.names(&unwound.frames);
            (unwound, names)
        })
        .collect()
}

/// Replays `capture` and checks every sample against its expected frames,
/// frame by frame; returns the frames by name.
fn check_frames(capture: &Capture) -> Vec<(Unwound, Vec<String>)> {
    let replayed = replay(capture);
    let expected = capture.expected();
    assert_eq!(replayed.len(), expected.len(), "{}: samples", capture.name);
    for (index, ((_, names), expected)) in replayed.iter().zip(&expected).enumerate() {
        for (depth, (name, want)) in names.iter().zip(expected).enumerate() {
            assert_eq!(
                name, want,
                "{} sample {index}, frame {depth}:\n{names:#?}",
                capture.name
            );
        }
        assert_eq!(
            names.len(),
            expected.len(),
            "{} sample {index}: frames\n{names:#?}",
            capture.name
        );
    }
    replayed
}

/// Whether `names`, innermost first, end with the tail of `chain` that
/// starts at the leaf's function.
fn is_chain_tail(names: &[String], chain: &[&str]) -> bool {
    let Some(start) = chain
        .iter()
        .position(|f| Some(*f) == names.first().map(String::as_str))
    else {
        return false;
    };
    names
        .iter()
        .map(String::as_str)
        .eq(chain[start..].iter().copied())
}

const C_CHAIN: [&str; 8] = [
    "burn_leaf",
    "level_three",
    "level_two",
    "level_one",
    "main",
    "__libc_start_call_main",
    "__libc_start_main",
    "_start",
];

#[test]
fn c_without_frame_pointers_unwinds_to_start() {
    for capture in [
        agent_fixtures::C_CLANG_CAPTURE,
        agent_fixtures::C_GCC_CAPTURE,
    ] {
        let replayed = check_frames(&capture);
        for (unwound, names) in &replayed {
            assert!(
                is_chain_tail(names, &C_CHAIN),
                "{}: {names:?}",
                capture.name
            );
            assert_eq!(unwound.outcome.stop, Stop::Complete);
            // No frame pointers: every frame came from CFI.
            assert_eq!(unwound.outcome.rbp_frames, 0);
        }
        // The leaf itself, and samples in the levels (their prologues too).
        assert!(replayed.iter().any(|(_, names)| names[0] == "burn_leaf"));
        assert!(replayed.iter().any(|(_, names)| names[0] == "level_one"));
    }
}

#[test]
fn rust_without_frame_pointers_unwinds_through_std_to_start() {
    let chain = [
        "rust_chain::burn_leaf",
        "rust_chain::level_three",
        "rust_chain::level_two",
        "rust_chain::level_one",
        "rust_chain::main",
        "std::sys::backtrace::__rust_begin_short_backtrace",
        "std::rt::lang_start::{{closure}}",
        "std::rt::lang_start_internal",
        "main",
        "__libc_start_call_main",
        "__libc_start_main",
        "_start",
    ];
    let replayed = check_frames(&agent_fixtures::RUST_CAPTURE);
    for (unwound, names) in &replayed {
        assert!(is_chain_tail(names, &chain), "{names:?}");
        assert_eq!(unwound.outcome.stop, Stop::Complete);
    }
    assert!(replayed.iter().any(|(_, names)| names[0] == chain[0]));
}

#[test]
fn go_unwinds_with_debug_frame_to_goexit() {
    let chain = [
        "main.burn_leaf",
        "main.level_three",
        "main.level_two",
        "main.level_one",
        "main.main",
        "runtime.main",
        "runtime.goexit.abi0",
    ];
    let capture = agent_fixtures::GO_CAPTURE;
    let replayed = check_frames(&capture);
    for (unwound, names) in &replayed {
        assert!(is_chain_tail(names, &chain), "{names:?}");
        assert_eq!(unwound.outcome.stop, Stop::Complete);
    }
    // The goroutine ran on more than one thread.
    let samples = capture.samples().expect("samples");
    let first = samples[0].tid;
    assert!(samples.iter().any(|sample| sample.tid != first));
}

#[test]
fn go_frame_pointer_walks_agree_with_its_cfi() {
    // Go keeps frame pointers: the agent's frame-pointer path (the
    // kernel's walk, its leaf repaired from the small copy) must give what
    // the CFI gives.
    let capture = agent_fixtures::GO_CAPTURE;
    let mut process = Process::new(&capture);
    let mut unwinder = Unwinder::new(64 << 20);
    let samples = capture.samples().expect("samples");
    let stacks = capture.stacks().expect("stacks");
    for (sample, stack) in samples.iter().zip(&stacks) {
        let input = Sample {
            regs: regs(sample),
            stack,
            walk: &sample.walk,
        };
        let dwarf = unwinder.dwarf(input, &mut process);
        let small_copy = Sample {
            stack: &stack[..stack.len().min(1024)],
            ..input
        };
        let walked = unwinder.frame_pointers(small_copy, &mut process);
        assert_eq!(
            process.names(&walked.frames),
            process.names(&dwarf.frames),
            "{:?}",
            walked.leaf
        );
    }
}

#[test]
fn node_jit_frames_unwind_by_rbp_and_are_named_by_the_perf_map() {
    let js = [
        "JS:*burnLeaf",
        "JS:*levelThree",
        "JS:*levelTwo",
        "JS:*levelOne",
        "JS:*main",
    ];
    let native_tail = [
        "Builtins_JSEntryTrampoline",
        "Builtins_JSEntry",
        "v8::internal::(anonymous namespace)::Invoke",
        "v8::internal::Execution::Call",
        "v8::Function::Call",
        "node::builtins::BuiltinLoader::CompileAndCall",
        "node::Realm::ExecuteBootstrapper",
        "node::StartExecution",
        "node::StartExecution",
        "node::LoadEnvironment",
        "node::NodeMainInstance::Run",
        "node::Start",
        "__libc_start_call_main",
        "__libc_start_main",
        "_start",
    ];
    let replayed = check_frames(&agent_fixtures::NODE_CAPTURE);
    for (unwound, names) in &replayed {
        assert_eq!(unwound.outcome.stop, Stop::Complete, "{names:?}");
        // JIT code has no CFI: it is crossed by following rbp.
        assert!(unwound.outcome.rbp_frames > 0, "{names:?}");
        // `JS:*name /path/script.js:line:column`: the function alone.
        let functions: Vec<&str> = names
            .iter()
            .map(|name| match name.split_once(' ') {
                Some((function, _)) if name.starts_with("JS:") => function,
                _ => name,
            })
            .collect();
        let jit = functions
            .iter()
            .take_while(|f| f.starts_with("JS:"))
            .count();
        assert!(jit > 0, "{names:?}");
        // The script's functions in call order. A function interrupted
        // before its `push rbp` hides its caller from the rbp step (as from
        // the kernel's walk): there is no CFI to say where its return
        // address is.
        let mut chain = js.iter();
        assert!(
            functions[..jit]
                .iter()
                .all(|f| chain.any(|expected| expected == f)),
            "{names:?}"
        );
        // Node's entry into JavaScript and its C++ and C callers, whatever
        // interpreted frames (node's module loader) come between.
        assert!(functions.ends_with(&native_tail), "{names:?}");
        let between = &functions[jit..functions.len() - native_tail.len()];
        assert!(
            between
                .iter()
                .all(|f| *f == "Builtins_InterpreterEntryTrampoline"),
            "{names:?}"
        );
    }
}

#[test]
fn without_libcs_cfi_the_c_stacks_lose_their_start() {
    // The replay reads the extracts it is given: without libc's, the frames
    // below main are guessed from rbp (which clang's code does not keep)
    // and the unwind stops short of `_start`.
    let capture = agent_fixtures::C_CLANG_CAPTURE;
    let mut process = Process::new(&capture);
    process
        .objects
        .retain(|path, _| !path.ends_with("/libc.so.6"));
    let mut unwinder = Unwinder::new(64 << 20);
    let samples = capture.samples().expect("samples");
    let stacks = capture.stacks().expect("stacks");
    for (sample, stack) in samples.iter().zip(&stacks) {
        let input = Sample {
            regs: regs(sample),
            stack,
            walk: &sample.walk,
        };
        let unwound = unwinder.dwarf(input, &mut process);
        let names = process.names(&unwound.frames);
        assert_ne!(unwound.outcome.stop, Stop::Complete, "{names:?}");
        assert!(!names.iter().any(|name| name == "_start"), "{names:?}");
        // Up to main, the binary's own CFI still holds.
        assert!(names.iter().any(|name| name == "main"), "{names:?}");
    }
}
