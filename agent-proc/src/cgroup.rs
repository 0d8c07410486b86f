//! What a process's cgroups say about where it runs: the container id and
//! runtime (Docker, containerd/CRI, CRI-O, Podman, with cgroupfs or
//! systemd naming, cgroup v1 or v2), the Kubernetes pod UID and the
//! systemd unit. Parses the text of /proc/PID/cgroup; no I/O.

use std::{fmt, sync::LazyLock};

use regex::Regex;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerRuntime {
    Docker,
    Containerd,
    CriO,
    Podman,
}

impl ContainerRuntime {
    pub fn name(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Containerd => "containerd",
            Self::CriO => "cri-o",
            Self::Podman => "podman",
        }
    }
}

impl fmt::Display for ContainerRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// 64 hexadecimal digits, as runtimes and Kubernetes write it.
    pub id: String,
    /// `None` when the naming does not tell (kubepods with cgroupfs).
    pub runtime: Option<ContainerRuntime>,
}

/// The cgroup facts of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupInfo {
    /// The path that best tells where the process runs: the one naming its
    /// container, pod or unit, else the unified (v2) path, else the most
    /// specific v1 path.
    pub path: String,
    pub container: Option<Container>,
    /// With dashes, as in the pod's `metadata.uid` (systemd naming writes
    /// underscores); 32 hex digits for static pods (their config hash).
    pub pod_uid: Option<String>,
    /// The innermost `*.service` or `*.scope`.
    pub systemd_unit: Option<String>,
}

/// One line of /proc/PID/cgroup: `hierarchy-ID:controller-list:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line<'a> {
    hierarchy: &'a str,
    controllers: &'a str,
    path: &'a str,
}

fn lines(text: &str) -> Vec<Line<'_>> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            Some(Line {
                hierarchy: parts.next()?,
                controllers: parts.next()?,
                path: parts.next()?,
            })
        })
        .collect()
}

/// The lines worth looking at, most telling first: the unified hierarchy,
/// systemd's own v1 hierarchy, then v1 controllers (cpu and memory are
/// where runtimes always place containers).
fn candidates<'a>(lines: &[Line<'a>]) -> Vec<&'a str> {
    let rank = |line: &Line<'_>| -> u8 {
        let has = |name: &str| line.controllers.split(',').any(|c| c == name);
        if line.hierarchy == "0" && line.controllers.is_empty() {
            0
        } else if has("name=systemd") {
            1
        } else if has("cpu") {
            2
        } else if has("memory") {
            3
        } else if has("pids") {
            4
        } else {
            5
        }
    };
    let mut ranked: Vec<(u8, &'a str)> = lines
        .iter()
        .filter(|line| line.path != "/" && !line.path.is_empty())
        .map(|line| (rank(line), line.path))
        .collect();
    // Stable: equal ranks keep the file's order.
    ranked.sort_by_key(|(rank, _)| *rank);
    let mut paths: Vec<&str> = Vec::new();
    for (_, path) in ranked {
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    paths
}

static CONTAINER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:(docker|cri-containerd|crio|libpod)-|.*:(docker|cri-containerd|crio):)?([0-9a-f]{64})(?:\.scope)?$",
    )
    .expect("a valid regex")
});

static POD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:kubepods(?:-[a-z]+)*-)?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?(?::.*)?$",
    )
    .expect("a valid regex")
});

fn runtime_named(name: &str) -> Option<ContainerRuntime> {
    match name {
        "docker" => Some(ContainerRuntime::Docker),
        "cri-containerd" => Some(ContainerRuntime::Containerd),
        "crio" => Some(ContainerRuntime::CriO),
        "libpod" => Some(ContainerRuntime::Podman),
        _ => None,
    }
}

/// The innermost container named in `path`.
fn container_in(path: &str) -> Option<Container> {
    let components: Vec<&str> = path.split('/').collect();
    components.iter().enumerate().rev().find_map(|(i, part)| {
        let captures = CONTAINER.captures(part)?;
        let id = captures.get(3)?.as_str().to_owned();
        let runtime = match captures.get(1).or_else(|| captures.get(2)) {
            Some(prefix) => runtime_named(prefix.as_str()),
            // Docker with cgroupfs: `/docker/<id>`.
            None => i
                .checked_sub(1)
                .and_then(|parent| runtime_named(components[parent])),
        };
        Some(Container { id, runtime })
    })
}

