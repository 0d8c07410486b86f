//! The HTTP endpoint operators and orchestrators watch (`--http-address`):
//! `/metrics` (OpenMetrics text), `/healthy` (the process answers) and
//! `/ready` (the BPF programs are attached on every CPU). It runs on a
//! thread and runtime of its own, so a slow scraper or a flood of
//! connections never holds up sampling; connections are bounded in number
//! and lifetime.

use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};

use crate::metrics::{self, Metrics};

/// Connections served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 32;
/// A client must send its request headers within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection (keep-alive included) stays open.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Whether the agent is ready: set once sampling runs on every CPU,
/// cleared when it stops or while a stage makes no progress; healthy
/// unless a stage has made none for long (see `watchdog`).
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    stalled: Mutex<Vec<&'static str>>,
    failing: AtomicBool,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The stages making no progress; `failing` when one has made none
    /// for so long that the process should be restarted.
    pub fn set_stalled(&self, stages: Vec<&'static str>, failing: bool) {
        *self.stalled.lock().unwrap_or_else(|p| p.into_inner()) = stages;
        self.failing.store(failing, Ordering::Relaxed);
    }

    pub fn stalled_stages(&self) -> Vec<&'static str> {
        self.stalled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && self.stalled_stages().is_empty()
    }

    pub fn is_healthy(&self) -> bool {
        !self.failing.load(Ordering::Relaxed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("could not listen on {address} (--http-address)")]
    Bind {
        address: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("could not start the HTTP server thread")]
    Thread {
        #[source]
        source: io::Error,
    },
}

/// The running server; dropping it stops it.
pub struct HttpServer {
    address: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<thread::JoinHandle<()>>,
}

struct State {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl HttpServer {
    /// Binds now, so a taken or forbidden address stops firn at start.
    pub fn start(
        address: SocketAddr,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Result<Self, HttpError> {
        let bind_error = |source| HttpError::Bind { address, source };
        let listener = std::net::TcpListener::bind(address).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        let (stop, stopped) = watch::channel(false);
        let state = Arc::new(State { metrics, health });
        let thread = thread::Builder::new()
            .name("firn-http".into())
            .spawn(move || {
                crate::stats::cpu::account_thread(crate::stats::cpu::CpuStage::Http);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        warn!(%error, "could not start the HTTP server's runtime: no /metrics");
                        return;
                    }
                };
                runtime.block_on(serve(listener, state, stopped));
            })
            .map_err(|source| HttpError::Thread { source })?;
        Ok(Self {
            address: local,
            stop,
            thread: Some(thread),
        })
    }

    /// The address actually bound (a port of 0 picks a free one).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<State>,
    mut stopped: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            warn!(%error, "the HTTP server could not use its socket: no /metrics");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, most likely: wait rather
                    // than spin.
                    debug!(%error, "could not accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!("HTTP connection refused: too many open");
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = respond(&state, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(error)) = tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                debug!(%error, "HTTP connection ended with an error");
            }
            drop(slot);
        });
    }
}

fn respond(state: &State, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    match request.uri().path() {
        "/metrics" => match state.metrics.encode() {
            Ok(body) => Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, metrics::CONTENT_TYPE)
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "")),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not encode the metrics\n",
            ),
        },
        "/healthy" if state.health.is_healthy() => text(StatusCode::OK, "ok\n"),
        "/healthy" => stalled(&state.health, "not healthy"),
        "/ready" if state.health.is_ready() => text(StatusCode::OK, "ready\n"),
        "/ready" if !state.health.stalled_stages().is_empty() => {
            stalled(&state.health, "not ready")
        }
        "/ready" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the BPF programs are not attached\n",
        ),
        "/" => text(StatusCode::OK, "firn: /metrics /healthy /ready\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics /healthy /ready\n",
        ),
    }
}

/// 503 naming the stages that make no progress.
fn stalled(health: &Health, verdict: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "{verdict}: no progress in {}\n",
        health.stalled_stages().join(", ")
    );
    let mut response = text(StatusCode::SERVICE_UNAVAILABLE, "");
    *response.body_mut() = Full::new(Bytes::from(body));
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::stats::Stats;

    fn get(address: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = std::net::TcpStream::connect(address).expect("connects");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: firn\r\nConnection: close\r\n\r\n"
        )
        .expect("sends");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("reads");
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .expect("a status line");
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    #[test]
    fn endpoints_answer_and_readiness_follows_the_flag() {
        let stats = Arc::new(Stats::default());
        Stats::add(&stats.samples_received, 5);
        let health = Arc::new(Health::default());
        let server = HttpServer::start(
            "127.0.0.1:0".parse().expect("address"),
            Arc::new(Metrics::new(stats)),
            health.clone(),
        )
        .expect("binds");
        let address = server.local_addr();
        assert_eq!(get(address, "/healthy").0, 200);
        assert_eq!(get(address, "/ready").0, 503);
        health.set_ready(true);
        assert_eq!(get(address, "/ready").0, 200);
        let (status, body) = get(address, "/metrics");
        assert_eq!(status, 200);
        assert!(body.contains("firn_samples_total 5"), "{body}");
        assert_eq!(get(address, "/nothing").0, 404);

        // A second server on the same address is refused by name.
        let error = HttpServer::start(address, Arc::new(Metrics::new(Arc::default())), health)
            .err()
            .expect("the address is taken");
        assert!(error.to_string().contains(&address.to_string()), "{error}");
        drop(server);
        assert!(std::net::TcpStream::connect(address).is_err(), "stopped");
    }
}
