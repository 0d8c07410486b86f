//! The Connect protocol's unary call over HTTP/1.1 (rustls for `https`):
//! `POST {url}/push.v1.PusherService/Push` with a protobuf body, as
//! Pyroscope and Grafana Cloud serve it to Grafana Alloy. A refusal's
//! Connect error code is the gRPC one, so it is told as a [`Status`].

use std::sync::Arc;

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
use tonic::{Code, Status};

use super::{PushRequest, PyroscopeConfig, PyroscopeError};
use crate::output::{
    delivery::{Pusher, causes},
    parca::connect::client_config,
};

const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// An answer (an error's JSON) is read up to this.
const MAX_ANSWER_BYTES: usize = 64 << 10;
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Checked settings and the headers every push carries; the client is
/// made inside the network thread's runtime.
#[derive(Clone)]
pub struct Target {
    endpoint: http::Uri,
    headers: Arc<HeaderMap>,
    tls: Arc<rustls::ClientConfig>,
    https: bool,
}

impl Target {
    pub fn new(config: &PyroscopeConfig) -> Result<Self, PyroscopeError> {
        let endpoint = format!("{}{PUSH_PATH}", config.url.trim_end_matches('/'));
        let endpoint: http::Uri = endpoint.parse().map_err(|_| PyroscopeError::Url {
            url: config.url.clone(),
        })?;
        let tls_error = |source| PyroscopeError::Tls {
            source: Box::new(source),
        };
        let tls = match &config.tls {
            Some(tls) => client_config(tls).map_err(tls_error)?,
            // Never used: the URL said http://, but the connector wants one.
            None => Arc::new(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map_err(|source| tls_error(crate::output::parca::ParcaError::Tls { source }))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            ),
        };
        // The connector sets ALPN itself (HTTP/1.1) and refuses a preset.
        let mut tls = (*tls).clone();
        tls.alpn_protocols.clear();
        Ok(Self {
            endpoint,
            headers: Arc::new(headers(config)?),
            tls: Arc::new(tls),
            https: config.tls.is_some(),
        })
    }

    /// Must be called inside the runtime the client will run on.
    pub fn client(self) -> ConnectClient {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let builder =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config((*self.tls).clone());
        let https = if self.https {
            builder.https_only()
        } else {
            builder.https_or_http()
        }
        .enable_http1()
        .wrap_connector(http);
        ConnectClient {
            client: Client::builder(TokioExecutor::new()).build(https),
            endpoint: self.endpoint,
            headers: self.headers,
        }
    }
}

/// The headers of every push; credentials are marked sensitive so the
/// HTTP layers never print them.
fn headers(config: &PyroscopeConfig) -> Result<HeaderMap, PyroscopeError> {
    let mut map = HeaderMap::new();
    let mut insert = |name: &str, value: &str, sensitive: bool| {
        let header_name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| PyroscopeError::Header {
                key: name.to_owned(),
            })?;
        let mut value = HeaderValue::from_str(value).map_err(|_| PyroscopeError::Header {
            key: name.to_owned(),
        })?;
        value.set_sensitive(sensitive);
        map.insert(header_name, value);
        Ok::<_, PyroscopeError>(())
    };
    insert("content-type", "application/proto", false)?;
    insert("connect-protocol-version", "1", false)?;
    insert(
        "user-agent",
        concat!("firn/", env!("CARGO_PKG_VERSION")),
        false,
    )?;
    for (key, value) in &config.headers {
        insert(key, value.expose(), true)?;
    }
    if let Some(tenant) = &config.tenant_id {
        insert("x-scope-orgid", tenant, false)?;
    }
    if let Some(auth) = &config.basic_auth {
        let pair = format!("{}:{}", auth.username, auth.password.expose());
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        insert("authorization", &format!("Basic {encoded}"), true)?;
    } else if let Some(token) = &config.bearer_token {
        insert("authorization", &format!("Bearer {}", token.expose()), true)?;
    }
    Ok(map)
}

pub struct ConnectClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    endpoint: http::Uri,
    headers: Arc<HeaderMap>,
}

impl Pusher for ConnectClient {
    type Request = PushRequest;

