//! Java frames unwound over stacks laid out as HotSpot lays them out, with
//! the code blobs and methods of a captured JVM, and named.

use std::collections::HashMap;

use super::*;

const SP: u64 = 0x7ffc_0000_1000;

struct Jvm {
    loaded: Loaded,
    layout: Layout,
    cache: CodeCache,
}

fn jvm(capture: &JvmCapture) -> Jvm {
    let mut loaded = load(capture);
    let (_, layout) = layout_of(&mut loaded);
    let cache = CodeCache::read(&mut loaded.memory, &layout).expect("the code heaps");
    Jvm {
        loaded,
        layout,
        cache,
    }
}

impl Jvm {
    fn blob(&mut self, pc: u64) -> CodeBlob {
        self.cache
            .find(&mut self.loaded.memory, &self.layout, pc)
            .expect("readable")
            .expect("a blob")
    }

    /// The captured nmethod of `function`.
    fn nmethod(&mut self, function: &str) -> CodeBlob {
        let mut namer = MethodNamer::new();
        for code in self.loaded.nmethods.clone() {
            let blob = self.blob(code);
            let (method, _) = namer
                .method(&mut self.loaded.memory, &self.layout, blob.method)
                .expect("named");
            if method.function() == function {
                return blob;
            }
        }
        panic!("no nmethod of {function}");
    }

    fn name(&mut self, namer: &mut JavaNamer, frame: &JavaFrame) -> Vec<String> {
        namer
            .name(&mut self.loaded.memory, &self.layout, &self.cache, frame)
            .expect("named")
            .iter()
            .map(|frame| {
                format!(
                    "{}:{} {:?}",
                    frame.method.function(),
                    frame.line,
                    frame.kind
                )
            })
            .collect()
    }
}

/// The pc in `blob` whose pc desc has exactly the scopes `wanted`
/// (`Class.method:line`, innermost first).
fn call_site(jvm: &mut Jvm, blob: &CodeBlob, wanted: &[String]) -> u64 {
    let debug =
        NmethodDebug::read(&mut jvm.loaded.memory, &jvm.layout, blob).expect("debug information");
    let mut namer = MethodNamer::new();
    for offset in debug.pc_offsets().collect::<Vec<_>>() {
        let Ok(scopes) = debug.scopes_at(i64::from(offset), true) else {
            continue;
        };
        let names: Vec<String> = scopes
            .iter()
            .map(|scope| {
                let (method, _) = namer
                    .method(&mut jvm.loaded.memory, &jvm.layout, scope.method)
                    .expect("named");
                format!("{}:{}", method.function(), method.line(scope.bci))
            })
            .collect();
        if names == wanted {
            return blob.code.start + offset as u64;
        }
    }
    panic!("no pc desc with {wanted:?}");
}

fn reader(words: &HashMap<u64, u64>) -> impl Fn(u64) -> Option<u64> + '_ {
    move |address| words.get(&address).copied()
}

#[test]
fn compiled_frames_unwind_by_their_size_and_name_their_scopes() {
    for capture in captures("c1") {
        compiled_frames_unwind_in(capture);
    }
}

