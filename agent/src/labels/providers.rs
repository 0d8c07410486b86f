//! The metadata providers the labeler chains: each adds the labels one
//! source knows about a process. A new source (another orchestrator, a
//! runtime's own metadata) is one more provider.

use std::sync::Arc;

use super::{
    MetadataConfig, PodIndex, ProcessMetadata, relabel::LabelSet, relabel::sanitize_name,
    runtime::RuntimeClient,
};
use crate::{host::Host, process::ProcessImage};

/// What the providers are told about one process.
pub struct ProcessView<'a> {
    pub image: &'a ProcessImage,
    pub metadata: &'a ProcessMetadata,
}

/// Labels discovered so far; an empty value is no label.
#[derive(Default)]
pub struct Discovered(LabelSet);

impl Discovered {
    pub fn set(&mut self, name: &str, value: &str) {
        if !value.is_empty() {
            self.0.insert(name.to_owned(), value.to_owned());
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn into_set(self) -> LabelSet {
        self.0
    }
}

/// One source of labels.
pub trait MetadataProvider: Send + Sync {
    fn discover(&self, process: &ProcessView<'_>, labels: &mut Discovered);
}

/// The same for every process: external labels, then `node` and
/// `kernel_release` (a label firn discovers wins over an external one, as
/// a series' own label does in Prometheus).
pub struct CommonLabels(Vec<(String, String)>);

impl CommonLabels {
    pub fn new(metadata: &MetadataConfig, host: &Host) -> Self {
        let mut labels = metadata.external_labels.clone();
        labels.push(("node".into(), metadata.node.clone()));
        if let Some(release) = host.kernel_release() {
            labels.push(("kernel_release".into(), release));
        }
        Self(labels)
    }
}

impl MetadataProvider for CommonLabels {
    fn discover(&self, _: &ProcessView<'_>, labels: &mut Discovered) {
        for (name, value) in &self.0 {
            labels.set(name, value);
        }
    }
}

/// The process itself: pid, comm, command line, executable and its build id.
pub struct ProcessLabels;

impl MetadataProvider for ProcessLabels {
    fn discover(&self, process: &ProcessView<'_>, labels: &mut Discovered) {
        let ProcessView { image, metadata } = process;
        let pid = image.tgid.to_string();
        labels.set("pid", &pid);
        labels.set("comm", &image.comm);
        labels.set("__meta_process_pid", &pid);
        labels.set("__meta_process_comm", &image.comm);
        labels.set("__meta_process_cmdline", &metadata.cmdline);
        if let Some(path) = &metadata.executable {
            labels.set("__meta_process_executable_path", path);
            let build_id = image
                .mappings
                .iter()
                .filter(|mapping| mapping.spec.path == *path)
                .find_map(|mapping| mapping.object())
                .and_then(|object| object.build_id())
                .map(|id| id.to_hex());
            if let Some(build_id) = build_id {
                labels.set("__meta_process_executable_build_id", &build_id);
            }
        }
        if let Some(name) = metadata.executable_name() {
            labels.set("executable", name);
            labels.set("__meta_process_executable_name", name);
        }
    }
}

/// The process's cgroup: systemd unit, container, pod UID.
pub struct CgroupLabels;

impl MetadataProvider for CgroupLabels {
    fn discover(&self, process: &ProcessView<'_>, labels: &mut Discovered) {
        let cgroup = &process.metadata.cgroup;
        labels.set("cgroup", &cgroup.path);
        labels.set("__meta_process_cgroup", &cgroup.path);
        if let Some(unit) = &cgroup.systemd_unit {
            labels.set("systemd_unit", unit);
            labels.set("__meta_systemd_unit", unit);
        }
        if let Some(container) = &cgroup.container {
            labels.set("container_id", &container.id);
            labels.set("__meta_container_id", &container.id);
            if let Some(runtime) = container.runtime {
                labels.set("__meta_container_runtime", runtime.name());
            }
        }
        if let Some(uid) = &cgroup.pod_uid {
            labels.set("__meta_kubernetes_pod_uid", uid);
        }
    }
}

/// A Docker or Podman container's name and labels, from the runtime's
/// API socket.
pub struct RuntimeLabels(RuntimeClient);

impl RuntimeLabels {
    pub fn new(client: RuntimeClient) -> Self {
        Self(client)
    }
}

impl MetadataProvider for RuntimeLabels {
    fn discover(&self, process: &ProcessView<'_>, labels: &mut Discovered) {
        let Some(container) = &process.metadata.cgroup.container else {
            return;
        };
        let Some(found) = self.0.lookup(&container.id, container.runtime) else {
            return;
        };
        labels.set("container", found.name.trim_start_matches('/'));
        for (name, value) in found.meta_labels(&container.id) {
            labels.set(&name, &value);
        }
    }
}

/// The Kubernetes pod and container the process's cgroup names, from the
/// watched pods of this node.
pub struct KubernetesLabels(Arc<PodIndex>);

impl KubernetesLabels {
    pub fn new(pods: Arc<PodIndex>) -> Self {
        Self(pods)
    }
}

impl MetadataProvider for KubernetesLabels {
    fn discover(&self, process: &ProcessView<'_>, labels: &mut Discovered) {
        let cgroup = &process.metadata.cgroup;
        let Some(found) = self.0.lookup(
            cgroup.pod_uid.as_deref(),
            cgroup.container.as_ref().map(|c| c.id.as_str()),
        ) else {
            return;
        };
        let pod = &found.pod;
        labels.set("namespace", &pod.namespace);
        labels.set("pod", &pod.name);
        labels.set("__meta_kubernetes_namespace", &pod.namespace);
        labels.set("__meta_kubernetes_pod_name", &pod.name);
        labels.set("__meta_kubernetes_pod_uid", &pod.uid);
        labels.set("__meta_kubernetes_pod_node_name", &pod.node_name);
        labels.set("__meta_kubernetes_pod_ip", &pod.ip);
        if let Some((kind, name)) = &pod.controller {
            labels.set("__meta_kubernetes_pod_controller_kind", kind);
            labels.set("__meta_kubernetes_pod_controller_name", name);
        }
        for (kind, map) in [("label", &pod.labels), ("annotation", &pod.annotations)] {
            for (name, value) in map {
                let name = sanitize_name(name);
                labels.set(&format!("__meta_kubernetes_pod_{kind}_{name}"), value);
                labels.set(
                    &format!("__meta_kubernetes_pod_{kind}present_{name}"),
                    "true",
                );
            }
        }
        if let Some(container) = found.container() {
            labels.set("container", &container.name);
            labels.set("__meta_kubernetes_pod_container_name", &container.name);
            labels.set("__meta_kubernetes_pod_container_image", &container.image);
            if let Some(id) = &container.id {
                labels.set("__meta_kubernetes_pod_container_id", id);
            }
            if let Some(runtime) = &container.runtime {
                labels.set("__meta_container_runtime", runtime);
            }
        }
    }
}

/// `service_name`, which Pyroscope requires, inferred as Grafana's
/// `pyroscope.ebpf` does: the `pyroscope.io/service_name` pod annotation,
/// then `namespace/container` in Kubernetes, the container runtime's name
/// for the container, the systemd service, then the process's own name.
/// Runs last, so it sees every other provider's labels; relabeling may
/// still replace it, and an external `service_name` label wins.
pub struct ServiceName;

impl MetadataProvider for ServiceName {
    fn discover(&self, _: &ProcessView<'_>, labels: &mut Discovered) {
        if labels.get("service_name").is_some() {
            return;
        }
        let name = infer_service_name(labels);
        labels.set("service_name", &name);
        labels.set("__meta_service_name", &name);
    }
}

fn infer_service_name(labels: &Discovered) -> String {
    if let Some(annotated) =
        labels.get("__meta_kubernetes_pod_annotation_pyroscope_io_service_name")
    {
        return annotated.to_owned();
    }
    if let (Some(namespace), Some(container)) = (
        labels.get("__meta_kubernetes_namespace"),
        labels.get("__meta_kubernetes_pod_container_name"),
    ) {
        return format!("{namespace}/{container}");
    }
    if let Some(container) = labels.get("__meta_docker_container_name") {
        return container.trim_start_matches('/').to_owned();
    }
    // Container scopes are systemd units too, named after an id.
    if let Some(unit) = labels
        .get("__meta_systemd_unit")
        .filter(|unit| unit.ends_with(".service"))
    {
        return unit.trim_end_matches(".service").to_owned();
    }
    labels
        .get("__meta_process_executable_name")
        .or_else(|| labels.get("__meta_process_comm"))
        .unwrap_or("unspecified")
        .to_owned()
}
