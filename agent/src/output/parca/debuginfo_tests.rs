//! The upload against a server of the test's own: what is asked, in which
//! order, and what is read only when the server wants it.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use agent_fixtures::{CHAIN, CHAIN_STRIPPED};

use super::*;
use crate::{
    output::parca::{
        RemoteStoreConfig, connect,
        debuginfo_proto::{
            InitiateUploadResponse, MarkUploadFinishedResponse, ShouldInitiateUploadResponse,
            UploadInstructions, UploadResponse,
            debuginfo_service_server::{DebuginfoService, DebuginfoServiceServer},
        },
    },
    process::{DebugFile, DebugFileKind, ObjectKey},
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Should { hash: String },
    Initiate { hash: String, size: i64 },
    Upload,
    Finished,
}

#[derive(Default)]
struct FakeServer {
    wants: bool,
    /// InitiateUpload fails with this, as Parca does for a file it holds.
    refuse: Option<tonic::Code>,
    calls: Mutex<Vec<Call>>,
    uploaded: Mutex<Vec<u8>>,
}

impl FakeServer {
    fn call(&self, call: Call) {
        self.calls.lock().expect("lock").push(call);
    }
}

#[tonic::async_trait]
impl DebuginfoService for Arc<FakeServer> {
    async fn upload(
        &self,
        request: Request<Streaming<UploadRequest>>,
    ) -> Result<Response<UploadResponse>, Status> {
        self.call(Call::Upload);
        let mut stream = request.into_inner();
        let mut bytes = Vec::new();
        while let Some(message) = stream.next().await {
            if let Some(upload_request::Data::ChunkData(chunk)) = message?.data {
                bytes.extend_from_slice(&chunk);
            }
        }
        let size = bytes.len() as u64;
        *self.uploaded.lock().expect("lock") = bytes;
        Ok(Response::new(UploadResponse {
            build_id: String::new(),
            size,
        }))
    }

    async fn should_initiate_upload(
        &self,
        request: Request<ShouldInitiateUploadRequest>,
    ) -> Result<Response<ShouldInitiateUploadResponse>, Status> {
        self.call(Call::Should {
            hash: request.into_inner().hash,
        });
        Ok(Response::new(ShouldInitiateUploadResponse {
            should_initiate_upload: self.wants,
            reason: "test".into(),
        }))
    }

    async fn initiate_upload(
        &self,
        request: Request<InitiateUploadRequest>,
    ) -> Result<Response<InitiateUploadResponse>, Status> {
        let request = request.into_inner();
        self.call(Call::Initiate {
            hash: request.hash,
            size: request.size,
        });
        if let Some(code) = self.refuse {
            return Err(Status::new(code, "the same file is already there"));
        }
        Ok(Response::new(InitiateUploadResponse {
            upload_instructions: Some(UploadInstructions {
                build_id: request.build_id,
                upload_id: "u1".into(),
                upload_strategy: UploadStrategy::Grpc.into(),
                signed_url: String::new(),
                r#type: 0,
            }),
        }))
    }

    async fn mark_upload_finished(
        &self,
        _request: Request<MarkUploadFinishedRequest>,
    ) -> Result<Response<MarkUploadFinishedResponse>, Status> {
        self.call(Call::Finished);
        Ok(Response::new(MarkUploadFinishedResponse {}))
    }
}

/// Serves `server` on a free port of localhost until the runtime ends.
async fn serve(server: Arc<FakeServer>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    let (sender, receiver) = mpsc::channel::<std::io::Result<tokio::net::TcpStream>>(4);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if sender.send(Ok(tcp)).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DebuginfoServiceServer::new(server))
            .serve_with_incoming(ReceiverStream::new(receiver)),
    );
    address
}

fn uploader(address: SocketAddr) -> (Uploader, Arc<Stats>) {
    let remote = RemoteStoreConfig {
        address: address.to_string(),
        tls: None,
        bearer_token: None,
        grpc_headers: Vec::new(),
        queue_bytes: 0,
        request_timeout: Duration::from_secs(5),
    };
    let channel = connect::target(&remote).expect("target").channel();
    let client = debuginfo_service_client::DebuginfoServiceClient::with_interceptor(
        channel,
        RequestMetadata::new(&remote).expect("metadata"),
    );
    let config = DebuginfoConfig {
        upload: true,
        upload_symbolized: false,
        max_parallel: 2,
        upload_timeout: Duration::from_secs(20),
    };
    let stats = Arc::new(Stats::default());
    (Uploader::new(client, &config, stats.clone()), stats)
}

fn object(bytes: &'static [u8]) -> Arc<ObjectFile> {
    Arc::new(
        ObjectFile::from_memory(ObjectKey::Vdso, "/fixtures/chain", bytes.into()).expect("fixture"),
    )
}

