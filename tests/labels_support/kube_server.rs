//! A Kubernetes API server of the test's own: HTTPS with a certificate
//! from the test's CA, answering the pods list (`GET /api/v1/pods`) with
//! recorded Pod objects and the pods watch (`?watch=true`) with a chunked
//! stream of events the test sends. It keeps every request it saw.

#![allow(dead_code)]

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpListener,
    sync::broadcast,
};
use tokio_rustls::{TlsAcceptor, rustls};

/// One request as the server read it.
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub target: String,
    pub authorization: Option<String>,
}

impl SeenRequest {
    pub fn is_watch(&self) -> bool {
        self.target.contains("watch=true")
    }
}

#[derive(Default)]
struct State {
    /// The pods the list answers with (JSON objects).
    pods: Vec<String>,
    resource_version: u64,
    requests: Vec<SeenRequest>,
    /// TCP connections accepted, TLS handshake or not.
    connections: usize,
}

pub struct FakeApiServer {
    pub address: SocketAddr,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeApiServer {
    pub fn start(tls: rustls::ServerConfig, pods: Vec<String>) -> Self {
        let state = Arc::new(Mutex::new(State {
            pods,
            resource_version: 100,
            requests: Vec::new(),
            connections: 0,
        }));
        let (events, _) = broadcast::channel::<String>(64);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("binds a loopback port");
        let address = listener.local_addr().expect("bound");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let thread = {
            let state = state.clone();
            let events = events.clone();
            std::thread::spawn(move || {
                runtime.block_on(async move {
                    let serve = async {
                        loop {
                            let Ok((tcp, _)) = listener.accept().await else {
                                break;
                            };
                            let acceptor = acceptor.clone();
                            let state = state.clone();
                            state.lock().expect("lock").connections += 1;
                            let events = events.subscribe();
                            tokio::spawn(async move {
                                if let Ok(stream) = acceptor.accept(tcp).await {
                                    let _ = serve(stream, state, events).await;
                                }
                            });
                        }
                    };
                    tokio::select! {
                        () = serve => {}
                        _ = stopped => {}
                    }
                });
            })
        };
        Self {
            address,
            state,
            events,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.address.port())
    }

    pub fn connections(&self) -> usize {
        self.state.lock().expect("lock").connections
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state.lock().expect("lock").requests.clone()
    }

    /// Waits until `done` holds for the requests seen, at most `timeout`.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&[SeenRequest]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if done(&self.requests()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Sends a watch event (`ADDED`, `MODIFIED`, `DELETED`) for `pod` to
    /// every open watch, and updates what a new list answers.
    pub fn send(&self, kind: &str, uid: &str, pod: &str) {
        let version = {
            let mut state = self.state.lock().expect("lock");
            state.resource_version += 1;
            state.pods.retain(|p| !p.contains(uid));
            if kind != "DELETED" {
                state.pods.push(pod.to_owned());
            }
            state.resource_version
        };
        let pod = pod.replacen(
            "\"metadata\": {",
            &format!("\"metadata\": {{\"resourceVersion\": \"{version}\", "),
            1,
        );
        let _ = self
            .events
            .send(format!(r#"{{"type":"{kind}","object":{pod}}}"#));
    }

    /// An `ERROR` event with a `Status` of `code` (410: version too old).
    pub fn send_error(&self, code: u16) {
        let _ = self.events.send(format!(
            r#"{{"type":"ERROR","object":{{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":{code},"message":"too old resource version"}}}}"#
        ));
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    state: Arc<Mutex<State>>,
    mut events: broadcast::Receiver<String>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 || head.len() > 64 << 10 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.lines();
    let target = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or_default()
        .to_owned();
    let authorization = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("authorization"))
        .map(|(_, value)| value.trim().to_owned());
    let request = SeenRequest {
        target,
        authorization,
    };
    let watch = request.is_watch();
    let list = {
        let mut state = state.lock().expect("lock");
        state.requests.push(request);
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{}"}},"items":[{}]}}"#,
            state.resource_version,
            state.pods.join(",")
        )
    };
    if !watch {
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{list}",
            list.len()
        );
        stream.write_all(response.as_bytes()).await?;
        return stream.shutdown().await;
    }
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await?;
    stream.flush().await?;
    while let Ok(event) = events.recv().await {
        let line = format!("{event}\n");
        stream
            .write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())
            .await?;
        stream.flush().await?;
    }
    Ok(())
}
