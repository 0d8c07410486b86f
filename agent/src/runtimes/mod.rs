//! Interpreter runtimes: frames of interpreted code, named and spliced into
//! the native stacks. Each runtime is one module with the same shape: a
//! detector that recognizes the runtime in a process image and hands the
//! BPF walker that process's layout, and a namer that turns what the walker
//! recorded into function, file and line while the process is alive. Only
//! CPython (`python`), HotSpot (`java`) and V8 (`node`) exist so far; the pipeline drives
//! each through one trait, [`RuntimeSupport`] (`support`).

mod java;
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

/// Which interpreter a frame belongs to. The order is the pipeline's:
/// the first runtime to claim a sample's process names its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    Java,
    Python,
    JavaScript,
}

impl Runtime {
    /// The pprof mapping that holds this runtime's frames.
    pub fn mapping_name(self) -> &'static str {
        match self {
            Self::Python => "[python]",
            Self::Java => "[java]",
            Self::JavaScript => "[javascript]",
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
