//! The Code object an optimized frame runs, found from the frame's pc.
//!
//! A frame holds its JSFunction but not its code, and a function's `code`
//! field is its current code, not necessarily the code the frame runs
//! (neither is exported by every release: Node 20 lacks the field, Node
//! 24 reaches code through a JS dispatch table no constant describes). The
//! pc, though, lies in the instructions of the code the frame runs, and
//! V8 allocates instructions in objects whose start firn can recognize:
//! an InstructionStream (V8 11 on; the Code object itself before), whose
//! first instruction is at a known offset (`InstructionStream::
//! instruction_start`, `Code::instruction_start` in V8 10) and aligned to
//! 32 bytes. firn walks back from the pc over those aligned starts, up to
//! [`MAX_CODE_BYTES`], to the first object whose map is the
//! InstructionStream map, and accepts it only if it links back: its Code
//! points at it and it at its Code (V8 11 on), the pc lies within its
//! instructions where the size is exported. Fields that link them are
//! learned the same way, by the type of what they point at, and kept per
//! process once a Code passed every check.

use agent_cache::ByteBoundedCache;

use super::{
    Layout, NameError,
    heap::{instance_type, read_u64, tagged_field},
    object::Constants,
};
use crate::Memory;

/// Bytes of instructions walked back from a pc at most: optimized code of
/// a function is seldom longer; a pc further in stays without its inlined
/// functions (counted).
pub const MAX_CODE_BYTES: u64 = 256 << 10;
/// Instructions start on this alignment (V8's `kCodeAlignment` is 32 or
/// 64 on x86-64).
const CODE_ALIGNMENT: u64 = 32;
/// Bytes read at once while walking back.
const CHUNK: u64 = 4096;
/// Tagged fields of a Code object looked through for one of a known type.
pub(crate) const CODE_FIELDS_PROBED: u64 = 8;
/// Bytes of the pc-to-code cache per process.
const PC_CACHE_BYTES: usize = 256 << 10;

/// What firn follows from a pc to its Code, from the constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub code_type: u16,
    /// `InstructionStream` (V8 11 on), where instructions live apart from
    /// their Code; `None`: the Code holds them.
    pub stream_type: Option<u16>,
    /// Bytes from the start of the object holding the instructions to
    /// the first instruction.
    pub header: u64,
    /// `Code::instruction_size` (an int), where exported.
    pub instruction_size: Option<u64>,
    /// `Code::instruction_stream`, where exported (else learned).
    pub code_stream: Option<u64>,
    /// `Code::flags` and how they hold the code's kind: baseline code
    /// (Sparkplug) inlines nothing.
    pub kind: Option<CodeKind>,
    /// `Code::deoptimization_data` and `Code::source_position_table`,
    /// where exported (V8 11); else learned.
    pub deoptimization_data: Option<u64>,
    pub source_positions: Option<u64>,
    pub deopt: DeoptIndexes,
    /// Instance types of the arrays the deoptimization data may be
    /// (FixedArray, TrustedFixedArray, ProtectedFixedArray), 0 if absent.
    pub fixed_arrays: [u16; 3],
    /// And of byte arrays (ByteArray, TrustedByteArray).
    pub byte_arrays: [u16; 2],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeKind {
    pub flags: u64,
    pub mask: u32,
    pub shift: u32,
    pub baseline: u32,
}

/// Slots of DeoptimizationData (a fixed array) firn reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeoptIndexes {
    pub inlined_count: u64,
    pub literal_array: u64,
    /// The InliningPositions; `None` where not exported: the slot after
    /// the SharedFunctionInfo's (as in V8 9 to 13).
    pub inlining_positions: Option<u64>,
    /// The outermost function's SharedFunctionInfo, or (V8 13) a wrapper
    /// holding it; `None` where not exported (V8 10): learned, as the
    /// slot that holds the frame's own function's.
    pub shared: Option<u64>,
    /// `Some((wrapper type, wrapper's field))` when `shared` is wrapped.
    pub shared_wrapper: Option<(u16, u64)>,
}

