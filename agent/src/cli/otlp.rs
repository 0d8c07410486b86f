//! The agent's flags for an OTLP profiles receiver (an OpenTelemetry
//! Collector, Pyroscope's OTLP endpoint).

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{
    http_auth::{FlagNames, HttpAuthFlags},
    parse_period, parse_store_bytes,
    remote::{ConfigError, KeyValues, parse_headers},
};
use crate::output::otlp::{OtlpConfig, ProfilesVersion, Protocol};

#[derive(Args, Debug, Clone)]
pub struct OtlpArgs {
    /// An OTLP receiver: `http://localhost:4317` (gRPC, plaintext),
    /// `https://collector.example.com:4318` (with --otlp-protocol http);
    /// `https://` is assumed without a scheme. With other destinations
    /// too, profiles go to all.
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// gRPC (`ProfilesService/Export`) or HTTP (`POST
    /// <endpoint>/v1development/profiles`, protobuf).
    #[arg(long, value_name = "PROTOCOL", value_enum, default_value = "grpc")]
    pub otlp_protocol: Protocol,

    /// The opentelemetry-proto release of the profiles messages the
    /// receiver reads: 1.10 (the OpenTelemetry Collector v0.161, and
    /// receivers built on opentelemetry-proto 1.10 or 1.11) or 1.9
    /// (Pyroscope v1.19). The two number a sample's fields differently.
    #[arg(long, value_name = "VERSION", value_enum, default_value = "1.10")]
    pub otlp_profiles_version: ProfilesVersion,

    /// The basic auth user.
    #[arg(long, value_name = "USER", env = "OTLP_BASIC_AUTH_USERNAME")]
    pub otlp_basic_auth_username: Option<String>,

    /// The basic auth password.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "OTLP_BASIC_AUTH_PASSWORD",
        hide_env_values = true,
        conflicts_with = "otlp_basic_auth_password_file"
    )]
    pub otlp_basic_auth_password: Option<String>,

    /// A file holding the basic auth password.
    #[arg(long, value_name = "FILE")]
    pub otlp_basic_auth_password_file: Option<PathBuf>,

    /// Sent as `Authorization: Bearer <token>` (instead of basic auth).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "OTLP_BEARER_TOKEN",
        hide_env_values = true,
        conflicts_with_all = ["otlp_bearer_token_file", "otlp_basic_auth_username"]
    )]
    pub otlp_bearer_token: Option<String>,

    /// A file holding the bearer token.
    #[arg(long, value_name = "FILE", conflicts_with = "otlp_basic_auth_username")]
    pub otlp_bearer_token_file: Option<PathBuf>,

    /// Headers (gRPC metadata) sent with every export:
    /// `key=value;key2=value2` (e.g. `X-Scope-OrgID=team-a` for a
    /// multi-tenant Pyroscope).
    #[arg(long, value_name = "HEADERS", value_parser = parse_headers)]
    pub otlp_headers: Vec<KeyValues>,

    /// TLS without checking the receiver's certificate.
    #[arg(long)]
    pub otlp_insecure_skip_verify: bool,

    /// PEM certificates trusted on top of the system's roots.
    #[arg(long, value_name = "FILE")]
    pub otlp_ca_file: Option<PathBuf>,

    /// Send requests as they are instead of gzipped (for a receiver
    /// without gzip).
    #[arg(long)]
    pub otlp_no_compression: bool,

    /// Unsent profiles kept while the receiver is slow or down; the oldest
    /// are dropped (and counted) beyond this (at least 1KiB).
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = parse_store_bytes)]
    pub otlp_queue_bytes: u64,

    /// Longest a single export may take before it is retried (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_period)]
    pub otlp_remote_timeout: Duration,
}

