//! Plain configuration, built from the command line (`cli`) and consumed by
//! the pipeline. Nothing here parses or validates flags.

use std::{fmt, net::SocketAddr, path::PathBuf, time::Duration};

pub use agent_symbolize::{DemangleMode, SymbolConfig};

/// What the BPF side samples and how.
#[derive(Clone, Debug)]
pub struct SamplingConfig {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Only these processes (tgids), filtered in the kernel; empty = all.
    pub pids: Vec<u32>,
    /// Ring buffer size in bytes (a power of two, at least a page);
    /// `None` sizes it from the CPU count.
    pub ring_buffer_bytes: Option<u32>,
    /// User stack bytes copied per sample for unwinding the leaf frame with
    /// CFI (frame-pointer walks lose the caller of a leaf without a frame).
    pub leaf_stack_copy_bytes: u32,
    /// How user stacks are unwound.
    pub unwind: UnwindMode,
    /// User stack bytes copied per sample of a process unwound with DWARF.
    pub stack_copy_bytes: u32,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            frequency_hz: 100,
            pids: Vec::new(),
            ring_buffer_bytes: None,
            leaf_stack_copy_bytes: 1024,
            unwind: UnwindMode::Auto,
            stack_copy_bytes: 16 * 1024,
        }
    }
}

/// How user stacks are unwound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnwindMode {
    /// Per process: DWARF where its code lacks frame pointers.
    #[default]
    Auto,
    /// The kernel's frame-pointer walk, leaf repaired with CFI.
    FramePointers,
    /// DWARF CFI over a copy of the stack, for every process.
    Dwarf,
}

/// Sizes of every cache and queue.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Processes tracked at once.
    pub max_processes: usize,
    /// Open ELF objects (file handles, build ids) kept.
    pub max_objects: usize,
    /// Bytes of unwind tables kept in memory.
    pub unwind_cache_bytes: usize,
    /// Distinct stacks per profile; samples beyond are counted as dropped.
    pub max_stacks_per_profile: usize,
    /// How long an exited process stays resolvable.
    pub exited_process_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_processes: 16_384,
            max_objects: 4_096,
            unwind_cache_bytes: 32 << 20,
            max_stacks_per_profile: 200_000,
            exited_process_grace: Duration::from_secs(30),
        }
    }
}

/// Where separate debug files are looked for (GDB's debug-file-directory),
/// inside a process's root first, then on the host: opened with each
/// object, for the symbolizer and the debuginfo upload.
#[derive(Clone, Debug)]
pub struct DebugFileConfig {
    pub directories: Vec<PathBuf>,
}

impl Default for DebugFileConfig {
    fn default() -> Self {
        Self {
            directories: vec![PathBuf::from("/usr/lib/debug")],
        }
    }
}

/// `firn record`: one recording, one profile.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    pub sampling: SamplingConfig,
    pub limits: Limits,
    pub symbols: SymbolConfig,
    pub debug_files: DebugFileConfig,
    /// Sample labels and relabeling (no Kubernetes watch for one recording).
    pub metadata: MetadataConfig,
    pub duration: Duration,
    pub output: PathBuf,
    pub flamegraph: Option<PathBuf>,
}

/// `firn`: the long-running agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub sampling: SamplingConfig,
    pub limits: Limits,
    pub symbols: SymbolConfig,
    pub debug_files: DebugFileConfig,
    /// One profile per interval.
    pub profiling_duration: Duration,
    /// Used when there is no remote store.
    pub local_store: LocalStoreConfig,
    /// Where profiles are pushed instead of the local store.
    pub remote_store: Option<RemoteStoreConfig>,
    /// Labels on every series: `node`, external labels, process metadata,
    /// relabeling.
    pub metadata: MetadataConfig,
    pub debuginfo: DebuginfoConfig,
    /// Where /metrics, /healthy and /ready are served.
    pub http_address: SocketAddr,
}

#[derive(Clone, Debug)]
pub struct LocalStoreConfig {
    pub directory: PathBuf,
    /// Oldest profiles are deleted (and counted) beyond this many bytes.
    pub max_bytes: u64,
}

/// A Parca server (or anything serving its profile store API).
#[derive(Clone, Debug)]
pub struct RemoteStoreConfig {
    /// `host:port`.
    pub address: String,
    /// `None`: plaintext gRPC (`--remote-store-insecure`).
    pub tls: Option<TlsConfig>,
    pub bearer_token: Option<Secret>,
    /// Extra gRPC metadata sent with every request.
    pub grpc_headers: Vec<(String, Secret)>,
    /// Bytes of unsent profiles kept; the oldest are dropped beyond.
    pub queue_bytes: u64,
    /// Longest one push may take before it is retried.
    pub request_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// Certificates (DER) trusted on top of the system's roots.
    pub extra_roots: Vec<Vec<u8>>,
    /// Accept any server certificate (`--remote-store-insecure-skip-verify`).
    pub skip_verify: bool,
}

/// A credential: its `Debug` never shows it, so it cannot leak into logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// How series are labelled.
#[derive(Clone, Debug)]
pub struct MetadataConfig {
    /// The `node` label.
    pub node: String,
    /// Added to every series (`--metadata-external-labels`).
    pub external_labels: Vec<(String, String)>,
    /// `relabel_configs` from the config file, applied in order.
    pub relabel_rules: Vec<crate::labels::Rule>,
    /// Pod labels from the API server; `None` outside Kubernetes.
    pub kubernetes: Option<KubernetesConfig>,
}

/// The Kubernetes API server the pods of this node are watched through.
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    /// `https://host:port` (`http://` only when asked for explicitly).
    pub api_server: String,
    /// The service account token, read at every connection (it rotates).
    pub token_file: Option<PathBuf>,
    /// The only CA trusted for the API server; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The node whose pods are watched (`spec.nodeName`).
    pub node: String,
}

/// Uploads of debug information to the remote store, for the objects whose
/// frames firn could not name: their debug files (see [`DebugFileConfig`]),
/// else the objects themselves.
#[derive(Clone, Debug)]
pub struct DebuginfoConfig {
    pub upload: bool,
    /// Uploads at once.
    pub max_parallel: usize,
    /// Longest one upload may take.
    pub upload_timeout: Duration,
}

impl Default for DebuginfoConfig {
    fn default() -> Self {
        Self {
            upload: true,
            max_parallel: 4,
            upload_timeout: Duration::from_secs(120),
        }
    }
}