impl CodeLayout {
    /// `None` when a constant it needs is missing: frames are then named
    /// without the functions inlined into them.
    pub fn new(constants: &Constants) -> Option<Self> {
        let get = |name: &str| constants.get(name);
        let unsigned = |name: &str| get(name).and_then(|value| u64::try_from(value).ok());
        let type_of = |name: &str| get(name).and_then(|value| u16::try_from(value).ok());
        let field = |class: &str, name: &str| {
            constants
                .with_prefix(&format!("class_{class}__{name}__"))
                .next()
                .and_then(|(_, value)| u64::try_from(value).ok())
        };
        let code_type = type_of("type_Code__CODE_TYPE")?;
        let stream_type = type_of("type_InstructionStream__INSTRUCTION_STREAM_TYPE");
        let header = match stream_type {
            Some(_) => field("InstructionStream", "instruction_start")?,
            None => field("Code", "instruction_start")?,
        };
        let kind = match (unsigned("CodeKindFieldMask"), unsigned("CodeKindBaseline")) {
            (Some(mask), Some(baseline)) => field("Code", "flags").and_then(|flags| {
                Some(CodeKind {
                    flags,
                    mask: u32::try_from(mask).ok()?,
                    // A constant in `.bss` is zero and has no bytes to read.
                    shift: u32::try_from(unsigned("CodeKindFieldShift").unwrap_or(0)).ok()?,
                    baseline: u32::try_from(baseline).ok()?,
                })
            }),
            _ => None,
        };
        let shared_wrapper = match unsigned("DeoptimizationDataWrappedSharedFunctionInfoIndex") {
            Some(index) => Some((
                index,
                Some((
                    type_of("type_SharedFunctionInfoWrapper__SHARED_FUNCTION_INFO_WRAPPER_TYPE")?,
                    field("SharedFunctionInfoWrapper", "shared_info")?,
                )),
            )),
            None => None,
        };
        let (shared, shared_wrapper) = match shared_wrapper {
            Some((index, wrapper)) => (Some(index), wrapper),
            None => (unsigned("DeoptimizationDataSharedFunctionInfoIndex"), None),
        };
        // V8 10 (Node 18) does not export the indexes: the count and the
        // literal array have kept their slots from V8 9 to 12 (V8 13
        // exports its own); what they hold is checked all the same.
        let deopt = DeoptIndexes {
            inlined_count: unsigned("DeoptimizationDataInlinedFunctionCountIndex").unwrap_or(1),
            literal_array: unsigned("DeoptimizationDataLiteralArrayIndex").unwrap_or(2),
            inlining_positions: unsigned("DeoptimizationDataInliningPositionsIndex"),
            shared,
            shared_wrapper,
        };
        let array_type = |name: &str| type_of(name).unwrap_or(0);
        let fixed_arrays = [
            array_type("type_FixedArray__FIXED_ARRAY_TYPE"),
            array_type("type_TrustedFixedArray__TRUSTED_FIXED_ARRAY_TYPE"),
            array_type("type_ProtectedFixedArray__PROTECTED_FIXED_ARRAY_TYPE"),
        ];
        let byte_arrays = [
            array_type("type_ByteArray__BYTE_ARRAY_TYPE"),
            array_type("type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE"),
        ];
        Some(Self {
            code_type,
            stream_type,
            header,
            instruction_size: field("Code", "instruction_size"),
            code_stream: field("Code", "instruction_stream"),
            kind,
            deoptimization_data: field("Code", "deoptimization_data"),
            source_positions: field("Code", "source_position_table"),
            deopt,
            fixed_arrays,
            byte_arrays,
        })
    }

    pub(crate) fn is_fixed_array(&self, kind: u16) -> bool {
        kind != 0 && self.fixed_arrays.contains(&kind)
    }

    pub(crate) fn is_byte_array(&self, kind: u16) -> bool {
        kind != 0 && self.byte_arrays.contains(&kind)
    }
}

/// The Code a pc lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FoundCode {
    /// The Code object (tagged).
    pub code: u64,
    /// Its first instruction.
    pub start: u64,
    /// Its instructions' length, where the build says.
    pub size: Option<u64>,
    pub baseline: bool,
}

/// Fields learned from the process's own objects.
#[derive(Clone, Copy, Debug, Default)]
struct Learned {
    /// The map word every InstructionStream (Code in V8 10) starts with.
    stream_map: Option<u64>,
    /// InstructionStream's field pointing at its Code.
    stream_code: Option<u64>,
    /// Code's field pointing at its InstructionStream (where not exported).
    code_stream: Option<u64>,
}

/// Finds the Code of pcs in one process.
pub(crate) struct CodeFinder {
    layout: CodeLayout,
    learned: Learned,
    /// pc -> (object start, Code), checked again on every hit; `None`: no
    /// code there (not walked back again).
    by_pc: ByteBoundedCache<u64, Option<(u64, u64)>>,
}

impl CodeFinder {
    pub fn new(layout: CodeLayout) -> Self {
        Self {
            layout,
            learned: Learned::default(),
            by_pc: ByteBoundedCache::new(PC_CACHE_BYTES),
        }
    }

