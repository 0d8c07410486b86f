//! ELF objects behind mappings: opened once per (device, inode), with their
//! build id, load segments and separate debug files, kept open so they stay
//! readable after the process that mapped them exits (and after its mount
//! namespace is gone).

use std::{
    fs::File,
    io,
    num::NonZeroUsize,
    ops::Deref,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use lru::LruCache;
use tracing::debug;

use super::{
    debugfiles::{DebugFile, open_debug_files},
    ids::{ContentId, ContentIds},
    offload::{OPEN_DEADLINE, Offload, OffloadError, SlowRoots},
};
use crate::{
    stats::Stats,
    untrusted::{self, MappedFile, ProcessRoot, Refusal, Refusals},
};
use agent_elf::{self as elf, BuildId, ElfLayout, SharedBytes};
pub use agent_elf::{ContentKey, ObjectKey};
use agent_proc::maps::{MappingKind, MappingSpec};

enum ObjectSource {
    File(File),
    Memory(Arc<[u8]>),
}

/// An ELF object some process has mapped.
pub struct ObjectFile {
    pub key: ObjectKey,
    /// The path as the process that mapped it sees it.
    pub path: String,
    pub layout: ElfLayout,
    /// Candidate separate debug files, best first, not yet checked against
    /// the object (empty when the object has DWARF of its own).
    pub debug_files: Vec<DebugFile>,
    /// Names the object's content in the unwinder's caches: shared by
    /// the registry's objects of one content, else the object's own.
    pub content_id: ContentId,
    source: ObjectSource,
}

impl std::fmt::Debug for ObjectFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectFile")
            .field("key", &self.key)
            .field("path", &self.path)
            .field("build_id", &self.layout.build_id)
            .finish()
    }
}

/// The bytes of an object, memory-mapped or in memory.
pub enum ObjectData {
    Mapped(MappedFile),
    Memory(Arc<[u8]>),
}

impl Deref for ObjectData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(map) => map,
            Self::Memory(bytes) => bytes,
        }
    }
}

impl AsRef<[u8]> for ObjectData {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl SharedBytes for ObjectData {
    fn release_pages(&self) {
        if let Self::Mapped(map) = self {
            map.release_pages();
        }
    }
}

/// An object's bytes for positioned reads, see [`ObjectFile::contents`].
pub enum ObjectContents {
    File(File),
    Memory(Arc<[u8]>),
}

impl ObjectFile {
    pub fn build_id(&self) -> Option<&BuildId> {
        self.layout.build_id.as_ref()
    }

    pub fn content_key(&self) -> ContentKey {
        ContentKey::of(self.key, &self.layout)
    }

    /// The object's bytes, for the symbolizer and unwinder to parse.
    pub fn data(&self) -> io::Result<ObjectData> {
        match &self.source {
            // A file truncated underneath reads as zeros past its end (see
            // `untrusted::MappedFile`).
            ObjectSource::File(file) => MappedFile::map(file).map(ObjectData::Mapped),
            ObjectSource::Memory(bytes) => Ok(ObjectData::Memory(bytes.clone())),
        }
    }

    /// The object's bytes for reading in pieces (the debuginfo upload
    /// streams them): another handle on the open file, or the bytes in
    /// memory. Nothing is mapped, so nothing stays resident.
    pub fn contents(&self) -> io::Result<ObjectContents> {
        match &self.source {
            ObjectSource::File(file) => file.try_clone().map(ObjectContents::File),
            ObjectSource::Memory(bytes) => Ok(ObjectContents::Memory(bytes.clone())),
        }
    }

    /// Opens an object by its host path, with its debug files (for tools
    /// and benchmarks; processes' objects come from the registry).
    pub fn open(path: &Path, debug_directories: &[PathBuf]) -> Result<Self, ObjectError> {
        let display = path.display().to_string();
        let io_error = |source| ObjectError::Io {
            path: display.clone(),
            source,
        };
        let file =
            untrusted::open_host_file(path, untrusted::MAX_OBJECT_BYTES).map_err(|error| {
                ObjectError::Open {
                    path: display.clone(),
                    pid: 0,
                    source: error,
                }
            })?;
        let meta = file.metadata().map_err(io_error)?;
        let key = ObjectKey::File {
            dev: meta.dev(),
            inode: meta.ino(),
        };
        let mut object = Self::from_file(key, &display, file)?;
        object.debug_files =
            open_debug_files(None, &display, &object.layout, debug_directories, &|_| {});
        Ok(object)
    }

