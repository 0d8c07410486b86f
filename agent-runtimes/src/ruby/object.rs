//! Is a mapped object the CRuby interpreter, which one, and where its
//! statics are. Two of them are not exported (the symbol table, the
//! interpreter loop) and are found in the code of exported functions
//! that use them.

use std::ops::Range;

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

use super::{RubyError, RubyVersion, layout::layout};

/// The interpreter in an object: `libruby.so`, or an executable with it
/// linked in. Addresses are link-time ones (add the object's load bias).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RubyObject {
    pub version: RubyVersion,
    /// The global the running execution context is found through:
    /// `ruby_single_main_ractor` (3.0+), `ruby_current_execution_context_ptr`
    /// (2.x).
    pub context_global: u64,
    /// `ruby_global_symbols`, the symbol table (static, found through
    /// `rb_id2str`'s code).
    pub symbols: u64,
    /// `vm_exec_core`, the native interpreter loop whose frames the
    /// recorded control frames stand for (static, found as the largest
    /// function `rb_vm_exec` calls).
    pub eval_loop: Range<u64>,
}

const VERSION: &str = "ruby_version";
const ID_TO_STRING: &str = "rb_id2str";
const EXEC: &str = "rb_vm_exec";

/// Bytes of a version string read at most.
const MAX_VERSION_BYTES: u64 = 32;
/// Instructions decoded at most looking for `global_symbols.last_id`, over
/// `rb_id2str` and the one function it jumps to.
const MAX_INSTRUCTIONS: usize = 64;
/// Bytes decoded at once from a function's start.
const CODE_WINDOW: u64 = 512;
/// Bytes of `rb_vm_exec` decoded at most (it is about 3 KB).
const MAX_EXEC_BYTES: u64 = 64 << 10;

/// Whether the object named `file_name` (a path or a file name) with the
/// bytes `elf` is a CRuby interpreter: `Ok(None)` if not, an error if it
/// is one firn cannot walk.
///
/// An interpreter is named `libruby*.so*`, or defines `rb_vm_exec` (an
/// executable with libruby linked in exports it for extensions): the
/// `ruby` that only loads `libruby.so` is not one.
pub fn inspect_object(file_name: &str, elf: &[u8]) -> Result<Option<RubyObject>, RubyError> {
    let file_name = file_name.rsplit('/').next().unwrap_or(file_name);
    let named = file_name.starts_with("libruby") && file_name.contains(".so");
    let file = match object::File::parse(elf) {
        Ok(file) => file,
        Err(source) if named => return Err(RubyError::Parse { source }),
        Err(_) => return Ok(None),
    };
    let defines_exec = || has_string(&file, EXEC) && find_symbol(&file, EXEC).is_some();
    if !named && !defines_exec() {
        return Ok(None);
    }
    let version = read_version(&file)?;
    let layout = layout(version)?;
    let context_global = find_symbol(&file, layout.context_symbol)
        .ok_or(RubyError::MissingSymbol {
            name: layout.context_symbol,
        })?
        .address();
    Ok(Some(RubyObject {
        version,
        context_global,
        symbols: global_symbols(&file)?,
        eval_loop: eval_loop(&file)?,
    }))
}

/// The version `ruby_version` says.
fn read_version(file: &object::File<'_>) -> Result<RubyVersion, RubyError> {
    let symbol = find_symbol(file, VERSION).ok_or(RubyError::MissingSymbol { name: VERSION })?;
    let address = symbol.address();
    let length = match symbol.size() {
        0 => MAX_VERSION_BYTES,
        size => size.min(MAX_VERSION_BYTES),
    };
    let bytes = symbol
        .section_index()
        .and_then(|index| file.section_by_index(index).ok())
        .and_then(|section| bytes_at(&section, address, length))
        .ok_or(RubyError::UnreadableSymbol {
            name: VERSION,
            address,
        })?;
    let text = bytes.split(|&byte| byte == 0).next().unwrap_or_default();
    let text = String::from_utf8_lossy(text);
    RubyVersion::parse(&text).ok_or_else(|| RubyError::UnknownVersion {
        text: text.into_owned(),
    })
}

/// Whether a symbol string table of the file holds `name`: most objects
/// are not interpreters, and a search of the tables answers sooner than
/// reading each symbol's name.
fn has_string(file: &object::File<'_>, name: &str) -> bool {
    let needle = [b"\0", name.as_bytes(), b"\0"].concat();
    [".dynstr", ".strtab"].iter().any(|table| {
        file.section_by_name(table)
            .and_then(|section| section.data().ok())
            .is_some_and(|data| memchr::memmem::find(data, &needle).is_some())
    })
}

fn find_symbol<'data, 'file>(
    file: &'file object::File<'data>,
    name: &str,
) -> Option<object::Symbol<'data, 'file>> {
    file.dynamic_symbols()
        .chain(file.symbols())
        .find(|symbol| symbol.is_definition() && symbol.name() == Ok(name))
}

