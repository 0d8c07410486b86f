//! The pods of this node from the API server: list, then watch from the
//! list's resourceVersion; re-list when the server says the version is
//! gone (410); reconnect with backoff after failures. HTTP/1.1 over
//! rustls (the service account's CA) with the service account's token,
//! re-read at every connection because the kubelet rotates it.

use std::{
    path::PathBuf,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    sync::watch,
};
use tracing::{debug, info, warn};

use super::{
    PodIndex,
    objects::{self, WatchEvent},
};
use crate::{labels::KubernetesConfig, stats::Stats};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// The server ends each watch after this; firn then watches again.
const WATCH_SECONDS: u64 = 300;
/// No byte at all for this long means the connection is dead.
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_SECONDS + 60);
const MAX_LIST_BYTES: usize = 256 << 20;
/// Longest watch event line (a pod object).
const MAX_EVENT_BYTES: usize = 4 << 20;
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

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
    #[error("could not connect to {address}")]
    Connect {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP to the API server failed")]
    Http {
        #[source]
        source: hyper::Error,
    },
    #[error("the API server answered {status}: {message}")]
    Status { status: StatusCode, message: String },
    #[error("the API server's answer is not usable")]
    Object {
        #[source]
        source: objects::ObjectError,
    },
    #[error("reading the API server's answer failed: {reason}")]
    Body { reason: String },
    #[error("timed out")]
    Timeout,
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
        let api = Api::new(config)?;
        let (stop, stopped) = watch::channel(false);
        thread::Builder::new()
            .name("firn-kubernetes".into())
            .spawn(move || {
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
                runtime.block_on(run(api, index, stats, stopped));
            })
            .map_err(|source| KubernetesError::Thread { source })?;
        Ok(Self { stop })
    }
}

/// How to reach the API server.
struct Api {
    host: String,
    port: u16,
    authority: String,
    tls: Option<Arc<ClientConfig>>,
    token_file: Option<PathBuf>,
    selector: String,
    node: String,
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

enum WatchEnd {
    /// The server closed the watch (its timeout); go on from here.
    Closed,
    /// The version is too old (410): list again.
    Expired,
}

impl Api {
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
        let authority = uri.authority().ok_or_else(bad)?.to_string();
        let host = uri
            .host()
            .ok_or_else(bad)?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
        let tls = secure
            .then(|| tls_config(config.ca_file.as_ref()))
            .transpose()?;
        let selector =
            utf8_percent_encode(&format!("spec.nodeName={}", config.node), NON_ALPHANUMERIC)
                .to_string();
        Ok(Self {
            host,
            port,
            authority,
            tls,
            token_file: config.token_file.clone(),
            selector,
            node: config.node.clone(),
        })
    }

