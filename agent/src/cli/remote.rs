//! The agent's flags for the remote store, the series labels and debuginfo
//! uploads, named as Parca Agent names them so a DaemonSet's arguments
//! carry over; converted into the plain `config` structs.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{parse_period, parse_store_bytes};
use crate::{
    labels::MetadataConfig,
    output::parca::{DebuginfoConfig, RemoteStoreConfig, Secret, TlsConfig},
};

#[derive(Args, Debug, Clone)]
pub struct RemoteStoreArgs {
    /// The Parca server, `host:port` (e.g. localhost:7070); profiles go
    /// there instead of the local store.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_address)]
    pub remote_store_address: Option<String>,

    /// Sent as `authorization: Bearer <token>`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "PARCA_BEARER_TOKEN",
        hide_env_values = true,
        conflicts_with = "remote_store_bearer_token_file"
    )]
    pub remote_store_bearer_token: Option<String>,

    /// A file holding the bearer token.
    #[arg(long, value_name = "FILE")]
    pub remote_store_bearer_token_file: Option<PathBuf>,

    /// Plaintext gRPC instead of TLS.
    #[arg(long, conflicts_with_all = ["remote_store_insecure_skip_verify", "remote_store_ca_file"])]
    pub remote_store_insecure: bool,

    /// TLS without checking the server's certificate.
    #[arg(long)]
    pub remote_store_insecure_skip_verify: bool,

    /// PEM certificates trusted on top of the system's roots.
    #[arg(long, value_name = "FILE")]
    pub remote_store_ca_file: Option<PathBuf>,

    /// gRPC metadata sent with every request: `key=value;key2=value2`.
    #[arg(long, value_name = "HEADERS", value_parser = parse_headers)]
    pub remote_store_grpc_headers: Vec<KeyValues>,

    /// Unsent profiles kept while the server is slow or down; the oldest
    /// are dropped (and counted) beyond this (at least 1KiB). A few
    /// minutes of a busy node's profiles: a larger queue would be most of
    /// firn's memory.
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = parse_store_bytes)]
    pub remote_store_queue_bytes: u64,

    /// Longest a single push may take before it is retried (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_period)]
    pub remote_store_rpc_unary_timeout: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct DebuginfoArgs {
    /// Never upload debug information to the remote store.
    #[arg(long)]
    pub debuginfo_upload_disable: bool,

    /// Offer the server the objects firn named completely itself too (as
    /// Parca Agent, which names nothing, offers all). By default only
    /// objects with frames firn could not name are offered: the server
    /// stores named frames as sent, and uploading a large binary costs
    /// about a millisecond of CPU per MB.
    #[arg(long)]
    pub debuginfo_upload_symbolized: bool,

    /// Uploads at once.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub debuginfo_upload_max_parallel: u64,

    /// Longest one upload may take (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_period)]
    pub debuginfo_upload_timeout_duration: Duration,
}

/// `key=value` pairs from a `;`-separated flag value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValues(pub Vec<(String, String)>);

/// Flag values that are well-formed but do not make a usable configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("could not read the bearer token file {path}")]
    TokenFile {
        path: String,
        #[source]
        source: crate::untrusted::OpenError,
    },
    #[error("the bearer token file {path} is empty")]
    EmptyTokenFile { path: String },
    #[error("could not read the CA file {path}")]
    CaFile {
        path: String,
        #[source]
        source: crate::untrusted::OpenError,
    },
    #[error("the CA file {path} holds no PEM certificate")]
    NoCertificates { path: String },
    #[error("the {flag} key `{key}` is given twice")]
    DuplicateKey { flag: &'static str, key: String },
    #[error("--{flag} only applies with --remote-store-address")]
    NeedsRemoteStore { flag: &'static str },
    #[error("--{flag} only applies with --pyroscope-url")]
    NeedsPyroscope { flag: &'static str },
    #[error("--{flag} only applies with --otlp-endpoint")]
    NeedsOtlp { flag: &'static str },
    #[error(
        "--collect-kernel-profile=false and --collect-user-profile=false leave nothing to sample"
    )]
    NoStacks,
    #[error(
        "destinations[{index}] must name one server: remote-store-address (Parca), \
         pyroscope-url (Pyroscope) or otlp-endpoint (OTLP)"
    )]
    DestinationKind { index: usize },
    #[error("{given} needs {missing}")]
    Incomplete {
        given: &'static str,
        missing: &'static str,
    },
    #[error("could not tell the host name for the `node` label; set --node")]
    NoHostName {
        #[source]
        source: std::io::Error,
    },
}

