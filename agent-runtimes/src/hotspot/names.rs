//! Java frames named: what [`super::step`] recorded of each frame turned
//! into methods with lines, a compiled frame into one frame per scope
//! (inlined methods first).

use std::{num::NonZeroUsize, sync::Arc};

use lru::LruCache;

use super::{
    HotSpotError,
    codecache::{BlobKind, CodeCache},
    invalid,
    layout::Layout,
    method::{JavaMethod, MethodNamer, NamerCounts},
    scopes::NmethodDebug,
    unwind::JavaFrame,
};
use crate::Memory;

/// Nmethods whose debug information is kept.
const CACHED_NMETHODS: usize = 1024;

/// How a Java frame ran, as async-profiler marks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Interpreted,
    /// Compiled by C1 (tiers 1 to 3).
    C1,
    /// Compiled by C2 (tier 4).
    C2,
    /// Inlined into the compiled frame below it.
    Inlined,
    /// A `native` method's wrapper.
    Native,
}

/// A Java frame, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedJavaFrame {
    pub method: Arc<JavaMethod>,
    /// 0 when unknown.
    pub line: u32,
    pub kind: FrameKind,
}

/// Names the frames of one JVM: methods and nmethods' debug information,
/// cached and checked again on each use.
pub struct JavaNamer {
    methods: MethodNamer,
    /// By code start and compile id.
    nmethods: LruCache<(u64, i32), Arc<NmethodDebug>>,
}

impl Default for JavaNamer {
    fn default() -> Self {
        Self::new()
    }
}

impl JavaNamer {
    pub fn new() -> Self {
        Self {
            methods: MethodNamer::new(),
            nmethods: LruCache::new(
                NonZeroUsize::new(CACHED_NMETHODS).unwrap_or(NonZeroUsize::MIN),
            ),
        }
    }

    pub fn take_counts(&mut self) -> NamerCounts {
        self.methods.take_counts()
    }

    /// The Java frames `frame` stands for, innermost first; empty for a
    /// stub (named by its blob, [`JavaFrame::Stub`]).
    pub fn name(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        cache: &CodeCache,
        frame: &JavaFrame,
    ) -> Result<Vec<NamedJavaFrame>, HotSpotError> {
        self.name_at(memory, layout, cache, frame, (u64::MAX, 0))
    }

    /// [`Self::name`] for a sample taken at `sampled_at`, any read made at
    /// or after `now`: methods read after the sample are not read again
    /// ([`MethodNamer::method_at`]).
    pub fn name_at(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        cache: &CodeCache,
        frame: &JavaFrame,
        at: (u64, u64),
    ) -> Result<Vec<NamedJavaFrame>, HotSpotError> {
        match *frame {
            JavaFrame::Interpreted { method, bcp } => {
                let (named, code) = self.methods.method_at(memory, layout, method, at)?;
                // A native method called from interpreted code runs in
                // the interpreter's native entry: no bytecode, no line.
                if named.native {
                    return Ok(vec![NamedJavaFrame {
                        method: named,
                        line: 0,
                        kind: FrameKind::Native,
                    }]);
                }
                let bci = named
                    .bci(code, bcp)
                    .ok_or_else(|| invalid("a bytecode pointer", bcp, "outside its method"))?;
                let line = named.line(bci);
                Ok(vec![NamedJavaFrame {
                    method: named,
                    line,
                    kind: FrameKind::Interpreted,
                }])
            }
            JavaFrame::Native { method } => {
                let (named, _) = self.methods.method_at(memory, layout, method, at)?;
                Ok(vec![NamedJavaFrame {
                    method: named,
                    line: 0,
                    kind: FrameKind::Native,
                }])
            }
            JavaFrame::Compiled {
                code,
                method,
                compile_id,
                pc,
                exact,
                tier,
            } => self.compiled(
                memory,
                layout,
                cache,
                (code, method, compile_id),
                (pc, exact, tier),
                at,
            ),
            JavaFrame::Stub { .. } => Ok(Vec::new()),
        }
    }

    /// `JavaFrame::Compiled`'s fields.
    fn compiled(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        cache: &CodeCache,
        (code, method, compile_id): (u64, u64, i32),
        (pc, exact, tier): (u64, bool, u8),
        at: (u64, u64),
    ) -> Result<Vec<NamedJavaFrame>, HotSpotError> {
        let debug = match self.nmethods.get(&(code, compile_id)) {
            Some(debug) => debug.clone(),
            None => {
                // The blob again, as it is now: it must still be the same
                // method's.
                let blob = cache
                    .find(memory, layout, pc)?
                    .filter(|blob| {
                        blob.code.start == code
                            && blob.method == method
                            && blob.compile_id == compile_id
                            && matches!(blob.kind, BlobKind::Compiled { .. })
                    })
                    .ok_or_else(|| invalid("an nmethod", code, "gone since the sample"))?;
                let debug = Arc::new(NmethodDebug::read(memory, layout, &blob)?);
                self.nmethods.put((code, compile_id), debug.clone());
                debug
            }
        };
        let own = if tier >= 4 {
            FrameKind::C2
        } else {
            FrameKind::C1
        };
        let scopes = debug.scopes_at(pc.wrapping_sub(code) as i64, exact);
        let scopes = match scopes {
            Ok(scopes) if !scopes.is_empty() => scopes,
            // No debug information at this pc: the method alone.
            _ => {
                let (named, _) = self.methods.method_at(memory, layout, method, at)?;
                return Ok(vec![NamedJavaFrame {
                    method: named,
                    line: 0,
                    kind: own,
                }]);
            }
        };
        let last = scopes.len() - 1;
        scopes
            .iter()
            .enumerate()
            .map(|(index, scope)| {
                let (named, _) = self.methods.method_at(memory, layout, scope.method, at)?;
                let line = named.line(scope.bci);
                Ok(NamedJavaFrame {
                    method: named,
                    line,
                    kind: if index == last {
                        own
                    } else {
                        FrameKind::Inlined
                    },
                })
            })
            .collect()
    }
}
