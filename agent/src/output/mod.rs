//! Exporters: where built profiles go.

mod flamegraph;
mod local;

pub use flamegraph::{collapsed_stacks, write_flamegraph};
pub use local::LocalStore;

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
}
