//! What the OTLP exporter is told: the receiver, how to reach it, and
//! which release of the profiles messages it reads.

use std::time::Duration;

use crate::output::{
    parca::{Secret, TlsConfig},
    pyroscope::BasicAuth,
};

/// How requests travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`
    /// over HTTP/2.
    Grpc,
    /// `POST {endpoint}/v1development/profiles`, a protobuf body.
    Http,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "gRPC",
            Self::Http => "HTTP",
        }
    }
}

/// The release of opentelemetry-proto whose profiles messages are sent.
/// The profiles signal is still in development: v1.9.0 and v1.10.0 number
/// `Sample`'s fields differently, so a receiver reading one release takes
/// the other's samples for something else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfilesVersion {
    /// v1.10.0 (and v1.11.0, which reads the same): the OpenTelemetry
    /// Collector v0.161.0.
    #[value(name = "1.10")]
    V1_10,
    /// v1.9.0: Pyroscope v1.19's OTLP ingestion.
    #[value(name = "1.9")]
    V1_9,
}

impl ProfilesVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1_10 => "1.10",
            Self::V1_9 => "1.9",
        }
    }
}

/// An OTLP profiles receiver: an OpenTelemetry Collector, Pyroscope's OTLP
/// endpoint, or anything else serving the profiles service.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// The `destination` label of its metrics and log lines.
    pub name: String,
    /// `https://host:port[/prefix]`; `http://` only when written so. gRPC
    /// uses the host and port alone.
    pub endpoint: String,
    pub protocol: Protocol,
    pub version: ProfilesVersion,
    /// `None` for an `http://` endpoint.
    pub tls: Option<TlsConfig>,
    pub basic_auth: Option<BasicAuth>,
    pub bearer_token: Option<Secret>,
    /// Extra headers (gRPC metadata) sent with every export.
    pub headers: Vec<(String, Secret)>,
    /// Gzip the request (HTTP `Content-Encoding: gzip`, gRPC
    /// `grpc-encoding: gzip`).
    pub gzip: bool,
    /// Bytes of unsent profiles kept; the oldest are dropped beyond.
    pub queue_bytes: u64,
    /// Longest one export may take before it is retried.
    pub request_timeout: Duration,
}
