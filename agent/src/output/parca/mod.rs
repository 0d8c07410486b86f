//! Pushing profiles to a Parca server (`ProfileStoreService/WriteRaw`), and
//! the debug information of objects firn could not symbolize
//! (`DebuginfoService`).
//!
//! One series per label set (see `labels`: `node`, external labels,
//! `pid`, `comm`, cgroup, container, Kubernetes, after relabeling), named
//! `__name__="parca_agent_cpu"` as Parca Agent names it (off-CPU profiles
//! as Parca Agent's: `parca_agent:wallclock:nanoseconds:samples:count`,
//! which Parca's UI shows as "Off-CPU"); the per-thread
//! `thread_id` (and `thread_name`) stay sample labels. The queue, retries
//! and network thread are those of every exporter (`output::delivery`).
//! Debug information uploads have a thread, runtime and connection of
//! their own.

mod budget;
mod config;
pub(super) mod connect;
mod debugfile;
mod debuginfo;

use std::{sync::Arc, thread};

use bytes::Bytes;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::mpsc;
use tonic::{Status, codegen::InterceptedService, transport::Channel};
use tracing::{debug, error};

pub use self::config::{DebuginfoConfig, RemoteStoreConfig, Secret, TlsConfig};
use self::{
    connect::RequestMetadata,
    debuginfo::Uploader,
    profilestore::{
        Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest,
        profile_store_service_client::ProfileStoreServiceClient,
    },
};
use super::{
    ProfileKind,
    delivery::{Endpoint, Pusher, Remote, Server, Wire},
    destination::Tally,
};
use crate::{
    offcpu::{self, ServerNames},
    process::ObjectFile,
    stats::{
        Stats,
        cpu::{self, CpuStage},
    },
};

/// Code generated from `proto/parca/`, nested as the packages are so the
/// cross-package references resolve.
#[allow(clippy::all, clippy::too_many_lines, missing_docs)]
pub mod proto {
    pub mod parca {
        pub mod profilestore {
            pub mod v1alpha1 {
                include!(concat!(env!("OUT_DIR"), "/parca.profilestore.v1alpha1.rs"));
            }
        }
        pub mod debuginfo {
            pub mod v1alpha1 {
                include!(concat!(env!("OUT_DIR"), "/parca.debuginfo.v1alpha1.rs"));
            }
        }
        pub mod query {
            pub mod v1alpha1 {
                include!(concat!(env!("OUT_DIR"), "/parca.query.v1alpha1.rs"));
            }
        }
    }
}

pub use proto::parca::{
    debuginfo::v1alpha1 as debuginfo_proto, profilestore::v1alpha1 as profilestore,
    query::v1alpha1 as query,
};

/// The profile name Parca Agent uses for on-CPU samples.
pub const PROFILE_NAME: &str = "parca_agent_cpu";
const PARCA: Server = Server {
    name: "Parca",
    queue_option: "--remote-store-queue-bytes",
    // Parca accepts up to 64 MiB.
    max_request_bytes: 16 << 20,
};
/// Objects waiting for a debuginfo upload decision.
const UPLOAD_BACKLOG: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ParcaError {
    #[error("`{address}` is not a usable remote store address")]
    Address {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("could not set up TLS")]
    Tls {
        #[source]
        source: rustls::Error,
    },
    #[error("a certificate in --remote-store-ca-file is not usable")]
    Certificate {
        #[source]
        source: rustls::Error,
    },
    #[error("the gRPC header `{key}` is not valid metadata")]
    Header { key: String },
    #[error("could not start the thread that talks to the remote store")]
    Thread {
        #[source]
        source: std::io::Error,
    },
}

/// Pushes to Parca: `WriteRawRequest`s over gRPC.
pub type ParcaExporter = Remote<Parca>;

/// What Parca's exporter adds to every exporter's queue and delivery.
pub struct Parca {
    uploads: Option<mpsc::Sender<Arc<ObjectFile>>>,
    /// Offer the objects firn named in full as well.
    upload_symbolized: bool,
    stats: Arc<Stats>,
}

pub type StoreClient = ProfileStoreServiceClient<InterceptedService<Channel, RequestMetadata>>;

impl Pusher for StoreClient {
    type Request = WriteRawRequest;

    async fn push(&mut self, request: WriteRawRequest) -> Result<(), Status> {
        self.write_raw(request).await.map(drop)
    }

