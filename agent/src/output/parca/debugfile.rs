//! Which file to hand the server for an object it should symbolize: the
//! first of the debug files opened with the object that matches it (the
//! symbolizer's candidates and rules, `agent_elf::debug_files`), else the
//! object itself when it has symbols or DWARF.
//!
//! Files are read with positioned reads, a chunk at a time, never mapped:
//! a mapping touched end to end (to stream it) would keep the whole file
//! resident in firn's RSS, hundreds of MB for a large binary.
//! Choosing the file reads only ELF headers.
//!
//! Parca maps runtime addresses with the program headers of the file it is
//! given. `objcopy --only-keep-debug` rewrites the PT_LOAD file offsets of
//! a debug file (its sections hold no code), so those offsets are put back
//! from the object the process maps, patched into the bytes as they are
//! read; the file on disk is never touched or copied whole.

use std::{
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::FileExt,
    sync::Arc,
};

use agent_elf::debug_files;
use object::{
    Endian, Endianness, ReadCache, ReadRef,
    elf::{FileHeader64, PT_LOAD},
    read::elf::{FileHeader, ProgramHeader},
};
use tracing::debug;

use crate::process::{ObjectContents, ObjectFile};

/// Bytes per read and per streamed message: small enough to keep memory
/// flat, large enough that a 200 MB file is 200 messages.
pub const CHUNK: usize = 1 << 20;

/// Bytes at each end of a file that its fingerprint covers.
pub const FINGERPRINT_EDGE: usize = 64 << 10;

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

    /// What the server files the upload under as its hash, in hex: SHA-256
    /// of the length and of the first and last [`FINGERPRINT_EDGE`] bytes as
    /// sent (all of them for a smaller file), as Parca Agent's file ids do.
    /// The server only compares it with the hash of an upload it marked
    /// invalid; hashing all of a 200 MB binary for that would cost more CPU
    /// than the upload itself. The ends hold what tells two builds apart
    /// when the build id does not: the ELF, program and section headers
    /// (patched ones included).
    pub fn fingerprint(&self) -> io::Result<String> {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        digest.update(&self.len.to_le_bytes());
        let edge = FINGERPRINT_EDGE as u64;
        let ranges = if self.len <= 2 * edge {
            [(0, self.len), (self.len, 0)]
        } else {
            [(0, edge), (self.len - edge, edge)]
        };
        let mut buf = Vec::new();
        for (offset, length) in ranges {
            // At most 2 × FINGERPRINT_EDGE, so it fits in usize.
            buf.resize(length as usize, 0);
            self.read_at(offset, &mut buf)?;
            digest.update(&buf);
        }
        Ok(hex(digest.finish().as_ref()))
    }
}

/// Whether `find_source` could find anything, from what is known without
/// reading a byte: the object's own sections, or debug files opened with it.
pub fn may_have_source(object: &ObjectFile) -> bool {
    object.layout.has_symtab || object.layout.has_debug_info || !object.debug_files.is_empty()
}

/// The first debug file of `object` that matches it, else the object itself
/// when it has symbols or DWARF; `None` when neither can name anything.
/// Reads ELF headers only (and a debuglink candidate whole, for its CRC),
/// never mapping anything.
pub fn find_source(object: &ObjectFile) -> io::Result<Option<Source>> {
    for candidate in &object.debug_files {
        let file = candidate.file();
        let matched =
            debug_files::matches_file(&object.layout, candidate.kind, FileCursor::new(file));
        match matched {
            Ok(true) => {}
            Ok(false) => {
                debug!(file = %candidate.path.display(), "debug file ignored: another build, or nothing to symbolize with");
                continue;
            }
            Err(error) => {
                debug!(file = %candidate.path.display(), %error, "debug file ignored: unreadable");
                continue;
            }
        }
        let patches = {
            let debug = ReadCache::new(FileCursor::new(file));
            match object.contents()? {
                ObjectContents::File(object_file) => {
                    load_offset_patches(&debug, &ReadCache::new(FileCursor::new(&object_file)))
                }
                ObjectContents::Memory(bytes) => load_offset_patches(&debug, &bytes[..]),
            }
            .unwrap_or_default()
        };
        return Source::new(
            candidate.path.display().to_string(),
            ObjectContents::File(file.try_clone()?),
            patches,
        )
        .map(Some);
    }
    if object.layout.has_symtab || object.layout.has_debug_info {
        return Source::new(object.path.clone(), object.contents()?, Vec::new()).map(Some);
    }
    Ok(None)
}

/// Reads a file shared with others through positioned reads: the offset
/// of the open file, which every handle on it shares, is never moved.
struct FileCursor<'a> {
    file: &'a File,
    position: u64,
}

impl<'a> FileCursor<'a> {
    fn new(file: &'a File) -> Self {
        Self { file, position: 0 }
    }
}

