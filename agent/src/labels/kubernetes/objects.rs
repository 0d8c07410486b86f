//! The parts of Kubernetes API objects firn reads: pod lists, watch
//! events, pods and `Status` errors. Parsing only; no I/O.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Annotation values longer than this are left out of the metadata
/// (`last-applied-configuration` can be hundreds of kilobytes).
const MAX_ANNOTATION_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("not a {kind} object")]
    Json {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("a pod without a uid")]
    NoUid,
    #[error("unknown watch event type `{kind}`")]
    EventType { kind: String },
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

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ObjectMeta {
    name: String,
    namespace: String,
    uid: String,
    resource_version: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner_references: Vec<OwnerReference>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct OwnerReference {
    kind: String,
    name: String,
    controller: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodSpec {
    node_name: String,
    containers: Vec<ContainerSpec>,
    init_containers: Vec<ContainerSpec>,
    ephemeral_containers: Vec<ContainerSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ContainerSpec {
    name: String,
    image: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodStatus {
    #[serde(rename = "podIP")]
    pod_ip: String,
    container_statuses: Vec<ContainerStatus>,
    init_container_statuses: Vec<ContainerStatus>,
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ContainerStatus {
    name: String,
    #[serde(rename = "containerID")]
    container_id: String,
    image: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pod {
    metadata: ObjectMeta,
    spec: PodSpec,
    status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ListMeta {
    resource_version: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodListObject {
    metadata: ListMeta,
    items: Vec<serde_json::Value>,
}

/// A `Status` object: what the API server sends instead of a result.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Status {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

/// A pod list: the pods that parsed, how many did not, and the version
/// to watch from.
#[derive(Debug)]
pub struct PodList {
    pub pods: Vec<PodInfo>,
    pub malformed: usize,
    pub resource_version: String,
}

#[derive(Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// Added or modified.
    Applied {
        pod: Box<PodInfo>,
        resource_version: String,
    },
    Deleted {
        uid: String,
        resource_version: String,
    },
    Bookmark {
        resource_version: String,
    },
    /// An `ERROR` event; code 410 means the version is too old.
    Error(Status),
}

pub fn parse_pod_list(bytes: &[u8]) -> Result<PodList, ObjectError> {
    let list: PodListObject =
        serde_json::from_slice(bytes).map_err(|source| ObjectError::Json {
            kind: "PodList",
            source,
        })?;
    let mut pods = Vec::with_capacity(list.items.len());
    let mut malformed = 0;
    for item in list.items {
        match pod_from_value(item) {
            Ok((pod, _)) => pods.push(pod),
            Err(_) => malformed += 1,
        }
    }
    Ok(PodList {
        pods,
        malformed,
        resource_version: list.metadata.resource_version,
    })
}

pub fn parse_status(bytes: &[u8]) -> Option<Status> {
    serde_json::from_slice(bytes).ok()
}

/// One line of a watch stream.
pub fn parse_event(line: &[u8]) -> Result<WatchEvent, ObjectError> {
    let event: RawEvent = serde_json::from_slice(line).map_err(|source| ObjectError::Json {
        kind: "watch event",
        source,
    })?;
    match event.kind.as_str() {
        "ADDED" | "MODIFIED" => {
            let (pod, resource_version) = pod_from_value(event.object)?;
            Ok(WatchEvent::Applied {
                pod: Box::new(pod),
                resource_version,
            })
        }
        "DELETED" => {
            let (pod, resource_version) = pod_from_value(event.object)?;
            Ok(WatchEvent::Deleted {
                uid: pod.uid,
                resource_version,
            })
        }
        "BOOKMARK" => {
            let pod: Pod =
                serde_json::from_value(event.object).map_err(|source| ObjectError::Json {
                    kind: "bookmark",
                    source,
                })?;
            Ok(WatchEvent::Bookmark {
                resource_version: pod.metadata.resource_version,
            })
        }
        "ERROR" => Ok(WatchEvent::Error(
            serde_json::from_value(event.object).unwrap_or_default(),
        )),
        other => Err(ObjectError::EventType {
            kind: other.to_owned(),
        }),
    }
}

fn pod_from_value(value: serde_json::Value) -> Result<(PodInfo, String), ObjectError> {
    let pod: Pod = serde_json::from_value(value).map_err(|source| ObjectError::Json {
        kind: "Pod",
        source,
    })?;
    if pod.metadata.uid.is_empty() {
        return Err(ObjectError::NoUid);
    }
    let Pod {
        metadata,
        spec,
        status,
    } = pod;
    let images: BTreeMap<&str, &str> = spec
        .containers
        .iter()
        .chain(&spec.init_containers)
        .chain(&spec.ephemeral_containers)
        .map(|c| (c.name.as_str(), c.image.as_str()))
        .collect();
    let mut containers: Vec<ContainerInfo> = status
        .container_statuses
        .iter()
        .chain(&status.init_container_statuses)
        .chain(&status.ephemeral_container_statuses)
        .map(|c| {
            let (runtime, id) = match c.container_id.split_once("://") {
                Some((runtime, id)) => (Some(runtime.to_owned()), Some(id.to_owned())),
                None if c.container_id.is_empty() => (None, None),
                None => (None, Some(c.container_id.clone())),
            };
            ContainerInfo {
                name: c.name.clone(),
                id,
                runtime,
                image: images
                    .get(c.name.as_str())
                    .map_or_else(|| c.image.clone(), |image| (*image).to_owned()),
            }
        })
        .collect();
    // Containers not started yet are known by name only.
    for (name, image) in &images {
        if !containers.iter().any(|c| c.name == *name) {
            containers.push(ContainerInfo {
                name: (*name).to_owned(),
                id: None,
                runtime: None,
                image: (*image).to_owned(),
            });
        }
    }
    let controller = metadata
        .owner_references
        .iter()
        .find(|owner| owner.controller == Some(true))
        .map(|owner| (owner.kind.clone(), owner.name.clone()));
    let config_hash = metadata
        .annotations
        .get("kubernetes.io/config.hash")
        .cloned();
    let annotations = metadata
        .annotations
        .into_iter()
        .filter(|(_, value)| value.len() <= MAX_ANNOTATION_BYTES)
        .collect();
    Ok((
        PodInfo {
            uid: metadata.uid,
            namespace: metadata.namespace,
            name: metadata.name,
            node_name: spec.node_name,
            ip: status.pod_ip,
            labels: metadata.labels,
            annotations,
            controller,
            containers,
            config_hash,
        },
        metadata.resource_version,
    ))
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_pod_yields_its_containers_labels_and_controller() {
        let list = format!(
            r#"{{"kind":"PodList","metadata":{{"resourceVersion":"99"}},"items":[{POD}, {{"metadata":{{}}}}]}}"#
        );
        let list = parse_pod_list(list.as_bytes()).expect("a pod list");
        assert_eq!(list.resource_version, "99");
        assert_eq!(list.malformed, 1, "the pod without a uid");
        let pod = &list.pods[0];
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str()),
            ("shop", "checkout-7d9f-abcde")
        );
        assert_eq!(pod.ip, "10.1.2.3");
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
    }

    #[test]
    fn watch_events_parse_and_bad_ones_are_errors() {
        let added = format!(r#"{{"type":"ADDED","object":{POD}}}"#);
        let Ok(WatchEvent::Applied {
            pod,
            resource_version,
        }) = parse_event(added.as_bytes())
        else {
            panic!("an applied pod");
        };
        assert_eq!(
            (pod.name.as_str(), resource_version.as_str()),
            ("checkout-7d9f-abcde", "1234")
        );
        let deleted = format!(r#"{{"type":"DELETED","object":{POD}}}"#);
        assert!(matches!(
            parse_event(deleted.as_bytes()),
            Ok(WatchEvent::Deleted { uid, .. }) if uid.starts_with("6b1f")
        ));
        let bookmark =
            br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"555"}}}"#;
        assert_eq!(
            parse_event(bookmark).expect("bookmark"),
            WatchEvent::Bookmark {
                resource_version: "555".into()
            }
        );
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version"}}"#;
        assert!(matches!(
            parse_event(gone),
            Ok(WatchEvent::Error(Status { code: 410, .. }))
        ));
        assert!(parse_event(b"{not json").is_err());
        assert!(parse_event(br#"{"type":"EXPLODED","object":{}}"#).is_err());
        assert!(parse_event(br#"{"type":"ADDED","object":{"metadata":{"name":"x"}}}"#).is_err());
        assert!(parse_event(br#"{"type":"ADDED","object":{"metadata":"wrong"}}"#).is_err());
    }
}
