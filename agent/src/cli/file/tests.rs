use std::time::Duration;

use super::*;
use crate::{
    cli::Command as Subcommand,
    config::{AgentConfig, RecordConfig},
    logging::LogFormat,
};

/// `firn ARGS --config-path <file holding text>`.
fn parse_with(text: &str, args: &[&str]) -> (tempfile::TempDir, Result<Cli, ArgsError>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("firn.yaml");
    std::fs::write(&path, text).expect("config file");
    let mut argv: Vec<String> = vec!["firn".into()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv.push("--config-path".into());
    argv.push(path.display().to_string());
    let parsed = parse_args(argv);
    (dir, parsed)
}

fn agent(text: &str, args: &[&str]) -> AgentConfig {
    let (_dir, parsed) = parse_with(text, args);
    let cli = parsed.expect("valid flags and file");
    AgentConfig::try_from(&cli.agent).expect("a usable config")
}

fn refused(text: &str, args: &[&str]) -> String {
    let (_dir, parsed) = parse_with(text, args);
    match parsed {
        Err(ArgsError::ConfigFile(error)) => error.to_string(),
        Err(ArgsError::Clap(error)) => panic!("a clap error instead of a file error: {error}"),
        Ok(_) => panic!("accepted:\n{text}"),
    }
}

#[test]
fn the_file_sets_flags_and_the_command_line_wins() {
    let text = "\
profiling-duration: 5s
frequency: 49
pid: [11, 12]
node: from-file
metadata-external-labels: {cluster: prod, region: eu}
http-address: 127.0.0.1:9999
log-format: json
debuginfo-upload-disable: true
relabel_configs:
  - action: labeldrop
    regex: cgroup
";
    let config = agent(text, &[]);
    assert_eq!(config.profiling_duration, Duration::from_secs(5));
    assert_eq!(config.sampling.frequency_hz, 49);
    assert_eq!(config.sampling.pids, [11, 12]);
    assert_eq!(config.metadata.node, "from-file");
    assert_eq!(
        config.metadata.external_labels,
        [
            ("cluster".to_owned(), "prod".to_owned()),
            ("region".to_owned(), "eu".to_owned())
        ]
    );
    assert_eq!(config.http_address.port(), 9999);
    assert!(!config.debuginfo.upload);
    assert_eq!(config.metadata.relabel_rules.len(), 1);

    let config = agent(text, &["--frequency", "99", "--pid", "13", "--node", "cli"]);
    assert_eq!(config.sampling.frequency_hz, 99, "the command line wins");
    assert_eq!(config.sampling.pids, [13], "a list is replaced, not merged");
    assert_eq!(config.metadata.node, "cli");
    assert_eq!(config.profiling_duration, Duration::from_secs(5));

    let (_dir, parsed) = parse_with(text, &["--log-format", "logfmt"]);
    assert_eq!(
        LogFormat::from(parsed.expect("valid").log_format),
        LogFormat::Logfmt
    );
    let (_dir, parsed) = parse_with(text, &[]);
    assert_eq!(
        LogFormat::from(parsed.expect("valid").log_format),
        LogFormat::Json
    );
}

#[test]
fn aliases_are_keys_too() {
    let config = agent("profiling-cpu-sampling-frequency: 19\n", &[]);
    assert_eq!(config.sampling.frequency_hz, 19);
}

#[test]
fn record_reads_its_own_flags_from_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("record.yaml");
    std::fs::write(&path, "duration: 3s\nfrequency: 77\nlog-level: debug\n").expect("file");
    let cli = parse_args([
        "firn",
        "record",
        "--config-path",
        path.to_str().expect("utf-8"),
        "--frequency",
        "88",
    ])
    .expect("valid");
    assert_eq!(cli.log_level, "debug", "global flags apply from the file");
    let Some(Subcommand::Record(args)) = cli.command else {
        panic!("record");
    };
    let config = RecordConfig::try_from(&args).expect("usable");
    assert_eq!(config.duration, Some(Duration::from_secs(3)));
    assert_eq!(config.sampling.frequency_hz, 88);

    // An agent flag is unknown to `firn record`.
    std::fs::write(&path, "profiling-duration: 3s\n").expect("file");
    let Err(ArgsError::ConfigFile(error)) = parse_args([
        "firn",
        "record",
        "--config-path",
        path.to_str().expect("utf-8"),
    ]) else {
        panic!("an agent flag in a record config must be refused");
    };
    let message = error.to_string();
    assert!(
        message.contains("`profiling-duration`") && message.contains("firn record --help"),
        "{message}"
    );
}