fn compiled_frames_unwind_in(capture: &JvmCapture) {
    let mut jvm = jvm(capture);
    let reconcile = jvm.nmethod("Chain.reconcile");
    let settle = jvm.nmethod("Chain.settle");
    // reconcile's own nmethod interrupted just before its call of
    // accumulate, returning into a call site of settle's nmethod (which
    // has reconcile inlined: any call site in Java code will do for the
    // unwind, and this one has two scopes to name).
    let inlined = [
        format!("Chain.reconcile:{}", marked_line("reconcile")),
        format!("Chain.settle:{}", marked_line("settle")),
    ];
    let return_address = call_site(&mut jvm, &settle, &inlined);
    let leaf_pc = call_site(
        &mut jvm,
        &reconcile,
        &[format!("Chain.reconcile:{}", marked_line("reconcile"))],
    ) - 2;
    let caller_sp = SP + reconcile.frame_size;
    let words = HashMap::from([
        (caller_sp - 8, return_address),
        (caller_sp - 16, 0x7ffc_0000_2000),
    ]);
    let regs = FrameRegs {
        ip: leaf_pc,
        sp: SP,
        bp: Some(1234),
    };
    let step = step(
        &jvm.cache,
        &jvm.layout,
        &reconcile,
        regs,
        true,
        &reader(&words),
    )
    .expect("unwound");
    assert_eq!(
        step.caller,
        FrameRegs {
            ip: return_address,
            sp: caller_sp,
            bp: Some(0x7ffc_0000_2000)
        }
    );
    let mut namer = JavaNamer::new();
    assert_eq!(
        jvm.name(&mut namer, &step.frame),
        [format!("Chain.reconcile:{} C1", marked_line("reconcile"))]
    );

    // The caller: settle's frame at the return address, its scopes
    // reconcile (inlined) then settle.
    let caller = jvm.blob(return_address);
    let outer = HashMap::from([(caller_sp + settle.frame_size - 8, 0x1234)]);
    let step = step_of(&jvm, &caller, step.caller, &outer);
    assert_eq!(
        jvm.name(&mut namer, &step.frame),
        [
            format!("Chain.reconcile:{} Inlined", marked_line("reconcile")),
            format!("Chain.settle:{} C1", marked_line("settle")),
        ]
    );
    // Its caller is native code (a return address outside the code
    // cache): taken as it is, the frame being complete.
    assert_eq!(step.caller.ip, 0x1234);
}

fn step_of(jvm: &Jvm, blob: &CodeBlob, regs: FrameRegs, words: &HashMap<u64, u64>) -> Step {
    step(&jvm.cache, &jvm.layout, blob, regs, false, &reader(words)).expect("unwound")
}

#[test]
fn an_interrupted_prologue_finds_the_return_address_at_sp() {
    for capture in captures("c2") {
        an_interrupted_prologue_in(capture);
    }
}

fn an_interrupted_prologue_in(capture: &JvmCapture) {
    let mut jvm = jvm(capture);
    let settle = jvm.nmethod("Chain.settle");
    let reconcile = jvm.nmethod("Chain.reconcile");
    let entry = reconcile.code.start;
    assert!(
        reconcile
            .frame_complete
            .is_some_and(|complete| entry < complete)
    );
    let return_address = settle.code.start + 0x20;
    // Nothing pushed yet: the return address at sp; beyond the frame's
    // size, garbage outside the code cache.
    let words = HashMap::from([(SP, return_address), (SP + reconcile.frame_size - 8, 0x42)]);
    let regs = FrameRegs {
        ip: entry,
        sp: SP,
        bp: Some(0x7ffc_0000_3000),
    };
    let step = step(
        &jvm.cache,
        &jvm.layout,
        &reconcile,
        regs,
        true,
        &reader(&words),
    )
    .expect("unwound");
    assert_eq!(
        step.caller,
        FrameRegs {
            ip: return_address,
            sp: SP + 8,
            bp: Some(0x7ffc_0000_3000)
        }
    );
    // No candidate returns into Java code: an error, not a guess.
    let words = HashMap::from([(SP, 0x42)]);
    assert!(step_result(&jvm, &reconcile, regs, &words).is_err());
}

fn step_result(
    jvm: &Jvm,
    blob: &CodeBlob,
    regs: FrameRegs,
    words: &HashMap<u64, u64>,
) -> Result<Step, HotSpotError> {
    step(&jvm.cache, &jvm.layout, blob, regs, true, &reader(words))
}

#[test]
fn interpreted_frames_take_method_and_bytecode_from_their_slots() {
    for capture in captures("c1") {
        interpreted_frames_in(capture);
    }
}

