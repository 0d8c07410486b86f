//! The offsets firn follows in a JVM, from its own tables: which fields of
//! which types, and where the statics are. A field the tables lack is an
//! error naming it.

use super::{stream::Coding, tables::VmTables};

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("the JVM's tables lack {what}")]
    Missing { what: String },
}

/// Where a code blob's instructions are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeBounds {
    /// JDK 8 to 22: `_code_begin` and `_code_end` hold addresses.
    Addresses { begin: u64, end: u64 },
    /// JDK 23 on: `_code_offset` and `_data_offset` from the blob's start.
    Offsets { code: u64, data: u64 },
}

/// Where an nmethod's debug information is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NmethodLayout {
    /// `Method*` of the compiled method.
    pub method: u64,
    /// `_comp_level`: 1 to 3 C1, 4 C2; and its width (an int to JDK 22,
    /// a byte from JDK 23).
    pub comp_level: (u64, usize),
    /// `_compile_id`: unique per compilation (an int).
    pub compile_id: u64,
    pub debug: DebugPlacement,
}

/// Where an nmethod's pc descs, scopes data and metadata are: which of
/// the two the tables describe decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugPlacement {
    /// Up to JDK 22: all in the blob, in the order metadata, scopes data,
    /// pc descs, dependencies.
    InBlob {
        /// `_scopes_data_begin`: the address of the scopes data.
        scopes_data_begin: u64,
        /// `_scopes_pcs_offset`, `_dependencies_offset`: the `PcDesc`
        /// array, from the blob's start.
        scopes_pcs_offset: u64,
        dependencies_offset: u64,
        /// `_metadata_offset`: the metadata array (the `Method*`s of
        /// inlined scopes), from the blob's start.
        metadata_offset: u64,
    },
    /// JDK 25: pc descs and scopes data in the nmethod's immutable data
    /// (`nmethod::_immutable_data`, on the C heap), the metadata in the
    /// blob's mutable data (`CodeBlob::_mutable_data`) after its
    /// relocations.
    Separate {
        immutable_data: u64,
        immutable_data_size: u64,
        /// `_scopes_pcs_offset`, `_scopes_data_offset`: from the
        /// immutable data's start; the scopes data runs to its end at
        /// most.
        scopes_pcs_offset: u64,
        scopes_data_offset: u64,
        mutable_data: u64,
        mutable_data_size: u64,
        relocation_size: u64,
    },
}

impl DebugPlacement {
    /// The header offsets read (for how much of a header to read).
    pub(crate) fn offsets(&self) -> [u64; 7] {
        match *self {
            Self::InBlob {
                scopes_data_begin,
                scopes_pcs_offset,
                dependencies_offset,
                metadata_offset,
            } => [
                scopes_data_begin,
                scopes_pcs_offset,
                dependencies_offset,
                metadata_offset,
                0,
                0,
                0,
            ],
            Self::Separate {
                immutable_data,
                immutable_data_size,
                scopes_pcs_offset,
                scopes_data_offset,
                mutable_data,
                mutable_data_size,
                relocation_size,
            } => [
                immutable_data,
                immutable_data_size,
                scopes_pcs_offset,
                scopes_data_offset,
                mutable_data,
                mutable_data_size,
                relocation_size,
            ],
        }
    }
}

