//! Where things are in each supported CRuby's structs (x86-64, Debian's
//! builds: no debug checks, no YJIT), one table row per release
//! (`releases.rs`).
//!
//! A release is added as a row: a `Layout` built from the previous one
//! with what moved, and a line in [`layout`]. What a release has that
//! another has not is an `Option` or an enum here, so the namer takes
//! each release's way explicitly.

use agent_common::{INTERPRETER_FRAME_READ, NO_OFFSET, RubyLayout};

use super::{
    RubyError, RubyVersion,
    read::HEADER_BYTES,
    releases::{RUBY27, RUBY31, RUBY33, RUBY34},
};

/// `RBasic::flags`: the type is in the low five bits.
pub(crate) const TYPE_MASK: u64 = 0x1f;
pub(crate) const T_CLASS: u64 = 0x02;
pub(crate) const T_MODULE: u64 = 0x03;
pub(crate) const T_STRING: u64 = 0x05;
pub(crate) const T_ARRAY: u64 = 0x07;
pub(crate) const T_IMEMO: u64 = 0x1a;
/// `imemo_type`: bits 12-15 of an imemo's flags.
pub(crate) const IMEMO_SHIFT: u32 = 12;
pub(crate) const IMEMO_MASK: u64 = 0xf;
pub(crate) const IMEMO_MENT: u64 = 6;
pub(crate) const IMEMO_ISEQ: u64 = 7;

/// `VM_FRAME_MAGIC_*`: a frame's type, in its environment flags under
/// [`FRAME_MAGIC_MASK`] (the same values from 2.7 to 3.4).
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

/// How `body->location.first_lineno` holds the first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstLine {
    /// A VALUE, a Fixnum (`n << 1 | 1`): until 3.1.
    Fixnum,
    /// An `int`: 3.2+.
    Int,
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
    /// realpath]), `base_label`, `label` (Strings), `first_lineno`.
    pub path: u64,
    pub base_label: u64,
    pub label: u64,
    pub first_line: u64,
    pub first_line_kind: FirstLine,
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
    /// `len` (`as.heap.len` in 3.1), `as.heap.ptr`.
    pub heap_length: u64,
    pub heap_pointer: u64,
    /// Where the bytes of an embedded string start.
    pub embedded: u64,
    /// An embedded string's length in its flags (`RSTRING_EMBED_LEN_MASK`
    /// and its shift), until 3.1; `None`: it is in `len`, as a heap
    /// string's (3.2+).
    pub embedded_length_flags: Option<(u64, u32)>,
    /// Bytes of a String object at most (its heap slot): an embedded
    /// one's bytes end there. 40 until 3.1; with variable width
    /// allocation (3.2+) the largest slot, 640.
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
    /// Bytes of an array object at most (as [`StringLayout::size`]).
    pub size: u64,
}

/// Method entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MethodLayout {
    /// `rb_method_entry_t`: `def`, `called_id`, `owner`; bytes read.
    pub entry_definition: u64,
    pub entry_called_id: u64,
    pub entry_owner: u64,
    pub entry_size: usize,
    /// `rb_method_definition_t.original_id`.
    pub definition_original_id: u64,
}

/// Classes: which is a singleton class, and where a class keeps its path
/// and a singleton class its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassLayout {
    /// `FL_SINGLETON`: `FL_USER0` until 3.3, `FL_USER1` in 3.4.
    pub singleton_flag: u64,
    pub names: ClassNames,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClassNames {
    /// Instance variables: `__classpath__` (only once the path is
    /// permanent) and `__attached__` (until 3.1).
    Ivars(IvarLayout),
    /// Fields of `rb_classext_t` (3.2+).
    Fields(ClassFields),
}

/// A class's instance variables: its `rb_classext_t` and that one's
/// `iv_tbl` (`st_table *`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IvarLayout {
    /// `struct RClass.ptr` (`rb_classext_t *`), and its `iv_tbl`.
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
    /// `id__attached__`: a singleton class's ivar holding its object.
    pub attached: u64,
}