#[test]
fn unknown_and_misspelt_keys_are_named() {
    let message = refused("frequency: 99\nno-such-flag: 1\n", &[]);
    assert!(
        message.contains("line 2") && message.contains("unknown key `no-such-flag`"),
        "{message}"
    );
    let message = refused("profiling_duration: 5s\n", &[]);
    assert!(
        message.contains("`profiling_duration`") && message.contains("`profiling-duration`"),
        "snake_case is refused with the right spelling: {message}"
    );
    let message = refused("--frequency: 5\n", &[]);
    assert!(message.contains("did you mean `frequency`?"), "{message}");
    let message = refused("relabel-configs: []\n", &[]);
    assert!(
        message.contains("did you mean `relabel_configs`"),
        "{message}"
    );
    let message = refused("relabel_config: []\n", &[]);
    assert!(
        message.contains("unknown key `relabel_config`"),
        "{message}"
    );
    let message = refused("config-path: other.yaml\n", &[]);
    assert!(
        message.contains("cannot be set in the config file"),
        "{message}"
    );
    let message = refused("help: true\n", &[]);
    assert!(message.contains("unknown key `help`"), "{message}");
}

#[test]
fn values_are_checked_by_the_flags_parsers_and_named_with_their_line() {
    for (text, wanted) in [
        (
            "\nfrequency: 0\n",
            ["line 2", "`frequency: 0`", "1..=10000"],
        ),
        (
            "profiling-duration: soon\n",
            ["line 1", "`profiling-duration: soon`", "duration"],
        ),
        (
            "log-format: xml\n",
            ["line 1", "`log-format: xml`", "logfmt"],
        ),
        (
            "http-address: nowhere\n",
            ["line 1", "`http-address: nowhere`", "invalid"],
        ),
        (
            "remote-store-insecure: yes please\n",
            ["line 1", "remote-store-insecure", "true or false"],
        ),
        ("frequency: [1, 2]\n", ["line 1", "frequency", "one value"]),
        ("pid: [1, -2]\n", ["line 1", "`pid: -2`", "invalid"]),
    ] {
        let message = refused(text, &[]);
        for part in wanted {
            assert!(message.contains(part), "`{part}` missing from: {message}");
        }
    }
    // A bad value is an error even when the command line overrides it.
    let message = refused("frequency: 0\n", &["--frequency", "99"]);
    assert!(message.contains("`frequency: 0`"), "{message}");
}

#[test]
fn conflicts_between_the_file_and_the_command_line_are_refused() {
    let message = refused(
        "remote-store-address: h:1\nremote-store-insecure: true\n",
        &["--remote-store-ca-file", "/etc/ca.pem"],
    );
    assert!(
        message.contains("line 2")
            && message.contains("`remote-store-insecure`")
            && message.contains("--remote-store-ca-file"),
        "{message}"
    );
    let message = refused(
        "remote-store-address: h:1\nremote-store-insecure: true\nremote-store-ca-file: /x.pem\n",
        &[],
    );
    assert!(message.contains("cannot be used with"), "{message}");
    // A switch the file turns off conflicts with nothing.
    let config = agent(
        "remote-store-address: h:1\nremote-store-insecure: false\nremote-store-insecure-skip-verify: true\n",
        &[],
    );
    assert!(config.remote_store().expect("remote").tls.is_some());
}

#[test]
fn without_a_config_file_the_command_line_alone_counts() {
    let cli = parse_args(["firn", "--frequency", "33"]).expect("valid");
    assert_eq!(cli.agent.sampling.frequency, 33);
    let Err(ArgsError::Clap(error)) = parse_args(["firn", "--frequency", "0"]) else {
        panic!("a bad flag is clap's error");
    };
    assert_eq!(error.exit_code(), 2);
    let Err(ArgsError::ConfigFile(error)) =
        parse_args(["firn", "--config-path", "/nonexistent/firn.yaml"])
    else {
        panic!("a missing file is an error");
    };
    assert!(
        error.to_string().contains("/nonexistent/firn.yaml"),
        "{error}"
    );
}

#[test]
fn relabel_rules_come_from_the_one_read_of_the_file() {
    let rules = "relabel_configs:\n- action: drop\n  source_labels: [comm]\n  regex: sleep\n";
    assert_eq!(agent(rules, &[]).metadata.relabel_rules.len(), 1);
    let (_dir, parsed) = parse_with(rules, &["record"]);
    let cli = parsed.expect("valid flags and file");
    let Some(Subcommand::Record(args)) = &cli.command else {
        panic!("not a recording: {cli:?}");
    };
    let config = RecordConfig::try_from(args).expect("a usable config");
    assert_eq!(config.metadata.relabel_rules.len(), 1);
    assert!(refused("relabel_configs:\n  - action: explode\n", &[]).contains("explode"));
}