/// Offsets of the fields firn reads, by type, and the statics it starts
/// from (run-time addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `Abstract_VM_Version::_vm_major_version` (an int).
    pub vm_major_version: u64,
    /// `Abstract_VM_Version::_s_vm_release` (a `const char*`).
    pub vm_release: u64,

    /// `CodeCache::_heaps`: a `GrowableArray<CodeHeap*>*`.
    pub code_heaps: u64,
    /// `CodeCache::_low_bound`, `_high_bound`: addresses of the bounds.
    pub code_low_bound: u64,
    pub code_high_bound: u64,
    pub growable_array_len: u64,
    pub growable_array_data: u64,
    pub code_heap_memory: u64,
    pub code_heap_segmap: u64,
    pub code_heap_log2_segment_size: u64,
    pub virtual_space_low: u64,
    pub virtual_space_high: u64,
    pub virtual_space_high_boundary: u64,
    /// `sizeof(HeapBlock)`: a blob starts this far past its block.
    pub heap_block_size: u64,
    /// `HeapBlock::Header::_used` from the block's start.
    pub heap_block_used: u64,
    /// `HeapBlock::Header::_length` (in segments) and its width.
    pub heap_block_length: (u64, usize),

    /// `AbstractInterpreter::_code`: the `StubQueue*` of the template
    /// interpreter, whose buffer is all interpreter code.
    pub interpreter_code: u64,
    pub stub_queue_buffer: u64,
    pub stub_queue_limit: u64,
    /// `StubRoutines::_call_stub_return_address`: where Java code returns
    /// to the call stub, the way back into native code.
    pub call_stub_return_address: u64,

    pub code_blob_name: u64,
    pub code_blob_size: u64,
    pub code_blob_frame_size: u64,
    /// `_frame_complete_offset` and its width (an int, 16 bits from JDK 23).
    pub code_blob_frame_complete: (u64, usize),
    pub code_bounds: CodeBounds,
    /// `CodeBlob::_kind` (JDK 23 on) and the value of an nmethod there;
    /// without it, nmethods are told by their names.
    pub code_blob_kind: Option<(u64, u64)>,
    /// `sizeof(CodeBlob)`: a blob is at least this long.
    pub code_blob_header: u64,
    pub nmethod: NmethodLayout,

    pub method_const_method: u64,
    /// `Method::_access_flags` and its width (4 bytes to JDK 21, 2 from
    /// JDK 22).
    pub method_access_flags: (u64, usize),
    /// `sizeof(Method)`.
    pub method_size: u64,
    pub const_method_constants: u64,
    /// `ConstMethod::_flags` and its width (16 bits, 32 from JDK 21).
    pub const_method_flags: (u64, usize),
    pub const_method_code_size: u64,
    /// `_constMethod_size`: the whole `ConstMethod` in words.
    pub const_method_total_size: u64,
    pub const_method_name_index: u64,
    pub const_method_signature_index: u64,
    /// `sizeof(ConstMethod)`: the bytecodes follow it.
    pub const_method_size: u64,
    /// The flag of `_flags` saying a line number table follows the code.
    pub has_line_number_table: u64,
    pub constant_pool_holder: u64,
    pub constant_pool_length: u64,
    pub constant_pool_source_file: u64,
    /// `sizeof(ConstantPool)`: its slots follow it.
    pub constant_pool_size: u64,
    pub klass_name: u64,
    /// `InstanceKlass::_constants`: a class's own constant pool.
    pub instance_klass_constants: u64,
    pub symbol_length: u64,
    pub symbol_body: u64,

    /// Word offsets from rbp of an interpreted frame's slots.
    pub interpreter_frame: InterpreterFrame,
    /// How line number tables and debug information are coded.
    pub coding: Coding,
}

/// An interpreted frame's slots, in words from its rbp (x86-64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpreterFrame {
    /// The caller's stack pointer as it called (before the callee's
    /// arguments were popped): what a compiled caller's frame size counts
    /// from.
    pub sender_sp: i64,
    pub method: i64,
    pub bcp: i64,
}

/// The x86-64 slots of `frame_x86.hpp`, which the tables of JDK 17 do not
/// list (later ones list the sender's sp alone). They have not changed
/// from JDK 8 to 25; the namer checks the `Method*` it finds there.
const INTERPRETER_FRAME_X86_64: InterpreterFrame = InterpreterFrame {
    sender_sp: -1,
    method: -3,
    bcp: -8,
};

struct Lookup<'a> {
    tables: &'a VmTables,
    missing: Vec<String>,
}

/// Largest field offset or type size believed: the JVM's types are a
/// few hundred bytes; firn allocates what a size says to read a header.
const MAX_OFFSET: u64 = 1 << 16;