fn pod_in(path: &str) -> Option<String> {
    if !path.contains("kubepods") {
        return None;
    }
    path.split('/').rev().find_map(|part| {
        let captures = POD.captures(part)?;
        Some(captures.get(1)?.as_str().replace('_', "-"))
    })
}

fn unit_in(path: &str) -> Option<String> {
    path.split('/')
        .rev()
        .find(|part| {
            (part.ends_with(".service") || part.ends_with(".scope"))
                && !part.starts_with('.')
                && part.len() > ".scope".len()
        })
        .map(str::to_owned)
}

impl CgroupInfo {
    /// From the text of /proc/PID/cgroup.
    pub fn parse(text: &str) -> Self {
        let lines = lines(text);
        let paths = candidates(&lines);
        let container = paths
            .iter()
            .find_map(|path| container_in(path).map(|c| (*path, c)));
        let pod = paths
            .iter()
            .find_map(|path| pod_in(path).map(|uid| (*path, uid)));
        let unit = paths
            .iter()
            .find_map(|path| unit_in(path).map(|unit| (*path, unit)));
        let path = container
            .as_ref()
            .map(|(path, _)| *path)
            .or_else(|| pod.as_ref().map(|(path, _)| *path))
            .or_else(|| unit.as_ref().map(|(path, _)| *path))
            .or_else(|| paths.first().copied())
            .unwrap_or("/");
        Self {
            path: path.to_owned(),
            container: container.map(|(_, c)| c),
            pod_uid: pod.map(|(_, uid)| uid),
            systemd_unit: unit.map(|(_, unit)| unit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4b6c1e2d9a8b7c6d5e4f30291817161514131211100f0e0d0c0b0a09080706";
    const UID: &str = "6b1f2a3c-4d5e-4f60-8a7b-9c0d1e2f3a4b";

    fn v1(path: &str) -> String {
        format!("12:pids:/\n11:memory:/sandbox/x\n9:name=systemd:/\n4:cpu,cpuacct:{path}\n0::/\n")
    }

    fn v2(path: &str) -> String {
        format!("0::{path}\n")
    }

    struct Case {
        text: String,
        path: String,
        id: Option<&'static str>,
        runtime: Option<ContainerRuntime>,
        pod: Option<&'static str>,
        unit: Option<String>,
    }

    fn case(text: String, path: &str) -> Case {
        Case {
            text,
            path: path.to_owned(),
            id: None,
            runtime: None,
            pod: None,
            unit: None,
        }
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "a table: one case per runtime and cgroup driver, read top to bottom"
    )]
    fn runtimes_are_recognized_by_their_cgroup_naming() {
        use ContainerRuntime::*;
        let uid_ = UID.replace('-', "_");
        let kube_systemd =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice");
        let cases = vec![
            // Docker, cgroupfs driver (v1) and systemd driver (v2).
            Case {
                id: Some(ID),
                runtime: Some(Docker),
                ..case(v1(&format!("/docker/{ID}")), &format!("/docker/{ID}"))
            },
            Case {
                id: Some(ID),
                runtime: Some(Docker),
                unit: Some(format!("docker-{ID}.scope")),
                ..case(
                    v2(&format!("/system.slice/docker-{ID}.scope")),
                    &format!("/system.slice/docker-{ID}.scope"),
                )
            },
            // Kubernetes with cgroupfs: the runtime is not named.
            Case {
                id: Some(ID),
                pod: Some(UID),
                ..case(
                    v1(&format!("/kubepods/burstable/pod{UID}/{ID}")),
                    &format!("/kubepods/burstable/pod{UID}/{ID}"),
                )
            },
            // containerd with the systemd driver.
            Case {
                id: Some(ID),
                runtime: Some(Containerd),
                pod: Some(UID),
                unit: Some(format!("cri-containerd-{ID}.scope")),
                ..case(
                    v2(&format!("{kube_systemd}/cri-containerd-{ID}.scope")),
                    &format!("{kube_systemd}/cri-containerd-{ID}.scope"),
                )
            },
            // containerd's `slice:prefix:id` form.
            Case {
                id: Some(ID),
                runtime: Some(Containerd),
                pod: Some(UID),
                ..case(
                    v1(&format!(
                        "/system.slice/containerd.service/kubepods-burstable-pod{uid_}.slice:cri-containerd:{ID}"
                    )),
                    &format!(
                        "/system.slice/containerd.service/kubepods-burstable-pod{uid_}.slice:cri-containerd:{ID}"
                    ),
                )
                .with_unit("containerd.service")
            },
            // CRI-O, systemd driver; its conmon is not the container.
            Case {
                id: Some(ID),
                runtime: Some(CriO),
                pod: Some(UID),
                unit: Some(format!("crio-{ID}.scope")),
                ..case(
                    v2(&format!("{kube_systemd}/crio-{ID}.scope")),
                    &format!("{kube_systemd}/crio-{ID}.scope"),
                )
            },
            Case {
                pod: Some(UID),
                unit: Some(format!("crio-conmon-{ID}.scope")),
                ..case(
                    v2(&format!("{kube_systemd}/crio-conmon-{ID}.scope")),
                    &format!("{kube_systemd}/crio-conmon-{ID}.scope"),
                )
            },
            // Podman: rootful systemd, nested container cgroup, cgroupfs.
            Case {
                id: Some(ID),
                runtime: Some(Podman),
                unit: Some(format!("libpod-{ID}.scope")),
                ..case(
                    v2(&format!("/machine.slice/libpod-{ID}.scope/container")),
                    &format!("/machine.slice/libpod-{ID}.scope/container"),
                )
            },
            Case {
                id: Some(ID),
                runtime: Some(Podman),
                ..case(
                    v1(&format!("/libpod_parent/libpod-{ID}")),
                    &format!("/libpod_parent/libpod-{ID}"),
                )
            },
            // systemd units, services and scopes.
            Case {
                unit: Some("nginx.service".into()),
                ..case(
                    "1:name=systemd:/system.slice/nginx.service\n0::/system.slice/nginx.service\n"
                        .into(),
                    "/system.slice/nginx.service",
                )
            },
            Case {
                unit: Some("session-3.scope".into()),
                ..case(
                    v2("/user.slice/user-1000.slice/session-3.scope"),
                    "/user.slice/user-1000.slice/session-3.scope",
                )
            },
            Case {
                unit: Some("app.service".into()),
                ..case(
                    v2("/user.slice/user-1000.slice/user@1000.service/app.slice/app.service"),
                    "/user.slice/user-1000.slice/user@1000.service/app.slice/app.service",
                )
            },
            // Nothing to tell: the most specific path, or the root.
            case(v1("/"), "/sandbox/x"),
            case("0::/\n".into(), "/"),
            case(String::new(), "/"),
        ];
        for case in cases {
            let info = CgroupInfo::parse(&case.text);
            let text = &case.text;
            assert_eq!(info.path, case.path, "{text}");
            assert_eq!(
                info.container.as_ref().map(|c| c.id.as_str()),
                case.id,
                "{text}"
            );
            assert_eq!(
                info.container.and_then(|c| c.runtime),
                case.runtime,
                "{text}"
            );
            assert_eq!(info.pod_uid.as_deref(), case.pod, "{text}");
            assert_eq!(info.systemd_unit, case.unit, "{text}");
        }
    }

    impl Case {
        fn with_unit(mut self, unit: &str) -> Self {
            self.unit = Some(unit.into());
            self
        }
    }

    #[test]
    fn malformed_text_yields_no_facts_rather_than_an_error() {
        for text in ["garbage", "::", "1:cpu", "\n\n", "0::/docker/short"] {
            let info = CgroupInfo::parse(text);
            assert!(info.container.is_none(), "{text}");
            assert!(info.pod_uid.is_none(), "{text}");
        }
    }
}
