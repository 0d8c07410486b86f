//! Every offset of the layout tables, checked against gdb's reading of the
//! DWARF of real builds (`fixtures/python/X.Y/layout.txt`).

use std::collections::HashMap;

use agent_common::{NO_OFFSET, PythonEntry, PythonInstruction};

use super::interpreters;
use crate::python::{
    layout::{
        BYTES_DATA, Bytecode, InstructionField, Layout, OBJECT_SIZE, OBJECT_TYPE, TYPE_NAME,
        UNICODE_LENGTH, UNICODE_STATE,
    },
    lines::LineFormat,
    walker_layout,
};

/// One `layout.txt`: per gdb command, the fields of a `ptype /o` (offset,
/// bit offset, size) and its total size, or the value of a `print`.
#[derive(Default)]
struct Dwarf {
    fields: HashMap<String, HashMap<String, (u64, u64, u64)>>,
    sizes: HashMap<String, u64>,
    values: HashMap<String, u64>,
}

impl Dwarf {
    fn parse(text: &str) -> Self {
        let mut dwarf = Self::default();
        let mut section = String::new();
        for line in text.lines() {
            if let Some(command) = line.strip_prefix("### ") {
                section = command.to_owned();
            } else if let Some(value) = line.strip_prefix('$') {
                let hex = value.rsplit(' ').next().expect("a value");
                let value = u64::from_str_radix(hex.trim_start_matches("0x"), 16).expect("hex");
                dwarf.values.insert(section.clone(), value);
            } else if let Some((_, size)) = line.split_once("total size (bytes):") {
                let size = size.trim_end_matches("*/").trim().parse().expect("a size");
                // The outermost struct's total comes last.
                dwarf.sizes.insert(section.clone(), size);
            } else if let Some((name, field)) = Self::field(line) {
                dwarf
                    .fields
                    .entry(section.clone())
                    .or_default()
                    .entry(name)
                    .or_insert(field);
            }
        }
        dwarf
    }

    /// `/*  32: 2   |  4 */  unsigned int kind : 3;`: name, (offset, bit,
    /// size).
    fn field(line: &str) -> Option<(String, (u64, u64, u64))> {
        let (position, declaration) = line.trim().strip_prefix("/*")?.split_once("*/")?;
        let (offset, size) = position.split_once('|')?;
        let (offset, bit) = offset.split_once(':').unwrap_or((offset, "0"));
        let declaration = declaration.trim().strip_suffix(';')?;
        let declaration = declaration.split(" : ").next()?;
        let declaration = declaration.split('[').next()?;
        let name = declaration
            .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()?;
        let number = |text: &str| text.trim().parse::<u64>().ok();
        Some((
            name.to_owned(),
            (number(offset)?, number(bit)?, number(size)?),
        ))
    }

    fn offset(&self, command: &str, field: &str) -> u64 {
        self.fields
            .get(command)
            .and_then(|fields| fields.get(field))
            .unwrap_or_else(|| panic!("{field} of {command}"))
            .0
    }

    fn field_of(&self, command: &str, field: &str) -> (u64, u64, u64) {
        *self
            .fields
            .get(command)
            .and_then(|fields| fields.get(field))
            .unwrap_or_else(|| panic!("{field} of {command}"))
    }

    fn value(&self, command: &str) -> u64 {
        *self
            .values
            .get(command)
            .unwrap_or_else(|| panic!("{command}"))
    }

    fn size(&self, command: &str) -> u64 {
        *self
            .sizes
            .get(command)
            .unwrap_or_else(|| panic!("{command}"))
    }
}

const CODE: &str = "ptype /o PyCodeObject";
const OLD_FRAME: &str = "ptype /o struct _frame";
const FRAME: &str = "ptype /o struct _PyInterpreterFrame";

#[test]
fn common_object_layouts() {
    for (version, interpreter) in interpreters() {
        let dwarf = Dwarf::parse(interpreter.layout);
        assert_eq!(dwarf.offset("ptype /o PyObject", "ob_type"), OBJECT_TYPE);
        assert_eq!(dwarf.offset("ptype /o PyVarObject", "ob_size"), OBJECT_SIZE);
        assert_eq!(
            dwarf.offset("ptype /o PyBytesObject", "ob_sval"),
            BYTES_DATA
        );
        assert_eq!(
            dwarf.value("print &((PyTypeObject *)0)->tp_name"),
            TYPE_NAME
        );
        assert_eq!(dwarf.offset("ptype /o Py_tss_t", "_key"), 4, "{version}");
        let ascii = "ptype /o PyASCIIObject";
        assert_eq!(dwarf.offset(ascii, "length"), UNICODE_LENGTH);
        assert_eq!(dwarf.field_of(ascii, "kind"), (UNICODE_STATE, 2, 4));
        assert_eq!(dwarf.field_of(ascii, "compact"), (UNICODE_STATE, 5, 4));
        assert_eq!(dwarf.field_of(ascii, "ascii"), (UNICODE_STATE, 6, 4));
        let layout = Layout::of(version).expect("supported");
        assert_eq!(dwarf.size(ascii), layout.unicode.ascii_data, "{version}");
        assert_eq!(
            dwarf.size("ptype /o PyCompactUnicodeObject"),
            layout.unicode.compact_data,
            "{version}"
        );
    }
}

