//! `/proc/PID/maps`: parsing (pure) and reading.

use std::{io, path::Path};

use procfs::{
    FromBufRead,
    process::{MMPermissions, MMapPath, MemoryMaps},
};

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
    #[error("could not parse /proc/{pid}/maps")]
    Parse {
        pid: u32,
        #[source]
        source: procfs::ProcError,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappingKind {
    /// Backed by a file; `path` is as the process sees it.
    File,
    /// The kernel's vDSO.
    Vdso,
    /// Executable memory with no file (JIT code).
    Anonymous,
}

/// One executable mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingSpec {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// `makedev(major, minor)` as the kernel reports it for the file.
    pub dev: u64,
    pub inode: u64,
    pub path: String,
    pub kind: MappingKind,
    /// The file was deleted or replaced after it was mapped.
    pub deleted: bool,
}

fn makedev(major: i32, minor: i32) -> u64 {
    let (major, minor) = (major as u64, minor as u64);
    ((major & 0xffff_f000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0xff)
}

/// The executable mappings in the text of `/proc/PID/maps`, sorted by start.
pub fn parse_maps(pid: u32, text: &[u8]) -> Result<Vec<MappingSpec>, MapsError> {
    let maps =
        MemoryMaps::from_buf_read(text).map_err(|source| MapsError::Parse { pid, source })?;
    let mut mappings: Vec<MappingSpec> = maps
        .into_iter()
        .filter(|map| map.perms.contains(MMPermissions::EXECUTE))
        .filter_map(|map| {
            let (kind, path, deleted) = match map.pathname {
                MMapPath::Path(path) => {
                    let text = path.to_string_lossy();
                    let (path, deleted) = match text.strip_suffix(" (deleted)") {
                        Some(stripped) => (stripped.to_owned(), true),
                        None => (text.into_owned(), false),
                    };
                    // memfd code is JIT output, not a file to symbolize.
                    if path.starts_with("/memfd:") {
                        (MappingKind::Anonymous, path, deleted)
                    } else {
                        (MappingKind::File, path, deleted)
                    }
                }
                MMapPath::Vdso => (MappingKind::Vdso, "[vdso]".to_owned(), false),
                MMapPath::Anonymous => (MappingKind::Anonymous, String::new(), false),
                // [vsyscall] and friends: nothing to symbolize.
                _ => return None,
            };
            Some(MappingSpec {
                start: map.address.0,
                end: map.address.1,
                offset: map.offset,
                dev: makedev(map.dev.0, map.dev.1),
                inode: map.inode,
                path,
                kind,
                deleted,
            })
        })
        .collect();
    mappings.sort_by_key(|m| m.start);
    Ok(mappings)
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
    parse_maps(pid, &text)
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

    const MAPS: &str = "\
55d4e0a00000-55d4e0a01000 r--p 00000000 fe:01 1311834                    /usr/bin/chain
55d4e0a01000-55d4e0a02000 r-xp 00001000 fe:01 1311834                    /usr/bin/chain
55d4e0a02000-55d4e0a03000 r--p 00002000 fe:01 1311834                    /usr/bin/chain
55d4e1c5e000-55d4e1c7f000 rw-p 00000000 00:00 0                          [heap]
7f2a1c028000-7f2a1c17d000 r-xp 00028000 fe:01 1049013                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f2a1c300000-7f2a1c301000 rwxp 00000000 00:00 0 
7f2a1c400000-7f2a1c401000 r-xp 00000000 00:05 2048                       /memfd:jit (deleted)
7f2a1c500000-7f2a1c501000 r-xp 00000000 fe:01 99                         /opt/app/old.so (deleted)
7ffd6b9e8000-7ffd6ba09000 rw-p 00000000 00:00 0                          [stack]
7ffd6bbc4000-7ffd6bbc6000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn keeps_executable_mappings_only() {
        let maps = parse_maps(1, MAPS.as_bytes()).expect("parses");
        let paths: Vec<&str> = maps.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/usr/bin/chain",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "",
                "/memfd:jit",
                "/opt/app/old.so",
                "[vdso]",
            ]
        );
        let exe = &maps[0];
        assert_eq!(
            (exe.start, exe.end, exe.offset),
            (0x55d4e0a01000, 0x55d4e0a02000, 0x1000)
        );
        assert_eq!(exe.inode, 1311834);
        assert_eq!(exe.dev, makedev(0xfe, 1));
        assert_eq!(exe.kind, MappingKind::File);
        assert_eq!(maps[2].kind, MappingKind::Anonymous);
        assert_eq!(maps[3].kind, MappingKind::Anonymous);
        assert!(maps[4].deleted);
        assert_eq!(maps[5].kind, MappingKind::Vdso);
    }

    #[test]
    fn garbage_is_a_parse_error() {
        assert!(matches!(
            parse_maps(7, b"this is not a maps file\n"),
            Err(MapsError::Parse { pid: 7, .. })
        ));
    }

    #[test]
    fn a_missing_process_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            read_maps(dir.path(), 4242),
            Err(MapsError::Gone { pid: 4242 })
        ));
    }
}
