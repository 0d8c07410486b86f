//! The CFI of real objects, as their toolchains wrote it: Debian 12's
//! `libc.so.6`, a Go binary (`.debug_frame` only, compressed; and its own
//! `.gopclntab`), a clang
//! `-O2` binary, node's 2.7 MB `.eh_frame`. Functions are found by name in
//! each object's symbol table, never by address, and their rows checked
//! against what their code does. How each object was made:
//! `fixtures/README.md`.

use agent_fixtures::{CHAIN_INLINE_CLANG, capture::inflate};
use agent_unwind::{Cfa, CfiContext, CfiSource, ObjectFrames, Rule, UnwindRow, is_go, survey};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// A function symbol in `.text`.
struct Function {
    name: String,
    address: u64,
    size: u64,
}

struct Cfi {
    source: CfiSource<Vec<u8>>,
    functions: Vec<Function>,
}

impl Cfi {
    fn new(data: Vec<u8>) -> Self {
        let file = object::File::parse(&*data).expect("an ELF file");
        let text = file.section_by_name(".text").expect(".text");
        let text = text.address()..text.address() + text.size();
        let functions = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && text.contains(&s.address()))
            .map(|s| Function {
                name: s.name().unwrap_or_default().to_owned(),
                address: s.address(),
                size: s.size(),
            })
            .collect();
        Self {
            source: CfiSource::new(data).expect("the CFI parses"),
            functions,
        }
    }

    fn extract(gz: &[u8]) -> Self {
        Self::new(inflate(gz).expect("a gzip-compressed extract"))
    }

    fn function(&self, name: &str) -> &Function {
        self.functions
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} is not in the symbol table"))
    }

    fn row(&self, vaddr: u64) -> Option<UnwindRow> {
        self.source.row(vaddr, &mut CfiContext::new())
    }

    /// The rows at every byte of function `name`.
    fn rows(&self, name: &str) -> Vec<UnwindRow> {
        let function = self.function(name);
        (function.address..function.address + function.size)
            .map(|vaddr| {
                self.row(vaddr)
                    .unwrap_or_else(|| panic!("no row at {name}+{:#x}", vaddr - function.address))
            })
            .collect()
    }

    /// The CFA rules of function `name` in address order, each change once.
    fn cfa_steps(&self, name: &str) -> Vec<Cfa> {
        let mut steps: Vec<Cfa> = self.rows(name).into_iter().map(|row| row.cfa).collect();
        steps.dedup();
        steps
    }

    fn verdict(&self) -> ObjectFrames {
        survey(&self.source, &mut CfiContext::new()).verdict()
    }
}

/// At a function's first instruction: the return address on top of the
/// stack, nothing else saved.
const ENTRY: UnwindRow = UnwindRow {
    cfa: Cfa::RspOffset(8),
    ra: Rule::CfaOffset(-8),
    rbp: Rule::Same,
};

#[test]
fn every_libc_function_has_cfi_with_the_return_address_on_top_at_entry() {
    let libc = Cfi::extract(agent_fixtures::LIBC_EXTRACT);
    assert!(libc.functions.len() > 3_000, "{}", libc.functions.len());
    let mut cold_in_a_frame = 0;
    for function in &libc.functions {
        let row = libc
            .row(function.address)
            .unwrap_or_else(|| panic!("no CFI for {}", function.name));
        if function.name == "__restore_rt" {
            continue;
        }
        if function.name.ends_with(".cold") {
            // The cold part of a function split by GCC runs in its
            // parent's frame, whatever that was when it jumped there.
            assert_eq!(row.ra, Rule::CfaOffset(-8), "{}", function.name);
            cold_in_a_frame += usize::from(row.cfa != Cfa::RspOffset(8));
        } else {
            assert_eq!(row, ENTRY, "{}", function.name);
        }
    }
    assert!(cold_in_a_frame > 50, "{cold_in_a_frame}");
}

