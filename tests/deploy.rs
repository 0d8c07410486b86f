//! The files in deploy/: Kubernetes manifests checked against Kubernetes'
//! own schemas, the systemd unit by systemd-analyze, the Containerfile by
//! hadolint, each one's firn flags and config by firn's own parser, and
//! the capability set they grant by running firn with exactly that set
//! (and with each capability left out, to show it is needed).

mod common;

use std::{
    collections::BTreeSet,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use agent_pprof::{self as pprof, Reader};
use common::*;
use firn::{cli::parse_args, config::AgentConfig};
use serde_json::Value;

/// What deploy/ grants, verified below.
const CAPABILITIES: [&str; 6] = [
    "BPF",
    "PERFMON",
    "SYSLOG",
    "SYS_PTRACE",
    "DAC_READ_SEARCH",
    "CHECKPOINT_RESTORE",
];

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("readable");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

fn kubernetes(name: &str) -> Value {
    yaml(&deploy().join("kubernetes").join(name))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("a list: {value}"))
        .iter()
        .map(|item| item.as_str().expect("a string").to_owned())
        .collect()
}

fn run(command: &mut Command) -> std::process::Output {
    command
        .output()
        .unwrap_or_else(|error| panic!("could not run {command:?}: {error}"))
}

/// `firn ARGS` with `--config-path=CONFIG` pointing at `config`, parsed
/// and checked as the binary does.
fn agent_config(args: &[String], config_in: &str, config: &Path) -> AgentConfig {
    let mut argv = vec!["firn".to_owned()];
    argv.extend(args.iter().map(|arg| {
        arg.replace(
            &format!("--config-path={config_in}"),
            &format!("--config-path={}", config.display()),
        )
    }));
    let cli = parse_args(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    AgentConfig::try_from(&cli.agent).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

#[test]
fn kubernetes_manifests_pass_schema_validation() {
    let dir = deploy().join("kubernetes");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    files.sort();
    let kustomization = kubernetes("kustomization.yaml");
    let mut resources = strings(&kustomization["resources"]);
    resources.sort();
    let manifests: Vec<String> = files
        .iter()
        .filter(|name| *name != "kustomization.yaml")
        .cloned()
        .collect();
    assert_eq!(
        resources, manifests,
        "the kustomization lists every manifest"
    );

    let validator = python_tool("kubernetes-validate");
    for name in &manifests {
        let manifest = kubernetes(name);
        assert!(manifest["kind"].is_string(), "{name}: {manifest}");
        let output = run(Command::new(&validator).arg("--strict").arg(dir.join(name)));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success() && text.contains("passed"),
            "{name} fails Kubernetes' schema:\n{text}"
        );
    }
    // The validator does refuse what Kubernetes would.
    let broken = tempfile::tempdir().expect("tempdir");
    let daemonset = std::fs::read_to_string(dir.join("daemonset.yaml")).expect("daemonset");
    for (from, to) in [
        ("hostPID: true", "hostPID: \"yes\""),
        (
            "readOnlyRootFilesystem: true",
            "readOnlyRootFilesystem: true\n            readOnlyRoot: true",
        ),
    ] {
        assert!(daemonset.contains(from));
        let path = broken.path().join("daemonset.yaml");
        std::fs::write(&path, daemonset.replacen(from, to, 1)).expect("broken copy");
        let output = run(Command::new(&validator).arg("--strict").arg(&path));
        assert!(!output.status.success(), "`{to}` passed validation");
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a checklist of the manifest's settings, one assertion each, read top to bottom"
)]
fn the_daemonset_runs_firn_with_the_configmap_as_a_least_privileged_root() {
    let daemonset = kubernetes("daemonset.yaml");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "firn sees the node's processes");
    let account = kubernetes("serviceaccount.yaml");
    assert_eq!(pod["serviceAccountName"], account["metadata"]["name"]);

    let role = kubernetes("clusterrole.yaml");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])
    );
    let binding = kubernetes("clusterrolebinding.yaml");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], account["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0]["namespace"],
        account["metadata"]["namespace"]
    );

    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let firn = &containers[0];
    let security = &firn["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    let added: BTreeSet<String> = strings(&security["capabilities"]["add"])
        .into_iter()
        .collect();
    let wanted: BTreeSet<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
    assert_eq!(added, wanted);

    let node_name = firn["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|var| var["name"] == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(firn["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(firn["livenessProbe"]["httpGet"]["path"], "/healthy");
    assert!(firn["resources"]["requests"]["memory"].is_string());
    assert!(firn["resources"]["limits"]["memory"].is_string());
    let mounts = firn["volumeMounts"].as_array().expect("mounts");
    let mount = |path: &str| {
        mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("{path} mounted"))
    };
    assert_eq!(mount("/sys")["readOnly"], true);
    assert_eq!(mount("/usr/lib/debug")["readOnly"], true);
    let config_volume = mount("/etc/firn")["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == config_volume.as_str())
        .expect("the config volume");
    let configmap = kubernetes("configmap.yaml");
    assert_eq!(volume["configMap"]["name"], configmap["metadata"]["name"]);

    // The container's arguments and the ConfigMap's firn.yaml make a
    // configuration firn accepts.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("firn.yaml");
    std::fs::write(
        &config,
        configmap["data"]["firn.yaml"].as_str().expect("firn.yaml"),
    )
    .expect("config");
    let args = strings(&firn["args"]);
    let agent = agent_config(&args, "/etc/firn/firn.yaml", &config);
    assert!(agent.remote_store().is_some(), "pushes to Parca");
    assert!(
        !agent.metadata.relabel_rules.is_empty(),
        "example relabel rules"
    );
    let port = firn["ports"][0]["containerPort"].as_u64().expect("a port");
    assert_eq!(u64::from(agent.http_address.port()), port);
    assert!(
        !agent.http_address.ip().is_loopback(),
        "the kubelet's probes reach the pod's IP"
    );
}

/// `Key=` values of a unit file.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|line| line.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_and_runs_firn_with_its_config() {
    let unit_path = deploy().join("systemd/firn.service");
    let unit = std::fs::read_to_string(&unit_path).expect("the unit");
    let exec = unit_values(&unit, "ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let mut words = exec[0].split_whitespace();
    let binary = words.next().expect("a binary");
    let args: Vec<String> = words.map(str::to_owned).collect();

    let dir = tempfile::tempdir().expect("tempdir");
    let verify = |text: &str| {
        let path = dir.path().join("firn.service");
        std::fs::write(&path, text).expect("unit copy");
        let output = run(Command::new("systemd-analyze").arg("verify").arg(&path));
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    // The unit as installed, its binary a real firn.
    let installed = unit.replace(binary, env!("CARGO_BIN_EXE_firn"));
    let (ok, warnings) = verify(&installed);
    assert!(
        ok && warnings.trim().is_empty(),
        "systemd-analyze verify:\n{warnings}"
    );
    let (_, warnings) = verify(&format!("{installed}\n[Service]\nNoSuchSetting=1\n"));
    assert!(
        warnings.contains("NoSuchSetting"),
        "systemd-analyze reports what it does not know"
    );

    let path = dir.path().join("firn.service");
    std::fs::write(&path, &installed).expect("unit copy");
    let output = run(Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(&path));
    let report = String::from_utf8_lossy(&output.stdout);
    let exposure: f64 = report
        .lines()
        .find_map(|line| {
            line.split("Overall exposure level for firn.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{report}"));
    eprintln!("systemd-analyze security: exposure {exposure}");
    assert!(exposure < 5.0, "the unit is hardened:\n{report}");

    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let granted: BTreeSet<String> = unit_values(&unit, key)
            .join(" ")
            .split_whitespace()
            .map(|cap| cap.trim_start_matches("CAP_").to_owned())
            .collect();
        let wanted: BTreeSet<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        assert_eq!(granted, wanted, "{key}");
    }
    assert_eq!(unit_values(&unit, "NoNewPrivileges"), ["yes"]);
    assert_eq!(
        unit_values(&unit, "EnvironmentFile"),
        ["-/etc/firn/firn.env"]
    );

    // Its flags and the config it installs make a configuration firn takes.
    let agent = agent_config(
        &args,
        "/etc/firn/firn.yaml",
        &deploy().join("systemd/firn.yaml"),
    );
    assert_eq!(
        agent.local_store.directory,
        PathBuf::from("/var/lib/firn/profiles"),
        "profiles in the unit's StateDirectory"
    );
    assert_eq!(unit_values(&unit, "StateDirectory"), ["firn"]);
}

/// What cargo reads to build the workspace: its manifest and lock file,
/// every member, every patched crate, the protocol files.
fn workspace_paths(workspace: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("workspace members");
    let patched = manifest
        .split_once("[patch.crates-io]")
        .map(|(_, rest)| rest)
        .expect("the aya patch");
    members
        .split('"')
        .skip(1)
        .step_by(2)
        .chain(
            patched
                .split("path = \"")
                .skip(1)
                .filter_map(|rest| rest.split('"').next()),
        )
        .chain(["Cargo.toml", "Cargo.lock", "proto"])
        .map(str::to_owned)
        .collect()
}

/// The stable Rust rust-toolchain.toml pins.
fn rust_channel(workspace: &Path) -> String {
    let toolchain = std::fs::read_to_string(workspace.join("rust-toolchain.toml")).expect("toml");
    toolchain
        .lines()
        .find_map(|line| line.strip_prefix("channel = "))
        .expect("channel")
        .trim_matches('"')
        .to_owned()
}

/// hadolint passes `path` (and does refuse a sloppy file).
fn assert_hadolint_clean(path: &Path) {
    let hadolint = python_tool("hadolint");
    let output = run(Command::new(&hadolint).arg(path));
    assert!(
        output.status.success(),
        "hadolint:\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let sloppy = dir.path().join("Containerfile");
    std::fs::write(&sloppy, "FROM debian\nRUN apt-get install curl\n").expect("file");
    assert!(
        !run(Command::new(&hadolint).arg(&sloppy)).status.success(),
        "hadolint refuses an unpinned image"
    );
}

#[test]
fn the_containerfile_lints_clean_and_builds_what_the_workspace_has() {
    // The file is linted and its references checked against the
    // workspace here; tests/image.rs builds and runs it.
    let path = deploy().join("container/Containerfile");
    let text = std::fs::read_to_string(&path).expect("Containerfile");
    assert_hadolint_clean(&path);

    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // The bases are build arguments (local ones in the tests); their
    // defaults are the public images.
    let mut defaults = std::collections::BTreeMap::new();
    let mut stages = Vec::new();
    let mut copied = BTreeSet::new();
    let mut copied_to = Vec::new();
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ARG", definition] => {
                if let Some((name, value)) = definition.split_once('=') {
                    defaults.insert(format!("${{{name}}}"), value.to_owned());
                }
            }
            ["FROM", image, rest @ ..] => {
                let image = defaults.get(*image).map_or(*image, String::as_str);
                assert!(image.contains(':'), "{image} carries a tag");
                assert!(
                    !image.contains('$'),
                    "{image}: an argument without a default"
                );
                if let ["AS", name] = rest {
                    stages.push((*name).to_owned());
                }
            }
            ["COPY", from, .., target] if from.starts_with("--from=") => {
                let stage = from.trim_start_matches("--from=");
                assert!(stages.iter().any(|s| s == stage), "stage {stage}");
                copied_to.push((*target).to_owned());
            }
            ["COPY", sources @ .., _target] => {
                for source in sources {
                    assert!(
                        workspace.join(source).exists(),
                        "COPY {source}: not in the workspace"
                    );
                    copied.insert(source.trim_end_matches('/').to_owned());
                }
            }
            _ => {}
        }
    }
    // Cargo loads every member's manifest and the patched crates: each is
    // copied.
    let needed = workspace_paths(&workspace);
    assert!(
        needed.iter().any(|path| path == "third_party/aya"),
        "{needed:?}"
    );
    for path in needed {
        assert!(
            copied.contains(&path),
            "the Containerfile does not copy {path}"
        );
    }
    assert_eq!(stages, ["builder"]);
    let channel = rust_channel(&workspace);
    assert!(
        text.contains(&format!("rust:{channel}-")),
        "the builder uses the pinned Rust {channel}"
    );
    let entrypoint = text
        .lines()
        .find_map(|line| line.strip_prefix("ENTRYPOINT [\""))
        .and_then(|rest| rest.split('"').next())
        .expect("ENTRYPOINT");
    assert!(
        copied_to.iter().any(|target| target == entrypoint),
        "{entrypoint}"
    );
    let cmd = text
        .lines()
        .find_map(|line| line.strip_prefix("CMD [\""))
        .and_then(|rest| rest.split('"').next())
        .expect("CMD");
    assert!(
        parse_args(["firn", cmd]).is_ok(),
        "the image's default arguments parse"
    );
}

