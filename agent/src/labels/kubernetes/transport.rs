//! The HTTP stack under kube's client, built by firn rather than from a
//! kubeconfig so every file (token, CA) goes through firn's own readers:
//! HTTP/1.1 over rustls (ring) with the configured CA, the service
//! account's token re-read for every request because the kubelet rotates
//! it, time limits on connecting and answering, and bounded bodies — a
//! list is at most [`MAX_LIST_BYTES`], one watch event at most
//! [`MAX_EVENT_BYTES`] — since kube reads both without a limit.

use std::{
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header};
use http_body::{Body, Frame, SizeHint};
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use kube::client::{Body as KubeBody, middleware::BaseUriLayer};
use rustls::ClientConfig;
use tokio::time::Sleep;
use tower::{BoxError, Layer, Service, ServiceBuilder};
use tracing::debug;

use crate::{backoff::Backoff, stats::Stats};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// From sending a watch to its answer's headers (TLS handshake included).
const WATCH_START_TIMEOUT: Duration = Duration::from_secs(20);
/// A whole list, body included.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_LIST_BYTES: usize = 256 << 20;
/// Longest watch event line (a pod object).
const MAX_EVENT_BYTES: usize = 4 << 20;
/// A watch that ended sooner than this after it started was cut short.
const QUICK_WATCH: Duration = Duration::from_secs(1);
const PACING_FIRST: Duration = Duration::from_millis(500);
const PACING_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("the API server did not answer within {limit:?}")]
    Timeout { limit: Duration },
    #[error("the API server's answer is longer than {limit} bytes")]
    TooLong { limit: usize },
    #[error("a watch event longer than {limit} bytes")]
    EventTooLong { limit: usize },
}

/// A kube client for the API server at `base` (scheme and authority
/// only). Must be called inside a tokio runtime: the client spawns its
/// request queue there.
pub fn client(
    base: Uri,
    tls: Arc<ClientConfig>,
    token_file: Option<PathBuf>,
    stats: Arc<Stats>,
) -> kube::Client {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*tls).clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let http_client = HttpClient::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(BaseUriLayer::new(base))
        .layer(ApiRequestLayer {
            shared: Arc::new(Shared {
                token_file,
                stats,
                pacing: Mutex::new(WatchPacing::new()),
            }),
        })
        .service(http_client);
    kube::Client::new(service, "default")
}

#[derive(Clone)]
struct ApiRequestLayer {
    shared: Arc<Shared>,
}

impl<S> Layer<S> for ApiRequestLayer {
    type Service = ApiRequests<S>;

    fn layer(&self, inner: S) -> ApiRequests<S> {
        ApiRequests {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// What every copy of the service shares.
struct Shared {
    token_file: Option<PathBuf>,
    stats: Arc<Stats>,
    pacing: Mutex<WatchPacing>,
}

impl Shared {
    /// `Bearer <token>`, marked sensitive so no HTTP layer prints it.
    fn token(&self) -> Option<HeaderValue> {
        let path = self.token_file.as_deref()?;
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
}

/// Spaces out watches that end at once. kube starts the next watch as
/// soon as one ends without an error (its backoff is for errors), and a
/// server that closes every watch at once must not be hammered.
struct WatchPacing {
    backoff: Backoff,
    last_start: Option<Instant>,
}

impl WatchPacing {
    fn new() -> Self {
        Self {
            backoff: Backoff::new(PACING_FIRST, PACING_MAX),
            last_start: None,
        }
    }

    /// How long a watch about to start at `now` waits first.
    fn delay(&mut self, now: Instant) -> Duration {
        let quick = self
            .last_start
            .is_some_and(|last| now.saturating_duration_since(last) < QUICK_WATCH);
        let delay = if quick {
            self.backoff.wait()
        } else {
            self.backoff.reset(PACING_FIRST);
            Duration::ZERO
        };
        self.last_start = Some(now + delay);
        delay
    }
}

/// Adds firn's headers and the token to each request, paces watches, and
/// puts the time and size limits on each answer.
#[derive(Clone)]
struct ApiRequests<S> {
    inner: S,
    shared: Arc<Shared>,
}

type ResponseFuture<B> =
    Pin<Box<dyn Future<Output = Result<Response<BoundedBody<B>>, BoxError>> + Send>>;

impl<S, B> Service<Request<KubeBody>> for ApiRequests<S>
where
    S: Service<Request<KubeBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin,
{
    type Response = Response<BoundedBody<B>>;
    type Error = BoxError;
    type Future = ResponseFuture<B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<KubeBody>) -> Self::Future {
        let headers = request.headers_mut();
        headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("firn/", env!("CARGO_PKG_VERSION"))),
        );
        headers
            .entry(header::ACCEPT)
            .or_insert(HeaderValue::from_static("application/json"));
        if let Some(token) = self.shared.token() {
            request.headers_mut().insert(header::AUTHORIZATION, token);
        }
        let watch = is_watch(request.uri());
        let (limit, delay) = if watch {
            let mut pacing = self.shared.pacing.lock().unwrap_or_else(|e| e.into_inner());
            (WATCH_START_TIMEOUT, pacing.delay(Instant::now()))
        } else {
            (LIST_TIMEOUT, Duration::ZERO)
        };
        // The service polled ready goes with the request; a copy stays.
        let copy = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, copy);
        let stats = self.shared.stats.clone();
        Box::pin(async move {
            if !delay.is_zero() {
                debug!(?delay, "the last watch ended at once; waiting");
                tokio::time::sleep(delay).await;
            }
            let sleep = tokio::time::sleep(limit);
            let body_deadline = (!watch).then(|| Box::pin(tokio::time::sleep(limit)));
            let response = tokio::select! {
                response = inner.call(request) => response.map_err(Into::into)?,
                () = sleep => return Err(TransportError::Timeout { limit }.into()),
            };
            Ok(response.map(|inner| BoundedBody {
                inner,
                kind: match body_deadline {
                    Some(deadline) => BodyKind::Whole { read: 0, deadline },
                    None => BodyKind::Events {
                        line: 0,
                        has_text: false,
                        stats,
                    },
                },
            }))
        })
    }
}

fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|query| query.split('&').any(|pair| pair == "watch=true"))
}

/// An answer's body within its limits.
pub struct BoundedBody<B> {
    inner: B,
    kind: BodyKind,
}

enum BodyKind {
    /// A list: read whole, within its byte and time limits.
    Whole {
        read: usize,
        deadline: Pin<Box<Sleep>>,
    },
    /// A watch: one event a line, each counted, none too long.
    Events {
        line: usize,
        has_text: bool,
        stats: Arc<Stats>,
    },
}

impl BodyKind {
    fn check(&mut self, data: &[u8]) -> Result<(), TransportError> {
        match self {
            Self::Whole { read, .. } => {
                *read += data.len();
                if *read > MAX_LIST_BYTES {
                    return Err(TransportError::TooLong {
                        limit: MAX_LIST_BYTES,
                    });
                }
            }
            Self::Events {
                line,
                has_text,
                stats,
            } => {
                for &byte in data {
                    if byte == b'\n' {
                        if *has_text {
                            Stats::inc(&stats.kubernetes_watch_events);
                        }
                        (*line, *has_text) = (0, false);
                    } else {
                        *line += 1;
                        *has_text |= !byte.is_ascii_whitespace();
                    }
                }
                if *line > MAX_EVENT_BYTES {
                    return Err(TransportError::EventTooLong {
                        limit: MAX_EVENT_BYTES,
                    });
                }
            }
        }
        Ok(())
    }
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let BodyKind::Whole { deadline, .. } = &mut this.kind
            && deadline.as_mut().poll(cx).is_ready()
        {
            let limit = LIST_TIMEOUT;
            return Poll::Ready(Some(Err(TransportError::Timeout { limit }.into())));
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref()
            && let Err(error) = this.kind.check(data)
        {
            return Poll::Ready(Some(Err(error.into())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_requests_are_told_from_lists() {
        let uri = |s: &str| s.parse::<Uri>().expect("a uri");
        assert!(is_watch(&uri(
            "/api/v1/pods?&watch=true&allowWatchBookmarks=true"
        )));
        assert!(!is_watch(&uri("/api/v1/pods?allowWatchBookmarks=true")));
        assert!(!is_watch(&uri("/api/v1/pods")));
    }

    #[test]
    fn watches_cut_short_are_spaced_out() {
        let mut pacing = WatchPacing::new();
        let start = Instant::now();
        assert_eq!(pacing.delay(start), Duration::ZERO, "the first watch");
        let first = pacing.delay(start + Duration::from_millis(10));
        assert!(first > Duration::ZERO && first <= PACING_FIRST);
        let later = start + Duration::from_millis(10) + first;
        assert!(pacing.delay(later) > first / 2, "growing");
        let long_after = later + Duration::from_secs(300);
        assert_eq!(
            pacing.delay(long_after),
            Duration::ZERO,
            "a watch that lasted"
        );
    }

    #[test]
    fn watch_events_are_counted_and_bounded() {
        let stats = Arc::new(Stats::default());
        let mut events = BodyKind::Events {
            line: 0,
            has_text: false,
            stats: stats.clone(),
        };
        events
            .check(b"{\"type\":\"ADDED\"}\n\n{\"ty")
            .expect("short lines");
        events
            .check(b"pe\":\"DELETED\"}\n  \n")
            .expect("short lines");
        assert_eq!(stats.snapshot().kubernetes_watch_events, 2);
        let long = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert!(matches!(
            events.check(&long),
            Err(TransportError::EventTooLong { .. })
        ));
    }
}
