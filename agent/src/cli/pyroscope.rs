//! The agent's flags for a Pyroscope server or Grafana Cloud Profiles,
//! named after Grafana Alloy's `pyroscope.write` endpoint arguments.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{
    http_auth::{FlagNames, HttpAuthFlags},
    parse_period, parse_store_bytes,
    remote::{ConfigError, KeyValues, parse_headers},
};
use crate::output::pyroscope::PyroscopeConfig;

#[derive(Args, Debug, Clone, Default)]
pub struct PyroscopeArgs {
    /// A Pyroscope server or Grafana Cloud Profiles URL
    /// (https://profiles-prod-001.grafana.net, http://localhost:4040);
    /// `https://` is assumed without a scheme. With --remote-store-address
    /// too, profiles go to both.
    #[arg(long, value_name = "URL", value_parser = parse_url)]
    pub pyroscope_url: Option<String>,

    /// The basic auth user (for Grafana Cloud: the stack's user id).
    #[arg(long, value_name = "USER", env = "PYROSCOPE_BASIC_AUTH_USERNAME")]
    pub pyroscope_basic_auth_username: Option<String>,

    /// The basic auth password (for Grafana Cloud: an access token).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "PYROSCOPE_BASIC_AUTH_PASSWORD",
        hide_env_values = true,
        conflicts_with = "pyroscope_basic_auth_password_file"
    )]
    pub pyroscope_basic_auth_password: Option<String>,

    /// A file holding the basic auth password.
    #[arg(long, value_name = "FILE")]
    pub pyroscope_basic_auth_password_file: Option<PathBuf>,

    /// Sent as `Authorization: Bearer <token>` (instead of basic auth).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "PYROSCOPE_BEARER_TOKEN",
        hide_env_values = true,
        conflicts_with_all = ["pyroscope_bearer_token_file", "pyroscope_basic_auth_username"]
    )]
    pub pyroscope_bearer_token: Option<String>,

    /// A file holding the bearer token.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "pyroscope_basic_auth_username"
    )]
    pub pyroscope_bearer_token_file: Option<PathBuf>,

    /// The tenant, sent as `X-Scope-OrgID` (Pyroscope with multitenancy on).
    #[arg(long, value_name = "TENANT")]
    pub pyroscope_tenant_id: Option<String>,

    /// HTTP headers sent with every push: `key=value;key2=value2`.
    #[arg(long, value_name = "HEADERS", value_parser = parse_headers)]
    pub pyroscope_headers: Vec<KeyValues>,

    /// TLS without checking the server's certificate.
    #[arg(long)]
    pub pyroscope_insecure_skip_verify: bool,

    /// PEM certificates trusted on top of the system's roots.
    #[arg(long, value_name = "FILE")]
    pub pyroscope_ca_file: Option<PathBuf>,

    /// Unsent profiles kept while the server is slow or down; the oldest
    /// are dropped (and counted) beyond this (at least 1KiB).
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = parse_store_bytes)]
    pub pyroscope_queue_bytes: u64,

    /// Longest a single push may take before it is retried (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_period)]
    pub pyroscope_remote_timeout: Duration,
}

impl PyroscopeArgs {
    /// `None` without `--pyroscope-url`.
    pub fn config(&self, name: &str) -> Result<Option<PyroscopeConfig>, ConfigError> {
        let Some(url) = &self.pyroscope_url else {
            return self.refuse_without_url().map(|()| None);
        };
        let auth = HttpAuthFlags {
            names: FlagNames {
                username: "--pyroscope-basic-auth-username",
                password_or_file: "--pyroscope-basic-auth-password or --pyroscope-basic-auth-password-file",
                tls_flags: "--pyroscope-ca-file or --pyroscope-insecure-skip-verify",
                https_url: "an https:// --pyroscope-url",
                headers: "--pyroscope-headers",
            },
            url,
            basic_auth_username: &self.pyroscope_basic_auth_username,
            basic_auth_password: &self.pyroscope_basic_auth_password,
            basic_auth_password_file: &self.pyroscope_basic_auth_password_file,
            bearer_token: &self.pyroscope_bearer_token,
            bearer_token_file: &self.pyroscope_bearer_token_file,
            headers: &self.pyroscope_headers,
            ca_file: &self.pyroscope_ca_file,
            insecure_skip_verify: self.pyroscope_insecure_skip_verify,
        }
        .resolve()?;
        Ok(Some(PyroscopeConfig {
            name: name.to_owned(),
            url: url.clone(),
            tls: auth.tls,
            basic_auth: auth.basic_auth,
            bearer_token: auth.bearer_token,
            tenant_id: self.pyroscope_tenant_id.clone(),
            headers: auth.headers,
            queue_bytes: self.pyroscope_queue_bytes,
            request_timeout: self.pyroscope_remote_timeout,
        }))
    }

    fn refuse_without_url(&self) -> Result<(), ConfigError> {
        let given = [
            (
                self.pyroscope_basic_auth_username.is_some(),
                "pyroscope-basic-auth-username",
            ),
            (
                self.pyroscope_basic_auth_password_file.is_some(),
                "pyroscope-basic-auth-password-file",
            ),
            (
                self.pyroscope_bearer_token_file.is_some(),
                "pyroscope-bearer-token-file",
            ),
            (self.pyroscope_tenant_id.is_some(), "pyroscope-tenant-id"),
            (!self.pyroscope_headers.is_empty(), "pyroscope-headers"),
            (self.pyroscope_ca_file.is_some(), "pyroscope-ca-file"),
            (
                self.pyroscope_insecure_skip_verify,
                "pyroscope-insecure-skip-verify",
            ),
        ];
        match given.iter().find(|(present, _)| *present) {
            Some(&(_, flag)) => Err(ConfigError::NeedsPyroscope { flag }),
            None => Ok(()),
        }
    }
}

/// An `http(s)://` URL with a host; `https://` when no scheme is written.
fn parse_url(text: &str) -> Result<String, String> {
    super::remote::parse_http_url(text, "https://profiles.example.com")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_default_to_https() {
        assert_eq!(
            parse_url("profiles.example.com").as_deref(),
            Ok("https://profiles.example.com")
        );
        assert_eq!(
            parse_url("http://localhost:4040/").as_deref(),
            Ok("http://localhost:4040")
        );
        assert!(parse_url("grpc://x:1").is_err());
        assert!(parse_url("https://").is_err());
    }

    #[test]
    fn basic_auth_needs_both_halves() {
        let args = PyroscopeArgs {
            pyroscope_url: Some("https://p.example.com".into()),
            pyroscope_basic_auth_username: Some("1".into()),
            ..PyroscopeArgs::default()
        };
        let error = args.config("pyroscope").expect_err("incomplete");
        assert!(error.to_string().contains("password"), "{error}");
        let args = PyroscopeArgs {
            pyroscope_tenant_id: Some("t".into()),
            ..PyroscopeArgs::default()
        };
        assert!(args.config("pyroscope").is_err(), "tenant without a URL");
    }
}
