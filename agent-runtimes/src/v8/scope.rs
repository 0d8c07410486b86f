//! The function name a ScopeInfo holds.
//!
//! Once a function is compiled, its SharedFunctionInfo holds a ScopeInfo
//! instead of its name. A ScopeInfo is a header (flags, parameter and
//! context local counts), the context locals' names and their infos, then
//! optional parts the flags select: the function variable (its name and
//! slot), the inferred name (`Module.load` for `Module.prototype.load =
//! function () {}`), positions, the outer scope. The flags' bit layout
//! changes between V8 releases and is not among the post-mortem
//! constants, but where the names start is (`scopeinfo_idx_first_vars`):
//! firn takes the first non-empty string of the three slots after the
//! locals, which are the function variable's name, its slot (a Smi) and
//! the inferred name when present, and otherwise Smis or oddballs. A slot
//! must hold a string object to be taken.

use std::sync::Arc;

use super::{
    Layout, NameError,
    heap::{instance_type, is_string, read_string, tagged_field},
};
use crate::Memory;

/// Up to this many context locals, their names are stored inline, one
/// slot each; beyond, in one hash table (V8's
/// `kScopeInfoMaxInlinedLocalNamesSize`, 75 since V8 9.4).
pub(crate) const MAX_INLINED_LOCAL_NAMES: u64 = 75;
/// More context locals than any function has; a larger count is not a
/// ScopeInfo firn reads.
pub(crate) const MAX_CONTEXT_LOCALS: u64 = 1 << 16;

/// The function's name, `None` when the scope holds none (anonymous
/// functions, scripts).
pub(crate) fn scope_info_name(
    memory: &mut dyn Memory,
    layout: &Layout,
    scope_info: u64,
) -> Result<Option<Arc<str>>, NameError> {
    let object = layout.tagging.untag(scope_info);
    let slot_size = u64::from(layout.tagging.tagged_size);
    let slot = |index: u64| layout.fields.heap_object_map + slot_size * (index + 1);
    let count = tagged_field(
        memory,
        layout,
        object,
        slot(layout.scope_info.context_local_count),
    )?;
    let locals = layout
        .tagging
        .smi(count)
        .and_then(|count| u64::try_from(count).ok())
        .filter(|&count| count <= MAX_CONTEXT_LOCALS)
        .ok_or(NameError::NoScopeName { object: scope_info })?;
    let names = if locals <= MAX_INLINED_LOCAL_NAMES {
        locals
    } else {
        1
    };
    let after_locals = layout.scope_info.first_vars + names + locals;
    for index in after_locals..after_locals + 3 {
        let value = tagged_field(memory, layout, object, slot(index))?;
        if !layout.tagging.is_heap_object(value) {
            continue;
        }
        if !is_string(layout, instance_type(memory, layout, value)?) {
            continue;
        }
        let name = read_string(memory, layout, value)?;
        if !name.is_empty() {
            return Ok(Some(name));
        }
    }
    Ok(None)
}
