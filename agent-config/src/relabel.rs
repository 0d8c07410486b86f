//! Prometheus relabeling (`relabel_configs`), with Prometheus' semantics:
//! anchored regexes, `;` as the default separator, `$1` / `${name}`
//! templates, MD5-based `hashmod`, and a label set with an empty value
//! meaning the label is absent. No I/O: rules are plain data.

use std::{collections::BTreeMap, fmt};

use md5::{Digest, Md5};
use regex::Regex;

/// A label set, sorted by name as Prometheus keeps it.
pub type LabelSet = BTreeMap<String, String>;

pub const DEFAULT_SEPARATOR: &str = ";";
pub const DEFAULT_REGEX: &str = "(.*)";
pub const DEFAULT_REPLACEMENT: &str = "$1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Replace,
    Keep,
    Drop,
    HashMod,
    LabelMap,
    LabelDrop,
    LabelKeep,
    Lowercase,
    Uppercase,
}

impl Action {
    pub const NAMES: [&'static str; 9] = [
        "replace",
        "keep",
        "drop",
        "hashmod",
        "labelmap",
        "labeldrop",
        "labelkeep",
        "lowercase",
        "uppercase",
    ];

    /// Prometheus accepts action names in any case.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "replace" => Self::Replace,
            "keep" => Self::Keep,
            "drop" => Self::Drop,
            "hashmod" => Self::HashMod,
            "labelmap" => Self::LabelMap,
            "labeldrop" => Self::LabelDrop,
            "labelkeep" => Self::LabelKeep,
            "lowercase" => Self::Lowercase,
            "uppercase" => Self::Uppercase,
            _ => return None,
        })
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index = *self as usize;
        f.write_str(Self::NAMES[index])
    }
}

/// One rule as written (a `relabel_configs` entry, Prometheus' keys),
/// before it is checked; `None` takes the Prometheus default.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    #[serde(default)]
    pub source_labels: Vec<String>,
    pub separator: Option<String>,
    pub regex: Option<String>,
    pub modulus: Option<u64>,
    pub target_label: Option<String>,
    pub replacement: Option<String>,
    pub action: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    #[error("unknown action `{action}` (one of {})", Action::NAMES.join(", "))]
    UnknownAction { action: String },
    #[error("the regex `{regex}` is invalid: {reason}")]
    Regex { regex: String, reason: String },
    #[error("the {action} action needs a `target_label`")]
    MissingTarget { action: Action },
    #[error("`{target}` is not a valid `target_label` for the {action} action")]
    InvalidTarget { action: Action, target: String },
    #[error("the hashmod action needs a `modulus` greater than zero")]
    MissingModulus,
    #[error("the {action} action only takes `regex`, not `{field}`")]
    NotAllowed { action: Action, field: &'static str },
    #[error("`{name}` in `source_labels` is not a valid label name")]
    InvalidSourceLabel { name: String },
}

/// A checked, compiled rule.
#[derive(Clone, Debug)]
pub struct Rule {
    source_labels: Vec<String>,
    separator: String,
    /// Anchored: `^(?:regex)$`.
    regex: Regex,
    modulus: u64,
    target_label: String,
    replacement: String,
    action: Action,
}