impl Lookup<'_> {
    fn offset(&mut self, type_name: &str, field: &str) -> u64 {
        let offset = self.tables.offset(type_name, field).unwrap_or_else(|| {
            self.missing.push(format!("{type_name}::{field}"));
            0
        });
        self.bounded(offset, || format!("{type_name}::{field}"))
    }

    /// `value`, or 0 and an error if it is no plausible offset or size.
    fn bounded(&mut self, value: u64, what: impl FnOnce() -> String) -> u64 {
        if value <= MAX_OFFSET {
            return value;
        }
        self.missing
            .push(format!("a plausible {} ({value:#x})", what()));
        0
    }

    /// The first of several names a field went by across JDKs.
    fn offset_of(&mut self, candidates: &[(&str, &str)]) -> u64 {
        for (type_name, field) in candidates {
            if let Some(offset) = self.tables.offset(type_name, field) {
                return self.bounded(offset, || format!("{type_name}::{field}"));
            }
        }
        let (type_name, field) = candidates[0];
        self.missing.push(format!("{type_name}::{field}"));
        0
    }

    fn static_address(&mut self, type_name: &str, field: &str) -> u64 {
        self.tables
            .static_address(type_name, field)
            .unwrap_or_else(|| {
                self.missing.push(format!("static {type_name}::{field}"));
                0
            })
    }

    fn size(&mut self, type_name: &str) -> u64 {
        let size = self.tables.size(type_name).unwrap_or_else(|| {
            self.missing.push(format!("the size of {type_name}"));
            0
        });
        self.bounded(size, || format!("size of {type_name}"))
    }

    fn constant_of(&mut self, candidates: &[&str]) -> i64 {
        for name in candidates {
            if let Some(value) = self.tables.constant(name) {
                return value;
            }
        }
        self.missing.push(format!("the constant {}", candidates[0]));
        0
    }

    /// The width of an integer field from its type's size: a type the
    /// tables list without a size is taken for an int.
    fn width(&self, type_name: &str, field: &str) -> usize {
        let type_string = self.tables.type_string(type_name, field);
        match type_string.and_then(|name| self.tables.size(name)) {
            Some(size @ (1 | 2 | 4 | 8)) => size as usize,
            _ => 4,
        }
    }
}

