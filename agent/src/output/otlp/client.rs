//! Sending one export: gRPC (`ProfilesService/Export` over HTTP/2, TLS by
//! the same connector as Parca's) or HTTP (`POST
//! {endpoint}/v1development/profiles`, protobuf, over HTTP/1.1), gzipped,
//! at the release of the messages the receiver reads. Refusals are told
//! as gRPC statuses, HTTP ones mapped as the OTLP specification maps them,
//! and only the failures the specification calls retryable are retried.

use std::{str::FromStr, sync::Arc};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use prost::Message;
use tonic::{
    Code, Status,
    codec::CompressionEncoding,
    metadata::{AsciiMetadataKey, AsciiMetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};
use tracing::{debug, warn};

use super::{
    OtlpConfig, OtlpError, OtlpRequest, ProfilesVersion, Protocol,
    proto::{self, ExportProfilesServiceResponse, legacy},
};
use crate::output::{
    delivery::{Failure, Pusher, causes},
    parca::connect::{self, client_config},
};

/// The path of the profiles signal, appended to an HTTP endpoint.
pub const HTTP_PATH: &str = "/v1development/profiles";
const MAX_ANSWER_BYTES: usize = 64 << 10;
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Checked settings; the client is made inside the network thread's
/// runtime.
#[derive(Clone)]
pub enum Target {
    Grpc(Box<GrpcTarget>),
    Http(Box<HttpTarget>),
}

#[derive(Clone)]
pub struct GrpcTarget {
    target: connect::Target,
    metadata: Metadata,
    version: ProfilesVersion,
    gzip: bool,
}

#[derive(Clone)]
pub struct HttpTarget {
    endpoint: http::Uri,
    headers: Arc<HeaderMap>,
    tls: Arc<rustls::ClientConfig>,
    https: bool,
    gzip: bool,
    version: ProfilesVersion,
}

/// The credentials and extra headers as `(name, value, sensitive)`.
fn credentials(config: &OtlpConfig) -> Vec<(String, String, bool)> {
    let mut pairs: Vec<(String, String, bool)> = config
        .headers
        .iter()
        .map(|(key, value)| (key.to_ascii_lowercase(), value.expose().to_owned(), true))
        .collect();
    if let Some(auth) = &config.basic_auth {
        let pair = format!("{}:{}", auth.username, auth.password.expose());
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        pairs.push(("authorization".into(), format!("Basic {encoded}"), true));
    } else if let Some(token) = &config.bearer_token {
        pairs.push((
            "authorization".into(),
            format!("Bearer {}", token.expose()),
            true,
        ));
    }
    pairs
}

impl Target {
    pub fn new(config: &OtlpConfig) -> Result<Self, OtlpError> {
        let uri: http::Uri = config.endpoint.parse().map_err(|_| OtlpError::Endpoint {
            endpoint: config.endpoint.clone(),
        })?;
        let tls_error = |source| OtlpError::Tls {
            source: Box::new(source),
        };
        match config.protocol {
            Protocol::Grpc => {
                let authority = uri.authority().ok_or_else(|| OtlpError::Endpoint {
                    endpoint: config.endpoint.clone(),
                })?;
                // gRPC needs a port; OTLP's is 4317.
                let address = match authority.port_u16() {
                    Some(_) => authority.to_string(),
                    None => format!("{authority}:4317"),
                };
                let target =
                    connect::grpc_target(&address, config.tls.as_ref(), config.request_timeout)
                        .map_err(tls_error)?;
                Ok(Self::Grpc(Box::new(GrpcTarget {
                    target,
                    metadata: Metadata::new(config)?,
                    version: config.version,
                    gzip: config.gzip,
                })))
            }
            Protocol::Http => {
                // A base URL gets the signal's path, as OpenTelemetry's
                // exporters add it; a full one is taken as it is.
                let base = config.endpoint.trim_end_matches('/');
                let endpoint = if base.ends_with(HTTP_PATH) {
                    base.to_owned()
                } else {
                    format!("{base}{HTTP_PATH}")
                };
                let endpoint: http::Uri = endpoint.parse().map_err(|_| OtlpError::Endpoint {
                    endpoint: config.endpoint.clone(),
                })?;
                let tls = match &config.tls {
                    Some(tls) => client_config(tls).map_err(tls_error)?,
                    // Never used: the endpoint said http://, but the
                    // connector wants one.
                    None => Arc::new(
                        rustls::ClientConfig::builder_with_provider(Arc::new(
                            rustls::crypto::ring::default_provider(),
                        ))
                        .with_safe_default_protocol_versions()
                        .map_err(|source| {
                            tls_error(crate::output::parca::ParcaError::Tls { source })
                        })?
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                    ),
                };
                // The connector sets ALPN itself (HTTP/1.1) and refuses a
                // preset.
                let mut tls = (*tls).clone();
                tls.alpn_protocols.clear();
                Ok(Self::Http(Box::new(HttpTarget {
                    endpoint,
                    headers: Arc::new(http_headers(config)?),
                    tls: Arc::new(tls),
                    https: config.tls.is_some(),
                    gzip: config.gzip,
                    version: config.version,
                })))
            }
        }
    }

    /// Must be called inside the runtime the client will run on.
    pub fn client(self) -> OtlpClient {
        match self {
            Self::Grpc(grpc) => {
                let GrpcTarget {
                    target,
                    metadata,
                    version,
                    gzip,
                } = *grpc;
                let channel = target.channel();
                match version {
                    ProfilesVersion::V1_10 => {
                        let client =
                            proto::ProfilesServiceClient::with_interceptor(channel, metadata);
                        OtlpClient::Grpc(if gzip {
                            // A server answers in the encoding it was sent.
                            client
                                .send_compressed(CompressionEncoding::Gzip)
                                .accept_compressed(CompressionEncoding::Gzip)
                        } else {
                            client
                        })
                    }
                    ProfilesVersion::V1_9 => {
                        let client =
                            legacy::ProfilesServiceClient::with_interceptor(channel, metadata);
                        OtlpClient::GrpcV1_9(if gzip {
                            // A server answers in the encoding it was sent.
                            client
                                .send_compressed(CompressionEncoding::Gzip)
                                .accept_compressed(CompressionEncoding::Gzip)
                        } else {
                            client
                        })
                    }
                }
            }
            Self::Http(target) => {
                let HttpTarget {
                    endpoint,
                    headers,
                    tls,
                    https,
                    gzip,
                    version,
                } = *target;
                let mut http = HttpConnector::new();
                http.enforce_http(false);
                http.set_nodelay(true);
                http.set_connect_timeout(Some(CONNECT_TIMEOUT));
                let builder =
                    hyper_rustls::HttpsConnectorBuilder::new().with_tls_config((*tls).clone());
                let connector = if https {
                    builder.https_only()
                } else {
                    builder.https_or_http()
                }
                .enable_http1()
                .wrap_connector(http);
                OtlpClient::Http(Box::new(HttpClient {
                    client: Client::builder(TokioExecutor::new()).build(connector),
                    endpoint,
                    headers,
                    gzip,
                    version,
                }))
            }
        }
    }
}

fn http_headers(config: &OtlpConfig) -> Result<HeaderMap, OtlpError> {
    let mut map = HeaderMap::new();
    let mut insert = |name: &str, value: &str, sensitive: bool| {
        let invalid = || OtlpError::Header {
            key: name.to_owned(),
        };
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
        let mut value = HeaderValue::from_str(value).map_err(|_| invalid())?;
        value.set_sensitive(sensitive);
        map.insert(name, value);
        Ok::<_, OtlpError>(())
    };
    insert("content-type", "application/x-protobuf", false)?;
    insert(
        "user-agent",
        concat!("firn/", env!("CARGO_PKG_VERSION")),
        false,
    )?;
    if config.gzip {
        insert("content-encoding", "gzip", false)?;
    }
    for (name, value, sensitive) in credentials(config) {
        insert(&name, &value, sensitive)?;
    }
    Ok(map)
}

/// gRPC metadata on every export; credentials marked sensitive.
#[derive(Clone)]
pub struct Metadata {
    headers: Arc<Vec<(AsciiMetadataKey, AsciiMetadataValue)>>,
}

impl Metadata {
    fn new(config: &OtlpConfig) -> Result<Self, OtlpError> {
        let mut headers = Vec::new();
        for (name, value, sensitive) in credentials(config) {
            let invalid = || OtlpError::Header { key: name.clone() };
            let key = AsciiMetadataKey::from_str(&name).map_err(|_| invalid())?;
            let mut value = AsciiMetadataValue::try_from(value.as_str()).map_err(|_| invalid())?;
            value.set_sensitive(sensitive);
            headers.push((key, value));
        }
        Ok(Self {
            headers: Arc::new(headers),
        })
    }
}

impl Interceptor for Metadata {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        for (key, value) in self.headers.iter() {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        Ok(request)
    }
}

type Intercepted = InterceptedService<Channel, Metadata>;

pub enum OtlpClient {
    Grpc(proto::ProfilesServiceClient<Intercepted>),
    GrpcV1_9(legacy::ProfilesServiceClient<Intercepted>),
    Http(Box<HttpClient>),
}

pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    endpoint: http::Uri,
    headers: Arc<HeaderMap>,
    gzip: bool,
    version: ProfilesVersion,
}

