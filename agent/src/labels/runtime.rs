//! Docker and Podman metadata: a container's name and labels from the
//! runtime's API socket (`GET /containers/{id}/json`, which Podman serves
//! in Docker's form too), as `__meta_docker_*` labels like Grafana Alloy's
//! `discovery.docker` gives `pyroscope.ebpf`. A socket that is not there is
//! not looked at; one that does not answer costs a second per container
//! per [`REFRESH`] at most, since answers (and their absence) are cached.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    num::NonZeroUsize,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use lru::LruCache;
use tracing::debug;

use super::{ContainerRuntime, relabel::sanitize_name};

/// Where Docker and rootful Podman serve their API.
pub const DEFAULT_SOCKETS: [&str; 2] = ["/run/docker.sock", "/run/podman/podman.sock"];

/// How long an answer is kept before the runtime is asked again (a
/// container's labels do not change; a new container gets a new id).
pub const REFRESH: Duration = Duration::from_secs(300);
const IO_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_ANSWER_BYTES: u64 = 1 << 20;
const CACHED_CONTAINERS: usize = 4096;

/// What the runtime says of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// As the API writes it, with its leading `/`.
    pub name: String,
    pub image: String,
    pub labels: BTreeMap<String, String>,
}

impl RuntimeContainer {
    /// The `__meta_docker_*` labels, as `discovery.docker` names them.
    pub fn meta_labels(&self, id: &str) -> Vec<(String, String)> {
        let mut labels = vec![
            ("__meta_docker_container_id".to_owned(), id.to_owned()),
            ("__meta_docker_container_name".to_owned(), self.name.clone()),
            (
                "__meta_docker_container_image".to_owned(),
                self.image.clone(),
            ),
        ];
        for (name, value) in &self.labels {
            labels.push((
                format!("__meta_docker_container_label_{}", sanitize_name(name)),
                value.clone(),
            ));
        }
        labels
    }
}

type Cached = (Instant, Option<RuntimeContainer>);

/// The runtimes' sockets and what they answered, bounded.
pub struct RuntimeClient {
    sockets: Vec<PathBuf>,
    cache: Mutex<LruCache<String, Cached>>,
}

impl RuntimeClient {
    /// `sockets` in the order they are asked (Docker's, Podman's).
    pub fn new(sockets: Vec<PathBuf>) -> Self {
        Self {
            sockets,
            cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(CACHED_CONTAINERS).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// The container `id` as its runtime describes it; `None` when no
    /// socket is there or none knows it. Only Docker and Podman serve this
    /// API; containers of other runtimes are not looked up.
    pub fn lookup(&self, id: &str, runtime: Option<ContainerRuntime>) -> Option<RuntimeContainer> {
        if matches!(
            runtime,
            Some(ContainerRuntime::Containerd | ContainerRuntime::CriO)
        ) {
            return None;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((when, known)) = cache.get(id)
            && when.elapsed() < REFRESH
        {
            return known.clone();
        }
        let sockets: Vec<&PathBuf> = self.sockets.iter().filter(|s| s.exists()).collect();
        if sockets.is_empty() {
            return None;
        }
        let found = sockets
            .into_iter()
            .find_map(|socket| match inspect(socket, id) {
                Ok(found) => found,
                Err(error) => {
                    debug!(socket = %socket.display(), %error, "the container runtime did not answer");
                    None
                }
            });
        cache.put(id.to_owned(), (Instant::now(), found.clone()));
        found
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("could not talk to the socket")]
    Io(#[from] std::io::Error),
    #[error("the answer is not HTTP")]
    NotHttp,
    #[error("HTTP {status}")]
    Status { status: u16 },
    #[error("the answer is not a container")]
    Json(#[from] serde_json::Error),
}

/// One `GET /containers/{id}/json` over HTTP/1.0 (the runtime closes the
/// connection after the answer, which is then read to its end).
fn inspect(socket: &Path, id: &str) -> Result<Option<RuntimeContainer>, InspectError> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    write!(
        stream,
        "GET /containers/{id}/json HTTP/1.0\r\nHost: localhost\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.take(MAX_ANSWER_BYTES).read_to_end(&mut answer)?;
    parse_answer(&answer)
}

fn parse_answer(answer: &[u8]) -> Result<Option<RuntimeContainer>, InspectError> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(InspectError::NotHttp)?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or(InspectError::NotHttp)?;
    match status {
        200 => {}
        404 => return Ok(None),
        status => return Err(InspectError::Status { status }),
    }
    #[derive(serde::Deserialize)]
    struct Inspect {
        #[serde(rename = "Name", default)]
        name: String,
        #[serde(rename = "Config", default)]
        config: Option<Config>,
    }
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(rename = "Image", default)]
        image: String,
        #[serde(rename = "Labels", default)]
        labels: Option<BTreeMap<String, String>>,
    }
    let inspect: Inspect = serde_json::from_slice(&answer[split + 4..])?;
    let config = inspect.config;
    Ok(Some(RuntimeContainer {
        name: inspect.name,
        image: config.as_ref().map(|c| c.image.clone()).unwrap_or_default(),
        labels: config.and_then(|c| c.labels).unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inspect_answer_gives_name_image_and_labels() {
        let answer = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"Id\":\"abc\",\"Name\":\"/shop-web\",\"Config\":{\"Image\":\"nginx:1\",\"Labels\":{\"com.example.team\":\"web\"}}}";
        let container = parse_answer(answer).expect("parses").expect("found");
        assert_eq!(container.name, "/shop-web");
        let labels = container.meta_labels("abc");
        assert!(labels.contains(&(
            "__meta_docker_container_label_com_example_team".into(),
            "web".into()
        )));
        assert!(labels.contains(&("__meta_docker_container_image".into(), "nginx:1".into())));
        assert_eq!(
            parse_answer(b"HTTP/1.0 404 Not Found\r\n\r\n{}").expect("parses"),
            None
        );
        assert!(parse_answer(b"garbage").is_err());
    }

    #[test]
    fn no_socket_no_lookup() {
        let client = RuntimeClient::new(vec![PathBuf::from("/nonexistent/docker.sock")]);
        assert_eq!(client.lookup("abc", Some(ContainerRuntime::Docker)), None);
    }
}
