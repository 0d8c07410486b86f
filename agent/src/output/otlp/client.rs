//! Sending one export: gRPC (`ProfilesService/Export` over HTTP/2, TLS by
//! the same connector as Parca's) or HTTP (`POST
//! {endpoint}/v1development/profiles`, protobuf, over HTTP/1.1), gzipped,
//! at the release of the messages the receiver reads. Refusals are told
//! as gRPC statuses, HTTP ones mapped as the OTLP specification maps them,
//! and only the failures the specification calls retryable are retried.

use std::{str::FromStr, sync::Arc};

use http::{HeaderMap, StatusCode};
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
    delivery::{
        Failure, Pusher, causes,
        http::{
            Answer, HeaderEntry, HttpsClient, credential_headers, header_map, https_client, post,
            standard_headers, tls_client_config,
        },
    },
    parca::connect,
};

/// The path of the profiles signal, appended to an HTTP endpoint.
pub const HTTP_PATH: &str = "/v1development/profiles";

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
                let tls = tls_client_config(config.tls.as_ref()).map_err(tls_error)?;
                Ok(Self::Http(Box::new(HttpTarget {
                    endpoint,
                    headers: Arc::new(http_headers(config)?),
                    tls,
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
                OtlpClient::Http(Box::new(HttpClient {
                    client: https_client(&tls, https),
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
    let mut entries = standard_headers("application/x-protobuf");
    if config.gzip {
        entries.push(("content-encoding".into(), "gzip".into(), false));
    }
    entries.extend(credentials(config));
    header_map(entries).map_err(|key| OtlpError::Header { key })
}

/// The user's headers and the `authorization` their credentials make.
fn credentials(config: &OtlpConfig) -> Vec<HeaderEntry> {
    credential_headers(
        &config.headers,
        config.basic_auth.as_ref(),
        config.bearer_token.as_ref(),
    )
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
    client: HttpsClient,
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
                export(client, endpoint, headers, body).await?
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

async fn export(
    client: &HttpsClient,
    endpoint: &http::Uri,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Result<ExportProfilesServiceResponse, Status> {
    let Answer {
        status,
        content_type,
        body,
    } = post(client, endpoint, headers, body).await?;
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
