//! Separate debug files: found where GDB looks for them, opened when the
//! object is first opened (while the process, and so its mount namespace,
//! surely exists) and kept open like the object; checked against the object
//! later, off the sampling path, because a debuglink check reads the whole
//! file.

use std::{
    collections::HashSet,
    fs::File,
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::objects::ObjectData;
use crate::untrusted::{MAX_OBJECT_BYTES, OpenError, ProcessRoot, open_host_file};
use agent_elf::{self as elf, ElfLayout};

/// At most this many candidate debug files are kept open per object.
const MAX_DEBUG_FILES: usize = 4;

/// How a debug file was found, which says how to check that it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugFileKind {
    /// `<dir>/.build-id/xx/rest.debug`: its build id must match.
    BuildId,
    /// Named by the object's `.gnu_debuglink`: build ids must match when
    /// both have one, else the CRC-32 of the file must be the link's.
    DebugLink { crc: u32 },
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
        // SAFETY: read-only mapping of a file nobody rewrites in place (as
        // for objects, see `ObjectFile::data`).
        unsafe { memmap2::Mmap::map(&self.file) }.map(ObjectData::Mapped)
    }
}

/// Where to look for the debug file of the object at `object_path` (as its
/// process sees it), in GDB's order: by build id in each debug directory,
/// then by debuglink next to the object, in its `.debug/`, and under each
/// debug directory.
pub fn candidate_paths(
    object_path: &str,
    layout: &ElfLayout,
    directories: &[PathBuf],
) -> Vec<(PathBuf, DebugFileKind)> {
    let mut candidates = Vec::new();
    if let Some(build_id) = layout
        .build_id
        .as_ref()
        .filter(|id| id.as_bytes().len() >= 2)
    {
        let hex = build_id.to_hex();
        for directory in directories {
            candidates.push((
                directory
                    .join(".build-id")
                    .join(&hex[..2])
                    .join(format!("{}.debug", &hex[2..])),
                DebugFileKind::BuildId,
            ));
        }
    }
    // The link is a file name (GDB joins it to directories); a name with a
    // slash or `..` could point anywhere, so it names nothing.
    if let Some(link) = layout
        .debug_link
        .as_ref()
        .filter(|link| is_plain_file_name(&link.name))
    {
        let object = Path::new(object_path);
        let kind = DebugFileKind::DebugLink { crc: link.crc };
        if let Some(object_dir) = object.parent().filter(|dir| dir.is_absolute()) {
            candidates.push((object_dir.join(&link.name), kind));
            candidates.push((object_dir.join(".debug").join(&link.name), kind));
            let relative = object_dir.strip_prefix("/").unwrap_or(object_dir);
            for directory in directories {
                candidates.push((directory.join(relative).join(&link.name), kind));
            }
        }
        candidates.retain(|(path, _)| path != object);
    }
    candidates
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
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
    for (path, kind) in candidate_paths(object_path, layout, directories) {
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

/// Whether the debug file with contents `debug` belongs to the object laid
/// out as `object`.
pub fn debug_file_matches(
    object: &ElfLayout,
    kind: DebugFileKind,
    debug: &[u8],
) -> Result<bool, elf::ElfError> {
    let debug_layout = elf::read_layout(debug)?;
    Ok(match (&object.build_id, &debug_layout.build_id, kind) {
        (Some(ours), Some(theirs), _) => ours == theirs,
        (_, _, DebugFileKind::DebugLink { crc }) => crc32fast::hash(debug) == crc,
        (_, _, DebugFileKind::BuildId) => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_elf::{BuildId, DebugLink};

    fn layout(build_id: Option<&[u8]>, link: Option<(&str, u32)>) -> ElfLayout {
        ElfLayout {
            build_id: build_id.map(BuildId::new),
            debug_link: link.map(|(name, crc)| DebugLink {
                name: name.into(),
                crc,
            }),
            ..ElfLayout::default()
        }
    }

    #[test]
    fn candidates_follow_gdb_order() {
        let dirs = [PathBuf::from("/usr/lib/debug"), PathBuf::from("/opt/dbg")];
        let layout = layout(Some(&[0xab, 0xcd, 0xef]), Some(("app.debug", 7)));
        let paths: Vec<String> = candidate_paths("/usr/bin/app", &layout, &dirs)
            .into_iter()
            .map(|(path, _)| path.display().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "/usr/lib/debug/.build-id/ab/cdef.debug",
                "/opt/dbg/.build-id/ab/cdef.debug",
                "/usr/bin/app.debug",
                "/usr/bin/.debug/app.debug",
                "/usr/lib/debug/usr/bin/app.debug",
                "/opt/dbg/usr/bin/app.debug",
            ]
        );
    }

    #[test]
    fn a_link_to_the_object_itself_is_no_candidate() {
        let layout = layout(None, Some(("app", 1)));
        let candidates = candidate_paths("/usr/bin/app", &layout, &[]);
        assert_eq!(candidates.len(), 1, "{candidates:?}");
        assert_eq!(candidates[0].0, Path::new("/usr/bin/.debug/app"));
        assert!(candidate_paths("/usr/bin/app", &ElfLayout::default(), &[]).is_empty());
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
        let layout = layout(Some(&[0xab, 0xcd]), None);
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
    fn debug_links_that_are_not_file_names_are_ignored() {
        for name in ["/etc/shadow", "../../etc/shadow", "..", "", "a/b"] {
            let layout = layout(None, Some((name, 1)));
            assert!(
                candidate_paths("/usr/bin/app", &layout, &[PathBuf::from("/usr/lib/debug")])
                    .is_empty(),
                "{name:?}"
            );
        }
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
            &layout(Some(&[0xab, 0xcd]), None),
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

    #[test]
    fn matching_checks_build_id_then_crc() {
        let chain = agent_fixtures::CHAIN;
        let own = elf::read_layout(chain).expect("fixture");
        assert!(debug_file_matches(&own, DebugFileKind::BuildId, chain).expect("parses"));
        let other = layout(Some(&[1, 2, 3]), None);
        assert!(!debug_file_matches(&other, DebugFileKind::BuildId, chain).expect("parses"));
        // Without a build id on our side the CRC decides.
        let crc = crc32fast::hash(chain);
        let unnamed = ElfLayout::default();
        assert!(
            debug_file_matches(&unnamed, DebugFileKind::DebugLink { crc }, chain).expect("parses")
        );
        assert!(
            !debug_file_matches(&unnamed, DebugFileKind::DebugLink { crc: !crc }, chain)
                .expect("parses")
        );
        assert!(!debug_file_matches(&unnamed, DebugFileKind::BuildId, chain).expect("parses"));
        assert!(debug_file_matches(&unnamed, DebugFileKind::BuildId, b"junk").is_err());
    }
}