/// A conversion failure is firn's, not the receiver's: told as a refusal
/// so the profiles are counted and never retried.
fn unconvertible(error: &super::convert::ConvertError) -> Status {
    Status::invalid_argument(causes(
        vec![error.to_string()],
        std::error::Error::source(error),
    ))
}

impl Pusher for OtlpClient {
    type Request = OtlpRequest;

    async fn push(&mut self, request: OtlpRequest) -> Result<(), Status> {
        let message = request.build().map_err(|error| unconvertible(&error))?;
        debug!(
            series = message.resource_profiles.len(),
            bytes = message.encoded_len(),
            "OTLP request built"
        );
        let response = match self {
            Self::Grpc(client) => client.export(message).await?.into_inner(),
            Self::GrpcV1_9(client) => client
                .export(legacy::from_current(message))
                .await?
                .into_inner(),
            Self::Http(http) => {
                let HttpClient {
                    client,
                    endpoint,
                    headers,
                    gzip,
                    version,
                } = http.as_ref();
                let body = match version {
                    ProfilesVersion::V1_10 => message.encode_to_vec(),
                    ProfilesVersion::V1_9 => legacy::from_current(message).encode_to_vec(),
                };
                let body = if *gzip { gzipped(&body) } else { body };
                post(client, endpoint, headers, body).await?
            }
        };
        if let Some(partial) = response.partial_success
            && (partial.rejected_profiles > 0 || !partial.error_message.is_empty())
        {
            warn!(
                rejected_profiles = partial.rejected_profiles,
                message = partial.error_message,
                "the receiver took the export in part"
            );
        }
        Ok(())
    }

