//! Debug information for the server's symbolizer: for each object in the
//! profiles (those whose frames firn sent without names first), ask the
//! server by build id whether it wants debug information, and only then
//! find a file with symbols or DWARF (a debug file opened with the object,
//! else the object itself), fingerprint it and stream it through
//! `parca.debuginfo.v1alpha1`. Nothing is read before the server asks for
//! it, so a server that is down or has the file costs no I/O and no
//! memory. At most a few uploads at once, the bytes they hold bounded by
//! one budget; one per build id, outcomes remembered in a bounded table.

use std::{
    num::NonZeroUsize,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use lru::LruCache;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::{StreamExt, wrappers::ReceiverStream};
use tonic::{Code, codegen::InterceptedService, transport::Channel};
use tracing::{debug, info, warn};

use super::{
    budget::{ByteBudget, reserved_bytes},
    config::DebuginfoConfig,
    connect::RequestMetadata,
    debugfile::{CHUNK, FINGERPRINT_EDGE, Source, find_source, may_have_source},
    debuginfo_proto::{
        BuildIdType, DebuginfoType, InitiateUploadRequest, MarkUploadFinishedRequest,
        ShouldInitiateUploadRequest, UploadInfo, UploadRequest, debuginfo_service_client,
        upload_instructions::UploadStrategy, upload_request,
    },
};
use crate::{output::delivery::describe, process::ObjectFile, stats::Stats};

pub type DebuginfoClient =
    debuginfo_service_client::DebuginfoServiceClient<InterceptedService<Channel, RequestMetadata>>;

/// Build ids whose outcome is remembered.
const REMEMBERED: usize = 4096;
/// A failed upload is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(300);
/// Bytes of debug files read but not yet handed to the network, across
/// all uploads: a few chunks each for two uploads at full speed.
pub const BYTES_IN_FLIGHT: usize = 8 * CHUNK;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    InProgress,
    Uploaded,
    Skipped,
    Failed { retry_at: Instant },
}

#[derive(Debug, thiserror::Error)]
enum UploadError {
    #[error("{call} failed: {reason}")]
    Rpc { call: &'static str, reason: String },
    #[error("the server answered InitiateUpload without instructions")]
    NoInstructions,
    #[error("took longer than {timeout:?}")]
    Timeout { timeout: Duration },
    #[error("could not read the debug information")]
    Read {
        #[source]
        source: std::io::Error,
    },
}

impl UploadError {
    fn rpc(call: &'static str, status: &tonic::Status) -> Self {
        Self::Rpc {
            call,
            reason: describe(status),
        }
    }
}

#[derive(Clone)]
pub struct Uploader {
    client: DebuginfoClient,
    timeout: Duration,
    slots: Arc<Semaphore>,
    budget: ByteBudget,
    outcomes: Arc<Mutex<LruCache<String, Outcome>>>,
    stats: Arc<Stats>,
}

impl Uploader {
    pub fn new(client: DebuginfoClient, config: &DebuginfoConfig, stats: Arc<Stats>) -> Self {
        Self {
            client,
            timeout: config.upload_timeout,
            slots: Arc::new(Semaphore::new(config.max_parallel.max(1))),
            budget: ByteBudget::new(BYTES_IN_FLIGHT),
            outcomes: Arc::new(Mutex::new(LruCache::new(
                NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN),
            ))),
            stats,
        }
    }

