//! The labels stage: what each process's series is labelled with. Process
//! metadata (read once per process from /proc and cached), its cgroups
//! (container, pod, systemd unit), the Kubernetes pod it belongs to, the
//! node and external labels, then the user's `relabel_configs`; labels
//! starting with `__` (the `__meta_*` ones among them) are discovery-only
//! and removed after relabeling.

pub mod cgroup;
pub mod kubernetes;
pub mod process;
pub mod relabel;

use std::sync::Arc;

pub use self::{
    cgroup::{CgroupInfo, Container, ContainerRuntime},
    kubernetes::{KubernetesWatcher, PodIndex},
    process::{MetadataLimits, MetadataReader, ProcessMetadata},
    relabel::{LabelSet, Rule},
};
use crate::{config::MetadataConfig, process::ProcessImage};

/// Turns a process into its series' label set.
pub struct Labeler {
    /// `node`, the external labels and `kernel_release`.
    common: LabelSet,
    rules: Vec<Rule>,
    pods: Option<Arc<PodIndex>>,
}

impl Labeler {
    pub fn new(metadata: &MetadataConfig, pods: Option<Arc<PodIndex>>) -> Self {
        let mut common = LabelSet::new();
        // External labels first: a label firn discovers wins, as a series'
        // own label wins over an external one in Prometheus.
        for (name, value) in &metadata.external_labels {
            common.insert(name.clone(), value.clone());
        }
        common.insert("node".into(), metadata.node.clone());
        if let Some(release) = kernel_release() {
            common.insert("kernel_release".into(), release);
        }
        Self {
            common,
            rules: metadata.relabel_rules.clone(),
            pods,
        }
    }

    /// The series labels of a process after relabeling; `None` when a
    /// `keep` or `drop` rule discards it.
    pub fn labels(&self, image: &ProcessImage, process: &ProcessMetadata) -> Option<LabelSet> {
        let mut labels = relabel::relabel(&self.rules, self.discovered(image, process))?;
        labels.retain(|name, value| !name.starts_with("__") && !value.is_empty());
        Some(labels)
    }

    /// Every label known before relabeling, `__meta_*` ones included.
    pub fn discovered(&self, image: &ProcessImage, process: &ProcessMetadata) -> LabelSet {
        let mut labels = self.common.clone();
        let mut set = |name: &str, value: &str| {
            if !value.is_empty() {
                labels.insert(name.to_owned(), value.to_owned());
            }
        };
        let pid = image.tgid.to_string();
        set("pid", &pid);
        set("comm", &image.comm);
        set("__meta_process_pid", &pid);
        set("__meta_process_comm", &image.comm);
        set("__meta_process_cmdline", &process.cmdline);
        if let Some(path) = &process.executable {
            set("__meta_process_executable_path", path);
            let build_id = image
                .mappings
                .iter()
                .filter(|mapping| mapping.spec.path == *path)
                .find_map(|mapping| mapping.object())
                .and_then(|object| object.build_id())
                .map(|id| id.to_hex());
            if let Some(build_id) = build_id {
                set("__meta_process_executable_build_id", &build_id);
            }
        }
        if let Some(name) = process.executable_name() {
            set("executable", name);
            set("__meta_process_executable_name", name);
        }
        let cgroup = &process.cgroup;
        set("cgroup", &cgroup.path);
        set("__meta_process_cgroup", &cgroup.path);
        if let Some(unit) = &cgroup.systemd_unit {
            set("systemd_unit", unit);
            set("__meta_systemd_unit", unit);
        }
        if let Some(container) = &cgroup.container {
            set("container_id", &container.id);
            set("__meta_container_id", &container.id);
            if let Some(runtime) = container.runtime {
                set("__meta_container_runtime", runtime.name());
            }
        }
        if let Some(uid) = &cgroup.pod_uid {
            set("__meta_kubernetes_pod_uid", uid);
        }
        let found = self.pods.as_ref().and_then(|pods| {
            pods.lookup(
                cgroup.pod_uid.as_deref(),
                cgroup.container.as_ref().map(|c| c.id.as_str()),
            )
        });
        if let Some(found) = found {
            let pod = &found.pod;
            set("namespace", &pod.namespace);
            set("pod", &pod.name);
            set("__meta_kubernetes_namespace", &pod.namespace);
            set("__meta_kubernetes_pod_name", &pod.name);
            set("__meta_kubernetes_pod_uid", &pod.uid);
            set("__meta_kubernetes_pod_node_name", &pod.node_name);
            set("__meta_kubernetes_pod_ip", &pod.ip);
            if let Some((kind, name)) = &pod.controller {
                set("__meta_kubernetes_pod_controller_kind", kind);
                set("__meta_kubernetes_pod_controller_name", name);
            }
            for (name, value) in &pod.labels {
                let name = relabel::sanitize_name(name);
                set(&format!("__meta_kubernetes_pod_label_{name}"), value);
                set(
                    &format!("__meta_kubernetes_pod_labelpresent_{name}"),
                    "true",
                );
            }
            for (name, value) in &pod.annotations {
                let name = relabel::sanitize_name(name);
                set(&format!("__meta_kubernetes_pod_annotation_{name}"), value);
                set(
                    &format!("__meta_kubernetes_pod_annotationpresent_{name}"),
                    "true",
                );
            }
            if let Some(container) = found.container() {
                set("container", &container.name);
                set("__meta_kubernetes_pod_container_name", &container.name);
                set("__meta_kubernetes_pod_container_image", &container.image);
                if let Some(id) = &container.id {
                    set("__meta_kubernetes_pod_container_id", id);
                }
                if let Some(runtime) = &container.runtime {
                    set("__meta_container_runtime", runtime);
                }
            }
        }
        labels
    }
}

