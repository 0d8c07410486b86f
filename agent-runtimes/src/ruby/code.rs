//! The statics libruby does not export, found in the code of functions it
//! does: the symbol table (`rb_id2str`), the interpreter loop
//! (`rb_vm_exec`, or since 3.3, which hides it, `rb_iseq_eval_main`) and,
//! since 3.3, the main ractor (`rb_ractor_stdin`).

use std::{collections::VecDeque, ops::Range};

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

use super::{
    RubyError,
    object::{bytes_at, find_symbol, section_at},
};

const ID_TO_STRING: &str = "rb_id2str";
const EXEC: &str = "rb_vm_exec";
const EVAL_MAIN: &str = "rb_iseq_eval_main";
const STDIN: &str = "rb_ractor_stdin";
const MAIN_RACTOR: &str = "ruby_single_main_ractor";

/// Instructions decoded at most looking for `global_symbols.last_id`, over
/// `rb_id2str` and the paths of the function it jumps to (3.4.11 compares
/// after 31).
const MAX_INSTRUCTIONS: usize = 128;
/// Instructions of `rb_ractor_stdin` decoded at most looking for its test
/// of the main ractor (its third in 3.3 and 3.4).
const MAX_STDIN_INSTRUCTIONS: usize = 16;
/// Bytes decoded at once from a function's start.
const CODE_WINDOW: u64 = 512;
/// Bytes of a function decoded at most looking for its calls
/// (`rb_vm_exec` is about 3 KB).
const MAX_EXEC_BYTES: u64 = 64 << 10;

/// Whether `address` is in the object's writable data, where a static
/// is.
fn in_data(file: &object::File<'_>, address: u64) -> bool {
    section_at(file, address).is_some_and(|section| {
        matches!(
            section.kind(),
            SectionKind::Data | SectionKind::UninitializedData
        )
    })
}

/// The global the running execution context is found through, `name`
/// (`ruby_single_main_ractor`): its symbol where the object exports it
/// (until 3.1), else in the code of `rb_ractor_stdin`, whose first test is
/// `rb_ractor_main_p()`'s `ruby_single_main_ractor != NULL`: `lea reg,
/// [rip + global]` then `cmp qword [reg], 0` in 3.3 and 3.4 (or the
/// global compared where it is).
pub(super) fn context_global(
    file: &object::File<'_>,
    name: &'static str,
) -> Result<u64, RubyError> {
    if let Some(symbol) = find_symbol(file, name) {
        return Ok(symbol.address());
    }
    // Only the main ractor is hidden (3.3+); 2.7's global is exported.
    if name != MAIN_RACTOR {
        return Err(RubyError::MissingSymbol { name });
    }
    let not_found = || RubyError::ContextNotFound {
        symbol: name,
        function: STDIN,
    };
    let start = find_symbol(file, STDIN)
        .ok_or(RubyError::MissingSymbol { name: STDIN })?
        .address();
    let code = section_at(file, start)
        .and_then(|section| bytes_at(&section, start, CODE_WINDOW))
        .ok_or(RubyError::UnreadableSymbol {
            name: STDIN,
            address: start,
        })?;
    // The registers loaded with the address of a static, and which.
    let mut loaded: Vec<(Register, u64)> = Vec::new();
    for instruction in Decoder::with_ip(64, code, start, DecoderOptions::NONE)
        .into_iter()
        .take(MAX_STDIN_INSTRUCTIONS)
    {
        if instruction.is_invalid() {
            break;
        }
        let found = match instruction.mnemonic() {
            Mnemonic::Lea if instruction.is_ip_rel_memory_operand() => {
                loaded.push((
                    instruction.op0_register(),
                    instruction.ip_rel_memory_address(),
                ));
                None
            }
            Mnemonic::Cmp if is_null_test(&instruction) => {
                if instruction.is_ip_rel_memory_operand() {
                    Some(instruction.ip_rel_memory_address())
                } else {
                    loaded
                        .iter()
                        .rev()
                        .find(|(register, _)| *register == instruction.memory_base())
                        .map(|(_, address)| *address)
                }
            }
            Mnemonic::Jmp | Mnemonic::Call | Mnemonic::Ret => break,
            _ => None,
        };
        if let Some(address) = found {
            return if in_data(file, address) {
                Ok(address)
            } else {
                Err(not_found())
            };
        }
    }
    Err(not_found())
}

/// `cmp qword [mem], 0` with no index and no displacement but a static's.
fn is_null_test(instruction: &Instruction) -> bool {
    instruction.op0_kind() == OpKind::Memory
        && matches!(
            instruction.op1_kind(),
            OpKind::Immediate8to64 | OpKind::Immediate32to64
        )
        && instruction.immediate64() == 0
        && instruction.memory_index() == Register::None
        && (instruction.is_ip_rel_memory_operand() || instruction.memory_displacement64() == 0)
}