#[derive(Args, Debug, Clone)]
pub struct MetadataArgs {
    /// The `node` label of every profile. Default: the host name.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node: Option<String>,

    /// Labels added to every profile: `key=value;key2=value2` (repeatable).
    #[arg(long, value_name = "LABELS", value_parser = parse_labels)]
    pub metadata_external_labels: Vec<KeyValues>,

    /// Docker or Podman API sockets asked for container names and labels
    /// (`__meta_docker_*`); those that do not exist are skipped. Empty
    /// (`--container-runtime-sockets=`): none asked.
    #[arg(
        long,
        value_name = "SOCKET",
        value_delimiter = ',',
        default_values_t = crate::labels::runtime::DEFAULT_SOCKETS.map(String::from)
    )]
    pub container_runtime_sockets: Vec<String>,
}

impl RemoteStoreArgs {
    /// `None` without `--remote-store-address`: profiles stay local.
    pub fn config(&self) -> Result<Option<RemoteStoreConfig>, ConfigError> {
        let Some(address) = &self.remote_store_address else {
            self.refuse_without_address()?;
            return Ok(None);
        };
        let bearer_token = match (
            &self.remote_store_bearer_token,
            &self.remote_store_bearer_token_file,
        ) {
            (Some(token), _) => Some(Secret::new(token.trim().to_owned())),
            (None, Some(path)) => Some(read_token(path)?),
            (None, None) => None,
        };
        let tls = if self.remote_store_insecure {
            None
        } else {
            let extra_roots = match &self.remote_store_ca_file {
                Some(path) => read_certificates(path)?,
                None => Vec::new(),
            };
            Some(TlsConfig {
                extra_roots,
                skip_verify: self.remote_store_insecure_skip_verify,
            })
        };
        let grpc_headers = flatten_unique(
            "--remote-store-grpc-headers",
            &self.remote_store_grpc_headers,
        )?
        .into_iter()
        .map(|(key, value)| (key, Secret::new(value)))
        .collect();
        Ok(Some(RemoteStoreConfig {
            address: address.clone(),
            tls,
            bearer_token,
            grpc_headers,
            queue_bytes: self.remote_store_queue_bytes,
            request_timeout: self.remote_store_rpc_unary_timeout,
        }))
    }

    /// Flags that only make sense with a server are an error without one,
    /// rather than silently ignored.
    fn refuse_without_address(&self) -> Result<(), ConfigError> {
        let given = [
            (
                self.remote_store_bearer_token_file.is_some(),
                "remote-store-bearer-token-file",
            ),
            (self.remote_store_insecure, "remote-store-insecure"),
            (
                self.remote_store_insecure_skip_verify,
                "remote-store-insecure-skip-verify",
            ),
            (self.remote_store_ca_file.is_some(), "remote-store-ca-file"),
            (
                !self.remote_store_grpc_headers.is_empty(),
                "remote-store-grpc-headers",
            ),
        ];
        match given.iter().find(|(present, _)| *present) {
            Some(&(_, flag)) => Err(ConfigError::NeedsRemoteStore { flag }),
            None => Ok(()),
        }
    }
}

impl MetadataArgs {
    pub fn config(&self) -> Result<MetadataConfig, ConfigError> {
        let node = match &self.node {
            Some(node) => node.clone(),
            None => host_name().map_err(|source| ConfigError::NoHostName { source })?,
        };
        Ok(MetadataConfig {
            node,
            external_labels: flatten_unique(
                "--metadata-external-labels",
                &self.metadata_external_labels,
            )?,
            relabel_rules: Vec::new(),
            kubernetes: None,
            runtime_sockets: self
                .container_runtime_sockets
                .iter()
                .filter(|socket| !socket.is_empty())
                .map(PathBuf::from)
                .collect(),
        })
    }
}

impl DebuginfoArgs {
    /// The files uploaded are the debug files the symbolizer reads (found
    /// in `--debuginfo-directories`).
    pub fn config(&self) -> DebuginfoConfig {
        DebuginfoConfig {
            upload: !self.debuginfo_upload_disable,
            upload_symbolized: self.debuginfo_upload_symbolized,
            max_parallel: usize::try_from(self.debuginfo_upload_max_parallel).unwrap_or(1),
            upload_timeout: self.debuginfo_upload_timeout_duration,
        }
    }
}

