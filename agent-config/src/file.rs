//! The YAML configuration file (`--config-path`): Prometheus
//! `relabel_configs`, and any command-line flag under its long name without
//! the dashes, as written on the command line (`profiling-duration: 10s`,
//! `remote-store-insecure: true`, `pid: [1, 2]`). This module reads the
//! file's text strictly into plain data; the daemon reads the file, checks
//! each key against its flags and applies it under the command line.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::relabel::{Rule, RuleError, RuleSpec};

/// The one key that is not a flag, spelled as Prometheus spells it.
pub const RELABEL_CONFIGS: &str = "relabel_configs";
/// Servers profiles are pushed to, each a map of the Parca
/// (`remote-store-*`), Pyroscope (`pyroscope-*`) or OTLP (`otlp-*`) flags,
/// and a `name`.
pub const DESTINATIONS: &str = "destinations";

/// The file as written.
#[derive(Debug, Default)]
pub struct ConfigFile {
    /// Prometheus `relabel_configs`, applied to every series.
    pub relabel_configs: Vec<RuleSpec>,
    /// `destinations`, each entry's keys in the order of the file.
    pub destinations: Vec<Vec<(String, SettingValue)>>,
    /// Every other top-level key, in the order of the file.
    pub settings: Vec<Setting>,
}

/// One `key: value` of the file other than `relabel_configs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub key: String,
    /// 1-based, for error messages.
    pub line: usize,
    pub value: SettingValue,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingValue {
    /// `true` or `false`.
    Bool(bool),
    /// A string or a number, as text.
    One(String),
    /// A list of strings or numbers, or a map of them written as
    /// `key=value` items (`metadata-external-labels: {cluster: prod}`).
    Many(Vec<String>),
}

/// Only `relabel_configs`, read with the line numbers the YAML parser
/// gives (the other keys are read generically).
#[derive(Debug, Default, Deserialize)]
struct RelabelSection {
    #[serde(default)]
    relabel_configs: Vec<RuleSpec>,
}

/// Only `destinations`, its entries read generically.
#[derive(Debug, Default, Deserialize)]
struct DestinationsSection {
    #[serde(default)]
    destinations: Vec<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("could not read the config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the config file {path} is not valid: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("{path}, line {line}: `{key}` {problem}")]
    Value {
        path: PathBuf,
        line: usize,
        key: String,
        problem: String,
    },
    #[error(
        "{path}, line {line}: unknown key `{key}`{hint} (keys are `relabel_configs` and the \
         flags of `firn{command} --help` without their dashes)"
    )]
    UnknownKey {
        path: PathBuf,
        line: usize,
        key: String,
        hint: String,
        /// ` record`, or empty for the agent.
        command: &'static str,
    },
    #[error("{path}, line {line}: `{key}: {value}` is invalid: {reason}")]
    InvalidValue {
        path: PathBuf,
        line: usize,
        key: String,
        value: String,
        reason: String,
    },
    #[error("{path}, line {line}: `{key}` cannot be used with --{other}")]
    Conflict {
        path: PathBuf,
        line: usize,
        key: String,
        other: String,
    },
    #[error("destinations[{index}] in {path} is invalid: {reason}")]
    Destination {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error("relabel_configs[{index}] (action {action}) in {path} is invalid")]
    Relabel {
        path: PathBuf,
        index: usize,
        action: String,
        #[source]
        source: RuleError,
    },
}

impl ConfigFile {
    /// `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigFileError> {
        // An empty file (or one holding only comments) is an empty config.
        if text
            .lines()
            .all(|line| line.trim().is_empty() || line.trim_start().starts_with('#'))
        {
            return Ok(Self::default());
        }
        let parse_error = |error: serde_saphyr::Error| ConfigFileError::Parse {
            path: path.to_path_buf(),
            reason: error.to_string(),
        };
        let keys: BTreeMap<String, Spanned<serde_json::Value>> =
            serde_saphyr::from_str(text).map_err(parse_error)?;
        let relabel: RelabelSection = serde_saphyr::from_str(text).map_err(parse_error)?;
        let destinations: DestinationsSection =
            serde_saphyr::from_str(text).map_err(parse_error)?;
        let destinations = destinations
            .destinations
            .into_iter()
            .enumerate()
            .map(|(index, entry)| {
                entry
                    .into_iter()
                    .map(|(key, value)| {
                        let value = setting_value(value).map_err(|problem| {
                            ConfigFileError::Destination {
                                path: path.to_path_buf(),
                                index,
                                reason: format!("`{key}` {problem}"),
                            }
                        })?;
                        Ok((key, value))
                    })
                    .collect::<Result<Vec<_>, ConfigFileError>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut settings = keys
            .into_iter()
            .filter(|(key, _)| key != RELABEL_CONFIGS && key != DESTINATIONS)
            .map(|(key, value)| {
                let line = value.referenced.line() as usize;
                let value =
                    setting_value(value.value).map_err(|problem| ConfigFileError::Value {
                        path: path.to_path_buf(),
                        line,
                        key: key.clone(),
                        problem,
                    })?;
                Ok(Setting { key, line, value })
            })
            .collect::<Result<Vec<_>, ConfigFileError>>()?;
        settings.sort_by_key(|setting| setting.line);
        Ok(Self {
            relabel_configs: relabel.relabel_configs,
            destinations,
            settings,
        })
    }

    /// The relabeling rules, checked; an invalid one is named by its index
    /// and action.
    pub fn relabel_rules(&self, path: &Path) -> Result<Vec<Rule>, ConfigFileError> {
        self.relabel_configs
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                Rule::new(entry).map_err(|source| ConfigFileError::Relabel {
                    path: path.to_path_buf(),
                    index,
                    action: entry.action.clone().unwrap_or_else(|| "replace".into()),
                    source,
                })
            })
            .collect()
    }
}

