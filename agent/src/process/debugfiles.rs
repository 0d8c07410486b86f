//! Separate debug files: the candidates `agent_elf::debug_files` names,
//! opened when the object is first opened (while the process, and so its
//! mount namespace, surely exists) and kept open like the object; checked
//! against the object later (`agent_elf::debug_files::matches`), off the
//! sampling path, because a debuglink check reads the whole file.

use std::{collections::HashSet, fs::File, io, os::unix::fs::MetadataExt, path::PathBuf};

use super::objects::ObjectData;
use crate::untrusted::{MAX_OBJECT_BYTES, MappedFile, OpenError, ProcessRoot, open_host_file};
pub use agent_elf::debug_files::DebugFileKind;
use agent_elf::{ElfLayout, debug_files};

/// At most this many candidate debug files are kept open per object.
const MAX_DEBUG_FILES: usize = 4;

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

/// A debug file candidate, open.
#[derive(Debug)]
pub struct DebugFile {
    /// Where it was opened (through `/proc/PID/root` or on the host).
    pub path: PathBuf,
    pub kind: DebugFileKind,
    file: File,
}

impl DebugFile {
    pub fn new(path: PathBuf, kind: DebugFileKind, file: File) -> Self {
        Self { path, kind, file }
    }

    /// The file's bytes, memory-mapped.
    pub fn data(&self) -> io::Result<ObjectData> {
        MappedFile::map(&self.file).map(ObjectData::Mapped)
    }

    /// The open file, for positioned reads that map nothing.
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// Opens the debug files of an object that has no DWARF of its own: each
/// candidate inside the process's root first (when it has one, i.e.
/// `/proc/PID/root` could be opened), then on the host. Files reached both
/// ways are kept once. Refused files (FIFOs, devices, giants) are passed
/// to `refused` and skipped.
pub fn open_debug_files(
    process_root: Option<&ProcessRoot>,
    object_path: &str,
    layout: &ElfLayout,
    directories: &[PathBuf],
    refused: &dyn Fn(&OpenError),
) -> Vec<DebugFile> {
    if layout.has_debug_info {
        return Vec::new();
    }
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for debug_files::Candidate { path, kind } in
        debug_files::candidates(object_path, layout, directories)
    {
        let inside = process_root.map(|root| {
            (
                root.open_file(&path, MAX_OBJECT_BYTES),
                PathBuf::from(format!("[process root]{}", path.display())),
            )
        });
        let on_host = (open_host_file(&path, MAX_OBJECT_BYTES), path.clone());
        for (opened, shown) in inside.into_iter().chain([on_host]) {
            let file = match opened {
                Ok(file) => file,
                Err(error) => {
                    refused(&error);
                    continue;
                }
            };
            let Ok(meta) = file.metadata() else { continue };
            if !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            found.push(DebugFile {
                path: shown,
                kind,
                file,
            });
            if found.len() == MAX_DEBUG_FILES {
                return found;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_elf::BuildId;

    fn layout(build_id: &[u8]) -> ElfLayout {
        ElfLayout {
            build_id: Some(BuildId::new(build_id)),
            ..ElfLayout::default()
        }
    }

    #[test]
    fn debug_files_are_found_in_the_process_root_first() {
        let root = tempfile::tempdir().expect("tempdir");
        let host_dirs = tempfile::tempdir().expect("tempdir");
        // The same relative layout under the "process root" and the host
        // debug directory; the first must win.
        let debug_dir = host_dirs.path().join("debug");
        let inside = root
            .path()
            .join(debug_dir.strip_prefix("/").expect("absolute"));
        for base in [&inside, &debug_dir] {
            let dir = base.join(".build-id/ab");
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("cd.debug"), b"x").expect("write");
        }
        let layout = layout(&[0xab, 0xcd]);
        let process_root = ProcessRoot::open(root.path()).expect("root");
        let found = open_debug_files(
            Some(&process_root),
            "/bin/app",
            &layout,
            std::slice::from_ref(&debug_dir),
            &|_| {},
        );
        assert_eq!(found.len(), 2);
        assert!(
            found[0].path.starts_with("[process root]"),
            "{:?}",
            found[0].path
        );
        assert_eq!(found[0].kind, DebugFileKind::BuildId);
        assert_eq!(found[1].path, debug_dir.join(".build-id/ab/cd.debug"));

        let with_dwarf = ElfLayout {
            has_debug_info: true,
            ..layout
        };
        assert!(
            open_debug_files(
                Some(&process_root),
                "/bin/app",
                &with_dwarf,
                &[debug_dir],
                &|_| {}
            )
            .is_empty()
        );
    }

    #[test]
    fn a_fifo_among_the_candidates_is_refused_not_waited_for() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("usr/lib/debug/.build-id/ab");
        std::fs::create_dir_all(&dir).expect("mkdir");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.join("cd.debug"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        let process_root = ProcessRoot::open(root.path()).expect("root");
        let refused = std::cell::Cell::new(0);
        let found = open_debug_files(
            Some(&process_root),
            "/bin/app",
            &layout(&[0xab, 0xcd]),
            &[PathBuf::from("/usr/lib/debug")],
            &|error| {
                if error.refusal().is_some() {
                    refused.set(refused.get() + 1);
                }
            },
        );
        assert!(found.is_empty());
        assert_eq!(refused.get(), 1);
    }
}
