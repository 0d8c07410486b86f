//! The Connect protocol's unary call over HTTP/1.1 (rustls for `https`):
//! `POST {url}/push.v1.PusherService/Push` with a protobuf body, as
//! Pyroscope and Grafana Cloud serve it to Grafana Alloy. A refusal's
//! Connect error code is the gRPC one, so it is told as a [`Status`].

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use prost::Message;
use tonic::{Code, Status};

use super::{PushRequest, PyroscopeConfig, PyroscopeError};
use crate::output::delivery::{
    Pusher,
    http::{
        Answer, HttpsClient, credential_headers, header_map, https_client, post, standard_headers,
        tls_client_config,
    },
};

const PUSH_PATH: &str = "/push.v1.PusherService/Push";

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
        let tls = tls_client_config(config.tls.as_ref()).map_err(|source| PyroscopeError::Tls {
            source: Box::new(source),
        })?;
        Ok(Self {
            endpoint,
            headers: Arc::new(headers(config)?),
            tls,
            https: config.tls.is_some(),
        })
    }

    /// Must be called inside the runtime the client will run on.
    pub fn client(self) -> ConnectClient {
        ConnectClient {
            client: https_client(&self.tls, self.https),
            endpoint: self.endpoint,
            headers: self.headers,
        }
    }
}

/// The headers of every push; credentials are marked sensitive so the
/// HTTP layers never print them.
fn headers(config: &PyroscopeConfig) -> Result<HeaderMap, PyroscopeError> {
    let mut entries = standard_headers("application/proto");
    entries.push(("connect-protocol-version".into(), "1".into(), false));
    if let Some(tenant) = &config.tenant_id {
        entries.push(("x-scope-orgid".into(), tenant.clone(), false));
    }
    entries.extend(credential_headers(
        &config.headers,
        config.basic_auth.as_ref(),
        config.bearer_token.as_ref(),
    ));
    header_map(entries).map_err(|key| PyroscopeError::Header { key })
}

pub struct ConnectClient {
    client: HttpsClient,
    endpoint: http::Uri,
    headers: Arc<HeaderMap>,
}

impl Pusher for ConnectClient {
    type Request = PushRequest;

    async fn push(&mut self, request: PushRequest) -> Result<(), Status> {
        let Answer {
            status,
            content_type,
            body,
        } = post(
            &self.client,
            &self.endpoint,
            &self.headers,
            request.encode_to_vec(),
        )
        .await?;
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
