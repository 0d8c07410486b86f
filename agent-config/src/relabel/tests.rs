//! Prometheus' documented relabeling semantics, one table case per
//! action.

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
    [
        replace_cases(),
        replace_target_cases(),
        filter_cases(),
        other_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `replace`, the default action.
fn replace_cases() -> Vec<Case> {
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
    ]
}

/// `replace` onto a target that is deleted, templated, or invalid.
fn replace_target_cases() -> Vec<Case> {
    vec![
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
    ]
}

/// `keep` and `drop`: whole label sets.
fn filter_cases() -> Vec<Case> {
    vec![
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
    ]
}

/// The actions on label names and values, and rules in sequence.
fn other_cases() -> Vec<Case> {
    vec![
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