/// firn's own unprivileged user, other than the workloads' (65534), as
/// root in a container or a DynamicUser= service is to the host's processes.
const FIRN_USER: &str = "65533";

/// One `firn record` as an unprivileged user holding only `capabilities`.
fn record_with(
    capabilities: &[&str],
    dir: &Path,
    firn: &Path,
    pids: &[u32],
) -> pprof::proto::Profile {
    let caps = capabilities
        .iter()
        .map(|cap| format!(",+{}", cap.to_ascii_lowercase()))
        .collect::<String>();
    let output_path = dir.join("out/profile.pb.gz");
    let _ = std::fs::remove_file(&output_path);
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={FIRN_USER}"))
        .arg(format!("--regid={FIRN_USER}"))
        .arg("--clear-groups")
        .arg(format!("--bounding-set=-all{caps}"))
        .arg(format!("--inh-caps=-all{caps}"))
        .arg(format!("--ambient-caps=-all{caps}"))
        .arg("--")
        .arg(firn)
        .args(["record", "--duration", "3s", "--output"])
        .arg(&output_path);
    for pid in pids {
        command.arg("--pid").arg(pid.to_string());
    }
    let output = run(&mut command);
    assert!(
        output.status.success(),
        "firn record with {capabilities:?}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    pprof::decode(&std::fs::read(&output_path).expect("the profile")).expect("pprof")
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story: an unprivileged firn with the granted capabilities against another user's workloads, then each capability left out in turn"
)]
fn the_granted_capabilities_suffice_and_each_is_needed() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    // Everything the unprivileged firn needs to reach: world-readable.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("out");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let firn = dir.path().join("firn");
    std::fs::copy(env!("CARGO_BIN_EXE_firn"), &firn).expect("firn copy");
    let chain = build_c(dir.path(), "chain.c", "chain", &FP_FLAGS);
    let deleted = dir.path().join("chain-deleted");
    std::fs::copy(&chain, &deleted).expect("copy");
    for path in [&chain, &deleted, &firn] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    // Workloads of another user: one whose binary is deleted once running
    // (as after an upgrade: only /proc/PID/map_files still opens it), and a
    // writer spending its time in the kernel.
    let as_nobody = |program: &Path, args: &[&str]| {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(program)
            .args(args);
        TestProcess::spawn(&mut command)
    };
    let running = as_nobody(&chain, &["100000"]);
    let orphan = as_nobody(&deleted, &["100000"]);
    let writer = as_nobody(
        Path::new("/bin/dd"),
        &["if=/dev/zero", "of=/dev/null", "bs=1"],
    );
    // setpriv has exec'd each workload (the deleted one must be mapped
    // before its file goes).
    for (process, name) in [
        (&running, "chain"),
        (&orphan, "chain-deleted"),
        (&writer, "dd"),
    ] {
        let exe = format!("/proc/{}/exe", process.pid());
        wait_for(
            "the workload to run",
            Duration::from_secs(30),
            || std::fs::read_link(&exe).is_ok_and(|path| path.ends_with(name)),
            || format!("{exe}: {:?}", std::fs::read_link(&exe)),
        );
    }
    std::fs::remove_file(&deleted).expect("delete the running binary");
    let pids = [running.pid(), orphan.pid(), writer.pid()];

    let named_chain = |profile: &pprof::proto::Profile, pid: u32| {
        let stacks = stacks_of(profile, pid);
        let (share, total) = chain_share(&stacks, &CHAIN);
        assert!(total > 0, "no samples of {pid}");
        share > 0.5
    };
    let named_kernel = |profile: &pprof::proto::Profile, pid: u32| {
        let stacks = stacks_of(profile, pid);
        assert!(!stacks.is_empty(), "no samples of {pid}");
        stacks.iter().any(|(names, _)| {
            names
                .iter()
                .any(|n| ["ksys_write", "vfs_write", "__x64_sys_write"].contains(&n.as_str()))
        })
    };
    let executable = |profile: &pprof::proto::Profile, pid: u32| {
        let pid = pid.to_string();
        Reader::new(profile)
            .samples()
            .find(|s| s.label("pid") == Some(pid.as_str()))
            .and_then(|s| s.label("executable"))
            .map(str::to_owned)
    };

    let all = record_with(&CAPABILITIES, dir.path(), &firn, &pids);
    assert!(
        named_chain(&all, running.pid()),
        "{}",
        describe(&stacks_of(&all, running.pid()))
    );
    assert!(named_chain(&all, orphan.pid()), "a deleted binary is named");
    assert!(named_kernel(&all, writer.pid()), "kernel frames are named");
    assert_eq!(executable(&all, running.pid()).as_deref(), Some("chain"));

    // Each capability left out costs what the manifests say it is for.
    let without = |left_out: &str| {
        let caps: Vec<&str> = CAPABILITIES
            .iter()
            .copied()
            .filter(|c| *c != left_out)
            .collect();
        record_with(&caps, dir.path(), &firn, &pids)
    };
    let profile = without("SYSLOG");
    assert!(
        !named_kernel(&profile, writer.pid()),
        "kallsyms needs CAP_SYSLOG"
    );
    assert!(named_chain(&profile, running.pid()));
    let profile = without("CHECKPOINT_RESTORE");
    assert!(
        !named_chain(&profile, orphan.pid()),
        "map_files needs CAP_CHECKPOINT_RESTORE"
    );
    let profile = without("DAC_READ_SEARCH");
    assert!(
        !named_chain(&profile, orphan.pid()),
        "another user's map_files needs CAP_DAC_READ_SEARCH"
    );
    let profile = without("SYS_PTRACE");
    // Sampled all the same: only the executable is missing.
    assert!(
        !stacks_of(&profile, running.pid()).is_empty(),
        "no samples of {} without CAP_SYS_PTRACE",
        running.pid()
    );
    assert_eq!(
        executable(&profile, running.pid()),
        None,
        "/proc/PID/exe needs CAP_SYS_PTRACE"
    );
    for needed in ["BPF", "PERFMON"] {
        let caps: Vec<&str> = CAPABILITIES
            .iter()
            .copied()
            .filter(|c| *c != needed)
            .collect();
        let output = run(Command::new("setpriv")
            .arg(format!("--reuid={FIRN_USER}"))
            .arg(format!("--regid={FIRN_USER}"))
            .arg("--clear-groups")
            .arg(format!(
                "--ambient-caps=-all{}",
                caps.iter()
                    .map(|c| format!(",+{}", c.to_ascii_lowercase()))
                    .collect::<String>()
            ))
            .arg(format!(
                "--inh-caps=-all{}",
                caps.iter()
                    .map(|c| format!(",+{}", c.to_ascii_lowercase()))
                    .collect::<String>()
            ))
            .arg(&firn)
            .args(["record", "--duration", "1s", "--output"])
            .arg(out.join("never.pb.gz")));
        assert_eq!(output.status.code(), Some(1), "without CAP_{needed}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("CAP_{needed}")));
    }
}
