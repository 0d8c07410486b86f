//! End to end: Docker and Podman metadata. A real Docker daemon (Debian's
//! docker.io, on its own socket and data directories) runs a real
//! container of a test workload, and firn names it from the daemon's API;
//! a replay of the same API covers what a fake can make certain (a
//! runtime that knows only one container, a socket that is missing).

mod common;
mod docker_support;
mod labels_support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use common::*;
use docker_support::*;
use labels_support::*;

const MINUTE: Duration = Duration::from_secs(60);

/// Runs the agent with `args` into a local store until it wrote a profile
/// holding `pid`, stops it, and returns that profile's labels of `pid`
/// and the agent's log.
fn labels_from_agent(dir: &Path, pid: u32, args: &[&str]) -> (BTreeMap<String, String>, String) {
    let (mut labels, log) = labels_of_each(dir, &[pid], args);
    (labels.remove(0), log)
}

/// [`labels_from_agent`] for several processes (each also given to the
/// agent as `--pid`): a profile must hold every one of them.
fn labels_of_each(
    dir: &Path,
    pids: &[u32],
    args: &[&str],
) -> (Vec<BTreeMap<String, String>>, String) {
    let store = dir.join("profiles");
    let pid_args: Vec<String> = pids
        .iter()
        .flat_map(|pid| ["--pid".to_owned(), pid.to_string()])
        .collect();
    let pid_args: Vec<&str> = pid_args.iter().map(String::as_str).collect();
    let agent = Agent::start(
        &dir.join("firn.log"),
        &[
            &[
                "--profiling-duration",
                "2s",
                "--local-store-directory",
                store.to_str().expect("utf-8"),
            ][..],
            &pid_args,
            args,
        ]
        .concat(),
        &[],
    );
    let labels = std::cell::RefCell::new(Vec::new());
    agent.wait_until("a profile holding every workload", MINUTE, || {
        let Some(profile) = newest_profile(&store) else {
            return false;
        };
        let found: Vec<_> = pids.iter().map(|&pid| labels_of(&profile, pid)).collect();
        let all_sampled = found.iter().all(|(_, samples)| *samples > 0);
        *labels.borrow_mut() = found.into_iter().map(|(labels, _)| labels).collect();
        all_sampled
    });
    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
    (labels.into_inner(), stopped.log)
}

#[test]
fn a_real_docker_container_is_named_with_its_labels() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    // A root file system of one static binary: no image registry needed.
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("rootfs");
    build_c(
        &rootfs,
        "chain.c",
        "chain",
        &["-static", "-O1", "-fno-omit-frame-pointer"],
    );
    let tarball = dir.path().join("rootfs.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .expect("tar runs");
    assert!(status.success());
    let mut daemon = Dockerd::start(&dir.path().join("docker"));
    daemon.docker_ok(&["import", tarball.to_str().expect("utf-8"), "firn-e2e:1"]);
    let name = format!("firn-e2e-{}", random_hex(8));
    let id = daemon.docker_ok(&[
        "run",
        "--detach",
        "--network=none",
        "--name",
        &name,
        "--label",
        "com.example.team=storefront",
        "firn-e2e:1",
        "/chain",
        "100000",
    ]);
    daemon.containers.push(id.clone());
    let pid: u32 = daemon
        .docker_ok(&["inspect", "--format", "{{.State.Pid}}", &id])
        .parse()
        .expect("a pid");
    let config = dir.path().join("firn.yaml");
    std::fs::write(
        &config,
        "relabel_configs:\n\
         - source_labels: [__meta_docker_container_label_com_example_team]\n  target_label: team\n",
    )
    .expect("config");
    let (labels, log) = labels_from_agent(
        dir.path(),
        pid,
        &[
            "--config-path",
            config.to_str().expect("utf-8"),
            "--container-runtime-sockets",
            daemon.socket.to_str().expect("utf-8"),
        ],
    );
    let get = |name: &str| labels.get(name).map(String::as_str);
    assert_eq!(get("container_id"), Some(id.as_str()), "{labels:?}");
    assert_eq!(get("container"), Some(name.as_str()), "{labels:?}");
    assert_eq!(get("service_name"), Some(name.as_str()), "{labels:?}");
    assert_eq!(get("team"), Some("storefront"), "{labels:?}");
    assert!(!log.contains("level=error"), "{log}");
}

