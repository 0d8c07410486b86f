//! Docker and Podman metadata: a container's name and labels from the
//! runtime's API socket (`GET /containers/{id}/json`, which Podman serves
//! in Docker's form too), as `__meta_docker_*` labels like Grafana Alloy's
//! `discovery.docker` gives `pyroscope.ebpf`. A socket that is not there is
//! not looked at; one that does not answer costs a second per container
//! per [`REFRESH`] at most, since answers (and their absence) are cached.

use std::{
    io::{Read, Write},
    num::NonZeroUsize,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use agent_config::container::{AnswerError, RuntimeContainer, parse_answer};
use lru::LruCache;
use tracing::debug;

use super::ContainerRuntime;

/// Where Docker and rootful Podman serve their API.
pub const DEFAULT_SOCKETS: [&str; 2] = ["/run/docker.sock", "/run/podman/podman.sock"];

/// How long an answer is kept before the runtime is asked again (a
/// container's labels do not change; a new container gets a new id).
pub const REFRESH: Duration = Duration::from_secs(300);
const IO_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_ANSWER_BYTES: u64 = 1 << 20;
const CACHED_CONTAINERS: usize = 4096;

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
    #[error(transparent)]
    Answer(#[from] AnswerError),
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
    Ok(parse_answer(&answer)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_socket_no_lookup() {
        let client = RuntimeClient::new(vec![PathBuf::from("/nonexistent/docker.sock")]);
        assert_eq!(client.lookup("abc", Some(ContainerRuntime::Docker)), None);
    }
}