impl Read for FileCursor<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.file.read_at(buf, self.position)?;
        self.position += read as u64;
        Ok(read)
    }
}

impl Seek for FileCursor<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let position = match to {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::End(delta) => self.file.metadata()?.len().checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        self.position = position.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the file",
            )
        })?;
        Ok(self.position)
    }
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

    use std::path::PathBuf;

    use agent_fixtures::{CHAIN, CHAIN_STRIPPED, INLINE_CHAIN_DEBUG, INLINE_CHAIN_STRIPPED};

    use super::*;
    use crate::process::{DebugFile, DebugFileKind, ObjectKey};

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

    fn debug_file(bytes: &[u8], kind: DebugFileKind) -> DebugFile {
        let mut file = tempfile::tempfile().expect("tempfile");
        file.write_all(bytes).expect("writes");
        DebugFile::new(PathBuf::from(format!("/debug/{kind:?}")), kind, file)
    }

    #[test]
    fn a_debug_file_is_preferred_and_must_match_the_object() {
        let mut stripped = object(CHAIN_STRIPPED);
        // Nothing anywhere: a stripped object alone names nothing, and
        // that is known without reading anything.
        assert!(!may_have_source(&stripped));
        assert!(find_source(&stripped).expect("reads").is_none());
        // Another program's debug file first: not taken for this one. Then
        // the unstripped build of the same program, its debug file.
        stripped.debug_files = vec![
            debug_file(INLINE_CHAIN_DEBUG, DebugFileKind::BuildId),
            debug_file(CHAIN, DebugFileKind::BuildId),
        ];
        assert!(may_have_source(&stripped));
        let found = find_source(&stripped).expect("reads").expect("found");
        assert_eq!(found.description, "/debug/BuildId");
        assert_eq!(found.len(), CHAIN.len() as u64);
        let hash = found.fingerprint().expect("hashes");
        assert_eq!(hash.len(), 64, "sha256 in hex");
        stripped.debug_files.remove(1);
        assert!(find_source(&stripped).expect("reads").is_none());
        // An object with symbols is its own source.
        let full = object(CHAIN);
        assert!(may_have_source(&full));
        let found = find_source(&full).expect("reads").expect("found");
        assert_eq!(found.description, "/fixtures/chain");
        assert_eq!(streamed(&found, CHUNK), CHAIN);
    }

    /// The debug file `objcopy --only-keep-debug` made, found by the
    /// object's debuglink: matched by CRC when build ids cannot decide, and
    /// sent with the object's load offsets.
    #[test]
    fn a_debuglink_file_is_found_and_gets_the_objects_load_offsets() {
        let mut stripped = ObjectFile::from_memory(
            ObjectKey::Vdso,
            "/fixtures/inline_chain",
            INLINE_CHAIN_STRIPPED.into(),
        )
        .expect("fixture");
        let crc = stripped.layout.debug_link.as_ref().expect("debuglink").crc;
        stripped.layout.build_id = None;
        stripped.debug_files = vec![
            debug_file(INLINE_CHAIN_DEBUG, DebugFileKind::DebugLink { crc: !crc }),
            debug_file(INLINE_CHAIN_DEBUG, DebugFileKind::DebugLink { crc }),
        ];
        let found = find_source(&stripped).expect("reads").expect("found");
        assert_eq!(found.len(), INLINE_CHAIN_DEBUG.len() as u64);
        assert!(!found.patches.is_empty(), "objcopy moved the load offsets");
        let sent = streamed(&found, 7);
        assert_ne!(sent, INLINE_CHAIN_DEBUG);
        assert_eq!(sent.len(), INLINE_CHAIN_DEBUG.len());
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
            source.fingerprint().expect("hashes"),
            whole.fingerprint().expect("hashes"),
            "the hash covers the patched bytes"
        );
    }

    #[test]
    fn the_fingerprint_covers_the_length_and_both_ends() {
        let source = |bytes: Vec<u8>| {
            Source::new("f".into(), ObjectContents::Memory(bytes.into()), Vec::new())
                .expect("source")
        };
        let len = 4 * FINGERPRINT_EDGE;
        let base: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let print = |bytes: Vec<u8>| source(bytes).fingerprint().expect("reads");
        let mut middle = base.clone();
        middle[len / 2] ^= 1;
        assert_eq!(print(base.clone()), print(middle), "the middle is not read");
        let mut last = base.clone();
        last[len - 1] ^= 1;
        assert_ne!(print(base.clone()), print(last));
        let mut first = base.clone();
        first[0] ^= 1;
        assert_ne!(print(base.clone()), print(first));
        assert_ne!(print(base.clone()), print(base[..len - 1].to_vec()));
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
        assert!(source.fingerprint().is_err());
        assert!(source.read_at(90, &mut [0; 20]).is_err(), "past the end");
    }
}