pub(super) fn read_token(path: &std::path::Path) -> Result<Secret, ConfigError> {
    let text = crate::untrusted::read_host_text(path).map_err(|source| ConfigError::TokenFile {
        path: path.display().to_string(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ConfigError::EmptyTokenFile {
            path: path.display().to_string(),
        });
    }
    Ok(Secret::new(token.to_owned()))
}

pub(super) fn read_certificates(path: &std::path::Path) -> Result<Vec<Vec<u8>>, ConfigError> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let pem = crate::untrusted::read_host_file(path).map_err(|source| ConfigError::CaFile {
        path: path.display().to_string(),
        source,
    })?;
    let certificates: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .map(|der| der.to_vec())
        .collect();
    if certificates.is_empty() {
        return Err(ConfigError::NoCertificates {
            path: path.display().to_string(),
        });
    }
    Ok(certificates)
}

pub(super) fn flatten_unique(
    flag: &'static str,
    values: &[KeyValues],
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (key, value) in values.iter().flat_map(|v| v.0.iter()) {
        if pairs.iter().any(|(k, _)| k == key) {
            return Err(ConfigError::DuplicateKey {
                flag,
                key: key.clone(),
            });
        }
        pairs.push((key.clone(), value.clone()));
    }
    Ok(pairs)
}

pub(super) fn host_name() -> std::io::Result<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    let name = String::from_utf8_lossy(&buffer[..end]).into_owned();
    if name.is_empty() {
        return Err(std::io::Error::other("the host name is empty"));
    }
    Ok(name)
}

/// An `http(s)://` URL with a host; `https://` when no scheme is written.
/// `example` shows the user a URL of the right kind.
pub(super) fn parse_http_url(text: &str, example: &str) -> Result<String, String> {
    let trimmed = text.trim();
    let url = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("https://{trimmed}")
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|_| format!("`{text}` is not a URL (e.g. {example})"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("`{text}`: only http:// and https:// URLs")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{text}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{text}`: a query string is not allowed"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// `host:port`, optionally written as `grpc://`, `http://` or `https://`
/// URL; TLS is chosen by `--remote-store-insecure`, not by the scheme.
fn parse_address(text: &str) -> Result<String, String> {
    let trimmed = text.trim();
    let bare = ["https://", "http://", "grpc://", "dns:///"]
        .iter()
        .find_map(|scheme| trimmed.strip_prefix(scheme))
        .unwrap_or(trimmed)
        .trim_end_matches('/');
    let (host, port) = bare
        .rsplit_once(':')
        .ok_or_else(|| format!("`{text}` is not host:port (e.g. localhost:7070)"))?;
    if host.is_empty() || host.contains('/') {
        return Err(format!("`{text}` is not host:port (e.g. localhost:7070)"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|&port| port != 0)
        .ok_or_else(|| format!("`{port}` in `{text}` is not a port number"))?;
    Ok(bare.to_owned())
}

fn parse_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(';')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("`{item}` is not key=value"))?;
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// Label names as Prometheus allows them, minus the ones firn sets itself.
fn parse_labels(text: &str) -> Result<KeyValues, String> {
    let pairs = parse_pairs(text)?;
    for (key, value) in &pairs {
        let mut chars = key.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "`{key}` is not a label name (letters, digits and _, not starting with a digit)"
            ));
        }
        if key.starts_with("__") || ["node", "pid", "comm"].contains(&key.as_str()) {
            return Err(format!("the label `{key}` is set by firn itself"));
        }
        if value.is_empty() {
            return Err(format!("the label `{key}` has an empty value"));
        }
    }
    Ok(KeyValues(pairs))
}

