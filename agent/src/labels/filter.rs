//! `relabel_configs`' keep and drop rules applied to a process on its
//! first sample, before anything is spent on it: a process the rules drop
//! is neither unwound nor symbolized, and once the BPF program is told its
//! tgid (`ExclusionMap`) its samples stop there. Only where the verdict
//! rests on labels known at once (the process's own, its cgroup's, the
//! node's): a process in a container, when Kubernetes pod labels or
//! container runtime names (which arrive later) are asked for, is left to
//! the output stage's rules as before.

use std::{
    num::NonZeroUsize,
    sync::{Arc, Weak},
};

use lru::LruCache;
use tracing::debug;

use super::{Labeler, MetadataConfig, ProcessMetadata, relabel::Action};
use crate::{host::Host, process::ProcessImage, stats::Stats};

/// The BPF map of excluded tgids; a trait so the filter is tested without
/// BPF.
pub trait ExclusionMap: Send {
    /// False when the map refused the entry (full).
    fn exclude(&mut self, tgid: u32) -> bool;
    fn include(&mut self, tgid: u32);
}

/// Whether `metadata`'s rules are worth applying to processes on their
/// first sample: some keep or drop a process.
pub fn applies_early(metadata: &MetadataConfig) -> bool {
    metadata
        .relabel_rules
        .iter()
        .any(|rule| matches!(rule.action(), Action::Keep | Action::Drop))
}

/// One process's verdict, for the image and metadata it was made from.
struct Verdict {
    image: Weak<ProcessImage>,
    metadata: Weak<ProcessMetadata>,
    kept: bool,
}

pub struct ProcessFilter {
    /// The node's and the processes' own providers only.
    labeler: Labeler,
    /// Containers get labels from Kubernetes or their runtime, later.
    containers_deferred: bool,
    verdicts: LruCache<u32, Verdict>,
    map: Option<Box<dyn ExclusionMap>>,
    stats: Arc<Stats>,
}

impl ProcessFilter {
    /// `capacity`: processes remembered (the process table's size).
    pub fn new(metadata: &MetadataConfig, host: &Host, capacity: usize, stats: Arc<Stats>) -> Self {
        Self {
            labeler: Labeler::new(
                &MetadataConfig {
                    runtime_sockets: Vec::new(),
                    kubernetes: None,
                    ..metadata.clone()
                },
                host,
                None,
            ),
            containers_deferred: metadata.kubernetes.is_some()
                || !metadata.runtime_sockets.is_empty(),
            verdicts: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
            map: None,
            stats,
        }
    }

    /// Excluded processes are written into `map` from now on.
    pub fn with_map(mut self, map: Box<dyn ExclusionMap>) -> Self {
        self.map = Some(map);
        self
    }

    /// Whether the rules keep the process; decided once per image and
    /// metadata read. A sample of a process they drop is counted here.
    pub fn kept(&mut self, image: &Arc<ProcessImage>, metadata: &Arc<ProcessMetadata>) -> bool {
        let tgid = image.tgid;
        let kept = match self.verdicts.get(&tgid) {
            Some(verdict)
                if std::ptr::eq(verdict.image.as_ptr(), Arc::as_ptr(image))
                    && std::ptr::eq(verdict.metadata.as_ptr(), Arc::as_ptr(metadata)) =>
            {
                verdict.kept
            }
            _ => {
                // A container's labels may come later: left to the output
                // stage, which applies the rules to every label. A process
                // already gone is judged by what is known of it, as the
                // output stage would.
                let cgroup = &metadata.cgroup;
                let deferred = self.containers_deferred
                    && (cgroup.container.is_some() || cgroup.pod_uid.is_some());
                let kept = deferred || self.labeler.labels(image, metadata).is_some();
                let was_excluded = self.verdicts.peek(&tgid).is_some_and(|v| !v.kept);
                self.verdicts.push(
                    tgid,
                    Verdict {
                        image: Arc::downgrade(image),
                        metadata: Arc::downgrade(metadata),
                        kept,
                    },
                );
                match (kept, was_excluded) {
                    (false, false) => self.exclude(tgid, image.gone),
                    (true, true) => self.include(tgid),
                    _ => {}
                }
                kept
            }
        };
        if !kept {
            Stats::inc(&self.stats.samples_excluded);
        }
        kept
    }

    /// `gone`: the process exited already, and with it the entry the BPF
    /// program would drop; none is written (a later process reusing the
    /// pid without an exec would inherit it).
    fn exclude(&mut self, tgid: u32, gone: bool) {
        Stats::inc(&self.stats.processes_excluded);
        debug!(
            pid = tgid,
            "relabeling drops the process: its samples are left out"
        );
        if !gone
            && let Some(map) = &mut self.map
            && !map.exclude(tgid)
        {
            Stats::inc(&self.stats.exclusion_map_full);
        }
    }

