//! The process table's objects and perf maps as the symbolizer reads them:
//! through the files opened (with [`crate::untrusted`]'s checks) when the
//! process was first seen, nothing opened again.

use std::{
    fs::File,
    io,
    os::unix::fs::{FileExt, MetadataExt},
    sync::Arc,
};

use agent_elf::{Bytes, ElfLayout, ObjectKey};
use agent_symbolize::{DebugFileBytes, ObjectSource, PerfMapSource, PerfMapStat};

use super::objects::ObjectFile;

impl ObjectSource for ObjectFile {
    fn key(&self) -> ObjectKey {
        self.key
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn layout(&self) -> &ElfLayout {
        &self.layout
    }

    fn bytes(&self) -> io::Result<Bytes> {
        Ok(Bytes::new(Arc::new(self.data()?)))
    }

    fn debug_files(&self) -> usize {
        self.debug_files.len()
    }

    fn debug_file(&self, index: usize) -> io::Result<DebugFileBytes> {
        let candidate = self.debug_files.get(index).ok_or(io::ErrorKind::NotFound)?;
        Ok(DebugFileBytes {
            kind: candidate.kind,
            path: candidate.path.display().to_string(),
            bytes: Bytes::new(Arc::new(candidate.data()?)),
        })
    }
}

/// A process's perf map, opened (through its root) by the process table.
#[derive(Debug)]
pub struct PerfMapFile(pub File);

impl PerfMapSource for PerfMapFile {
    fn stat(&self) -> io::Result<PerfMapStat> {
        let meta = self.0.metadata()?;
        Ok(PerfMapStat {
            identity: (meta.dev(), meta.ino()),
            len: meta.len(),
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
}
