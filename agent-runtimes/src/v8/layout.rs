//! What firn follows through V8's heap and frames, from the post-mortem
//! constants alone: a V8 release firn has never seen works when it exports
//! the same constants, and a constant it lacks is named in the error, never
//! guessed.
//!
//! Field constants are `class_CLASS__FIELD__TYPE`; the type part changed
//! across releases (`Object`, `Tagged_Object_`, `Tagged_NameOrScopeInfoT_`)
//! and some fields were renamed (`script_or_debug_info` became `script`),
//! so a field is looked up by class and any of its names, whatever its
//! type.

use super::{CodeLayout, object::Constants};

/// How tagged values are told apart and decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tagging {
    pub heap_object_tag: u64,
    pub heap_object_tag_mask: u64,
    pub smi_tag: u64,
    pub smi_tag_mask: u64,
    /// A Smi's value is the tagged word shifted right this much (32 on
    /// x86-64 without pointer compression, 1 with).
    pub smi_shift: u32,
    /// Bytes of a tagged field in a heap object: 8, or 4 with pointer
    /// compression (fields hold the low half; the high half is the cage's,
    /// the same as the object's own).
    pub tagged_size: u8,
}

impl Tagging {
    pub fn is_heap_object(&self, value: u64) -> bool {
        value & self.heap_object_tag_mask == self.heap_object_tag
    }

    pub fn is_smi(&self, value: u64) -> bool {
        value & self.smi_tag_mask == self.smi_tag
    }

    /// The Smi `value` holds, or `None` if it is not one.
    pub fn smi(&self, value: u64) -> Option<i64> {
        if !self.is_smi(value) {
            return None;
        }
        Some(if self.tagged_size == 4 {
            i64::from((value as u32 as i32) >> self.smi_shift)
        } else {
            (value as i64) >> self.smi_shift
        })
    }

    /// The address of the object a tagged pointer points at.
    pub fn untag(&self, value: u64) -> u64 {
        value & !self.heap_object_tag_mask
    }
}

/// Slots of a JavaScript frame, relative to its frame pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameSlots {
    /// The JSFunction being run (every JavaScript frame).
    pub function: i64,
    /// Its context, or a frame type marker in frames that are not
    /// JavaScript (stubs, entry and exit frames).
    pub context: i64,
    /// Interpreted (and baseline) frames: the BytecodeArray and the offset
    /// into it being run (a Smi, from the start of the tagged object).
    pub bytecode_array: i64,
    pub bytecode_offset: i64,
}

/// Instance types (`Map::instance_type`) firn checks objects against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Types {
    pub map: u16,
    /// JSFunction and its subtypes (class constructors and the like): the
    /// range the build exports, else from `JS_FUNCTION_TYPE` to before the
    /// next type it exports.
    pub js_function: (u16, u16),
    pub shared_function_info: u16,
    pub script: u16,
    pub scope_info: u16,
    pub bytecode_array: u16,
    pub fixed_array: u16,
    /// Types below this are strings.
    pub first_nonstring: u16,
}

/// How a string's instance type says what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringTags {
    pub encoding_mask: u16,
    pub one_byte: u16,
    pub representation_mask: u16,
    pub seq: u16,
    pub cons: u16,
    pub external: u16,
    pub sliced: u16,
    pub thin: u16,
}

/// Byte offsets of fields from the start of an object (its address with
/// the tag removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub heap_object_map: u64,
    pub map_instance_type: u64,
    pub js_function_shared: u64,
    pub sfi_name_or_scope_info: u64,
    /// `script_or_debug_info` before V8 12, `script` from then.
    pub sfi_script: u64,
    pub script_name: u64,
    pub script_source: u64,
    pub script_line_ends: u64,
    pub string_length: u64,
    pub seq_one_byte_chars: u64,
    pub seq_two_byte_chars: u64,
    pub cons_first: u64,
    pub cons_second: u64,
    pub sliced_parent: u64,
    pub sliced_offset: u64,
    pub thin_actual: u64,
    pub fixed_array_length: u64,
    pub fixed_array_data: u64,
}

/// ScopeInfo, the compiled form of a function's scope, which holds the
/// function's name once it is compiled: its slots by index (tagged words
/// after the map).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeInfoSlots {
    pub parameter_count: u64,
    pub context_local_count: u64,
    pub first_vars: u64,
}

/// What names a method by the class of the object it was called on
/// (`Ledger.post`), as V8's stack traces do: the receiver is in the frame
/// (arguments are pushed last to first since V8 8.9, the receiver nearest
/// the return address), its class is its map's constructor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receivers {
    /// The receiver's slot from the frame pointer (`off_fp_args`).
    pub slot: i64,
    /// `Map::constructor_or_back_pointer`: the constructor, or the map this
    /// one was derived from (which leads to it).
    pub map_constructor: u64,
    /// Instances of classes (and of constructor functions) are plain
    /// JSObjects.
    pub js_object: u16,
}

