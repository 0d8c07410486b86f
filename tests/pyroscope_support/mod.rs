//! A real Pyroscope server (v1.19.3, built by `cargo xtask setup`), its
//! query API over the Connect protocol, and a basic auth proxy in front of
//! it (Pyroscope itself does not check credentials; Grafana Cloud's
//! gateway does).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use agent_pprof::proto::Profile;
use prost::Message;

pub const CPU_TYPE: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
pub const SAMPLES_TYPE: &str = "process_cpu:samples:count:cpu:nanoseconds";

pub fn pyroscope_binary() -> PathBuf {
    let path = std::env::var_os("FIRN_PYROSCOPE_BIN").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/firn/pyroscope-v1.19.3/bin/pyroscope")
        },
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "the Pyroscope server v1.19.3 is not installed at {}: run `cargo xtask setup` \
         (or `cargo xtask test`), which builds it with Go from its source",
        path.display()
    );
    path
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("bound").port()
}

/// Pyroscope with every component in one process and local disk; killed
/// when dropped.
pub struct PyroscopeServer {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl PyroscopeServer {
    pub fn start(dir: &Path, multitenancy: bool) -> Self {
        std::fs::create_dir_all(dir).expect("pyroscope directory");
        let port = free_port();
        let log = dir.join("pyroscope.log");
        let child = Command::new(pyroscope_binary())
            .current_dir(dir)
            .arg(format!("-server.http-listen-port={port}"))
            .arg(format!("-server.grpc-listen-port={}", free_port()))
            // Its components find each other at the address it advertises
            // (the host's), so the listeners keep their default address.
            .arg(format!("-memberlist.bind-port={}", free_port()))
            .arg("-storage.backend=filesystem")
            .arg(format!(
                "-storage.filesystem.dir={}",
                dir.join("data").display()
            ))
            .arg("-self-profiling.disable-push=true")
            .arg(format!("-auth.multitenancy-enabled={multitenancy}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("pyroscope log"))
            .spawn()
            .expect("the Pyroscope server starts");
        let mut server = Self { child, port, log };
        server.wait_until_ready();
        server
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the Pyroscope server exited ({status}):\n{}", self.log());
            }
            if let Ok((200, _)) = http(self.port, "GET", "/ready", &[], b"") {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("Pyroscope was not ready within 120 s:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn call(
        &self,
        tenant: Option<&str>,
        method: &str,
        json: &serde_json::Value,
    ) -> serde_json::Value {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(tenant) = tenant {
            headers.push(("x-scope-orgid", tenant));
        }
        let path = format!("/querier.v1.QuerierService/{method}");
        let (status, body) = http(
            self.port,
            "POST",
            &path,
            &headers,
            json.to_string().as_bytes(),
        )
        .unwrap_or_else(|error| panic!("{method}: {error}"));
        assert_eq!(status, 200, "{method}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).expect("JSON answer")
    }

    /// Values of `label` over the window, for `tenant`.
    pub fn label_values(
        &self,
        tenant: Option<&str>,
        label: &str,
        start: SystemTime,
        end: SystemTime,
    ) -> Vec<String> {
        let answer = self.call(
            tenant,
            "LabelValues",
            &serde_json::json!({"name": label, "start": millis(start), "end": millis(end)}),
        );
        strings(&answer["names"])
    }

    pub fn profile_types(
        &self,
        tenant: Option<&str>,
        start: SystemTime,
        end: SystemTime,
    ) -> Vec<String> {
        let answer = self.call(
            tenant,
            "ProfileTypes",
            &serde_json::json!({"start": millis(start), "end": millis(end)}),
        );
        answer["profileTypes"]
            .as_array()
            .map(|types| {
                types
                    .iter()
                    .filter_map(|t| t["ID"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The merged profile of `selector` (`{pid="42"}`), as pprof
    /// (Pyroscope's `google.v1.Profile` is pprof's message).
    pub fn merged(
        &self,
        tenant: Option<&str>,
        profile_type: &str,
        selector: &str,
        start: SystemTime,
        end: SystemTime,
    ) -> Result<Profile, String> {
        let request = SelectMergeProfileRequest {
            profile_type_id: profile_type.to_owned(),
            label_selector: selector.to_owned(),
            start: millis(start),
            end: millis(end),
        };
        let mut headers = vec![("content-type", "application/proto")];
        if let Some(tenant) = tenant {
            headers.push(("x-scope-orgid", tenant));
        }
        let (status, body) = http(
            self.port,
            "POST",
            "/querier.v1.QuerierService/SelectMergeProfile",
            &headers,
            &request.encode_to_vec(),
        )
        .map_err(|error| error.to_string())?;
        if status != 200 {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        agent_pprof::decode(&body).map_err(|error| error.to_string())
    }
}

impl Drop for PyroscopeServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct SelectMergeProfileRequest {
    #[prost(string, tag = "1")]
    profile_type_id: String,
    #[prost(string, tag = "2")]
    label_selector: String,
    #[prost(int64, tag = "3")]
    start: i64,
    #[prost(int64, tag = "4")]
    end: i64,
}

fn millis(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .map(|values| {
            values
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One HTTP/1.1 request on its own connection: the status and the body
/// (chunked answers joined).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of the answer's head"))?;
    let head = String::from_utf8_lossy(&response[..split]).to_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let mut body = response[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = unchunk(&body);
    }
    Ok((status, body))
}

fn unchunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&data[..end])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = end + 2;
        out.extend_from_slice(&data[start..(start + size).min(data.len())]);
        data = &data[(start + size + 2).min(data.len())..];
    }
    out
}

/// A proxy that checks `Authorization: Basic` before it passes a
/// connection on to the server, as Grafana Cloud's gateway does; wrong or
/// missing credentials get 401. Stops when dropped.
pub struct AuthProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
    pub refused: Arc<AtomicU64>,
    pub passed: Arc<AtomicU64>,
}

impl AuthProxy {
    /// Plain HTTP, or HTTPS with `tls`.
    pub fn start(
        upstream: u16,
        user: &str,
        password: &str,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        use base64::Engine as _;
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("bound").port();
        let expected = format!(
            "authorization: basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
        .to_lowercase();
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let passed = Arc::new(AtomicU64::new(0));
        {
            let (stop, refused, passed) = (stop.clone(), refused.clone(), passed.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((client, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let _ = client.set_nonblocking(false);
                    let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
                    let expected = expected.clone();
                    let (refused, passed) = (refused.clone(), passed.clone());
                    let tls = tls.clone();
                    std::thread::spawn(move || match tls {
                        Some(config) => {
                            let Ok(connection) = rustls::ServerConnection::new(config) else {
                                return;
                            };
                            let stream = rustls::StreamOwned::new(connection, client);
                            serve(stream, upstream, &expected, &refused, &passed);
                        }
                        None => serve(client, upstream, &expected, &refused, &passed),
                    });
                }
            });
        }
        Self {
            port,
            stop,
            refused,
            passed,
        }
    }
}

impl Drop for AuthProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Each request on the connection is checked: its head is read, then its
/// body by Content-Length, and only a request with the right credentials
/// goes upstream (one upstream connection per request, `Connection:
/// close` there, so the answers stay in step).
fn serve(
    mut client: impl Read + Write,
    upstream: u16,
    expected: &str,
    refused: &AtomicU64,
    passed: &AtomicU64,
) {
    let mut buffer = Vec::new();
    loop {
        let Some((head, body)) = read_request(&mut client, &mut buffer) else {
            return;
        };
        let lower = head.to_lowercase();
        if !lower.lines().any(|line| line.trim() == expected) {
            refused.fetch_add(1, Ordering::Relaxed);
            let _ = client.write_all(
                b"HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nUnauthorized\n",
            );
            let _ = client.flush();
            continue;
        }
        passed.fetch_add(1, Ordering::Relaxed);
        let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
            return;
        };
        let head: String = head
            .lines()
            .filter(|line| !line.to_lowercase().starts_with("connection:"))
            .map(|line| format!("{line}\r\n"))
            .collect();
        let _ = server.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes());
        let _ = server.write_all(&body);
        let mut answer = Vec::new();
        let _ = server.read_to_end(&mut answer);
        // The client keeps its connection when the answer has a length;
        // without one, its end is the end of the connection.
        if client.write_all(&answer).is_err() || client.flush().is_err() {
            return;
        }
        if !String::from_utf8_lossy(&answer)
            .to_lowercase()
            .contains("content-length:")
        {
            return;
        }
    }
}

fn read_request(client: &mut impl Read, buffer: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut chunk = [0u8; 16 << 10];
    let end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let read = client.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())
                .flatten()
        })
        .unwrap_or(0);
    let start = end + 4;
    while buffer.len() < start + length {
        let read = client.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buffer.extend_from_slice(&chunk[..read]);
    }
    let body = buffer[start..start + length].to_vec();
    buffer.drain(..start + length);
    Some((head, body))
}
