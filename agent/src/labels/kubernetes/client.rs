//! The pods of this node from the API server, through kube's watcher:
//! list, then watch from the list's resourceVersion; list again when the
//! server says the version is gone (410); retry with kube's backoff after
//! failures. The HTTP stack under it is firn's own (`transport`).

use std::{path::PathBuf, sync::Arc, thread};

use agent_config::pod::{PodInfo, PodObject};
use http::Uri;
use kube::runtime::{
    WatchStreamExt,
    watcher::{self, Event},
};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, pem::PemObject},
};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tracing::{debug, info, warn};

use super::{MAX_PODS, PodIndex, transport};
use crate::{labels::KubernetesConfig, logging::error_chain, stats::Stats};

#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    #[error("`{url}` is not an http(s)://host[:port] address")]
    Url { url: String },
    #[error("could not read the CA file {path}")]
    CaFile {
        path: PathBuf,
        #[source]
        source: crate::untrusted::OpenError,
    },
    #[error("the CA file {path} holds no usable certificate")]
    NoCertificates { path: PathBuf },
    #[error("could not set up TLS")]
    Tls {
        #[source]
        source: rustls::Error,
    },
    #[error("could not start the Kubernetes watch thread")]
    Thread {
        #[source]
        source: std::io::Error,
    },
}

/// The watch thread; stops when dropped.
pub struct KubernetesWatcher {
    stop: watch::Sender<bool>,
}

impl Drop for KubernetesWatcher {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl KubernetesWatcher {
    /// Checks the address and CA, then starts watching on a thread of its
    /// own; `index` is kept current from then on.
    pub fn start(
        config: &KubernetesConfig,
        index: Arc<PodIndex>,
        stats: Arc<Stats>,
    ) -> Result<Self, KubernetesError> {
        let endpoint = Endpoint::new(config)?;
        let (stop, stopped) = watch::channel(false);
        thread::Builder::new()
            .name("firn-kubernetes".into())
            .spawn(move || {
                crate::stats::cpu::account_thread(crate::stats::cpu::CpuStage::Label);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        warn!(%error, "could not start the Kubernetes watch; no pod labels");
                        return;
                    }
                };
                runtime.block_on(run(endpoint, index, stats, stopped));
            })
            .map_err(|source| KubernetesError::Thread { source })?;
        Ok(Self { stop })
    }
}

/// How to reach the API server, and which pods to ask for.
struct Endpoint {
    /// Scheme and authority; a path in the configured address is ignored.
    base: Uri,
    /// For `https://`, trusting the configured CA. Plain `http://` (only
    /// when asked for) never reaches TLS, but the connector still wants a
    /// configuration: one that trusts nothing.
    tls: Arc<ClientConfig>,
    token_file: Option<PathBuf>,
    selector: String,
    node: String,
}

impl Endpoint {
    fn new(config: &KubernetesConfig) -> Result<Self, KubernetesError> {
        let bad = || KubernetesError::Url {
            url: config.api_server.clone(),
        };
        let uri: Uri = config.api_server.parse().map_err(|_| bad())?;
        let secure = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad()),
        };
        let authority = uri.authority().ok_or_else(bad)?;
        if authority.host().is_empty() {
            return Err(bad());
        }
        let base = Uri::builder()
            .scheme(uri.scheme_str().unwrap_or_default())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|_| bad())?;
        let tls = if secure {
            tls_config(config.ca_file.as_ref())?
        } else {
            client_config(RootCertStore::empty())?
        };
        Ok(Self {
            base,
            tls,
            token_file: config.token_file.clone(),
            selector: format!("spec.nodeName={}", config.node),
            node: config.node.clone(),
        })
    }
}

fn tls_config(ca_file: Option<&PathBuf>) -> Result<Arc<ClientConfig>, KubernetesError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        // The cluster's CA alone, as Kubernetes clients do.
        Some(path) => {
            let pem = crate::untrusted::read_host_file(path).map_err(|source| {
                KubernetesError::CaFile {
                    path: path.clone(),
                    source,
                }
            })?;
            for der in CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok) {
                roots
                    .add(der)
                    .map_err(|source| KubernetesError::Tls { source })?;
            }
            if roots.is_empty() {
                return Err(KubernetesError::NoCertificates { path: path.clone() });
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    client_config(roots)
}

fn client_config(roots: RootCertStore) -> Result<Arc<ClientConfig>, KubernetesError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| KubernetesError::Tls { source })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

