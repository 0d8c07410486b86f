//! End to end: Kubernetes pod labels. The pods come from an API server of
//! the test's own (HTTPS, the test's CA, recorded Pod objects, a watch
//! stream the test drives); the processes sit in real cgroups named as
//! the kubelet names them.

mod common;
mod labels_support;
mod parca_support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use agent_pprof::proto::Profile;
use common::*;
use labels_support::{
    kube_server::{FakeApiServer, SeenRequest},
    *,
};
use parca_support::{
    harness::{Agent, log_field},
    tls_server::Authority,
};

const MINUTE: Duration = Duration::from_secs(60);

/// A Pod object as the API server sends it.
fn pod_json(
    uid: &str,
    namespace: &str,
    name: &str,
    container: &str,
    container_id: &str,
    labels: &str,
) -> String {
    format!(
        r#"{{"kind": "Pod", "apiVersion": "v1", "metadata": {{"name": "{name}", "namespace": "{namespace}", "uid": "{uid}", "labels": {labels}, "annotations": {{"team.example.com/owner": "payments"}}, "ownerReferences": [{{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "{namespace}-rs", "uid": "1", "controller": true}}]}}, "spec": {{"nodeName": "firn-k8s-node", "containers": [{{"name": "{container}", "image": "example/{container}:1"}}]}}, "status": {{"phase": "Running", "podIP": "10.0.0.7", "containerStatuses": [{{"name": "{container}", "ready": true, "image": "example/{container}:1", "containerID": "containerd://{container_id}"}}]}}}}"#
    )
}

/// The first profile the local store wrote for an interval that began at
/// or after `since`.
fn profile_since(store: &Path, since: SystemTime, agent: &Agent) -> Profile {
    let since_ms = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while std::time::Instant::now() < deadline {
        let mut found: Vec<(u128, PathBuf)> = std::fs::read_dir(store)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let ms = name.strip_prefix("profile-")?.strip_suffix(".pb.gz")?;
                Some((ms.parse().ok()?, entry.path()))
            })
            .filter(|(ms, _)| *ms >= since_ms)
            .collect();
        found.sort();
        if let Some((_, path)) = found.first() {
            let bytes = std::fs::read(path).expect("profile");
            return agent_pprof::decode(&bytes).expect("pprof");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "no profile for an interval after {since:?}:\n{}",
        agent.log()
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one pod's life step by step against one fake API server: listed and watched, labelled, deleted and forgotten, then a lost watch (410) and the relist"
)]
fn kubernetes_pods_label_their_containers_until_deleted() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let h = hierarchies();
    let (uid_a, uid_b) = (pod_uid(), pod_uid());
    let (id_a, id_b) = (random_hex(64), random_hex(64));
    let cgroups = TestCgroups(vec![
        TestCgroup::create(
            &h.unified,
            &format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id_a}.scope",
                uid_a.replace('-', "_")
            ),
        ),
        TestCgroup::create(&h.cpu, &format!("kubepods/besteffort/pod{uid_b}/{id_b}")),
    ]);
    let a = start_chain(dir.path(), &FP_FLAGS);
    let b = start_chain(dir.path(), &FP_FLAGS);
    cgroups.0[0].add(a.pid());
    cgroups.0[1].add(b.pid());
    let pod_a = pod_json(
        &uid_a,
        "shop",
        "checkout-5f7d8-x2x4z",
        "server",
        &id_a,
        r#"{"app": "checkout", "app.kubernetes.io/part-of": "storefront"}"#,
    );
    let pod_b = pod_json(
        &uid_b,
        "batch",
        "report-28391-kq2lp",
        "worker",
        &id_b,
        r#"{"app": "report"}"#,
    )
    .replace(
        r#""team.example.com/owner": "payments""#,
        r#""team.example.com/owner": "payments", "pyroscope.io/service_name": "batch-reports""#,
    );
    let authority = Authority::new(dir.path(), "kube-ca");
    let server = FakeApiServer::start(authority.https_config(), vec![pod_a.clone(), pod_b]);
    let token = dir.path().join("token");
    std::fs::write(&token, "firn-test-token\n").expect("token file");
    let config = dir.path().join("firn.yaml");
    std::fs::write(
        &config,
        "relabel_configs:\n\
         - action: labelmap\n  regex: __meta_kubernetes_pod_label_(.+)\n\
         - source_labels: [__meta_kubernetes_pod_annotation_team_example_com_owner]\n  target_label: owner\n",
    )
    .expect("config file");
    let store = dir.path().join("profiles");
    let (pid_a, pid_b) = (a.pid().to_string(), b.pid().to_string());
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--kubernetes-api-server",
            &server.url(),
            "--kubernetes-ca-file",
            authority.pem_path.to_str().expect("utf-8"),
            "--kubernetes-token-file",
            token.to_str().expect("utf-8"),
            "--node",
            "firn-k8s-node",
            "--config-path",
            config.to_str().expect("utf-8"),
            "--profiling-duration",
            "2s",
            "--local-store-directory",
            store.to_str().expect("utf-8"),
            "--pid",
            &pid_a,
            "--pid",
            &pid_b,
        ],
        &[],
    );
    assert!(
        server.wait_for(MINUTE, |requests| requests.iter().any(|r| r.is_watch())),
        "firn never watched the pods:\n{}",
        agent.log()
    );

    let profile = profile_since(&store, SystemTime::now(), &agent);
    let (labels, samples) = labels_of(&profile, a.pid());
    assert!(
        samples > 0,
        "no samples of the pod's process:\n{}",
        agent.log()
    );
    let get = |labels: &BTreeMap<String, String>, name: &str| labels.get(name).cloned();
    for (name, value) in [
        ("namespace", "shop"),
        ("pod", "checkout-5f7d8-x2x4z"),
        ("container", "server"),
        ("container_id", id_a.as_str()),
        ("app", "checkout"),
        ("app_kubernetes_io_part_of", "storefront"),
        ("owner", "payments"),
        ("service_name", "shop/server"),
    ] {
        assert_eq!(get(&labels, name).as_deref(), Some(value), "{labels:?}");
    }
    let (labels, _) = labels_of(&profile, b.pid());
    for (name, value) in [
        ("namespace", "batch"),
        ("pod", "report-28391-kq2lp"),
        ("container", "worker"),
        ("app", "report"),
        ("service_name", "batch-reports"),
    ] {
        assert_eq!(get(&labels, name).as_deref(), Some(value), "{labels:?}");
    }

    // The pod is deleted: its process keeps its container id, not the pod.
    server.send("DELETED", &uid_a, &pod_a);
    let profile = profile_since(&store, SystemTime::now(), &agent);
    let (labels, samples) = labels_of(&profile, a.pid());
    assert!(samples > 0);
    for name in ["namespace", "pod", "container", "app", "owner"] {
        assert_eq!(
            get(&labels, name),
            None,
            "{name} after deletion: {labels:?}"
        );
    }
    assert_eq!(get(&labels, "container_id").as_deref(), Some(id_a.as_str()));
    assert_eq!(get(&labels, "service_name").as_deref(), Some("chain"));
    let (labels, _) = labels_of(&profile, b.pid());
    assert_eq!(get(&labels, "pod").as_deref(), Some("report-28391-kq2lp"));

    // The version is gone (410): firn lists again and watches from there.
    server.send_error(410);
    let relisted = |requests: &[SeenRequest]| {
        requests.iter().filter(|r| !r.is_watch()).count() >= 2
            && requests.iter().filter(|r| r.is_watch()).count() >= 2
    };
    assert!(
        server.wait_for(MINUTE, relisted),
        "no list and watch after a 410:\n{:#?}\n{}",
        server.requests(),
        agent.log()
    );
    let profile = profile_since(&store, SystemTime::now(), &agent);
    assert_eq!(get(&labels_of(&profile, a.pid()).0, "pod"), None);
    assert_eq!(
        get(&labels_of(&profile, b.pid()).0, "namespace").as_deref(),
        Some("batch")
    );

    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
    assert!(
        !stopped.log.contains("firn-test-token"),
        "the token is never logged"
    );
    let requests = server.requests();
    for request in &requests {
        assert_eq!(
            request.authorization.as_deref(),
            Some("Bearer firn-test-token"),
            "{request:?}"
        );
        let target = percent_encoding::percent_decode_str(&request.target).decode_utf8_lossy();
        assert!(
            target.starts_with("/api/v1/pods?")
                && target.contains("fieldSelector=spec.nodeName=firn-k8s-node"),
            "{target}"
        );
    }
    let first_watch = requests.iter().find(|r| r.is_watch()).expect("a watch");
    assert!(
        first_watch.target.contains("resourceVersion=100"),
        "the watch starts at the list's version: {first_watch:?}"
    );
    drop((a, b));
}

