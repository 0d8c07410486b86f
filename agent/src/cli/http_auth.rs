//! Credentials, TLS and headers of an HTTP-style destination (Pyroscope,
//! OTLP): the same flags under each destination's prefix, checked and
//! assembled the same way.

use std::path::PathBuf;

use super::remote::{ConfigError, KeyValues, flatten_unique, read_certificates, read_token};
use crate::output::{
    parca::{Secret, TlsConfig},
    pyroscope::BasicAuth,
};

/// The flag names one destination uses, for its error messages.
pub(super) struct FlagNames {
    pub username: &'static str,
    pub password_or_file: &'static str,
    pub tls_flags: &'static str,
    pub https_url: &'static str,
    pub headers: &'static str,
}

/// What the flags hold.
pub(super) struct HttpAuthFlags<'a> {
    pub names: FlagNames,
    pub url: &'a str,
    pub basic_auth_username: &'a Option<String>,
    pub basic_auth_password: &'a Option<String>,
    pub basic_auth_password_file: &'a Option<PathBuf>,
    pub bearer_token: &'a Option<String>,
    pub bearer_token_file: &'a Option<PathBuf>,
    pub headers: &'a [KeyValues],
    pub ca_file: &'a Option<PathBuf>,
    pub insecure_skip_verify: bool,
}

/// Checked and read: secrets from their files, certificates parsed.
pub(super) struct HttpAuth {
    pub basic_auth: Option<BasicAuth>,
    pub bearer_token: Option<Secret>,
    /// `None` for an `http://` URL.
    pub tls: Option<TlsConfig>,
    pub headers: Vec<(String, Secret)>,
}

impl HttpAuthFlags<'_> {
    pub fn resolve(&self) -> Result<HttpAuth, ConfigError> {
        let password = secret(self.basic_auth_password, self.basic_auth_password_file)?;
        let basic_auth = match (self.basic_auth_username, password) {
            (Some(username), Some(password)) => Some(BasicAuth {
                username: username.clone(),
                password,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Incomplete {
                    given: self.names.username,
                    missing: self.names.password_or_file,
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::Incomplete {
                    given: "a basic auth password",
                    missing: self.names.username,
                });
            }
        };
        let bearer_token = secret(self.bearer_token, self.bearer_token_file)?;
        let tls = if self.url.starts_with("http://") {
            if self.ca_file.is_some() || self.insecure_skip_verify {
                return Err(ConfigError::Incomplete {
                    given: self.names.tls_flags,
                    missing: self.names.https_url,
                });
            }
            None
        } else {
            Some(TlsConfig {
                extra_roots: match self.ca_file {
                    Some(path) => read_certificates(path)?,
                    None => Vec::new(),
                },
                skip_verify: self.insecure_skip_verify,
            })
        };
        let headers = flatten_unique(self.names.headers, self.headers)?
            .into_iter()
            .map(|(key, value)| (key, Secret::new(value)))
            .collect();
        Ok(HttpAuth {
            basic_auth,
            bearer_token,
            tls,
            headers,
        })
    }
}

/// A secret given on the command line (or in the environment) wins over
/// its file.
fn secret(given: &Option<String>, file: &Option<PathBuf>) -> Result<Option<Secret>, ConfigError> {
    match (given, file) {
        (Some(value), _) => Ok(Some(Secret::new(value.trim().to_owned()))),
        (None, Some(path)) => read_token(path).map(Some),
        (None, None) => Ok(None),
    }
}
