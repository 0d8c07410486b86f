//! JavaScript frames named from their JSFunction: the function's
//! SharedFunctionInfo gives its name and its Script the file.
//!
//! What a frame holds is the JSFunction as of the sample; by the time it is
//! named the garbage collector may have moved it. Each object on the way is
//! checked (tag, map, instance type) and the cache is keyed by the
//! SharedFunctionInfo's address together with the two fields the name
//! comes from, so an object that moved and left something else at its
//! address is read again, not named from the cache.

use std::sync::Arc;

use agent_cache::ByteBoundedCache;

use super::{
    ChainFrame, Layout,
    code::CodeFinder,
    heap::{instance_type, is_string, read_string, tagged_field, typed_field},
    inlined::{InlineError, Inliner, script_offset},
    position::{LINE_CACHE_BYTES, LineCache, Position, line_and_column, start_position},
    receiver::{CLASS_CACHE_BYTES, ClassCache, class_constructor, class_key, qualified},
    running::BytecodePositions,
    scope::scope_info_name,
    tier::{Tier, frame_tier},
};
use crate::{Memory, MemoryError};

/// Bytes of decoded names kept per process.
const CACHE_BYTES: usize = 1 << 20;

/// A JavaScript function, named.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JsFunction {
    /// The function's name; `(anonymous)` for functions without one.
    pub name: Arc<str>,
    /// The script's name (a file path or URL); empty when the script has
    /// none (code from `eval`, `new Function`).
    pub file: Arc<str>,
    /// Where the function starts in the script, as V8's profiler reports
    /// it; `None` when firn cannot tell (see [`super::position`]).
    pub position: Option<Position>,
}

impl JsFunction {
    fn weight(&self) -> usize {
        std::mem::size_of::<Self>() + self.name.len() + self.file.len()
    }
}

/// Why a frame could not be named.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    #[error("reading the process's memory failed")]
    Read {
        #[source]
        source: MemoryError,
    },
    #[error("{value:#x} is not a pointer to a heap object")]
    NotHeapObject { value: u64 },
    #[error("the object at {object:#x} has no valid map")]
    BadMap { object: u64 },
    #[error("the object at {object:#x} is of instance type {found}, not a {expected}")]
    WrongType {
        object: u64,
        expected: &'static str,
        found: u16,
    },
    #[error("the string at {object:#x} is not valid")]
    BadString { object: u64 },
    #[error("the string at {object:#x} is external (its characters are outside the heap)")]
    ExternalString { object: u64 },
    #[error("the string at {object:#x} nests too deep")]
    TooDeep { object: u64 },
    #[error("the function's ScopeInfo at {object:#x} holds no name firn can find")]
    NoScopeName { object: u64 },
}

impl NameError {
    /// A short name for the reason, for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read",
            Self::NotHeapObject { .. } | Self::BadMap { .. } => "not_an_object",
            Self::WrongType { .. } => "wrong_type",
            Self::BadString { .. } | Self::TooDeep { .. } => "bad_string",
            Self::ExternalString { .. } => "external_string",
            Self::NoScopeName { .. } => "scope_info",
        }
    }
}

/// Cache hits and misses, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamerCounts {
    pub hits: u64,
    pub misses: u64,
    /// Functions named without a line (their source unreadable, or no
    /// position confirmed by it).
    pub without_line: u64,
}

/// Names JavaScript functions of one process, caching by
/// SharedFunctionInfo.
pub struct V8Namer {
    layout: Layout,
    cache: ByteBoundedCache<(u64, u64, u64), JsFunction>,
    /// Functions named, by JSFunction ([`V8Namer::seen_key`]).
    seen: ByteBoundedCache<[u64; 5], JsFunction>,
    classes: ClassCache,
    lines: LineCache,
    counts: NamerCounts,
    /// Where the build says enough to find a frame's code.
    code: Option<(CodeFinder, Inliner)>,
    bytecode: Option<BytecodePositions>,
}

/// What an optimized frame runs: the functions inlined at its pc,
/// innermost first, each with the line it runs, and the line its own
/// function runs (`None` where firn cannot tell).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OptimizedFrame {
    pub inlined: Vec<(JsFunction, Option<Position>)>,
    pub line: Option<Position>,
}

impl V8Namer {
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            cache: ByteBoundedCache::new(CACHE_BYTES),
            seen: ByteBoundedCache::new(CACHE_BYTES),
            classes: ClassCache::new(CLASS_CACHE_BYTES),
            lines: LineCache::new(LINE_CACHE_BYTES),
            counts: NamerCounts::default(),
            code: layout
                .code
                .map(|code| (CodeFinder::new(code), Inliner::new(code))),
            bytecode: layout
                .bytecode_data
                .zip(layout.code)
                .map(|(data, code)| BytecodePositions::new(data, code.byte_arrays)),
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn counts(&self) -> NamerCounts {
        self.counts
    }