impl Layout {
    #[expect(
        clippy::too_many_lines,
        reason = "one lookup per field, in the order of the struct"
    )]
    pub fn new(tables: &VmTables) -> Result<Self, LayoutError> {
        let mut l = Lookup {
            tables,
            missing: Vec::new(),
        };
        let code_bounds = match (
            tables.offset("CodeBlob", "_code_begin"),
            tables.offset("CodeBlob", "_code_end"),
        ) {
            (Some(begin), Some(end)) => CodeBounds::Addresses {
                begin: l.bounded(begin, || "CodeBlob::_code_begin".into()),
                end: l.bounded(end, || "CodeBlob::_code_end".into()),
            },
            _ => CodeBounds::Offsets {
                code: l.offset("CodeBlob", "_code_offset"),
                data: l.offset("CodeBlob", "_data_offset"),
            },
        };
        let debug = if tables.offset("nmethod", "_immutable_data").is_some() {
            DebugPlacement::Separate {
                immutable_data: l.offset("nmethod", "_immutable_data"),
                immutable_data_size: l.offset("nmethod", "_immutable_data_size"),
                scopes_pcs_offset: l.offset("nmethod", "_scopes_pcs_offset"),
                scopes_data_offset: l.offset("nmethod", "_scopes_data_offset"),
                mutable_data: l.offset("CodeBlob", "_mutable_data"),
                mutable_data_size: l.offset("CodeBlob", "_mutable_data_size"),
                relocation_size: l.offset("CodeBlob", "_relocation_size"),
            }
        } else {
            DebugPlacement::InBlob {
                scopes_data_begin: l.offset("CompiledMethod", "_scopes_data_begin"),
                scopes_pcs_offset: l.offset("nmethod", "_scopes_pcs_offset"),
                dependencies_offset: l.offset("nmethod", "_dependencies_offset"),
                metadata_offset: l.offset("nmethod", "_metadata_offset"),
            }
        };
        let nmethod = NmethodLayout {
            method: l.offset_of(&[("CompiledMethod", "_method"), ("nmethod", "_method")]),
            comp_level: (
                l.offset("nmethod", "_comp_level"),
                l.width("nmethod", "_comp_level"),
            ),
            compile_id: l.offset("nmethod", "_compile_id"),
            debug,
        };
        let code_blob_kind = tables.offset("CodeBlob", "_kind").map(|kind| {
            (
                l.bounded(kind, || "CodeBlob::_kind".into()),
                l.constant_of(&["CodeBlobKind::Nmethod"]) as u64,
            )
        });
        let frame_complete = l.offset("CodeBlob", "_frame_complete_offset");
        let flags = l.offset_of(&[("ConstMethod", "_flags"), ("ConstMethod", "_flags._flags")]);
        let flags_width = if tables.offset("ConstMethod", "_flags").is_some() {
            l.width("ConstMethod", "_flags")
        } else {
            l.width("ConstMethod", "_flags._flags")
        };
        let layout = Layout {
            vm_major_version: l.static_address("Abstract_VM_Version", "_vm_major_version"),
            vm_release: l.static_address("Abstract_VM_Version", "_s_vm_release"),
            code_heaps: l.static_address("CodeCache", "_heaps"),
            code_low_bound: l.static_address("CodeCache", "_low_bound"),
            code_high_bound: l.static_address("CodeCache", "_high_bound"),
            growable_array_len: l.offset("GrowableArrayBase", "_len"),
            growable_array_data: l.offset("GrowableArray<int>", "_data"),
            code_heap_memory: l.offset("CodeHeap", "_memory"),
            code_heap_segmap: l.offset("CodeHeap", "_segmap"),
            code_heap_log2_segment_size: l.offset("CodeHeap", "_log2_segment_size"),
            virtual_space_low: l.offset("VirtualSpace", "_low"),
            virtual_space_high: l.offset("VirtualSpace", "_high"),
            virtual_space_high_boundary: l.offset("VirtualSpace", "_high_boundary"),
            heap_block_size: l.size("HeapBlock"),
            heap_block_used: l.offset("HeapBlock", "_header")
                + l.offset("HeapBlock::Header", "_used"),
            heap_block_length: (
                l.offset("HeapBlock", "_header") + l.offset("HeapBlock::Header", "_length"),
                l.width("HeapBlock::Header", "_length"),
            ),
            interpreter_code: l.static_address("AbstractInterpreter", "_code"),
            stub_queue_buffer: l.offset("StubQueue", "_stub_buffer"),
            stub_queue_limit: l.offset("StubQueue", "_buffer_limit"),
            call_stub_return_address: l.static_address("StubRoutines", "_call_stub_return_address"),
            code_blob_name: l.offset("CodeBlob", "_name"),
            code_blob_size: l.offset("CodeBlob", "_size"),
            code_blob_frame_size: l.offset("CodeBlob", "_frame_size"),
            code_blob_frame_complete: (
                frame_complete,
                l.width("CodeBlob", "_frame_complete_offset"),
            ),
            code_bounds,
            code_blob_kind,
            code_blob_header: l.size("CodeBlob"),
            nmethod,
            method_const_method: l.offset("Method", "_constMethod"),
            method_access_flags: (
                l.offset("Method", "_access_flags"),
                l.width("Method", "_access_flags"),
            ),
            method_size: l.size("Method"),
            const_method_constants: l.offset("ConstMethod", "_constants"),
            const_method_flags: (flags, flags_width),
            const_method_code_size: l.offset("ConstMethod", "_code_size"),
            const_method_total_size: l.offset("ConstMethod", "_constMethod_size"),
            const_method_name_index: l.offset("ConstMethod", "_name_index"),
            const_method_signature_index: l.offset("ConstMethod", "_signature_index"),
            const_method_size: l.size("ConstMethod"),
            has_line_number_table: l.constant_of(&[
                "ConstMethod::_has_linenumber_table",
                "ConstMethodFlags::_misc_has_linenumber_table",
            ]) as u64,
            constant_pool_holder: l.offset("ConstantPool", "_pool_holder"),
            constant_pool_length: l.offset("ConstantPool", "_length"),
            constant_pool_source_file: l.offset("ConstantPool", "_source_file_name_index"),
            constant_pool_size: l.size("ConstantPool"),
            klass_name: l.offset("Klass", "_name"),
            instance_klass_constants: l.offset("InstanceKlass", "_constants"),
            symbol_length: l.offset("Symbol", "_length"),
            symbol_body: l.offset("Symbol", "_body"),
            coding: match tables.major_version() {
                Some(major) => Coding::of_version(major),
                None => {
                    l.missing.push("the JVM's major version".to_owned());
                    Coding::Pack200
                }
            },
            interpreter_frame: InterpreterFrame {
                sender_sp: tables
                    .constant("frame::interpreter_frame_sender_sp_offset")
                    .unwrap_or(INTERPRETER_FRAME_X86_64.sender_sp),
                method: tables
                    .constant("frame::interpreter_frame_method_offset")
                    .unwrap_or(INTERPRETER_FRAME_X86_64.method),
                bcp: tables
                    .constant("frame::interpreter_frame_bcp_offset")
                    .unwrap_or(INTERPRETER_FRAME_X86_64.bcp),
            },
        };
        let slots = layout.interpreter_frame;
        if [slots.sender_sp, slots.method, slots.bcp]
            .iter()
            .any(|words| !(-64..=64).contains(words))
        {
            l.missing
                .push(format!("plausible interpreter frame slots ({slots:?})"));
        }
        match l.missing.is_empty() {
            true => Ok(layout),
            false => Err(LayoutError::Missing {
                what: l.missing.join(", "),
            }),
        }
    }
}
