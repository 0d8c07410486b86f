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
pub mod registry;
mod ruby;
mod splice;
mod support;

use std::{collections::HashMap, sync::Arc};

use agent_common::{ExecutableKey, InterpreterProcess};
use agent_elf::ContentKey;

pub use java::{JavaConfig, JavaFrames, JavaRuntime, JvmUnwinder};
pub use memory::ProcessMemory;
pub use node::{NodeConfig, NodeRuntime};
pub use python::{PythonConfig, PythonRuntime, ThreadPointerLookup};
pub use registry::{BpfWalkers, RuntimesConfig};
pub use ruby::{RubyConfig, RubyRuntime};
pub use splice::{NamedFrame, splice, splice_leaf_settling};
pub use support::{ForeignUnwind, JavaSupport, PythonSupport, RuntimeSupport, Spliced};

#[derive(Debug, thiserror::Error)]
#[error("could not set the interpreter layout of tgid {tgid} in the BPF map")]
pub struct InterpreterMapError {
    pub tgid: u32,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// The BPF map of interpreter processes, shared by the runtimes whose
/// frames the BPF program walks (a trait so they run without BPF in
/// tests).
pub trait InterpreterMap: Send {
    fn set(&mut self, tgid: u32, layout: InterpreterProcess) -> Result<(), InterpreterMapError>;
    /// Removes `tgid`'s entry if it is one of this runtime's: the map is
    /// shared, and another runtime's process is not this one's to drop.
    fn remove(&mut self, tgid: u32);
    /// The layout of every process of `executable`, set by the BPF program
    /// at its exec (`wake_until_ms` a duration from then).
    fn set_executable(&mut self, _executable: ExecutableKey, _layout: InterpreterProcess) {}
}

/// Which interpreter a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    Python,
    Java(JavaKind),
    JavaScript,
    /// A JavaScript function TurboFan or Maglev inlined into the frame
    /// below it.
    JavaScriptInlined,
    Ruby,
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
            Self::Ruby => "[ruby]",
        }
    }

    /// The frame type OpenTelemetry's profiles give frames of this runtime
    /// (`profile.frame.type`), in the words of its eBPF profiler.
    pub fn frame_type(self) -> &'static str {
        match self {
            Self::Python => "cpython",
            Self::Java(_) => "jvm",
            Self::JavaScript | Self::JavaScriptInlined => "v8js",
            Self::Ruby => "ruby",
        }
    }

    /// Every runtime's frames, by the mapping that holds them.
    pub fn of_mapping(name: &str) -> Option<Self> {
        const ALL: [Runtime; 10] = [
            Runtime::Python,
            Runtime::Java(JavaKind::Generated),
            Runtime::Java(JavaKind::Interpreted),
            Runtime::Java(JavaKind::C1),
            Runtime::Java(JavaKind::C2),
            Runtime::Java(JavaKind::Inlined),
            Runtime::Java(JavaKind::Native),
            Runtime::JavaScript,
            Runtime::JavaScriptInlined,
            Runtime::Ruby,
        ];
        ALL.into_iter()
            .find(|runtime| runtime.mapping_name() == name)
    }

    /// The pipeline's order: the first runtime to claim a sample's process
    /// names its frames.
    pub fn order(self) -> u8 {
        match self {
            Self::Java(_) => 0,
            Self::Python => 1,
            Self::JavaScript | Self::JavaScriptInlined => 2,
            Self::Ruby => 3,
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

/// Most objects whose inspection a runtime remembers (interpreters and
/// libraries are shared by many processes; the rest are remembered as
/// "not one"); beyond, all are forgotten and looked at again.
const MAX_REMEMBERED_OBJECTS: usize = 4096;

/// Remembers `value` for the object whose content is `key`, within
/// [`MAX_REMEMBERED_OBJECTS`].
fn remember<V>(cache: &mut HashMap<ContentKey, V>, key: ContentKey, value: V) {
    if cache.len() >= MAX_REMEMBERED_OBJECTS {
        cache.clear();
    }
    cache.insert(key, value);
}

/// The first object `image` maps that `inspect` finds the runtime's
/// (`found`), with the index of the mapping it was read through: the
/// executable and the files whose path `candidate` accepts, each looked at
/// once (its first mapping), what `inspect` said remembered in `seen` by
/// the object's content for the next process that maps it.
fn find_runtime_object<V: Clone>(
    image: &crate::process::ProcessImage,
    processes: &mut crate::process::ProcessTable,
    seen: &mut HashMap<ContentKey, V>,
    candidate: impl Fn(&str) -> bool,
    mut inspect: impl FnMut(&str, &crate::process::ObjectFile) -> V,
    found: impl Fn(&V) -> bool,
) -> Option<(usize, V)> {
    let executable = image.executable();
    for (index, mapping) in image.mappings.iter().enumerate() {
        let spec = &mapping.spec;
        if spec.kind != crate::process::MappingKind::File {
            continue;
        }
        if !(Some(spec.path.as_str()) == executable || candidate(&spec.path))
            || image.mappings[..index]
                .iter()
                .any(|earlier| earlier.spec.path == spec.path)
        {
            continue;
        }
        let Some(object) = processes.object(image, index) else {
            continue;
        };
        let key = object.content_key();
        let value = match seen.get(&key) {
            Some(value) => value.clone(),
            None => {
                let value = inspect(&spec.path, &object);
                remember(seen, key, value.clone());
                value
            }
        };
        if found(&value) {
            return Some((index, value));
        }
    }
    None
}

/// What to add to the object's link-time addresses to get the process's:
/// one value for the whole object, read off the mapping at `index`.
fn load_bias(image: &crate::process::ProcessImage, index: usize) -> Option<u64> {
    let mapping = image.mappings.get(index)?;
    let object = mapping.object()?;
    let vaddr = object.layout.vaddr_for_file_offset(mapping.spec.offset)?;
    Some(mapping.spec.start.wrapping_sub(vaddr))
}
