//! Where things are in each supported CPython's structs (x86-64, release
//! builds). Each table cites the headers and tag its offsets come from; the
//! unit tests check every offset against the DWARF of real builds
//! (`fixtures/python/X.Y/layout.txt`).

use agent_common::{
    INTERPRETER_FRAME_READ, NO_OFFSET, PythonEntry, PythonInstruction, PythonLayout,
};

use super::{PythonError, PythonVersion, lines::LineFormat};

/// `PyObject::ob_type`, the same in every version.
pub(crate) const OBJECT_TYPE: u64 = 8;
/// `PyVarObject::ob_size`.
pub(crate) const OBJECT_SIZE: u64 = 16;
/// `PyTypeObject::tp_name`.
pub(crate) const TYPE_NAME: u64 = 24;
/// `PyBytesObject::ob_sval`.
pub(crate) const BYTES_DATA: u64 = 32;
/// `PyASCIIObject::length`.
pub(crate) const UNICODE_LENGTH: u64 = 16;
/// `PyASCIIObject::state`: `interned:2 kind:3 compact:1 ascii:1`, from the
/// lowest bit, in every supported version.
pub(crate) const UNICODE_STATE: u64 = 32;

/// How a frame's raw instruction field becomes a byte offset in the
/// bytecode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InstructionField {
    /// `f_lasti` in bytes (3.8, 3.9).
    ByteIndex,
    /// `f_lasti` in 2-byte code units (3.10).
    UnitIndex,
    /// A pointer into `co_code_adaptive` (3.11+).
    Pointer,
}

/// Where a code object's bytecode is, for its size and for turning
/// pointers into offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bytecode {
    /// `co_code`: a pointer to a bytes object (3.8-3.10).
    Object { code: u64 },
    /// `co_code_adaptive`: inline at this offset, `ob_size` code units
    /// long (3.11+).
    Inline { adaptive: u64 },
}

/// The code object fields the namer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CodeLayout {
    /// The 8 bytes the walker copies as the frame's stamp. Both halves are
    /// ints set when the code object is made and never changed after:
    /// `co_firstlineno` with its neighbour (`co_flags` before 3.11,
    /// `co_nlocalsplus` from 3.11). They tell apart the functions of one
    /// file, so a freed code object whose memory holds another one by the
    /// time the namer reads it is caught, unless the two start on the same
    /// line (and then likely are the same function, reloaded).
    pub stamp: u64,
    pub file: u64,
    /// `co_qualname` from 3.11, `co_name` before.
    pub function: u64,
    pub first_line: u64,
    /// `co_lnotab` (3.8, 3.9) or `co_linetable`.
    pub line_table: u64,
    pub line_format: LineFormat,
    pub bytecode: Bytecode,
    /// Bytes read from the start of a code object: all of the above.
    pub header: usize,
}

/// Sizes of the string structs: a compact string's characters follow them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnicodeLayout {
    /// `sizeof(PyASCIIObject)`: ASCII strings.
    pub ascii_data: u64,
    /// `sizeof(PyCompactUnicodeObject)`: other compact strings.
    pub compact_data: u64,
}

/// One minor version's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `_PyRuntimeState`: `gilstate.autoTSSkey` up to 3.11, `autoTSSkey`
    /// from 3.12.
    pub runtime_tss_key: u64,
    /// `PyThreadState`: `frame` (3.8-3.10), `cframe` (3.11, 3.12),
    /// `current_frame` (3.13).
    pub thread_frame: u16,
    /// `_PyCFrame::current_frame` (3.11, 3.12).
    pub cframe_current_frame: Option<u16>,
    pub frame_code: u16,
    pub frame_previous: u16,
    pub frame_instruction: u16,
    /// `_PyInterpreterFrame::is_entry` (3.11) or `owner` (3.12+).
    pub frame_entry: Option<u16>,
    pub instruction: InstructionField,
    pub entry: PythonEntry,
    pub code: CodeLayout,
    pub unicode: UnicodeLayout,
}