/// `uname -r`.
fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|text| text.trim().to_owned())
        .filter(|release| !release.is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{
        kubernetes::{ContainerInfo, PodInfo},
        relabel::RuleSpec,
        *,
    };

    const ID: &str = "3f4b6c1e2d9a8b7c6d5e4f30291817161514131211100f0e0d0c0b0a09080706";
    const UID: &str = "6b1f2a3c-4d5e-4f60-8a7b-9c0d1e2f3a4b";

    fn metadata(rules: &[RuleSpec]) -> MetadataConfig {
        MetadataConfig {
            node: "node-a".into(),
            external_labels: vec![("cluster".into(), "prod".into())],
            relabel_rules: rules
                .iter()
                .map(|spec| Rule::new(spec).expect("valid"))
                .collect(),
            kubernetes: None,
        }
    }

    fn process() -> (ProcessImage, ProcessMetadata) {
        let image = ProcessImage::new(42, "server".into(), Vec::new());
        let cgroup = CgroupInfo::parse(&format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        ));
        let metadata = ProcessMetadata {
            pid: 42,
            cmdline: "/app/server --port 80".into(),
            executable: Some("/app/server".into()),
            cgroup: Arc::new(cgroup),
            cgroup_id: 9,
        };
        (image, metadata)
    }

    fn pods() -> Arc<PodIndex> {
        let index = PodIndex::new();
        index.apply(PodInfo {
            uid: UID.into(),
            namespace: "shop".into(),
            name: "checkout-abc".into(),
            node_name: "node-a".into(),
            ip: "10.0.0.5".into(),
            labels: BTreeMap::from([("app.kubernetes.io/name".into(), "checkout".into())]),
            annotations: BTreeMap::new(),
            controller: None,
            containers: vec![ContainerInfo {
                name: "server".into(),
                id: Some(ID.into()),
                runtime: Some("containerd".into()),
                image: "shop/checkout:1".into(),
            }],
            config_hash: None,
        });
        Arc::new(index)
    }

    fn get<'a>(labels: &'a LabelSet, name: &str) -> Option<&'a str> {
        labels.get(name).map(String::as_str)
    }

    #[test]
    fn a_container_in_a_pod_gets_every_label() {
        let (image, process) = process();
        let labeler = Labeler::new(&metadata(&[]), Some(pods()));
        let discovered = labeler.discovered(&image, &process);
        assert_eq!(
            get(
                &discovered,
                "__meta_kubernetes_pod_label_app_kubernetes_io_name"
            ),
            Some("checkout")
        );
        assert_eq!(
            get(&discovered, "__meta_container_runtime"),
            Some("containerd")
        );
        assert_eq!(
            get(&discovered, "__meta_process_cmdline"),
            Some("/app/server --port 80")
        );
        let labels = labeler.labels(&image, &process).expect("kept");
        for (name, value) in [
            ("node", "node-a"),
            ("cluster", "prod"),
            ("pid", "42"),
            ("comm", "server"),
            ("executable", "server"),
            ("container_id", ID),
            ("systemd_unit", &format!("cri-containerd-{ID}.scope")),
            ("namespace", "shop"),
            ("pod", "checkout-abc"),
            ("container", "server"),
        ] {
            assert_eq!(get(&labels, name), Some(value), "{name}");
        }
        assert!(labels.contains_key("kernel_release"));
        assert!(get(&labels, "cgroup").is_some_and(|p| p.ends_with(".scope")));
        assert!(
            labels.keys().all(|name| !name.starts_with("__")),
            "discovery labels are removed: {labels:?}"
        );
        assert!(labels.keys().all(|name| relabel::is_valid_name(name)));

        // Without the pod index (outside Kubernetes): no pod labels.
        let labels = Labeler::new(&metadata(&[]), None)
            .labels(&image, &process)
            .expect("kept");
        assert_eq!(get(&labels, "pod"), None);
        assert_eq!(get(&labels, "container_id"), Some(ID));
    }

    #[test]
    fn relabeling_sees_meta_labels_and_can_drop() {
        let (image, process) = process();
        let labelmap = RuleSpec {
            action: Some("labelmap".into()),
            regex: Some("__meta_kubernetes_pod_label_(.+)".into()),
            ..RuleSpec::default()
        };
        let labels = Labeler::new(&metadata(&[labelmap]), Some(pods()))
            .labels(&image, &process)
            .expect("kept");
        assert_eq!(get(&labels, "app_kubernetes_io_name"), Some("checkout"));

        let drop = RuleSpec {
            action: Some("drop".into()),
            source_labels: vec!["comm".into()],
            regex: Some("serv.*".into()),
            ..RuleSpec::default()
        };
        assert!(
            Labeler::new(&metadata(&[drop]), None)
                .labels(&image, &process)
                .is_none()
        );
    }
}