fn interpreted_frames_in(capture: &JvmCapture) {
    let mut jvm = jvm(capture);
    let reconcile = jvm.nmethod("Chain.reconcile");
    let mut namer = MethodNamer::new();
    let (method, code) = namer
        .method(&mut jvm.loaded.memory, &jvm.layout, reconcile.method)
        .expect("named");
    assert!(method.code_size > 20);
    // An interpreter pc: the template interpreter's code.
    let interpreter = interpreter_pc(&jvm);
    let blob = jvm.blob(interpreter);
    assert_eq!(blob.kind, BlobKind::Interpreter);
    let bp = SP + 0x80;
    let slots = jvm.layout.interpreter_frame;
    let at = |words: i64| bp.checked_add_signed(words * 8).expect("in range");
    // bci 18: the call of accumulate.
    let words = HashMap::from([
        (at(slots.method), reconcile.method),
        (at(slots.bcp), code + 18),
        (at(slots.sender_sp), bp + 0x40),
        (bp, 0x7ffc_0000_4000),
        (bp + 8, 0x5555),
    ]);
    let regs = FrameRegs {
        ip: interpreter,
        sp: SP,
        bp: Some(bp),
    };
    let step = step(&jvm.cache, &jvm.layout, &blob, regs, false, &reader(&words)).expect("unwound");
    assert_eq!(
        step.caller,
        FrameRegs {
            ip: 0x5555,
            sp: bp + 0x40,
            bp: Some(0x7ffc_0000_4000)
        }
    );
    let mut names = JavaNamer::new();
    assert_eq!(
        jvm.name(&mut names, &step.frame),
        [format!(
            "Chain.reconcile:{} Interpreted",
            marked_line("reconcile")
        )]
    );
    // A bytecode pointer outside the method: refused.
    let stray = JavaFrame::Interpreted {
        method: reconcile.method,
        bcp: code + 0x10000,
    };
    assert!(
        names
            .name(&mut jvm.loaded.memory, &jvm.layout, &jvm.cache, &stray)
            .is_err()
    );
}

/// A pc in the template interpreter whose blob the capture holds.
fn interpreter_pc(jvm: &Jvm) -> u64 {
    jvm.cache.interpreter_start()
}

/// The Java frames of a stopped thread, unwound over its stack copy from
/// its registers to the first frame outside the code cache, named.
fn unwind_stopped(jvm: &mut Jvm, stopped: &Stopped) -> Vec<String> {
    let word = |address: u64| {
        let offset = usize::try_from(address.checked_sub(stopped.sp)?).ok()?;
        let bytes = stopped.stack.get(offset..offset + 8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    };
    let mut namer = JavaNamer::new();
    let mut regs = FrameRegs {
        ip: stopped.ip,
        sp: stopped.sp,
        bp: Some(stopped.bp),
    };
    let mut names = Vec::new();
    for depth in 0..32 {
        if !jvm.cache.contains(regs.ip) {
            return names;
        }
        let blob = jvm.blob(if depth == 0 { regs.ip } else { regs.ip - 1 });
        let step = step(&jvm.cache, &jvm.layout, &blob, regs, depth == 0, &word)
            .unwrap_or_else(|error| panic!("{names:?} then {error}"));
        match &step.frame {
            JavaFrame::Stub { name } => names.push(format!("[{name}]")),
            frame => names.extend(jvm.name(&mut namer, frame)),
        }
        regs = step.caller;
    }
    panic!("no end to {names:?}");
}

#[test]
fn stopped_threads_unwind_through_the_chain_to_the_call_stub() {
    for capture in CAPTURES {
        let mut jvm = jvm(capture);
        let stacks = std::mem::take(&mut jvm.loaded.stacks);
        assert!(
            stacks.len() >= 4,
            "{}: {} stacks",
            capture.name,
            stacks.len()
        );
        // How each JVM had compiled the chain when stopped (the kinds of
        // accumulate, reconcile, settle, main). JDK 17's C1: accumulate
        // and reconcile compiled on their own, settle with reconcile
        // inlined, main interpreted; JDK 25's C1, minutes later, main too
        // (on stack replacement) with settle and reconcile inlined. C2:
        // the whole chain inlined into settle. Either way the same frames
        // by name.
        let kinds = match capture.name {
            "jdk17-c1" => ["C1", "Inlined", "C1", "Interpreted"],
            "jdk25-c1" => ["C1", "Inlined", "Inlined", "C1"],
            _ => ["Inlined", "Inlined", "C2", "Interpreted"],
        };
        let expected = [
            format!(
                "Chain.accumulate:{} {}",
                marked_line("accumulate") - 1,
                kinds[0]
            ),
            format!("Chain.reconcile:{} {}", marked_line("reconcile"), kinds[1]),
            format!("Chain.settle:{} {}", marked_line("settle"), kinds[2]),
            format!("Chain.main:{} {}", marked_line("main"), kinds[3]),
            "[call_stub]".to_owned(),
        ];
        for stopped in &stacks {
            assert_eq!(
                unwind_stopped(&mut jvm, stopped),
                expected,
                "{}",
                capture.name
            );
        }
    }
}
