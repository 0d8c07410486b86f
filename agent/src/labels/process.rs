//! Per-process metadata read from /proc (cgroups, command line,
//! executable), once per process and then cached: bounded caches per pid
//! and per cgroup membership, with a time to live and counters.

use std::{
    hash::Hash,
    num::NonZeroUsize,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use agent_proc::cgroup::CgroupInfo;
use lru::LruCache;

use crate::stats::Stats;

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
    /// container share it, and so share one parse.
    cgroups: TtlCache<String, Arc<CgroupInfo>>,
    stats: Arc<Stats>,
}

impl MetadataReader {
    pub fn new(proc_root: PathBuf, limits: &MetadataLimits, stats: Arc<Stats>) -> Self {
        Self {
            proc_root,
            processes: TtlCache::new(limits.max_processes, limits.process_ttl),
            cgroups: TtlCache::new(limits.max_cgroups, limits.cgroup_ttl),
            stats,
        }
    }

    /// The metadata of `tgid`, and whether it was just read. Reads /proc on
    /// first sight, once the entry expired, or when the sample comes from
    /// another cgroup than the one read (at most once a second).
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
        let metadata = match self.read(tgid, cgroup_id) {
            Some(metadata) => Arc::new(metadata),
            // Gone: what was known before still describes its samples.
            None => match self.processes.peek_stale(&tgid) {
                Some((old, _)) => old,
                None => Arc::new(ProcessMetadata::unknown(tgid)),
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

    fn read(&mut self, tgid: u32, cgroup_id: u64) -> Option<ProcessMetadata> {
        let dir = self.proc_root.join(tgid.to_string());
        // The cgroup file is the one that must be there: without it the
        // process is gone.
        let cgroup_text = std::fs::read_to_string(dir.join("cgroup")).ok()?;
        let cmdline = std::fs::read(dir.join("cmdline"))
            .map(|bytes| agent_proc::status::command_line(&bytes, MAX_CMDLINE))
            .unwrap_or_default();
        let executable = std::fs::read_link(dir.join("exe")).ok().map(|path| {
            let path = path.to_string_lossy();
            path.strip_suffix(" (deleted)").unwrap_or(&path).to_owned()
        });
        let cgroup = self.cgroup(cgroup_text);
        Some(ProcessMetadata {
            pid: tgid,
            cmdline,
            executable,
            cgroup,
            cgroup_id,
        })
    }

    fn cgroup(&mut self, text: String) -> Arc<CgroupInfo> {
        let now = Instant::now();
        if let Some(info) = self.cgroups.get(&text, now) {
            Stats::inc(&self.stats.cgroup_cache_hits);
            return info;
        }
        Stats::inc(&self.stats.cgroup_cache_misses);
        let info = Arc::new(CgroupInfo::parse(&text));
        if self.cgroups.insert(text, info.clone(), now) {
            Stats::inc(&self.stats.cgroup_cache_evictions);
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_read_once_then_served_from_the_cache() {
        let stats = Arc::new(Stats::default());
        let mut reader = MetadataReader::new(
            PathBuf::from("/proc"),
            &MetadataLimits::default(),
            stats.clone(),
        );
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
        let mut reader = MetadataReader::new(PathBuf::from("/proc"), &limits, stats);
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
            MetadataReader::new(dir.path().to_path_buf(), &MetadataLimits::default(), stats);
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
        let mut reader = MetadataReader::new(dir.path().to_path_buf(), &limits, stats.clone());
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
}
