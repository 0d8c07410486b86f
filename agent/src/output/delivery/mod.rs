//! What every exporter that pushes to a server shares: a byte-bounded
//! queue the builder thread fills without waiting on the network, a
//! network thread with its own runtime that sends oldest first with
//! timeouts, backoff and retries, and a shutdown flush bounded by a
//! deadline. An exporter is only what differs, a [`Wire`]: how a batch's
//! profiles become its request type, the labels of its series, and the
//! [`Pusher`] that sends a request and reads a failure.

pub mod http;
pub mod queue;
mod send;

use std::{
    future::Future,
    sync::{Arc, mpsc as std_mpsc},
    thread,
    time::{Duration, Instant},
};

use bytes::Bytes;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tonic::{Code, Status};
use tracing::{error, warn};

pub use self::send::{Failure, causes, classify, describe};
use self::{
    queue::{Pending, SharedQueue},
    send::Delivery,
};
use super::{
    ExportReceipt, Exporter, Grouping, OutputError, ProfileBatch, ProfileKind, SeriesProfile,
    destination::Tally,
};
use crate::{
    process::ObjectFile,
    stats::cpu::{self, CpuStage},
};

/// How one kind of server is named and how much it takes at once.
#[derive(Clone, Copy, Debug)]
pub struct Server {
    /// For thread names and log lines: "Parca".
    pub name: &'static str,
    /// The option that bounds the queue, named when profiles are dropped.
    pub queue_option: &'static str,
    /// Requests are cut below this size (unless one profile is larger).
    pub max_request_bytes: usize,
}

/// One kind of server's request and series labels, built on the builder
/// thread.
pub trait Wire: Send + 'static {
    /// One push's body, holding one or more series.
    type Request: Clone + Default + Send + 'static;
    /// Sends requests; made on the network thread, inside its runtime.
    type Client: Pusher<Request = Self::Request>;

    const SERVER: Server;

    /// The labels of a profile's series: its own, with what this server
    /// wants on every series of that kind.
    fn series_labels(
        &self,
        kind: ProfileKind,
        profile_labels: Vec<(String, String)>,
    ) -> Vec<(String, String)>;

    /// An off-CPU profile as this server wants it (`off_cpu/nanoseconds`
    /// as firn writes it, unless the server knows another name).
    fn off_cpu_profile(&self, gzipped: Vec<u8>) -> Vec<u8> {
        gzipped
    }

    /// Adds one profile, `gzipped`, to `request` as a series `labels` name.
    fn add_series(request: &mut Self::Request, labels: Vec<(String, String)>, gzipped: Bytes);

    /// The objects of a batch, for a server that takes debug information:
    /// `unnamed` hold frames firn could not name. Must not block.
    fn offer_objects(&mut self, unnamed: Vec<Arc<ObjectFile>>, named: Vec<Arc<ObjectFile>>) {
        let _ = (unnamed, named);
    }
}

/// One kind of server's push call. Failures are told as gRPC statuses
/// (the Connect protocol's error codes are the same) so retrying and
/// refusing work alike for all.
pub trait Pusher: Send + 'static {
    type Request: Clone + Send;

    fn push(&mut self, request: Self::Request) -> impl Future<Output = Result<(), Status>> + Send;

    /// Which flags set the credentials, for a refusal's log line.
    fn credentials_hint(&self) -> &'static str;

    /// Whether a failure is worth retrying.
    fn classify(&self, code: Code) -> Failure {
        classify(code)
    }

    /// What to check after a refusal, appended to its log line.
    fn hint(&self, code: Code) -> String {
        match code {
            Code::Unauthenticated | Code::PermissionDenied => {
                format!(" (check {})", self.credentials_hint())
            }
            _ => String::new(),
        }
    }
}

/// Where a [`Remote`] pushes and how much it holds meanwhile.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The server, as the user gave it (for log lines).
    pub address: String,
    pub queue_bytes: u64,
    pub request_timeout: Duration,
}

/// An exporter that pushes a [`Wire`]'s requests to a server.
pub struct Remote<W: Wire> {
    wire: W,
    address: String,
    queue: Arc<SharedQueue<W::Request>>,
    shutdown: watch::Sender<Option<Instant>>,
    done: std_mpsc::Receiver<()>,
    thread: thread::JoinHandle<()>,
    tally: Tally,
}

