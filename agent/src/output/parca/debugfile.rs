//! Which file to hand the server for an object it should symbolize: a
//! separate debug file found by build id, else the object itself when it
//! has symbols or DWARF.
//!
//! Parca maps runtime addresses with the program headers of the file it is
//! given. `objcopy --only-keep-debug` rewrites the PT_LOAD file offsets of
//! a debug file (its sections hold no code), so those offsets are put back
//! from the object the process maps, patched into the bytes as they are
//! streamed; the file on disk is never touched or copied whole.

use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::Arc,
};

use bytes::Bytes;
use object::{
    Endian, Endianness, Object, ObjectSection,
    elf::{FileHeader64, PT_LOAD},
    read::elf::{FileHeader, ProgramHeader},
};
use tracing::debug;

use crate::process::{ObjectData, ObjectFile};

/// Bytes per streamed message: small enough to keep memory flat.
pub const CHUNK: usize = 1 << 20;

/// A file that can symbolize an object, ready to stream.
#[derive(Clone)]
pub struct Source {
    pub description: String,
    data: Arc<ObjectData>,
    /// Replacements (offset, bytes) applied while streaming.
    patches: Arc<Vec<(usize, Vec<u8>)>>,
    /// SHA-256 of the bytes as streamed, hex.
    pub hash: String,
}

impl Source {
    fn new(description: String, data: ObjectData, patches: Vec<(usize, Vec<u8>)>) -> Self {
        let mut source = Self {
            description,
            data: Arc::new(data),
            patches: Arc::new(patches),
            hash: String::new(),
        };
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for chunk in source.clone().chunks(CHUNK) {
            digest.update(&chunk);
        }
        source.hash = hex(digest.finish().as_ref());
        source
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The streamed bytes in pieces of `size`, patches applied.
    pub fn chunks(self, size: usize) -> impl Iterator<Item = Bytes> + Send {
        let count = self.data.len().div_ceil(size);
        (0..count).map(move |index| {
            let start = index * size;
            let end = (start + size).min(self.data.len());
            let mut chunk = self.data[start..end].to_vec();
            for (offset, bytes) in self.patches.iter() {
                for (i, &byte) in bytes.iter().enumerate() {
                    if let Some(at) = (offset + i)
                        .checked_sub(start)
                        .filter(|&at| at < chunk.len())
                    {
                        chunk[at] = byte;
                    }
                }
            }
            Bytes::from(chunk)
        })
    }
}

/// A debug file for `build_id` in one of `directories`
/// (`DIR/.build-id/ab/cdef….debug`), else the object itself when it has
/// symbols or DWARF; `None` when neither can name anything.
pub fn find_source(
    object: &ObjectFile,
    directories: &[PathBuf],
    build_id: &str,
) -> std::io::Result<Option<Source>> {
    let object_data = object.data()?;
    for directory in directories {
        let path = build_id_path(directory, build_id);
        let Ok(file) = File::open(&path) else {
            continue;
        };
        // SAFETY: a read-only mapping of a debug file, as in ObjectFile::data.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        if !matches_and_symbolizes(&map, build_id) {
            debug!(file = %path.display(), "debug file ignored: another build id, or nothing to symbolize with");
            continue;
        }
        let patches = load_offset_patches(&map, &object_data).unwrap_or_default();
        return Ok(Some(Source::new(
            path.display().to_string(),
            ObjectData::Mapped(map),
            patches,
        )));
    }
    if matches_and_symbolizes(&object_data, build_id) {
        return Ok(Some(Source::new(
            object.path.clone(),
            object_data,
            Vec::new(),
        )));
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
fn matches_and_symbolizes(data: &[u8], build_id: &str) -> bool {
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
fn load_offset_patches(debug: &[u8], object: &[u8]) -> Option<Vec<(usize, Vec<u8>)>> {
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
    let table = usize::try_from(debug_header.e_phoff(debug_endian)).ok()?;
    let entry = usize::from(debug_header.e_phentsize(debug_endian));
    // p_offset follows p_type and p_flags in an Elf64_Phdr.
    const P_OFFSET: usize = 8;
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
                table + index * entry + P_OFFSET,
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
    use super::*;
    use crate::{
        elf::tests::{CHAIN, CHAIN_STRIPPED},
        process::ObjectKey,
    };

    fn object(bytes: &'static [u8]) -> ObjectFile {
        ObjectFile::from_memory(ObjectKey::Vdso, "/fixtures/chain", bytes.into()).expect("fixture")
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
        // Nothing anywhere: a stripped object alone names nothing.
        assert!(
            find_source(&stripped, &directories, &build_id)
                .expect("reads")
                .is_none()
        );
        // The unstripped build of the same program serves as its debug file.
        let path = build_id_path(dir.path(), &build_id);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(&path, CHAIN).expect("debug file");
        let found = find_source(&stripped, &directories, &build_id)
            .expect("reads")
            .expect("found");
        assert_eq!(found.description, path.display().to_string());
        assert_eq!(found.hash.len(), 64, "sha256 in hex");
        // A debug file of another build is not taken for this one.
        assert!(
            find_source(&stripped, &directories, "00ff00ff")
                .expect("reads")
                .is_none()
        );
        // An object with symbols is its own source.
        let full = object(CHAIN);
        let found = find_source(&full, &[], &build_id)
            .expect("reads")
            .expect("found");
        assert_eq!(found.description, "/fixtures/chain");
    }

    /// A debug file whose PT_LOAD offsets were rewritten gets the object's
    /// back in the streamed bytes, and only there.
    #[test]
    fn load_offsets_are_restored_while_streaming() {
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
        let patches = load_offset_patches(&debug, &original).expect("segments line up");
        assert_eq!(patches.len(), loads.len());
        let source = Source::new("debug".into(), ObjectData::Memory(debug.into()), patches);
        // Chunks smaller than a program header, to cross boundaries.
        let streamed: Vec<u8> = source.clone().chunks(5).flat_map(|c| c.to_vec()).collect();
        assert_eq!(streamed, original);
        let whole = Source::new(
            "original".into(),
            ObjectData::Memory(original.into()),
            Vec::new(),
        );
        assert_eq!(source.hash, whole.hash, "the hash covers the patched bytes");
    }
}
