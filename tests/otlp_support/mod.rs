//! A real OpenTelemetry Collector (v0.161.0, built by `cargo xtask setup`
//! from the Go module proxy): its OTLP receiver on gRPC and HTTP, each
//! into its own pipeline and file exporter, so a test reads back what
//! arrived by which protocol; optionally a bearer token the gRPC receiver
//! demands. The files are the Collector's JSON of `ProfilesData`, read
//! back here into stacks, attributes and totals.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub fn otelcol_binary() -> PathBuf {
    let path = std::env::var_os("FIRN_OTELCOL_BIN").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/firn/otelcol-v0.161.0/bin/otelcol")
        },
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "the OpenTelemetry Collector v0.161.0 is not installed at {}: run `cargo xtask setup` \
         (or `cargo xtask test`), which builds it with Go from xtask/otelcol/",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("bound").port()
}

/// The Collector, killed when dropped.
pub struct Collector {
    child: Child,
    pub grpc_port: u16,
    pub http_port: u16,
    dir: PathBuf,
    log: PathBuf,
}

impl Collector {
    /// With `token`, the gRPC receiver refuses exports without
    /// `Authorization: Bearer <token>`.
    pub fn start(dir: &Path, token: Option<&str>) -> Self {
        Self::launch(dir, token, None)
    }

    /// Both receivers behind TLS with this certificate and key (PEM).
    pub fn start_tls(dir: &Path, cert: &Path, key: &Path) -> Self {
        Self::launch(dir, None, Some((cert, key)))
    }

