//! What the Parca exporter is told: the server, how to reach it, and the
//! debuginfo uploads.

use std::{fmt, time::Duration};

/// A Parca server (or anything serving its profile store API).
#[derive(Clone, Debug)]
pub struct RemoteStoreConfig {
    /// `host:port`.
    pub address: String,
    /// `None`: plaintext gRPC (`--remote-store-insecure`).
    pub tls: Option<TlsConfig>,
    pub bearer_token: Option<Secret>,
    /// Extra gRPC metadata sent with every request.
    pub grpc_headers: Vec<(String, Secret)>,
    /// Bytes of unsent profiles kept; the oldest are dropped beyond.
    pub queue_bytes: u64,
    /// Longest one push may take before it is retried.
    pub request_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// Certificates (DER) trusted on top of the system's roots.
    pub extra_roots: Vec<Vec<u8>>,
    /// Accept any server certificate (`--remote-store-insecure-skip-verify`).
    pub skip_verify: bool,
}

/// A credential: its `Debug` never shows it, so it cannot leak into logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Uploads of debug information to the remote store, for the objects whose
/// frames firn could not name: their debug files (where
/// `process::DebugFileConfig` says), else the objects themselves.
#[derive(Clone, Debug)]
pub struct DebuginfoConfig {
    pub upload: bool,
    /// Offer the objects whose frames firn named itself as well.
    pub upload_symbolized: bool,
    /// Uploads at once.
    pub max_parallel: usize,
    /// Longest one upload may take.
    pub upload_timeout: Duration,
}

impl Default for DebuginfoConfig {
    fn default() -> Self {
        Self {
            upload: true,
            upload_symbolized: false,
            max_parallel: 4,
            upload_timeout: Duration::from_secs(120),
        }
    }
}
