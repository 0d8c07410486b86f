//! Interpreter runtimes: frames of interpreted code, named and spliced into
//! the native stacks. Each runtime is one module with the same shape: a
//! detector that recognizes the runtime in a process image and hands the
//! BPF walker that process's layout, and a namer that turns what the walker
//! recorded into function, file and line while the process is alive. Only
//! CPython (`python`), HotSpot (`java`) and V8 (`node`) exist so far; the pipeline drives
//! each through one trait, [`RuntimeSupport`] (`support`).

mod java;
mod java_threads;
mod memory;
mod node;
mod python;
mod splice;
mod support;

use std::sync::Arc;

pub use java::{JavaConfig, JavaFrames, JavaRuntime, JvmUnwinder};
pub use memory::ProcessMemory;
pub use node::{NodeConfig, NodeRuntime};
pub use python::{
    PythonConfig, PythonMapError, PythonProcessMap, PythonRuntime, ThreadPointerLookup,
};
pub use splice::{NamedFrame, splice};
pub use support::{ForeignUnwind, JavaSupport, PythonSupport, RuntimeSupport, Spliced};

/// Which interpreter a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    Python,
    Java(JavaKind),
    JavaScript,
    /// A JavaScript function TurboFan or Maglev inlined into the frame
    /// below it.
    JavaScriptInlined,
}

/// How a Java frame ran, as async-profiler's `_[0]`, `_[1]`, `_[j]`,
/// `_[i]` markers tell it; shown as the frame's mapping, so a method keeps
/// one function name whatever tier ran it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JavaKind {
    /// The JVM's generated code (stubs, the call stub), or a frame that
    /// could not be named.
    Generated,
    Interpreted,
    /// Compiled by C1 (tiers 1 to 3).
    C1,
    /// Compiled by C2 (tier 4).
    C2,
    /// Inlined by the compiler into the frame below it.
    Inlined,
    /// A `native` method's wrapper.
    Native,
}

impl Runtime {
    /// The pprof mapping that holds this runtime's frames.
    pub fn mapping_name(self) -> &'static str {
        match self {
            Self::Python => "[python]",
            Self::Java(JavaKind::Generated) => "[java]",
            Self::Java(JavaKind::Interpreted) => "[java:interpreted]",
            Self::Java(JavaKind::C1) => "[java:c1]",
            Self::Java(JavaKind::C2) => "[java:c2]",
            Self::Java(JavaKind::Inlined) => "[java:inlined]",
            Self::Java(JavaKind::Native) => "[java:native]",
            Self::JavaScript => "[javascript]",
            Self::JavaScriptInlined => "[javascript:inlined]",
        }
    }

    /// The pipeline's order: the first runtime to claim a sample's process
    /// names its frames.
    pub fn order(self) -> u8 {
        match self {
            Self::Java(_) => 0,
            Self::Python => 1,
            Self::JavaScript | Self::JavaScriptInlined => 2,
        }
    }
}

/// A frame of interpreted code, named.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InterpretedFrame {
    pub runtime: Runtime,
    pub function: Arc<str>,
    pub file: Arc<str>,
    /// The line being run; 0 when unknown.
    pub line: u32,
}

/// One frame of a user stack: native code by address, or interpreted code
/// by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UserFrame {
    Native(u64),
    Interpreted(Arc<InterpretedFrame>),
}

impl UserFrame {
    pub fn native(&self) -> Option<u64> {
        match self {
            Self::Native(address) => Some(*address),
            Self::Interpreted(_) => None,
        }
    }
}

/// A mapped file's name, the whole path when it has none.
fn file_name(path: &str) -> &str {
    std::path::Path::new(path)
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or(path)
}

/// What to add to the object's link-time addresses to get the process's:
/// one value for the whole object, read off the mapping at `index`.
fn load_bias(image: &crate::process::ProcessImage, index: usize) -> Option<u64> {
    let mapping = image.mappings.get(index)?;
    let object = mapping.object()?;
    let vaddr = object.layout.vaddr_for_file_offset(mapping.spec.offset)?;
    Some(mapping.spec.start.wrapping_sub(vaddr))
}