#[test]
fn libc_start_call_main_keeps_its_frame_on_rsp() {
    let libc = Cfi::extract(agent_fixtures::LIBC_EXTRACT);
    let rows = libc.rows("__libc_start_call_main");
    assert_eq!(rows[0], ENTRY);
    assert!(rows.iter().all(|row| row.ra == Rule::CfaOffset(-8)));
    // It makes room for its jmp_buf and never sets up rbp.
    let steps = libc.cfa_steps("__libc_start_call_main");
    assert!(
        steps
            .iter()
            .all(|cfa| matches!(cfa, Cfa::RspOffset(offset) if *offset >= 8)),
        "{steps:?}"
    );
    assert!(steps.len() > 1, "{steps:?}");
}

#[test]
fn libc_functions_with_a_frame_pointer_switch_to_rbp_after_the_prologue() {
    let libc = Cfi::extract(agent_fixtures::LIBC_EXTRACT);
    let rows = libc.rows("__gconv_open");
    assert_eq!(rows[0], ENTRY);
    // push %rbp (1 byte), then mov %rsp,%rbp (3 bytes).
    assert_eq!(rows[1].cfa, Cfa::RspOffset(16));
    assert_eq!(rows[1].rbp, Rule::CfaOffset(-16));
    assert_eq!(rows[4].cfa, Cfa::RbpOffset(16));
    assert_eq!(rows[4].rbp, Rule::CfaOffset(-16));
}

#[test]
fn libc_signal_trampoline_is_a_signal_frame() {
    let libc = Cfi::extract(agent_fixtures::LIBC_EXTRACT);
    let restore = libc.function("__restore_rt");
    assert_eq!(
        libc.row(restore.address).map(|row| row.cfa),
        Some(Cfa::Signal)
    );
}

#[test]
fn libc_plt_uses_the_plt_expression() {
    let data = inflate(agent_fixtures::LIBC_EXTRACT).expect("libc");
    let file = object::File::parse(&*data).expect("an ELF file");
    let plt = file.section_by_name(".plt").expect(".plt").address();
    let libc = Cfi::new(data.clone());
    // PLT0 pushes the link map, then jumps; the entries after it share
    // one rule that depends on where in its 16 bytes rip is.
    assert_eq!(libc.row(plt).map(|row| row.cfa), Some(Cfa::RspOffset(16)));
    assert_eq!(
        libc.row(plt + 6).map(|row| row.cfa),
        Some(Cfa::RspOffset(24))
    );
    assert_eq!(
        libc.row(plt + 16).map(|row| row.cfa),
        Some(Cfa::Plt { threshold: 11 })
    );
}

#[test]
fn go_debug_frame_covers_every_function_on_rsp_alone() {
    let data = inflate(agent_fixtures::GO_CHAIN_EXTRACT).expect("go_chain");
    assert!(is_go(&data));
    let go = Cfi::new(data);
    // The linker's markers (`runtime.etext`, `go:textfipsstart`, ...) are
    // not functions.
    let functions: Vec<&Function> = go.functions.iter().filter(|f| f.size > 1).collect();
    assert!(functions.len() > 1_000, "{}", functions.len());
    for function in functions {
        assert_eq!(go.row(function.address), Some(ENTRY), "{}", function.name);
    }
    // A leaf without locals gets no frame at all.
    assert!(go.rows("main.burn_leaf").iter().all(|row| *row == ENTRY));
    // Go pushes rbp and sets it up as a frame pointer, but its CFI says
    // only how far rsp moved: hence `is_go` before the survey.
    assert_eq!(
        go.cfa_steps("main.level_three"),
        [8, 16, 24, 16, 8].map(Cfa::RspOffset)
    );
    assert!(
        go.rows("main.level_three")
            .iter()
            .all(|row| row.rbp == Rule::Same)
    );
    assert_eq!(go.verdict(), ObjectFrames::NoFramePointers);
}