/// gRPC metadata: ASCII header names and values.
pub(super) fn parse_headers(text: &str) -> Result<KeyValues, String> {
    let pairs = parse_pairs(text)?;
    for (key, value) in &pairs {
        let valid_key = !key.is_empty()
            && !key.ends_with("-bin")
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid_key {
            return Err(format!("`{key}` is not a gRPC header name"));
        }
        if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(format!(
                "the value of the header `{key}` is not printable ASCII"
            ));
        }
    }
    Ok(KeyValues(
        pairs
            .into_iter()
            .map(|(key, value)| (key.to_ascii_lowercase(), value))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{cli::Cli, config::AgentConfig};

    #[test]
    fn remote_store_flags_become_a_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").expect("token file");
        let cli = Cli::try_parse_from([
            "firn",
            "--remote-store-address",
            "parca.example:7070",
            "--remote-store-bearer-token-file",
            token.to_str().expect("utf-8"),
            "--remote-store-grpc-headers",
            "X-Scope-OrgID=team;x-extra=1",
            "--node",
            "node-a",
            "--metadata-external-labels",
            "cluster=prod;region=eu",
            "--metadata-external-labels",
            "zone=b",
            "--debuginfo-upload-disable",
        ])
        .expect("valid flags");
        let config = AgentConfig::try_from(&cli.agent).expect("a usable config");
        let remote = config.remote_store().expect("remote store");
        assert_eq!(remote.address, "parca.example:7070");
        assert_eq!(
            remote.bearer_token.as_ref().map(Secret::expose),
            Some("s3cret")
        );
        assert!(remote.tls.is_some(), "TLS unless --remote-store-insecure");
        let headers: Vec<(&str, &str)> = remote
            .grpc_headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.expose()))
            .collect();
        assert_eq!(headers, [("x-scope-orgid", "team"), ("x-extra", "1")]);
        assert_eq!(config.metadata.node, "node-a");
        assert_eq!(config.metadata.external_labels.len(), 3);
        assert!(!config.debuginfo.upload);
        assert!(
            !format!("{remote:?}").contains("s3cret"),
            "the token never shows in Debug output"
        );
    }

    #[test]
    fn unusable_remote_store_flags_are_config_errors() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["firn"];
            argv.extend_from_slice(args);
            AgentConfig::try_from(&Cli::try_parse_from(argv).expect("parses").agent)
        };
        assert!(matches!(
            parse(&[
                "--remote-store-address",
                "h:1",
                "--remote-store-bearer-token-file",
                "/nonexistent/token"
            ]),
            Err(ConfigError::TokenFile { .. })
        ));
        let empty = tempfile::NamedTempFile::new().expect("temp file");
        assert!(matches!(
            parse(&[
                "--remote-store-address",
                "h:1",
                "--remote-store-ca-file",
                empty.path().to_str().expect("utf-8")
            ]),
            Err(ConfigError::NoCertificates { .. })
        ));
        // Devices and FIFOs are refused at once, not read (a FIFO would
        // wait for a writer forever).
        assert!(matches!(
            parse(&[
                "--remote-store-address",
                "h:1",
                "--remote-store-ca-file",
                "/dev/null"
            ]),
            Err(ConfigError::CaFile { .. })
        ));
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("token");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        let error = parse(&[
            "--remote-store-address",
            "h:1",
            "--remote-store-bearer-token-file",
            fifo.to_str().expect("utf-8"),
        ])
        .expect_err("a FIFO is no token file");
        assert!(matches!(error, ConfigError::TokenFile { .. }), "{error:?}");
        assert!(matches!(
            parse(&["--remote-store-insecure"]),
            Err(ConfigError::NeedsRemoteStore { .. })
        ));
        assert!(matches!(
            parse(&[
                "--metadata-external-labels",
                "a=1",
                "--metadata-external-labels",
                "a=2"
            ]),
            Err(ConfigError::DuplicateKey { .. })
        ));
    }

    #[test]
    fn addresses_and_labels_are_checked() {
        assert_eq!(parse_address("localhost:7070"), Ok("localhost:7070".into()));
        assert_eq!(parse_address("https://parca:443/"), Ok("parca:443".into()));
        assert_eq!(parse_address("[::1]:7070"), Ok("[::1]:7070".into()));
        assert!(parse_address("localhost").is_err());
        assert!(parse_address("localhost:http").is_err());
        assert!(parse_address(":7070").is_err());
        assert!(parse_labels("cluster=prod").is_ok());
        assert!(parse_labels("1abc=x").is_err());
        assert!(parse_labels("__name__=x").is_err());
        assert!(parse_labels("node=x").is_err());
        assert!(parse_labels("noequals").is_err());
        assert!(parse_headers("x-token=abc").is_ok());
        assert!(parse_headers("bad header=abc").is_err());
        assert!(parse_headers("x-data-bin=abc").is_err());
    }
}