async fn run(
    endpoint: Endpoint,
    index: Arc<PodIndex>,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) {
    let client = transport::client(
        endpoint.base,
        endpoint.tls,
        endpoint.token_file,
        stats.clone(),
    );
    let pods = kube::Api::<PodObject>::all(client);
    // Any version: lists are served from the API server's cache rather
    // than etcd, which matters with one agent per node; the watch catches
    // up from there.
    let config = watcher::Config::default()
        .fields(&endpoint.selector)
        .any_semantic();
    let events = watcher::watcher(pods, config).default_backoff();
    tokio::pin!(events);
    let mut sync = PodSync {
        node: endpoint.node,
        index,
        stats,
        listed: None,
        listed_skipped: 0,
        first_list: true,
        failing: false,
    };
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => sync.event(event),
                Some(Err(error)) => sync.error(&error),
                None => return,
            },
            _ = stop.changed() => return,
        }
    }
}

/// Applies the watcher's events to the pod index.
struct PodSync {
    node: String,
    index: Arc<PodIndex>,
    stats: Arc<Stats>,
    /// The pods of a list under way; they replace the index once it ends.
    listed: Option<Vec<PodInfo>>,
    /// Pods of that list beyond the index's bound.
    listed_skipped: usize,
    first_list: bool,
    /// The last list or watch failed: the next failure is not worth a
    /// warning, the recovery is worth a line.
    failing: bool,
}

