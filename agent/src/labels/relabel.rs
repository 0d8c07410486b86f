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

/// One rule as written, before it is checked; `None` takes the
/// Prometheus default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleSpec {
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
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> LabelSet {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn rule(yaml_like: &[(&str, &str)], sources: &[&str]) -> Rule {
        let mut spec = RuleSpec {
            source_labels: sources.iter().map(|s| (*s).to_owned()).collect(),
            ..RuleSpec::default()
        };
        for (key, value) in yaml_like {
            let value = Some((*value).to_owned());
            match *key {
                "separator" => spec.separator = value,
                "regex" => spec.regex = value,
                "modulus" => spec.modulus = value.and_then(|v| v.parse().ok()),
                "target_label" => spec.target_label = value,
                "replacement" => spec.replacement = value,
                "action" => spec.action = value,
                other => panic!("no field {other}"),
            }
        }
        Rule::new(&spec).unwrap_or_else(|error| panic!("{spec:?}: {error}"))
    }

    /// One case: rules, input, expected output (`None`: dropped).
    struct Case {
        name: &'static str,
        rules: Vec<Rule>,
        input: LabelSet,
        output: Option<LabelSet>,
    }

    fn base() -> LabelSet {
        labels(&[
            ("__meta_kubernetes_pod_label_app", "checkout"),
            ("__meta_kubernetes_pod_label_team_name", "Shop"),
            ("comm", "nginx"),
            ("pid", "42"),
        ])
    }

    fn with(extra: &[(&str, &str)]) -> LabelSet {
        let mut set = base();
        set.extend(labels(extra));
        set
    }

    fn cases() -> Vec<Case> {
        vec![
            Case {
                name: "replace with the defaults copies the source",
                rules: vec![rule(
                    &[("target_label", "app")],
                    &["__meta_kubernetes_pod_label_app"],
                )],
                input: base(),
                output: Some(with(&[("app", "checkout")])),
            },
            Case {
                name: "replace joins sources with the separator and expands groups",
                rules: vec![rule(
                    &[
                        ("separator", "/"),
                        ("regex", "(.*)/(4.)"),
                        ("target_label", "instance"),
                        ("replacement", "${1}-$2"),
                    ],
                    &["comm", "pid"],
                )],
                input: base(),
                output: Some(with(&[("instance", "nginx-42")])),
            },
            Case {
                name: "replace does nothing when the anchored regex does not match",
                rules: vec![rule(
                    &[
                        ("regex", "ngin"),
                        ("target_label", "x"),
                        ("replacement", "y"),
                    ],
                    &["comm"],
                )],
                input: base(),
                output: Some(base()),
            },
            Case {
                name: "replace with named groups",
                rules: vec![rule(
                    &[
                        ("regex", "(?P<first>n)(?P<rest>.*)"),
                        ("target_label", "short"),
                        ("replacement", "${rest}"),
                    ],
                    &["comm"],
                )],
                input: base(),
                output: Some(with(&[("short", "ginx")])),
            },
            Case {
                name: "replace to an empty value deletes the target",
                rules: vec![rule(
                    &[("target_label", "comm"), ("replacement", "")],
                    &["nonexistent"],
                )],
                input: base(),
                output: Some({
                    let mut set = base();
                    set.remove("comm");
                    set
                }),
            },
            Case {
                name: "replace into a templated target label",
                rules: vec![rule(
                    &[
                        ("regex", "(.*)"),
                        ("target_label", "proc_$1"),
                        ("replacement", "yes"),
                    ],
                    &["comm"],
                )],
                input: base(),
                output: Some(with(&[("proc_nginx", "yes")])),
            },
            Case {
                name: "a templated target that expands to an invalid name is skipped",
                rules: vec![rule(
                    &[("target_label", "$1"), ("replacement", "x")],
                    &["pid"],
                )],
                input: base(),
                output: Some(base()),
            },
            Case {
                name: "keep keeps a matching set",
                rules: vec![rule(
                    &[("action", "keep"), ("regex", "nginx|envoy")],
                    &["comm"],
                )],
                input: base(),
                output: Some(base()),
            },
            Case {
                name: "keep drops a set that does not match (anchored)",
                rules: vec![rule(&[("action", "keep"), ("regex", "ngin")], &["comm"])],
                input: base(),
                output: None,
            },
            Case {
                name: "keep on a missing label matches the empty string",
                rules: vec![rule(&[("action", "keep"), ("regex", "")], &["missing"])],
                input: base(),
                output: Some(base()),
            },
            Case {
                name: "drop drops a matching set",
                rules: vec![rule(&[("action", "DROP"), ("regex", "ng.*")], &["comm"])],
                input: base(),
                output: None,
            },
            Case {
                name: "drop keeps a set that does not match",
                rules: vec![rule(&[("action", "drop"), ("regex", "envoy")], &["comm"])],
                input: base(),
                output: Some(base()),
            },
            Case {
                name: "hashmod takes the MD5 of the value modulo",
                rules: vec![rule(
                    &[
                        ("action", "hashmod"),
                        ("modulus", "1000"),
                        ("target_label", "shard"),
                    ],
                    &["comm"],
                )],
                input: base(),
                output: Some(with(&[("shard", &md5_mod("nginx", 1000).to_string())])),
            },
            Case {
                name: "labelmap copies matching names with the replacement",
                rules: vec![rule(
                    &[
                        ("action", "labelmap"),
                        ("regex", "__meta_kubernetes_pod_label_(.+)"),
                    ],
                    &[],
                )],
                input: base(),
                output: Some(with(&[("app", "checkout"), ("team_name", "Shop")])),
            },
            Case {
                name: "labeldrop removes matching names",
                rules: vec![rule(
                    &[("action", "labeldrop"), ("regex", "__meta_.*|pid")],
                    &[],
                )],
                input: base(),
                output: Some(labels(&[("comm", "nginx")])),
            },
            Case {
                name: "labelkeep keeps only matching names",
                rules: vec![rule(&[("action", "labelkeep"), ("regex", "comm|pid")], &[])],
                input: base(),
                output: Some(labels(&[("comm", "nginx"), ("pid", "42")])),
            },
            Case {
                name: "lowercase",
                rules: vec![rule(
                    &[("action", "lowercase"), ("target_label", "team")],
                    &["__meta_kubernetes_pod_label_team_name"],
                )],
                input: base(),
                output: Some(with(&[("team", "shop")])),
            },
            Case {
                name: "uppercase",
                rules: vec![rule(
                    &[("action", "uppercase"), ("target_label", "comm")],
                    &["comm"],
                )],
                input: base(),
                output: Some(with(&[("comm", "NGINX")])),
            },
            Case {
                name: "rules apply in order, each seeing the previous result",
                rules: vec![
                    rule(
                        &[("target_label", "app")],
                        &["__meta_kubernetes_pod_label_app"],
                    ),
                    rule(&[("action", "drop"), ("regex", "checkout")], &["app"]),
                ],
                input: base(),
                output: None,
            },
        ]
    }

    fn md5_mod(value: &str, modulus: u64) -> u64 {
        let hash = Md5::digest(value.as_bytes());
        u64::from_be_bytes(hash[8..16].try_into().expect("8 bytes")) % modulus
    }

    #[test]
    fn each_action_follows_prometheus() {
        for case in cases() {
            assert_eq!(
                relabel(&case.rules, case.input),
                case.output,
                "case: {}",
                case.name
            );
        }
    }

    #[test]
    fn hashmod_matches_prometheus_values() {
        // Prometheus' own test: hashmod of "baz" modulo 1000 is 976
        // (relabel_test.go, source label `c` = "baz").
        let rule = rule(
            &[
                ("action", "hashmod"),
                ("modulus", "1000"),
                ("target_label", "b"),
            ],
            &["a"],
        );
        let out = relabel(&[rule], labels(&[("a", "baz")])).expect("kept");
        assert_eq!(out.get("b").map(String::as_str), Some("976"));
    }

    #[test]
    fn invalid_rules_are_rejected_with_the_reason() {
        let check = |spec: RuleSpec| Rule::new(&spec).expect_err("invalid");
        let spec = |action: &str| RuleSpec {
            action: Some(action.into()),
            ..RuleSpec::default()
        };
        assert!(matches!(
            check(spec("frobnicate")),
            RuleError::UnknownAction { .. }
        ));
        assert!(matches!(
            check(RuleSpec {
                regex: Some("(".into()),
                ..spec("keep")
            }),
            RuleError::Regex { .. }
        ));
        assert!(matches!(
            check(spec("replace")),
            RuleError::MissingTarget { .. }
        ));
        assert!(matches!(
            check(RuleSpec {
                target_label: Some("0bad".into()),
                ..spec("uppercase")
            }),
            RuleError::InvalidTarget { .. }
        ));
        assert_eq!(
            check(RuleSpec {
                target_label: Some("x".into()),
                ..spec("hashmod")
            }),
            RuleError::MissingModulus
        );
        assert!(matches!(
            check(RuleSpec {
                source_labels: vec!["comm".into()],
                ..spec("labeldrop")
            }),
            RuleError::NotAllowed {
                field: "source_labels",
                ..
            }
        ));
        assert!(matches!(
            check(RuleSpec {
                source_labels: vec!["no-dashes".into()],
                ..spec("keep")
            }),
            RuleError::InvalidSourceLabel { .. }
        ));
    }

    #[test]
    fn names_are_checked_and_sanitized_as_prometheus_does() {
        assert!(is_valid_name("__meta_x"));
        assert!(is_valid_name("a1"));
        assert!(!is_valid_name("1a"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("app.kubernetes.io/name"));
        assert_eq!(
            sanitize_name("app.kubernetes.io/name"),
            "app_kubernetes_io_name"
        );
    }
}