    /// Takes objects until the sender goes away; each upload is its own
    /// task, at most `max_parallel` at once.
    pub async fn run(self, mut objects: mpsc::Receiver<Arc<ObjectFile>>) {
        while let Some(object) = objects.recv().await {
            let Some(build_id) = object.build_id().map(|id| id.to_hex()) else {
                continue;
            };
            if !self.begin(&build_id) {
                continue;
            }
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                break;
            };
            let uploader = self.clone();
            tokio::spawn(async move {
                let outcome = uploader.upload_one(&build_id, object).await;
                uploader.remember(&build_id, outcome);
                drop(slot);
            });
        }
    }

    /// True when this build id should be tried now (never seen, or its
    /// last failure is old enough).
    fn begin(&self, build_id: &str) -> bool {
        let mut outcomes = self
            .outcomes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let start = match outcomes.get(build_id) {
            None => true,
            Some(Outcome::Failed { retry_at }) => Instant::now() >= *retry_at,
            Some(_) => false,
        };
        if start {
            outcomes.put(build_id.to_owned(), Outcome::InProgress);
        }
        start
    }

    fn remember(&self, build_id: &str, outcome: Outcome) {
        self.outcomes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .put(build_id.to_owned(), outcome);
    }

    async fn upload_one(&self, build_id: &str, object: Arc<ObjectFile>) -> Outcome {
        let path = object.path.clone();
        let result = tokio::time::timeout(self.timeout, self.upload(build_id, object)).await;
        let result = result.unwrap_or(Err(UploadError::Timeout {
            timeout: self.timeout,
        }));
        match result {
            Ok(outcome) => outcome,
            Err(error) => {
                Stats::inc(&self.stats.debuginfo_upload_failures);
                warn!(build_id, object = path, %error, "debuginfo upload failed; will retry later");
                Outcome::Failed {
                    retry_at: Instant::now() + RETRY_AFTER,
                }
            }
        }
    }

    fn skipped(&self, build_id: &str, object: &str, reason: &str) -> Outcome {
        Stats::inc(&self.stats.debuginfo_uploads_skipped);
        debug!(build_id, object, reason, "debuginfo not uploaded");
        Outcome::Skipped
    }

    async fn upload(
        &self,
        build_id: &str,
        object: Arc<ObjectFile>,
    ) -> Result<Outcome, UploadError> {
        let object_path = object.path.clone();
        if !may_have_source(&object) {
            return Ok(self.skipped(build_id, &object_path, "no symbols or DWARF found for it"));
        }
        let mut client = self.client.clone();
        // By build id alone: the server needs the hash only to refuse a
        // file it already marked invalid, which InitiateUpload checks
        // (AlreadyExists) anyway, and finding the file costs reads.
        let answer = client
            .should_initiate_upload(ShouldInitiateUploadRequest {
                build_id: build_id.to_owned(),
                hash: String::new(),
                force: false,
                r#type: DebuginfoType::DebuginfoUnspecified.into(),
                build_id_type: BuildIdType::Gnu.into(),
            })
            .await
            .map_err(|status| UploadError::rpc("ShouldInitiateUpload", &status))?
            .into_inner();
        if !answer.should_initiate_upload {
            return Ok(self.skipped(build_id, &object_path, &answer.reason));
        }
        let source = blocking(move || find_source(&object)).await?;
        let Some(source) = source else {
            return Ok(self.skipped(build_id, &object_path, "no symbols or DWARF found for it"));
        };
        let hash = {
            let reservation = self.budget.reserve(2 * FINGERPRINT_EDGE).await;
            let source = source.clone();
            blocking(move || {
                let _reservation = reservation;
                source.fingerprint()
            })
            .await?
        };
        let size = source.len();
        let upload_id = match initiate(&mut client, build_id, size, hash).await? {
            Initiated::Upload { upload_id } => upload_id,
            Initiated::Declined { reason } => {
                return Ok(self.skipped(build_id, &object_path, &reason));
            }
        };
        self.send(&mut client, build_id, upload_id, &source).await?;
        Stats::inc(&self.stats.debuginfo_uploads);
        info!(
            build_id,
            object = object_path,
            file = source.description,
            bytes = size,
            "debuginfo uploaded"
        );
        Ok(Outcome::Uploaded)
    }

    /// Streams `source` as upload `upload_id` and tells the server it is
    /// complete, unless reading it failed part way.
    async fn send(
        &self,
        client: &mut DebuginfoClient,
        build_id: &str,
        upload_id: String,
        source: &Source,
    ) -> Result<(), UploadError> {
        let info = UploadRequest {
            data: Some(upload_request::Data::Info(UploadInfo {
                build_id: build_id.to_owned(),
                upload_id: upload_id.clone(),
                r#type: DebuginfoType::DebuginfoUnspecified.into(),
            })),
        };
        // Chunks are read as the stream is sent, each holding its share of
        // the budget until the encoder has copied it.
        let (sender, receiver) = mpsc::channel(1);
        let mut reader = AbortOnDrop(tokio::spawn(read_chunks(
            source.clone(),
            self.budget.clone(),
            sender,
        )));
        let chunks = ReceiverStream::new(receiver).map(|chunk| UploadRequest {
            data: Some(upload_request::Data::ChunkData(chunk)),
        });
        client
            .upload(tokio_stream::iter([info]).chain(chunks))
            .await
            .map_err(|status| UploadError::rpc("Upload", &status))?;
        // A read that failed ended the stream early: the server must not
        // be told that a short file is complete.
        (&mut reader.0)
            .await
            .map_err(|error| UploadError::Read {
                source: std::io::Error::other(error),
            })?
            .map_err(|source| UploadError::Read { source })?;
        client
            .mark_upload_finished(MarkUploadFinishedRequest {
                build_id: build_id.to_owned(),
                upload_id,
                r#type: DebuginfoType::DebuginfoUnspecified.into(),
            })
            .await
            .map_err(|status| UploadError::rpc("MarkUploadFinished", &status))?;
        Ok(())
    }
}

