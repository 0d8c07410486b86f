//! The labels stage: what each process's series is labelled with. A chain
//! of metadata providers (`providers`): the node and external labels, the
//! process (read once per process from /proc and cached), its cgroups
//! (container, pod, systemd unit), the Kubernetes pod it belongs to; then
//! the user's `relabel_configs`. Labels starting with `__` (the `__meta_*`
//! ones among them) are discovery-only and removed after relabeling.

mod filter;
pub mod kubernetes;
pub mod process;
mod providers;
pub mod runtime;

use std::{path::PathBuf, sync::Arc};

use self::providers::{
    CgroupLabels, CommonLabels, Discovered, KubernetesLabels, MetadataProvider, ProcessLabels,
    ProcessView, RuntimeLabels, ServiceName,
};
pub use agent_config::relabel::{self, LabelSet, Rule};
pub use agent_proc::cgroup::{CgroupInfo, Container, ContainerRuntime};

pub use self::{
    filter::{ExclusionMap, ProcessFilter, applies_early},
    kubernetes::{KubernetesWatcher, PodIndex},
    process::{MetadataLimits, MetadataReader, ProcessMetadata},
};
use crate::{host::Host, process::ProcessImage};

/// How series are labelled.
#[derive(Clone, Debug)]
pub struct MetadataConfig {
    /// The `node` label.
    pub node: String,
    /// Added to every series (`--metadata-external-labels`).
    pub external_labels: Vec<(String, String)>,
    /// `relabel_configs` from the config file, applied in order.
    pub relabel_rules: Vec<Rule>,
    /// Pod labels from the API server; `None` outside Kubernetes.
    pub kubernetes: Option<KubernetesConfig>,
    /// Docker and Podman API sockets asked for container names and labels
    /// (those that exist); empty: none asked.
    pub runtime_sockets: Vec<PathBuf>,
}

/// The Kubernetes API server the pods of this node are watched through.
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    /// `https://host:port` (`http://` only when asked for explicitly).
    pub api_server: String,
    /// The service account token, read at every connection (it rotates).
    pub token_file: Option<PathBuf>,
    /// The only CA trusted for the API server; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The node whose pods are watched (`spec.nodeName`).
    pub node: String,
}

/// Turns a process into its series' label set: each metadata provider in
/// turn adds what it knows (later ones win), then relabeling.
pub struct Labeler {
    providers: Vec<Box<dyn MetadataProvider>>,
    rules: Vec<Rule>,
}

impl Labeler {
    pub fn new(metadata: &MetadataConfig, host: &Host, pods: Option<Arc<PodIndex>>) -> Self {
        let mut providers: Vec<Box<dyn MetadataProvider>> = vec![
            Box::new(CommonLabels::new(metadata, host)),
            Box::new(ProcessLabels),
            Box::new(CgroupLabels),
        ];
        if !metadata.runtime_sockets.is_empty() {
            providers.push(Box::new(RuntimeLabels::new(runtime::RuntimeClient::new(
                metadata.runtime_sockets.clone(),
            ))));
        }
        if let Some(pods) = pods {
            providers.push(Box::new(KubernetesLabels::new(pods)));
        }
        providers.push(Box::new(ServiceName));
        Self {
            providers,
            rules: metadata.relabel_rules.clone(),
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
        let mut labels = Discovered::default();
        let view = ProcessView {
            image,
            metadata: process,
        };
        for provider in &self.providers {
            provider.discover(&view, &mut labels);
        }
        labels.into_set()
    }
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
            runtime_sockets: Vec::new(),
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
        let labeler = Labeler::new(&metadata(&[]), &Host::system(), Some(pods()));
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
            ("service_name", "shop/server"),
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
        let labels = Labeler::new(&metadata(&[]), &Host::system(), None)
            .labels(&image, &process)
            .expect("kept");
        assert_eq!(get(&labels, "pod"), None);
        assert_eq!(get(&labels, "container_id"), Some(ID));
        assert_eq!(
            get(&labels, "service_name"),
            Some("server"),
            "outside Kubernetes a container scope is no service: the executable's name"
        );
    }

    #[test]
    fn service_names_follow_the_annotation_then_the_unit() {
        let (image, mut process) = process();
        let annotated = pods();
        let mut pod = annotated
            .lookup(Some(UID), Some(ID))
            .expect("pod")
            .pod
            .as_ref()
            .clone();
        pod.annotations
            .insert("pyroscope.io/service_name".into(), "checkout-api".into());
        annotated.apply(pod);
        let labels = Labeler::new(&metadata(&[]), &Host::system(), Some(annotated))
            .labels(&image, &process)
            .expect("kept");
        assert_eq!(get(&labels, "service_name"), Some("checkout-api"));

        process.cgroup = Arc::new(CgroupInfo::parse("0::/system.slice/nginx.service\n"));
        let labeler = Labeler::new(&metadata(&[]), &Host::system(), None);
        let labels = labeler.labels(&image, &process).expect("kept");
        assert_eq!(get(&labels, "service_name"), Some("nginx"));

        let rename = RuleSpec {
            action: Some("replace".into()),
            source_labels: vec!["comm".into()],
            target_label: Some("service_name".into()),
            ..RuleSpec::default()
        };
        let labels = Labeler::new(&metadata(&[rename]), &Host::system(), None)
            .labels(&image, &process)
            .expect("kept");
        assert_eq!(
            get(&labels, "service_name"),
            Some("server"),
            "relabeling wins"
        );
    }

    #[test]
    fn relabeling_sees_meta_labels_and_can_drop() {
        let (image, process) = process();
        let labelmap = RuleSpec {
            action: Some("labelmap".into()),
            regex: Some("__meta_kubernetes_pod_label_(.+)".into()),
            ..RuleSpec::default()
        };
        let labels = Labeler::new(&metadata(&[labelmap]), &Host::system(), Some(pods()))
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
            Labeler::new(&metadata(&[drop]), &Host::system(), None)
                .labels(&image, &process)
                .is_none()
        );
    }
}