#[test]
fn an_api_server_whose_certificate_is_not_trusted_gets_no_token() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let served = Authority::new(dir.path(), "served-ca");
    let trusted = Authority::new(dir.path(), "other-ca");
    let server = FakeApiServer::start(served.https_config(), Vec::new());
    let token = dir.path().join("token");
    std::fs::write(&token, "never-sent-token").expect("token file");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--kubernetes-api-server",
            &server.url(),
            "--kubernetes-ca-file",
            trusted.pem_path.to_str().expect("utf-8"),
            "--kubernetes-token-file",
            token.to_str().expect("utf-8"),
            "--profiling-duration",
            "1s",
            "--local-store-directory",
            dir.path().join("profiles").to_str().expect("utf-8"),
            "--pid",
            "1",
        ],
        &[],
    );
    // Three attempts (the first, then two retries after backoff).
    let deadline = std::time::Instant::now() + MINUTE;
    while server.connections() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
    assert!(
        server.connections() >= 3,
        "firn did not retry:\n{}",
        stopped.log
    );
    assert!(
        server.requests().is_empty(),
        "a request reached an unverified server: {:?}",
        server.requests()
    );
    let warnings: Vec<&str> = stopped
        .log
        .lines()
        .filter(|line| line.contains("level=warn") && line.contains("pods of this node"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning, not one per retry:\n{}",
        stopped.log
    );
    assert!(
        warnings[0].contains("certificate") || warnings[0].contains("UnknownIssuer"),
        "the warning names the certificate problem: {}",
        warnings[0]
    );
    assert!(
        log_field(
            &stopped.log,
            "firn agent stopped",
            "kubernetes_watch_errors"
        )
        .unwrap_or(0)
            >= 3
    );
}