    async fn push(&mut self, request: PushRequest) -> Result<(), Status> {
        let mut http_request = Request::post(self.endpoint.clone())
            .body(Full::new(Bytes::from(request.encode_to_vec())))
            .map_err(|error| Status::internal(error.to_string()))?;
        http_request
            .headers_mut()
            .extend(self.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
        let response = self
            .client
            .request(http_request)
            .await
            .map_err(|error| Status::unavailable(error_chain(&error)))?;
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
            return Ok(());
        }
        Err(refusal(status, &content_type, &body))
    }

    fn credentials_hint(&self) -> &'static str {
        "--pyroscope-basic-auth-username / --pyroscope-basic-auth-password[-file] / \
         --pyroscope-bearer-token[-file] / --pyroscope-tenant-id"
    }
}

/// What the cause chain of a failed request says, on one line.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    causes(vec![error.to_string()], error.source())
}

#[derive(serde::Deserialize)]
struct ConnectError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// A Connect error (`{"code": "invalid_argument", "message": ...}`), or a
/// proxy's bare HTTP status told as the Connect specification maps it.
pub fn refusal(status: StatusCode, content_type: &str, body: &[u8]) -> Status {
    let parsed = content_type
        .starts_with("application/json")
        .then(|| serde_json::from_slice::<ConnectError>(body).ok())
        .flatten();
    if let Some(error) = parsed
        && let Some(code) = connect_code(&error.code)
    {
        return Status::new(code, format!("HTTP {}: {}", status.as_u16(), error.message));
    }
    let code = match status {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    Status::new(code, format!("HTTP {}: {}", status.as_u16(), text.trim()))
}

fn connect_code(name: &str) -> Option<Code> {
    Some(match name {
        "canceled" => Code::Cancelled,
        "unknown" => Code::Unknown,
        "invalid_argument" => Code::InvalidArgument,
        "deadline_exceeded" => Code::DeadlineExceeded,
        "not_found" => Code::NotFound,
        "already_exists" => Code::AlreadyExists,
        "permission_denied" => Code::PermissionDenied,
        "resource_exhausted" => Code::ResourceExhausted,
        "failed_precondition" => Code::FailedPrecondition,
        "aborted" => Code::Aborted,
        "out_of_range" => Code::OutOfRange,
        "unimplemented" => Code::Unimplemented,
        "internal" => Code::Internal,
        "unavailable" => Code::Unavailable,
        "data_loss" => Code::DataLoss,
        "unauthenticated" => Code::Unauthenticated,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::parca::Secret;

    #[test]
    fn connect_errors_keep_their_code_and_bare_statuses_are_mapped() {
        let error = refusal(
            StatusCode::BAD_REQUEST,
            "application/json",
            br#"{"code":"invalid_argument","message":"service_name is required"}"#,
        );
        assert_eq!(error.code(), Code::InvalidArgument);
        assert!(error.message().contains("service_name is required"));
        let proxy = refusal(StatusCode::UNAUTHORIZED, "text/plain", b"Unauthorized\n");
        assert_eq!(proxy.code(), Code::Unauthenticated);
        assert_eq!(
            refusal(StatusCode::SERVICE_UNAVAILABLE, "", b"").code(),
            Code::Unavailable
        );
    }

    #[test]
    fn credentials_become_sensitive_headers() {
        let config = PyroscopeConfig {
            name: "pyroscope".into(),
            url: "https://profiles.example.com".into(),
            tls: None,
            basic_auth: Some(super::super::BasicAuth {
                username: "123".into(),
                password: Secret::new("secret".into()),
            }),
            bearer_token: None,
            tenant_id: Some("team-a".into()),
            headers: vec![("x-extra".into(), Secret::new("1".into()))],
            queue_bytes: 1 << 20,
            request_timeout: std::time::Duration::from_secs(1),
        };
        let map = headers(&config).expect("valid");
        let auth = map.get("authorization").expect("auth");
        assert!(auth.is_sensitive());
        assert_eq!(auth, "Basic MTIzOnNlY3JldA==");
        assert_eq!(map.get("x-scope-orgid").expect("tenant"), "team-a");
        assert!(!format!("{map:?}").contains("MTIzOnNlY3JldA"));
    }
}
