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
    /// A process whose image ended in an exec, its samples still being
    /// handled: /proc already shows the next program, so it is not read.
    ended: Option<u32>,
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
            ended: None,
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
        let read = match self.ended {
            Some(ended) if ended == tgid => None,
            _ => self.read(tgid, cgroup_id, now),
        };
        let metadata = match read {
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
        if self.ended == Some(tgid) {
            self.ended = None;
        }
    }

    /// `tgid` executed another program: until [`Self::forget`], the
    /// samples of the image before are labelled with what was read of it
    /// (else as a process that could not be read), not with the next
    /// program's command line and executable.
    pub fn image_ended(&mut self, tgid: u32) {
        self.ended = Some(tgid);
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
mod tests;