/// Everything firn reads of one V8 build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub tagging: Tagging,
    pub pointer_size: u8,
    pub frame: FrameSlots,
    pub types: Types,
    pub strings: StringTags,
    pub fields: Fields,
    pub scope_info: ScopeInfoSlots,
    /// `None` when the build lacks a constant it needs: methods are then
    /// named without their class.
    pub receivers: Option<Receivers>,
    /// `None` when the build lacks a constant it needs: optimized frames
    /// are then named without the functions inlined into them.
    pub code: Option<CodeLayout>,
    /// `BytecodeArray::data`, the bytecodes' offset in their array, which
    /// turns an interpreted frame's offset slot into a bytecode offset.
    pub bytecode_data: Option<u64>,
}

/// JSFunction's subtypes at most, where the build does not export their
/// range (V8 12 has 17).
const MAX_JS_FUNCTION_TYPES: u16 = 32;

/// The constants a layout needs and the build does not export, by name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the V8 build lacks {} post-mortem constants firn needs: {}", missing.len(), missing.join(", "))]
pub struct LayoutError {
    pub missing: Vec<String>,
}

/// Looks constants up, noting each one missing instead of stopping at the
/// first, so one error lists them all.
struct Lookup<'a> {
    constants: &'a Constants,
    missing: Vec<String>,
}

impl Lookup<'_> {
    fn value(&mut self, name: &str) -> i64 {
        self.constants.get(name).unwrap_or_else(|| {
            self.missing.push(name.to_owned());
            0
        })
    }

    fn unsigned(&mut self, name: &str) -> u64 {
        let value = self.value(name);
        u64::try_from(value).unwrap_or_else(|_| {
            self.missing.push(format!("{name} (negative: {value})"));
            0
        })
    }

    fn type_tag(&mut self, name: &str) -> u16 {
        let value = self.value(name);
        u16::try_from(value).unwrap_or_else(|_| {
            self.missing.push(format!("{name} (out of range: {value})"));
            0
        })
    }

    /// `class_CLASS__FIELD__*` for the first of `fields` exported.
    fn field(&mut self, class: &str, fields: &[&str]) -> u64 {
        for field in fields {
            let prefix = format!("class_{class}__{field}__");
            if let Some((name, value)) = self.constants.with_prefix(&prefix).next() {
                return u64::try_from(value).unwrap_or_else(|_| {
                    self.missing.push(format!("{name} (negative: {value})"));
                    0
                });
            }
        }
        self.missing
            .push(format!("class_{class}__{}", fields.join("|")));
        0
    }
}

impl Layout {
    pub fn new(constants: &Constants) -> Result<Self, LayoutError> {
        let mut lookup = Lookup {
            constants,
            missing: Vec::new(),
        };
        let tagging = lookup.tagging();
        let pointer_size = lookup.value("SystemPointerSize");
        if pointer_size != 8 && constants.get("SystemPointerSize").is_some() {
            lookup
                .missing
                .push(format!("SystemPointerSize (8, not {pointer_size})"));
        }
        let frame = FrameSlots {
            function: lookup.value("off_fp_function"),
            context: lookup.value("off_fp_context"),
            bytecode_array: lookup.value("off_fp_bytecode_array"),
            bytecode_offset: lookup.value("off_fp_bytecode_offset"),
        };
        let types = lookup.types();
        let strings = lookup.strings();
        let fields = lookup.fields();
        let scope_info = ScopeInfoSlots {
            parameter_count: lookup.unsigned("scopeinfo_idx_nparams"),
            context_local_count: lookup.unsigned("scopeinfo_idx_ncontextlocals"),
            first_vars: lookup.unsigned("scopeinfo_idx_first_vars"),
        };
        if !lookup.missing.is_empty() {
            return Err(LayoutError {
                missing: lookup.missing,
            });
        }
        Ok(Self {
            tagging,
            pointer_size: 8,
            frame,
            types,
            strings,
            fields,
            scope_info,
            receivers: receivers(constants),
            code: CodeLayout::new(constants),
            bytecode_data: constants
                .with_prefix("class_BytecodeArray__data__")
                .next()
                .and_then(|(_, value)| u64::try_from(value).ok()),
        })
    }
}

fn receivers(constants: &Constants) -> Option<Receivers> {
    let (_, map_constructor) = constants
        .with_prefix("class_Map__constructor_or_back_pointer__")
        .next()?;
    Some(Receivers {
        slot: constants.get("off_fp_args")?,
        map_constructor: u64::try_from(map_constructor).ok()?,
        js_object: u16::try_from(constants.get("type_JSObject__JS_OBJECT_TYPE")?).ok()?,
    })
}