impl Default for OtlpArgs {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            otlp_protocol: Protocol::Grpc,
            otlp_profiles_version: ProfilesVersion::V1_10,
            otlp_basic_auth_username: None,
            otlp_basic_auth_password: None,
            otlp_basic_auth_password_file: None,
            otlp_bearer_token: None,
            otlp_bearer_token_file: None,
            otlp_headers: Vec::new(),
            otlp_insecure_skip_verify: false,
            otlp_ca_file: None,
            otlp_no_compression: false,
            otlp_queue_bytes: 16 << 20,
            otlp_remote_timeout: Duration::from_secs(30),
        }
    }
}

impl OtlpArgs {
    /// `None` without `--otlp-endpoint`.
    pub fn config(&self, name: &str) -> Result<Option<OtlpConfig>, ConfigError> {
        let Some(endpoint) = &self.otlp_endpoint else {
            return self.refuse_without_endpoint().map(|()| None);
        };
        let auth = HttpAuthFlags {
            names: FlagNames {
                username: "--otlp-basic-auth-username",
                password_or_file: "--otlp-basic-auth-password or --otlp-basic-auth-password-file",
                tls_flags: "--otlp-ca-file or --otlp-insecure-skip-verify",
                https_url: "an https:// --otlp-endpoint",
                headers: "--otlp-headers",
            },
            url: endpoint,
            basic_auth_username: &self.otlp_basic_auth_username,
            basic_auth_password: &self.otlp_basic_auth_password,
            basic_auth_password_file: &self.otlp_basic_auth_password_file,
            bearer_token: &self.otlp_bearer_token,
            bearer_token_file: &self.otlp_bearer_token_file,
            headers: &self.otlp_headers,
            ca_file: &self.otlp_ca_file,
            insecure_skip_verify: self.otlp_insecure_skip_verify,
        }
        .resolve()?;
        Ok(Some(OtlpConfig {
            name: name.to_owned(),
            endpoint: endpoint.clone(),
            protocol: self.otlp_protocol,
            version: self.otlp_profiles_version,
            tls: auth.tls,
            basic_auth: auth.basic_auth,
            bearer_token: auth.bearer_token,
            headers: auth.headers,
            gzip: !self.otlp_no_compression,
            queue_bytes: self.otlp_queue_bytes,
            request_timeout: self.otlp_remote_timeout,
        }))
    }

    fn refuse_without_endpoint(&self) -> Result<(), ConfigError> {
        let given = [
            (
                self.otlp_basic_auth_username.is_some(),
                "otlp-basic-auth-username",
            ),
            (
                self.otlp_basic_auth_password_file.is_some(),
                "otlp-basic-auth-password-file",
            ),
            (
                self.otlp_bearer_token_file.is_some(),
                "otlp-bearer-token-file",
            ),
            (!self.otlp_headers.is_empty(), "otlp-headers"),
            (self.otlp_ca_file.is_some(), "otlp-ca-file"),
            (self.otlp_insecure_skip_verify, "otlp-insecure-skip-verify"),
        ];
        match given.iter().find(|(present, _)| *present) {
            Some(&(_, flag)) => Err(ConfigError::NeedsOtlp { flag }),
            None => Ok(()),
        }
    }
}

/// An `http(s)://` URL with a host; `https://` when no scheme is written.
fn parse_endpoint(text: &str) -> Result<String, String> {
    super::remote::parse_http_url(text, "http://localhost:4317")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_default_to_https_and_credentials_need_one() {
        assert_eq!(
            parse_endpoint("collector:4317").as_deref(),
            Ok("https://collector:4317")
        );
        assert!(parse_endpoint("grpc://x:1").is_err());
        let args = OtlpArgs {
            otlp_headers: vec![parse_headers("a=b").expect("header")],
            ..OtlpArgs::default()
        };
        assert!(args.config("otlp").is_err(), "headers without an endpoint");
        let args = OtlpArgs {
            otlp_endpoint: Some("http://localhost:4317".into()),
            ..OtlpArgs::default()
        };
        let config = args.config("otlp").expect("valid").expect("some");
        assert!(config.tls.is_none());
        assert_eq!(config.version, ProfilesVersion::V1_10);
    }
}
