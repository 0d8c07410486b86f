//! End to end: the container image. `deploy/container/Containerfile` is
//! built by a real Docker daemon (Debian's docker.io, BuildKit) on base
//! images `cargo xtask setup` made from Debian packages (no image
//! registry is reachable), and the image runs as
//! `deploy/kubernetes/daemonset.yaml` runs it, on that daemon's containerd
//! (the runtime a kubelet drives): the host's PID namespace, root with
//! only the capabilities the DaemonSet grants, the default seccomp
//! profile, the host's /sys read-only, the ConfigMap's configuration. It
//! must profile a workload running on the host and answer the kubelet's
//! probes.

mod common;
mod docker_support;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::*;
use docker_support::*;
use serde_json::Value;

/// Where `cargo xtask setup` keeps the base images' root file systems.
fn image_bases() -> PathBuf {
    let dir = std::env::var_os("FIRN_IMAGE_BASES").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/firn/image-bases")
        },
        PathBuf::from,
    );
    assert!(
        dir.join("tag").is_file(),
        "the container test's base images are missing from {}: run `cargo xtask setup` \
         (or `cargo xtask test`), which makes them from Debian packages",
        dir.display()
    );
    dir
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("readable");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("a list: {value}"))
        .iter()
        .map(|item| item.as_str().expect("a string").to_owned())
        .collect()
}