    async fn get(&self, path: &str) -> Result<hyper::Response<Incoming>, KubernetesError> {
        let address = format!("{}:{}", self.host, self.port);
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address))
            .await
            .map_err(|_| KubernetesError::Timeout)?
            .map_err(|source| KubernetesError::Connect {
                address: address.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Io> = match &self.tls {
            Some(tls) => {
                let name =
                    ServerName::try_from(self.host.clone()).map_err(|_| KubernetesError::Url {
                        url: self.authority.clone(),
                    })?;
                let tls = tokio_rustls::TlsConnector::from(tls.clone());
                Box::new(
                    tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name, tcp))
                        .await
                        .map_err(|_| KubernetesError::Timeout)?
                        .map_err(|source| KubernetesError::Connect { address, source })?,
                )
            }
            None => Box::new(tcp),
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| KubernetesError::Http { source })?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, "Kubernetes API connection ended");
            }
        });
        let mut request = Request::get(path)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("firn/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(token) = self.token() {
            request = request.header(header::AUTHORIZATION, token);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|_| KubernetesError::Url {
                url: path.to_owned(),
            })?;
        sender
            .send_request(request)
            .await
            .map_err(|source| KubernetesError::Http { source })
    }

    /// `Bearer <token>`, marked sensitive so no HTTP layer prints it.
    fn token(&self) -> Option<HeaderValue> {
        let path = self.token_file.as_ref()?;
        let token = match crate::untrusted::read_host_text(path) {
            Ok(token) => token,
            Err(error) => {
                debug!(path = %path.display(), %error, "no service account token");
                return None;
            }
        };
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim())).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    async fn list(&self) -> Result<objects::PodList, KubernetesError> {
        // Version 0: served from the API server's cache rather than etcd,
        // which matters with one agent per node; the watch catches up.
        let path = format!(
            "/api/v1/pods?fieldSelector={}&resourceVersion=0",
            self.selector
        );
        let response = tokio::time::timeout(LIST_TIMEOUT, async {
            let response = self.get(&path).await?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_LIST_BYTES)
                .collect()
                .await
                .map_err(|error| KubernetesError::Body {
                    reason: error.to_string(),
                })?
                .to_bytes();
            Ok::<_, KubernetesError>((status, body))
        })
        .await
        .map_err(|_| KubernetesError::Timeout)??;
        let (status, body) = response;
        if !status.is_success() {
            return Err(status_error(status, &body));
        }
        objects::parse_pod_list(&body).map_err(|source| KubernetesError::Object { source })
    }

    /// Applies the watch's events to `index` until the server ends it.
    async fn watch(
        &self,
        resource_version: &mut String,
        index: &PodIndex,
        stats: &Stats,
    ) -> Result<WatchEnd, KubernetesError> {
        let path = format!(
            "/api/v1/pods?fieldSelector={}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&resourceVersion={}",
            self.selector,
            utf8_percent_encode(resource_version, NON_ALPHANUMERIC)
        );
        let response = tokio::time::timeout(CONNECT_TIMEOUT * 2, self.get(&path))
            .await
            .map_err(|_| KubernetesError::Timeout)??;
        let status = response.status();
        let mut body = response.into_body();
        if status == StatusCode::GONE {
            return Ok(WatchEnd::Expired);
        }
        if !status.is_success() {
            let body = Limited::new(body, 64 << 10)
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_default();
            return Err(status_error(status, &body));
        }
        let mut pending = BytesMut::new();
        loop {
            let frame = match tokio::time::timeout(WATCH_IDLE, body.frame()).await {
                Err(_) => return Err(KubernetesError::Timeout),
                Ok(None) => return Ok(WatchEnd::Closed),
                Ok(Some(frame)) => frame.map_err(|source| KubernetesError::Http { source })?,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line = pending.split_to(end + 1);
                if let Some(end) = self.event(&line, resource_version, index, stats) {
                    return Ok(end);
                }
            }
            if pending.len() > MAX_EVENT_BYTES {
                return Err(KubernetesError::Body {
                    reason: format!("a watch event longer than {MAX_EVENT_BYTES} bytes"),
                });
            }
        }
    }

    /// Applies one event line; `Some` when the watch must end.
    fn event(
        &self,
        line: &[u8],
        resource_version: &mut String,
        index: &PodIndex,
        stats: &Stats,
    ) -> Option<WatchEnd> {
        if line.trim_ascii().is_empty() {
            return None;
        }
        Stats::inc(&stats.kubernetes_watch_events);
        match objects::parse_event(line) {
            Ok(WatchEvent::Applied {
                pod,
                resource_version: version,
            }) => {
                // The selector should make this impossible; a pod of
                // another node must still not label this node's processes.
                if pod.node_name.is_empty() || pod.node_name == self.node {
                    debug!(namespace = pod.namespace, pod = pod.name, "pod updated");
                    if !index.apply(*pod) {
                        Stats::inc(&stats.kubernetes_pods_skipped);
                    }
                }
                *resource_version = version;
            }
            Ok(WatchEvent::Deleted {
                uid,
                resource_version: version,
            }) => {
                debug!(uid, "pod deleted");
                index.remove(&uid);
                *resource_version = version;
            }
            Ok(WatchEvent::Bookmark {
                resource_version: version,
            }) => *resource_version = version,
            Ok(WatchEvent::Error(status)) if status.code == 410 => return Some(WatchEnd::Expired),
            Ok(WatchEvent::Error(status)) => {
                Stats::inc(&stats.kubernetes_watch_errors);
                debug!(
                    code = status.code,
                    message = status.message,
                    "watch error event"
                );
                return Some(WatchEnd::Expired);
            }
            Err(error) => {
                Stats::inc(&stats.kubernetes_watch_errors);
                debug!(%error, "malformed watch event skipped");
            }
        }
        None
    }
}

