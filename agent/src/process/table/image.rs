//! A process's image: its executable mappings as firn last read them,
//! each with its object resolved on first use, and its JIT perf map.

use std::{
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use agent_proc::maps::MappingSpec;

use crate::process::{objects::ObjectFile, sources::PerfMapFile};

/// One executable mapping, with its object resolved on first use.
#[derive(Debug)]
pub struct Mapping {
    pub spec: MappingSpec,
    /// The path is a system library's ([`crate::unwind::is_system_library`]),
    /// judged once rather than for every frame unwound in it.
    pub system: bool,
    pub(super) object: OnceLock<Option<Arc<ObjectFile>>>,
}

impl AsRef<MappingSpec> for Mapping {
    fn as_ref(&self) -> &MappingSpec {
        &self.spec
    }
}

impl Mapping {
    pub fn new(spec: MappingSpec) -> Self {
        Self {
            system: crate::unwind::is_system_library(&spec.path),
            spec,
            object: OnceLock::new(),
        }
    }

    /// The object, if it was resolved and could be opened.
    pub fn object(&self) -> Option<&Arc<ObjectFile>> {
        self.object.get().and_then(Option::as_ref)
    }

    pub fn contains(&self, address: u64) -> bool {
        self.spec.contains(address)
    }

    /// The link-time address in the object for a runtime address.
    pub fn object_vaddr(&self, address: u64) -> Option<u64> {
        let object = self.object()?;
        let file_offset = address.checked_sub(self.spec.start)? + self.spec.offset;
        object.layout.vaddr_for_file_offset(file_offset)
    }
}

/// A process's address space as firn last read it. Samples keep the image
/// they were taken under, so an exec does not re-symbolize old samples
/// against the new program.
#[derive(Debug)]
pub struct ProcessImage {
    pub tgid: u32,
    /// The process's name (its main thread's comm).
    pub comm: String,
    pub mappings: Vec<Mapping>,
    /// The maps could not be read: the process had already exited.
    pub gone: bool,
    pub(super) read_at: Instant,
    pub(super) perf_map: Mutex<PerfMapSlot>,
    /// Every runtime looked at this image and found it is not theirs.
    passed_over: AtomicBool,
}

/// The process's `/tmp/perf-PID.map`, or else its `/tmp/jit-PID.dump`,
/// opened when its JIT code is first sampled and kept open so it stays readable after the process exits.
#[derive(Debug, Default)]
pub(super) struct PerfMapSlot {
    pub(super) file: Option<Arc<PerfMapFile>>,
    pub(super) tried_at: Option<Instant>,
}

impl ProcessImage {
    pub fn new(tgid: u32, comm: String, specs: Vec<MappingSpec>) -> Self {
        Self {
            tgid,
            comm,
            mappings: specs.into_iter().map(Mapping::new).collect(),
            gone: false,
            read_at: Instant::now(),
            perf_map: Mutex::default(),
            passed_over: AtomicBool::new(false),
        }
    }

    /// The perf map of this image's JIT code, if one was found.
    pub fn perf_map(&self) -> Option<Arc<PerfMapFile>> {
        self.perf_map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .file
            .clone()
    }

    /// Whether every runtime looked at this image and passed it over (a
    /// new image is looked at again).
    pub fn passed_over(&self) -> bool {
        self.passed_over.load(Ordering::Relaxed)
    }

    pub fn set_passed_over(&self) {
        self.passed_over.store(true, Ordering::Relaxed);
    }

    /// The image of a process whose maps could not be read (it exited).
    pub(crate) fn gone(tgid: u32, comm: String) -> Self {
        Self {
            gone: true,
            ..Self::new(tgid, comm, Vec::new())
        }
    }

    /// Index of the mapping containing `address`.
    pub fn mapping_index(&self, address: u64) -> Option<usize> {
        agent_proc::maps::mapping_index(&self.mappings, address)
    }

    /// The executable's path, when the main binary is mapped.
    pub fn executable(&self) -> Option<&str> {
        agent_proc::maps::executable(&self.mappings)
    }
}