/// 3.8 and 3.9 share every offset used here.
/// - `struct _frame`: `Include/frameobject.h` at v3.8.18,
///   `Include/cpython/frameobject.h` at v3.9.18: `f_back` 24, `f_code` 32,
///   `f_lasti` 104.
/// - `PyCodeObject`: `Include/code.h` at v3.8.18, `Include/cpython/code.h`
///   at v3.9.18: `co_flags` 36, `co_firstlineno` 40, `co_code` 48,
///   `co_filename` 104, `co_name` 112, `co_lnotab` 120.
/// - `struct _ts` (`Include/cpython/pystate.h`): `frame` 24.
/// - `_PyRuntimeState.gilstate.autoTSSkey`: 0x570 in 3.8
///   (`Include/internal/pycore_pystate.h` at v3.8.18), 0x248 in 3.9
///   (`Include/internal/pycore_runtime.h` at v3.9.18).
/// - `PyASCIIObject`, `PyCompactUnicodeObject`
///   (`Include/cpython/unicodeobject.h`): 48 and 72 bytes (with `wstr`).
const PY38: Layout = Layout {
    runtime_tss_key: 0x570,
    thread_frame: 24,
    cframe_current_frame: None,
    frame_code: 32,
    frame_previous: 24,
    frame_instruction: 104,
    frame_entry: None,
    instruction: InstructionField::ByteIndex,
    entry: PythonEntry::EveryFrame,
    code: CodeLayout {
        stamp: 36,
        file: 104,
        function: 112,
        first_line: 40,
        line_table: 120,
        line_format: LineFormat::Lnotab,
        bytecode: Bytecode::Object { code: 48 },
        header: 128,
    },
    unicode: UnicodeLayout {
        ascii_data: 48,
        compact_data: 72,
    },
};

const PY39: Layout = Layout {
    runtime_tss_key: 0x248,
    ..PY38
};

/// 3.10 (tag v3.10.13): `struct _frame` (`Include/cpython/frameobject.h`)
/// lost `f_stacktop`: `f_lasti` 96, now in code units. `PyCodeObject`
/// (`Include/cpython/code.h`) keeps 3.9's offsets, `co_linetable` taking
/// `co_lnotab`'s place (120). `gilstate.autoTSSkey` 0x248
/// (`Include/internal/pycore_runtime.h`).
const PY310: Layout = Layout {
    frame_instruction: 96,
    instruction: InstructionField::UnitIndex,
    code: CodeLayout {
        line_format: LineFormat::Ranges,
        ..PY38.code
    },
    ..PY39
};

/// 3.11 (tag v3.11.7):
/// - `struct _ts` (`Include/cpython/pystate.h`): `cframe` 0x38;
///   `_PyCFrame::current_frame` 8.
/// - `_PyInterpreterFrame` (`Include/internal/pycore_frame.h`): `f_code`
///   32, `previous` 48, `prev_instr` 56, `is_entry` 68.
/// - `PyCodeObject` (`Include/cpython/code.h`): `co_firstlineno` 72,
///   `co_nlocalsplus` 76, `co_filename` 112, `co_qualname` 128,
///   `co_linetable` 136, `co_code_adaptive` 184.
/// - `gilstate.autoTSSkey` 0x250 (`Include/internal/pycore_runtime.h`).
const PY311: Layout = Layout {
    runtime_tss_key: 0x250,
    thread_frame: 0x38,
    cframe_current_frame: Some(8),
    frame_code: 32,
    frame_previous: 48,
    frame_instruction: 56,
    frame_entry: Some(68),
    instruction: InstructionField::Pointer,
    entry: PythonEntry::Flag,
    code: CodeLayout {
        stamp: 72,
        file: 112,
        function: 128,
        first_line: 72,
        line_table: 136,
        line_format: LineFormat::Locations,
        bytecode: Bytecode::Inline { adaptive: 184 },
        header: 144,
    },
    unicode: PY38.unicode,
};

