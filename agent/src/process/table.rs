//! Processes by tgid: their current image (mappings, objects, JIT perf
//! map), replaced on exec, kept for a grace period after exit, bounded in
//! number.

use std::{
    num::NonZeroUsize,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use lru::LruCache;
use tracing::debug;

use super::{
    debugfiles::DebugFileConfig,
    maps::{MapsError, read_maps},
    objects::{ObjectFile, ObjectRegistry},
    offload::{OPEN_DEADLINE, Offload, OffloadError, SlowRoots},
    sources::PerfMapFile,
};
use agent_proc::maps::{MappingKind, MappingSpec};
use exits::ExitQueue;
pub use image::{Mapping, ProcessImage};

use crate::{
    stats::Stats,
    untrusted::{self, ProcessRoot, Refusals},
};

/// Longest the drain thread waits for a process's maps: reading them takes
/// the process's mmap lock, which a thread of it stuck in a page fault on a
/// hung FUSE or NFS mount holds indefinitely. A normal read takes well
/// under a millisecond; the budget is that of a file open.
pub const MAPS_DEADLINE: Duration = OPEN_DEADLINE;

/// Reads a process's mappings (`/proc/PID/maps` below the proc root given);
/// tests put in one that hangs.
pub type MapsReader = Arc<dyn Fn(&Path, u32) -> Result<Vec<MappingSpec>, MapsError> + Send + Sync>;

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

struct Entry {
    image: Arc<ProcessImage>,
    exited_at: Option<Instant>,
    /// A new program whose maps were read before it could have mapped its
    /// libraries (at its exec): with mappings captured at exit, its
    /// samples wait for those or for a read once it has run a while.
    unsettled: bool,
    /// A new program whose maps are not read yet: read at its first
    /// sample, so a process that is never sampled (most short ones) costs
    /// no read of its maps.
    unread: bool,
    /// Its exit event was handled (not only a failed read).
    exit_seen: bool,
}

impl Entry {
    fn exit_seen(&self) -> bool {
        self.exit_seen
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessTableStats {
    pub processes: usize,
    pub objects: usize,
}

pub struct ProcessTable {
    proc_root: PathBuf,
    processes: LruCache<u32, Entry, foldhash::fast::RandomState>,
    /// Exits in the order they were seen, for `expire`.
    exits: ExitQueue,
    objects: ObjectRegistry,
    grace: Duration,
    stats: Arc<Stats>,
    refusals: Refusals,
    /// Perf maps are opened off the drain thread, like objects.
    offload: Offload,
    /// Maps are read off the drain thread too, with a deadline of their own.
    maps_offload: Offload,
    read_maps: MapsReader,
    slow_roots: SlowRoots,
    /// The kernel captures exiting processes' mappings: new programs are
    /// unsettled until their maps are read again or captured.
    captures_exit_maps: bool,
    /// The time of the records being handled, read once for a batch of
    /// them (`set_clock`); without one, the clock is read when needed.
    clock: Option<Instant>,
}

impl ProcessTable {
    /// Where the processes' `/proc` entries are.
    pub fn proc_root(&self) -> &std::path::Path {
        &self.proc_root
    }

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
            processes: LruCache::with_hasher(capacity, Default::default()),
            exits: ExitQueue::default(),
            grace: config.exited_process_grace,
            refusals: Refusals::new(stats.clone()),
            stats,
            offload: Offload::new("firn-open-perf-map", OPEN_DEADLINE),
            maps_offload: Offload::new("firn-read-maps", MAPS_DEADLINE),
            read_maps: Arc::new(read_maps),
            captures_exit_maps: false,
            clock: None,
        }
    }

    /// The kernel captures the mappings of exiting processes (see
    /// [`Self::holds`]).
    pub fn set_captures_exit_maps(&mut self, on: bool) {
        self.captures_exit_maps = on;
    }

    /// Whether a sample of `tgid` should wait for better maps than firn
    /// has: those the kernel captures as the process exits, or a read once
    /// it has run past its loader. True for a new program (its maps read at
    /// its exec, or not read at all yet) and for a live process whose maps
    /// could not be read (it exited before its samples were drained; its
    /// exit event is still to come). Only when the kernel captures.
    ///
    /// A deferred program's maps are not read here: most sampled new
    /// processes are gone before their samples settle, and the capture at
    /// their exit replaces any read. One that lives on is read when it
    /// settles ([`Self::settle`]).
    pub fn holds(&mut self, tgid: u32, comm: &str) -> bool {
        if !self.captures_exit_maps {
            return false;
        }
        if self.processes.peek(&tgid).is_none() {
            self.image(tgid, comm);
        }
        let Some(entry) = self.processes.peek(&tgid) else {
            return false;
        };
        let empty = entry.image.gone || entry.image.mappings.is_empty();
        entry.unsettled || (empty && !entry.exit_seen())
    }

    /// Reads `tgid`'s maps again for its held samples: true (and the
    /// process settled) when they could be read, so it is alive and its
    /// samples can be placed with them.
    pub fn settle(&mut self, tgid: u32, comm: &str) -> bool {
        // A deferred program's name came with its exec event.
        let comm_known = self.unread(tgid);
        let fresh = self.read_image(tgid, comm, comm_known);
        if fresh.gone || fresh.mappings.is_empty() {
            return false;
        }
        self.insert(tgid, Arc::new(fresh));
        true
    }

    /// Reads `tgid`'s maps again now, for a runtime waiting for its loader
    /// to map what it looks for; whether its samples wait stays as it was.
    /// `None` when they could not be read (the process is gone).
    pub fn read_again(&mut self, tgid: u32) -> Option<Arc<ProcessImage>> {
        let entry = self.processes.peek(&tgid)?;
        let (comm, unsettled) = (entry.image.comm.clone(), entry.unsettled);
        let fresh = self.read_image(tgid, &comm, true);
        if fresh.gone || fresh.mappings.is_empty() {
            return None;
        }
        let fresh = Arc::new(fresh);
        self.insert(tgid, fresh.clone());
        if let Some(entry) = self.processes.peek_mut(&tgid) {
            entry.unsettled = unsettled;
        }
        Some(fresh)
    }

    /// A runtime found what it needs in `tgid`'s maps as they are (an
    /// interpreter registered): its samples need not wait for others.
    pub fn settled(&mut self, tgid: u32) {
        if let Some(entry) = self.processes.peek_mut(&tgid) {
            entry.unsettled = false;
        }
    }

    /// The mappings the kernel captured as `tgid` exited replace what
    /// firn read: they are the process's last and whole address space.
    pub fn install_captured(&mut self, tgid: u32, comm: &str, specs: Vec<MappingSpec>) {
        let comm = match self.processes.peek(&tgid) {
            Some(entry) if !entry.image.comm.is_empty() => entry.image.comm.clone(),
            _ => comm.to_owned(),
        };
        Stats::inc(&self.stats.exit_maps_installed);
        self.insert(tgid, Arc::new(ProcessImage::new(tgid, comm, specs)));
    }

    pub fn sizes(&self) -> ProcessTableStats {
        ProcessTableStats {
            processes: self.processes.len(),
            objects: self.objects.len(),
        }
    }

    /// The image of `tgid` if firn has read it, without any I/O.
    pub fn lookup(&mut self, tgid: u32) -> Option<Arc<ProcessImage>> {
        self.processes
            .get(&tgid)
            .filter(|entry| !entry.unread)
            .map(|entry| entry.image.clone())
    }

    /// The maps of `tgid`'s deferred program can no longer be read as they
    /// were (it executed another program, or exited without a capture):
    /// its samples keep unplaced frames rather than be placed in another
    /// image's maps.
    pub fn unreadable(&mut self, tgid: u32) {
        let Some(entry) = self.processes.peek(&tgid) else {
            return;
        };
        if !entry.unread {
            return;
        }
        let comm = entry.image.comm.clone();
        self.insert(tgid, Arc::new(ProcessImage::gone(tgid, comm)));
    }

    /// Whether `tgid` executed a program whose maps are still to be read
    /// (when its samples settle, or at its first sample without the
    /// kernel's capture, by [`Self::image`]).
    pub fn unread(&self, tgid: u32) -> bool {
        self.processes.peek(&tgid).is_some_and(|entry| entry.unread)
    }

    /// The image of `tgid`, reading /proc on first sight. A process that is
    /// already gone gets an empty image (its frames stay unknown).
    ///
    /// Samples arrive in order with exit events, so a sample of a tgid whose
    /// exit was seen comes from a new process that reused the pid (or from a
    /// thread outliving its leader): its maps are read again, at most once
    /// per [`REFRESH_INTERVAL`], and the old image is kept if that fails.
    pub fn image(&mut self, tgid: u32, fallback_comm: &str) -> Arc<ProcessImage> {
        if let Some(entry) = self.processes.peek(&tgid)
            && entry.unread
        {
            return self.first_read(tgid);
        }
        if let Some(entry) = self.processes.get(&tgid) {
            let stale = entry.exited_at.is_some()
                && !entry.image.gone
                && entry.image.read_at.elapsed() >= REFRESH_INTERVAL;
            if !stale {
                return entry.image.clone();
            }
            let old = entry.image.clone();
            let fresh = self.read_image(tgid, fallback_comm, false);
            if fresh.gone {
                return old;
            }
            let fresh = Arc::new(fresh);
            self.insert(tgid, fresh.clone());
            return fresh;
        }
        let image = Arc::new(self.read_image(tgid, fallback_comm, false));
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
        let fresh = Arc::new(self.read_image(tgid, &image.comm, false));
        if fresh.gone {
            // Keep what we had: the old mappings still explain old samples.
            return image;
        }
        self.insert(tgid, fresh.clone());
        fresh
    }

    /// The time of the records handled until the next call (`None`: read
    /// the clock when needed).
    pub fn set_clock(&mut self, now: Option<Instant>) {
        self.clock = now;
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

    /// Opens `/tmp/perf-PID.map` (else the jitdump the process mapped, or
    /// `/tmp/jit-PID.dump`) as the process sees it (PID in its own pid
    /// namespace, the file through its root), retrying at most once per
    /// [`REFRESH_INTERVAL`] while it does not exist.
    fn open_perf_map(&mut self, image: &ProcessImage) {
        let mut slot = image
            .perf_map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = self.clock.unwrap_or_else(Instant::now);
        if slot.file.is_some()
            || slot
                .tried_at
                .is_some_and(|at| now.saturating_duration_since(at) < REFRESH_INTERVAL)
        {
            return;
        }
        slot.tried_at = Some(now);
        let process_dir = self.proc_root.join(image.tgid.to_string());
        let pid = image.tgid;
        let namespace = SlowRoots::namespace(&process_dir);
        if self.slow_roots.is_slow(namespace) {
            return;
        }
        // A JIT writing a jitdump maps a page of it executable so that
        // profilers find it wherever it was written (V8 writes it into its
        // working directory): that mapping names the file.
        let jitdump_marker = image
            .mappings
            .iter()
            .map(|mapping| &mapping.spec)
            .find(|spec| {
                !spec.deleted
                    && Path::new(&spec.path)
                        .file_name()
                        .and_then(|name| name.to_str())
                        .is_some_and(|name| name.starts_with("jit-") && name.ends_with(".dump"))
            })
            .map(|spec| PathBuf::from(&spec.path));
        let opened = self.offload.run(move || {
            let nspid = namespace_pid(&process_dir).unwrap_or(pid);
            let fuse = untrusted::fuse_mounts(&process_dir);
            let root = ProcessRoot::of_process(&process_dir, fuse)?;
            // A perf map first (`--perf-basic-prof`, the JVM's agents), else
            // a jitdump (`--perf-prof`, Wasmtime, Julia, .NET); the
            // symbolizer tells them apart by their first bytes.
            root.open_file(
                Path::new(&format!("/tmp/perf-{nspid}.map")),
                untrusted::MAX_OBJECT_BYTES,
            )
            .or_else(|error| {
                let jitdump = jitdump_marker
                    .unwrap_or_else(|| PathBuf::from(format!("/tmp/jit-{nspid}.dump")));
                root.open_file(&jitdump, untrusted::MAX_OBJECT_BYTES)
                    .map_err(|_| error)
            })
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
    /// is most likely still alive. `comm` is the event's, taken after the
    /// exec: the process's name, not read again.
    ///
    /// `deferrable`: nothing needs the image before the process's first
    /// sample (no runtime registers a process of its executable at once).
    /// With the kernel capturing exit maps the read then waits until its
    /// samples settle: most new processes on a busy host are never
    /// sampled, most of those that are exit first (their capture places
    /// the samples), and the samples of the rest wait for a later read
    /// anyway (they are unsettled).
    pub fn on_exec(&mut self, tgid: u32, comm: &str, deferrable: bool) {
        if deferrable && self.captures_exit_maps {
            Stats::inc(&self.stats.maps_deferred);
            self.insert(
                tgid,
                Arc::new(ProcessImage::new(tgid, comm.to_owned(), Vec::new())),
            );
            if let Some(entry) = self.processes.peek_mut(&tgid) {
                entry.unsettled = true;
                entry.unread = true;
            }
            return;
        }
        let image = Arc::new(self.read_image(tgid, comm, true));
        self.insert(tgid, image);
        if self.captures_exit_maps
            && let Some(entry) = self.processes.peek_mut(&tgid)
        {
            entry.unsettled = true;
        }
    }

    /// The first read of the maps of a new program whose read was deferred
    /// (see [`Self::on_exec`]): it stays unsettled, as if read at its exec.
    fn first_read(&mut self, tgid: u32) -> Arc<ProcessImage> {
        let comm = self
            .processes
            .peek(&tgid)
            .map(|entry| entry.image.comm.clone())
            .unwrap_or_default();
        let image = Arc::new(self.read_image(tgid, &comm, true));
        self.insert(tgid, image.clone());
        if !image.gone
            && let Some(entry) = self.processes.peek_mut(&tgid)
        {
            entry.unsettled = true;
        }
        image
    }

    fn insert(&mut self, tgid: u32, image: Arc<ProcessImage>) {
        let exited_at = image.gone.then(Instant::now);
        if let Some(at) = exited_at {
            self.queue_exit(at, tgid);
        }
        let entry = Entry {
            image,
            exited_at,
            unsettled: false,
            unread: false,
            exit_seen: false,
        };
        if let Some((evicted, _)) = self.processes.push(tgid, entry)
            && evicted != tgid
        {
            Stats::inc(&self.stats.processes_evicted);
        }
    }

    /// Reads the process's name and maps on the maps helper thread. A read
    /// that misses its deadline (or finds earlier reads still stuck) leaves
    /// an empty image, counted as a timed-out read and logged once; the
    /// process is read again after the exit grace period.
    /// `comm_known`: `fallback_comm` is the process's name (from an exec
    /// event), so `/proc/PID/comm` is not read: one file fewer for each
    /// process, most of which are seen once.
    fn read_image(&mut self, tgid: u32, fallback_comm: &str, comm_known: bool) -> ProcessImage {
        Stats::inc(&self.stats.maps_reads);
        let proc_root = self.proc_root.clone();
        let read_maps = self.read_maps.clone();
        let read = self.maps_offload.run(move || {
            let comm = (!comm_known)
                .then(|| {
                    std::fs::read_to_string(proc_root.join(tgid.to_string()).join("comm"))
                        .map(|text| text.trim_end_matches('\n').to_owned())
                        .ok()
                })
                .flatten();
            (comm, read_maps(&proc_root, tgid))
        });
        let (comm, maps) = match read {
            Ok((comm, maps)) => (comm.unwrap_or_else(|| fallback_comm.to_owned()), maps),
            Err(error) => {
                Stats::inc(&self.stats.maps_read_failures);
                if matches!(error, OffloadError::TimedOut(_)) {
                    self.refusals.record_timeout(tgid, "/proc/PID/maps");
                }
                debug!(pid = tgid, %error, "could not read maps");
                return ProcessImage::gone(tgid, fallback_comm.to_owned());
            }
        };
        match maps {
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
    agent_proc::status::namespace_pid(&status)
}

mod exits;
mod image;
#[cfg(test)]
mod tests;