    fn credentials_hint(&self) -> &'static str {
        "--remote-store-bearer-token / --remote-store-bearer-token-file"
    }
}

impl Wire for Parca {
    type Request = WriteRawRequest;
    type Client = StoreClient;

    const SERVER: Server = PARCA;

    /// `__name__` first, outside relabeling's reach: Parca refuses series
    /// without it.
    fn series_labels(
        &self,
        kind: ProfileKind,
        profile_labels: Vec<(String, String)>,
    ) -> Vec<(String, String)> {
        let name = match kind {
            ProfileKind::Cpu => PROFILE_NAME,
            ProfileKind::OffCpu => offcpu::PARCA.series,
        };
        let mut labels = vec![("__name__".to_owned(), name.to_owned())];
        labels.extend(profile_labels);
        labels
    }

    fn off_cpu_profile(&self, gzipped: Vec<u8>) -> Vec<u8> {
        renamed(gzipped, &offcpu::PARCA)
    }

    fn add_series(request: &mut WriteRawRequest, labels: Vec<(String, String)>, gzipped: Bytes) {
        let labels = labels
            .into_iter()
            .map(|(name, value)| Label { name, value })
            .collect();
        request.series.push(RawProfileSeries {
            labels: Some(LabelSet { labels }),
            samples: vec![RawSample {
                raw_profile: gzipped,
                executable_info: Vec::new(),
            }],
        });
    }

    fn offer_objects(&mut self, unnamed: Vec<Arc<ObjectFile>>, named: Vec<Arc<ObjectFile>>) {
        let Some(uploads) = &self.uploads else {
            return;
        };
        for object in offered_for_upload(unnamed, named, self.upload_symbolized) {
            if uploads.try_send(object).is_err() {
                Stats::inc(&self.stats.debuginfo_uploads_skipped);
                debug!("debuginfo candidate skipped: the upload backlog is full");
            }
        }
    }
}

impl ParcaExporter {
    /// Checks the configuration (TLS roots, headers) and starts the network
    /// thread; nothing connects until the first push.
    /// Every push attempt's duration goes into `push_duration`.
    pub fn start(
        remote: &RemoteStoreConfig,
        debuginfo: &DebuginfoConfig,
        tally: Tally,
        push_duration: Histogram,
    ) -> Result<Self, ParcaError> {
        let request_metadata = RequestMetadata::new(remote)?;
        let target = connect::target(remote)?;
        let uploads = if debuginfo.upload {
            let (upload_sender, upload_receiver) = mpsc::channel(UPLOAD_BACKLOG);
            let debuginfo = debuginfo.clone();
            let target = target.clone();
            let request_metadata = request_metadata.clone();
            let stats = tally.total().clone();
            thread::Builder::new()
                .name("firn-upload".into())
                .spawn(move || {
                    upload_thread(&debuginfo, target, request_metadata, upload_receiver, stats);
                })
                .map_err(|source| ParcaError::Thread { source })?;
            Some(upload_sender)
        } else {
            None
        };
        let wire = Parca {
            uploads,
            upload_symbolized: debuginfo.upload_symbolized,
            stats: tally.total().clone(),
        };
        let endpoint = Endpoint {
            address: remote.address.clone(),
            queue_bytes: remote.queue_bytes,
            request_timeout: remote.request_timeout,
        };
        Remote::spawn(wire, &endpoint, tally, push_duration, move || {
            ProfileStoreServiceClient::with_interceptor(target.channel(), request_metadata)
        })
        .map_err(|source| ParcaError::Thread { source })
    }
}

/// An off-CPU profile under a server's names; as it was should it not
/// decode (a bug in firn: it built it), logged.
pub(super) fn renamed(gzipped: Vec<u8>, names: &ServerNames) -> Vec<u8> {
    match offcpu::rename(&gzipped, names) {
        Ok(renamed) => renamed,
        Err(error) => {
            error!(error = %format!("{:#}", anyhow::Error::from(error)), "off-CPU profile sent as firn names it");
            gzipped
        }
    }
}

