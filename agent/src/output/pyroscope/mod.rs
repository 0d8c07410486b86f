//! Pushing profiles to Pyroscope or Grafana Cloud Profiles
//! (`push.v1.PusherService/Push` over the Connect protocol), as Grafana
//! Alloy's `pyroscope.write` does: one series per label set, named
//! `__name__="process_cpu"` with `service_name` on every series, so
//! Pyroscope lists the profile types `process_cpu:cpu:nanoseconds:cpu:
//! nanoseconds` and `process_cpu:samples:count:cpu:nanoseconds`. The queue,
//! retries and network thread are the Parca exporter's.

mod config;
mod connect;

use std::{
    sync::{Arc, mpsc as std_mpsc},
    thread,
    time::Instant,
};

use bytes::Bytes;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tracing::{error, warn};

pub use self::config::{BasicAuth, PyroscopeConfig};
use self::proto::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use super::{
    ExportReceipt, Exporter, Grouping, OutputError, ProfileBatch, SeriesProfile,
    destination::Tally,
    parca::{
        delivery::Delivery,
        queue::{Pending, SharedQueue},
    },
};
use crate::stats::cpu::{self, CpuStage};

/// Code generated from `proto/pyroscope/`.
#[allow(clippy::all, clippy::too_many_lines, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
}

/// The profile name Pyroscope's eBPF profiler gives on-CPU samples.
pub const PROFILE_NAME: &str = "process_cpu";
/// What a series without one is called, as Grafana's agents call it.
pub const UNKNOWN_SERVICE: &str = "unspecified";
/// Requests are cut below this size: well within what servers and the
/// proxies before them take in one request, and a retry resends less.
const MAX_REQUEST_BYTES: usize = 4 << 20;

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
    #[error("the thread that talks to Pyroscope has stopped")]
    Stopped,
}

pub struct PyroscopeExporter {
    url: String,
    queue: Arc<SharedQueue<PushRequest>>,
    shutdown: watch::Sender<Option<Instant>>,
    done: std_mpsc::Receiver<()>,
    thread: thread::JoinHandle<()>,
    tally: Tally,
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
        let queue = Arc::new(SharedQueue::new(
            usize::try_from(config.queue_bytes).unwrap_or(usize::MAX),
            tally.clone(),
        ));
        let (shutdown, shutdown_receiver) = watch::channel(None);
        let (done_sender, done) = std_mpsc::channel();
        let thread = {
            let queue = queue.clone();
            let tally = tally.clone();
            let config = config.clone();
            thread::Builder::new()
                .name("firn-pyroscope".into())
                .spawn(move || {
                    cpu::account_thread(CpuStage::Push);
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(error) => {
                            error!(%error, "could not start the runtime for Pyroscope; profiles will not be sent");
                            return;
                        }
                    };
                    runtime.block_on(
                        Delivery {
                            client: target.client(),
                            queue,
                            shutdown: shutdown_receiver,
                            request_timeout: config.request_timeout,
                            address: config.url.clone(),
                            tally,
                            push_duration,
                        }
                        .run(),
                    );
                    let _ = done_sender.send(());
                })
                .map_err(|source| PyroscopeError::Thread { source })?
        };
        Ok(Self {
            url: config.url.clone(),
            queue,
            shutdown,
            done,
            thread,
            tally,
        })
    }
}

/// The series of one profile: `__name__`, `__delta__` (firn's profiles
/// are deltas already; without it Pyroscope would take them for
/// cumulative ones), the profile's own labels, and `service_name` when
/// relabeling left none.
fn series_labels(profile_labels: Vec<(String, String)>) -> Vec<LabelPair> {
    let pair = |name: &str, value: &str| LabelPair {
        name: name.to_owned(),
        value: value.to_owned(),
    };
    let mut labels = vec![pair("__name__", PROFILE_NAME), pair("__delta__", "false")];
    let has_service = profile_labels
        .iter()
        .any(|(name, _)| name == "service_name");
    labels.extend(
        profile_labels
            .into_iter()
            .filter(|(name, _)| name != "__name__" && name != "__delta__")
            .map(|(name, value)| LabelPair { name, value }),
    );
    if !has_service {
        labels.push(pair("service_name", UNKNOWN_SERVICE));
    }
    labels
}

/// The batch as pushes of at most `max_bytes` each (unless one profile is
/// larger).
fn requests(profiles: Vec<SeriesProfile>, max_bytes: usize) -> Vec<Pending<PushRequest>> {
    let empty = || Pending {
        request: PushRequest::default(),
        bytes: 0,
        profiles: 0,
        attempts: 0,
    };
    let mut requests = Vec::new();
    let mut current = empty();
    for profile in profiles {
        let labels = series_labels(profile.labels);
        let bytes = profile.gzipped.len()
            + labels
                .iter()
                .map(|l| l.name.len() + l.value.len())
                .sum::<usize>();
        if current.profiles > 0 && current.bytes + bytes > max_bytes {
            requests.push(std::mem::replace(&mut current, empty()));
        }
        current.request.series.push(RawProfileSeries {
            labels,
            samples: vec![RawSample {
                raw_profile: Bytes::from(profile.gzipped),
                id: String::new(),
            }],
        });
        current.bytes += bytes;
        current.profiles += 1;
    }
    if current.profiles > 0 {
        requests.push(current);
    }
    requests
}

impl Exporter for PyroscopeExporter {
    fn grouping(&self) -> Grouping {
        Grouping::PerProcess
    }

    fn export(&mut self, batch: ProfileBatch) -> Result<ExportReceipt, OutputError> {
        if self.thread.is_finished() {
            return Err(PyroscopeError::Stopped.into());
        }
        let mut receipt = ExportReceipt {
            action: "profiles queued",
            destination: self.url.clone(),
            bytes: 0,
        };
        self.tally.written(batch.profiles.len() as u64);
        for request in requests(batch.profiles, MAX_REQUEST_BYTES) {
            receipt.bytes += request.bytes;
            let dropped = self.queue.push_back(request);
            if dropped.profiles > 0 {
                self.tally.dropped(dropped.profiles as u64);
                warn!(
                    destination = self.tally.name(),
                    profiles = dropped.profiles,
                    server = self.url,
                    "profiles dropped: the queue of unsent profiles is full (--pyroscope-queue-bytes)"
                );
            }
        }
        Ok(receipt)
    }

    fn finish(self: Box<Self>, deadline: Instant) {
        let _ = self.shutdown.send(Some(deadline));
        let grace = deadline.saturating_duration_since(Instant::now())
            + std::time::Duration::from_millis(500);
        match self.done.recv_timeout(grace) {
            Ok(()) => {
                let _ = self.thread.join();
            }
            Err(_) => warn!("the Pyroscope thread did not stop in time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn large_batches_are_cut() {
        let profiles = (0..5).map(|_| profile(&[("pid", "1")], 400)).collect();
        let sizes: Vec<usize> = requests(profiles, 1000)
            .iter()
            .map(|p| p.profiles)
            .collect();
        assert_eq!(sizes, [2, 2, 1]);
    }
}
