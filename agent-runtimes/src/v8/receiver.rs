//! The class a method was called on, for naming it `Class.method` as V8's
//! stack traces do (`at Ledger.post`). A function's SharedFunctionInfo
//! does not know its class (V8's profiler names a class method `post`),
//! but the frame holds the receiver, `this`, as of the sample: an instance
//! of a class (a plain JSObject) has the class's constructor in its map,
//! and a static method's receiver is the class itself.
//!
//! Only classes and constructor functions of scripts count: the receiver
//! of a function called on an object literal, on the global object or on
//! nothing (`undefined` in strict code) names no class, and the function
//! keeps the name V8's profiler gives it.
//!
//! The answer is cached by the receiver's map and the map's constructor
//! field, both read live: the class follows from that pair alone, so an
//! object that moved and left another at the address is looked up by what
//! is there now. Two reads per frame on a hit.

use std::sync::Arc;

use agent_cache::ByteBoundedCache;

use super::{
    Layout, NameError, Receivers,
    heap::{instance_type, tagged_field},
};
use crate::Memory;

/// Bytes of cached classes per process.
pub(crate) const CLASS_CACHE_BYTES: usize = 256 << 10;
/// Maps derived from maps (each added property makes one) are followed
/// back this far to the one that holds the constructor.
const MAX_BACK_POINTERS: usize = 64;

/// The class of a receiver, by (map, map's constructor field); `None`
/// cached too: most receivers have none.
pub(crate) type ClassCache = ByteBoundedCache<(u64, u64), Option<Arc<str>>>;

/// The receiver's map and its constructor field, read live.
pub(crate) fn class_key(
    memory: &mut dyn Memory,
    layout: &Layout,
    receivers: &Receivers,
    receiver: u64,
) -> Result<Option<(u64, u64)>, NameError> {
    if !layout.tagging.is_heap_object(receiver) {
        return Ok(None);
    }
    let map = tagged_field(
        memory,
        layout,
        layout.tagging.untag(receiver),
        layout.fields.heap_object_map,
    )?;
    if !layout.tagging.is_heap_object(map) {
        return Ok(None);
    }
    let constructor = tagged_field(
        memory,
        layout,
        layout.tagging.untag(map),
        receivers.map_constructor,
    )?;
    Ok(Some((map, constructor)))
}

/// The JSFunction whose class the receiver is an instance of (or which is
/// the receiver, for a static method), checked object by object; `None`
/// when the receiver is not a plain object or a function.
pub(crate) fn class_constructor(
    memory: &mut dyn Memory,
    layout: &Layout,
    receivers: &Receivers,
    receiver: u64,
) -> Result<Option<u64>, NameError> {
    let kind = instance_type(memory, layout, receiver)?;
    let (first, last) = layout.types.js_function;
    if (first..=last).contains(&kind) {
        return Ok(Some(receiver));
    }
    if kind != receivers.js_object {
        return Ok(None);
    }
    let map = tagged_field(
        memory,
        layout,
        layout.tagging.untag(receiver),
        layout.fields.heap_object_map,
    )?;
    let mut constructor = tagged_field(
        memory,
        layout,
        layout.tagging.untag(map),
        receivers.map_constructor,
    )?;
    for _ in 0..MAX_BACK_POINTERS {
        if !layout.tagging.is_heap_object(constructor) {
            return Ok(None);
        }
        let kind = instance_type(memory, layout, constructor)?;
        if (first..=last).contains(&kind) {
            return Ok(Some(constructor));
        }
        if kind != layout.types.map {
            return Ok(None);
        }
        constructor = tagged_field(
            memory,
            layout,
            layout.tagging.untag(constructor),
            receivers.map_constructor,
        )?;
    }
    Ok(None)
}

/// `Class.method` for a method `name` called on an instance of (or, static,
/// on) `class`; `None` where V8's stack traces would not qualify it: an
/// anonymous function, a name already qualified (`Module._load`, inferred
/// from `Module.prototype._load = function`), the constructor itself.
pub(crate) fn qualified(class: &str, name: &str) -> Option<Arc<str>> {
    if name == "(anonymous)" || name.contains('.') || name == class {
        return None;
    }
    Some(Arc::from(format!("{class}.{name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_qualified_like_stack_traces() {
        assert_eq!(qualified("Ledger", "post").as_deref(), Some("Ledger.post"));
        assert_eq!(qualified("Ledger", "Ledger"), None);
        assert_eq!(qualified("Ledger", "(anonymous)"), None);
        assert_eq!(qualified("Module", "Module._load"), None);
    }
}