/// Go's own table (`.gopclntab`) and the `.debug_frame` Go's linker writes
/// from it agree on where the return address is at every byte of every
/// function; the table also says where the caller's rbp was saved.
#[test]
fn go_table_agrees_with_go_debug_frame_at_every_byte() {
    let data = inflate(agent_fixtures::GO_CHAIN_PCLNTAB_EXTRACT).expect("go_chain");
    let table = Cfi::new(data.clone());
    assert!(table.source.has_go_table(), "the table is read");
    let debug_frame = CfiSource::without_go_table(data).expect("the CFI parses");
    assert!(!debug_frame.has_go_table());
    let mut context = CfiContext::new();
    let mut compared = 0usize;
    for function in table.functions.iter().filter(|f| f.size > 1) {
        for vaddr in function.address..function.address + function.size {
            let Some(expected) = debug_frame.row(vaddr, &mut context) else {
                continue;
            };
            let row = table.row(vaddr).unwrap_or_else(|| {
                panic!(
                    "no row at {}+{:#x}",
                    function.name,
                    vaddr - function.address
                )
            });
            assert_eq!(
                (row.cfa, row.ra),
                (expected.cfa, expected.ra),
                "{}+{:#x}",
                function.name,
                vaddr - function.address
            );
            compared += 1;
        }
    }
    assert!(compared > 100_000, "{compared} addresses compared");
    // Inside a frame the caller's rbp is right below the return address.
    let rows = table.rows("main.level_three");
    assert_eq!(rows[0], ENTRY);
    assert!(
        rows.iter()
            .filter(|row| row.cfa != Cfa::RspOffset(8))
            .all(|row| row.rbp == Rule::CfaOffset(-16))
    );
    assert!(table.rows("main.burn_leaf").iter().all(|row| *row == ENTRY));
}

#[test]
fn clang_o2_frames_live_on_rsp() {
    let clang = Cfi::new(CHAIN_INLINE_CLANG.to_vec());
    assert!(clang.rows("burn_leaf").iter().all(|row| *row == ENTRY));
    // push %r14; push %rbx; sub $0xbb8,%rsp, and back.
    assert_eq!(
        clang.cfa_steps("level_two"),
        [8, 16, 24, 3024, 24, 16, 8].map(Cfa::RspOffset)
    );
    assert!(
        clang
            .rows("level_two")
            .iter()
            .all(|row| row.rbp == Rule::Same)
    );
    // main saves rbp as an ordinary register: the CFA stays on rsp.
    let main = clang.rows("main");
    assert!(main.iter().any(|row| row.rbp == Rule::CfaOffset(-16)));
    assert!(main.iter().all(|row| matches!(row.cfa, Cfa::RspOffset(_))));
    // The program's entry: no caller.
    assert_eq!(
        clang
            .row(clang.function("_start").address)
            .map(|row| row.ra),
        Some(Rule::Undefined)
    );
    // crtbegin's helpers come without CFI.
    assert_eq!(clang.row(clang.function("frame_dummy").address), None);
    assert_eq!(clang.verdict(), ObjectFrames::NoFramePointers);
}

#[test]
fn node_cfi_covers_its_cpp_but_not_v8s_embedded_builtins() {
    let node = Cfi::extract(agent_fixtures::NODE_EXTRACT);
    let (builtins, native): (Vec<&Function>, Vec<&Function>) = node
        .functions
        .iter()
        .partition(|f| f.name.starts_with("Builtins_"));
    assert!(!builtins.is_empty() && !native.is_empty());
    for function in native {
        assert_eq!(node.row(function.address), Some(ENTRY), "{}", function.name);
    }
    // V8's builtins carry no CFI: they are crossed by following rbp.
    for function in builtins {
        assert_eq!(node.row(function.address), None, "{}", function.name);
    }
    assert_eq!(node.verdict(), ObjectFrames::FramePointers);
}