/// Up to `length` bytes of `section` from `address` (fewer at its end).
fn bytes_at<'data>(
    section: &object::Section<'data, '_>,
    address: u64,
    length: u64,
) -> Option<&'data [u8]> {
    // Section fields come from the file: an end past the address space
    // must not wrap.
    let end = section.address().saturating_add(section.size());
    let available = end.checked_sub(address)?;
    if address < section.address() || available == 0 {
        return None;
    }
    section
        .data_range(address, available.min(length))
        .ok()
        .flatten()
}

/// The section holding `address`.
fn section_at<'data, 'file>(
    file: &'file object::File<'data>,
    address: u64,
) -> Option<object::Section<'data, 'file>> {
    file.sections().find(|section| {
        (section.address()..section.address().saturating_add(section.size())).contains(&address)
    })
}

/// `ruby_global_symbols`, from the code of `rb_id2str`: it turns the ID
/// into a serial and jumps to `get_id_serial_entry`, whose first
/// comparison with a 32-bit static is `serial <= global_symbols.last_id`,
/// `last_id` being the struct's first field. The address must be in the
/// object's writable data.
fn global_symbols(file: &object::File<'_>) -> Result<u64, RubyError> {
    let not_found = RubyError::SymbolTableNotFound {
        function: ID_TO_STRING,
        instructions: MAX_INSTRUCTIONS,
    };
    let start = find_symbol(file, ID_TO_STRING)
        .ok_or(RubyError::MissingSymbol { name: ID_TO_STRING })?
        .address();
    let address = last_id_compare(file, start).ok_or(not_found)?;
    let in_data = section_at(file, address).is_some_and(|section| {
        matches!(
            section.kind(),
            SectionKind::Data | SectionKind::UninitializedData
        )
    });
    if in_data {
        Ok(address)
    } else {
        Err(RubyError::SymbolTableNotFound {
            function: ID_TO_STRING,
            instructions: MAX_INSTRUCTIONS,
        })
    }
}

