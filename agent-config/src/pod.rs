//! What firn reads of a Kubernetes Pod: the API object as the watcher
//! parses it ([`PodObject`]: k8s-openapi's metadata, and of the spec and
//! status only the fields firn labels with), and the few values the index
//! keeps of it ([`PodInfo`]). Parsing and conversion only; no I/O.

use std::collections::BTreeMap;

use k8s_openapi::{
    NamespaceResourceScope, api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::Deserialize;

/// Annotation values longer than this are left out of the metadata
/// (`last-applied-configuration` can be hundreds of kilobytes).
const MAX_ANNOTATION_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("a pod without a uid")]
    NoUid,
}

/// A Pod as the API server sends it, with only what firn reads of its
/// spec and status. k8s-openapi's whole `Pod` would parse (and hold) every
/// probe, volume and resource of every container: about a megabyte more
/// code in the binary and more memory per listed pod, for nothing firn
/// uses. The metadata is k8s-openapi's, and the API path and kind are
/// `Pod`'s.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct PodObject {
    pub metadata: ObjectMeta,
    spec: PodSpec,
    status: PodStatus,
}

impl k8s_openapi::Resource for PodObject {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = NamespaceResourceScope;
}

impl k8s_openapi::Metadata for PodObject {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodSpec {
    node_name: String,
    containers: Vec<ContainerSpec>,
    init_containers: Vec<ContainerSpec>,
    ephemeral_containers: Vec<ContainerSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct ContainerSpec {
    name: String,
    image: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodStatus {
    #[serde(rename = "podIP")]
    pod_ip: String,
    container_statuses: Vec<ContainerStatus>,
    init_container_statuses: Vec<ContainerStatus>,
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct ContainerStatus {
    name: String,
    #[serde(rename = "containerID")]
    container_id: String,
    image: String,
}

/// One container of a pod, with its runtime id once it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerInfo {
    pub name: String,
    /// Without the `containerd://` style prefix.
    pub id: Option<String>,
    /// The runtime named in that prefix.
    pub runtime: Option<String>,
    pub image: String,
}

/// A pod as firn labels with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node_name: String,
    pub ip: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The controller's kind and name (`ReplicaSet`, `checkout-7d9f`).
    pub controller: Option<(String, String)>,
    pub containers: Vec<ContainerInfo>,
    /// Static pods run under this UID in cgroups, not `metadata.uid`.
    pub config_hash: Option<String>,
}

impl TryFrom<PodObject> for PodInfo {
    type Error = ObjectError;

    fn try_from(pod: PodObject) -> Result<Self, ObjectError> {
        let PodObject {
            metadata,
            spec,
            status,
        } = pod;
        let uid = metadata
            .uid
            .filter(|uid| !uid.is_empty())
            .ok_or(ObjectError::NoUid)?;
        let images: BTreeMap<String, String> = spec
            .containers
            .into_iter()
            .chain(spec.init_containers)
            .chain(spec.ephemeral_containers)
            .map(|c| (c.name, c.image))
            .collect();
        let mut containers: Vec<ContainerInfo> = status
            .container_statuses
            .into_iter()
            .chain(status.init_container_statuses)
            .chain(status.ephemeral_container_statuses)
            .map(|c| container(c, &images))
            .collect();
        // Containers not started yet are known by name only.
        for (name, image) in images {
            if !containers.iter().any(|c| c.name == name) {
                containers.push(ContainerInfo {
                    name,
                    id: None,
                    runtime: None,
                    image,
                });
            }
        }
        let controller = metadata
            .owner_references
            .into_iter()
            .flatten()
            .find(|owner| owner.controller == Some(true))
            .map(|owner| (owner.kind, owner.name));
        let annotations = metadata.annotations.unwrap_or_default();
        let config_hash = annotations.get("kubernetes.io/config.hash").cloned();
        let annotations = annotations
            .into_iter()
            .filter(|(_, value)| value.len() <= MAX_ANNOTATION_BYTES)
            .collect();
        Ok(PodInfo {
            uid,
            namespace: metadata.namespace.unwrap_or_default(),
            name: metadata.name.unwrap_or_default(),
            node_name: spec.node_name,
            ip: status.pod_ip,
            labels: metadata.labels.unwrap_or_default(),
            annotations,
            controller,
            containers,
            config_hash,
        })
    }
}

/// A container as its status names it; the image as the spec asked for
/// it (the status may show the resolved one).
fn container(status: ContainerStatus, images: &BTreeMap<String, String>) -> ContainerInfo {
    let (runtime, id) = match status.container_id.split_once("://") {
        Some((runtime, id)) => (Some(runtime.to_owned()), Some(id.to_owned())),
        None if status.container_id.is_empty() => (None, None),
        None => (None, Some(status.container_id)),
    };
    let image = images.get(&status.name).cloned().unwrap_or(status.image);
    ContainerInfo {
        name: status.name,
        id,
        runtime,
        image,
    }
}

#[cfg(test)]
mod tests {
    use kube_core::{ObjectList, WatchEvent};