/// 3.12 (tag v3.12.1):
/// - `struct _ts`: `cframe` 0x38; `_PyCFrame::current_frame` 0.
/// - `_PyInterpreterFrame`: `f_code` 0, `previous` 8, `prev_instr` 56,
///   `owner` 70.
/// - `PyCodeObject`: `co_firstlineno` 68, `co_nlocalsplus` 72,
///   `co_filename` 112, `co_qualname` 128, `co_linetable` 136,
///   `co_code_adaptive` 192.
/// - `_PyRuntimeState::autoTSSkey` 0x608.
/// - `PyASCIIObject` 40, `PyCompactUnicodeObject` 56 bytes (no `wstr`).
const PY312: Layout = Layout {
    runtime_tss_key: 0x608,
    cframe_current_frame: Some(0),
    frame_code: 0,
    frame_previous: 8,
    frame_entry: Some(70),
    entry: PythonEntry::Shim,
    code: CodeLayout {
        stamp: 68,
        first_line: 68,
        bytecode: Bytecode::Inline { adaptive: 192 },
        ..PY311.code
    },
    unicode: UnicodeLayout {
        ascii_data: 40,
        compact_data: 56,
    },
    ..PY311
};

/// 3.13 (tag v3.13.0): no more `_PyCFrame`: `struct _ts::current_frame`
/// 0x48; `_PyInterpreterFrame::f_executable` 0 and `instr_ptr` 56, the
/// rest as 3.12; `co_code_adaptive` 200; `_PyRuntimeState::autoTSSkey`
/// 0x870.
const PY313: Layout = Layout {
    runtime_tss_key: 0x870,
    thread_frame: 0x48,
    cframe_current_frame: None,
    code: CodeLayout {
        bytecode: Bytecode::Inline { adaptive: 200 },
        ..PY312.code
    },
    ..PY312
};

impl Layout {
    pub(crate) fn of(version: PythonVersion) -> Result<&'static Self, PythonError> {
        match (version.major, version.minor) {
            (3, 8) => Ok(&PY38),
            (3, 9) => Ok(&PY39),
            (3, 10) => Ok(&PY310),
            (3, 11) => Ok(&PY311),
            (3, 12) => Ok(&PY312),
            (3, 13) => Ok(&PY313),
            _ => Err(PythonError::UnsupportedVersion { version }),
        }
    }
}

// Every field the walker reads of a frame lies within the bytes it reads.
const _: () = {
    let layouts = [PY38, PY39, PY310, PY311, PY312, PY313];
    let mut index = 0;
    while index < layouts.len() {
        let layout = layouts[index];
        assert!(layout.frame_code as usize + 8 <= INTERPRETER_FRAME_READ);
        assert!(layout.frame_previous as usize + 8 <= INTERPRETER_FRAME_READ);
        assert!(layout.frame_instruction as usize + 8 <= INTERPRETER_FRAME_READ);
        if let Some(entry) = layout.frame_entry {
            assert!((entry as usize) < INTERPRETER_FRAME_READ);
        }
        assert!(layout.code.stamp as usize + 8 <= layout.code.header);
        index += 1;
    }
};

/// What the BPF walker needs for a process running CPython `version`,
/// whose `_PyRuntime` and `PyCode_Type` are at `runtime_address` and
/// `code_type_address` (in the process) and whose glibc keeps pthread keys
/// at `tsd_first_block` from the thread pointer
/// ([`crate::libc::glibc_thread_specific_offset`]).
pub fn walker_layout(
    version: PythonVersion,
    runtime_address: u64,
    code_type_address: u64,
    tsd_first_block: u32,
) -> Result<PythonLayout, PythonError> {
    let layout = Layout::of(version)?;
    let instruction = match layout.instruction {
        InstructionField::ByteIndex | InstructionField::UnitIndex => PythonInstruction::Index,
        InstructionField::Pointer => PythonInstruction::Pointer,
    };
    Ok(PythonLayout {
        tss_key_address: runtime_address.wrapping_add(layout.runtime_tss_key),
        code_type: code_type_address,
        tsd_first_block,
        version: u16::from(version.major) << 8 | u16::from(version.minor),
        thread_frame: layout.thread_frame,
        cframe_current_frame: layout.cframe_current_frame.unwrap_or(NO_OFFSET),
        frame_code: layout.frame_code,
        frame_previous: layout.frame_previous,
        frame_instruction: layout.frame_instruction,
        frame_entry: layout.frame_entry.unwrap_or(NO_OFFSET),
        // The header is a few hundred bytes at most.
        code_stamp: layout.code.stamp as u16,
        instruction: instruction as u8,
        entry: layout.entry as u8,
        reserved: [0; 2],
    })
}