/// A flag's value as written: a scalar, a list of scalars, or a map of
/// scalars (for the `key=value` flags).
fn setting_value(value: serde_json::Value) -> Result<SettingValue, String> {
    use serde_json::Value;
    let scalar = |value: Value| match value {
        Value::String(text) => Some(text),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    };
    match value {
        Value::Null => Err("has no value".into()),
        Value::Bool(flag) => Ok(SettingValue::Bool(flag)),
        Value::String(_) | Value::Number(_) => scalar(value)
            .map(SettingValue::One)
            .ok_or_else(|| "is not a value".into()),
        Value::Array(items) => items
            .into_iter()
            .map(scalar)
            .collect::<Option<Vec<_>>>()
            .map(SettingValue::Many)
            .ok_or_else(|| "must be a list of plain values (strings or numbers)".into()),
        Value::Object(map) => map
            .into_iter()
            .map(|(key, value)| scalar(value).map(|value| format!("{key}={value}")))
            .collect::<Option<Vec<_>>>()
            .map(SettingValue::Many)
            .ok_or_else(|| "must map keys to plain values (strings or numbers)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, ConfigFileError> {
        ConfigFile::parse(text, Path::new("firn.yaml"))
    }

    #[test]
    fn relabel_configs_parse_with_prometheus_keys() {
        let config = parse(
            r#"
relabel_configs:
  - source_labels: [__meta_kubernetes_pod_label_app, comm]
    separator: "/"
    regex: "(.+)/(.*)"
    target_label: app
    replacement: "${1}"
  - action: labelmap
    regex: __meta_kubernetes_pod_label_(.+)
  - source_labels: [comm]
    regex: dropme
    action: drop
  - source_labels: [pid]
    modulus: 4
    target_label: shard
    action: hashmod
"#,
        )
        .expect("a valid config");
        let path = Path::new("firn.yaml");
        let rules = config.relabel_rules(path).expect("valid rules");
        assert_eq!(rules.len(), 4);
        assert_eq!(config.relabel_configs[0].separator.as_deref(), Some("/"));
        assert_eq!(config.relabel_configs[3].modulus, Some(4));
        assert!(parse("").expect("empty").relabel_configs.is_empty());
        assert!(
            parse("# nothing\n")
                .expect("comments")
                .relabel_configs
                .is_empty()
        );
    }

    #[test]
    fn relabel_configs_are_strict_and_errors_name_the_file() {
        let error =
            parse("relabel_configs:\n  - source_label: [comm]\n").expect_err("unknown rule key");
        assert!(error.to_string().contains("source_label"), "{error}");
        let error = parse("relabel_configs: {a: 1}\n").expect_err("wrong shape");
        assert!(error.to_string().contains("firn.yaml"), "{error}");
        let error = parse("- just\n- a list\n").expect_err("not a mapping");
        assert!(error.to_string().contains("firn.yaml"), "{error}");
        let error = parse("frequency: [1\n").expect_err("not YAML");
        assert!(error.to_string().contains("firn.yaml"), "{error}");
    }

    #[test]
    fn other_keys_are_settings_in_file_order_with_their_lines() {
        let config = parse(
            "# agent\nprofiling-duration: 5s\nfrequency: 99\nremote-store-insecure: true\n\
             pid: [1, 2]\nmetadata-external-labels: {cluster: prod, region: eu}\n\
             relabel_configs: []\n",
        )
        .expect("valid");
        let settings: Vec<(&str, usize, &SettingValue)> = config
            .settings
            .iter()
            .map(|s| (s.key.as_str(), s.line, &s.value))
            .collect();
        assert_eq!(
            settings,
            [
                ("profiling-duration", 2, &SettingValue::One("5s".into())),
                ("frequency", 3, &SettingValue::One("99".into())),
                ("remote-store-insecure", 4, &SettingValue::Bool(true)),
                ("pid", 5, &SettingValue::Many(vec!["1".into(), "2".into()])),
                (
                    "metadata-external-labels",
                    6,
                    &SettingValue::Many(vec!["cluster=prod".into(), "region=eu".into()])
                ),
            ]
        );
    }

    #[test]
    fn values_that_are_no_flag_value_are_named() {
        for (text, key, problem) in [
            ("node:\n", "node", "has no value"),
            ("pid: [[1]]\n", "pid", "list of plain values"),
            ("node: {a: [1]}\n", "node", "map keys to plain values"),
        ] {
            let error = parse(text).expect_err(text);
            let message = error.to_string();
            assert!(
                message.contains(key) && message.contains(problem) && message.contains("line 1"),
                "{message}"
            );
        }
    }

    #[test]
    fn an_invalid_rule_is_named() {
        let config = parse(
            "relabel_configs:\n  - action: keep\n    source_labels: [comm]\n  - action: drop\n    regex: \"(\"\n",
        )
        .expect("parses");
        let error = config
            .relabel_rules(Path::new("firn.yaml"))
            .expect_err("bad regex");
        let message = format!(
            "{error}: {}",
            std::error::Error::source(&error).expect("the rule's error")
        );
        assert!(message.contains("relabel_configs[1]"), "{message}");
        assert!(message.contains("drop"), "{message}");
        assert!(message.contains("regex"), "{message}");
    }
}