#[test]
fn thread_state_and_frame_offsets() {
    for (version, interpreter) in interpreters() {
        let dwarf = Dwarf::parse(interpreter.layout);
        let layout = Layout::of(version).expect("supported");
        let gilstate = "print &((struct pyruntimestate *)0)->gilstate.autoTSSkey";
        let runtime = if version.minor <= 11 {
            gilstate
        } else {
            "print &((struct pyruntimestate *)0)->autoTSSkey"
        };
        assert_eq!(layout.runtime_tss_key, dwarf.value(runtime), "{version}");
        let thread_frame = match version.minor {
            8..=10 => "print &((struct _ts *)0)->frame",
            11 | 12 => "print &((struct _ts *)0)->cframe",
            _ => "print &((struct _ts *)0)->current_frame",
        };
        assert_eq!(u64::from(layout.thread_frame), dwarf.value(thread_frame));
        let cframe = (version.minor <= 12 && version.minor >= 11)
            .then(|| dwarf.offset("ptype /o struct _PyCFrame", "current_frame"));
        assert_eq!(
            layout.cframe_current_frame.map(u64::from),
            cframe,
            "{version}"
        );
        let frame = |fields: [&str; 3]| fields.map(|field| dwarf.offset(FRAME, field));
        let (expected, entry) = match version.minor {
            8..=10 => (
                ["f_code", "f_back", "f_lasti"].map(|field| dwarf.offset(OLD_FRAME, field)),
                None,
            ),
            11 => (
                frame(["f_code", "previous", "prev_instr"]),
                Some(dwarf.offset(FRAME, "is_entry")),
            ),
            12 => (
                frame(["f_code", "previous", "prev_instr"]),
                Some(dwarf.offset(FRAME, "owner")),
            ),
            _ => (
                frame(["f_executable", "previous", "instr_ptr"]),
                Some(dwarf.offset(FRAME, "owner")),
            ),
        };
        let walked = [
            layout.frame_code,
            layout.frame_previous,
            layout.frame_instruction,
        ];
        assert_eq!(walked.map(u64::from), expected, "{version}");
        assert_eq!(layout.frame_entry.map(u64::from), entry, "{version}");
    }
}

#[test]
fn code_object_offsets() {
    for (version, interpreter) in interpreters() {
        let dwarf = Dwarf::parse(interpreter.layout);
        let code = Layout::of(version).expect("supported").code;
        let modern = version.minor >= 11;
        assert_eq!(code.file, dwarf.offset(CODE, "co_filename"));
        let function = if modern { "co_qualname" } else { "co_name" };
        assert_eq!(code.function, dwarf.offset(CODE, function), "{version}");
        assert_eq!(code.first_line, dwarf.offset(CODE, "co_firstlineno"));
        let (table, format) = match version.minor {
            8 | 9 => ("co_lnotab", LineFormat::Lnotab),
            10 => ("co_linetable", LineFormat::Ranges),
            _ => ("co_linetable", LineFormat::Locations),
        };
        assert_eq!(code.line_table, dwarf.offset(CODE, table), "{version}");
        assert_eq!(code.line_format, format, "{version}");
        let bytecode = if modern {
            Bytecode::Inline {
                adaptive: dwarf.offset(CODE, "co_code_adaptive"),
            }
        } else {
            Bytecode::Object {
                code: dwarf.offset(CODE, "co_code"),
            }
        };
        assert_eq!(code.bytecode, bytecode, "{version}");
        // The stamp: co_firstlineno and an int next to it, both 4 bytes.
        let (low, high) = if modern {
            ("co_firstlineno", "co_nlocalsplus")
        } else {
            ("co_flags", "co_firstlineno")
        };
        assert_eq!(dwarf.field_of(CODE, low), (code.stamp, 0, 4), "{version}");
        assert_eq!(
            dwarf.field_of(CODE, high),
            (code.stamp + 4, 0, 4),
            "{version}"
        );
        let read = [code.file, code.function, code.line_table, code.stamp];
        let end = read.into_iter().max().expect("fields") + 8;
        assert!(code.header as u64 >= end && code.header as u64 <= end + 8);
    }
}

#[test]
fn walker_layouts() {
    for (version, _) in interpreters() {
        let layout = Layout::of(version).expect("supported");
        let process =
            walker_layout(version, 0x7f00_0000_0000, 0x7f00_0010_0000, 0x310).expect("supported");
        assert_eq!(
            process.tss_key_address,
            0x7f00_0000_0000 + layout.runtime_tss_key
        );
        assert_eq!(process.tsd_first_block, 0x310);
        assert_eq!(process.version, 0x0300 | u16::from(version.minor));
        assert_eq!(u64::from(process.code_stamp), layout.code.stamp);
        let (instruction, entry) = match version.minor {
            8..=10 => (PythonInstruction::Index, PythonEntry::EveryFrame),
            11 => (PythonInstruction::Pointer, PythonEntry::Flag),
            _ => (PythonInstruction::Pointer, PythonEntry::Shim),
        };
        assert_eq!(process.instruction, instruction as u8, "{version}");
        assert_eq!(process.entry, entry as u8, "{version}");
        assert_eq!(
            layout.instruction == InstructionField::Pointer,
            version.minor >= 11
        );
        let no_cframe = !(11..=12).contains(&version.minor);
        assert_eq!(process.cframe_current_frame == NO_OFFSET, no_cframe);
        assert_eq!(process.frame_entry == NO_OFFSET, version.minor <= 10);
    }
    for minor in [7, 14] {
        let version = crate::python::PythonVersion {
            major: 3,
            minor,
            patch: 0,
        };
        assert!(walker_layout(version, 0, 0, 0x310).is_err());
    }
}