/// `ruby_global_symbols`, from the code of `rb_id2str`: it turns the ID
/// into a serial and jumps to `get_id_serial_entry`, which compares the
/// serial with `global_symbols.last_id` (`serial <= last_id`), `last_id`
/// being the struct's first field. The address must be in the object's
/// writable data.
pub(super) fn global_symbols(file: &object::File<'_>) -> Result<u64, RubyError> {
    let not_found = || RubyError::SymbolTableNotFound {
        function: ID_TO_STRING,
        instructions: MAX_INSTRUCTIONS,
    };
    let start = find_symbol(file, ID_TO_STRING)
        .ok_or(RubyError::MissingSymbol { name: ID_TO_STRING })?
        .address();
    let address = last_id_compare(file, start).ok_or_else(not_found)?;
    if in_data(file, address) {
        Ok(address)
    } else {
        Err(not_found())
    }
}

/// Where a run of straight-line code ended.
enum Run {
    /// At the comparison with `last_id`, reading this static.
    Compare(u64),
    /// At a direct `jmp` (or, in `rb_id2str`, a direct `call`) to here.
    Jump(u64),
    /// At a return, an indirect jump, a trap, or out of bytes.
    End,
}

/// The static a `cmp` of a 32-bit register with `[rip + disp]` reads: in
/// `rb_id2str` from `start`, straight on to its first direct `jmp` or
/// `call` (into the static lookup), then in that code along all its
/// paths, breadth-first, conditional branches both taken and not. 2.7
/// compares in `rb_id2str` itself, 3.1 and 3.3 on the lookup's straight
/// path; 3.4.11 puts the return for serial 0 there and compares on both
/// sides of a branch.
fn last_id_compare(file: &object::File<'_>, start: u64) -> Option<u64> {
    let mut budget = MAX_INSTRUCTIONS;
    let mut branches = VecDeque::new();
    let lookup = match run(file, start, true, &mut budget, &mut branches)? {
        Run::Compare(address) => return Some(address),
        Run::Jump(target) => target,
        Run::End => return None,
    };
    branches.clear();
    branches.push_back(lookup);
    let mut started = Vec::new();
    while let Some(address) = branches.pop_front() {
        if started.contains(&address) {
            continue;
        }
        started.push(address);
        match run(file, address, false, &mut budget, &mut branches)? {
            Run::Compare(address) => return Some(address),
            Run::Jump(target) => branches.push_back(target),
            Run::End => {}
        }
    }
    None
}

/// Decodes from `address` until the comparison or the end of the run,
/// queueing the targets of conditional branches. `follow_calls`: a direct
/// `call` ends the run as a jump does (`rb_id2str` may call its lookup);
/// otherwise calls are stepped over, as they return. `None` once `budget`
/// instructions were decoded, or at bytes that do not decode.
fn run(
    file: &object::File<'_>,
    address: u64,
    follow_calls: bool,
    budget: &mut usize,
    branches: &mut VecDeque<u64>,
) -> Option<Run> {
    let code = bytes_at(&section_at(file, address)?, address, CODE_WINDOW)?;
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        *budget = budget.checked_sub(1)?;
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            return None;
        }
        if is_last_id_compare(&instruction) {
            return Some(Run::Compare(instruction.ip_rel_memory_address()));
        }
        let direct = instruction.op0_kind() == OpKind::NearBranch64;
        match instruction.mnemonic() {
            _ if is_conditional_branch(&instruction) => {
                branches.push_back(instruction.near_branch_target());
            }
            Mnemonic::Jmp if direct => return Some(Run::Jump(instruction.near_branch_target())),
            Mnemonic::Call if direct && follow_calls => {
                return Some(Run::Jump(instruction.near_branch_target()));
            }
            Mnemonic::Call if !follow_calls => {}
            Mnemonic::Jmp
            | Mnemonic::Call
            | Mnemonic::Ret
            | Mnemonic::Retf
            | Mnemonic::Int3
            | Mnemonic::Ud2
            | Mnemonic::Hlt => return Some(Run::End),
            _ => {}
        }
    }
    Some(Run::End)
}

/// A direct `jcc` (the decoder's flow control tables are not built in).
fn is_conditional_branch(instruction: &Instruction) -> bool {
    instruction.op0_kind() == OpKind::NearBranch64
        && matches!(
            instruction.mnemonic(),
            Mnemonic::Ja
                | Mnemonic::Jae
                | Mnemonic::Jb
                | Mnemonic::Jbe
                | Mnemonic::Je
                | Mnemonic::Jne
                | Mnemonic::Jg
                | Mnemonic::Jge
                | Mnemonic::Jl
                | Mnemonic::Jle
                | Mnemonic::Jo
                | Mnemonic::Jno
                | Mnemonic::Jp
                | Mnemonic::Jnp
                | Mnemonic::Js
                | Mnemonic::Jns
        )
}

