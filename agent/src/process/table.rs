//! Processes by tgid: their current image (mappings, objects, JIT perf
//! map), replaced on exec, kept for a grace period after exit, bounded in
//! number.

use std::{
    num::NonZeroUsize,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use lru::LruCache;
use tracing::debug;

use super::{
    debugfiles::DebugFileConfig,
    maps::{MappingKind, MappingSpec, MapsError, read_maps},
    objects::{ObjectFile, ObjectRegistry},
    offload::{OPEN_DEADLINE, Offload, OffloadError, SlowRoots},
    sources::PerfMapFile,
};
use crate::{
    stats::Stats,
    untrusted::{self, FuseMounts, ProcessRoot, Refusals},
};

/// How often a process's maps may be re-read because an address fell
/// outside all of them (libraries loaded later, JIT code).
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// How many processes and objects the table keeps, and for how long.
#[derive(Clone, Debug)]
pub struct ProcessTableConfig {
    /// Processes tracked at once.
    pub max_processes: usize,
    /// Open ELF objects (file handles, build ids) kept.
    pub max_objects: usize,
    /// How long an exited process stays resolvable.
    pub exited_process_grace: Duration,
}

impl Default for ProcessTableConfig {
    fn default() -> Self {
        Self {
            max_processes: 16_384,
            max_objects: 4_096,
            exited_process_grace: Duration::from_secs(30),
        }
    }
}

/// One executable mapping, with its object resolved on first use.
#[derive(Debug)]
pub struct Mapping {
    pub spec: MappingSpec,
    object: OnceLock<Option<Arc<ObjectFile>>>,
}

impl Mapping {
    pub fn new(spec: MappingSpec) -> Self {
        Self {
            spec,
            object: OnceLock::new(),
        }
    }

    /// The object, if it was resolved and could be opened.
    pub fn object(&self) -> Option<&Arc<ObjectFile>> {
        self.object.get().and_then(Option::as_ref)
    }

    pub fn contains(&self, address: u64) -> bool {
        address >= self.spec.start && address < self.spec.end
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
    read_at: Instant,
    perf_map: Mutex<PerfMapSlot>,
}

/// The process's `/tmp/perf-PID.map`, opened when its JIT code is first
/// sampled and kept open so it stays readable after the process exits.
#[derive(Debug, Default)]
struct PerfMapSlot {
    file: Option<Arc<PerfMapFile>>,
    tried_at: Option<Instant>,
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

    fn gone(tgid: u32, comm: String) -> Self {
        Self {
            gone: true,
            ..Self::new(tgid, comm, Vec::new())
        }
    }

    /// Index of the mapping containing `address`.
    pub fn mapping_index(&self, address: u64) -> Option<usize> {
        let index = self.mappings.partition_point(|m| m.spec.start <= address);
        let candidate = index.checked_sub(1)?;
        self.mappings[candidate]
            .contains(address)
            .then_some(candidate)
    }

    /// The executable's path, when the main binary is mapped.
    pub fn executable(&self) -> Option<&str> {
        self.mappings
            .iter()
            .find(|m| m.spec.kind == super::MappingKind::File)
            .map(|m| m.spec.path.as_str())
    }
}

struct Entry {
    image: Arc<ProcessImage>,
    exited_at: Option<Instant>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessTableStats {
    pub processes: usize,
    pub objects: usize,
}

pub struct ProcessTable {
    proc_root: PathBuf,
    processes: LruCache<u32, Entry>,
    objects: ObjectRegistry,
    grace: Duration,
    stats: Arc<Stats>,
    refusals: Refusals,
    /// Perf maps are opened off the drain thread, like objects.
    offload: Offload,
    slow_roots: SlowRoots,
}

impl ProcessTable {
    pub fn new(
        proc_root: PathBuf,
        config: &ProcessTableConfig,
        debug_files: &DebugFileConfig,
        stats: Arc<Stats>,
    ) -> Self {
        let capacity = NonZeroUsize::new(config.max_processes).unwrap_or(NonZeroUsize::MIN);
        let objects = ObjectRegistry::new(
            proc_root.clone(),
            config.max_objects,
            debug_files.directories.clone(),
            stats.clone(),
        );
        Self {
            slow_roots: objects.slow_roots(),
            objects,
            proc_root,
            processes: LruCache::new(capacity),
            grace: config.exited_process_grace,
            refusals: Refusals::new(stats.clone()),
            stats,
            offload: Offload::new("firn-open-perf-map", OPEN_DEADLINE),
        }
    }

    pub fn sizes(&self) -> ProcessTableStats {
        ProcessTableStats {
            processes: self.processes.len(),
            objects: self.objects.len(),
        }
    }

    /// The image of `tgid` if firn has read it, without any I/O.
    pub fn lookup(&mut self, tgid: u32) -> Option<Arc<ProcessImage>> {
        self.processes.get(&tgid).map(|entry| entry.image.clone())
    }

    /// The image of `tgid`, reading /proc on first sight. A process that is
    /// already gone gets an empty image (its frames stay unknown).
    ///
    /// Samples arrive in order with exit events, so a sample of a tgid whose
    /// exit was seen comes from a new process that reused the pid (or from a
    /// thread outliving its leader): its maps are read again, at most once
    /// per [`REFRESH_INTERVAL`], and the old image is kept if that fails.
    pub fn image(&mut self, tgid: u32, fallback_comm: &str) -> Arc<ProcessImage> {
        if let Some(entry) = self.processes.get(&tgid) {
            let stale = entry.exited_at.is_some()
                && !entry.image.gone
                && entry.image.read_at.elapsed() >= REFRESH_INTERVAL;
            if !stale {
                return entry.image.clone();
            }
            let old = entry.image.clone();
            let fresh = self.read_image(tgid, fallback_comm);
            if fresh.gone {
                return old;
            }
            let fresh = Arc::new(fresh);
            self.insert(tgid, fresh.clone());
            return fresh;
        }
        let image = Arc::new(self.read_image(tgid, fallback_comm));
        self.insert(tgid, image.clone());
        image
    }

    /// Like [`Self::image`], but re-reads the maps (at most once per
    /// [`REFRESH_INTERVAL`]) when `address` lies outside every mapping.
    pub fn image_covering(
        &mut self,
        tgid: u32,
        fallback_comm: &str,
        address: u64,
    ) -> Arc<ProcessImage> {
        let image = self.image(tgid, fallback_comm);
        if image.gone
            || image.mapping_index(address).is_some()
            || image.read_at.elapsed() < REFRESH_INTERVAL
        {
            return image;
        }
        Stats::inc(&self.stats.maps_refreshed);
        let fresh = Arc::new(self.read_image(tgid, &image.comm));
        if fresh.gone {
            // Keep what we had: the old mappings still explain old samples.
            return image;
        }
        self.insert(tgid, fresh.clone());
        fresh
    }

    /// Opens (once) and returns the object behind a mapping of `image`. For
    /// JIT code (anonymous executable memory) it opens the process's perf
    /// map instead and returns no object.
    pub fn object(&mut self, image: &ProcessImage, index: usize) -> Option<Arc<ObjectFile>> {
        let mapping = image.mappings.get(index)?;
        if mapping.spec.kind == MappingKind::Anonymous {
            self.open_perf_map(image);
            return None;
        }
        mapping
            .object
            .get_or_init(|| match self.objects.resolve(image.tgid, &mapping.spec) {
                Ok(object) => Some(object),
                Err(error) => {
                    debug!(pid = image.tgid, %error, "object unavailable");
                    None
                }
            })
            .clone()
    }

    /// Opens `/tmp/perf-PID.map` as the process sees it (PID in its own pid
    /// namespace, the file through its root), retrying at most once per
    /// [`REFRESH_INTERVAL`] while it does not exist.
    fn open_perf_map(&mut self, image: &ProcessImage) {
        let mut slot = image
            .perf_map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.file.is_some()
            || slot
                .tried_at
                .is_some_and(|at| at.elapsed() < REFRESH_INTERVAL)
        {
            return;
        }
        slot.tried_at = Some(Instant::now());
        let process_dir = self.proc_root.join(image.tgid.to_string());
        let pid = image.tgid;
        let namespace = SlowRoots::namespace(&process_dir);
        if self.slow_roots.is_slow(namespace) {
            return;
        }
        let opened = self.offload.run(move || {
            let nspid = namespace_pid(&process_dir).unwrap_or(pid);
            let fuse = FuseMounts::of_process(&process_dir);
            let root = ProcessRoot::of_process(&process_dir, fuse)?;
            root.open_file(
                Path::new(&format!("/tmp/perf-{nspid}.map")),
                untrusted::MAX_OBJECT_BYTES,
            )
        });
        match opened {
            Ok(Ok(file)) => slot.file = Some(Arc::new(PerfMapFile(file))),
            Ok(Err(error)) => {
                self.refusals.record(pid, &error);
                debug!(pid, %error, "no perf map");
            }
            Err(OffloadError::TimedOut(_)) => {
                self.refusals.record_timeout(pid, "/tmp/perf-PID.map");
                self.slow_roots.mark(namespace);
            }
            Err(error) => debug!(pid, %error, "no perf map"),
        }
    }

    /// The process executed a new program: read its new image now, while it
    /// is most likely still alive.
    pub fn on_exec(&mut self, tgid: u32, comm: &str) {
        let image = Arc::new(self.read_image(tgid, comm));
        self.insert(tgid, image);
    }

    /// The process exited: keep it resolvable for the grace period.
    pub fn on_exit(&mut self, tgid: u32) {
        if let Some(entry) = self.processes.peek_mut(&tgid) {
            entry.exited_at.get_or_insert_with(Instant::now);
        }
    }

    /// Forgets processes that exited more than the grace period ago.
    pub fn expire(&mut self, now: Instant) {
        let grace = self.grace;
        let expired: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, entry)| {
                entry
                    .exited_at
                    .is_some_and(|at| now.duration_since(at) >= grace)
            })
            .map(|(&tgid, _)| tgid)
            .collect();
        for tgid in expired {
            self.processes.pop(&tgid);
        }
        // Called every second: often enough for the gauges.
        Stats::set(&self.stats.processes_tracked, self.processes.len() as u64);
        Stats::set(&self.stats.objects_tracked, self.objects.len() as u64);
    }

    fn insert(&mut self, tgid: u32, image: Arc<ProcessImage>) {
        let exited_at = image.gone.then(Instant::now);
        if let Some((evicted, _)) = self.processes.push(tgid, Entry { image, exited_at })
            && evicted != tgid
        {
            Stats::inc(&self.stats.processes_evicted);
        }
    }

    fn read_image(&self, tgid: u32, fallback_comm: &str) -> ProcessImage {
        let comm = std::fs::read_to_string(self.proc_root.join(tgid.to_string()).join("comm"))
            .map(|text| text.trim_end_matches('\n').to_owned())
            .unwrap_or_else(|_| fallback_comm.to_owned());
        match read_maps(&self.proc_root, tgid) {
            Ok(specs) => ProcessImage::new(tgid, comm, specs),
            Err(MapsError::Gone { .. }) => {
                Stats::inc(&self.stats.processes_gone);
                ProcessImage::gone(tgid, comm)
            }
            Err(error) => {
                Stats::inc(&self.stats.maps_read_failures);
                debug!(pid = tgid, %error, "could not read maps");
                ProcessImage::gone(tgid, comm)
            }
        }
    }
}

/// The process's pid in its own (innermost) pid namespace: the last
/// `NSpid:` field of its status.
fn namespace_pid(process_dir: &Path) -> Option<u32> {
    let status = std::fs::read_to_string(process_dir.join("status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::process::MappingKind;

    fn table(proc_root: &Path, stats: Arc<Stats>) -> ProcessTable {
        ProcessTable::new(
            proc_root.to_path_buf(),
            &ProcessTableConfig::default(),
            &DebugFileConfig {
                directories: Vec::new(),
            },
            stats,
        )
    }

    fn spec(start: u64, end: u64, path: &str) -> MappingSpec {
        MappingSpec {
            start,
            end,
            offset: 0,
            dev: 0,
            inode: 0,
            path: path.into(),
            kind: MappingKind::File,
            deleted: false,
        }
    }

    #[test]
    fn mapping_index_finds_the_containing_mapping() {
        let image = ProcessImage::new(
            1,
            "x".into(),
            vec![spec(0x1000, 0x2000, "/a"), spec(0x5000, 0x6000, "/b")],
        );
        assert_eq!(image.mapping_index(0x1000), Some(0));
        assert_eq!(image.mapping_index(0x1fff), Some(0));
        assert_eq!(image.mapping_index(0x2000), None);
        assert_eq!(image.mapping_index(0x5800), Some(1));
        assert_eq!(image.mapping_index(0x10), None);
        assert_eq!(image.executable(), Some("/a"));
    }

    #[test]
    fn own_process_is_read_and_its_objects_resolve() {
        let stats = Arc::new(Stats::default());
        let mut table = table(Path::new("/proc"), stats.clone());
        let pid = std::process::id();
        let image = table.image(pid, "fallback");
        assert!(!image.gone);
        let here = own_address();
        let index = image.mapping_index(here).expect("this function is mapped");
        let object = table.object(&image, index).expect("the test binary opens");
        assert!(object.build_id().is_some());
        assert!(image.mappings[index].object_vaddr(here).is_some());
        assert!(Arc::ptr_eq(&image, &table.image(pid, "fallback")), "cached");
    }

    fn own_address() -> u64 {
        own_address as *const () as usize as u64
    }

    #[test]
    fn a_vanished_process_gets_an_empty_counted_image() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let mut table = table(dir.path(), stats.clone());
        let image = table.image(31337, "ghost");
        assert!(image.gone);
        assert_eq!(image.comm, "ghost");
        assert_eq!(image.mapping_index(0x1000), None);
        assert_eq!(stats.snapshot().processes_gone, 1);
        // Gone processes expire after the grace period.
        table.expire(Instant::now() + ProcessTableConfig::default().exited_process_grace);
        assert_eq!(table.sizes().processes, 0);
    }

    #[test]
    fn exit_keeps_the_image_for_the_grace_period() {
        let stats = Arc::new(Stats::default());
        let mut table = table(Path::new("/proc"), stats);
        let pid = std::process::id();
        let image = table.image(pid, "me");
        table.on_exit(pid);
        table.expire(Instant::now());
        assert!(
            table
                .lookup(pid)
                .is_some_and(|kept| Arc::ptr_eq(&kept, &image))
        );
        table.expire(
            Instant::now()
                + ProcessTableConfig::default().exited_process_grace
                + Duration::from_secs(1),
        );
        assert!(table.lookup(pid).is_none());
    }

    #[test]
    fn a_pid_seen_again_after_its_exit_is_read_again() {
        let stats = Arc::new(Stats::default());
        let root = tempfile::tempdir().expect("tempdir");
        let process = root.path().join("42");
        std::fs::create_dir_all(&process).expect("mkdir");
        let maps = |path: &str| format!("55d4e0a01000-55d4e0a02000 r-xp 00001000 fe:01 7 {path}\n");
        std::fs::write(process.join("maps"), maps("/usr/bin/old")).expect("write");
        let mut table = table(root.path(), stats);
        assert_eq!(table.image(42, "old").executable(), Some("/usr/bin/old"));

        // The program is replaced without an exec event (pid reuse): still
        // the cached image while the process has not exited.
        std::fs::write(process.join("maps"), maps("/usr/bin/new")).expect("write");
        assert_eq!(table.image(42, "old").executable(), Some("/usr/bin/old"));

        table.on_exit(42);
        let entry = table
            .processes
            .peek_mut(&42)
            .expect("kept for the grace period");
        let image = Arc::get_mut(&mut entry.image).expect("no other holder");
        image.read_at = Instant::now()
            .checked_sub(REFRESH_INTERVAL)
            .expect("the clock is past the interval");
        let fresh = table.image(42, "new");
        assert_eq!(fresh.executable(), Some("/usr/bin/new"));
        assert!(
            table
                .lookup(42)
                .is_some_and(|kept| Arc::ptr_eq(&kept, &fresh)),
            "the new process replaces the exited one"
        );
        // Once gone for good, the exited image is what remains.
        table.on_exit(42);
        std::fs::remove_dir_all(&process).expect("rm");
        assert_eq!(table.image(42, "new").executable(), Some("/usr/bin/new"));
    }

    #[test]
    fn jit_code_opens_the_perf_map_named_by_the_namespace_pid() {
        let stats = Arc::new(Stats::default());
        let root = tempfile::tempdir().expect("tempdir");
        let process = root.path().join("42");
        std::fs::create_dir_all(process.join("root/tmp")).expect("mkdir");
        // Pid 42 on the host is pid 7 in its container.
        std::fs::write(process.join("status"), "Name:\tnode\nNSpid:\t42\t7\n").expect("write");
        std::fs::write(
            process.join("mountinfo"),
            "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n",
        )
        .expect("write");
        std::fs::write(
            process.join("maps"),
            "7f0000000000-7f0000100000 r-xp 00000000 00:00 0 \n",
        )
        .expect("write");
        let mut table = table(root.path(), stats);
        let image = table.image(42, "node");
        assert_eq!(image.mappings[0].spec.kind, MappingKind::Anonymous);
        assert!(table.object(&image, 0).is_none());
        assert!(image.perf_map().is_none(), "no perf map written yet");

        std::fs::write(
            process.join("root/tmp/perf-7.map"),
            "7f0000000000 10 JS:*f\n",
        )
        .expect("write");
        table.object(&image, 0);
        assert!(
            image.perf_map().is_none(),
            "retried at most once per interval"
        );
        image.perf_map.lock().expect("not poisoned").tried_at.take();
        table.object(&image, 0);
        assert!(image.perf_map().is_some());
    }

    #[test]
    fn the_table_is_bounded_and_counts_evictions() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let config = ProcessTableConfig {
            max_processes: 2,
            ..ProcessTableConfig::default()
        };
        let no_debug_files = DebugFileConfig {
            directories: Vec::new(),
        };
        let mut table = ProcessTable::new(
            dir.path().to_path_buf(),
            &config,
            &no_debug_files,
            stats.clone(),
        );
        for pid in 1..=5 {
            table.image(pid, "p");
        }
        assert_eq!(table.sizes().processes, 2);
        assert_eq!(stats.snapshot().processes_evicted, 3);
    }
}
