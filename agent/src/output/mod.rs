//! The pipeline's tail and the exporters. The builder thread takes each
//! aggregated interval through one step after another, each handing the
//! next a plain value: [`symbolize_interval`] (a [`SymbolizedInterval`]),
//! [`label_interval`] (a [`LabelledInterval`], cut the way the exporter
//! asks), [`build_batch`] (a [`ProfileBatch`]); then it hands the batch
//! over through the [`Exporter`] trait.

mod batch;
pub mod delivery;
pub mod destination;
mod fanout;
mod flamegraph;
mod labelled;
mod local;
pub mod otlp;
pub mod parca;
pub mod pyroscope;
mod symbolized;

use std::{
    fs::OpenOptions,
    path::Path,
    sync::Arc,
    time::{Instant, SystemTime},
};

pub use batch::{build_batch, build_off_cpu_batch, build_whole_profile};
pub use fanout::FanOut;
pub use flamegraph::{render_flamegraph, write_flamegraph};
pub use labelled::{LabelledInterval, SeriesStacks, label_interval};
pub use local::{LocalStore, LocalStoreConfig};
pub use symbolized::{
    FRAME_CACHE_BYTES, FrameCache, FrameTable, SymbolizedInterval, SymbolizedStack,
    symbolize_interval,
};

use crate::process::ObjectFile;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("could not write {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not create the directory {path}")]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not render the flame graph")]
    FlameGraph {
        #[source]
        source: std::io::Error,
    },
    #[error("the thread that talks to {server} has stopped")]
    Stopped { server: &'static str },
    #[error(transparent)]
    Parca(#[from] parca::ParcaError),
    #[error(transparent)]
    Pyroscope(#[from] pyroscope::PyroscopeError),
    #[error(transparent)]
    Otlp(#[from] otlp::OtlpError),
}

/// Checks that `path` can be written, without changing what is there:
/// `firn record` looks before sampling, so a typo in `--output` does not
/// cost the whole recording. A file that does not exist yet is created and
/// removed again.
pub fn check_writable(path: &Path) -> Result<(), OutputError> {
    let error = |source| OutputError::Write {
        path: path.display().to_string(),
        source,
    };
    if path.is_dir() {
        return Err(error(std::io::Error::from(
            std::io::ErrorKind::IsADirectory,
        )));
    }
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => std::fs::remove_file(path).map_err(error),
        Err(existing) if existing.kind() == std::io::ErrorKind::AlreadyExists => OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .map_err(error),
        Err(other) => Err(error(other)),
    }
}

/// How an exporter wants an interval cut into profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// One profile for everything; processes told apart by sample labels.
    Whole,
    /// One profile per label set (a process image, unless relabeling
    /// merged some), its labels the profile's series labels.
    PerProcess,
}

/// One built, gzipped pprof and the labels of the series it belongs to.
#[derive(Clone, Debug)]
pub struct SeriesProfile {
    /// Empty for [`Grouping::Whole`].
    pub labels: Vec<(String, String)>,
    pub gzipped: Vec<u8>,
    pub samples: u64,
}

/// What a batch's profiles count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProfileKind {
    /// CPU time: `samples/count` and `cpu/nanoseconds`.
    #[default]
    Cpu,
    /// Time waited (`--off-cpu`): `samples/count` and
    /// `off_cpu/nanoseconds`, which each server gets under the names it
    /// knows (see [`crate::offcpu::ServerNames`]).
    OffCpu,
}

/// One interval, built.
#[derive(Clone, Debug)]
pub struct ProfileBatch {
    pub kind: ProfileKind,
    pub start: SystemTime,
    pub profiles: Vec<SeriesProfile>,
    /// Objects (with a build id) holding frames firn could not name, so an
    /// exporter can offer their debug information to a server that
    /// symbolizes.
    pub debuginfo_candidates: Vec<Arc<ObjectFile>>,
    /// The other objects (with a build id) the profiles have frames in,
    /// all of them named.
    pub symbolized_objects: Vec<Arc<ObjectFile>>,
    /// How many objects have frames firn could not name.
    pub unsymbolized_objects: usize,
}

/// What an exporter did with a batch, for the interval's log line.
#[derive(Clone, Debug)]
pub struct ExportReceipt {
    /// "profile written", "profiles queued", ...
    pub action: &'static str,
    /// A file, a server.
    pub destination: String,
    pub bytes: usize,
}

pub trait Exporter: Send {
    fn grouping(&self) -> Grouping;

    /// Takes one batch; must not block on the network.
    fn export(&mut self, batch: ProfileBatch) -> Result<ExportReceipt, OutputError>;

    /// Shutdown: delivers what is still pending, giving up at `deadline`.
    fn finish(self: Box<Self>, deadline: Instant);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_paths_are_checked_without_a_trace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fresh = dir.path().join("p.pb.gz");
        check_writable(&fresh).expect("a new file in a directory that exists");
        assert!(!fresh.exists(), "the check leaves nothing behind");
        let existing = dir.path().join("old.pb.gz");
        std::fs::write(&existing, b"old").expect("file");
        check_writable(&existing).expect("an existing file");
        assert_eq!(std::fs::read(&existing).expect("read"), b"old");
        for bad in [dir.path().join("missing/p.pb.gz"), dir.path().to_path_buf()] {
            let error = check_writable(&bad).expect_err("refused");
            let chain = format!("{:#}", anyhow::Error::from(error));
            assert!(chain.contains(&bad.display().to_string()), "{chain}");
        }
    }
}