impl<W: Wire> Remote<W> {
    /// Starts the network thread, which makes its client with `client`
    /// inside its runtime; nothing connects until the first push.
    /// Every push attempt's duration goes into `push_duration`.
    pub fn spawn(
        wire: W,
        endpoint: &Endpoint,
        tally: Tally,
        push_duration: Histogram,
        client: impl FnOnce() -> W::Client + Send + 'static,
    ) -> std::io::Result<Self> {
        let queue = Arc::new(SharedQueue::new(
            usize::try_from(endpoint.queue_bytes).unwrap_or(usize::MAX),
            tally.clone(),
        ));
        let (shutdown, shutdown_receiver) = watch::channel(None);
        let (done_sender, done) = std_mpsc::channel();
        let thread = {
            let queue = queue.clone();
            let tally = tally.clone();
            let endpoint = endpoint.clone();
            thread::Builder::new()
                .name(format!("firn-{}", W::SERVER.name.to_lowercase()))
                .spawn(move || {
                    cpu::account_thread(CpuStage::Push);
                    deliver::<W>(
                        &endpoint,
                        queue,
                        shutdown_receiver,
                        tally,
                        push_duration,
                        client,
                    );
                    let _ = done_sender.send(());
                })?
        };
        Ok(Self {
            wire,
            address: endpoint.address.clone(),
            queue,
            shutdown,
            done,
            thread,
            tally,
        })
    }
}

fn deliver<W: Wire>(
    endpoint: &Endpoint,
    queue: Arc<SharedQueue<W::Request>>,
    shutdown: watch::Receiver<Option<Instant>>,
    tally: Tally,
    push_duration: Histogram,
    client: impl FnOnce() -> W::Client,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            error!(%error, server = W::SERVER.name, "could not start the network runtime; profiles will not be sent");
            return;
        }
    };
    runtime.block_on(async move {
        Delivery {
            client: client(),
            queue,
            shutdown,
            request_timeout: endpoint.request_timeout,
            address: endpoint.address.clone(),
            tally,
            push_duration,
            refused: None,
        }
        .run()
        .await;
    });
}

/// The profiles as pushes of at most `max_bytes` each (unless one profile
/// is larger), each series labelled as `wire` labels it.
pub fn requests<W: Wire>(
    wire: &W,
    kind: ProfileKind,
    profiles: Vec<SeriesProfile>,
    max_bytes: usize,
) -> Vec<Pending<W::Request>> {
    let empty = || Pending {
        request: W::Request::default(),
        bytes: 0,
        profiles: 0,
        attempts: 0,
    };
    let mut requests = Vec::new();
    let mut current = empty();
    for profile in profiles {
        let labels = wire.series_labels(kind, profile.labels);
        let gzipped = match kind {
            ProfileKind::Cpu => profile.gzipped,
            ProfileKind::OffCpu => wire.off_cpu_profile(profile.gzipped),
        };
        let bytes = gzipped.len()
            + labels
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>();
        if current.profiles > 0 && current.bytes + bytes > max_bytes {
            requests.push(std::mem::replace(&mut current, empty()));
        }
        W::add_series(&mut current.request, labels, Bytes::from(gzipped));
        current.bytes += bytes;
        current.profiles += 1;
    }
    if current.profiles > 0 {
        requests.push(current);
    }
    requests
}

impl<W: Wire> Exporter for Remote<W> {
    fn grouping(&self) -> Grouping {
        Grouping::PerProcess
    }

    fn export(&mut self, batch: ProfileBatch) -> Result<ExportReceipt, OutputError> {
        if self.thread.is_finished() {
            return Err(OutputError::Stopped {
                server: W::SERVER.name,
            });
        }
        let mut receipt = ExportReceipt {
            action: "profiles queued",
            destination: self.address.clone(),
            bytes: 0,
        };
        // Counted per series, the unit of sent, dropped and queued.
        self.tally.written(batch.profiles.len() as u64);
        for request in requests(
            &self.wire,
            batch.kind,
            batch.profiles,
            W::SERVER.max_request_bytes,
        ) {
            receipt.bytes += request.bytes;
            let dropped = self.queue.push_back(request);
            if dropped.profiles > 0 {
                self.tally.dropped(dropped.profiles as u64);
                warn!(
                    destination = self.tally.name(),
                    profiles = dropped.profiles,
                    server = self.address,
                    "profiles dropped: the queue of unsent profiles is full ({})",
                    W::SERVER.queue_option
                );
            }
        }
        self.wire
            .offer_objects(batch.debuginfo_candidates, batch.symbolized_objects);
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
            Err(_) => warn!(
                server = W::SERVER.name,
                "the network thread did not stop in time"
            ),
        }
    }
}