    fn launch(dir: &Path, token: Option<&str>, tls: Option<(&Path, &Path)>) -> Self {
        std::fs::create_dir_all(dir).expect("collector directory");
        let (grpc_port, http_port) = (free_port(), free_port());
        let tls = tls.map_or(String::new(), |(cert, key)| {
            format!(
                "\n        tls:\n          cert_file: {}\n          key_file: {}",
                cert.display(),
                key.display()
            )
        });
        let auth = token.map_or(String::new(), |_| {
            "\n        auth:\n          authenticator: bearertokenauth".to_owned()
        });
        let extension = token.map_or(String::new(), |token| {
            format!("extensions:\n  bearertokenauth:\n    token: \"{token}\"\n")
        });
        let service_extensions = if token.is_some() {
            "  extensions: [bearertokenauth]\n"
        } else {
            ""
        };
        let file = |name: &str| dir.join(format!("{name}.json")).display().to_string();
        let config = format!(
            "{extension}receivers:
  otlp/grpc:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc_port}{auth}{tls}
  otlp/http:
    protocols:
      http:
        endpoint: 127.0.0.1:{http_port}{tls}
exporters:
  file/grpc:
    path: {}
    format: json
    flush_interval: 100ms
  file/http:
    path: {}
    format: json
    flush_interval: 100ms
service:
{service_extensions}  telemetry:
    metrics:
      level: none
  pipelines:
    profiles/grpc:
      receivers: [otlp/grpc]
      exporters: [file/grpc]
    profiles/http:
      receivers: [otlp/http]
      exporters: [file/http]
",
            file("grpc"),
            file("http"),
        );
        let config_path = dir.join("otelcol.yaml");
        std::fs::write(&config_path, config).expect("collector config");
        let log = dir.join("otelcol.log");
        let child = Command::new(otelcol_binary())
            .arg(format!("--config={}", config_path.display()))
            .arg("--feature-gates=service.profilesSupport")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("collector log"))
            .spawn()
            .expect("the Collector starts");
        let mut collector = Self {
            child,
            grpc_port,
            http_port,
            dir: dir.to_path_buf(),
            log,
        };
        collector.wait_until_ready();
        collector
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the Collector exited ({status}):\n{}", self.log());
            }
            if self.log().contains("Everything is ready") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the Collector was not ready within 60 s:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    pub fn http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// Every profile received by `protocol` ("grpc" or "http") so far.
    pub fn received(&self, protocol: &str) -> Vec<Received> {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{protocol}.json"))).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .flat_map(|export| read_export(&export))
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One profile as the Collector wrote it, resolved through its dictionary.
#[derive(Debug, Default)]
pub struct Received {
    pub resource: HashMap<String, String>,
    pub sample_type: (String, String),
    pub period: i64,
    /// Frames leaf first, each `(function, frame type)`, with the count.
    pub samples: Vec<(Vec<(String, String)>, i64)>,
    /// Every mapping's file and its `process.executable.build_id.gnu`.
    pub build_ids: Vec<(String, String)>,
    /// Sample attribute keys seen.
    pub sample_attributes: Vec<String>,
}

impl Received {
    pub fn total(&self) -> i64 {
        self.samples.iter().map(|(_, count)| count).sum()
    }

    /// The stacks as function names, leaf first, with their counts.
    pub fn stacks(&self) -> Vec<(Vec<String>, i64)> {
        self.samples
            .iter()
            .map(|(frames, count)| {
                (
                    frames.iter().map(|(name, _)| name.clone()).collect(),
                    *count,
                )
            })
            .collect()
    }
}

/// A protojson number: int64 as a string, int32 as a number, absent as 0.
fn number(value: Option<&Value>) -> i64 {
    match value {
        Some(Value::String(text)) => text.parse().unwrap_or(0),
        Some(Value::Number(number)) => number.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn list<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

struct Dictionary<'a>(&'a Value);

impl<'a> Dictionary<'a> {
    fn table(&self, name: &str, index: i64) -> Option<&'a Value> {
        list(self.0, name).get(usize::try_from(index).ok()?)
    }

    fn string(&self, index: i64) -> String {
        self.table("stringTable", index)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    }

    /// A key and value of the Collector's JSON, which may name strings by
    /// their index in the dictionary.
    fn key_value(&self, entry: &Value) -> (String, String) {
        let key = entry.get("key").and_then(Value::as_str).map_or_else(
            || self.string(number(entry.get("keyStrindex"))),
            str::to_owned,
        );
        let value = entry.get("value").cloned().unwrap_or_default();
        let value = if let Some(text) = value.get("stringValue").and_then(Value::as_str) {
            text.to_owned()
        } else if value.get("stringValueStrindex").is_some() {
            self.string(number(value.get("stringValueStrindex")))
        } else if value.get("intValue").is_some() {
            number(value.get("intValue")).to_string()
        } else {
            value.to_string()
        };
        (key, value)
    }

    fn attributes(&self, indices: &[Value]) -> Vec<(String, String)> {
        indices
            .iter()
            .filter_map(|index| self.table("attributeTable", number(Some(index))))
            .map(|entry| self.key_value(entry))
            .collect()
    }

    fn frames(&self, stack_index: i64) -> Vec<(String, String)> {
        let Some(stack) = self.table("stackTable", stack_index) else {
            return Vec::new();
        };
        let mut frames = Vec::new();
        for index in list(stack, "locationIndices") {
            let Some(location) = self.table("locationTable", number(Some(index))) else {
                continue;
            };
            let kind = self
                .attributes(list(location, "attributeIndices"))
                .into_iter()
                .find(|(key, _)| key == "profile.frame.type")
                .map(|(_, value)| value)
                .unwrap_or_default();
            for line in list(location, "lines") {
                let function = self
                    .table("functionTable", number(line.get("functionIndex")))
                    .map(|function| self.string(number(function.get("nameStrindex"))))
                    .unwrap_or_default();
                frames.push((function, kind.clone()));
            }
        }
        frames
    }
}

fn read_export(export: &Value) -> Vec<Received> {
    let empty = Value::Null;
    let dictionary = Dictionary(export.get("dictionary").unwrap_or(&empty));
    let build_ids: Vec<(String, String)> = list(dictionary.0, "mappingTable")
        .iter()
        .filter_map(|mapping| {
            let file = dictionary.string(number(mapping.get("filenameStrindex")));
            dictionary
                .attributes(list(mapping, "attributeIndices"))
                .into_iter()
                .find(|(key, _)| key == "process.executable.build_id.gnu")
                .map(|(_, build_id)| (file, build_id))
        })
        .collect();
    let mut received = Vec::new();
    for resource in list(export, "resourceProfiles") {
        let attributes: HashMap<String, String> = resource
            .get("resource")
            .map(|r| list(r, "attributes"))
            .unwrap_or_default()
            .iter()
            .map(|entry| dictionary.key_value(entry))
            .collect();
        for scope in list(resource, "scopeProfiles") {
            for profile in list(scope, "profiles") {
                let mut one = Received {
                    resource: attributes.clone(),
                    period: number(profile.get("period")),
                    ..Received::default()
                };
                if let Some(kind) = profile.get("sampleType") {
                    one.sample_type = (
                        dictionary.string(number(kind.get("typeStrindex"))),
                        dictionary.string(number(kind.get("unitStrindex"))),
                    );
                }
                for sample in list(profile, "samples") {
                    let count = list(sample, "values")
                        .iter()
                        .map(|value| number(Some(value)))
                        .sum();
                    let frames = dictionary.frames(number(sample.get("stackIndex")));
                    for (key, _) in dictionary.attributes(list(sample, "attributeIndices")) {
                        if !one.sample_attributes.contains(&key) {
                            one.sample_attributes.push(key);
                        }
                    }
                    one.samples.push((frames, count));
                }
                one.build_ids.clone_from(&build_ids);
                received.push(one);
            }
        }
    }
    received
}
