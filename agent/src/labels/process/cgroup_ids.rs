//! The cgroup facts of v2 cgroups, by the id the BPF program records with
//! every sample (`bpf_get_current_cgroup_id`). Learned from processes read
//! alive, they label the samples of a process that exited before firn
//! read it (its container, pod and unit are those of its cgroup), and
//! spare the read of /proc/PID/cgroup where its text follows from the id.

use std::{
    os::unix::fs::MetadataExt,
    path::{Component, Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use agent_proc::cgroup::CgroupInfo;

use super::TtlCache;
use crate::stats::Stats;

/// What one v2 cgroup's processes were seen with.
#[derive(Clone, Debug)]
struct Known {
    info: Arc<CgroupInfo>,
    /// The whole text of /proc/PID/cgroup was the v2 line: every process
    /// of the cgroup has that text.
    unified_only: bool,
    /// Its processes were read with different facts (on a hybrid host
    /// their v1 memberships differ): the id alone does not tell them.
    ambiguous: bool,
}

/// A bounded map from v2 cgroup id to the facts of its processes.
pub(super) struct CgroupIds {
    /// The unified hierarchy's mount; `None`: nothing is learned.
    root: Option<PathBuf>,
    entries: TtlCache<u64, Known>,
    stats: Arc<Stats>,
}

impl CgroupIds {
    pub(super) fn new(
        root: Option<PathBuf>,
        capacity: usize,
        ttl: Duration,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            root,
            entries: TtlCache::new(capacity, ttl),
            stats,
        }
    }

    /// The id of the v2 cgroup `text` (a /proc/PID/cgroup) names: the
    /// inode number of its directory, which is the id the BPF program
    /// records. The sample's id is not taken for it: the process may have
    /// moved since.
    pub(super) fn id_of(&self, text: &str) -> Option<u64> {
        let root = self.root.as_ref()?;
        let relative = Path::new(unified_path(text)?.strip_prefix('/')?);
        // A path outside firn's cgroup namespace (`/../…`) is not below
        // this mount.
        if !relative
            .components()
            .all(|part| matches!(part, Component::Normal(_)))
        {
            return None;
        }
        let metadata = std::fs::metadata(root.join(relative)).ok()?;
        metadata.is_dir().then(|| metadata.ino())
    }

    /// A process of cgroup `id` was read alive with `text`, parsed into
    /// `info`.
    pub(super) fn learn(&mut self, id: u64, text: &str, info: &Arc<CgroupInfo>, now: Instant) {
        let known = match self.entries.get(&id, now) {
            Some(old)
                if old.ambiguous || (!Arc::ptr_eq(&old.info, info) && *old.info != **info) =>
            {
                Known {
                    ambiguous: true,
                    ..old
                }
            }
            _ => Known {
                info: info.clone(),
                unified_only: unified_only(text),
                ambiguous: false,
            },
        };
        if self.entries.insert(id, known, now) {
            Stats::inc(&self.stats.cgroup_id_cache_evictions);
        }
    }

    /// The facts every process of cgroup `id` has, when the text of its
    /// /proc/PID/cgroup follows from the id: then it need not be read.
    pub(super) fn unified(&mut self, id: u64, now: Instant) -> Option<Arc<CgroupInfo>> {
        self.lookup(id, now, |known| known.unified_only)
    }

    /// The facts of the processes of cgroup `id`, for one firn could not
    /// read.
    pub(super) fn any(&mut self, id: u64, now: Instant) -> Option<Arc<CgroupInfo>> {
        self.lookup(id, now, |_| true)
    }

    fn lookup(
        &mut self,
        id: u64,
        now: Instant,
        usable: impl Fn(&Known) -> bool,
    ) -> Option<Arc<CgroupInfo>> {
        let found = self
            .entries
            .get(&id, now)
            .filter(|known| !known.ambiguous && usable(known));
        match found {
            Some(known) => {
                Stats::inc(&self.stats.cgroup_id_cache_hits);
                Some(known.info)
            }
            None => {
                Stats::inc(&self.stats.cgroup_id_cache_misses);
                None
            }
        }
    }
}

/// The path of the v2 line (`0::/path`).
fn unified_path(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.strip_prefix("0::"))
}

/// Whether `text` has no line besides the v2 one.
fn unified_only(text: &str) -> bool {
    let mut lines = text.lines().filter(|line| !line.is_empty());
    matches!((lines.next(), lines.next()), (Some(line), None) if line.starts_with("0::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lone_v2_line_follows_from_the_id() {
        assert!(unified_only("0::/system.slice/a.service\n"));
        assert!(!unified_only(
            "1:cpu:/docker/x\n0::/system.slice/a.service\n"
        ));
        assert!(!unified_only(""));
        assert_eq!(unified_path("4:memory:/x\n0::/a.scope\n"), Some("/a.scope"));
        assert_eq!(unified_path("4:memory:/x\n"), None);
    }
}
