//! Kubernetes pod metadata: the pods of this node, kept current by a
//! list-then-watch of the API server on a thread of its own, indexed by
//! pod UID and container id so processes can be matched to them through
//! their cgroups.

mod client;
mod transport;

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

pub use agent_config::pod::{ContainerInfo, PodInfo};
pub use client::{KubernetesError, KubernetesWatcher};

/// Pods indexed; more than any node runs (the kubelet's default is 110).
pub const MAX_PODS: usize = 4096;

#[derive(Default)]
struct Pods {
    by_uid: HashMap<String, Arc<PodInfo>>,
    /// Static pods: the config hash their cgroups are named after.
    by_config_hash: HashMap<String, String>,
    /// Container id -> pod UID.
    by_container: HashMap<String, String>,
}

impl Pods {
    fn insert(&mut self, pod: PodInfo) {
        self.remove(&pod.uid);
        for id in pod.containers.iter().filter_map(|c| c.id.clone()) {
            self.by_container.insert(id, pod.uid.clone());
        }
        if let Some(hash) = &pod.config_hash {
            self.by_config_hash.insert(hash.clone(), pod.uid.clone());
        }
        self.by_uid.insert(pod.uid.clone(), Arc::new(pod));
    }

    fn remove(&mut self, uid: &str) {
        if let Some(old) = self.by_uid.remove(uid) {
            for id in old.containers.iter().filter_map(|c| c.id.as_deref()) {
                self.by_container.remove(id);
            }
            if let Some(hash) = &old.config_hash {
                self.by_config_hash.remove(hash);
            }
        }
    }
}

/// The pods of this node, shared between the watch (writer) and the
/// profile builder (reader); sampling never touches it.
#[derive(Default)]
pub struct PodIndex {
    pods: RwLock<Pods>,
}

/// A pod a process belongs to and, when known, which of its containers.
#[derive(Clone, Debug)]
pub struct PodMatch {
    pub pod: Arc<PodInfo>,
    pub container: Option<usize>,
}

impl PodMatch {
    pub fn container(&self) -> Option<&ContainerInfo> {
        self.container.and_then(|i| self.pod.containers.get(i))
    }
}

impl PodIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// The pod of a process whose cgroups named `container_id` and/or
    /// `pod_uid`. The container id is the surer key.
    pub fn lookup(&self, pod_uid: Option<&str>, container_id: Option<&str>) -> Option<PodMatch> {
        let pods = self.pods.read().unwrap_or_else(|e| e.into_inner());
        let uid = container_id
            .and_then(|id| pods.by_container.get(id))
            .map(String::as_str)
            .or(pod_uid)?;
        let pod = pods.by_uid.get(uid).or_else(|| {
            let real = pods.by_config_hash.get(uid)?;
            pods.by_uid.get(real)
        })?;
        let container = container_id.and_then(|id| {
            pod.containers
                .iter()
                .position(|c| c.id.as_deref() == Some(id))
        });
        Some(PodMatch {
            pod: pod.clone(),
            container,
        })
    }

    /// After a list: exactly these pods. Returns how many did not fit.
    pub fn replace_all(&self, pods: Vec<PodInfo>) -> usize {
        let mut fresh = Pods::default();
        let mut skipped = 0;
        for pod in pods {
            if fresh.by_uid.len() >= MAX_PODS {
                skipped += 1;
                continue;
            }
            fresh.insert(pod);
        }
        *self.pods.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        skipped
    }

    /// An added or modified pod; false if it did not fit.
    pub fn apply(&self, pod: PodInfo) -> bool {
        let mut pods = self.pods.write().unwrap_or_else(|e| e.into_inner());
        if pods.by_uid.len() >= MAX_PODS && !pods.by_uid.contains_key(&pod.uid) {
            return false;
        }
        pods.insert(pod);
        true
    }

    pub fn remove(&self, uid: &str) {
        self.pods
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    pub fn len(&self) -> usize {
        self.pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_uid
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn pod(uid: &str, containers: &[(&str, Option<&str>)]) -> PodInfo {
        PodInfo {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            node_name: "node".into(),
            ip: String::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            controller: None,
            containers: containers
                .iter()
                .map(|(name, id)| ContainerInfo {
                    name: (*name).into(),
                    id: id.map(str::to_owned),
                    runtime: None,
                    image: String::new(),
                })
                .collect(),
            config_hash: None,
        }
    }

    #[test]
    fn processes_match_pods_by_container_id_or_pod_uid() {
        let index = PodIndex::new();
        index.replace_all(vec![pod(
            "u1",
            &[("app", Some("c1")), ("side", Some("c2"))],
        )]);
        let by_id = index.lookup(None, Some("c2")).expect("by container id");
        assert_eq!(by_id.container().map(|c| c.name.as_str()), Some("side"));
        let by_uid = index
            .lookup(Some("u1"), Some("unknown"))
            .expect("by pod uid");
        assert!(by_uid.container().is_none(), "the sandbox is no container");
        assert!(index.lookup(Some("u2"), None).is_none());

        // A modified pod replaces its container ids; a deleted one is gone.
        index.apply(pod("u1", &[("app", Some("c3"))]));
        assert!(index.lookup(None, Some("c1")).is_none());
        assert!(index.lookup(None, Some("c3")).is_some());
        index.remove("u1");
        assert!(index.lookup(Some("u1"), Some("c3")).is_none());
        assert!(index.is_empty());
    }

    #[test]
    fn static_pods_match_by_config_hash_and_the_index_is_bounded() {
        let index = PodIndex::new();
        let mut mirror = pod("real-uid", &[]);
        mirror.config_hash = Some("0123456789abcdef0123456789abcdef".into());
        index.apply(mirror);
        let found = index
            .lookup(Some("0123456789abcdef0123456789abcdef"), None)
            .expect("by config hash");
        assert_eq!(found.pod.uid, "real-uid");

        let many = (0..MAX_PODS + 3)
            .map(|i| pod(&i.to_string(), &[]))
            .collect();
        assert_eq!(index.replace_all(many), 3);
        assert_eq!(index.len(), MAX_PODS);
        assert!(!index.apply(pod("one-more", &[])));
    }
}