    /// The function a frame's function slot holds (`function`: the tagged
    /// word at [`FrameSlots::function`](super::FrameSlots) from the frame
    /// pointer), or why it is not one.
    pub fn name(
        &mut self,
        memory: &mut dyn Memory,
        function: u64,
    ) -> Result<JsFunction, NameError> {
        let layout = self.layout;
        // Four reads name a function seen before: its map and
        // SharedFunctionInfo, and the two fields of the latter the name
        // comes from, all live. An object that moved or died leaves a
        // forwarding or filler map behind, and another function at the
        // address has its own SharedFunctionInfo: either is read again.
        if let Some(key) = self.seen_key(memory, function)
            && let Some(named) = self.seen.get(&key)
        {
            self.counts.hits += 1;
            return Ok(named.clone());
        }
        let kind = instance_type(memory, &layout, function)?;
        let (first, last) = layout.types.js_function;
        if !(first..=last).contains(&kind) {
            return Err(NameError::WrongType {
                object: function,
                expected: "JSFunction",
                found: kind,
            });
        }
        let shared = tagged_field(
            memory,
            &layout,
            layout.tagging.untag(function),
            layout.fields.js_function_shared,
        )?;
        expect_type(
            memory,
            &layout,
            shared,
            layout.types.shared_function_info,
            "SharedFunctionInfo",
        )?;
        let map = tagged_field(
            memory,
            &layout,
            layout.tagging.untag(function),
            layout.fields.heap_object_map,
        )?;
        let (named, [name_or_scope, script]) = self.shared(memory, shared)?;
        self.remember([function, map, shared, name_or_scope, script], &named);
        Ok(named)
    }

    /// The function whose SharedFunctionInfo is `shared` (tagged, checked
    /// already), with the two fields it is named from.
    fn shared(
        &mut self,
        memory: &mut dyn Memory,
        shared: u64,
    ) -> Result<(JsFunction, [u64; 2]), NameError> {
        let layout = self.layout;
        let sfi = layout.tagging.untag(shared);
        let name_or_scope =
            tagged_field(memory, &layout, sfi, layout.fields.sfi_name_or_scope_info)?;
        let script = tagged_field(memory, &layout, sfi, layout.fields.sfi_script)?;
        let key = (shared, name_or_scope, script);
        if let Some(named) = self.cache.get(&key) {
            self.counts.hits += 1;
            return Ok((named.clone(), [name_or_scope, script]));
        }
        self.counts.misses += 1;
        let name = function_name(memory, &layout, name_or_scope)?;
        let file = script_name(memory, &layout, script)?;
        // A line firn cannot find leaves the function named all the same.
        let position = self.position(memory, name_or_scope, script).ok().flatten();
        self.counts.without_line += u64::from(position.is_none());
        let named = JsFunction {
            name,
            file,
            position,
        };
        let weight = named.weight();
        self.cache.insert(key, named.clone(), weight);
        Ok((named, [name_or_scope, script]))
    }

    /// What keys a function already named: the JSFunction, its map and
    /// SharedFunctionInfo, and that one's name and script fields, as they
    /// are now; `None` when they cannot be read.
    fn seen_key(&self, memory: &mut dyn Memory, function: u64) -> Option<[u64; 5]> {
        let layout = &self.layout;
        if !layout.tagging.is_heap_object(function) {
            return None;
        }
        let object = layout.tagging.untag(function);
        let map = tagged_field(memory, layout, object, layout.fields.heap_object_map).ok()?;
        let shared = tagged_field(memory, layout, object, layout.fields.js_function_shared).ok()?;
        if !layout.tagging.is_heap_object(shared) {
            return None;
        }
        let sfi = layout.tagging.untag(shared);
        let name_or_scope =
            tagged_field(memory, layout, sfi, layout.fields.sfi_name_or_scope_info).ok()?;
        let script = tagged_field(memory, layout, sfi, layout.fields.sfi_script).ok()?;
        Some([function, map, shared, name_or_scope, script])
    }

    fn remember(&mut self, key: [u64; 5], named: &JsFunction) {
        let weight = named.weight() + std::mem::size_of::<[u64; 5]>();
        self.seen.insert(key, named.clone(), weight);
    }
}

