//! Reading `/proc/PID/maps` (bounded); `agent_proc::maps` parses it.

use std::{io, path::Path};

use agent_proc::maps::{MappingSpec, ParseError, parse_maps};

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

/// Reads and parses `/proc/PID/maps` under `proc_root`.
pub fn read_maps(proc_root: &Path, pid: u32) -> Result<Vec<MappingSpec>, MapsError> {
    let path = proc_root.join(pid.to_string()).join("maps");
    let text = read_bounded(&path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => MapsError::Gone { pid },
        // A process that exits mid-read gives ESRCH.
        _ if source.raw_os_error() == Some(libc::ESRCH) => MapsError::Gone { pid },
        _ => MapsError::Read { pid, source },
    })?;
    // Kernel threads (and processes in the middle of exiting) have an empty
    // maps file: no user mappings, nothing to resolve.
    Ok(parse_maps(pid, &text)?)
}

/// The most of a maps file read: a process with a million mappings (about
/// 100 MB of text) must not make firn allocate that much. Beyond it the
/// maps are unreadable (counted as a read failure).
const MAX_MAPS_BYTES: u64 = 32 << 20;

fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_MAPS_BYTES + 1)
        .read_to_end(&mut text)?;
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