/// Debug information goes on its own thread, runtime and connection:
/// hundreds of MB read and streamed for a large binary never delay a push
/// (nor share its HTTP/2 flow control), and their CPU time is told apart.
fn upload_thread(
    debuginfo: &DebuginfoConfig,
    target: connect::Target,
    request_metadata: RequestMetadata,
    uploads: mpsc::Receiver<Arc<ObjectFile>>,
    stats: Arc<Stats>,
) {
    cpu::account_thread(CpuStage::Upload);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("firn-upload-read")
        .on_thread_start(|| cpu::account_thread(CpuStage::Upload))
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            error!(%error, "could not start the runtime for debuginfo uploads; none will be made");
            return;
        }
    };
    runtime.block_on(async move {
        let client =
            debuginfo_proto::debuginfo_service_client::DebuginfoServiceClient::with_interceptor(
                target.channel(),
                request_metadata,
            );
        // Until the exporter goes away at shutdown.
        Uploader::new(client, debuginfo, stats).run(uploads).await;
    });
    // Uploads in flight at shutdown are abandoned, reads included: the
    // server asks for them again after the next start.
    runtime.shutdown_background();
}

/// The objects a batch offers for upload: those with frames firn could not
/// name, and with `upload_symbolized` the others too. The server keeps
/// named frames as they were sent, and offering a large object costs about
/// a millisecond of CPU per MB to read and hash.
fn offered_for_upload(
    unnamed: Vec<Arc<ObjectFile>>,
    named: Vec<Arc<ObjectFile>>,
    upload_symbolized: bool,
) -> Vec<Arc<ObjectFile>> {
    let mut offered = unnamed;
    if upload_symbolized {
        offered.extend(named);
    }
    offered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{SeriesProfile, delivery::requests};

    /// By default (the CLI's and the config's) only objects with frames
    /// firn could not name are offered; named ones only when asked for.
    #[test]
    fn only_objects_with_unnamed_frames_are_offered_by_default() {
        let object = |path: &str| {
            Arc::new(
                ObjectFile::from_memory(
                    crate::process::ObjectKey::Vdso,
                    path,
                    agent_fixtures::CHAIN.into(),
                )
                .expect("fixture"),
            )
        };
        let paths = |objects: Vec<Arc<ObjectFile>>| -> Vec<String> {
            objects.iter().map(|o| o.path.clone()).collect()
        };
        let (unnamed, named) = (object("/unnamed"), object("/named"));
        let default = DebuginfoConfig::default().upload_symbolized;
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(["firn"]).expect("no flags");
        assert!(!default && !cli.agent.debuginfo.debuginfo_upload_symbolized);
        let offered = offered_for_upload(vec![unnamed.clone()], vec![named.clone()], default);
        assert_eq!(paths(offered), ["/unnamed"]);
        let offered = offered_for_upload(vec![unnamed], vec![named], true);
        assert_eq!(paths(offered), ["/unnamed", "/named"]);
    }

    fn profile(pid: &str, bytes: usize) -> SeriesProfile {
        SeriesProfile {
            labels: vec![("pid".into(), pid.into()), ("comm".into(), "app".into())],
            gzipped: vec![0x1f; bytes],
            samples: 1,
        }
    }

    fn wire() -> Parca {
        Parca {
            uploads: None,
            upload_symbolized: false,
            stats: Arc::default(),
        }
    }

    #[test]
    fn every_series_is_named_and_carries_its_profile_labels() {
        let pushes = requests(
            &wire(),
            ProfileKind::Cpu,
            vec![profile("1", 10), profile("2", 10)],
            1 << 20,
        );
        assert_eq!(pushes.len(), 1);
        let series = &pushes[0].request.series;
        assert_eq!(series.len(), 2);
        let names: Vec<(&str, &str)> = series[1]
            .labels
            .as_ref()
            .expect("labels")
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("__name__", "parca_agent_cpu"),
                ("pid", "2"),
                ("comm", "app"),
            ]
        );
        assert_eq!(series[1].samples[0].raw_profile.len(), 10);
    }

    #[test]
    fn large_batches_are_cut_into_several_pushes() {
        let profiles = (0..5).map(|i| profile(&i.to_string(), 400)).collect();
        let pushes = requests(&wire(), ProfileKind::Cpu, profiles, 1000);
        let sizes: Vec<usize> = pushes.iter().map(|p| p.profiles).collect();
        assert_eq!(sizes, [2, 2, 1]);
        assert!(pushes.iter().all(|p| p.bytes <= 1000));
        // A profile larger than the cut still goes, alone.
        let pushes = requests(&wire(), ProfileKind::Cpu, vec![profile("9", 5000)], 1000);
        assert_eq!(pushes.len(), 1);
    }
}
