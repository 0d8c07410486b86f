//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for the
//! config file, the relabel rules and the labels they rewrite, and the
//! Kubernetes and container runtime APIs' answers. None may panic, hang or allocate without
//! bound on any input.

use std::path::Path;

use kube_core::{ObjectList, WatchEvent};

use crate::{
    container,
    file::ConfigFile,
    pod::{PodInfo, PodObject},
    relabel::{LabelSet, Rule, relabel},
};

/// The labels a process typically has when the relabel rules run.
fn typical_labels() -> LabelSet {
    [
        ("comm", "java"),
        ("executable", "/usr/bin/java"),
        ("pid", "4242"),
        ("cgroup", "/system.slice/app.service"),
        ("systemd_unit", "app.service"),
        ("__meta_kubernetes_pod_label_app", "checkout"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .collect()
}

fn rules_of(text: &str) -> Vec<Rule> {
    let path = Path::new("firn.yaml");
    ConfigFile::parse(text, path)
        .and_then(|config| config.relabel_rules(path))
        .unwrap_or_default()
}

/// The `--config-path` file, its relabel rules applied to typical labels.
pub fn config_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let rules = rules_of(text);
    let _ = relabel(&rules, typical_labels());
}

/// Relabel rules (a config file) and the labels they rewrite (label values
/// come from processes: names, cgroup paths, pod labels): the config, a NUL
/// byte, then `name=value` lines.
pub fn relabel_labels(data: &[u8]) {
    let (config, labels) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let Ok(config) = std::str::from_utf8(config) else {
        return;
    };
    let rules = rules_of(config);
    let mut set = typical_labels();
    for line in String::from_utf8_lossy(labels).lines() {
        if let Some((name, value)) = line.split_once('=') {
            set.insert(name.to_owned(), value.to_owned());
        }
    }
    let _ = relabel(&rules, set);
}

/// Kubernetes API answers as the client parses them (a pod list, a watch
/// event line), then firn's reading of each pod in them.
pub fn kubernetes_pod(data: &[u8]) {
    if let Ok(list) = serde_json::from_slice::<ObjectList<PodObject>>(data) {
        for pod in list.items {
            let _ = PodInfo::try_from(pod);
        }
    }
    if let Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod) | WatchEvent::Deleted(pod)) =
        serde_json::from_slice::<WatchEvent<PodObject>>(data)
    {
        let _ = PodInfo::try_from(pod);
    }
}

/// A container runtime's answer to `GET /containers/{id}/json` (names,
/// images and labels are whoever started the container's), and the
/// labels made of it.
pub fn container_answer(data: &[u8]) {
    if let Ok(Some(found)) = container::parse_answer(data) {
        let _ = found.meta_labels("3f4b6c1e2d9a");
    }
}

#[cfg(test)]
agent_fixtures::replays! {
    "container_answer" => container_answer,
    "config_file" => config_file,
    "relabel" => relabel_labels,
    "kubernetes_pod" => kubernetes_pod,
}