impl V8Namer {
    /// What an optimized frame runs: the functions inlined into its code
    /// at its pc and the lines being run (no function inlined when the
    /// frame runs baseline code): `function`, the frame's function slot
    /// as [`V8Namer::name`] takes it; `pc`, the sample's instruction
    /// pointer for the innermost frame (`leaf`), else the frame's return
    /// address. Meant for frames [`V8Namer::tier`] finds optimized; an
    /// interpreted frame's pc is in V8's builtins, where no code object is
    /// found.
    pub fn optimized(
        &mut self,
        memory: &mut dyn Memory,
        function: u64,
        pc: u64,
        leaf: bool,
    ) -> Result<OptimizedFrame, InlineError> {
        let layout = self.layout;
        let Some((finder, inliner)) = self.code.as_mut() else {
            return Ok(OptimizedFrame::default());
        };
        // A return address is just past its call, which may be the last
        // instruction of an inlined function.
        let pc = if leaf { pc } else { pc.wrapping_sub(1) };
        let found = finder
            .find(memory, &layout, pc)?
            .ok_or(InlineError::NoCode { pc })?;
        if found.baseline {
            return Ok(OptimizedFrame::default());
        }
        let shared = tagged_field(
            memory,
            &layout,
            layout.tagging.untag(function),
            layout.fields.js_function_shared,
        )?;
        let run = inliner.run(memory, &layout, &found, shared, pc - found.start)?;
        let mut inlined = Vec::with_capacity(run.inlined.len());
        for (shared, position) in run.inlined {
            let named = self.shared(memory, shared)?.0;
            let line = self.line_at(memory, shared, position);
            inlined.push((named, line));
        }
        let line = run
            .position
            .and_then(|position| self.line_at(memory, shared, position));
        Ok(OptimizedFrame { inlined, line })
    }

    /// The line an interpreted frame runs, from its bytecode array and
    /// offset slots as of the sample (`bytecode`, as
    /// [`ChainFrame::bytecode`](super::ChainFrame) holds them); `None`
    /// when firn cannot tell.
    pub fn interpreted_line(
        &mut self,
        memory: &mut dyn Memory,
        function: u64,
        bytecode: [Option<u64>; 2],
    ) -> Option<Position> {
        let layout = self.layout;
        let [Some(array), Some(offset)] = bytecode else {
            return None;
        };
        let positions = self.bytecode.as_mut()?;
        let shared = tagged_field(
            memory,
            &layout,
            layout.tagging.untag(function),
            layout.fields.js_function_shared,
        )
        .ok()?;
        let (script, source) = script_source(memory, &layout, shared).ok()??;
        let at = positions
            .script_offset(memory, &layout, array, offset, source)
            .ok()??;
        line_and_column(memory, &layout, &mut self.lines, script, source, at)
            .ok()
            .flatten()
    }

    /// The line of source position `position` (raw, as position tables
    /// keep it) in the script of the function whose SharedFunctionInfo is
    /// `shared`.
    fn line_at(&mut self, memory: &mut dyn Memory, shared: u64, position: u64) -> Option<Position> {
        let layout = self.layout;
        let at = script_offset(position)?;
        let (script, source) = script_source(memory, &layout, shared).ok()??;
        line_and_column(memory, &layout, &mut self.lines, script, source, at)
            .ok()
            .flatten()
    }

    /// [`V8Namer::name`], with a method called on an instance of a
    /// script's class (or on the class, static) named `Class.method`, as
    /// V8's stack traces name it (see [`super::receiver`]). `receiver`: the
    /// word in the frame's receiver slot
    /// ([`Receivers::slot`](super::Receivers)) as of the sample. The class
    /// is a refinement: when it cannot be read the function keeps its
    /// plain name.
    pub fn name_method(
        &mut self,
        memory: &mut dyn Memory,
        function: u64,
        receiver: Option<u64>,
    ) -> Result<JsFunction, NameError> {
        let named = self.name(memory, function)?;
        let (Some(receiver), Some(_)) = (receiver, self.layout.receivers) else {
            return Ok(named);
        };
        if &*named.name == "(anonymous)" || named.name.contains('.') {
            return Ok(named);
        }
        let class = self.class(memory, receiver).ok().flatten();
        Ok(
            match class.and_then(|class| qualified(&class, &named.name)) {
                Some(name) => JsFunction { name, ..named },
                None => named,
            },
        )
    }

    /// The name of the script class `receiver` is an instance of (or is).
    fn class(
        &mut self,
        memory: &mut dyn Memory,
        receiver: u64,
    ) -> Result<Option<Arc<str>>, NameError> {
        let layout = self.layout;
        let Some(receivers) = layout.receivers else {
            return Ok(None);
        };
        let Some(key) = class_key(memory, &layout, &receivers, receiver)? else {
            return Ok(None);
        };
        if let Some(class) = self.classes.get(&key) {
            return Ok(class.clone());
        }
        let class = match class_constructor(memory, &layout, &receivers, receiver)? {
            Some(constructor) => match self.name(memory, constructor) {
                Ok(named) if !named.file.is_empty() && &*named.name != "(anonymous)" => {
                    Some(named.name)
                }
                // A builtin constructor (`Object`, `Function`) has no
                // script: no class of the program's.
                Ok(_)
                | Err(NameError::WrongType {
                    expected: "Script", ..
                }) => None,
                Err(error) => return Err(error),
            },
            None => None,
        };
        let weight = std::mem::size_of::<((u64, u64), Option<Arc<str>>)>()
            + class.as_ref().map_or(0, |class| class.len());
        self.classes.insert(key, class.clone(), weight);
        Ok(class)
    }

