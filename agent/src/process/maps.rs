//! Reading `/proc/PID/maps` (bounded); `agent_proc::maps` parses it.

use std::{
    fs::File,
    io::{self, Read},
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
};

use agent_proc::maps::{MappingSpec, ParseError, parse_maps};

mod query;

#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    /// The process exited (or never existed): its frames stay unknown.
    #[error("process {pid} is gone")]
    Gone { pid: u32 },
    #[error("could not read /proc/{pid}/maps")]
    Read {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// The executable mappings of `pid`, from `/proc/PID/maps` under
/// `proc_root`: asked of the kernel one executable mapping at a time
/// (`PROCMAP_QUERY`, Linux 6.11+), else read as text. The text prints every
/// mapping (a JVM's or a Go program's hundreds of heap and stack ones), a
/// line and a path each, for the handful firn keeps: the query costs a
/// fraction of it, and a process is read at least once in its life.
pub fn read_maps(proc_root: &Path, pid: u32) -> Result<Vec<MappingSpec>, MapsError> {
    let file = open_maps(proc_root, pid)?;
    if QUERY_SUPPORTED.load(Ordering::Relaxed) {
        match query::executable_mappings(&file) {
            Ok(mappings) => return Ok(mappings),
            Err(query::Error::Unsupported) => QUERY_SUPPORTED.store(false, Ordering::Relaxed),
            // A name longer than the query's buffer: the text has it.
            Err(query::Error::NameTooLong) => {}
            Err(query::Error::Io(source)) => return Err(read_error(pid, source)),
        }
    }
    parse_text(file, pid)
}

/// The executable mappings of `pid` read from the text of `/proc/PID/maps`
/// alone, as kernels before 6.11 give them (and for comparison).
pub fn read_maps_as_text(proc_root: &Path, pid: u32) -> Result<Vec<MappingSpec>, MapsError> {
    parse_text(open_maps(proc_root, pid)?, pid)
}

fn open_maps(proc_root: &Path, pid: u32) -> Result<File, MapsError> {
    let path = proc_root.join(pid.to_string()).join("maps");
    File::open(&path).map_err(|source| read_error(pid, source))
}

fn parse_text(file: File, pid: u32) -> Result<Vec<MappingSpec>, MapsError> {
    let text = read_bounded(file).map_err(|source| read_error(pid, source))?;
    // Kernel threads (and processes in the middle of exiting) have an empty
    // maps file: no user mappings, nothing to resolve.
    Ok(parse_maps(pid, &text)?)
}

/// Until a kernel without `PROCMAP_QUERY` says so.
static QUERY_SUPPORTED: AtomicBool = AtomicBool::new(true);

fn read_error(pid: u32, source: io::Error) -> MapsError {
    match source.kind() {
        io::ErrorKind::NotFound => MapsError::Gone { pid },
        // A process that exits mid-read gives ESRCH.
        _ if source.raw_os_error() == Some(libc::ESRCH) => MapsError::Gone { pid },
        _ => MapsError::Read { pid, source },
    }
}

/// The most of a maps file read: a process with a million mappings (about
/// 100 MB of text) must not make firn allocate that much. Beyond it the
/// maps are unreadable (counted as a read failure).
const MAX_MAPS_BYTES: u64 = 32 << 20;

fn read_bounded(file: File) -> io::Result<Vec<u8>> {
    let mut text = Vec::new();
    file.take(MAX_MAPS_BYTES + 1).read_to_end(&mut text)?;
    if text.len() as u64 > MAX_MAPS_BYTES {
        return Err(io::Error::other(format!(
            "more than {MAX_MAPS_BYTES} bytes of mappings"
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_process_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            read_maps(dir.path(), 4242),
            Err(MapsError::Gone { pid: 4242 })
        ));
    }
}
