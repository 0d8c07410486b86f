//! A profile store of the test's own: tonic behind rustls with a
//! certificate from a CA the test makes, demanding a bearer token. It keeps
//! what it accepted and what credentials it was shown.

use std::{
    net::SocketAddr,
    path::Path,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use firn::output::parca::profilestore::{
    RawProfileSeries, WriteRawRequest, WriteRawResponse,
    profile_store_service_server::{ProfileStoreService, ProfileStoreServiceServer},
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
};
use tokio_rustls::{TlsAcceptor, rustls};
use tonic::{Request, Response, Status, transport::server::Connected};

/// Every call the server saw.
#[derive(Default)]
pub struct Seen {
    /// Series accepted.
    pub series: Vec<RawProfileSeries>,
    /// The `authorization` values of calls refused.
    pub refused_credentials: Vec<String>,
    /// Calls accepted.
    pub accepted_calls: usize,
}

struct Store {
    expected: String,
    seen: Arc<Mutex<Seen>>,
}

#[tonic::async_trait]
impl ProfileStoreService for Store {
    async fn write_raw(
        &self,
        request: Request<WriteRawRequest>,
    ) -> Result<Response<WriteRawResponse>, Status> {
        let credentials = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut seen = self.seen.lock().expect("lock");
        if credentials != self.expected {
            seen.refused_credentials.push(credentials);
            return Err(Status::unauthenticated("invalid bearer token"));
        }
        seen.accepted_calls += 1;
        seen.series.extend(request.into_inner().series);
        Ok(Response::new(WriteRawResponse {}))
    }
}

/// A CA (written to `dir/name.pem`) and a certificate for 127.0.0.1 it signed.
pub struct Authority {
    pub pem_path: std::path::PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Authority {
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("firn test CA {name}"));
        let ca = CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let pem_path = dir.join(format!("{name}.pem"));
        std::fs::write(&pem_path, ca.pem()).expect("CA file");
        Self { pem_path, ca }
    }

    /// A server configuration for HTTP/1.1 (an HTTPS server of a test's
    /// own) with a certificate this CA signed.
    pub fn https_config(&self) -> rustls::ServerConfig {
        let mut config = self.server_config();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }

    /// A certificate for 127.0.0.1 this CA signed and its key, written as
    /// PEM to `dir/server.pem` and `dir/server.key` (for a server that
    /// reads files).
    pub fn server_files(&self, dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let key = KeyPair::generate().expect("server key");
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("server params");
        let leaf = params
            .signed_by(&key, &self.ca)
            .expect("server certificate");
        let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
        std::fs::write(&cert_path, format!("{}{}", leaf.pem(), self.ca.pem())).expect("cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("key");
        (cert_path, key_path)
    }

    fn server_config(&self) -> rustls::ServerConfig {
        let key = KeyPair::generate().expect("server key");
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("server params");
        let leaf = params
            .signed_by(&key, &self.ca)
            .expect("server certificate");
        let chain = vec![leaf.der().clone(), self.ca.der().clone()];
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server TLS config");
        config.alpn_protocols = vec![b"h2".to_vec()];
        config
    }
}

/// The server, running on its own thread until dropped.
pub struct TlsStore {
    pub address: SocketAddr,
    pub seen: Arc<Mutex<Seen>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsStore {
    pub fn start(authority: &Authority, token: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let acceptor = TlsAcceptor::from(Arc::new(authority.server_config()));
        let store = Store {
            expected: format!("Bearer {token}"),
            seen: seen.clone(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("binds a loopback port");
        let address = listener.local_addr().expect("bound");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                // Handshakes run in their own tasks: one client failing TLS
                // must not hold up the others.
                let (sender, receiver) = tokio::sync::mpsc::channel::<std::io::Result<Tls>>(16);
                tokio::spawn(async move {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            break;
                        };
                        let acceptor = acceptor.clone();
                        let sender = sender.clone();
                        tokio::spawn(async move {
                            // A refused handshake is the client's problem.
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                let _ = sender.send(Ok(Tls(stream))).await;
                            }
                        });
                    }
                });
                let incoming = tokio_stream::wrappers::ReceiverStream::new(receiver);
                let _ = tonic::transport::Server::builder()
                    .add_service(ProfileStoreServiceServer::new(store))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Self {
            address,
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for TlsStore {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A server-side TLS stream tonic can serve.
pub struct Tls(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for Tls {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Tls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
