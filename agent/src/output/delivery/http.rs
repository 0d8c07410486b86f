//! What the HTTP/1.1 pushers (Pyroscope's Connect call, OTLP/HTTP) share:
//! the client, the headers every push carries with credentials marked
//! sensitive, and one POST whose answer is read up to a bound.

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tonic::Status;

use super::causes;
use crate::output::{
    parca::{ParcaError, Secret, TlsConfig, connect::client_config},
    pyroscope::BasicAuth,
};

pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// An answer (an error's body) is read up to this.
const MAX_ANSWER_BYTES: usize = 64 << 10;
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Must be called inside the runtime the client will run on. `https_only`
/// refuses a plaintext connection (the URL said `https://`).
pub fn https_client(tls: &rustls::ClientConfig, https_only: bool) -> HttpsClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    // The connector sets ALPN itself (HTTP/1.1) and refuses a preset.
    let mut tls = tls.clone();
    tls.alpn_protocols.clear();
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
    let connector = if https_only {
        builder.https_only()
    } else {
        builder.https_or_http()
    }
    .enable_http1()
    .wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The TLS settings of an `https://` endpoint; for an `http://` one
/// (`None`) a placeholder the connector wants but never uses.
pub fn tls_client_config(
    tls: Option<&TlsConfig>,
) -> Result<std::sync::Arc<rustls::ClientConfig>, ParcaError> {
    match tls {
        Some(tls) => client_config(tls),
        None => Ok(std::sync::Arc::new(
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|source| ParcaError::Tls { source })?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        )),
    }
}

/// A header as given: its name, its value, and whether it is a secret.
pub type HeaderEntry = (String, String, bool);

/// The user's headers and the `authorization` their credentials make, all
/// marked secret (a header may carry a token).
pub fn credential_headers(
    headers: &[(String, Secret)],
    basic_auth: Option<&BasicAuth>,
    bearer_token: Option<&Secret>,
) -> Vec<HeaderEntry> {
    let mut entries: Vec<HeaderEntry> = headers
        .iter()
        .map(|(key, value)| (key.to_ascii_lowercase(), value.expose().to_owned(), true))
        .collect();
    if let Some(auth) = basic_auth {
        let pair = format!("{}:{}", auth.username, auth.password.expose());
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        entries.push(("authorization".into(), format!("Basic {encoded}"), true));
    } else if let Some(token) = bearer_token {
        entries.push((
            "authorization".into(),
            format!("Bearer {}", token.expose()),
            true,
        ));
    }
    entries
}

/// A header map, secrets marked sensitive so the HTTP layers never print
/// them; `Err` names the header that is not a valid name or value.
pub fn header_map(entries: impl IntoIterator<Item = HeaderEntry>) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value, sensitive) in entries {
        let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| name.clone())?;
        let mut header_value = HeaderValue::from_str(&value).map_err(|_| name.clone())?;
        header_value.set_sensitive(sensitive);
        map.insert(header_name, header_value);
    }
    Ok(map)
}

/// The first headers of every push.
pub fn standard_headers(content_type: &str) -> Vec<HeaderEntry> {
    vec![
        ("content-type".into(), content_type.into(), false),
        (
            "user-agent".into(),
            concat!("firn/", env!("CARGO_PKG_VERSION")).into(),
            false,
        ),
    ]
}

/// What a server answered.
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    /// Up to [`MAX_ANSWER_BYTES`]; empty when it could not be read.
    pub body: Bytes,
}

/// One POST; a failure to reach the server is `Unavailable` (retried).
pub async fn post(
    client: &HttpsClient,
    endpoint: &http::Uri,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Result<Answer, Status> {
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
    Ok(Answer {
        status,
        content_type,
        body,
    })
}
