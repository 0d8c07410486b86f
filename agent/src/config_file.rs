//! The YAML configuration file (`--config-path`): a plain struct
//! deserialized strictly (an unknown key is an error naming it), then
//! checked and turned into the `config` structs. Today it holds
//! `relabel_configs`; more keys join it as plain fields.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::labels::relabel::{Rule, RuleError, RuleSpec};

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Prometheus `relabel_configs`, applied to every series.
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfigEntry>,
}

/// One `relabel_configs` entry, Prometheus' keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelabelConfigEntry {
    #[serde(default)]
    pub source_labels: Vec<String>,
    pub separator: Option<String>,
    pub regex: Option<String>,
    pub modulus: Option<u64>,
    pub target_label: Option<String>,
    pub replacement: Option<String>,
    pub action: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("could not read the config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the config file {path} is not valid: {reason}")]
    Parse { path: PathBuf, reason: String },
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
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigFileError> {
        // An empty file (or one holding only comments) is an empty config.
        if text
            .lines()
            .all(|line| line.trim().is_empty() || line.trim_start().starts_with('#'))
        {
            return Ok(Self::default());
        }
        serde_saphyr::from_str(text).map_err(|error| ConfigFileError::Parse {
            path: path.to_path_buf(),
            reason: error.to_string(),
        })
    }

    /// The relabeling rules, checked; an invalid one is named by its index
    /// and action.
    pub fn relabel_rules(&self, path: &Path) -> Result<Vec<Rule>, ConfigFileError> {
        self.relabel_configs
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                let spec = RuleSpec {
                    source_labels: entry.source_labels.clone(),
                    separator: entry.separator.clone(),
                    regex: entry.regex.clone(),
                    modulus: entry.modulus,
                    target_label: entry.target_label.clone(),
                    replacement: entry.replacement.clone(),
                    action: entry.action.clone(),
                };
                Rule::new(&spec).map_err(|source| ConfigFileError::Relabel {
                    path: path.to_path_buf(),
                    index,
                    action: entry.action.clone().unwrap_or_else(|| "replace".into()),
                    source,
                })
            })
            .collect()
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
    fn unknown_keys_are_rejected_by_name() {
        let error = parse("relabel_config: []\n").expect_err("unknown top-level key");
        assert!(error.to_string().contains("relabel_config"), "{error}");
        let error =
            parse("relabel_configs:\n  - source_label: [comm]\n").expect_err("unknown rule key");
        assert!(error.to_string().contains("source_label"), "{error}");
        let error = parse("relabel_configs: {a: 1}\n").expect_err("wrong shape");
        assert!(error.to_string().contains("firn.yaml"), "{error}");
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