impl Lookup<'_> {
    fn tagging(&mut self) -> Tagging {
        let tagged_size = self.value("TaggedSize");
        let smi_tag_mask = self.unsigned("SmiTagMask");
        let smi_shift_size = self.unsigned("SmiShiftSize");
        let tagging = Tagging {
            heap_object_tag: self.unsigned("HeapObjectTag"),
            heap_object_tag_mask: self.unsigned("HeapObjectTagMask"),
            smi_tag: self.unsigned("SmiTag"),
            smi_tag_mask,
            // The value sits above the tag bits and the shift padding.
            smi_shift: (smi_shift_size + u64::from(smi_tag_mask.count_ones())) as u32,
            tagged_size: match tagged_size {
                4 | 8 => tagged_size as u8,
                _ => 0,
            },
        };
        if tagging.tagged_size == 0 && self.constants.get("TaggedSize").is_some() {
            self.missing
                .push(format!("TaggedSize (4 or 8, not {tagged_size})"));
        }
        tagging
    }

    fn types(&mut self) -> Types {
        let js_function = self.type_tag("type_JSFunction__JS_FUNCTION_TYPE");
        let range = (
            self.constants.get("FirstJSFunctionType"),
            self.constants.get("LastJSFunctionType"),
        );
        let js_function = match range {
            (Some(first), Some(last)) => (
                u16::try_from(first).unwrap_or(js_function),
                u16::try_from(last).unwrap_or(js_function),
            ),
            // V8 10 and 11 (Node 18, 20) do not export the range. Its
            // other types (class constructors, the builtins' own
            // constructors) are not exported either and come right after
            // JS_FUNCTION_TYPE, before the next type that is: the range
            // ends there. The namer checks each such object's
            // SharedFunctionInfo all the same.
            _ => {
                let next = self
                    .constants
                    .with_prefix("type_")
                    .filter_map(|(_, value)| u16::try_from(value).ok())
                    .filter(|&value| value > js_function)
                    .min()
                    .unwrap_or(js_function.saturating_add(1));
                let last = next
                    .saturating_sub(1)
                    .min(js_function.saturating_add(MAX_JS_FUNCTION_TYPES));
                (js_function, last)
            }
        };
        Types {
            map: self.type_tag("type_Map__MAP_TYPE"),
            js_function,
            shared_function_info: self
                .type_tag("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE"),
            script: self.type_tag("type_Script__SCRIPT_TYPE"),
            scope_info: self.type_tag("type_ScopeInfo__SCOPE_INFO_TYPE"),
            bytecode_array: self.type_tag("type_BytecodeArray__BYTECODE_ARRAY_TYPE"),
            fixed_array: self.type_tag("type_FixedArray__FIXED_ARRAY_TYPE"),
            first_nonstring: self.type_tag("FirstNonstringType"),
        }
    }

    fn strings(&mut self) -> StringTags {
        StringTags {
            encoding_mask: self.type_tag("StringEncodingMask"),
            one_byte: self.type_tag("OneByteStringTag"),
            representation_mask: self.type_tag("StringRepresentationMask"),
            seq: self.type_tag("SeqStringTag"),
            cons: self.type_tag("ConsStringTag"),
            external: self.type_tag("ExternalStringTag"),
            sliced: self.type_tag("SlicedStringTag"),
            thin: self.type_tag("ThinStringTag"),
        }
    }

    fn fields(&mut self) -> Fields {
        Fields {
            heap_object_map: self.field("HeapObject", &["map"]),
            map_instance_type: self.field("Map", &["instance_type"]),
            js_function_shared: self.field("JSFunction", &["shared"]),
            sfi_name_or_scope_info: self.field("SharedFunctionInfo", &["name_or_scope_info"]),
            sfi_script: self.field("SharedFunctionInfo", &["script_or_debug_info", "script"]),
            script_name: self.field("Script", &["name"]),
            script_source: self.field("Script", &["source"]),
            script_line_ends: self.field("Script", &["line_ends"]),
            string_length: self.field("String", &["length"]),
            seq_one_byte_chars: self.field("SeqOneByteString", &["chars"]),
            seq_two_byte_chars: self.field("SeqTwoByteString", &["chars"]),
            cons_first: self.field("ConsString", &["first"]),
            cons_second: self.field("ConsString", &["second"]),
            sliced_parent: self.field("SlicedString", &["parent"]),
            sliced_offset: self.field("SlicedString", &["offset"]),
            thin_actual: self.field("ThinString", &["actual"]),
            fixed_array_length: self.field("FixedArrayBase", &["length"]),
            fixed_array_data: self.field("FixedArray", &["data", "objects"]),
        }
    }
}
