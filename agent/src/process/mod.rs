//! The process table: what each process has mapped, the ELF objects behind
//! those mappings, exec/exit tracking, and a grace period for exited
//! processes.

mod debugfiles;
mod ids;
mod maps;
mod objects;
pub mod offload;
mod sources;
mod table;

pub use agent_proc::maps::{MappingKind, MappingSpec, parse_maps};
pub use debugfiles::{DebugFile, DebugFileConfig, DebugFileKind, open_debug_files};
pub use ids::ContentId;
pub use maps::{MapsError, read_maps, read_maps_as_text};
pub use objects::{ContentKey, ObjectContents, ObjectData, ObjectFile, ObjectKey, ObjectRegistry};
pub use sources::PerfMapFile;
pub use table::{Mapping, ProcessImage, ProcessTable, ProcessTableConfig, ProcessTableStats};