fn status_error(status: StatusCode, body: &[u8]) -> KubernetesError {
    let message = objects::parse_status(body)
        .map(|s| s.message)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_owned());
    KubernetesError::Status { status, message }
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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| KubernetesError::Tls { source })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Exponential backoff with jitter.
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self {
            next: BACKOFF_START,
        }
    }

    fn reset(&mut self) {
        self.next = BACKOFF_START;
    }

    fn next(&mut self) -> Duration {
        let wait = self.next.mul_f64(0.5 + fastrand::f64() / 2.0);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }
}

/// Logs the first failure of a run of failures as a warning, the rest at
/// debug level, and the recovery once: an unreachable API server must not
/// flood the log.
struct Health {
    failing: bool,
}

impl Health {
    fn failed(&mut self, stats: &Stats, what: &str, error: &KubernetesError) {
        Stats::inc(&stats.kubernetes_watch_errors);
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

/// An error and its causes on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

async fn run(api: Api, index: Arc<PodIndex>, stats: Arc<Stats>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Backoff::new();
    let mut health = Health { failing: false };
    let mut resource_version: Option<String> = None;
    let mut first_list = true;
    loop {
        let round = async {
            let Some(version) = &mut resource_version else {
                match api.list().await {
                    Ok(list) => {
                        let skipped = index.replace_all(list.pods);
                        Stats::add(&stats.kubernetes_pods_skipped, skipped as u64);
                        Stats::add(&stats.kubernetes_watch_errors, list.malformed as u64);
                        let pods = index.len();
                        if first_list || health.failing {
                            info!(node = api.node, pods, "watching the pods of this node");
                        }
                        first_list = false;
                        health.failing = false;
                        backoff.reset();
                        resource_version = Some(list.resource_version);
                    }
                    Err(error) => {
                        health.failed(&stats, "listing the pods of this node", &error);
                        tokio::time::sleep(backoff.next()).await;
                    }
                }
                return;
            };
            let started = Instant::now();
            match api.watch(version, &index, &stats).await {
                Ok(WatchEnd::Expired) => {
                    debug!("the watch's resource version is gone; listing again");
                    resource_version = None;
                }
                Ok(WatchEnd::Closed) => {
                    // A server that ends watches at once must not be hammered.
                    if started.elapsed() < Duration::from_secs(1) {
                        tokio::time::sleep(backoff.next()).await;
                    } else {
                        backoff.reset();
                    }
                }
                Err(error) => {
                    health.failed(&stats, "watching the pods of this node", &error);
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        };
        tokio::select! {
            () = round => {}
            _ = stop.changed() => return,
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
        let api = Api::new(&config("https://10.96.0.1:443")).expect("in-cluster form");
        assert_eq!((api.host.as_str(), api.port), ("10.96.0.1", 443));
        assert!(api.tls.is_some(), "https means TLS, verified");
        assert_eq!(api.selector, "spec%2EnodeName%3Dnode%20a");
        let api = Api::new(&config("http://[::1]:8080")).expect("plain, IPv6");
        assert_eq!((api.host.as_str(), api.port), ("::1", 8080));
        assert!(api.tls.is_none());
        assert_eq!(
            Api::new(&config("https://k8s")).map(|a| a.port).ok(),
            Some(443)
        );
        for bad in ["k8s:443", "ftp://k8s", "", "https://"] {
            assert!(Api::new(&config(bad)).is_err(), "{bad}");
        }
        let mut with_ca = config("https://k8s");
        with_ca.ca_file = Some("/nonexistent/ca.crt".into());
        assert!(matches!(
            Api::new(&with_ca),
            Err(KubernetesError::CaFile { .. })
        ));
    }

    #[test]
    fn backoff_grows_to_its_cap() {
        let mut backoff = Backoff::new();
        let waits: Vec<Duration> = (0..10).map(|_| backoff.next()).collect();
        assert!(waits[0] <= BACKOFF_START);
        assert!(waits.iter().all(|w| *w <= BACKOFF_MAX));
        assert!(waits[9] >= BACKOFF_MAX / 2);
        backoff.reset();
        assert!(backoff.next() <= BACKOFF_START);
    }
}
