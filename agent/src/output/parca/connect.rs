//! The gRPC channel to the remote store: TCP, then TLS (rustls: the
//! system's roots plus `--remote-store-ca-file`) unless plaintext was asked
//! for, and the metadata every request carries (bearer token, extra
//! headers). tonic reconnects the channel by itself after failures.

use std::{
    future::Future,
    io,
    pin::Pin,
    str::FromStr,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature},
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tonic::{
    Request, Status,
    metadata::{AsciiMetadataKey, AsciiMetadataValue},
    service::Interceptor,
    transport::{Channel, Endpoint, Uri},
};
use tracing::{debug, warn};

use super::{
    ParcaError,
    config::{RemoteStoreConfig, TlsConfig},
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// Where and how to connect, checked (address, TLS roots) but not yet
/// connected; made before the network thread starts so a bad setting
/// stops firn at once.
#[derive(Clone)]
pub struct Target {
    endpoint: Endpoint,
    connector: Connector,
}

impl Target {
    /// A lazily connected channel: nothing touches the network until the
    /// first request, so a server that is down at start delays nothing.
    /// Must be called inside the runtime the channel will run on.
    pub fn channel(self) -> Channel {
        self.endpoint.connect_with_connector_lazy(self.connector)
    }
}

pub fn target(config: &RemoteStoreConfig) -> Result<Target, ParcaError> {
    grpc_target(&config.address, config.tls.as_ref(), config.request_timeout)
}

/// A gRPC server at `address` (`host:port`), over TLS when `tls` is given:
/// what every gRPC exporter connects with.
pub fn grpc_target(
    address: &str,
    tls: Option<&TlsConfig>,
    request_timeout: Duration,
) -> Result<Target, ParcaError> {
    let tls = tls.map(client_config).transpose()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(|source| ParcaError::Address {
            address: address.to_owned(),
            source,
        })?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(request_timeout)
        .http2_keep_alive_interval(KEEP_ALIVE)
        .tcp_nodelay(true)
        .user_agent(concat!("firn/", env!("CARGO_PKG_VERSION")))
        .map_err(|source| ParcaError::Address {
            address: address.to_owned(),
            source,
        })?;
    Ok(Target {
        endpoint,
        connector: Connector { tls },
    })
}

/// The rustls configuration: TLS 1.2/1.3 with ring, HTTP/2 by ALPN.
pub fn client_config(tls: &TlsConfig) -> Result<Arc<ClientConfig>, ParcaError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| ParcaError::Tls { source })?;
    let mut config = if tls.skip_verify {
        warn!("TLS certificate verification is off (--remote-store-insecure-skip-verify)");
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate { provider }))
            .with_no_client_auth()
    } else {
        builder
            .with_root_certificates(root_store(&tls.extra_roots)?)
            .with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn root_store(extra_roots: &[Vec<u8>]) -> Result<RootCertStore, ParcaError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        debug!(%error, "a system certificate could not be loaded");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    debug!(added, ignored, "system root certificates");
    for der in extra_roots {
        roots
            .add(CertificateDer::from(der.clone()))
            .map_err(|source| ParcaError::Certificate { source })?;
    }
    if roots.is_empty() {
        warn!(
            "no trusted root certificates: TLS connections will fail (see --remote-store-ca-file)"
        );
    }
    Ok(roots)
}

/// Metadata added to every request. The token is marked sensitive so the
/// HTTP layers never print it.
#[derive(Clone)]
pub struct RequestMetadata {
    headers: Arc<Vec<(AsciiMetadataKey, AsciiMetadataValue)>>,
}

impl RequestMetadata {
    pub fn new(config: &RemoteStoreConfig) -> Result<Self, ParcaError> {
        let mut headers = Vec::new();
        for (key, value) in &config.grpc_headers {
            let name = AsciiMetadataKey::from_str(key)
                .map_err(|_| ParcaError::Header { key: key.clone() })?;
            let mut value = AsciiMetadataValue::try_from(value.expose())
                .map_err(|_| ParcaError::Header { key: key.clone() })?;
            value.set_sensitive(true);
            headers.push((name, value));
        }
        if let Some(token) = &config.bearer_token {
            let mut value = AsciiMetadataValue::try_from(format!("Bearer {}", token.expose()))
                .map_err(|_| ParcaError::Header {
                    key: "authorization".into(),
                })?;
            value.set_sensitive(true);
            headers.push((AsciiMetadataKey::from_static("authorization"), value));
        }
        Ok(Self {
            headers: Arc::new(headers),
        })
    }
}

impl Interceptor for RequestMetadata {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        for (key, value) in self.headers.iter() {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        Ok(request)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the address {uri} has no host or port")]
    Address { uri: String },
    #[error("could not connect to {address}")]
    Tcp {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("{host} is not a valid TLS server name")]
    ServerName { host: String },
    #[error("TLS handshake with {address} failed")]
    Handshake {
        address: String,
        #[source]
        source: io::Error,
    },
}

/// TCP, then TLS when configured; errors name the address and the cause
/// (e.g. an unknown certificate issuer) instead of a bare "transport error".
#[derive(Clone)]
struct Connector {
    tls: Option<Arc<ClientConfig>>,
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else {
                return Err(ConnectError::Address {
                    uri: uri.to_string(),
                });
            };
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let address = format!("{}:{port}", uri.host().unwrap_or_default());
            let tcp = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|source| ConnectError::Tcp {
                    address: address.clone(),
                    source,
                })?;
            let _ = tcp.set_nodelay(true);
            let Some(tls) = tls else {
                return Ok(TokioIo::new(Stream::Plain(tcp)));
            };
            let name = ServerName::try_from(host.clone())
                .map_err(|_| ConnectError::ServerName { host })?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|source| ConnectError::Handshake { address, source })?;
            Ok(TokioIo::new(Stream::Tls(Box::new(stream))))
        })
    }
}

pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(stream) => stream.is_write_vectored(),
            Self::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

/// `--remote-store-insecure-skip-verify`: any certificate is accepted, but
/// the handshake signatures are still checked so the session is sound.
#[derive(Debug)]
struct AcceptAnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