/// `cmp r32, dword [rip + disp]` or `cmp dword [rip + disp], r32`.
fn is_last_id_compare(instruction: &Instruction) -> bool {
    if instruction.mnemonic() != Mnemonic::Cmp || !instruction.is_ip_rel_memory_operand() {
        return false;
    }
    let register = match (instruction.op0_kind(), instruction.op1_kind()) {
        (OpKind::Memory, OpKind::Register) => instruction.op1_register(),
        (OpKind::Register, OpKind::Memory) => instruction.op0_register(),
        _ => return false,
    };
    (Register::EAX as u32..=Register::R15D as u32).contains(&(register as u32))
}

/// `vm_exec_core`, the native interpreter loop: the largest function (by
/// its call frame information) `rb_vm_exec` calls directly in its own
/// section (not through the PLT); the loop is tens of KB, what else
/// `rb_vm_exec` calls (hooks, error paths) is small. Since 3.3 libruby
/// hides `rb_vm_exec`: it is one of the functions `rb_iseq_eval_main`
/// calls or jumps to (its `return vm_exec(ec)` is a tail call), and the
/// loop the largest function those call.
pub(super) fn eval_loop(file: &object::File<'_>) -> Result<Range<u64>, RubyError> {
    let functions = function_ranges(file)?;
    let (function, calls) = if let Some(exec) = find_symbol(file, EXEC) {
        let calls = callees(file, &functions, EXEC, exec.address(), exec.size(), false)?;
        (EXEC, calls)
    } else {
        let main = find_symbol(file, EVAL_MAIN).ok_or(RubyError::MissingSymbol { name: EXEC })?;
        let mut calls = Vec::new();
        for exec in callees(
            file,
            &functions,
            EVAL_MAIN,
            main.address(),
            main.size(),
            true,
        )? {
            // A callee without code here (a bad FDE) has no calls.
            calls.extend(callees(file, &functions, EVAL_MAIN, exec, 0, false).unwrap_or_default());
        }
        calls.sort_unstable();
        calls.dedup();
        (EVAL_MAIN, calls)
    };
    calls
        .iter()
        .filter_map(|&target| function_at(&functions, target))
        .max_by_key(|range| range.end - range.start)
        .ok_or(RubyError::EvalLoopNotFound {
            function,
            calls: calls.len(),
        })
}

/// The FDE range holding `address`.
fn function_at(functions: &[Range<u64>], address: u64) -> Option<Range<u64>> {
    let after = functions.partition_point(|range| range.start <= address);
    let range = functions.get(after.checked_sub(1)?)?;
    range.contains(&address).then(|| range.clone())
}

/// The targets of the direct calls of the function at `start` (`size`
/// bytes, or as its FDE says when 0) into its own section, sorted; with
/// `tail_calls`, of its direct jumps out of itself too. `name` names the
/// function asked about in errors.
fn callees(
    file: &object::File<'_>,
    functions: &[Range<u64>],
    name: &'static str,
    start: u64,
    size: u64,
    tail_calls: bool,
) -> Result<Vec<u64>, RubyError> {
    let unreadable = RubyError::UnreadableSymbol {
        name,
        address: start,
    };
    let section = section_at(file, start).ok_or(unreadable)?;
    let own = match size {
        0 => function_at(functions, start).filter(|range| range.start == start),
        size => Some(start..start.saturating_add(size)),
    };
    let length = own
        .as_ref()
        .map_or(MAX_EXEC_BYTES, |range| range.end - range.start)
        .min(MAX_EXEC_BYTES);
    let code = bytes_at(&section, start, length).ok_or(RubyError::UnreadableSymbol {
        name,
        address: start,
    })?;
    let in_section = section.address()..section.address().saturating_add(section.size());
    let own = own.unwrap_or(start..start.saturating_add(length));
    let mut calls: Vec<u64> = Decoder::with_ip(64, code, start, DecoderOptions::NONE)
        .into_iter()
        .filter(|instruction| instruction.op0_kind() == OpKind::NearBranch64)
        .filter_map(|instruction| {
            let target = instruction.near_branch_target();
            match instruction.mnemonic() {
                Mnemonic::Call => Some(target),
                Mnemonic::Jmp if tail_calls && !own.contains(&target) => Some(target),
                _ => None,
            }
        })
        .filter(|target| in_section.contains(target))
        .collect();
    calls.sort_unstable();
    calls.dedup();
    Ok(calls)
}

/// The address ranges of the object's FDEs in `.eh_frame`, sorted by
/// start; empty without one.
pub(super) fn function_ranges(file: &object::File<'_>) -> Result<Vec<Range<u64>>, RubyError> {
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Ok(Vec::new());
    };
    let data = section.data().unwrap_or_default();
    let mut eh_frame = EhFrame::new(data, LittleEndian);
    eh_frame.set_address_size(8);
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut ranges = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            Err(source) if ranges.is_empty() => return Err(RubyError::FrameInformation { source }),
            // A malformed entry ends the walk; keep what was read.
            Err(_) => break,
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        if let Ok(fde) = partial.parse(EhFrame::cie_from_offset) {
            let start = fde.initial_address();
            ranges.push(start..start.saturating_add(fde.len()));
        }
    }
    ranges.sort_unstable_by_key(|range| range.start);
    Ok(ranges)
}
