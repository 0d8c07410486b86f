//! Where things are in each supported CRuby's structs (x86-64, the default
//! build: no `USE_RVARGC`, no debug checks), one table row per release.
//!
//! A release is added as a row: a `Layout` built from the previous one
//! with what moved (3.3 and 3.4 will move `RString`'s length to offset 16
//! for every string and its embedded bytes to 24, the native thread id
//! behind `rb_thread_t.nt`, and a class's path out of its instance
//! variables), and a line in [`layout`].

use agent_common::{INTERPRETER_FRAME_READ, NO_OFFSET, RubyLayout};

use super::{RubyError, RubyVersion, read::HEADER_BYTES};

/// `RBasic::flags`: the type is in the low five bits.
pub(crate) const TYPE_MASK: u64 = 0x1f;
pub(crate) const T_CLASS: u64 = 0x02;
pub(crate) const T_MODULE: u64 = 0x03;
pub(crate) const T_STRING: u64 = 0x05;
pub(crate) const T_ARRAY: u64 = 0x07;
pub(crate) const T_IMEMO: u64 = 0x1a;
/// `FL_SINGLETON` (`FL_USER0`): a class is an object's singleton class.
pub(crate) const FL_SINGLETON: u64 = 0x1000;
/// `imemo_type`: bits 12-15 of an imemo's flags.
pub(crate) const IMEMO_SHIFT: u32 = 12;
pub(crate) const IMEMO_MASK: u64 = 0xf;
pub(crate) const IMEMO_MENT: u64 = 6;
pub(crate) const IMEMO_ISEQ: u64 = 7;
/// `Qnil`.
pub(crate) const NIL: u64 = 0x08;

/// `VM_FRAME_MAGIC_*`: a frame's type, in its environment flags under
/// [`FRAME_MAGIC_MASK`].
pub(crate) const FRAME_MAGIC_MASK: u32 = 0x7fff_0001;
pub(crate) const FRAME_MAGIC_CFUNC: u32 = 0x5555_0001;
pub(crate) const FRAME_MAGIC_IFUNC: u32 = 0x6666_0001;
pub(crate) const FRAME_MAGIC_DUMMY: u32 = 0x7999_0001;

/// The execution context, thread and control frame fields the BPF walker
/// follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WalkerLayout {
    /// `rb_ractor_t.threads.running_ec` (3.0+); `None` when the global
    /// points to the execution context itself (2.x).
    pub running_context: Option<u16>,
    /// `rb_execution_context_t`: `vm_stack`, `vm_stack_size`, `cfp`,
    /// `thread_ptr`.
    pub context_stack: u16,
    pub context_stack_size: u16,
    pub context_frame: u16,
    pub context_thread: u16,
    /// `rb_thread_t.nt` (3.3+), `None` when the `pthread_t` is in the
    /// thread itself.
    pub thread_native: Option<u16>,
    /// The `pthread_t` (`thread_id`), in the thread or its native thread.
    pub native_thread_id: u16,
    /// `rb_control_frame_t`: its size, `pc`, `iseq`, `ep`.
    pub frame_size: u16,
    pub frame_pc: u16,
    pub frame_iseq: u16,
    pub frame_ep: u16,
}

/// `rb_iseq_t` and its `rb_iseq_constant_body`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IseqLayout {
    /// `rb_iseq_t.body`.
    pub body: u64,
    /// `body->iseq_size` (u32, in VALUEs) and `iseq_encoded`.
    pub size: u64,
    pub encoded: u64,
    /// `body->location`: `pathobj` (a String, or an Array [path,
    /// realpath]), `base_label`, `label` (Strings), `first_lineno` (a
    /// Fixnum).
    pub path: u64,
    pub base_label: u64,
    pub label: u64,
    pub first_line: u64,
    /// `body->insns_info`: `body` (entries), `positions` (u32s, or null
    /// once the succinct index is built), `size` (u32),
    /// `succ_index_table`.
    pub info_entries: u64,
    pub info_positions: u64,
    pub info_size: u64,
    pub info_succinct: u64,
    /// Bytes of the body read: all of the above.
    pub body_header: usize,
    /// `struct iseq_insn_info_entry`: its size and `line_no` (i32).
    pub entry_size: u64,
    pub entry_line: u64,
}

/// `struct RString`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StringLayout {
    /// `RSTRING_NOEMBED`: set, the bytes are on the heap.
    pub heap_flag: u64,
    /// `as.heap.len`, `as.heap.ptr`.
    pub heap_length: u64,
    pub heap_pointer: u64,
    /// Where the bytes of an embedded string start.
    pub embedded: u64,
    /// An embedded string's length: `RSTRING_EMBED_LEN_MASK` and its
    /// shift in the flags.
    pub embedded_length_mask: u64,
    pub embedded_length_shift: u32,
    /// Bytes of a String object: an embedded one's bytes end there.
    pub size: u64,
}