/// The base images under the recipe's tag, imported from their tarballs
/// unless the daemon already holds them; other tags of them are removed.
fn import_bases(daemon: &Dockerd, bases: &Path) -> (String, String) {
    let tag = std::fs::read_to_string(bases.join("tag")).expect("the bases' tag");
    let tag = tag.trim();
    let mut images = Vec::new();
    for kind in ["builder", "runtime"] {
        let repository = format!("firn-base/{kind}");
        let image = format!("{repository}:{tag}");
        if !daemon
            .docker(&["image", "inspect", &image])
            .status
            .success()
        {
            let changes = std::fs::read_to_string(bases.join(format!("{kind}.changes")))
                .expect("the base's changes");
            let mut command = daemon.command();
            command.arg("import");
            for change in changes.lines().filter(|line| !line.is_empty()) {
                command.arg(format!("--change={change}"));
            }
            let output = command
                .arg(bases.join(format!("{kind}.tar")))
                .arg(&image)
                .output()
                .expect("docker import runs");
            assert!(
                output.status.success(),
                "docker import {image}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let listed = daemon.docker_ok(&["images", "--format", "{{.Tag}}", &repository]);
        for old in listed.lines().filter(|old| *old != tag) {
            let _ = daemon.docker(&["rmi", &format!("{repository}:{old}")]);
        }
        images.push(image);
    }
    (images[0].clone(), images[1].clone())
}

/// A first build on two busy cores took 45 minutes; past this, it hangs.
const BUILD_DEADLINE: Duration = Duration::from_secs(90 * 60);

/// Builds the Containerfile into `image`, and returns how long it took.
fn build_image(
    daemon: &Dockerd,
    dir: &Path,
    builder: &str,
    runtime: &str,
    image: &str,
) -> Duration {
    let started = Instant::now();
    let log_path = dir.join("build.log");
    let log = std::fs::File::create(&log_path).expect("build log");
    let mut build = daemon
        .command()
        .current_dir(workspace())
        .args(["build", "--progress=plain", "--network=host"])
        .arg(format!("--build-arg=BUILDER_IMAGE={builder}"))
        .arg(format!("--build-arg=RUNTIME_IMAGE={runtime}"))
        .args([
            "--file",
            "deploy/container/Containerfile",
            "--tag",
            image,
            ".",
        ])
        .stdout(log.try_clone().expect("build log"))
        .stderr(log)
        .spawn()
        .expect("docker build runs");
    let status = loop {
        if let Some(status) = build.try_wait().expect("waits") {
            break status;
        }
        if started.elapsed() > BUILD_DEADLINE {
            let _ = build.kill();
            let _ = build.wait();
            panic!(
                "docker build did not finish within {BUILD_DEADLINE:?}:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    assert!(
        status.success(),
        "docker build failed after {took:?}:\n{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    // What earlier builds left: the image this one replaced, build cache
    // beyond a bound (the cargo caches are what a rebuild reuses).
    let _ = daemon.docker(&["image", "prune", "--force"]);
    let _ = daemon.docker(&["builder", "prune", "--force", "--keep-storage=8GB"]);
    took
}

/// The ConfigMap's firn.yaml without the remote store: profiles go to the
/// local store the test reads.
fn local_config(dir: &Path) -> PathBuf {
    let configmap = yaml(&workspace().join("deploy/kubernetes/configmap.yaml"));
    let text = configmap["data"]["firn.yaml"].as_str().expect("firn.yaml");
    assert!(text.contains("remote-store-address:"), "{text}");
    let local: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("remote-store-"))
        .map(|line| format!("{line}\n"))
        .collect();
    let config_dir = dir.join("etc-firn");
    std::fs::create_dir_all(&config_dir).expect("config directory");
    std::fs::write(config_dir.join("firn.yaml"), local).expect("config");
    config_dir
}

/// Linux's capabilities by number, as `CAP_*` names.
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The capability names set in a `/proc/PID/status` mask.
fn capability_names(mask: u64) -> BTreeSet<String> {
    (0..CAPABILITIES.len())
        .filter(|bit| mask & (1 << bit) != 0)
        .map(|bit| CAPABILITIES[bit].to_owned())
        .collect()
}

/// What the DaemonSet's pod asks of its runtime.
struct Pod {
    /// `ctr run` flags: its security context and volumes (the config
    /// directory and the local store given), `--net-host` for the pod's IP.
    flags: Vec<String>,
    /// The container's arguments, and those that keep the run local.
    args: Vec<String>,
    capabilities: BTreeSet<String>,
}

/// The DaemonSet's pod as containerd's `ctr run` flags. Debian's Docker
/// 20.10 refuses `--cap-add=BPF` (it predates the capability), and
/// containerd is the runtime a kubelet uses: its default seccomp profile
/// is the pod's `RuntimeDefault`.
fn daemonset_pod(config_dir: &Path, store: &Path) -> Pod {
    let daemonset = yaml(&workspace().join("deploy/kubernetes/daemonset.yaml"));
    let pod = &daemonset["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    let mut flags = vec!["--net-host".to_owned()];
    assert_eq!(pod["hostPID"], true);
    // The test's own PID namespace is the host's here (the machine's
    // PID 1 may hide its namespace from root).
    flags.push(format!("--with-ns=pid:/proc/{}/ns/pid", std::process::id()));
    // ctr sets no user: the image's, root (see `cargo xtask setup`'s
    // runtime base); checked against runAsUser below.
    assert_eq!(security["runAsUser"], 0);
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    let capabilities: BTreeSet<String> = strings(&security["capabilities"]["add"])
        .into_iter()
        .collect();
    for name in CAPABILITIES {
        if capabilities.contains(name) {
            flags.push(format!("--cap-add=CAP_{name}"));
        } else {
            flags.push(format!("--cap-drop=CAP_{name}"));
        }
    }
    assert_eq!(security["privileged"], false);
    // ctr sets no_new_privs unless --allow-new-privs.
    assert_eq!(security["allowPrivilegeEscalation"], false);
    if security["readOnlyRootFilesystem"] == true {
        flags.push("--read-only".to_owned());
    }
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    flags.push("--seccomp".to_owned());
    // Unconfined AppArmor: ctr applies no profile unless asked.
    assert_eq!(security["appArmorProfile"]["type"], "Unconfined");
    let volumes = pod["volumes"].as_array().expect("volumes");
    for mount in container["volumeMounts"].as_array().expect("mounts") {
        let name = mount["name"].as_str().expect("a name");
        let target = mount["mountPath"].as_str().expect("a path");
        let volume = volumes
            .iter()
            .find(|volume| volume["name"] == name)
            .unwrap_or_else(|| panic!("volume {name}"));
        let source = if volume["configMap"].is_object() {
            config_dir.to_path_buf()
        } else {
            PathBuf::from(volume["hostPath"]["path"].as_str().expect("a host path"))
        };
        if !source.exists() {
            // DirectoryOrCreate (debug files): nothing to mount here.
            assert_eq!(volume["hostPath"]["type"], "DirectoryOrCreate", "{name}");
            continue;
        }
        let access = if mount["readOnly"] == true {
            "ro"
        } else {
            "rw"
        };
        flags.push(format!(
            "--mount=type=bind,src={},dst={target},options=rbind:{access}",
            source.display()
        ));
    }
    flags.push(format!(
        "--mount=type=bind,src={},dst=/var/lib/firn/profiles,options=rbind:rw",
        store.display()
    ));
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    flags.push(format!("--env=NODE_NAME={}", node.trim()));
    let mut args = strings(&container["args"]);
    args.extend(
        [
            "--profiling-duration=2s",
            "--local-store-directory=/var/lib/firn/profiles",
            // The pod's port, on the host's network: a free one.
            "--http-address=127.0.0.1:0",
        ]
        .map(str::to_owned),
    );
    Pod {
        flags,
        args,
        capabilities,
    }
}

/// containerd's client on the Docker daemon's containerd, in a namespace
/// of the test's own.
struct Ctr {
    address: PathBuf,
}

const CTR_NAMESPACE: &str = "firn-image-test";

impl Ctr {
    fn command(&self) -> Command {
        let mut command = Command::new("ctr");
        command
            .arg(format!("--address={}", self.address.display()))
            .arg(format!("--namespace={CTR_NAMESPACE}"));
        command
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self
            .command()
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("ctr (Debian's containerd) runs: {error}"));
        assert!(
            output.status.success(),
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// A container `ctr run` started: killed and deleted when dropped.
struct CtrContainer<'a> {
    ctr: &'a Ctr,
    id: String,
}

impl Drop for CtrContainer<'_> {
    fn drop(&mut self) {
        let _ = self
            .ctr
            .command()
            .args(["task", "kill", "--signal=SIGKILL", &self.id])
            .output();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let deleted = self
                .ctr
                .command()
                .args(["task", "delete", "--force", &self.id])
                .output();
            let listed = self.ctr.command().args(["task", "ls", "-q"]).output();
            if deleted.is_ok()
                && listed.is_ok_and(|out| !String::from_utf8_lossy(&out.stdout).contains(&self.id))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self
            .ctr
            .command()
            .args(["container", "delete", &self.id])
            .output();
    }
}

/// The `ctr`-side name of a local Docker image.
fn ctr_image_name(image: &str) -> String {
    format!("docker.io/library/{image}")
}

/// A field of `/proc/PID/status`.
fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

/// Where the container serves /healthy, from its log line saying so.
fn served_at(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|line| line.contains("serving /metrics"))?;
    let start = line.find("address=")? + "address=".len();
    line[start..].split_whitespace().next()?.parse().ok()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story: build the image, run it as the DaemonSet does, read what it wrote"
)]
fn the_image_builds_and_profiles_as_the_daemonset_runs_it() {
    require_root();
    let _serial = serial();
    let bases = image_bases();
    let dir = tempfile::tempdir().expect("tempdir");
    // The daemon's data root is kept with the bases: imported bases and
    // the build's cargo caches serve the next run.
    let daemon = Dockerd::start_on(&dir.path().join("docker"), &bases.join("docker"));
    let (builder, runtime) = import_bases(&daemon, &bases);
    let image = "firn-image-test:latest";
    let took = build_image(&daemon, dir.path(), &builder, &runtime, image);
    eprintln!("docker build of the image: {took:.1?}");

    // The image as containerd holds it.
    let ctr = Ctr {
        address: daemon.containerd_socket(),
    };
    // A run killed before its guards dropped leaves its container (and
    // firn, in the host's PID namespace) behind: the namespace is the
    // test's own.
    for leftover in ctr.ok(&["container", "ls", "--quiet"]).lines() {
        drop(CtrContainer {
            ctr: &ctr,
            id: leftover.trim().to_owned(),
        });
    }
    // The last run's image goes first, its snapshots collected before
    // the import returns (`--sync`): replaced by the import instead, they
    // are collected while it unpacks, and containerd's collector may take
    // a parent layer the unpack has just found ("parent snapshot ... does
    // not exist", containerd/containerd#3787).
    let listed = ctr.ok(&["images", "ls", "--quiet"]);
    for old in listed
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        ctr.ok(&["images", "rm", "--sync", old]);
    }
    let archive = dir.path().join("image.tar");
    daemon.docker_ok(&["save", "--output", archive.to_str().expect("utf-8"), image]);
    ctr.ok(&["images", "import", archive.to_str().expect("utf-8")]);
    let entrypoint: Vec<String> = serde_json::from_str(&daemon.docker_ok(&[
        "image",
        "inspect",
        "--format={{json .Config.Entrypoint}}",
        image,
    ]))
    .expect("the entrypoint");

    let chain = build_c(dir.path(), "chain.c", "chain", &FP_FLAGS);
    let workload = TestProcess::spawn(Command::new(&chain).arg("100000"));
    let store = dir.path().join("profiles");
    std::fs::create_dir_all(&store).expect("store");
    let pod = daemonset_pod(&local_config(dir.path()), &store);
    let log_path = dir.path().join("firn.log");
    let id = format!("firn-image-{}", std::process::id());
    let mut run = vec!["run".to_owned(), "--detach".to_owned()];
    run.push(format!("--log-uri=file://{}", log_path.display()));
    run.extend(pod.flags.iter().cloned());
    run.push(ctr_image_name(image));
    run.push(id.clone());
    run.extend(entrypoint);
    run.extend(pod.args.iter().cloned());
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    ctr.ok(&run);
    let _container = CtrContainer {
        ctr: &ctr,
        id: id.clone(),
    };
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // firn, as the host sees it: root with exactly the DaemonSet's
    // capabilities, no new privileges, a seccomp filter.
    let tasks = ctr.ok(&["task", "ls"]);
    let pid: u32 = tasks
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.first() == Some(&id.as_str()) && fields.get(2) == Some(&"RUNNING"))
                .then(|| fields[1].parse().ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("firn's task is not running:\n{tasks}\n{}", logs()));
    assert!(
        status_field(pid, "Uid")
            .split_whitespace()
            .all(|uid| uid == "0"),
        "runAsUser: 0"
    );
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        let mask = u64::from_str_radix(&status_field(pid, set), 16).expect("a mask");
        assert_eq!(capability_names(mask), pod.capabilities, "{set}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(
        status_field(pid, "Seccomp"),
        "2",
        "RuntimeDefault: a filter"
    );

    let running = || {
        ctr.ok(&["task", "ls"])
            .lines()
            .any(|line| line.starts_with(&id) && line.contains("RUNNING"))
    };
    let stacks = std::cell::RefCell::new(Vec::new());
    wait_for(
        "a profile naming the workload's chain",
        Duration::from_secs(120),
        || {
            assert!(running(), "the container exited:\n{}", logs());
            let Some(profile) = newest_profile(&store) else {
                return false;
            };
            *stacks.borrow_mut() = stacks_of(&profile, workload.pid());
            let (share, total) = chain_share(&stacks.borrow(), &CHAIN);
            total >= 20 && share > 0.8
        },
        || format!("{}\n{}", describe(&stacks.borrow()), logs()),
    );

    let address = served_at(&logs()).unwrap_or_else(|| panic!("no address logged:\n{}", logs()));
    for path in ["/healthy", "/ready"] {
        let answer = get(address, path);
        assert!(
            matches!(answer, Ok((200, _))),
            "{path} answered {answer:?}:\n{}",
            logs()
        );
    }
    let log = logs();
    assert!(!log.contains("level=error"), "{log}");
}
