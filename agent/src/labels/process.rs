//! Per-process metadata read from /proc (cgroups, command line,
//! executable), once per process and then cached: bounded caches per pid,
//! per cgroup membership and per v2 cgroup id, with a time to live and
//! counters.

mod cgroup_ids;

use std::{
    hash::Hash,
    num::NonZeroUsize,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use agent_proc::cgroup::CgroupInfo;
use lru::LruCache;

use self::cgroup_ids::CgroupIds;
use crate::{host::Host, stats::Stats};

/// Longest command line kept; the rest is cut (a label is no place for
/// megabytes of arguments).
const MAX_CMDLINE: usize = 4096;
/// A sample from another cgroup than the one read re-reads the process at
/// most this often (threads of one process may sit in different cgroups).
const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What firn knows about one process besides its memory map.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProcessMetadata {
    pub pid: u32,
    /// Arguments joined by spaces, cut at [`MAX_CMDLINE`] bytes.
    pub cmdline: String,
    /// The target of /proc/PID/exe (in the process's mount namespace).
    pub executable: Option<String>,
    pub cgroup: Arc<CgroupInfo>,
    /// The (v2) cgroup id the BPF program saw when this was read.
    pub cgroup_id: u64,
}

impl ProcessMetadata {
    /// A process firn could not read (it exited first).
    pub fn unknown(pid: u32) -> Self {
        Self {
            pid,
            ..Self::default()
        }
    }

    /// The executable's base name.
    pub fn executable_name(&self) -> Option<&str> {
        let path = self.executable.as_deref()?;
        path.rsplit('/').next().filter(|name| !name.is_empty())
    }
}

/// Sizes and lifetimes of the metadata caches.
#[derive(Clone, Debug)]
pub struct MetadataLimits {
    pub max_processes: usize,
    /// Distinct cgroup memberships, and distinct v2 cgroup ids.
    pub max_cgroups: usize,
    /// After this, a process's metadata is read again on its next sample
    /// (cgroup moves are seen at once through the cgroup id; a v1-only
    /// move is seen after this).
    pub process_ttl: Duration,
    pub cgroup_ttl: Duration,
}

impl Default for MetadataLimits {
    fn default() -> Self {
        Self {
            max_processes: 16_384,
            max_cgroups: 4_096,
            process_ttl: Duration::from_secs(60),
            cgroup_ttl: Duration::from_secs(600),
        }
    }
}

/// A least-recently-used cache whose entries also expire.
pub struct TtlCache<K: Hash + Eq, V> {
    entries: LruCache<K, (V, Instant)>,
    ttl: Duration,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            entries: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
            ttl,
        }
    }

    /// The value, unless absent or older than the time to live.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        let (value, at) = self.entries.get(key)?;
        (now.duration_since(*at) < self.ttl).then(|| value.clone())
    }

    /// The value whatever its age, and when it was stored.
    pub fn peek_stale(&mut self, key: &K) -> Option<(V, Instant)> {
        self.entries.peek(key).cloned()
    }

    /// True if another entry had to go to make room.
    pub fn insert(&mut self, key: K, value: V, now: Instant) -> bool {
        matches!(self.entries.push(key.clone(), (value, now)), Some((old, _)) if old != key)
    }

    pub fn remove(&mut self, key: &K) {
        self.entries.pop(key);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Reads and caches [`ProcessMetadata`]; owned by the sampling side, which
/// sees processes while they are alive.
pub struct MetadataReader {
    proc_root: PathBuf,
    processes: TtlCache<u32, Arc<ProcessMetadata>>,
    /// Keyed by the whole text of /proc/PID/cgroup: the processes of one
    /// container share it, and so share one parse. With the id of the v2
    /// cgroup it names.
    cgroups: TtlCache<String, (Arc<CgroupInfo>, Option<u64>)>,
    ids: CgroupIds,
    stats: Arc<Stats>,
}

impl MetadataReader {
    /// Reads beneath the host's `/proc`; learns v2 cgroup ids in its
    /// unified cgroup hierarchy.
    pub fn new(host: &Host, limits: &MetadataLimits, stats: Arc<Stats>) -> Self {
        Self {
            proc_root: host.proc().to_path_buf(),
            processes: TtlCache::new(limits.max_processes, limits.process_ttl),
            cgroups: TtlCache::new(limits.max_cgroups, limits.cgroup_ttl),
            ids: CgroupIds::new(
                host.unified_cgroup_root(),
                limits.max_cgroups,
                limits.cgroup_ttl,
                stats.clone(),
            ),
            stats,
        }
    }

    /// The metadata of `tgid`, and whether it was just read. Reads /proc on
    /// first sight, once the entry expired, or when the sample comes from
    /// another cgroup than the one read (at most once a second). A process
    /// gone before its first read gets the cgroup facts of the live
    /// processes of its sample's cgroup, when that tells them.
    pub fn get(&mut self, tgid: u32, cgroup_id: u64) -> (Arc<ProcessMetadata>, bool) {
        self.get_at(tgid, cgroup_id, Instant::now())
    }

    /// [`Self::get`] at `now`, a time the caller read once for many
    /// samples.
    pub fn get_at(
        &mut self,
        tgid: u32,
        cgroup_id: u64,
        now: Instant,
    ) -> (Arc<ProcessMetadata>, bool) {
        if let Some(metadata) = self.processes.get(&tgid, now) {
            let moved = metadata.cgroup_id != cgroup_id;
            let recheck = moved
                && self
                    .processes
                    .peek_stale(&tgid)
                    .is_some_and(|(_, at)| now.duration_since(at) >= RECHECK_INTERVAL);
            if !recheck {
                Stats::inc(&self.stats.process_metadata_cache_hits);
                return (metadata, false);
            }
        }
        Stats::inc(&self.stats.process_metadata_cache_misses);
        let metadata = match self.read(tgid, cgroup_id, now) {
            Some(metadata) => Arc::new(metadata),
            // Gone: what was known before still describes its samples.
            None => match self.processes.peek_stale(&tgid) {
                Some((old, _)) => old,
                None => Arc::new(self.unreadable(tgid, cgroup_id, now)),
            },
        };
        if self.processes.insert(tgid, metadata.clone(), now) {
            Stats::inc(&self.stats.process_metadata_cache_evictions);
        }
        (metadata, true)
    }

    /// The process executed a new program (its command line and
    /// executable changed) or exited (its pid may be reused).
    pub fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    pub fn len(&self) -> usize {
        self.processes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    /// A process firn could not read, which it knew nothing of: the cgroup
    /// facts of its sample's cgroup when firn read a process there (its
    /// command line and executable stay unknown).
    fn unreadable(&mut self, tgid: u32, cgroup_id: u64, now: Instant) -> ProcessMetadata {
        match self.ids.any(cgroup_id, now) {
            Some(cgroup) => {
                Stats::inc(&self.stats.process_metadata_from_cgroup_id);
                ProcessMetadata {
                    pid: tgid,
                    cgroup,
                    cgroup_id,
                    ..ProcessMetadata::default()
                }
            }
            None => {
                Stats::inc(&self.stats.process_metadata_unknown);
                ProcessMetadata::unknown(tgid)
            }
        }
    }

    fn read(&mut self, tgid: u32, cgroup_id: u64, now: Instant) -> Option<ProcessMetadata> {
        let dir = self.proc_root.join(tgid.to_string());
        let command_line = |bytes: Vec<u8>| agent_proc::status::command_line(&bytes, MAX_CMDLINE);
        // Where the cgroup file's text follows from the sample's cgroup id
        // (a v2-only host), it is not read: the command line's read then
        // tells whether the process is there.
        let (cgroup, cmdline) = match self.ids.unified(cgroup_id, now) {
            Some(cgroup) => (
                cgroup,
                command_line(std::fs::read(dir.join("cmdline")).ok()?),
            ),
            None => {
                // The cgroup file is the one that must be there: without
                // it the process is gone.
                let text = std::fs::read_to_string(dir.join("cgroup")).ok()?;
                let cmdline = std::fs::read(dir.join("cmdline"))
                    .map(command_line)
                    .unwrap_or_default();
                (self.cgroup(text, cgroup_id, now), cmdline)
            }
        };
        let executable = std::fs::read_link(dir.join("exe")).ok().map(|path| {
            let path = path.to_string_lossy();
            path.strip_suffix(" (deleted)").unwrap_or(&path).to_owned()
        });
        Some(ProcessMetadata {
            pid: tgid,
            cmdline,
            executable,
            cgroup,
            cgroup_id,
        })
    }

    /// The facts of a live process's cgroup `text`, parsed once per text;
    /// its v2 cgroup id learns them.
    fn cgroup(&mut self, text: String, cgroup_id: u64, now: Instant) -> Arc<CgroupInfo> {
        let (info, id) = match self.cgroups.get(&text, now) {
            Some((info, id)) => {
                Stats::inc(&self.stats.cgroup_cache_hits);
                // A sample from another cgroup: the process moved, or its
                // cgroup was made again under the same path (a restarted
                // unit), with a new id.
                if id != Some(cgroup_id) {
                    let now_id = self.ids.id_of(&text);
                    if now_id != id {
                        self.cgroups
                            .insert(text.clone(), (info.clone(), now_id), now);
                    }
                    (info, now_id)
                } else {
                    (info, id)
                }
            }
            None => {
                Stats::inc(&self.stats.cgroup_cache_misses);
                let info = Arc::new(CgroupInfo::parse(&text));
                let id = self.ids.id_of(&text);
                if self.cgroups.insert(text.clone(), (info.clone(), id), now) {
                    Stats::inc(&self.stats.cgroup_cache_evictions);
                }
                (info, id)
            }
        };
        if let Some(id) = id {
            self.ids.learn(id, &text, &info, now);
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::MetadataExt, path::Path};

    use super::*;

    /// A host whose `/proc` is `dir`, without a cgroup hierarchy.
    fn fake_host(dir: &Path) -> Host {
        Host::at(dir.to_path_buf(), dir.join("sys"))
    }

    #[test]
    fn own_process_is_read_once_then_served_from_the_cache() {
        let stats = Arc::new(Stats::default());
        let mut reader =
            MetadataReader::new(&Host::system(), &MetadataLimits::default(), stats.clone());
        let pid = std::process::id();
        let (first, fresh) = reader.get(pid, 7);
        assert!(fresh);
        assert_eq!(first.pid, pid);
        let exe = std::env::current_exe().expect("own path");
        assert_eq!(
            first.executable_name(),
            exe.file_name().and_then(|n| n.to_str())
        );
        assert!(!first.cmdline.is_empty());
        assert!(!first.cgroup.path.is_empty());
        let (second, fresh) = reader.get(pid, 7);
        assert!(!fresh);
        assert!(Arc::ptr_eq(&first, &second));
        let snapshot = stats.snapshot();
        assert_eq!(
            (
                snapshot.process_metadata_cache_misses,
                snapshot.process_metadata_cache_hits
            ),
            (1, 1)
        );
        assert_eq!(snapshot.cgroup_cache_misses, 1);
        reader.forget(pid);
        let (third, fresh) = reader.get(pid, 7);
        assert!(fresh && !Arc::ptr_eq(&first, &third));
        assert_eq!(stats.snapshot().cgroup_cache_hits, 1, "same cgroup text");
    }

    #[test]
    fn metadata_expires_by_the_time_given() {
        let stats = Arc::new(Stats::default());
        let limits = MetadataLimits::default();
        let mut reader = MetadataReader::new(&Host::system(), &limits, stats);
        let pid = std::process::id();
        let batch = Instant::now();
        assert!(reader.get_at(pid, 7, batch).1);
        assert!(!reader.get_at(pid, 7, batch).1, "one read for the batch");
        let later = batch + limits.process_ttl + Duration::from_secs(1);
        assert!(reader.get_at(pid, 7, later).1, "read again once expired");
    }

    #[test]
    fn a_vanished_process_gets_unknown_metadata() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let mut reader =
            MetadataReader::new(&fake_host(dir.path()), &MetadataLimits::default(), stats);
        let (metadata, _) = reader.get(4_194_305, 1);
        assert_eq!(*metadata, ProcessMetadata::unknown(4_194_305));
        assert_eq!(metadata.executable_name(), None);
    }

    #[test]
    fn caches_are_bounded_expire_and_count_evictions() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        for pid in 1..=3 {
            let process = dir.path().join(pid.to_string());
            std::fs::create_dir(&process).expect("dir");
            std::fs::write(process.join("cgroup"), format!("0::/slice/{pid}.service\n"))
                .expect("cgroup");
            std::fs::write(process.join("cmdline"), b"prog\0--flag\0").expect("cmdline");
        }
        let limits = MetadataLimits {
            max_processes: 2,
            max_cgroups: 2,
            ..MetadataLimits::default()
        };
        let mut reader = MetadataReader::new(&fake_host(dir.path()), &limits, stats.clone());
        for pid in 1..=3 {
            let (metadata, _) = reader.get(pid, 1);
            assert_eq!(metadata.cmdline, "prog --flag");
            assert_eq!(
                metadata.cgroup.systemd_unit.as_deref(),
                Some(format!("{pid}.service").as_str())
            );
        }
        assert_eq!(reader.len(), 2);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.process_metadata_cache_evictions, 1);
        assert_eq!(snapshot.cgroup_cache_evictions, 1);

        let mut cache = TtlCache::new(4, Duration::from_secs(10));
        let start = Instant::now();
        cache.insert("a", 1, start);
        assert_eq!(cache.get(&"a", start + Duration::from_secs(9)), Some(1));
        assert_eq!(cache.get(&"a", start + Duration::from_secs(10)), None);
        assert_eq!(cache.peek_stale(&"a").map(|(v, _)| v), Some(1));
    }

    /// A host laid out in `dir`: `proc/PID/{cgroup,cmdline}` for each
    /// `(pid, cgroup text)` (no cgroup file where it is `None`) and a v2
    /// hierarchy with a directory for each of `cgroups`, whose ids (inode
    /// numbers) are returned in that order.
    fn host_with(
        dir: &Path,
        processes: &[(u32, Option<&str>)],
        cgroups: &[&str],
    ) -> (Host, Vec<u64>) {
        for (pid, text) in processes {
            let process = dir.join(format!("proc/{pid}"));
            std::fs::create_dir_all(&process).expect("pid dir");
            std::fs::write(process.join("cmdline"), format!("prog\0{pid}\0")).expect("cmdline");
            if let Some(text) = text {
                std::fs::write(process.join("cgroup"), text).expect("cgroup");
            }
        }
        let root = dir.join("sys/fs/cgroup");
        std::fs::create_dir_all(&root).expect("cgroup root");
        std::fs::write(root.join("cgroup.controllers"), "cpu memory\n").expect("controllers");
        let ids = cgroups
            .iter()
            .map(|path| {
                let cgroup = root.join(path);
                std::fs::create_dir_all(&cgroup).expect("cgroup dir");
                std::fs::metadata(&cgroup).expect("cgroup dir").ino()
            })
            .collect();
        (Host::at(dir.join("proc"), dir.join("sys")), ids)
    }

    #[test]
    fn a_gone_process_gets_the_cgroup_facts_of_its_cgroup_id() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let (host, ids) = host_with(
            dir.path(),
            &[(1, Some("0::/system.slice/app.service\n"))],
            &["system.slice/app.service", "system.slice/other.service"],
        );
        let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats.clone());
        let (live, _) = reader.get(1, ids[0]);
        assert_eq!(live.cmdline, "prog 1");
        assert_eq!(live.cgroup.systemd_unit.as_deref(), Some("app.service"));

        // Pid 2 is gone (no /proc/2) and its sample was taken in the cgroup
        // of pid 1.
        let (gone, _) = reader.get(2, ids[0]);
        assert!(Arc::ptr_eq(&gone.cgroup, &live.cgroup));
        assert_eq!((gone.pid, gone.cgroup_id), (2, ids[0]));
        assert_eq!(
            (gone.cmdline.as_str(), gone.executable.as_deref()),
            ("", None)
        );
        // Another cgroup no live process was read in: nothing known.
        let (unknown, _) = reader.get(3, ids[1]);
        assert_eq!(*unknown, ProcessMetadata::unknown(3));
        let snapshot = stats.snapshot();
        assert_eq!(
            (
                snapshot.process_metadata_from_cgroup_id,
                snapshot.process_metadata_unknown
            ),
            (1, 1)
        );
    }

    #[test]
    fn a_v2_only_cgroup_file_is_not_read_again_for_a_known_id() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let unified = "0::/system.slice/app.service\n";
        let hybrid = "4:cpu:/\n0::/hybrid.scope\n";
        // Pids 2 and 4 have a command line but no cgroup file: where it
        // is read, they count as gone.
        let (host, ids) = host_with(
            dir.path(),
            &[(1, Some(unified)), (2, None), (3, Some(hybrid)), (4, None)],
            &["system.slice/app.service", "hybrid.scope"],
        );
        let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats.clone());
        let (first, _) = reader.get(1, ids[0]);
        let before = stats.snapshot();
        let (second, _) = reader.get(2, ids[0]);
        assert_eq!(second.cmdline, "prog 2", "read, without its cgroup file");
        assert!(Arc::ptr_eq(&second.cgroup, &first.cgroup));
        let after = stats.snapshot().since(&before);
        assert_eq!(after.cgroup_cache_hits + after.cgroup_cache_misses, 0);
        assert_eq!(after.cgroup_id_cache_hits, 1);

        // With v1 lines the text does not follow from the id: read.
        let (third, _) = reader.get(3, ids[1]);
        assert_eq!(third.cgroup.systemd_unit.as_deref(), Some("hybrid.scope"));
        let (fourth, _) = reader.get(4, ids[1]);
        assert_eq!(
            fourth.cmdline, "",
            "taken for gone: its cgroup file is missing"
        );
        assert!(Arc::ptr_eq(&fourth.cgroup, &third.cgroup));
        assert_eq!(stats.snapshot().process_metadata_from_cgroup_id, 1);
    }

    #[test]
    fn an_id_is_learned_from_its_cgroup_not_from_a_sample_taken_before_a_move() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let (host, ids) = host_with(
            dir.path(),
            &[(1, Some("0::/b.service\n"))],
            &["a.service", "b.service"],
        );
        let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats);
        // Sampled in a.service, read once it was in b.service.
        let (moved, _) = reader.get(1, ids[0]);
        assert_eq!(moved.cgroup.systemd_unit.as_deref(), Some("b.service"));
        assert_eq!(*reader.get(2, ids[0]).0, ProcessMetadata::unknown(2));
        let (gone, _) = reader.get(3, ids[1]);
        assert_eq!(gone.cgroup.systemd_unit.as_deref(), Some("b.service"));
    }

    #[test]
    fn a_unit_made_again_is_learned_under_its_new_id() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let (host, ids) = host_with(
            dir.path(),
            &[(1, Some("0::/a.service\n")), (2, Some("0::/a.service\n"))],
            &["a.service"],
        );
        let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats);
        reader.get(1, ids[0]);
        // Restarted: a new directory, so a new id, under the same path.
        let root = dir.path().join("sys/fs/cgroup");
        std::fs::rename(root.join("a.service"), root.join("old")).expect("rename");
        std::fs::create_dir(root.join("a.service")).expect("made again");
        let new_id = std::fs::metadata(root.join("a.service"))
            .expect("dir")
            .ino();
        assert_ne!(new_id, ids[0]);
        reader.get(2, new_id);
        let (gone, _) = reader.get(3, new_id);
        assert_eq!(gone.cgroup.systemd_unit.as_deref(), Some("a.service"));
    }

    #[test]
    fn an_id_whose_processes_differ_in_v1_tells_nothing() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let container = format!("4:cpu:/docker/{}\n0::/shared.service\n", "a".repeat(64));
        let (host, ids) = host_with(
            dir.path(),
            &[
                (1, Some("4:cpu:/\n0::/shared.service\n")),
                (2, Some(&container)),
            ],
            &["shared.service"],
        );
        let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats);
        assert!(reader.get(1, ids[0]).0.cgroup.container.is_none());
        assert!(reader.get(2, ids[0]).0.cgroup.container.is_some());
        assert_eq!(*reader.get(3, ids[0]).0, ProcessMetadata::unknown(3));
    }

    #[test]
    fn without_a_v2_hierarchy_nothing_is_learned() {
        let stats = Arc::new(Stats::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, ids) = host_with(dir.path(), &[(1, Some("0::/a.service\n"))], &["a.service"]);
        let host = Host::at(dir.path().join("proc"), dir.path().join("no-sys"));
        let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats.clone());
        assert!(reader.get(1, ids[0]).0.cgroup.systemd_unit.is_some());
        assert_eq!(*reader.get(2, ids[0]).0, ProcessMetadata::unknown(2));
        assert_eq!(stats.snapshot().process_metadata_unknown, 1);
    }
}