/// `rb_classext_t`, in the class's own slot after `struct RClass`;
/// offsets from the class's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassFields {
    /// `classpath`: a String, or 0 for an anonymous class.
    pub path: u64,
    /// The byte and bit of `permanent_classpath`: a path that is not
    /// permanent (a class under an anonymous one) is not shown, as Ruby's
    /// backtraces do not.
    pub permanent_byte: u64,
    pub permanent_bit: u8,
    /// `as.singleton_class.attached_object`.
    pub attached: u64,
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
}

/// One release's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The symbol `context_global` is: `ruby_single_main_ractor` (3.0+)
    /// or `ruby_current_execution_context_ptr` (2.x).
    pub context_symbol: &'static str,
    /// `Qnil`: 0x08 until 3.1, 0x04 since 3.2.
    pub nil: u64,
    pub walker: WalkerLayout,
    pub iseq: IseqLayout,
    pub string: StringLayout,
    pub array: ArrayLayout,
    pub method: MethodLayout,
    pub class: ClassLayout,
    pub symbols: SymbolLayout,
}

/// The layout of CRuby `version`: any patch release of a supported minor
/// version (they keep their structs).
pub(crate) fn layout(version: RubyVersion) -> Result<&'static Layout, RubyError> {
    match (version.major, version.minor) {
        (2, 7) => Ok(&RUBY27),
        (3, 1) => Ok(&RUBY31),
        (3, 3) => Ok(&RUBY33),
        (3, 4) => Ok(&RUBY34),
        _ => Err(RubyError::UnsupportedVersion { version }),
    }
}

// What the walker reads of a context and of a frame lies within the bytes
// it reads; what the namer reads of a body or a string within its header.
const _: () = {
    let layouts = [RUBY27, RUBY31, RUBY33, RUBY34];
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
        assert!(method.entry_size <= 64);
        if let ClassNames::Ivars(ivars) = layouts[index].class.names {
            assert!(ivars.table_header <= 64);
            assert!(ivars.table_entries as usize + 8 <= ivars.table_header);
        }
        // A String's or an Array's header read ahead holds its fields.
        let string = layouts[index].string;
        assert!(string.heap_pointer as usize + 8 <= HEADER_BYTES);
        assert!(string.embedded as usize <= HEADER_BYTES);
        assert!(string.size as usize >= HEADER_BYTES);
        let array = layouts[index].array;
        assert!(array.heap_pointer as usize + 8 <= HEADER_BYTES);
        assert!(array.size as usize >= HEADER_BYTES);
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
        for other in [
            version(3, 0, 6),
            version(3, 2, 0),
            version(2, 6, 10),
            version(3, 5, 0),
            version(4, 0, 0),
        ] {
            assert!(matches!(
                walker_layout(other, 0),
                Err(RubyError::UnsupportedVersion { version }) if version == other
            ));
        }
    }

    #[test]
    fn ruby_3_3_and_3_4_walker_layouts() {
        for (minor, patch) in [(3, 8), (4, 11)] {
            let walker = walker_layout(version(3, minor, patch), 0x7f00_2000).expect("supported");
            assert_eq!(
                walker,
                RubyLayout {
                    context_global: 0x7f00_2000,
                    version: 0x0300 | u16::from(minor),
                    running_context: 384,
                    context_stack: 0,
                    context_stack_size: 8,
                    context_frame: 16,
                    context_thread: 48,
                    thread_native: 40,
                    native_thread_id: 16,
                    frame_size: 56,
                    frame_pc: 0,
                    frame_iseq: 16,
                    frame_ep: 32,
                }
            );
        }
        // What differs between the two: the singleton flag, tLAST_OP_ID.
        let (ruby33, ruby34) = (
            layout(version(3, 3, 0)).expect("3.3"),
            layout(version(3, 4, 0)).expect("3.4"),
        );
        assert_eq!(
            (ruby33.class.singleton_flag, ruby34.class.singleton_flag),
            (0x1000, 0x2000)
        );
        assert_eq!(
            (ruby33.symbols.last_operator, ruby34.symbols.last_operator),
            (169, 170)
        );
        assert_eq!(
            Layout {
                class: ruby33.class,
                symbols: ruby33.symbols,
                ..*ruby34
            },
            *ruby33
        );
    }
}
