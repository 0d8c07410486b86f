//! What the Pyroscope exporter is told: the server, how to reach it and
//! who to say firn is.

use std::time::Duration;

use crate::output::parca::{Secret, TlsConfig};

/// A Pyroscope server or Grafana Cloud Profiles (anything serving
/// `push.v1.PusherService/Push` over the Connect protocol).
#[derive(Clone, Debug)]
pub struct PyroscopeConfig {
    /// The `destination` label of its metrics and log lines.
    pub name: String,
    /// `https://host[:port][/prefix]`; `http://` only when written so.
    pub url: String,
    /// `None` for an `http://` URL.
    pub tls: Option<TlsConfig>,
    pub basic_auth: Option<BasicAuth>,
    pub bearer_token: Option<Secret>,
    /// Sent as `X-Scope-OrgID` (Pyroscope with multitenancy on).
    pub tenant_id: Option<String>,
    /// Extra HTTP headers sent with every push.
    pub headers: Vec<(String, Secret)>,
    /// Bytes of unsent profiles kept; the oldest are dropped beyond.
    pub queue_bytes: u64,
    /// Longest one push may take before it is retried.
    pub request_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct BasicAuth {
    pub username: String,
    pub password: Secret,
}