/// Docker's API as a runtime socket answers `GET /containers/{id}/json`,
/// for the one container it knows; 404 for others. Stops when dropped.
struct FakeRuntimeSocket {
    path: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FakeRuntimeSocket {
    fn start(path: &Path, id: &str, inspect: String) -> Self {
        use std::io::{Read, Write};
        let listener = std::os::unix::net::UnixListener::bind(path).expect("socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let wanted = format!("GET /containers/{id}/json ");
        {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok((mut client, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let _ = client.set_nonblocking(false);
                    let mut request = [0u8; 4096];
                    let read = client.read(&mut request).unwrap_or(0);
                    let request = String::from_utf8_lossy(&request[..read]);
                    let answer = if request.starts_with(&wanted) {
                        format!(
                            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{inspect}",
                            inspect.len()
                        )
                    } else {
                        "HTTP/1.0 404 Not Found\r\nContent-Length: 2\r\n\r\n{}".to_owned()
                    };
                    let _ = client.write_all(answer.as_bytes());
                }
            });
        }
        Self {
            path: path.to_path_buf(),
            stop,
        }
    }
}

impl Drop for FakeRuntimeSocket {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn docker_containers_get_their_name_and_labels_from_the_runtime_socket() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let h = hierarchies();
    let id = random_hex(64);
    let cgroups = TestCgroups(vec![TestCgroup::create(
        &h.unified,
        &format!("system.slice/docker-{id}.scope"),
    )]);
    let inside = start_chain(dir.path(), &FP_FLAGS);
    cgroups.0[0].add(inside.pid());
    let outside = start_chain(dir.path(), &FP_FLAGS);
    let socket = dir.path().join("docker.sock");
    let _runtime = FakeRuntimeSocket::start(
        &socket,
        &id,
        format!(
            r#"{{"Id":"{id}","Name":"/shop-web","Config":{{"Image":"example/shop:1","Labels":{{"com.example.team":"storefront"}}}}}}"#
        ),
    );
    let config = dir.path().join("firn.yaml");
    std::fs::write(
        &config,
        "relabel_configs:\n\
         - source_labels: [__meta_docker_container_label_com_example_team]\n  target_label: team\n\
         - source_labels: [__meta_docker_container_image]\n  target_label: image\n",
    )
    .expect("config");
    let sockets = format!("{},/nonexistent/podman.sock", socket.display());
    let (each, log) = labels_of_each(
        dir.path(),
        &[inside.pid(), outside.pid()],
        &[
            "--config-path",
            config.to_str().expect("utf-8"),
            "--container-runtime-sockets",
            &sockets,
        ],
    );
    let get =
        |labels: &std::collections::BTreeMap<String, String>, name: &str| labels.get(name).cloned();
    let labels = &each[0];
    for (name, value) in [
        ("container", "shop-web"),
        ("container_id", id.as_str()),
        ("service_name", "shop-web"),
        ("team", "storefront"),
        ("image", "example/shop:1"),
    ] {
        assert_eq!(get(labels, name).as_deref(), Some(value), "{labels:?}");
    }
    // The process beside the container, in no container cgroup, gets
    // none of the container's labels: it is named as a plain process.
    let outside_labels = &each[1];
    assert_eq!(
        get(outside_labels, "pid"),
        Some(outside.pid().to_string()),
        "{outside_labels:?}"
    );
    assert_eq!(get(outside_labels, "comm").as_deref(), Some("chain"));
    for name in ["container", "container_id", "team", "image"] {
        assert_eq!(get(outside_labels, name), None, "{outside_labels:?}");
    }
    assert_ne!(
        get(outside_labels, "service_name").as_deref(),
        Some("shop-web"),
        "{outside_labels:?}"
    );
    let log = &log;
    assert!(
        !log.contains("level=error") && !log.contains("level=warn"),
        "an absent socket is no error:\n{log}"
    );
}
