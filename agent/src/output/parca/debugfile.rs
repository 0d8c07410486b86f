//! Which file to hand the server for an object it should symbolize: a
//! separate debug file found by build id, else the object itself when it
//! has symbols or DWARF.
//!
//! Files are read with positioned reads, a chunk at a time, never mapped:
//! a mapping touched end to end (to hash or to stream it) would keep the
//! whole file resident in firn's RSS, hundreds of MB for a large binary.
//! Choosing the file reads only ELF headers.
//!
//! Parca maps runtime addresses with the program headers of the file it is
//! given. `objcopy --only-keep-debug` rewrites the PT_LOAD file offsets of
//! a debug file (its sections hold no code), so those offsets are put back
//! from the object the process maps, patched into the bytes as they are
//! read; the file on disk is never touched or copied whole.

use std::{
    io,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{
    Endian, Endianness, Object, ObjectSection, ReadCache, ReadRef,
    elf::{FileHeader64, PT_LOAD},
    read::elf::{FileHeader, ProgramHeader},
};
use tracing::debug;

use crate::{
    process::{ObjectContents, ObjectFile},
    untrusted,
};

/// Bytes per read and per streamed message: small enough to keep memory
/// flat, large enough that a 200 MB file is 200 messages.
pub const CHUNK: usize = 1 << 20;

/// A file that can symbolize an object, ready to be read in chunks.
#[derive(Clone)]
pub struct Source {
    pub description: String,
    contents: Arc<ObjectContents>,
    len: u64,
    /// Replacements (offset, bytes) applied to every read.
    patches: Arc<[(u64, Vec<u8>)]>,
}

impl Source {
    fn new(
        description: String,
        contents: ObjectContents,
        patches: Vec<(u64, Vec<u8>)>,
    ) -> io::Result<Self> {
        let len = match &contents {
            ObjectContents::File(file) => file.metadata()?.len(),
            ObjectContents::Memory(bytes) => bytes.len() as u64,
        };
        Ok(Self {
            description,
            contents: Arc::new(contents),
            len,
            patches: patches.into(),
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Fills `buf` with the bytes at `offset` as they are sent, patches
    /// applied. A file that shrank since it was chosen is an error, not a
    /// short upload.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&end| end <= self.len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        match &*self.contents {
            ObjectContents::File(file) => file.read_exact_at(buf, offset)?,
            ObjectContents::Memory(bytes) => {
                let range = usize::try_from(offset).ok().zip(usize::try_from(end).ok());
                let slice = range
                    .and_then(|(start, end)| bytes.get(start..end))
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(slice);
            }
        }
        for (at, bytes) in self.patches.iter() {
            for (i, &byte) in bytes.iter().enumerate() {
                if let Some(index) = (at + i as u64)
                    .checked_sub(offset)
                    .and_then(|index| usize::try_from(index).ok())
                    .filter(|&index| index < buf.len())
                {
                    buf[index] = byte;
                }
            }
        }
        Ok(())
    }

    /// The (offset, length) of each piece of at most `size` bytes.
    pub fn pieces(&self, size: usize) -> impl Iterator<Item = (u64, usize)> + Send + use<> {
        let len = self.len;
        let size = size.max(1) as u64;
        (0..len.div_ceil(size)).map(move |index| {
            let offset = index * size;
            // At most `size`, so it fits in usize.
            (offset, (len - offset).min(size) as usize)
        })
    }

    /// SHA-256 of the bytes as sent, in hex: the file read once, a chunk at
    /// a time, into `buf` (which ends up `CHUNK` long).
    pub fn hash(&self, buf: &mut Vec<u8>) -> io::Result<String> {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for (offset, length) in self.pieces(CHUNK) {
            buf.resize(length, 0);
            self.read_at(offset, buf)?;
            digest.update(buf);
        }
        Ok(hex(digest.finish().as_ref()))
    }
}

/// Whether `find_source` could find anything, from what is known without
/// reading a byte: the object's own sections, or a file at a build-id path.
pub fn may_have_source(object: &ObjectFile, directories: &[PathBuf], build_id: &str) -> bool {
    object.layout.has_symtab
        || object.layout.has_debug_info
        || directories
            .iter()
            .any(|directory| build_id_path(directory, build_id).is_file())
}

/// A debug file for `build_id` in one of `directories`
/// (`DIR/.build-id/ab/cdef….debug`), else the object itself when it has
/// symbols or DWARF; `None` when neither can name anything. Reads ELF
/// headers only.
pub fn find_source(
    object: &ObjectFile,
    directories: &[PathBuf],
    build_id: &str,
) -> io::Result<Option<Source>> {
    for directory in directories {
        let path = build_id_path(directory, build_id);
        // A host directory, but checked all the same: a FIFO or device
        // there must not block the uploader.
        let file = match untrusted::open_host_file(&path, untrusted::MAX_OBJECT_BYTES) {
            Ok(file) => file,
            Err(error) => {
                if !error.is_not_found() {
                    debug!(%error, "debug file not uploaded");
                }
                continue;
            }
        };
        let patches = {
            let debug = ReadCache::new(&file);
            if !matches_and_symbolizes(&debug, build_id) {
                debug!(file = %path.display(), "debug file ignored: another build id, or nothing to symbolize with");
                continue;
            }
            match object.contents()? {
                ObjectContents::File(object_file) => {
                    load_offset_patches(&debug, &ReadCache::new(&object_file))
                }
                ObjectContents::Memory(bytes) => load_offset_patches(&debug, &bytes[..]),
            }
            .unwrap_or_default()
        };
        return Source::new(
            path.display().to_string(),
            ObjectContents::File(file),
            patches,
        )
        .map(Some);
    }
    let own_id = object.build_id().map(|id| id.to_hex());
    if own_id.as_deref() == Some(build_id)
        && (object.layout.has_symtab || object.layout.has_debug_info)
    {
        return Source::new(object.path.clone(), object.contents()?, Vec::new()).map(Some);
    }
    Ok(None)
}

pub fn build_id_path(directory: &Path, build_id: &str) -> PathBuf {
    let (head, tail) = build_id.split_at(2.min(build_id.len()));
    directory
        .join(".build-id")
        .join(head)
        .join(format!("{tail}.debug"))
}

/// The ELF's build id is `build_id` and it holds DWARF or a symbol table.
fn matches_and_symbolizes<'data, R: ReadRef<'data>>(data: R, build_id: &str) -> bool {
    let Ok(file) = object::File::parse(data) else {
        return false;
    };
    let same = file
        .build_id()
        .ok()
        .flatten()
        .is_some_and(|id| hex(id) == build_id);
    let useful = [".debug_info", ".symtab"].iter().any(|name| {
        file.section_by_name(name)
            .is_some_and(|section| section.size() > 0)
    });
    same && useful
}

/// Patches that give the debug file's PT_LOAD headers the file offsets the
/// object has, segment for segment (same address and size). `None` when
/// the two do not line up (then the file is sent as it is).
fn load_offset_patches<'d, 'o, D: ReadRef<'d>, O: ReadRef<'o>>(
    debug: D,
    object: O,
) -> Option<Vec<(u64, Vec<u8>)>> {
    let debug_header = FileHeader64::<Endianness>::parse(debug).ok()?;
    let debug_endian = debug_header.endian().ok()?;
    let object_header = FileHeader64::<Endianness>::parse(object).ok()?;
    let object_endian = object_header.endian().ok()?;
    let object_loads: Vec<_> = object_header
        .program_headers(object_endian, object)
        .ok()?
        .iter()
        .filter(|header| header.p_type(object_endian) == PT_LOAD)
        .collect();
    let table = debug_header.e_phoff(debug_endian);
    let entry = u64::from(debug_header.e_phentsize(debug_endian));
    // p_offset follows p_type and p_flags in an Elf64_Phdr.
    const P_OFFSET: u64 = 8;
    let mut patches = Vec::new();
    for (index, header) in debug_header
        .program_headers(debug_endian, debug)
        .ok()?
        .iter()
        .enumerate()
    {
        if header.p_type(debug_endian) != PT_LOAD {
            continue;
        }
        let original = object_loads.iter().find(|original| {
            original.p_vaddr(object_endian) == header.p_vaddr(debug_endian)
                && original.p_memsz(object_endian) == header.p_memsz(debug_endian)
        })?;
        let offset = original.p_offset(object_endian);
        if offset != header.p_offset(debug_endian) {
            patches.push((
                table
                    .checked_add((index as u64).checked_mul(entry)?)?
                    .checked_add(P_OFFSET)?,
                debug_endian.write_u64(offset).to_vec(),
            ));
        }
    }
    Some(patches)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use agent_fixtures::{CHAIN, CHAIN_STRIPPED};

    use super::*;
    use crate::process::ObjectKey;

    fn object(bytes: &'static [u8]) -> ObjectFile {
        ObjectFile::from_memory(ObjectKey::Vdso, "/fixtures/chain", bytes.into()).expect("fixture")
    }

    fn streamed(source: &Source, size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for (offset, length) in source.pieces(size) {
            let mut buf = vec![0; length];
            source.read_at(offset, &mut buf).expect("reads");
            out.extend_from_slice(&buf);
        }
        out
    }

    #[test]
    fn build_id_paths_follow_the_gdb_layout() {
        assert_eq!(
            build_id_path(Path::new("/usr/lib/debug"), "abcdef12"),
            PathBuf::from("/usr/lib/debug/.build-id/ab/cdef12.debug")
        );
    }

    #[test]
    fn a_debug_file_is_preferred_and_must_match_the_build_id() {
        let stripped = object(CHAIN_STRIPPED);
        let build_id = stripped.build_id().expect("build id").to_hex();
        let dir = tempfile::tempdir().expect("tempdir");
        let directories = [dir.path().to_path_buf()];
        // Nothing anywhere: a stripped object alone names nothing, and
        // that is known without reading anything.
        assert!(!may_have_source(&stripped, &directories, &build_id));
        assert!(
            find_source(&stripped, &directories, &build_id)
                .expect("reads")
                .is_none()
        );
        // The unstripped build of the same program serves as its debug file.
        let path = build_id_path(dir.path(), &build_id);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(&path, CHAIN).expect("debug file");
        assert!(may_have_source(&stripped, &directories, &build_id));
        let found = find_source(&stripped, &directories, &build_id)
            .expect("reads")
            .expect("found");
        assert_eq!(found.description, path.display().to_string());
        assert_eq!(found.len(), CHAIN.len() as u64);
        let hash = found.hash(&mut Vec::new()).expect("hashes");
        assert_eq!(hash.len(), 64, "sha256 in hex");
        // A debug file of another build is not taken for this one.
        assert!(
            find_source(&stripped, &directories, "00ff00ff")
                .expect("reads")
                .is_none()
        );
        // An object with symbols is its own source.
        let full = object(CHAIN);
        assert!(may_have_source(&full, &[], &build_id));
        let found = find_source(&full, &[], &build_id)
            .expect("reads")
            .expect("found");
        assert_eq!(found.description, "/fixtures/chain");
        assert_eq!(streamed(&found, CHUNK), CHAIN);
    }

    /// A debug file whose PT_LOAD offsets were rewritten gets the object's
    /// back in the bytes read, and only there; read from a file in pieces
    /// that cross the program headers, and hashed as patched.
    #[test]
    fn load_offsets_are_restored_while_reading() {
        let original = CHAIN.to_vec();
        let header = FileHeader64::<Endianness>::parse(original.as_slice()).expect("ELF64");
        let endian = header.endian().expect("endian");
        let table = usize::try_from(header.e_phoff(endian)).expect("offset");
        let entry = usize::from(header.e_phentsize(endian));
        let loads: Vec<usize> = header
            .program_headers(endian, original.as_slice())
            .expect("headers")
            .iter()
            .enumerate()
            .filter(|(_, h)| h.p_type(endian) == PT_LOAD && h.p_offset(endian) != 0)
            .map(|(index, _)| table + index * entry + 8)
            .collect();
        assert!(
            !loads.is_empty(),
            "the fixture has loads at non-zero offsets"
        );
        let mut debug = original.clone();
        for &at in &loads {
            debug[at..at + 8].copy_from_slice(&[0; 8]);
        }
        let mut file = tempfile::tempfile().expect("tempfile");
        file.write_all(&debug).expect("writes");
        let patches =
            load_offset_patches(&ReadCache::new(&file), original.as_slice()).expect("line up");
        assert_eq!(patches.len(), loads.len());
        let source =
            Source::new("debug".into(), ObjectContents::File(file), patches).expect("source");
        // Pieces smaller than a program header, to cross boundaries.
        assert_eq!(streamed(&source, 5), original);
        let whole = Source::new(
            "original".into(),
            ObjectContents::Memory(original.into()),
            Vec::new(),
        )
        .expect("source");
        assert_eq!(
            source.hash(&mut Vec::new()).expect("hashes"),
            whole.hash(&mut Vec::new()).expect("hashes"),
            "the hash covers the patched bytes"
        );
    }

    #[test]
    fn a_file_that_shrank_is_an_error_not_a_short_read() {
        let mut file = tempfile::tempfile().expect("tempfile");
        file.write_all(&[7; 100]).expect("writes");
        let source = Source::new(
            "shrinks".into(),
            ObjectContents::File(file.try_clone().expect("clone")),
            Vec::new(),
        )
        .expect("source");
        file.set_len(50).expect("truncates");
        let mut buf = vec![0; 100];
        assert!(source.read_at(0, &mut buf).is_err());
        assert!(source.hash(&mut Vec::new()).is_err());
        assert!(source.read_at(90, &mut [0; 20]).is_err(), "past the end");
    }
}