    use super::*;

    const POD: &str = r#"{
      "kind": "Pod", "apiVersion": "v1",
      "metadata": {
        "name": "checkout-7d9f-abcde", "namespace": "shop",
        "uid": "6b1f2a3c-4d5e-4f60-8a7b-9c0d1e2f3a4b", "resourceVersion": "1234",
        "labels": {"app": "checkout", "app.kubernetes.io/name": "checkout"},
        "annotations": {"prometheus.io/scrape": "true"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": "checkout-7d9f", "uid": "x", "controller": true}]
      },
      "spec": {"nodeName": "node-a",
               "containers": [{"name": "server", "image": "shop/checkout:1.2"},
                              {"name": "sidecar", "image": "envoy:1.30"}]},
      "status": {"phase": "Running", "podIP": "10.1.2.3",
                 "containerStatuses": [{"name": "server", "ready": true,
                   "containerID": "containerd://3f4b6c1e2d9a8b7c6d5e4f30291817161514131211100f0e0d0c0b0a09080706",
                   "image": "docker.io/shop/checkout:1.2"}]}
    }"#;

    fn pod_info(json: &str) -> Result<PodInfo, ObjectError> {
        PodInfo::try_from(serde_json::from_str::<PodObject>(json).expect("a Pod"))
    }

    #[test]
    fn a_pod_yields_its_containers_labels_and_controller() {
        let pod = pod_info(POD).expect("a usable pod");
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str()),
            ("shop", "checkout-7d9f-abcde")
        );
        assert_eq!(pod.ip, "10.1.2.3");
        assert_eq!(pod.node_name, "node-a");
        assert_eq!(
            pod.labels.get("app.kubernetes.io/name").map(String::as_str),
            Some("checkout")
        );
        assert_eq!(
            pod.controller,
            Some(("ReplicaSet".into(), "checkout-7d9f".into()))
        );
        let server = &pod.containers[0];
        assert_eq!(server.name, "server");
        assert_eq!(server.runtime.as_deref(), Some("containerd"));
        assert_eq!(server.id.as_deref().map(str::len), Some(64));
        assert_eq!(server.image, "shop/checkout:1.2");
        assert_eq!(pod.containers[1].id, None, "not started yet");
        assert_eq!(pod.containers[1].image, "envoy:1.30");
    }

    #[test]
    fn pods_without_a_uid_are_refused_and_long_annotations_left_out() {
        assert!(matches!(
            pod_info(r#"{"metadata": {"name": "x"}}"#),
            Err(ObjectError::NoUid)
        ));
        let long = "x".repeat(MAX_ANNOTATION_BYTES + 1);
        let pod = pod_info(&format!(
            r#"{{"metadata": {{"uid": "u", "annotations": {{"big": "{long}", "kubernetes.io/config.hash": "abc"}}}}}}"#
        ))
        .expect("a usable pod");
        assert!(!pod.annotations.contains_key("big"));
        assert_eq!(pod.config_hash.as_deref(), Some("abc"));
        assert!(pod.containers.is_empty());
    }

    /// The shapes the API server sends, as the client parses them.
    #[test]
    fn lists_and_watch_events_carry_pods() {
        let list = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"99"}},"items":[{POD}]}}"#
        );
        let list: ObjectList<PodObject> = serde_json::from_str(&list).expect("a pod list");
        assert_eq!(list.metadata.resource_version.as_deref(), Some("99"));
        assert_eq!(list.items.len(), 1);
        let deleted = format!(r#"{{"type":"DELETED","object":{POD}}}"#);
        let Ok(WatchEvent::Deleted(pod)) = serde_json::from_str::<WatchEvent<PodObject>>(&deleted)
        else {
            panic!("a deleted pod");
        };
        assert!(PodInfo::try_from(pod).is_ok_and(|pod| pod.uid.starts_with("6b1f")));
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version"}}"#;
        assert!(matches!(
            serde_json::from_str::<WatchEvent<PodObject>>(gone),
            Ok(WatchEvent::Error(status)) if status.code == 410
        ));
        for bad in [
            r#"{"type":"ADDED","object":{"metadata":"wrong"}}"#,
            r#"{"type":"ADDED","object":{"spec":{"containers":{}}}}"#,
            "{not json",
        ] {
            assert!(
                serde_json::from_str::<WatchEvent<PodObject>>(bad).is_err(),
                "{bad}"
            );
        }
    }
}
