//! Separate debug files: where GDB looks for an object's, and whether a
//! candidate belongs to the object. The one finder of the symbolizer and
//! the debuginfo uploader; opening the candidates is the caller's (it
//! decides whose root they are looked up in, and how a hostile file is
//! refused).

use std::{
    io::{self, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
};

use object::ReadCache;

use crate::{BuildId, ElfError, ElfLayout, layout_of};

/// How a debug file was found, which says how to check that it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugFileKind {
    /// `<dir>/.build-id/xx/rest.debug`: its build id must match.
    BuildId,
    /// Named by the object's `.gnu_debuglink`: build ids must match when
    /// both have one, else the CRC-32 of the file must be the link's.
    DebugLink { crc: u32 },
}

/// A place a debug file of the object may be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub path: PathBuf,
    pub kind: DebugFileKind,
}

/// `<directory>/.build-id/xx/rest.debug`, GDB's layout; `None` for a build
/// id too short to split.
pub fn build_id_path(directory: &Path, build_id: &BuildId) -> Option<PathBuf> {
    if build_id.as_bytes().len() < 2 {
        return None;
    }
    let hex = build_id.to_hex();
    Some(
        directory
            .join(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..])),
    )
}

/// Where to look for the debug file of the object at `object_path` (as its
/// process sees it), best first, in GDB's order: by build id in each debug
/// directory, then by debuglink next to the object, in its `.debug/`, and
/// under each debug directory. None is the object itself.
pub fn candidates(
    object_path: &str,
    layout: &ElfLayout,
    directories: &[PathBuf],
) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    if let Some(build_id) = &layout.build_id {
        candidates.extend(
            directories
                .iter()
                .filter_map(|directory| build_id_path(directory, build_id))
                .map(|path| Candidate {
                    path,
                    kind: DebugFileKind::BuildId,
                }),
        );
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
            let relative = object_dir.strip_prefix("/").unwrap_or(object_dir);
            let paths = [
                object_dir.join(&link.name),
                object_dir.join(".debug").join(&link.name),
            ]
            .into_iter()
            .chain(
                directories
                    .iter()
                    .map(|directory| directory.join(relative).join(&link.name)),
            );
            candidates.extend(paths.map(|path| Candidate { path, kind }));
        }
        candidates.retain(|candidate| candidate.path != object);
    }
    candidates
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// What the candidate's headers say, before any CRC is computed.
enum Verdict {
    Decided(bool),
    /// The whole file's CRC-32 must be this.
    Crc(u32),
}

/// A candidate belongs to the object when their build ids are equal (both
/// have one), else, found by debuglink, when its CRC-32 is the link's. And
/// it must hold something to name frames with (DWARF or a `.symtab`): a
/// debug file stripped of both would be chosen for nothing.
fn verdict(object: &ElfLayout, kind: DebugFileKind, candidate: &ElfLayout) -> Verdict {
    if !candidate.has_debug_info && !candidate.has_symtab {
        return Verdict::Decided(false);
    }
    match (&object.build_id, &candidate.build_id, kind) {
        (Some(ours), Some(theirs), _) => Verdict::Decided(ours == theirs),
        (_, _, DebugFileKind::DebugLink { crc }) => Verdict::Crc(crc),
        (_, _, DebugFileKind::BuildId) => Verdict::Decided(false),
    }
}

/// Whether the debug file with contents `candidate` belongs to the object
/// laid out as `object` (see [`verdict`] for the rules).
pub fn matches(
    object: &ElfLayout,
    kind: DebugFileKind,
    candidate: &[u8],
) -> Result<bool, ElfError> {
    let layout = layout_of(candidate)?;
    Ok(match verdict(object, kind, &layout) {
        Verdict::Decided(matched) => matched,
        Verdict::Crc(crc) => crc32fast::hash(candidate) == crc,
    })
}