/// `struct RArray`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArrayLayout {
    /// `RARRAY_EMBED_FLAG`: set, the elements are in the object.
    pub embedded_flag: u64,
    pub embedded_length_mask: u64,
    pub embedded_length_shift: u32,
    pub embedded: u64,
    /// `as.heap.len`, `as.heap.ptr`.
    pub heap_length: u64,
    pub heap_pointer: u64,
    /// Bytes of an array object.
    pub size: u64,
}

/// Method entries, classes and their instance variable tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MethodLayout {
    /// `rb_method_entry_t`: `def`, `called_id`, `owner`; bytes read.
    pub entry_definition: u64,
    pub entry_called_id: u64,
    pub entry_owner: u64,
    pub entry_size: usize,
    /// `rb_method_definition_t.original_id`.
    pub definition_original_id: u64,
    /// `struct RClass.ptr` (`rb_classext_t *`), and its `iv_tbl`
    /// (`st_table *`).
    pub class_ext: u64,
    pub ext_ivars: u64,
    /// `st_table`: `entries_start`, `entries_bound`, `entries`; bytes
    /// read; the size of an entry (`{hash, key, record}`) and where its
    /// key and record are.
    pub table_start: u64,
    pub table_bound: u64,
    pub table_entries: u64,
    pub table_header: usize,
    pub table_entry_size: u64,
    pub table_entry_key: u64,
    pub table_entry_record: u64,
}

/// The symbol table (`ruby_global_symbols`) and IDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SymbolLayout {
    /// `rb_symbols_t`: `last_id` (u32, the last serial given out) and
    /// `ids` (an Array of Arrays).
    pub last_id: u64,
    pub ids: u64,
    /// `ID_ENTRY_UNIT`: IDs per chunk; `ID_ENTRY_SIZE`: VALUEs per ID
    /// (its String, its Symbol).
    pub ids_per_chunk: u64,
    pub values_per_id: u64,
    /// `tLAST_OP_ID`: an ID above it is `serial << shift | scope`, one at
    /// or below it is its own serial.
    pub last_operator: u64,
    pub serial_shift: u32,
    /// `struct RSymbol.id`, for the ID of a dynamic symbol.
    pub symbol_id: u64,
    /// `id__attached__`: a singleton class's ivar holding its object.
    pub attached: u64,
}

/// One release's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The symbol `context_global` is: `ruby_single_main_ractor` (3.0+)
    /// or `ruby_current_execution_context_ptr` (2.x).
    pub context_symbol: &'static str,
    pub walker: WalkerLayout,
    pub iseq: IseqLayout,
    pub string: StringLayout,
    pub array: ArrayLayout,
    pub method: MethodLayout,
    pub symbols: SymbolLayout,
}

/// 3.1 (measured with `offsetof` on Debian's 3.1.2 sources, x86-64):
/// `vm_core.h`, `iseq.h`, `method.h`, `internal/class.h`,
/// `include/ruby/internal/core/rstring.h` and `rarray.h`, `st.h`,
/// `symbol.h` (`rb_symbols_t`), `id.h` (`tLAST_OP_ID` 169,
/// `id__attached__` 3089).
const RUBY31: Layout = Layout {
    context_symbol: "ruby_single_main_ractor",
    walker: WalkerLayout {
        running_context: Some(520),
        context_stack: 0,
        context_stack_size: 8,
        context_frame: 16,
        context_thread: 48,
        thread_native: None,
        native_thread_id: 80,
        frame_size: 64,
        frame_pc: 0,
        frame_iseq: 16,
        frame_ep: 32,
    },
    iseq: IseqLayout {
        body: 16,
        size: 4,
        encoded: 8,
        path: 64,
        base_label: 72,
        label: 80,
        first_line: 88,
        info_entries: 120,
        info_positions: 128,
        info_size: 136,
        info_succinct: 144,
        body_header: 152,
        entry_size: 12,
        entry_line: 0,
    },
    string: StringLayout {
        heap_flag: 0x2000,
        heap_length: 16,
        heap_pointer: 24,
        embedded: 16,
        embedded_length_mask: 0x7c000,
        embedded_length_shift: 14,
        size: 40,
    },
    array: ArrayLayout {
        embedded_flag: 0x2000,
        embedded_length_mask: 0x18000,
        embedded_length_shift: 15,
        embedded: 16,
        heap_length: 16,
        heap_pointer: 32,
        size: 40,
    },
    method: MethodLayout {
        entry_definition: 16,
        entry_called_id: 24,
        entry_owner: 32,
        entry_size: 40,
        definition_original_id: 32,
        class_ext: 24,
        ext_ivars: 8,
        table_start: 32,
        table_bound: 40,
        table_entries: 48,
        table_header: 56,
        table_entry_size: 24,
        table_entry_key: 8,
        table_entry_record: 16,
    },
    symbols: SymbolLayout {
        last_id: 0,
        ids: 16,
        ids_per_chunk: 512,
        values_per_id: 2,
        last_operator: 169,
        serial_shift: 4,
        symbol_id: 32,
        attached: 3089,
    },
};

