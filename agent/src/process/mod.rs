//! The process table: what each process has mapped, the ELF objects behind
//! those mappings, exec/exit tracking, and a grace period for exited
//! processes.

mod maps;
mod objects;
mod table;

pub use maps::{MappingKind, MappingSpec, MapsError, parse_maps};
pub use objects::{ContentKey, ObjectData, ObjectFile, ObjectKey, ObjectRegistry};
pub use table::{Mapping, ProcessImage, ProcessTable, ProcessTableStats};