/// Like [`matches`], over a file read in pieces: its headers, then (for a
/// CRC) the whole file a chunk at a time, so nothing of it stays in memory.
pub fn matches_file<R: Read + Seek>(
    object: &ElfLayout,
    kind: DebugFileKind,
    mut candidate: R,
) -> Result<bool, ElfError> {
    let layout = {
        let cache = ReadCache::new(&mut candidate);
        layout_of(&cache)?
    };
    Ok(match verdict(object, kind, &layout) {
        Verdict::Decided(matched) => matched,
        Verdict::Crc(crc) => {
            crc32_of(candidate).map_err(|source| ElfError::Read { source })? == crc
        }
    })
}

fn crc32_of<R: Read + Seek>(mut reader: R) -> io::Result<u32> {
    reader.seek(SeekFrom::Start(0))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0; 64 << 10];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(hasher.finalize()),
            Ok(read) => hasher.update(&buf[..read]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use agent_fixtures::{CHAIN, CHAIN_STRIPPED, INLINE_CHAIN_DEBUG, INLINE_CHAIN_STRIPPED};

    use super::*;
    use crate::{DebugLink, read_layout};

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

    fn paths(candidates: &[Candidate]) -> Vec<String> {
        candidates
            .iter()
            .map(|candidate| candidate.path.display().to_string())
            .collect()
    }

    /// Both ways of checking, which must always agree.
    fn check(object: &ElfLayout, kind: DebugFileKind, candidate: &[u8]) -> Result<bool, ElfError> {
        let in_memory = matches(object, kind, candidate);
        let read = matches_file(object, kind, Cursor::new(candidate));
        assert_eq!(
            in_memory.as_ref().ok(),
            read.as_ref().ok(),
            "{in_memory:?} / {read:?}"
        );
        in_memory
    }

    #[test]
    fn candidates_follow_gdb_order() {
        let dirs = [PathBuf::from("/usr/lib/debug"), PathBuf::from("/opt/dbg")];
        let layout = layout(Some(&[0xab, 0xcd, 0xef]), Some(("app.debug", 7)));
        let candidates = candidates("/usr/bin/app", &layout, &dirs);
        assert_eq!(
            paths(&candidates),
            [
                "/usr/lib/debug/.build-id/ab/cdef.debug",
                "/opt/dbg/.build-id/ab/cdef.debug",
                "/usr/bin/app.debug",
                "/usr/bin/.debug/app.debug",
                "/usr/lib/debug/usr/bin/app.debug",
                "/opt/dbg/usr/bin/app.debug",
            ]
        );
        assert_eq!(candidates[0].kind, DebugFileKind::BuildId);
        assert_eq!(candidates[2].kind, DebugFileKind::DebugLink { crc: 7 });
    }

    #[test]
    fn the_fixtures_debuglink_names_its_debug_file() {
        let stripped = read_layout(INLINE_CHAIN_STRIPPED).expect("fixture");
        let dirs = [PathBuf::from("/usr/lib/debug")];
        let candidates = candidates("/opt/app/inline_chain", &stripped, &dirs);
        let hex = stripped.build_id.as_ref().expect("build id").to_hex();
        assert_eq!(
            paths(&candidates),
            [
                format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]),
                "/opt/app/inline_chain.debug".to_owned(),
                "/opt/app/.debug/inline_chain.debug".to_owned(),
                "/usr/lib/debug/opt/app/inline_chain.debug".to_owned(),
            ]
        );
    }

    #[test]
    fn a_link_to_the_object_itself_is_no_candidate() {
        let layout = layout(None, Some(("app", 1)));
        let candidates = candidates("/usr/bin/app", &layout, &[]);
        assert_eq!(paths(&candidates), ["/usr/bin/.debug/app"]);
        assert!(super::candidates("/usr/bin/app", &ElfLayout::default(), &[]).is_empty());
        // A relative object path gives the link nothing to be next to.
        assert!(super::candidates("app", &layout, &[]).is_empty());
    }

    #[test]
    fn debug_links_that_are_not_file_names_are_ignored() {
        for name in [
            "/etc/shadow",
            "../../etc/shadow",
            "..",
            ".",
            "",
            "a/b",
            "a\0b",
        ] {
            let layout = layout(None, Some((name, 1)));
            assert!(
                candidates("/usr/bin/app", &layout, &[PathBuf::from("/usr/lib/debug")]).is_empty(),
                "{name:?}"
            );
        }
    }

    #[test]
    fn build_ids_too_short_to_split_name_no_path() {
        let dir = Path::new("/usr/lib/debug");
        assert_eq!(build_id_path(dir, &BuildId::new(&[0xab])), None);
        assert_eq!(
            build_id_path(dir, &BuildId::new(&[0xab, 0xcd])),
            Some(PathBuf::from("/usr/lib/debug/.build-id/ab/cd.debug"))
        );
        let short = layout(Some(&[0xab]), None);
        assert!(candidates("/usr/bin/app", &short, &[dir.to_path_buf()]).is_empty());
    }

    #[test]
    fn matching_checks_build_id_then_crc() {
        let own = read_layout(CHAIN).expect("fixture");
        assert!(check(&own, DebugFileKind::BuildId, CHAIN).expect("parses"));
        let other = layout(Some(&[1, 2, 3]), None);
        assert!(!check(&other, DebugFileKind::BuildId, CHAIN).expect("parses"));
        // Without a build id on our side the CRC decides.
        let crc = crc32fast::hash(CHAIN);
        let unnamed = ElfLayout::default();
        assert!(check(&unnamed, DebugFileKind::DebugLink { crc }, CHAIN).expect("parses"));
        assert!(!check(&unnamed, DebugFileKind::DebugLink { crc: !crc }, CHAIN).expect("parses"));
        assert!(!check(&unnamed, DebugFileKind::BuildId, CHAIN).expect("parses"));
        assert!(check(&unnamed, DebugFileKind::BuildId, b"junk").is_err());
    }

    #[test]
    fn the_stripped_fixture_and_its_debug_file_match() {
        let stripped = read_layout(INLINE_CHAIN_STRIPPED).expect("fixture");
        let link = stripped.debug_link.clone().expect("debuglink");
        let by_link = DebugFileKind::DebugLink { crc: link.crc };
        assert!(check(&stripped, by_link, INLINE_CHAIN_DEBUG).expect("parses"));
        assert!(check(&stripped, DebugFileKind::BuildId, INLINE_CHAIN_DEBUG).expect("parses"));
        // Another program's debug file: its build id differs.
        assert!(!check(&stripped, by_link, CHAIN).expect("parses"));
        // Without build ids, the link's CRC is the whole file's.
        let no_id = ElfLayout {
            build_id: None,
            ..stripped
        };
        assert!(check(&no_id, by_link, INLINE_CHAIN_DEBUG).expect("parses"));
        let wrong = DebugFileKind::DebugLink { crc: link.crc ^ 1 };
        assert!(!check(&no_id, wrong, INLINE_CHAIN_DEBUG).expect("parses"));
    }

    #[test]
    fn a_file_with_nothing_to_name_frames_with_never_matches() {
        // Same build id, but stripped of .symtab and DWARF.
        let own = read_layout(CHAIN).expect("fixture");
        assert!(!check(&own, DebugFileKind::BuildId, CHAIN_STRIPPED).expect("parses"));
        let crc = crc32fast::hash(CHAIN_STRIPPED);
        let unnamed = ElfLayout::default();
        assert!(
            !check(&unnamed, DebugFileKind::DebugLink { crc }, CHAIN_STRIPPED).expect("parses")
        );
    }

    #[test]
    fn a_file_that_fails_to_read_is_an_error() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("gone"))
            }
        }
        impl Seek for Failing {
            fn seek(&mut self, _pos: SeekFrom) -> io::Result<u64> {
                Ok(0)
            }
        }
        let unnamed = ElfLayout::default();
        assert!(matches_file(&unnamed, DebugFileKind::BuildId, Failing).is_err());
        for len in (0..CHAIN.len()).step_by(331) {
            let _ = check(&unnamed, DebugFileKind::DebugLink { crc: 0 }, &CHAIN[..len]);
        }
    }
}
