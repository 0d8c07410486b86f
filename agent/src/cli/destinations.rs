//! The config file's `destinations`: several servers at once, each entry
//! the Parca (`remote-store-*`), Pyroscope (`pyroscope-*`) or OTLP
//! (`otlp-*`) flags without their dashes, and a `name` for its metrics and log lines. Each entry is
//! read by the flags' own parsers, environment variables left out (they
//! would apply to every entry alike).

use std::path::Path;

use clap::{CommandFactory, FromArgMatches, Parser};

use super::{OtlpArgs, PyroscopeArgs, RemoteStoreArgs, remote::ConfigError};
use crate::{
    config::DestinationConfig,
    config_file::{ConfigFileError, SettingValue},
};

/// One entry of `destinations`.
#[derive(Parser, Debug, Clone)]
#[command(name = "destinations", no_binary_name = true, disable_help_flag = true)]
pub struct DestinationArgs {
    /// The `destination` label of its metrics (default `parca`,
    /// `pyroscope` or `otlp`).
    #[arg(long)]
    pub name: Option<String>,

    #[command(flatten)]
    pub remote_store: RemoteStoreArgs,

    #[command(flatten)]
    pub pyroscope: PyroscopeArgs,

    #[command(flatten)]
    pub otlp: OtlpArgs,
}

impl DestinationArgs {
    /// Reads one entry, `index` naming it in errors.
    pub fn from_entry(
        entry: &[(String, SettingValue)],
        path: &Path,
        index: usize,
    ) -> Result<Self, ConfigFileError> {
        let mut argv = Vec::new();
        for (key, value) in entry {
            match value {
                SettingValue::Bool(true) => argv.push(format!("--{key}")),
                SettingValue::Bool(false) => {}
                SettingValue::One(text) => argv.push(format!("--{key}={text}")),
                SettingValue::Many(items) => {
                    argv.extend(items.iter().map(|item| format!("--{key}={item}")));
                }
            }
        }
        let mut command = Self::command();
        let ids: Vec<String> = command
            .get_arguments()
            .map(|arg| arg.get_id().to_string())
            .collect();
        for id in ids {
            command = command.mut_arg(id, |arg| arg.env(None));
        }
        let error = |reason: String| ConfigFileError::Destination {
            path: path.to_path_buf(),
            index,
            reason,
        };
        let matches = command
            .try_get_matches_from(argv)
            .map_err(|e| error(first_line(&e.to_string())))?;
        Self::from_arg_matches(&matches).map_err(|e| error(first_line(&e.to_string())))
    }

    /// The server this entry names: exactly one of a Parca address, a
    /// Pyroscope URL and an OTLP endpoint.
    pub fn config(&self, index: usize) -> Result<DestinationConfig, ConfigError> {
        let parca = self.remote_store.config()?;
        let name = |default: &str| self.name.clone().unwrap_or_else(|| default.to_owned());
        let pyroscope = self.pyroscope.config(&name("pyroscope"))?;
        let otlp = self.otlp.config(&name("otlp"))?;
        match (parca, pyroscope, otlp) {
            (Some(store), None, None) => Ok(DestinationConfig::Parca {
                store,
                name: name("parca"),
            }),
            (None, Some(pyroscope), None) => Ok(DestinationConfig::Pyroscope(pyroscope)),
            (None, None, Some(otlp)) => Ok(DestinationConfig::Otlp(otlp)),
            _ => Err(ConfigError::DestinationKind { index }),
        }
    }
}

fn first_line(text: &str) -> String {
    text.lines()
        .find(|line| !line.trim().is_empty())
        .unwrap_or(text)
        .trim_start_matches("error: ")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str, value: &str) -> (String, SettingValue) {
        (key.to_owned(), SettingValue::One(value.to_owned()))
    }

    #[test]
    fn entries_are_read_by_the_flags_parsers() {
        let path = Path::new("firn.yaml");
        let pyroscope = DestinationArgs::from_entry(
            &[
                one("name", "grafana-cloud"),
                one("pyroscope-url", "profiles.example.com"),
                one("pyroscope-tenant-id", "team-a"),
                (
                    "pyroscope-headers".into(),
                    SettingValue::Many(vec!["X-Extra=1".into()]),
                ),
            ],
            path,
            0,
        )
        .expect("valid");
        let DestinationConfig::Pyroscope(config) = pyroscope.config(0).expect("config") else {
            panic!("a Pyroscope destination");
        };
        assert_eq!(config.name, "grafana-cloud");
        assert_eq!(config.url, "https://profiles.example.com");
        assert!(config.tls.is_some(), "https by default");
        let parca = DestinationArgs::from_entry(
            &[
                one("remote-store-address", "parca:7070"),
                ("remote-store-insecure".into(), SettingValue::Bool(true)),
            ],
            path,
            1,
        )
        .expect("valid");
        assert!(matches!(
            parca.config(1),
            Ok(DestinationConfig::Parca { name, .. }) if name == "parca"
        ));
        let error = DestinationArgs::from_entry(&[one("pyroscope-urll", "x")], path, 2)
            .expect_err("a typo");
        assert!(error.to_string().contains("destinations[2]"), "{error}");
        let neither = DestinationArgs::from_entry(&[one("name", "x")], path, 3).expect("parses");
        assert!(neither.config(3).is_err());
    }

    #[test]
    fn otlp_entries_name_their_receiver_protocol_and_release() {
        let path = Path::new("firn.yaml");
        let entry = DestinationArgs::from_entry(
            &[
                one("otlp-endpoint", "http://localhost:4040"),
                one("otlp-protocol", "http"),
                one("otlp-profiles-version", "1.9"),
                one("otlp-headers", "X-Scope-OrgID=team-a"),
            ],
            path,
            0,
        )
        .expect("valid");
        let DestinationConfig::Otlp(config) = entry.config(0).expect("config") else {
            panic!("an OTLP destination");
        };
        assert_eq!(config.name, "otlp");
        assert_eq!(config.protocol, crate::output::otlp::Protocol::Http);
        assert_eq!(config.version, crate::output::otlp::ProfilesVersion::V1_9);
        assert!(config.tls.is_none(), "http:// is plaintext");
        assert_eq!(config.headers.len(), 1);
        let version = DestinationArgs::from_entry(&[one("otlp-profiles-version", "2")], path, 1)
            .expect_err("an unknown release");
        assert!(version.to_string().contains("destinations[1]"), "{version}");
        let both = DestinationArgs::from_entry(
            &[
                one("otlp-endpoint", "collector:4317"),
                one("pyroscope-url", "http://localhost:4040"),
            ],
            path,
            2,
        )
        .expect("parses");
        assert!(both.config(2).is_err(), "one server per entry");
    }
}
