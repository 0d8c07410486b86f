//! What `firn` and `firn record` run with: each stage's own config,
//! assembled from the command line and the config file (`cli`). The stages
//! define their configs; nothing here parses or validates flags, and no
//! stage imports this module.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use agent_symbolize::SymbolConfig;

use crate::{
    labels::MetadataConfig,
    output::{
        LocalStoreConfig,
        otlp::OtlpConfig,
        parca::{DebuginfoConfig, RemoteStoreConfig},
        pyroscope::PyroscopeConfig,
    },
    sampler::SamplingConfig,
    session::PipelineConfig,
};

/// `firn record`: one recording, one profile.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    pub sampling: SamplingConfig,
    pub pipeline: PipelineConfig,
    pub symbols: SymbolConfig,
    /// Sample labels and relabeling (no Kubernetes watch for one recording).
    pub metadata: MetadataConfig,
    /// `None`: 10 s, or with a command until it exits.
    pub duration: Option<Duration>,
    pub output: PathBuf,
    pub flamegraph: Option<PathBuf>,
    /// The command to start and profile (empty: none).
    pub command: Vec<std::ffi::OsString>,
    /// Status line and summary on a terminal.
    pub summary: bool,
}

/// `firn top`: a live view of the hottest functions.
#[derive(Clone, Debug)]
pub struct TopConfig {
    pub sampling: SamplingConfig,
    pub pipeline: PipelineConfig,
    pub symbols: SymbolConfig,
    pub metadata: MetadataConfig,
    /// How often the view is redrawn.
    pub refresh: Duration,
}

/// `firn`: the long-running agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub sampling: SamplingConfig,
    pub pipeline: PipelineConfig,
    pub symbols: SymbolConfig,
    /// One profile per interval.
    pub profiling_duration: Duration,
    /// Used when there is no remote store.
    pub local_store: LocalStoreConfig,
    /// Where profiles are pushed instead of the local store: every one
    /// gets every profile.
    pub destinations: Vec<DestinationConfig>,
    /// Labels on every series: `node`, external labels, process metadata,
    /// relabeling.
    pub metadata: MetadataConfig,
    pub debuginfo: DebuginfoConfig,
    /// Where /metrics, /healthy and /ready are served.
    pub http_address: SocketAddr,
}

/// One server profiles are pushed to.
#[derive(Clone, Debug)]
pub enum DestinationConfig {
    Parca {
        store: RemoteStoreConfig,
        /// The `destination` label of its metrics.
        name: String,
    },
    Pyroscope(PyroscopeConfig),
    Otlp(OtlpConfig),
}

impl AgentConfig {
    /// The first Parca server, if any.
    pub fn remote_store(&self) -> Option<&RemoteStoreConfig> {
        self.destinations.iter().find_map(|d| match d {
            DestinationConfig::Parca { store, .. } => Some(store),
            DestinationConfig::Pyroscope(_) | DestinationConfig::Otlp(_) => None,
        })
    }
}
