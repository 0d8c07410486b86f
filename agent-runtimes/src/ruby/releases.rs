//! The table of [`Layout`]s, one row per supported release, each measured
//! with `offsetof` (and `sizeof`, and the values of the enums and flags)
//! by `fixtures/ruby/layout-probe.c`, compiled in that release's
//! configured Debian source tree (`./configure --enable-shared
//! --disable-yjit`, the options of Debian's `rules` that touch a layout),
//! and checked against the real libruby's code where the code shows it
//! (`tLAST_OP_ID` in `rb_id2str`).

use super::layout::{
    ArrayLayout, ClassFields, ClassLayout, ClassNames, FirstLine, IseqLayout, IvarLayout, Layout,
    MethodLayout, StringLayout, SymbolLayout, WalkerLayout,
};

/// 2.7 (Debian 11's 2.7.4, `ruby2.7` 2.7.4-1+deb11u1). What differs from
/// 3.1: no ractor, the running execution context is the global
/// `ruby_current_execution_context_ptr` itself; `thread_ptr` (56),
/// `rb_thread_t.thread_id` (72); no `jit_return` (the control frame is
/// 56 bytes); no `node_id` in `iseq_insn_info_entry` (8 bytes);
/// `tLAST_OP_ID` 168 (`cmp $0xa8` in `rb_id2str`), `id__attached__`
/// 3073. The iseq body, strings, arrays, method entries, classes' instance
/// variables and the symbol table are where 3.1 has them.
pub(super) const RUBY27: Layout = Layout {
    context_symbol: "ruby_current_execution_context_ptr",
    walker: WalkerLayout {
        running_context: None,
        context_thread: 56,
        native_thread_id: 72,
        frame_size: 56,
        ..RUBY31.walker
    },
    iseq: IseqLayout {
        entry_size: 8,
        ..RUBY31.iseq
    },
    class: ClassLayout {
        names: ClassNames::Ivars(IvarLayout {
            attached: 3073,
            ..RUBY31_IVARS
        }),
        ..RUBY31.class
    },
    symbols: SymbolLayout {
        last_operator: 168,
        ..RUBY31.symbols
    },
    ..RUBY31
};

/// 3.1's instance variable tables, as 2.7's.
const RUBY31_IVARS: IvarLayout = IvarLayout {
    class_ext: 24,
    ext_ivars: 8,
    table_start: 32,
    table_bound: 40,
    table_entries: 48,
    table_header: 56,
    table_entry_size: 24,
    table_entry_key: 8,
    table_entry_record: 16,
    attached: 3089,
};

/// 3.1 (Debian 12's 3.1.2): `vm_core.h`, `iseq.h`, `method.h`,
/// `internal/class.h`, `include/ruby/internal/core/rstring.h` and
/// `rarray.h`, `st.h`, `symbol.h` (`rb_symbols_t`), `id.h` (`tLAST_OP_ID`
/// 169, `id__attached__` 3089).
pub(super) const RUBY31: Layout = Layout {
    context_symbol: "ruby_single_main_ractor",
    nil: 0x08,
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
        first_line_kind: FirstLine::Fixnum,
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
        embedded_length_flags: Some((0x7c000, 14)),
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
    },
    class: ClassLayout {
        singleton_flag: 0x1000,
        names: ClassNames::Ivars(RUBY31_IVARS),
    },
    symbols: SymbolLayout {
        last_id: 0,
        ids: 16,
        ids_per_chunk: 512,
        values_per_id: 2,
        last_operator: 169,
        serial_shift: 4,
        symbol_id: 32,
    },
};

/// 3.3 (Debian 13's 3.3.8, `ruby3.3` 3.3.8-2). What moved since 3.1:
/// special constants (`Qnil` 0x04); `running_ec` (384); the `pthread_t`
/// behind `rb_thread_t.nt` (`struct rb_native_thread.thread_id`); the
/// control frame lost `__bp__` (56 bytes); `first_lineno` is an int and
/// `insns_info` 8 bytes earlier; every String's length is `len` (16) and
/// embedded bytes start at 24; embedded Arrays' length is 7 bits; a
/// class's `rb_classext_t` lies in its slot after `struct RClass` (32
/// bytes) and holds its path (`classpath`, `permanent_classpath`) and a
/// singleton class's object (`attached_object`). The same: the execution
/// context, the iseq header, method entries, the symbol table, the ID
/// scheme (`tLAST_OP_ID` 169, `cmp $0xa9` in `rb_id2str`), the frame
/// magic and environment flags.
pub(super) const RUBY33: Layout = Layout {
    context_symbol: "ruby_single_main_ractor",
    nil: 0x04,
    walker: WalkerLayout {
        running_context: Some(384),
        thread_native: Some(40),
        native_thread_id: 16,
        frame_size: 56,
        ..RUBY31.walker
    },
    iseq: IseqLayout {
        first_line_kind: FirstLine::Int,
        info_entries: 112,
        info_positions: 120,
        info_size: 128,
        info_succinct: 136,
        body_header: 144,
        ..RUBY31.iseq
    },
    string: StringLayout {
        heap_flag: 0x2000,
        heap_length: 16,
        heap_pointer: 24,
        embedded: 24,
        embedded_length_flags: None,
        size: 640,
    },
    array: ArrayLayout {
        embedded_length_mask: 0x3f_8000,
        size: 640,
        ..RUBY31.array
    },
    method: RUBY31.method,
    class: ClassLayout {
        singleton_flag: 0x1000,
        names: ClassNames::Fields(ClassFields {
            path: 152,
            permanent_byte: 149,
            permanent_bit: 0x01,
            attached: 128,
        }),
    },
    symbols: RUBY31.symbols,
};

/// 3.4 (measured on Debian's 3.4.5 source, `ruby3.4` 3.4.5-1~exp1; the
/// chroots run experimental's 3.4.11, whose source the archive no longer
/// serves: its `rb_id2str` compares with `tLAST_OP_ID` 170 as 3.4.5's
/// does, and its captures name the chain). What moved since 3.3:
/// `FL_SINGLETON` is `FL_USER1` (0x2000), `tLAST_OP_ID` 170.
pub(super) const RUBY34: Layout = Layout {
    class: ClassLayout {
        singleton_flag: 0x2000,
        ..RUBY33.class
    },
    symbols: SymbolLayout {
        last_operator: 170,
        ..RUBY33.symbols
    },
    ..RUBY33
};
