//! What the builder is fed: an interval's symbolized stacks. Frames and
//! mappings are kept once in a table ([`Frames`]) and stacks point into it,
//! so profiles cut from one interval (one per series) share them.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

/// The file name of the kernel's mapping, as perf and Parca spell it.
pub(crate) const KERNEL_MAPPING: &str = "[kernel.kallsyms]";
/// Where the kernel's half of the address space starts (x86-64, arm64).
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// One source-level frame of a location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// Human-readable (demangled) name.
    pub function: String,
    /// The name as the object spells it (mangled).
    pub system_name: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// A mapping of the sampled address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The pprof file name: a path, `[vdso]`, `[anon]`, `[kernel.kallsyms]`.
    pub path: String,
    /// Hex; empty when unknown.
    pub build_id: String,
    pub start: u64,
    /// One past the last address.
    pub limit: u64,
    pub offset: u64,
    /// The kernel's mapping says it holds functions whatever its frames;
    /// a user mapping says what its named frames hold.
    pub kernel: bool,
}

impl Mapping {
    /// The kernel's half of the address space.
    pub fn kernel(build_id: String) -> Self {
        Self {
            path: KERNEL_MAPPING.to_owned(),
            build_id,
            start: KERNEL_START,
            limit: u64::MAX,
            offset: 0,
            kernel: true,
        }
    }
}

/// Where a frame's code lies: it decides how a frame without a name is
/// counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Kernel,
    /// In an object file that was read: unnamed means its symbols and
    /// debug information miss the address.
    Object,
    /// No object to read: outside every mapping, JIT code, a file that
    /// could not be opened.
    NoObject,
}

/// One distinct frame of an interval: what becomes one pprof location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Index into [`Frames::mappings`]; `None` outside every mapping.
    pub mapping: Option<usize>,
    /// The runtime address, as sampled.
    pub address: u64,
    pub origin: Origin,
    /// Innermost (inlined) first, the function they were inlined into
    /// last; empty when the frame could not be named. Shared: one object
    /// mapped by many processes names its frames once.
    pub lines: Arc<[Line]>,
}

/// The frames and mappings an interval's stacks point into.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frames {
    pub mappings: Vec<Mapping>,
    pub frames: Vec<Frame>,
}

/// One distinct stack and its samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    pub count: u64,
    /// The sample's string labels, in order.
    pub labels: Arc<[(String, String)]>,
    /// Indices into [`Frames::frames`], leaf first.
    pub frames: Box<[usize]>,
}

/// When and how often the stacks were sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub start: SystemTime,
    pub duration: Duration,
    /// The sampling period (1e9 / frequency).
    pub period_ns: i64,
}