/// The static a `cmp` of a 32-bit register with `[rip + disp]` reads, in
/// the code from `start`, following at most one direct `jmp` or `call`.
fn last_id_compare(file: &object::File<'_>, start: u64) -> Option<u64> {
    let mut address = start;
    let mut followed = false;
    let mut decoded = 0;
    loop {
        let code = bytes_at(&section_at(file, address)?, address, CODE_WINDOW)?;
        let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
        let mut instruction = Instruction::default();
        let mut target = None;
        while decoder.can_decode() && decoded < MAX_INSTRUCTIONS {
            decoder.decode_out(&mut instruction);
            decoded += 1;
            if instruction.is_invalid() {
                return None;
            }
            if is_last_id_compare(&instruction) {
                return Some(instruction.ip_rel_memory_address());
            }
            // Conditional branches are passed by: the comparison is on
            // the straight path.
            match instruction.mnemonic() {
                Mnemonic::Jmp | Mnemonic::Call
                    if instruction.op0_kind() == OpKind::NearBranch64 =>
                {
                    target = Some(instruction.near_branch_target());
                    break;
                }
                Mnemonic::Jmp
                | Mnemonic::Call
                | Mnemonic::Ret
                | Mnemonic::Retf
                | Mnemonic::Int3
                | Mnemonic::Ud2
                | Mnemonic::Hlt => return None,
                _ => {}
            }
        }
        match target {
            Some(target) if !followed => {
                followed = true;
                address = target;
            }
            _ => return None,
        }
    }
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

/// `vm_exec_core`: of the functions `rb_vm_exec` calls directly in its own
/// section (not through the PLT), the largest by its call frame
/// information. The interpreter loop is tens of KB; what else
/// `rb_vm_exec` calls (hooks, error paths) is small.
fn eval_loop(file: &object::File<'_>) -> Result<Range<u64>, RubyError> {
    let exec = find_symbol(file, EXEC).ok_or(RubyError::MissingSymbol { name: EXEC })?;
    let start = exec.address();
    let section = section_at(file, start).ok_or(RubyError::UnreadableSymbol {
        name: EXEC,
        address: start,
    })?;
    let length = match exec.size() {
        0 => MAX_EXEC_BYTES,
        size => size.min(MAX_EXEC_BYTES),
    };
    let code = bytes_at(&section, start, length).ok_or(RubyError::UnreadableSymbol {
        name: EXEC,
        address: start,
    })?;
    let in_section = section.address()..section.address().saturating_add(section.size());
    let mut calls: Vec<u64> = Decoder::with_ip(64, code, start, DecoderOptions::NONE)
        .into_iter()
        .filter(|instruction| {
            instruction.mnemonic() == Mnemonic::Call
                && instruction.op0_kind() == OpKind::NearBranch64
        })
        .map(|instruction| instruction.near_branch_target())
        .filter(|target| in_section.contains(target))
        .collect();
    calls.sort_unstable();
    calls.dedup();
    let functions = function_ranges(file)?;
    calls
        .iter()
        .filter_map(|&target| {
            let after = functions.partition_point(|range| range.start <= target);
            let range = functions.get(after.checked_sub(1)?)?;
            range.contains(&target).then(|| range.clone())
        })
        .max_by_key(|range| range.end - range.start)
        .ok_or(RubyError::EvalLoopNotFound {
            function: EXEC,
            calls: calls.len(),
        })
}

/// The address ranges of the object's FDEs in `.eh_frame`, sorted by
/// start; empty without one.
fn function_ranges(file: &object::File<'_>) -> Result<Vec<Range<u64>>, RubyError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Stand-ins for libruby (`fixtures/ruby/make-objects.sh`).
    fn stand_in(file: &str) -> Vec<u8> {
        let path = agent_fixtures::dir().join("ruby/objects").join(file);
        std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    const RUBY_3_1_2: RubyVersion = RubyVersion {
        major: 3,
        minor: 1,
        patch: 2,
    };

    #[test]
    fn statics_are_found_in_the_code() {
        let found = inspect_object(
            "/usr/lib/libruby-3.1.so.3.1.2",
            &stand_in("libruby-3.1.so.3.1.2"),
        )
        .expect("an interpreter")
        .expect("walkable");
        assert_eq!(
            found,
            RubyObject {
                version: RUBY_3_1_2,
                context_global: 0x5040,
                symbols: 0x5020,
                eval_loop: 0x105c..0x2012,
            }
        );
        // The symbols, not the name, make an interpreter.
        let renamed = inspect_object("ruby-static", &stand_in("libruby-3.1.so.3.1.2"))
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(renamed, found);
    }

    #[test]
    fn the_eval_loop_is_never_a_plt_entry() {
        // vm_exec_core of 18 bytes, the PLT's FDE 32: still the loop.
        let found = inspect_object("libruby-3.1.so.3.1", &stand_in("libruby-3.1-small-loop.so"))
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(found.eval_loop, 0x105c..0x106e);
    }

    #[test]
    fn interpreters_firn_cannot_walk() {
        assert!(matches!(
            inspect_object("libruby-2.7.so.2.7", &stand_in("libruby-2.7.so.2.7.8")),
            Err(RubyError::UnsupportedVersion { version }) if version.to_string() == "2.7.8"
        ));
        assert!(matches!(
            inspect_object("libruby-3.1.so", &stand_in("libruby-3.1-no-last-id.so")),
            Err(RubyError::SymbolTableNotFound {
                function: "rb_id2str",
                ..
            })
        ));
        assert!(matches!(
            inspect_object("libruby.so.3.1", agent_fixtures::CHAIN),
            Err(RubyError::MissingSymbol {
                name: "ruby_version"
            })
        ));
        assert!(matches!(
            inspect_object("libruby.so.3.1", b"garbage"),
            Err(RubyError::Parse { .. })
        ));
    }

    #[test]
    fn other_objects_are_not_interpreters() {
        assert_eq!(
            inspect_object("chain", agent_fixtures::CHAIN).ok(),
            Some(None)
        );
        assert_eq!(inspect_object("ruby", b"garbage").ok(), Some(None));
        assert_eq!(
            inspect_object("/usr/bin/ruby3.1", agent_fixtures::CHAIN_STRIPPED).ok(),
            Some(None)
        );
    }

    #[test]
    fn versions() {
        assert_eq!(RubyVersion::parse("3.1.2"), Some(RUBY_3_1_2));
        assert_eq!(RUBY_3_1_2.to_string(), "3.1.2");
        for other in ["3.1", "3.1.2.1", "3.x.2", "", "3.1.256"] {
            assert_eq!(RubyVersion::parse(other), None, "{other}");
        }
    }

    /// Debian 12's libruby 3.1 (`libruby3.1` 3.1.7+really3.1.2-0+deb12u1),
    /// where that very build is installed: the values checked by hand with
    /// objdump (`fixtures/README.md`).
    #[test]
    fn debian_libruby_3_1_where_installed() {
        let path = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2";
        let elf = std::fs::read(path).unwrap_or_default();
        let build_id = object::File::parse(&*elf)
            .ok()
            .and_then(|file| file.build_id().ok().flatten())
            .map(|id| {
                id.iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect::<String>()
            });
        let same = build_id.as_deref() == Some("862794fba1ac9d77263f555b39818ec3baacbeb8");
        if !same {
            eprintln!("{path} is not the build checked: not checked");
            return;
        }
        let found = inspect_object(path, &elf)
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(
            found,
            RubyObject {
                version: RUBY_3_1_2,
                context_global: 0x3b_d368,
                symbols: 0x3a_f1c0,
                eval_loop: 0x24_ebd0..0x25_3047,
            }
        );
    }
}