    fn credentials_hint(&self) -> &'static str {
        "--otlp-headers / --otlp-bearer-token[-file] / --otlp-basic-auth-username"
    }

    /// Retryable as the OTLP specification lists them; everything else is
    /// final, so a receiver that will never take the profiles is not asked
    /// again and again.
    fn classify(&self, code: Code) -> Failure {
        match code {
            Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unavailable
            | Code::DataLoss
            | Code::ResourceExhausted => Failure::Retry,
            _ => Failure::Reject,
        }
    }

    fn hint(&self, code: Code) -> String {
        match code {
            Code::Unauthenticated | Code::PermissionDenied => {
                format!(" (check {})", self.credentials_hint())
            }
            Code::Unimplemented | Code::NotFound => " (check --otlp-endpoint and --otlp-protocol; \
                 an OpenTelemetry Collector takes profiles only with \
                 --feature-gates=service.profilesSupport)"
                .to_owned(),
            Code::InvalidArgument => " (check --otlp-profiles-version: the receiver may read \
                 another release of the profiles messages)"
                .to_owned(),
            _ => String::new(),
        }
    }
}

fn gzipped(body: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

async fn post(
    client: &Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    endpoint: &http::Uri,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Result<ExportProfilesServiceResponse, Status> {
    let mut request = Request::post(endpoint.clone())
        .body(Full::new(Bytes::from(body)))
        .map_err(|error| Status::internal(error.to_string()))?;
    request
        .headers_mut()
        .extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    let response = client.request(request).await.map_err(|error| {
        Status::unavailable(causes(
            vec![error.to_string()],
            std::error::Error::source(&error),
        ))
    })?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .unwrap_or_default();
    if status.is_success() {
        return Ok(if content_type.contains("protobuf") {
            ExportProfilesServiceResponse::decode(body).unwrap_or_default()
        } else {
            ExportProfilesServiceResponse::default()
        });
    }
    Err(refusal(status, &content_type, &body))
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// An OTLP/HTTP error as a status: the codes the specification retries
/// (429, 502, 503, 504) as `Unavailable`, the others final.
pub fn refusal(status: StatusCode, content_type: &str, body: &[u8]) -> Status {
    let text = if content_type.contains("protobuf") {
        RpcStatus::decode(body)
            .map(|status| status.message)
            .unwrap_or_default()
    } else {
        String::from_utf8_lossy(&body[..body.len().min(200)])
            .trim()
            .to_owned()
    };
    let code = match status {
        StatusCode::BAD_REQUEST
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::UNSUPPORTED_MEDIA_TYPE => Code::InvalidArgument,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        // A gRPC refusal passed on as a bare 500 (Pyroscope does so): its
        // code says more than the status.
        _ if text.contains("code = InvalidArgument") => Code::InvalidArgument,
        _ => Code::Internal,
    };
    Status::new(code, format!("HTTP {}: {text}", status.as_u16()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_errors_are_retried_only_where_the_specification_says() {
        let client_codes = [
            (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
            (StatusCode::NOT_FOUND, Code::Unimplemented),
            (StatusCode::BAD_REQUEST, Code::InvalidArgument),
            (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            (StatusCode::TOO_MANY_REQUESTS, Code::Unavailable),
            (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
        ];
        for (status, code) in client_codes {
            assert_eq!(
                refusal(status, "text/plain", b"no").code(),
                code,
                "{status}"
            );
        }
        let body = RpcStatus {
            code: 3,
            message: "bad profiles".into(),
        }
        .encode_to_vec();
        let status = refusal(StatusCode::BAD_REQUEST, "application/x-protobuf", &body);
        assert!(status.message().contains("bad profiles"), "{status:?}");
        let passed_on = refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            b"rpc error: code = InvalidArgument desc = sample value is required",
        );
        assert_eq!(passed_on.code(), Code::InvalidArgument);
    }
}