/// What the server said to an upload of this build id.
enum Initiated {
    Upload {
        upload_id: String,
    },
    /// It will not take the file, and asking again would not help.
    Declined {
        reason: String,
    },
}

async fn initiate(
    client: &mut DebuginfoClient,
    build_id: &str,
    size: u64,
    hash: String,
) -> Result<Initiated, UploadError> {
    let initiated = client
        .initiate_upload(InitiateUploadRequest {
            build_id: build_id.to_owned(),
            size: i64::try_from(size).unwrap_or(i64::MAX),
            hash,
            force: false,
            r#type: DebuginfoType::DebuginfoUnspecified.into(),
            build_id_type: BuildIdType::Gnu.into(),
        })
        .await;
    let instructions = match initiated {
        Ok(response) => response
            .into_inner()
            .upload_instructions
            .ok_or(UploadError::NoInstructions)?,
        // Another agent got there first, the server holds this very
        // file already marked invalid, or it will never take this file
        // (too large): asking again would not help.
        Err(status)
            if matches!(
                status.code(),
                Code::AlreadyExists | Code::FailedPrecondition | Code::InvalidArgument
            ) =>
        {
            return Ok(Initiated::Declined {
                reason: status.message().to_owned(),
            });
        }
        Err(status) => return Err(UploadError::rpc("InitiateUpload", &status)),
    };
    if instructions.upload_strategy() != UploadStrategy::Grpc {
        return Ok(Initiated::Declined {
            reason: "the server asks for a signed-URL upload, which firn does not do".into(),
        });
    }
    Ok(Initiated::Upload {
        upload_id: instructions.upload_id,
    })
}

/// Reads `source` a chunk at a time into `sender`, each chunk waiting for
/// its bytes in `budget`. Stops quietly when the upload stops listening
/// (its own error is the one reported).
async fn read_chunks(
    source: Source,
    budget: ByteBudget,
    sender: mpsc::Sender<Bytes>,
) -> std::io::Result<()> {
    for (offset, length) in source.pieces(CHUNK) {
        let reservation = budget.reserve(length).await;
        let piece = source.clone();
        let chunk = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0; length];
            piece.read_at(offset, &mut buf).map(|()| buf)
        })
        .await
        .map_err(std::io::Error::other)??;
        if sender
            .send(reserved_bytes(chunk, reservation))
            .await
            .is_err()
        {
            return Ok(());
        }
    }
    Ok(())
}

/// File reads off the runtime's thread.
async fn blocking<T: Send + 'static>(
    read: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, UploadError> {
    tokio::task::spawn_blocking(read)
        .await
        .map_err(|error| UploadError::Read {
            source: std::io::Error::other(error),
        })?
        .map_err(|source| UploadError::Read { source })
}

/// The reader stops with the upload that reads (a timeout drops it).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
#[path = "debuginfo_tests.rs"]
mod tests;