/// SHA-256 of the length and of the first and last 64 KiB (all of a
/// smaller file).
fn fingerprint(bytes: &[u8]) -> String {
    let edge = 64 << 10;
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    digest.update(&(bytes.len() as u64).to_le_bytes());
    if bytes.len() <= 2 * edge {
        digest.update(bytes);
    } else {
        digest.update(&bytes[..edge]);
        digest.update(&bytes[bytes.len() - edge..]);
    }
    digest
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn a_server_that_does_not_want_it_is_asked_by_build_id_alone() {
    let server = Arc::new(FakeServer::default());
    let address = serve(server.clone()).await;
    let (uploader, stats) = uploader(address);
    let chain = object(CHAIN);
    let build_id = chain.build_id().expect("build id").to_hex();
    assert_eq!(
        uploader.upload_one(&build_id, chain).await,
        Outcome::Skipped
    );
    assert_eq!(
        *server.calls.lock().expect("lock"),
        [Call::Should {
            hash: String::new()
        }],
        "no hash: nothing was read"
    );
    assert_eq!(
        stats
            .debuginfo_uploads_skipped
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_server_that_is_down_costs_one_failed_question() {
    // A port nothing listens on: bound, then let go.
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port");
    let (uploader, stats) = uploader(address);
    let chain = object(CHAIN);
    let build_id = chain.build_id().expect("build id").to_hex();
    assert!(matches!(
        uploader.upload_one(&build_id, chain).await,
        Outcome::Failed { .. }
    ));
    assert_eq!(
        stats
            .debuginfo_upload_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(uploader.budget.available(), BYTES_IN_FLIGHT, "nothing held");
}

#[tokio::test]
async fn an_object_that_cannot_name_anything_is_not_asked_about() {
    let server = Arc::new(FakeServer {
        wants: true,
        ..FakeServer::default()
    });
    let address = serve(server.clone()).await;
    let (uploader, _) = uploader(address);
    let stripped = object(CHAIN_STRIPPED);
    let build_id = stripped.build_id().expect("build id").to_hex();
    assert_eq!(
        uploader.upload_one(&build_id, stripped).await,
        Outcome::Skipped
    );
    assert!(server.calls.lock().expect("lock").is_empty());
}

/// A debug file of several chunks is fingerprinted and streamed whole,
/// in order, and the budget is whole again afterwards.
#[tokio::test]
async fn a_wanted_debug_file_is_hashed_then_streamed_in_chunks() {
    let server = Arc::new(FakeServer {
        wants: true,
        ..FakeServer::default()
    });
    let address = serve(server.clone()).await;
    let mut stripped =
        ObjectFile::from_memory(ObjectKey::Vdso, "/fixtures/chain", CHAIN_STRIPPED.into())
            .expect("fixture");
    let build_id = stripped.build_id().expect("build id").to_hex();
    // The unstripped build serves as the debug file; bytes after the ELF
    // contents make it span several chunks.
    let mut debug = CHAIN.to_vec();
    debug.extend((0..(5 * CHUNK / 2)).map(|i| (i % 251) as u8));
    let mut file = tempfile::tempfile().expect("tempfile");
    std::io::Write::write_all(&mut file, &debug).expect("debug file");
    stripped.debug_files = vec![DebugFile::new(
        "/debug/chain".into(),
        DebugFileKind::BuildId,
        file,
    )];
    let stripped = Arc::new(stripped);
    let (uploader, stats) = uploader(address);
    assert_eq!(
        uploader.upload_one(&build_id, stripped).await,
        Outcome::Uploaded
    );
    assert_eq!(
        *server.calls.lock().expect("lock"),
        [
            Call::Should {
                hash: String::new()
            },
            Call::Initiate {
                hash: fingerprint(&debug),
                size: debug.len() as i64
            },
            Call::Upload,
            Call::Finished,
        ]
    );
    assert!(*server.uploaded.lock().expect("lock") == debug);
    assert_eq!(
        stats
            .debuginfo_uploads
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(uploader.budget.available(), BYTES_IN_FLIGHT);
}

#[tokio::test]
async fn a_file_the_server_already_holds_is_not_streamed() {
    let server = Arc::new(FakeServer {
        wants: true,
        refuse: Some(tonic::Code::AlreadyExists),
        ..FakeServer::default()
    });
    let address = serve(server.clone()).await;
    let (uploader, _) = uploader(address);
    let chain = object(CHAIN);
    let build_id = chain.build_id().expect("build id").to_hex();
    assert_eq!(
        uploader.upload_one(&build_id, chain).await,
        Outcome::Skipped
    );
    let calls = server.calls.lock().expect("lock").clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[1],
        Call::Initiate {
            hash: fingerprint(CHAIN),
            size: CHAIN.len() as i64
        }
    );
}
