//! A real Parca server for the push tests, its query API, and the `firn`
//! agent run against it.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use agent_pprof::{self as pprof, Reader, proto::Profile};
use firn::output::parca::query::{
    MergeProfile, ProfileTypesRequest, QueryRequest, ValuesRequest,
    query_request::{Mode, Options, ReportType},
    query_response::Report,
    query_service_client::QueryServiceClient,
};
use tonic::transport::Channel;

// The agent guard lives with the other shared test code; re-exported for
// the tests that import it from here.
#[allow(unused_imports)]
pub use crate::common::{Agent, Stopped, log_field};

pub const CPU_PROFILE_TYPE: &str = "parca_agent_cpu:samples:count:cpu:nanoseconds:delta";

/// The Parca binary `cargo xtask setup` builds.
pub fn parca_binary() -> PathBuf {
    let path = std::env::var_os("FIRN_PARCA_BIN").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/firn/parca-v0.28.0/bin/parca")
        },
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "the Parca server v0.28.0 is not installed at {}: run `cargo xtask setup` \
         (or `cargo xtask test`), which builds it with Go",
        path.display()
    );
    path
}

/// A loopback port nothing listens on (yet).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("bound").port()
}

/// A Parca server on a loopback port with a FILESYSTEM bucket in `dir`;
/// killed when dropped.
pub struct ParcaServer {
    child: Child,
    pub port: u16,
    pub data: PathBuf,
    log: PathBuf,
}

impl ParcaServer {
    pub fn start(dir: &Path, port: u16) -> Self {
        std::fs::create_dir_all(dir).expect("parca directory");
        let data = dir.join("data");
        let config = dir.join("parca.yaml");
        std::fs::write(
            &config,
            format!(
                "object_storage:\n  bucket:\n    type: \"FILESYSTEM\"\n    config:\n      directory: \"{}\"\n",
                data.display()
            ),
        )
        .expect("parca config");
        let cache = dir.join("symbolizer-cache");
        std::fs::create_dir_all(&cache).expect("cache directory");
        let log = dir.join("parca.log");
        let child = Command::new(parca_binary())
            .current_dir(dir)
            .arg(format!("--config-path={}", config.display()))
            .arg(format!("--http-address=127.0.0.1:{port}"))
            // No debuginfod: the machine has no internet, and the tests
            // prove what firn uploads.
            .arg("--debuginfod-upstream-servers=")
            .arg("--debuginfod-http-request-timeout=1s")
            .arg(format!("--debuginfo-cache-dir={}", cache.display()))
            .arg("--storage-active-memory=268435456")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("parca log"))
            .spawn()
            .expect("the Parca server starts");
        let mut server = Self {
            child,
            port,
            data,
            log,
        };
        server.wait_until_listening();
        server
    }

    fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the Parca server exited ({status}):\n{}", self.log());
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "the Parca server did not listen within 60 s:\n{}",
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn query(&self) -> Query {
        Query::connect(self.port)
    }
}

impl Drop for ParcaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parca's own query API, blocking.
pub struct Query {
    runtime: tokio::runtime::Runtime,
    client: QueryServiceClient<Channel>,
}

fn timestamp(time: SystemTime) -> prost_types::Timestamp {
    let since = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    prost_types::Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

impl Query {
    fn connect(port: u16) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let client = runtime
            .block_on(QueryServiceClient::connect(format!(
                "http://127.0.0.1:{port}"
            )))
            .expect("connects to Parca's query API");
        Self {
            runtime,
            client: client.max_decoding_message_size(256 << 20),
        }
    }

    /// `name:sample_type:sample_unit:period_type:period_unit[:delta]`.
    pub fn profile_types(&mut self) -> Vec<String> {
        let response = self
            .runtime
            .block_on(self.client.profile_types(ProfileTypesRequest::default()))
            .expect("ProfileTypes answers")
            .into_inner();
        response
            .types
            .iter()
            .map(|t| {
                let mut name = format!(
                    "{}:{}:{}:{}:{}",
                    t.name, t.sample_type, t.sample_unit, t.period_type, t.period_unit
                );
                if t.delta {
                    name.push_str(":delta");
                }
                name
            })
            .collect()
    }

    pub fn values(&mut self, label: &str, start: SystemTime, end: SystemTime) -> Vec<String> {
        self.runtime
            .block_on(self.client.values(ValuesRequest {
                label_name: label.to_owned(),
                r#match: Vec::new(),
                start: Some(timestamp(start)),
                end: Some(timestamp(end)),
            }))
            .expect("Values answers")
            .into_inner()
            .label_values
    }

    /// The merged profile of `selector` (e.g. `{pid="42"}`) over the
    /// window, as pprof, symbolized by the server.
    pub fn merged(&mut self, selector: &str, start: SystemTime, end: SystemTime) -> Profile {
        self.try_merged(selector, start, end)
            .unwrap_or_else(|status| panic!("Query answers: {status}"))
    }

    /// [`Self::merged`], or the server's error (while it holds nothing yet,
    /// say).
    pub fn try_merged(
        &mut self,
        selector: &str,
        start: SystemTime,
        end: SystemTime,
    ) -> Result<Profile, tonic::Status> {
        self.try_merged_type(CPU_PROFILE_TYPE, selector, start, end)
    }

    /// [`Self::try_merged`] of another profile type than the CPU samples.
    pub fn try_merged_type(
        &mut self,
        profile_type: &str,
        selector: &str,
        start: SystemTime,
        end: SystemTime,
    ) -> Result<Profile, tonic::Status> {
        let request = QueryRequest {
            mode: Mode::Merge.into(),
            options: Some(Options::Merge(MergeProfile {
                query: format!("{profile_type}{selector}"),
                start: Some(timestamp(start)),
                end: Some(timestamp(end)),
            })),
            report_type: ReportType::Pprof.into(),
        };
        let response = self
            .runtime
            .block_on(self.client.query(request))?
            .into_inner();
        Ok(match response.report {
            Some(Report::Pprof(bytes)) => pprof::decode(&bytes).expect("Parca's pprof decodes"),
            None => Profile::default(),
        })
    }
}

/// Frame names of every sample with its count of samples, whatever its
/// labels. Parca answers a `samples:count` query with the counts weighted
/// by the period (`cpu/nanoseconds`); they are turned back into counts for
/// firn's default 100 Hz.
pub fn all_stacks(profile: &Profile) -> Vec<(Vec<String>, i64)> {
    let reader = Reader::new(profile);
    let unit = reader
        .sample_types()
        .first()
        .map_or("count", |&(_, unit)| unit);
    let per_sample = if unit == "nanoseconds" {
        1_000_000_000 / 100
    } else {
        1
    };
    reader
        .samples()
        .map(|sample| (sample.function_names(), sample.count() / per_sample))
        .collect()
}
