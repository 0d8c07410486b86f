//! Exporters: where built profiles go. The builder thread turns each
//! interval into a [`ProfileBatch`] (plain data) cut the way the exporter
//! asks, then hands it over through the [`Exporter`] trait.

mod batch;
mod flamegraph;
mod local;
pub mod parca;

use std::{
    sync::Arc,
    time::{Instant, SystemTime},
};

pub use batch::{build_batch, build_whole_profile, unsymbolized_objects};
pub use flamegraph::{collapsed_stacks, write_flamegraph};
pub use local::LocalStore;

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
    #[error(transparent)]
    Parca(#[from] parca::ParcaError),
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

/// One interval, built.
#[derive(Debug)]
pub struct ProfileBatch {
    pub start: SystemTime,
    pub profiles: Vec<SeriesProfile>,
    /// Objects (with a build id) the profiles have frames in, those holding
    /// frames firn could not name first, so an exporter can offer their
    /// debug information to a server that symbolizes.
    pub debuginfo_candidates: Vec<Arc<ObjectFile>>,
    /// How many of the candidates have frames firn could not name.
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