    fn from_file(key: ObjectKey, path: &str, file: File) -> Result<Self, ObjectError> {
        let map = MappedFile::map(&file).map_err(|source| ObjectError::Io {
            path: path.to_owned(),
            source,
        })?;
        let layout = elf::read_layout(&map).map_err(|source| ObjectError::Elf {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            key,
            path: path.to_owned(),
            layout,
            debug_files: Vec::new(),
            content_id: ContentId::fresh(),
            source: ObjectSource::File(file),
        })
    }

    pub fn from_memory(key: ObjectKey, path: &str, bytes: Arc<[u8]>) -> Result<Self, ObjectError> {
        let layout = elf::read_layout(&bytes).map_err(|source| ObjectError::Elf {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            key,
            path: path.to_owned(),
            layout,
            debug_files: Vec::new(),
            content_id: ContentId::fresh(),
            source: ObjectSource::Memory(bytes),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("could not open {path} (mapped by process {pid})")]
    Open {
        path: String,
        pid: u32,
        #[source]
        source: untrusted::OpenError,
    },
    #[error("gave up opening {path} (mapped by process {pid})")]
    Stalled {
        path: String,
        pid: u32,
        #[source]
        source: OffloadError,
    },
    #[error("could not read {path}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a usable ELF object")]
    Elf {
        path: String,
        #[source]
        source: elf::ElfError,
    },
    #[error("mapping of kind {kind:?} has no object")]
    NoObject { kind: MappingKind },
}

/// Open objects by key, bounded; evictions are counted.
pub struct ObjectRegistry {
    proc_root: PathBuf,
    /// Where separate debug files are looked for (`/usr/lib/debug`).
    debug_directories: Vec<PathBuf>,
    objects: LruCache<ObjectKey, Arc<ObjectFile>>,
    /// The content ids of `objects`, an entry per content held.
    content_ids: ContentIds,
    vdso: Option<Arc<ObjectFile>>,
    stats: Arc<Stats>,
    refusals: Refusals,
    offload: Offload,
    slow_roots: SlowRoots,
}

impl ObjectRegistry {
    pub fn new(
        proc_root: PathBuf,
        capacity: usize,
        debug_directories: Vec<PathBuf>,
        stats: Arc<Stats>,
    ) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        let refusals = Refusals::new(stats.clone());
        let vdso = match own_vdso() {
            // Its debug file, if the host has one (by build id: the kernel's
            // debug packages ship it), is the host's.
            Ok(mut vdso) => {
                vdso.debug_files = open_debug_files(
                    None,
                    &vdso.path,
                    &vdso.layout,
                    &debug_directories,
                    &|error| {
                        refusals.record(std::process::id(), error);
                    },
                );
                Some(Arc::new(vdso))
            }
            Err(error) => {
                debug!(%error, "vDSO frames will not be symbolized");
                None
            }
        };
        Self {
            proc_root,
            debug_directories,
            objects: LruCache::new(capacity),
            content_ids: ContentIds::default(),
            vdso,
            refusals,
            stats,
            offload: Offload::new("firn-open", OPEN_DEADLINE),
            slow_roots: SlowRoots::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// How many contents the registry's objects have ids for.
    pub fn content_ids(&self) -> usize {
        self.content_ids.len()
    }

    /// The object behind `mapping` of process `pid`, opened on first use.
    pub fn resolve(
        &mut self,
        pid: u32,
        mapping: &MappingSpec,
    ) -> Result<Arc<ObjectFile>, ObjectError> {
        let key = match mapping.kind {
            MappingKind::File => ObjectKey::File {
                dev: mapping.dev,
                inode: mapping.inode,
            },
            MappingKind::Vdso => {
                return self.vdso.clone().ok_or(ObjectError::NoObject {
                    kind: MappingKind::Vdso,
                });
            }
            MappingKind::Anonymous => {
                return Err(ObjectError::NoObject {
                    kind: MappingKind::Anonymous,
                });
            }
        };
        if let Some(object) = self.objects.get(&key) {
            return Ok(object.clone());
        }
        let result = self.open(pid, mapping, key).map(|mut object| {
            object.content_id = self.content_ids.acquire(object.content_key());
            Arc::new(object)
        });
        match &result {
            Ok(object) => {
                Stats::inc(&self.stats.objects_opened);
                if let Some((evicted_key, evicted)) = self.objects.push(key, object.clone())
                    && evicted_key != key
                {
                    Stats::inc(&self.stats.objects_evicted);
                    self.content_ids.release(&evicted.content_key());
                }
            }
            Err(_) => Stats::inc(&self.stats.object_open_failures),
        }
        result
    }

    /// Opens the exact file the process maps, then its debug files, each
    /// off this thread and with a deadline (see [`open_object`]). Paths
    /// inside a mount namespace where a lookup hung are not looked up
    /// again for a while.
    fn open(
        &mut self,
        pid: u32,
        mapping: &MappingSpec,
        key: ObjectKey,
    ) -> Result<ObjectFile, ObjectError> {
        let process_dir = self.proc_root.join(pid.to_string());
        let namespace = SlowRoots::namespace(&process_dir);
        let inside_root = !self.slow_roots.is_slow(namespace);
        let spec = mapping.clone();
        let refusals = self.refusals.clone();
        let opened = self
            .offload
            .run(move || open_object(&process_dir, pid, &spec, key, inside_root, &refusals));
        let (mut object, root) = self.finish(pid, mapping, namespace, opened)??;
        let path = mapping.path.clone();
        let layout = object.layout.clone();
        let directories = self.debug_directories.clone();
        let refusals = self.refusals.clone();
        let debug_files = self.offload.run(move || {
            open_debug_files(root.as_ref(), &path, &layout, &directories, &|error| {
                refusals.record(pid, error);
            })
        });
        // Without its debug files the object still has its symbols.
        object.debug_files = self
            .finish(pid, mapping, namespace, debug_files)
            .unwrap_or_default();
        Ok(object)
    }

    /// The result of offloaded work; a missed deadline is counted and its
    /// mount namespace remembered as slow.
    fn finish<T>(
        &mut self,
        pid: u32,
        mapping: &MappingSpec,
        namespace: Option<u64>,
        result: Result<T, OffloadError>,
    ) -> Result<T, ObjectError> {
        result.map_err(|source| {
            if matches!(source, OffloadError::TimedOut(_)) {
                self.refusals.record_timeout(pid, &mapping.path);
                self.slow_roots.mark(namespace);
            }
            ObjectError::Stalled {
                path: mapping.path.clone(),
                pid,
                source,
            }
        })
    }

    /// Shared with the process table, which looks up perf maps inside the
    /// same roots.
    pub fn slow_roots(&self) -> SlowRoots {
        self.slow_roots.clone()
    }
}

/// Opens the exact file a process maps: through map_files (works for
/// deleted files and other mount namespaces), then by its path inside the
/// process's root (unless `inside_root` is false), then the host path if
/// its device and inode match. Every open is checked (see
/// [`crate::untrusted`]); a refused file is not tried by another path,
/// since every path leads to the same file. Returns the process's root
/// too, for the debug files.
fn open_object(
    process_dir: &Path,
    pid: u32,
    mapping: &MappingSpec,
    key: ObjectKey,
    inside_root: bool,
    refusals: &Refusals,
) -> Result<(ObjectFile, Option<ProcessRoot>), ObjectError> {
    let map_file = process_dir
        .join("map_files")
        .join(format!("{:x}-{:x}", mapping.start, mapping.end));
    // Decided from the kernel's own lists before touching the file: a
    // stat or page fault on FUSE waits for its server, unkillably.
    let fuse = untrusted::fuse_mounts(process_dir);
    if fuse.has_device(mapping.dev) {
        let error = untrusted::OpenError::Refused {
            path: mapping.path.clone(),
            reason: Refusal::Fuse,
            detail: "on a FUSE mount".into(),
        };
        refusals.record(pid, &error);
        return Err(ObjectError::Open {
            path: mapping.path.clone(),
            pid,
            source: error,
        });
    }
    let root = inside_root
        .then(|| ProcessRoot::of_process(process_dir, fuse).ok())
        .flatten();
    let host_path = Path::new(&mapping.path);
    let mut last_error = None;
    for attempt in 0..3 {
        let opened = match attempt {
            0 => untrusted::open_magic_link(&map_file, untrusted::MAX_OBJECT_BYTES),
            1 => match &root {
                Some(root) => root.open_file(host_path, untrusted::MAX_OBJECT_BYTES),
                None => continue,
            },
            _ => {
                untrusted::open_host_file(host_path, untrusted::MAX_OBJECT_BYTES).and_then(|file| {
                    if same_inode(&file, mapping) {
                        Ok(file)
                    } else {
                        Err(untrusted::OpenError::Io {
                            path: mapping.path.clone(),
                            source: io::Error::from(io::ErrorKind::NotFound),
                        })
                    }
                })
            }
        };
        match opened {
            Ok(file) => return Ok((ObjectFile::from_file(key, &mapping.path, file)?, root)),
            Err(error) if error.refusal().is_some() => {
                refusals.record(pid, &error);
                return Err(ObjectError::Open {
                    path: mapping.path.clone(),
                    pid,
                    source: error,
                });
            }
            Err(error) => last_error = Some(error),
        }
    }
    Err(ObjectError::Open {
        path: mapping.path.clone(),
        pid,
        source: last_error.unwrap_or_else(|| untrusted::OpenError::Io {
            path: mapping.path.clone(),
            source: io::Error::from(io::ErrorKind::NotFound),
        }),
    })
}

fn same_inode(file: &File, mapping: &MappingSpec) -> bool {
    file.metadata()
        .map(|meta| meta.ino() == mapping.inode && meta.dev() == mapping.dev)
        .unwrap_or(false)
}

/// This process's own vDSO image: every 64-bit process on the host maps the
/// same one.
fn own_vdso() -> Result<ObjectFile, ObjectError> {
    let maps = super::maps::read_maps(Path::new("/proc"), std::process::id()).map_err(|error| {
        ObjectError::Io {
            path: "[vdso]".into(),
            source: io::Error::other(error.to_string()),
        }
    })?;
    let vdso = maps
        .iter()
        .find(|m| m.kind == MappingKind::Vdso)
        .ok_or(ObjectError::NoObject {
            kind: MappingKind::Vdso,
        })?;
    let len = usize::try_from(vdso.end - vdso.start).unwrap_or(0);
    // SAFETY: the vDSO is mapped readable in this process for its whole
    // life, at the range /proc/self/maps reports.
    let bytes: Arc<[u8]> =
        unsafe { std::slice::from_raw_parts(vdso.start as usize as *const u8, len) }.into();
    ObjectFile::from_memory(ObjectKey::Vdso, "[vdso]", bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vdso_is_parsed_from_memory() {
        let vdso = own_vdso().expect("this process has a vDSO");
        assert!(vdso.build_id().is_some());
        let data = vdso.data().expect("in memory");
        let symbols = elf::read_symbols(&elf::Bytes::new(Arc::new(data))).expect("vDSO symbols");
        assert!(!symbols.is_empty());
    }

    #[test]
    fn objects_are_opened_once_per_inode() {
        let stats = Arc::new(Stats::default());
        let mut registry =
            ObjectRegistry::new(PathBuf::from("/proc"), 8, Vec::new(), stats.clone());
        let pid = std::process::id();
        let maps = super::super::maps::read_maps(Path::new("/proc"), pid).expect("own maps");
        let own = maps
            .iter()
            .find(|m| m.kind == MappingKind::File)
            .expect("the test binary is file-backed");
        let first = registry.resolve(pid, own).expect("opens");
        let second = registry.resolve(pid, own).expect("cached");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(stats.snapshot().objects_opened, 1);
        assert!(first.build_id().is_some());
    }

    #[test]
    fn content_ids_go_with_the_objects_let_go() {
        let stats = Arc::new(Stats::default());
        let mut registry =
            ObjectRegistry::new(PathBuf::from("/proc"), 1, Vec::new(), stats.clone());
        let pid = std::process::id();
        let maps = super::super::maps::read_maps(Path::new("/proc"), pid).expect("own maps");
        let mut files = maps.iter().filter(|m| m.kind == MappingKind::File);
        let own = files.next().expect("the test binary is file-backed");
        let other = files
            .find(|m| (m.dev, m.inode) != (own.dev, own.inode))
            .expect("a shared library is mapped");
        let first = registry.resolve(pid, own).expect("opens");
        assert_eq!(registry.content_ids(), 1);
        let library = registry.resolve(pid, other).expect("opens");
        assert_ne!(first.content_id, library.content_id);
        assert_eq!(stats.snapshot().objects_evicted, 1);
        assert_eq!(
            registry.content_ids(),
            1,
            "the evicted object's id is forgotten"
        );
        // Opened again, the object's content gets a new id: rows cached
        // under the old one are never taken for another object's.
        let again = registry.resolve(pid, own).expect("opens again");
        assert_ne!(again.content_id, first.content_id);
        assert_eq!(registry.content_ids(), 1);
    }

    #[test]
    fn a_missing_file_is_a_counted_failure() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let mut registry =
            ObjectRegistry::new(dir.path().to_path_buf(), 8, Vec::new(), stats.clone());
        let mapping = MappingSpec {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            dev: 1,
            inode: 2,
            path: "/nonexistent/firn-test-object".into(),
            kind: MappingKind::File,
            deleted: false,
        };
        assert!(matches!(
            registry.resolve(99, &mapping),
            Err(ObjectError::Open { pid: 99, .. })
        ));
        assert_eq!(stats.snapshot().object_open_failures, 1);
    }
}