    fn include(&mut self, tgid: u32) {
        if let Some(map) = &mut self.map {
            map.include(tgid);
        }
    }

    /// The process executed a new image (its labels change) or exited.
    pub fn forget(&mut self, tgid: u32) {
        if self.verdicts.pop(&tgid).is_some_and(|v| !v.kept) {
            self.include(tgid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::labels::{CgroupInfo, Rule, relabel::RuleSpec};

    #[derive(Default)]
    struct FakeMap(Arc<Mutex<Vec<u32>>>);

    impl ExclusionMap for FakeMap {
        fn exclude(&mut self, tgid: u32) -> bool {
            self.0.lock().expect("lock").push(tgid);
            true
        }

        fn include(&mut self, tgid: u32) {
            self.0.lock().expect("lock").retain(|&t| t != tgid);
        }
    }

    fn config(runtime_sockets: Vec<std::path::PathBuf>) -> MetadataConfig {
        MetadataConfig {
            node: "node-a".into(),
            external_labels: Vec::new(),
            relabel_rules: vec![
                Rule::new(&RuleSpec {
                    source_labels: vec!["comm".into()],
                    regex: Some("keep.*".into()),
                    action: Some("keep".into()),
                    ..RuleSpec::default()
                })
                .expect("valid"),
            ],
            kubernetes: None,
            runtime_sockets,
        }
    }

    fn process(tgid: u32, comm: &str, cgroup: &str) -> (Arc<ProcessImage>, Arc<ProcessMetadata>) {
        let image = Arc::new(ProcessImage::new(tgid, comm.into(), Vec::new()));
        let metadata = Arc::new(ProcessMetadata {
            pid: tgid,
            cgroup: Arc::new(CgroupInfo::parse(cgroup)),
            ..ProcessMetadata::default()
        });
        (image, metadata)
    }

    #[test]
    fn a_dropped_process_is_judged_once_and_told_to_the_kernel() {
        let stats = Arc::new(Stats::default());
        let map = FakeMap::default();
        let excluded = map.0.clone();
        assert!(applies_early(&config(Vec::new())));
        let mut filter = ProcessFilter::new(&config(Vec::new()), &Host::system(), 8, stats.clone())
            .with_map(Box::new(map));
        let (image, metadata) = process(7, "keepme", "0::/user.slice\n");
        assert!(filter.kept(&image, &metadata));
        let (image, metadata) = process(8, "other", "0::/user.slice\n");
        for _ in 0..3 {
            assert!(!filter.kept(&image, &metadata));
        }
        assert_eq!(*excluded.lock().expect("lock"), [8]);
        let snapshot = stats.snapshot();
        assert_eq!(
            (snapshot.processes_excluded, snapshot.samples_excluded),
            (1, 3)
        );
        // An exec: the new image is judged anew, the kernel told first.
        filter.forget(8);
        assert!(excluded.lock().expect("lock").is_empty());
        let (image, metadata) = process(8, "keepme-too", "0::/user.slice\n");
        assert!(filter.kept(&image, &metadata));
        // A process gone before its maps were read is judged by its name,
        // but the kernel is not told: its entry would outlive it.
        let gone = Arc::new(ProcessImage::gone(11, "other".into()));
        assert!(!filter.kept(&gone, &metadata));
        assert!(excluded.lock().expect("lock").is_empty());
        assert_eq!(stats.snapshot().processes_excluded, 2);
    }

    /// With container runtime names asked for, a container's labels come
    /// later: its process is left to the output stage; a host process is
    /// judged at once.
    #[test]
    fn containers_wait_for_their_labels_when_those_come_later() {
        let stats = Arc::new(Stats::default());
        let sockets = vec!["/run/docker.sock".into()];
        let mut filter = ProcessFilter::new(&config(sockets), &Host::system(), 8, stats.clone());
        let id = "3f4b6c1e2d9a8b7c6d5e4f30291817161514131211100f0e0d0c0b0a09080706";
        let (image, metadata) =
            process(9, "other", &format!("0::/system.slice/docker-{id}.scope\n"));
        assert!(metadata.cgroup.container.is_some());
        assert!(filter.kept(&image, &metadata));
        let (image, metadata) = process(10, "other", "0::/user.slice\n");
        assert!(!filter.kept(&image, &metadata));
        assert_eq!(stats.snapshot().processes_excluded, 1);
    }
}