    /// Which tier ran a JavaScript frame (one [`V8Namer::name`] named),
    /// checked against the live heap like a name. `builtins`: where the
    /// process has V8's builtins
    /// ([`V8Object::builtins_in_process`](super::V8Object::builtins_in_process);
    /// empty when unknown), which tells code entered by on-stack
    /// replacement from the interpreter.
    pub fn tier(
        &self,
        memory: &mut dyn Memory,
        frame: &ChainFrame,
        builtins: &[std::ops::Range<u64>],
    ) -> Result<Tier, NameError> {
        frame_tier(memory, &self.layout, frame, builtins)
    }

    /// Where the function starts, for a Script `script` already checked.
    fn position(
        &mut self,
        memory: &mut dyn Memory,
        name_or_scope: u64,
        script: u64,
    ) -> Result<Option<Position>, NameError> {
        let layout = self.layout;
        let Some(source) = typed_field(
            memory,
            &layout,
            script,
            layout.fields.script_source,
            |kind| is_string(&layout, kind),
        )?
        else {
            return Ok(None);
        };
        let Some(start) = start_position(memory, &layout, name_or_scope, source)? else {
            return Ok(None);
        };
        line_and_column(memory, &layout, &mut self.lines, script, source, start)
    }
}

/// The Script and source string of a function's SharedFunctionInfo, if it
/// has both.
fn script_source(
    memory: &mut dyn Memory,
    layout: &Layout,
    shared: u64,
) -> Result<Option<(u64, u64)>, NameError> {
    if !layout.tagging.is_heap_object(shared)
        || instance_type(memory, layout, shared)? != layout.types.shared_function_info
    {
        return Ok(None);
    }
    let script_type = layout.types.script;
    let Some(script) = typed_field(memory, layout, shared, layout.fields.sfi_script, |kind| {
        kind == script_type
    })?
    else {
        return Ok(None);
    };
    let source = typed_field(
        memory,
        layout,
        script,
        layout.fields.script_source,
        |kind| is_string(layout, kind),
    )?;
    Ok(source.map(|source| (script, source)))
}

fn expect_type(
    memory: &mut dyn Memory,
    layout: &Layout,
    tagged: u64,
    expected_type: u16,
    expected: &'static str,
) -> Result<(), NameError> {
    let found = instance_type(memory, layout, tagged)?;
    if found != expected_type {
        return Err(NameError::WrongType {
            object: tagged,
            expected,
            found,
        });
    }
    Ok(())
}

/// `SharedFunctionInfo::name_or_scope_info`: the name itself until the
/// function is compiled, then its ScopeInfo, which holds it; a Smi (no
/// name) for anonymous functions.
fn function_name(
    memory: &mut dyn Memory,
    layout: &Layout,
    name_or_scope: u64,
) -> Result<Arc<str>, NameError> {
    let anonymous = || Arc::from("(anonymous)");
    if layout.tagging.is_smi(name_or_scope) {
        return Ok(anonymous());
    }
    let kind = instance_type(memory, layout, name_or_scope)?;
    let name = if is_string(layout, kind) {
        read_string(memory, layout, name_or_scope)?
    } else if kind == layout.types.scope_info {
        match scope_info_name(memory, layout, name_or_scope)? {
            Some(name) => name,
            None => return Ok(anonymous()),
        }
    } else {
        return Err(NameError::WrongType {
            object: name_or_scope,
            expected: "String or ScopeInfo",
            found: kind,
        });
    };
    Ok(if name.is_empty() { anonymous() } else { name })
}

/// The script's name; empty for scripts without one (`eval`).
fn script_name(
    memory: &mut dyn Memory,
    layout: &Layout,
    script: u64,
) -> Result<Arc<str>, NameError> {
    let kind = instance_type(memory, layout, script)?;
    if kind != layout.types.script {
        return Err(NameError::WrongType {
            object: script,
            expected: "Script",
            found: kind,
        });
    }
    match typed_field(memory, layout, script, layout.fields.script_name, |kind| {
        is_string(layout, kind)
    })? {
        Some(name) => read_string(memory, layout, name),
        None => Ok(Arc::from("")),
    }
}
