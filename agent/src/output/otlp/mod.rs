//! Exporting profiles as OpenTelemetry's profiles signal (OTLP): to an
//! OpenTelemetry Collector, Pyroscope's OTLP endpoint, or any receiver of
//! `ProfilesService/Export`, over gRPC or HTTP. A batch's series keep
//! their gzipped pprof in the queue (so the queue's bound is what it
//! holds); an export turns them into one request whose dictionary they
//! share (`convert`). The queue, retries and network thread are those of
//! every exporter (`output::delivery`).

mod client;
mod config;
pub mod convert;
pub mod proto;

use bytes::Bytes;
use prometheus_client::metrics::histogram::Histogram;

pub use self::{
    client::HTTP_PATH,
    config::{OtlpConfig, ProfilesVersion, Protocol},
};
use self::{client::OtlpClient, convert::ConvertError};
use super::{
    ProfileKind,
    delivery::{Endpoint, Remote, Server, Wire},
    destination::Tally,
};

const OTLP: Server = Server {
    name: "OTLP",
    queue_option: "--otlp-queue-bytes",
    // The Collector's gRPC receiver takes 4 MiB by default; a request is
    // about twice the gzipped profiles it is built from (measured: 0.5 MB
    // of them made 0.74 to 1.0 MB, the dictionary shared).
    max_request_bytes: 1 << 20,
};

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("`{endpoint}` is not a usable OTLP endpoint")]
    Endpoint { endpoint: String },
    #[error("could not set up TLS for the OTLP receiver")]
    Tls {
        #[source]
        source: Box<super::parca::ParcaError>,
    },
    #[error("the header `{key}` is not valid")]
    Header { key: String },
    #[error("could not start the thread that talks to the OTLP receiver")]
    Thread {
        #[source]
        source: std::io::Error,
    },
}

/// The series of one export, each its labels and gzipped pprof.
#[derive(Clone, Debug, Default)]
pub struct OtlpRequest {
    series: Vec<(Vec<(String, String)>, Bytes)>,
}

impl OtlpRequest {
    /// The request as the current release of the messages spells it.
    pub fn build(&self) -> Result<proto::ExportProfilesServiceRequest, ConvertError> {
        let mut builder = convert::RequestBuilder::default();
        for (series, (labels, gzipped)) in self.series.iter().enumerate() {
            let profile = agent_pprof::decode(gzipped)
                .map_err(|source| ConvertError::Pprof { series, source })?;
            builder.add(labels, &profile, series)?;
        }
        Ok(builder.finish())
    }
}

/// Pushes OTLP profiles.
pub type OtlpExporter = Remote<Otlp>;

/// What the OTLP exporter adds to every exporter's queue and delivery.
pub struct Otlp;

impl Wire for Otlp {
    type Request = OtlpRequest;
    type Client = OtlpClient;

    const SERVER: Server = OTLP;

    /// The process's labels as they are: they become the resource's
    /// attributes, renamed to the semantic conventions when exported.
    fn series_labels(
        &self,
        _: ProfileKind,
        profile_labels: Vec<(String, String)>,
    ) -> Vec<(String, String)> {
        profile_labels
    }

    fn add_series(request: &mut OtlpRequest, labels: Vec<(String, String)>, gzipped: Bytes) {
        request.series.push((labels, gzipped));
    }
}

impl OtlpExporter {
    /// Checks the configuration (endpoint, TLS roots, headers) and starts
    /// the network thread; nothing connects until the first export.
    pub fn start(
        config: &OtlpConfig,
        tally: Tally,
        push_duration: Histogram,
    ) -> Result<Self, OtlpError> {
        let target = client::Target::new(config)?;
        let endpoint = Endpoint {
            address: config.endpoint.clone(),
            queue_bytes: config.queue_bytes,
            request_timeout: config.request_timeout,
        };
        Remote::spawn(Otlp, &endpoint, tally, push_duration, move || {
            target.client()
        })
        .map_err(|source| OtlpError::Thread { source })
    }
}

#[cfg(test)]
mod tests;