impl Rule {
    /// Checks a rule as Prometheus does when it loads its configuration.
    pub fn new(spec: &RuleSpec) -> Result<Self, RuleError> {
        let action = match &spec.action {
            None => Action::Replace,
            Some(name) => Action::parse(name).ok_or_else(|| RuleError::UnknownAction {
                action: name.clone(),
            })?,
        };
        let pattern = spec.regex.as_deref().unwrap_or(DEFAULT_REGEX);
        let regex = Regex::new(&format!("^(?:{pattern})$")).map_err(|error| RuleError::Regex {
            regex: pattern.to_owned(),
            reason: error.to_string(),
        })?;
        if let Some(name) = spec.source_labels.iter().find(|n| !is_valid_name(n)) {
            return Err(RuleError::InvalidSourceLabel { name: name.clone() });
        }
        let target_label = spec.target_label.clone().unwrap_or_default();
        let needs_target = matches!(
            action,
            Action::Replace | Action::HashMod | Action::Lowercase | Action::Uppercase
        );
        if needs_target && target_label.is_empty() {
            return Err(RuleError::MissingTarget { action });
        }
        // A replace target may hold `$1` templates, checked once expanded.
        let templated = action == Action::Replace && target_label.contains('$');
        if needs_target && !templated && !is_valid_name(&target_label) {
            return Err(RuleError::InvalidTarget {
                action,
                target: target_label,
            });
        }
        if action == Action::HashMod && spec.modulus.unwrap_or(0) == 0 {
            return Err(RuleError::MissingModulus);
        }
        if matches!(action, Action::LabelDrop | Action::LabelKeep) {
            let extra = [
                (!spec.source_labels.is_empty(), "source_labels"),
                (
                    spec.separator
                        .as_deref()
                        .is_some_and(|s| s != DEFAULT_SEPARATOR),
                    "separator",
                ),
                (spec.target_label.is_some(), "target_label"),
                (spec.modulus.is_some(), "modulus"),
                (
                    spec.replacement
                        .as_deref()
                        .is_some_and(|r| r != DEFAULT_REPLACEMENT),
                    "replacement",
                ),
            ];
            if let Some(&(_, field)) = extra.iter().find(|(given, _)| *given) {
                return Err(RuleError::NotAllowed { action, field });
            }
        }
        Ok(Self {
            source_labels: spec.source_labels.clone(),
            separator: spec
                .separator
                .clone()
                .unwrap_or_else(|| DEFAULT_SEPARATOR.to_owned()),
            regex,
            modulus: spec.modulus.unwrap_or(0),
            target_label,
            replacement: spec
                .replacement
                .clone()
                .unwrap_or_else(|| DEFAULT_REPLACEMENT.to_owned()),
            action,
        })
    }

    pub fn action(&self) -> Action {
        self.action
    }

    /// Applies the rule; false means the whole label set is dropped.
    fn apply(&self, labels: &mut LabelSet) -> bool {
        let value = || {
            self.source_labels
                .iter()
                .map(|name| labels.get(name).map_or("", String::as_str))
                .collect::<Vec<_>>()
                .join(&self.separator)
        };
        match self.action {
            Action::Keep => return self.regex.is_match(&value()),
            Action::Drop => return !self.regex.is_match(&value()),
            Action::Replace => {
                let value = value();
                if let Some(captures) = self.regex.captures(&value) {
                    let mut target = String::new();
                    captures.expand(&self.target_label, &mut target);
                    if is_valid_name(&target) {
                        let mut replaced = String::new();
                        captures.expand(&self.replacement, &mut replaced);
                        set(labels, target, replaced);
                    }
                }
            }
            Action::Lowercase => {
                let value = value().to_lowercase();
                set(labels, self.target_label.clone(), value);
            }
            Action::Uppercase => {
                let value = value().to_uppercase();
                set(labels, self.target_label.clone(), value);
            }
            Action::HashMod => {
                let hash = Md5::digest(value().as_bytes());
                // The last 8 bytes, big endian, as Prometheus reads them.
                let mut tail = [0u8; 8];
                tail.copy_from_slice(&hash[8..]);
                let modulo = u64::from_be_bytes(tail) % self.modulus;
                set(labels, self.target_label.clone(), modulo.to_string());
            }
            Action::LabelMap => {
                let snapshot: Vec<(String, String)> = labels
                    .iter()
                    .filter(|(name, _)| self.regex.is_match(name))
                    .map(|(name, value)| (name.clone(), value.clone()))
                    .collect();
                for (name, value) in snapshot {
                    let renamed = self.regex.replace_all(&name, self.replacement.as_str());
                    // Prometheus would reject the target later; skipping
                    // the one label keeps the rest of the set usable.
                    if is_valid_name(&renamed) {
                        set(labels, renamed.into_owned(), value);
                    }
                }
            }
            Action::LabelDrop => labels.retain(|name, _| !self.regex.is_match(name)),
            Action::LabelKeep => labels.retain(|name, _| self.regex.is_match(name)),
        }
        true
    }
}

/// An empty value removes the label, as in Prometheus.
fn set(labels: &mut LabelSet, name: String, value: String) {
    if value.is_empty() {
        labels.remove(&name);
    } else {
        labels.insert(name, value);
    }
}

/// Applies `rules` in order; `None` when a `keep` or `drop` rule discards
/// the set.
pub fn relabel(rules: &[Rule], mut labels: LabelSet) -> Option<LabelSet> {
    for rule in rules {
        if !rule.apply(&mut labels) {
            return None;
        }
    }
    Some(labels)
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, Prometheus' label names.
pub fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Prometheus' `SanitizeLabelName`: every character outside
/// `[a-zA-Z0-9_]` becomes `_`.
pub fn sanitize_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests;
