//! Plain configuration, built from the command line (`cli`) and consumed by
//! the pipeline. Nothing here parses or validates flags.

use std::{path::PathBuf, time::Duration};

/// What the BPF side samples and how.
#[derive(Clone, Debug)]
pub struct SamplingConfig {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Only these processes (tgids), filtered in the kernel; empty = all.
    pub pids: Vec<u32>,
    /// Ring buffer size in bytes (a power of two, at least a page);
    /// `None` sizes it from the CPU count.
    pub ring_buffer_bytes: Option<u32>,
    /// User stack bytes copied per sample for unwinding the leaf frame with
    /// CFI (frame-pointer walks lose the caller of a leaf without a frame).
    pub leaf_stack_copy_bytes: u32,
    /// How user stacks are unwound.
    pub unwind: UnwindMode,
    /// User stack bytes copied per sample of a process unwound with DWARF.
    pub stack_copy_bytes: u32,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            frequency_hz: 100,
            pids: Vec::new(),
            ring_buffer_bytes: None,
            leaf_stack_copy_bytes: 1024,
            unwind: UnwindMode::Auto,
            stack_copy_bytes: 16 * 1024,
        }
    }
}

/// How user stacks are unwound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnwindMode {
    /// Per process: DWARF where its code lacks frame pointers.
    #[default]
    Auto,
    /// The kernel's frame-pointer walk, leaf repaired with CFI.
    FramePointers,
    /// DWARF CFI over a copy of the stack, for every process.
    Dwarf,
}

/// Sizes of every cache and queue.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Processes tracked at once.
    pub max_processes: usize,
    /// Open ELF objects (file handles, build ids) kept.
    pub max_objects: usize,
    /// Bytes of symbol tables kept in memory.
    pub symbol_cache_bytes: usize,
    /// Bytes of unwind tables kept in memory.
    pub unwind_cache_bytes: usize,
    /// Distinct stacks per profile; samples beyond are counted as dropped.
    pub max_stacks_per_profile: usize,
    /// How long an exited process stays resolvable.
    pub exited_process_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_processes: 16_384,
            max_objects: 4_096,
            symbol_cache_bytes: 64 << 20,
            unwind_cache_bytes: 32 << 20,
            max_stacks_per_profile: 200_000,
            exited_process_grace: Duration::from_secs(30),
        }
    }
}

/// `firn record`: one recording, one profile.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    pub sampling: SamplingConfig,
    pub limits: Limits,
    pub duration: Duration,
    pub output: PathBuf,
    pub flamegraph: Option<PathBuf>,
}

/// `firn`: the long-running agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub sampling: SamplingConfig,
    pub limits: Limits,
    /// One profile per interval.
    pub profiling_duration: Duration,
    pub local_store: LocalStoreConfig,
}

#[derive(Clone, Debug)]
pub struct LocalStoreConfig {
    pub directory: PathBuf,
    /// Oldest profiles are deleted (and counted) beyond this many bytes.
    pub max_bytes: u64,
}