impl PodSync {
    fn event(&mut self, event: Event<PodObject>) {
        match event {
            Event::Init => {
                self.listed = Some(Vec::new());
                self.listed_skipped = 0;
            }
            Event::InitApply(pod) => {
                let Some(pod) = self.pod(pod) else { return };
                match &mut self.listed {
                    Some(listed) if listed.len() < MAX_PODS => listed.push(pod),
                    _ => self.listed_skipped += 1,
                }
            }
            Event::InitDone => {
                let skipped = self
                    .index
                    .replace_all(self.listed.take().unwrap_or_default());
                let skipped = skipped + std::mem::take(&mut self.listed_skipped);
                Stats::add(&self.stats.kubernetes_pods_skipped, skipped as u64);
                if self.first_list || self.failing {
                    let pods = self.index.len();
                    info!(node = self.node, pods, "watching the pods of this node");
                }
                self.first_list = false;
                self.failing = false;
            }
            Event::Apply(pod) => {
                if let Some(pod) = self.pod(pod) {
                    debug!(namespace = pod.namespace, pod = pod.name, "pod updated");
                    if !self.index.apply(pod) {
                        Stats::inc(&self.stats.kubernetes_pods_skipped);
                    }
                }
                self.recovered();
            }
            Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid {
                    debug!(uid, "pod deleted");
                    self.index.remove(&uid);
                }
                self.recovered();
            }
        }
    }

    /// What firn keeps of a pod of this node; `None` (counted) for a pod
    /// it cannot use.
    fn pod(&self, pod: PodObject) -> Option<PodInfo> {
        let pod = match PodInfo::try_from(pod) {
            Ok(pod) => pod,
            Err(error) => {
                Stats::inc(&self.stats.kubernetes_watch_errors);
                debug!(%error, "unusable pod skipped");
                return None;
            }
        };
        // The selector should make this impossible; a pod of another node
        // must still not label this node's processes.
        (pod.node_name.is_empty() || pod.node_name == self.node).then_some(pod)
    }

    fn recovered(&mut self) {
        if self.failing {
            info!(node = self.node, "watching the pods of this node again");
            self.failing = false;
        }
    }

    /// Logs the first failure of a run of failures as a warning, the rest
    /// at debug level: an unreachable API server must not flood the log.
    /// The watcher itself goes on after its backoff.
    fn error(&mut self, error: &watcher::Error) {
        let what = match error {
            watcher::Error::WatchError(status) if status.code == 410 => {
                debug!("the watch's resource version is gone; listing again");
                return;
            }
            watcher::Error::WatchFailed(kube::Error::SerdeError(error)) => {
                Stats::inc(&self.stats.kubernetes_watch_errors);
                debug!(%error, "malformed watch event skipped");
                return;
            }
            watcher::Error::InitialListFailed(_) | watcher::Error::NoResourceVersion => {
                "listing the pods of this node"
            }
            watcher::Error::WatchStartFailed(_)
            | watcher::Error::WatchError(_)
            | watcher::Error::WatchFailed(_) => "watching the pods of this node",
        };
        Stats::inc(&self.stats.kubernetes_watch_errors);
        let error = error_chain(error);
        if self.failing {
            debug!(error, "{what} failed again; retrying");
        } else {
            warn!(
                error,
                "{what} failed; retrying with backoff (pod labels may be missing)"
            );
            self.failing = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> KubernetesConfig {
        KubernetesConfig {
            api_server: url.into(),
            token_file: None,
            ca_file: None,
            node: "node a".into(),
        }
    }

    #[test]
    fn api_server_addresses_are_checked() {
        let endpoint = Endpoint::new(&config("https://10.96.0.1:443")).expect("in-cluster form");
        assert_eq!(endpoint.base, "https://10.96.0.1:443/");
        assert_eq!(endpoint.selector, "spec.nodeName=node a");
        let endpoint = Endpoint::new(&config("http://[::1]:8080/ignored")).expect("plain, IPv6");
        assert_eq!(endpoint.base, "http://[::1]:8080/");
        assert_eq!(
            Endpoint::new(&config("https://k8s")).map(|e| e.base).ok(),
            Some(Uri::from_static("https://k8s/"))
        );
        for bad in ["k8s:443", "ftp://k8s", "", "https://"] {
            assert!(Endpoint::new(&config(bad)).is_err(), "{bad}");
        }
        // https means TLS verified against the CA, which must be readable;
        // plain http reads no CA.
        let mut with_ca = config("https://k8s");
        with_ca.ca_file = Some("/nonexistent/ca.crt".into());
        assert!(matches!(
            Endpoint::new(&with_ca),
            Err(KubernetesError::CaFile { .. })
        ));
        with_ca.api_server = "http://k8s".into();
        assert!(Endpoint::new(&with_ca).is_ok());
    }

    fn pod(uid: &str, node: &str) -> PodObject {
        serde_json::from_value(serde_json::json!({
            "metadata": {"uid": uid, "name": format!("pod-{uid}"), "namespace": "ns"},
            "spec": {"nodeName": node, "containers": [{"name": "app"}]},
        }))
        .expect("a Pod")
    }

    fn sync(stats: &Arc<Stats>) -> PodSync {
        PodSync {
            node: "node-a".into(),
            index: Arc::new(PodIndex::new()),
            stats: stats.clone(),
            listed: None,
            listed_skipped: 0,
            first_list: true,
            failing: false,
        }
    }

    #[test]
    fn a_list_replaces_the_index_and_watch_events_update_it() {
        let stats = Arc::new(Stats::default());
        let mut sync = sync(&stats);
        sync.index
            .apply(PodInfo::try_from(pod("stale", "node-a")).expect("pod"));
        sync.event(Event::Init);
        sync.event(Event::InitApply(pod("u1", "node-a")));
        sync.event(Event::InitApply(pod("elsewhere", "node-b")));
        sync.event(Event::InitApply(pod("", "node-a")));
        assert!(
            sync.index.lookup(Some("u1"), None).is_none(),
            "not before the list ends"
        );
        sync.event(Event::InitDone);
        assert_eq!(sync.index.len(), 1, "the stale pod is gone, u1 is in");
        assert!(sync.index.lookup(Some("u1"), None).is_some());
        sync.event(Event::Apply(pod("u2", "")));
        sync.event(Event::Apply(pod("elsewhere", "node-b")));
        assert_eq!(sync.index.len(), 2);
        sync.event(Event::Delete(pod("u1", "node-a")));
        assert!(
            sync.index.lookup(Some("u1"), None).is_none(),
            "deleted pods are forgotten"
        );
        let totals = stats.snapshot();
        assert_eq!(totals.kubernetes_watch_errors, 1, "the pod without a uid");
        assert_eq!(totals.kubernetes_pods_skipped, 0);
    }

    #[test]
    fn a_lost_watch_version_is_no_error_and_failures_are_counted() {
        let stats = Arc::new(Stats::default());
        let mut sync = sync(&stats);
        let gone =
            kube::core::Status::failure("too old resource version", "Expired").with_code(410);
        sync.error(&watcher::Error::WatchError(gone.boxed()));
        assert!(!sync.failing);
        assert_eq!(stats.snapshot().kubernetes_watch_errors, 0);
        sync.error(&watcher::Error::NoResourceVersion);
        sync.error(&watcher::Error::NoResourceVersion);
        assert!(sync.failing);
        assert_eq!(stats.snapshot().kubernetes_watch_errors, 2);
        sync.event(Event::Init);
        sync.event(Event::InitDone);
        assert!(!sync.failing, "a list that went through ends the failures");
    }
}
