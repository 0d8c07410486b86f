//! Pushing profiles to Pyroscope or Grafana Cloud Profiles
//! (`push.v1.PusherService/Push` over the Connect protocol), as Grafana
//! Alloy's `pyroscope.write` does: one series per label set, named
//! `__name__="process_cpu"` with `service_name` on every series, so
//! Pyroscope lists the profile types `process_cpu:cpu:nanoseconds:cpu:
//! nanoseconds` and `process_cpu:samples:count:cpu:nanoseconds`; off-CPU
//! profiles as Alloy's are, `offcpu:offcpu:nanoseconds::`. The queue,
//! retries and network thread are those of every exporter
//! (`output::delivery`).

mod config;
mod connect;

use bytes::Bytes;
use prometheus_client::metrics::histogram::Histogram;

pub use self::config::{BasicAuth, PyroscopeConfig};
use self::{
    connect::ConnectClient,
    proto::{LabelPair, PushRequest, RawProfileSeries, RawSample},
};
use super::{
    ProfileKind,
    delivery::{Endpoint, Remote, Server, Wire},
    destination::Tally,
};
use crate::offcpu;

/// Code generated from `proto/pyroscope/`.
#[allow(clippy::all, clippy::too_many_lines, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
}

/// The profile name Pyroscope's eBPF profiler gives on-CPU samples.
pub const PROFILE_NAME: &str = "process_cpu";
/// What a series without one is called, as Grafana's agents call it.
pub const UNKNOWN_SERVICE: &str = "unspecified";

const PYROSCOPE: Server = Server {
    name: "Pyroscope",
    queue_option: "--pyroscope-queue-bytes",
    // Well within what servers and the proxies before them take in one
    // request, and a retry resends less.
    max_request_bytes: 4 << 20,
};

#[derive(Debug, thiserror::Error)]
pub enum PyroscopeError {
    #[error("`{url}` is not a usable Pyroscope URL")]
    Url { url: String },
    #[error("could not set up TLS for Pyroscope")]
    Tls {
        #[source]
        source: Box<super::parca::ParcaError>,
    },
    #[error("the HTTP header `{key}` is not valid")]
    Header { key: String },
    #[error("could not start the thread that talks to Pyroscope")]
    Thread {
        #[source]
        source: std::io::Error,
    },
}

/// Pushes to Pyroscope: `PushRequest`s over the Connect protocol.
pub type PyroscopeExporter = Remote<Pyroscope>;

/// What Pyroscope's exporter adds to every exporter's queue and delivery.
pub struct Pyroscope;

impl Wire for Pyroscope {
    type Request = PushRequest;
    type Client = ConnectClient;

    const SERVER: Server = PYROSCOPE;

    fn series_labels(
        &self,
        kind: ProfileKind,
        profile_labels: Vec<(String, String)>,
    ) -> Vec<(String, String)> {
        let name = match kind {
            ProfileKind::Cpu => PROFILE_NAME,
            ProfileKind::OffCpu => offcpu::PYROSCOPE.series,
        };
        series_labels(name, profile_labels)
    }

    fn off_cpu_profile(&self, gzipped: Vec<u8>) -> Vec<u8> {
        super::parca::renamed(gzipped, &offcpu::PYROSCOPE)
    }

    fn add_series(request: &mut PushRequest, labels: Vec<(String, String)>, gzipped: Bytes) {
        request.series.push(RawProfileSeries {
            labels: labels
                .into_iter()
                .map(|(name, value)| LabelPair { name, value })
                .collect(),
            samples: vec![RawSample {
                raw_profile: gzipped,
                id: String::new(),
            }],
        });
    }
}

impl PyroscopeExporter {
    /// Checks the configuration (URL, TLS roots, headers) and starts the
    /// network thread; nothing connects until the first push.
    pub fn start(
        config: &PyroscopeConfig,
        tally: Tally,
        push_duration: Histogram,
    ) -> Result<Self, PyroscopeError> {
        let target = connect::Target::new(config)?;
        let endpoint = Endpoint {
            address: config.url.clone(),
            queue_bytes: config.queue_bytes,
            request_timeout: config.request_timeout,
        };
        Remote::spawn(Pyroscope, &endpoint, tally, push_duration, move || {
            target.client()
        })
        .map_err(|source| PyroscopeError::Thread { source })
    }
}

/// The series of one profile: `__name__`, `__delta__` (firn's profiles
/// are deltas already; without it Pyroscope would take them for
/// cumulative ones), the profile's own labels, and `service_name` when
/// relabeling left none.
fn series_labels(name: &str, profile_labels: Vec<(String, String)>) -> Vec<(String, String)> {
    let pair = |name: &str, value: &str| (name.to_owned(), value.to_owned());
    let mut labels = vec![pair("__name__", name), pair("__delta__", "false")];
    let has_service = profile_labels
        .iter()
        .any(|(name, _)| name == "service_name");
    labels.extend(
        profile_labels
            .into_iter()
            .filter(|(name, _)| name != "__name__" && name != "__delta__"),
    );
    if !has_service {
        labels.push(pair("service_name", UNKNOWN_SERVICE));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{SeriesProfile, delivery::requests};

    fn profile(labels: &[(&str, &str)], bytes: usize) -> SeriesProfile {
        SeriesProfile {
            labels: labels
                .iter()
                .map(|&(n, v)| (n.to_owned(), v.to_owned()))
                .collect(),
            gzipped: vec![0x1f; bytes],
            samples: 1,
        }
    }

    fn names(series: &RawProfileSeries) -> Vec<(&str, &str)> {
        series
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect()
    }

    #[test]
    fn every_series_is_named_and_has_a_service() {
        let pushes = requests(
            &Pyroscope,
            ProfileKind::Cpu,
            vec![
                profile(&[("service_name", "shop/checkout"), ("pid", "1")], 10),
                profile(&[("pid", "2"), ("__name__", "other")], 10),
            ],
            1 << 20,
        );
        assert_eq!(pushes.len(), 1);
        let series = &pushes[0].request.series;
        assert_eq!(
            names(&series[0]),
            [
                ("__name__", "process_cpu"),
                ("__delta__", "false"),
                ("service_name", "shop/checkout"),
                ("pid", "1"),
            ]
        );
        assert_eq!(
            names(&series[1]),
            [
                ("__name__", "process_cpu"),
                ("__delta__", "false"),
                ("pid", "2"),
                ("service_name", "unspecified"),
            ]
        );
    }

    #[test]
    fn off_cpu_series_are_named_as_alloy_names_them() {
        let pushes = requests(
            &Pyroscope,
            ProfileKind::OffCpu,
            vec![profile(&[("pid", "1")], 10)],
            1 << 20,
        );
        assert_eq!(
            names(&pushes[0].request.series[0])[0],
            ("__name__", "offcpu")
        );
    }

    #[test]
    fn large_batches_are_cut() {
        let profiles = (0..5).map(|_| profile(&[("pid", "1")], 400)).collect();
        let sizes: Vec<usize> = requests(&Pyroscope, ProfileKind::Cpu, profiles, 1000)
            .iter()
            .map(|p| p.profiles)
            .collect();
        assert_eq!(sizes, [2, 2, 1]);
    }
}