    /// The Code `pc` lies in, or `None` when no object that links back
    /// starts within [`MAX_CODE_BYTES`] below it (remembered: a pc
    /// without code is not walked back from again).
    pub fn find(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        pc: u64,
    ) -> Result<Option<FoundCode>, NameError> {
        let weight = std::mem::size_of::<(u64, Option<(u64, u64)>)>();
        match self.by_pc.get(&pc) {
            Some(None) => return Ok(None),
            Some(&Some((object, code))) => {
                if let Ok(Some(found)) = self.check(memory, layout, object, pc)
                    && found.code == code
                {
                    return Ok(Some(found));
                }
            }
            None => {}
        }
        let lowest = pc.saturating_sub(MAX_CODE_BYTES);
        let mut start = pc & !(CODE_ALIGNMENT - 1);
        let mut chunk: Option<(u64, Vec<u8>)> = None;
        while start >= lowest && start >= self.layout.header {
            let object = start - self.layout.header;
            if chunk
                .as_ref()
                .is_none_or(|(base, _)| object < *base || object + 8 > base + CHUNK)
            {
                let base = object & !(CHUNK - 1);
                let mut bytes = vec![0; CHUNK as usize];
                if memory.read(base, &mut bytes).is_err() {
                    // Below the first page of code there is nothing.
                    break;
                }
                chunk = Some((base, bytes));
            }
            let (base, bytes) = chunk.as_ref().expect("read above");
            let at = (object - base) as usize;
            let word = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            if self.maybe_stream_map(memory, layout, word, object)
                && let Some(found) = self.check(memory, layout, object, pc)?
            {
                self.by_pc.insert(pc, Some((object, found.code)), weight);
                return Ok(Some(found));
            }
            start -= CODE_ALIGNMENT;
        }
        self.by_pc.insert(pc, None, weight);
        Ok(None)
    }

    /// Whether `word`, at the start of `object`, may be the map of the
    /// objects holding instructions.
    fn maybe_stream_map(
        &self,
        memory: &mut dyn Memory,
        layout: &Layout,
        word: u64,
        object: u64,
    ) -> bool {
        match self.learned.stream_map {
            Some(map) => word == map,
            None => {
                layout.tagging.is_heap_object(word)
                    && instance_type(memory, layout, object | layout.tagging.heap_object_tag)
                        .is_ok_and(|kind| {
                            kind == self.layout.stream_type.unwrap_or(self.layout.code_type)
                        })
            }
        }
    }

    /// The Code of the object at `object` if it holds `pc` and links back.
    fn check(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        object: u64,
        pc: u64,
    ) -> Result<Option<FoundCode>, NameError> {
        let tag = layout.tagging.heap_object_tag;
        let map = read_u64(memory, object)?;
        if self.learned.stream_map.is_some_and(|known| known != map) {
            return Ok(None);
        }
        let stream = object | tag;
        let code = match self.layout.stream_type {
            None => {
                if instance_type(memory, layout, stream)? != self.layout.code_type {
                    return Ok(None);
                }
                stream
            }
            Some(stream_type) => {
                if instance_type(memory, layout, stream)? != stream_type {
                    return Ok(None);
                }
                match self.stream_code(memory, layout, stream)? {
                    Some(code) => code,
                    None => return Ok(None),
                }
            }
        };
        let start = object + self.layout.header;
        let size = match self.layout.instruction_size {
            Some(offset) => {
                let word = read_u64(memory, layout.tagging.untag(code) + offset)?;
                Some(u64::from(word as u32))
            }
            None => None,
        };
        if pc < start || size.is_some_and(|size| pc >= start + size) {
            return Ok(None);
        }
        let baseline = match self.layout.kind {
            Some(kind) => {
                let flags = read_u64(memory, layout.tagging.untag(code) + kind.flags)? as u32;
                (flags >> kind.shift) & kind.mask == kind.baseline
            }
            None => false,
        };
        self.learned.stream_map = Some(map);
        Ok(Some(FoundCode {
            code,
            start,
            size,
            baseline,
        }))
    }

    /// The Code an InstructionStream belongs to, if they point at each
    /// other.
    fn stream_code(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        stream: u64,
    ) -> Result<Option<u64>, NameError> {
        let object = layout.tagging.untag(stream);
        let slot = u64::from(layout.tagging.tagged_size);
        let fields: Vec<u64> = match self.learned.stream_code {
            Some(field) => vec![field],
            None => (1..self.layout.header / slot)
                .map(|index| index * slot)
                .collect(),
        };
        for field in fields {
            let code = tagged_field(memory, layout, object, field)?;
            if !layout.tagging.is_heap_object(code)
                || instance_type(memory, layout, code)? != self.layout.code_type
            {
                continue;
            }
            let back: Vec<u64> = match self.layout.code_stream.or(self.learned.code_stream) {
                Some(field) => vec![field],
                None => (1..=CODE_FIELDS_PROBED).map(|index| index * slot).collect(),
            };
            for back_field in back {
                if tagged_field(memory, layout, layout.tagging.untag(code), back_field)? == stream {
                    self.learned.stream_code = Some(field);
                    if self.layout.code_stream.is_none() {
                        self.learned.code_stream = Some(back_field);
                    }
                    return Ok(Some(code));
                }
            }
        }
        Ok(None)
    }
}