/// The layout of CRuby `version`: any patch release of a supported minor
/// version (they keep their structs).
pub(crate) fn layout(version: RubyVersion) -> Result<&'static Layout, RubyError> {
    match (version.major, version.minor) {
        (3, 1) => Ok(&RUBY31),
        _ => Err(RubyError::UnsupportedVersion { version }),
    }
}

// What the walker reads of a context and of a frame lies within the bytes
// it reads; what the namer reads of a body or a string within its header.
const _: () = {
    let layouts = [RUBY31];
    let mut index = 0;
    while index < layouts.len() {
        let walker = layouts[index].walker;
        let fields = [
            walker.context_stack,
            walker.context_stack_size,
            walker.context_frame,
            walker.context_thread,
            walker.frame_pc,
            walker.frame_iseq,
            walker.frame_ep,
        ];
        let mut field = 0;
        while field < fields.len() {
            assert!(fields[field] as usize + 8 <= INTERPRETER_FRAME_READ);
            field += 1;
        }
        assert!(walker.frame_size as usize <= INTERPRETER_FRAME_READ);
        let iseq = layouts[index].iseq;
        assert!(iseq.info_succinct as usize + 8 <= iseq.body_header);
        assert!(iseq.path as usize + 8 <= iseq.body_header);
        assert!(iseq.body_header <= 256);
        let method = layouts[index].method;
        assert!(method.entry_owner as usize + 8 <= method.entry_size);
        assert!(method.entry_size <= 64 && method.table_header <= 64);
        assert!(method.table_entries as usize + 8 <= method.table_header);
        let string = layouts[index].string;
        assert!(string.heap_pointer + 8 <= string.size);
        assert!(string.size as usize <= HEADER_BYTES);
        let array = layouts[index].array;
        assert!(array.heap_pointer + 8 <= array.size);
        assert!(array.size as usize <= HEADER_BYTES);
        index += 1;
    }
};

/// What the BPF walker needs for a process running CRuby `version`, whose
/// `context_global` ([`super::RubyObject::context_global`]) is at
/// `context_global_address` in the process.
pub fn walker_layout(
    version: RubyVersion,
    context_global_address: u64,
) -> Result<RubyLayout, RubyError> {
    let walker = layout(version)?.walker;
    Ok(RubyLayout {
        context_global: context_global_address,
        version: u16::from(version.major) << 8 | u16::from(version.minor),
        running_context: walker.running_context.unwrap_or(NO_OFFSET),
        context_stack: walker.context_stack,
        context_stack_size: walker.context_stack_size,
        context_frame: walker.context_frame,
        context_thread: walker.context_thread,
        thread_native: walker.thread_native.unwrap_or(NO_OFFSET),
        native_thread_id: walker.native_thread_id,
        frame_size: walker.frame_size,
        frame_pc: walker.frame_pc,
        frame_iseq: walker.frame_iseq,
        frame_ep: walker.frame_ep,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(major: u8, minor: u8, patch: u8) -> RubyVersion {
        RubyVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn ruby_3_1_walker_layout() {
        let walker = walker_layout(version(3, 1, 2), 0x7f00_1000).expect("supported");
        assert_eq!(
            walker,
            RubyLayout {
                context_global: 0x7f00_1000,
                version: 0x0301,
                running_context: 520,
                context_stack: 0,
                context_stack_size: 8,
                context_frame: 16,
                context_thread: 48,
                thread_native: NO_OFFSET,
                native_thread_id: 80,
                frame_size: 64,
                frame_pc: 0,
                frame_iseq: 16,
                frame_ep: 32,
            }
        );
        // Every 3.1 patch release, no other minor version.
        assert!(layout(version(3, 1, 7)).is_ok());
        for other in [version(3, 0, 6), version(3, 2, 0), version(2, 7, 8)] {
            assert!(matches!(
                walker_layout(other, 0),
                Err(RubyError::UnsupportedVersion { version }) if version == other
            ));
        }
    }
}
