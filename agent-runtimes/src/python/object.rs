//! Is a mapped object the CPython interpreter, and which one.

use std::ops::Range;

use object::{
    Endianness, Object, ObjectSection, ObjectSymbol,
    elf::DT_NEEDED,
    read::elf::{Dyn, ElfFile64},
};

use super::{PythonError, PythonVersion, layout::Layout};

/// The interpreter in an object: the shared `libpython3.N.so`, or an
/// executable with libpython linked in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonObject {
    pub version: PythonVersion,
    /// Link-time address of `_PyRuntime` (add the object's load bias).
    pub runtime: u64,
    /// Link-time addresses of `_PyEval_EvalFrameDefault`, the interpreter
    /// loop whose native frames the interpreter frames stand for.
    pub eval_loop: Range<u64>,
    /// Link-time address of `PyCode_Type`: the walker takes only objects
    /// of this type for code objects.
    pub code_type: u64,
}

const RUNTIME: &str = "_PyRuntime";
const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";
const CODE_TYPE: &str = "PyCode_Type";
/// `const unsigned long Py_Version = PY_VERSION_HEX` (3.11+).
const VERSION: &str = "Py_Version";

/// Whether the object named `file_name` (a path or a file name) with the
/// bytes `elf` is a CPython interpreter: `Ok(None)` if not, an error if it
/// is one firn cannot walk.
///
/// An object is an interpreter if it defines `_PyRuntime` or is named like
/// one (`python3.N`, `libpython3.N*.so*`); but an executable that only
/// loads `libpython3.N.so` (pyenv's, the Docker images') is not: the
/// library is. The version comes from `Py_Version` (3.11+), else from the
/// file name: the version string in `.rodata` is assembled at run time, so
/// there is no cheap third way.
pub fn inspect_object(file_name: &str, elf: &[u8]) -> Result<Option<PythonObject>, PythonError> {
    inspect_mapped_object(file_name, elf, &|| {})
}

/// [`inspect_object`] over the bytes of a file mapping: `release_pages`
/// lets the kernel drop the pages read so far, and is called while a large
/// string table is searched, so that the search of a big executable's
/// (a Go server's `.strtab` is tens of MB) does not hold it all resident.
pub fn inspect_mapped_object(
    file_name: &str,
    elf: &[u8],
    release_pages: &dyn Fn(),
) -> Result<Option<PythonObject>, PythonError> {
    let file_name = file_name.rsplit('/').next().unwrap_or(file_name);
    let named = NamedVersion::parse(file_name);
    let file = match object::File::parse(elf) {
        Ok(file) => file,
        Err(source) if named.is_some() => return Err(PythonError::Parse { source }),
        Err(_) => return Ok(None),
    };
    let runtime = if named.is_some() || has_string(&file, RUNTIME, release_pages) {
        find_symbol(&file, RUNTIME)
    } else {
        None
    };
    if runtime.is_none() && (named.is_none() || loads_libpython(elf)) {
        return Ok(None);
    }
    if let Some(build) = named.and_then(NamedVersion::unsupported_build) {
        return Err(PythonError::UnsupportedBuild {
            file_name: file_name.to_owned(),
            build,
        });
    }
    let Some(runtime) = runtime else {
        // Named like an interpreter, without its state: an old one (3.6
        // has no `_PyRuntime`) or a stripped one.
        if let Some(named) = named {
            Layout::of(named.version)?;
        }
        return Err(PythonError::MissingSymbol { name: RUNTIME });
    };
    let version = match find_symbol(&file, VERSION) {
        Some(symbol) => PythonVersion::from_hex(read_u64(&file, &symbol, VERSION)?),
        None => named
            .map(|named| named.version)
            .ok_or(PythonError::UnknownVersion)?,
    };
    Layout::of(version)?;
    let eval_loop =
        find_symbol(&file, EVAL_LOOP).ok_or(PythonError::MissingSymbol { name: EVAL_LOOP })?;
    let code_type =
        find_symbol(&file, CODE_TYPE).ok_or(PythonError::MissingSymbol { name: CODE_TYPE })?;
    Ok(Some(PythonObject {
        version,
        code_type: code_type.address(),
        runtime: runtime.address(),
        eval_loop: eval_loop.address()..eval_loop.address().saturating_add(eval_loop.size()),
    }))
}

/// The version and build flags a file name gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NamedVersion {
    version: PythonVersion,
    debug: bool,
    free_threaded: bool,
}

impl NamedVersion {
    /// `python3.N[flags]` or `libpython3.N[flags].so[...]`, with the ABI
    /// flags of `sys.abiflags` (`d` debug, `t` free-threaded, `m` the
    /// pymalloc of 3.7 and older).
    fn parse(file_name: &str) -> Option<Self> {
        let (rest, library) = match file_name.strip_prefix("libpython3.") {
            Some(rest) => (rest, true),
            None => (file_name.strip_prefix("python3.")?, false),
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let minor: u8 = rest[..digits].parse().ok()?;
        let rest = &rest[digits..];
        let flags = rest.bytes().take_while(u8::is_ascii_lowercase).count();
        let (flags, suffix) = rest.split_at(flags);
        let ends_right = if library {
            suffix.starts_with(".so")
        } else {
            suffix.is_empty()
        };
        ends_right.then_some(Self {
            version: PythonVersion {
                major: 3,
                minor,
                patch: 0,
            },
            debug: flags.contains('d'),
            free_threaded: flags.contains('t'),
        })
    }

    fn unsupported_build(self) -> Option<&'static str> {
        if self.free_threaded {
            Some("free-threaded")
        } else if self.debug {
            Some("debug")
        } else {
            None
        }
    }
}

/// Whether a symbol string table of the file holds `name`. Every
/// executable a process runs is asked whether it embeds an interpreter,
/// and a search of the tables (scanned at memory speed) answers for most
/// of them far sooner than reading each symbol's name.
fn has_string(file: &object::File<'_>, name: &str, release_pages: &dyn Fn()) -> bool {
    let needle = [b"\0", name.as_bytes(), b"\0"].concat();
    let finder = memchr::memmem::Finder::new(&needle);
    [".dynstr", ".strtab"].iter().any(|table| {
        file.section_by_name(table)
            .and_then(|section| section.data().ok())
            .is_some_and(|data| find_in_windows(&finder, data, release_pages))
    })
}

/// Bytes of a string table searched between two releases of its pages.
const SEARCH_WINDOW: usize = 1 << 20;

/// Whether `data` holds the finder's needle, searched a window at a time
/// with the pages released after each window but the last. Windows
/// overlap by the needle's length less one, so a match across a border is
/// found.
fn find_in_windows(
    finder: &memchr::memmem::Finder<'_>,
    data: &[u8],
    release_pages: &dyn Fn(),
) -> bool {
    let overlap = finder.needle().len().saturating_sub(1);
    let mut start: usize = 0;
    loop {
        let end = start.saturating_add(SEARCH_WINDOW).min(data.len());
        if finder.find(&data[start..end]).is_some() {
            return true;
        }
        if end == data.len() {
            return false;
        }
        release_pages();
        start = end - overlap;
    }
}

fn find_symbol<'data, 'file>(
    file: &'file object::File<'data>,
    name: &str,
) -> Option<object::Symbol<'data, 'file>> {
    file.dynamic_symbols()
        .chain(file.symbols())
        .find(|symbol| symbol.is_definition() && symbol.name() == Ok(name))
}

fn read_u64(
    file: &object::File<'_>,
    symbol: &object::Symbol<'_, '_>,
    name: &'static str,
) -> Result<u64, PythonError> {
    let address = symbol.address();
    let unreadable = PythonError::UnreadableSymbol { name, address };
    let section = symbol
        .section_index()
        .and_then(|index| file.section_by_index(index).ok())
        .ok_or(unreadable)?;
    let bytes = section
        .data_range(address, 8)
        .ok()
        .flatten()
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
        .ok_or(PythonError::UnreadableSymbol { name, address })?;
    Ok(match file.endianness() {
        Endianness::Little => u64::from_le_bytes(bytes),
        Endianness::Big => u64::from_be_bytes(bytes),
    })
}

/// Whether the ELF file `elf` needs a `libpython3.*` library (`DT_NEEDED`):
/// an executable whose interpreter is that library, mapped by the dynamic
/// loader after the exec.
pub fn loads_libpython(elf: &[u8]) -> bool {
    let Ok(file) = ElfFile64::<Endianness>::parse(elf) else {
        return false;
    };
    let endian = file.endian();
    let sections = file.elf_section_table();
    let Ok(Some((entries, link))) = sections.dynamic(endian, elf) else {
        return false;
    };
    let Ok(strings) = sections.strings(endian, elf, link) else {
        return false;
    };
    entries.iter().any(|entry| {
        entry.tag(endian) == DT_NEEDED
            && entry
                .string(endian, strings)
                .is_ok_and(|name| name.starts_with(b"libpython3."))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(file_name: &str) -> Option<(u8, bool, bool)> {
        NamedVersion::parse(file_name)
            .map(|named| (named.version.minor, named.debug, named.free_threaded))
    }

    #[test]
    fn versions_in_file_names() {
        assert_eq!(named("python3.9"), Some((9, false, false)));
        assert_eq!(named("python3.13t"), Some((13, false, true)));
        assert_eq!(named("libpython3.9.so.1.0"), Some((9, false, false)));
        assert_eq!(named("libpython3.11.so"), Some((11, false, false)));
        assert_eq!(named("libpython3.10d.so.1.0"), Some((10, true, false)));
        assert_eq!(named("libpython3.7m.so.1.0"), Some((7, false, false)));
        for other in [
            "libpython3.so",
            "python3",
            "python3.9-config",
            "libpython3.9.a",
            "python3.x",
            "ipython3.9",
            "libpython3.999.so",
        ] {
            assert_eq!(named(other), None, "{other}");
        }
    }

    #[test]
    fn a_large_table_is_searched_in_windows_releasing_its_pages() {
        let needle = b"\0_PyRuntime\0";
        let finder = memchr::memmem::Finder::new(needle);
        let released = std::cell::Cell::new(0);
        let release = || released.set(released.get() + 1);
        // Across the first border: half the needle on each side.
        let mut table = vec![b'x'; 3 * SEARCH_WINDOW];
        let at = SEARCH_WINDOW - needle.len() / 2;
        table[at..at + needle.len()].copy_from_slice(needle);
        assert!(find_in_windows(&finder, &table, &release));
        assert_eq!(released.get(), 1, "released after the first window");
        // Not there: every window searched, the pages let go after each.
        released.set(0);
        table[at..at + needle.len()].fill(b'x');
        assert!(!find_in_windows(&finder, &table, &release));
        assert_eq!(released.get(), 3);
        // At the very end.
        let end = table.len() - needle.len();
        table[end..].copy_from_slice(needle);
        assert!(find_in_windows(&finder, &table, &release));
        // A small table: one search, nothing to release.
        released.set(0);
        assert!(find_in_windows(&finder, needle, &release));
        assert!(!find_in_windows(&finder, b"", &release));
        assert_eq!(released.get(), 0);
    }

    fn object(file: &str) -> &'static [u8] {
        agent_fixtures::python::object(file).expect("a stand-in object")
    }

    #[test]
    fn py_version_decides_the_version() {
        let found = inspect_object(
            "/usr/lib/libpython3.12.so.1.0",
            object("libpython3.12.so.1.0"),
        )
        .expect("an interpreter")
        .expect("walkable");
        assert_eq!(found.version.to_string(), "3.12.1");
        assert_eq!(found.runtime, 0x21a0);
        assert_eq!(found.code_type, 0x2000);
        assert_eq!(found.eval_loop.end - found.eval_loop.start, 10);
        // The symbol, not the name, is the interpreter's word.
        let renamed = inspect_object("some-embedder", object("libpython3.12.so.1.0"))
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(renamed, found);
    }

    #[test]
    fn the_file_name_tells_older_versions() {
        let found = inspect_object("libpython3.9.so.1.0", object("libpython3.9.so.1.0"))
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(
            found.version,
            PythonVersion {
                major: 3,
                minor: 9,
                patch: 0
            }
        );
        assert!(matches!(
            inspect_object("libembedded.so", object("libpython3.9.so.1.0")),
            Err(PythonError::UnknownVersion)
        ));
        assert!(matches!(
            inspect_object("libpython3.9d.so.1.0", object("libpython3.9.so.1.0")),
            Err(PythonError::UnsupportedBuild { build: "debug", .. })
        ));
    }

    #[test]
    fn interpreters_firn_cannot_walk() {
        assert!(matches!(
            inspect_object("libpython3.14.so.1.0", object("libpython3.14.so.1.0")),
            Err(PythonError::UnsupportedVersion { version }) if version.minor == 14
        ));
        assert!(matches!(
            inspect_object("libpython3.10.so.1.0", object("libpython3.10.so.1.0")),
            Err(PythonError::MissingSymbol { name: "_PyRuntime" })
        ));
        assert!(matches!(
            inspect_object("libpython3.6m.so.1.0", object("libpython3.10.so.1.0")),
            Err(PythonError::UnsupportedVersion { version }) if version.minor == 6
        ));
        assert!(matches!(
            inspect_object("python3.11", b"garbage"),
            Err(PythonError::Parse { .. })
        ));
    }

    #[test]
    fn other_objects_are_not_interpreters() {
        assert_eq!(
            inspect_object("chain", agent_fixtures::CHAIN).ok(),
            Some(None)
        );
        assert_eq!(inspect_object("libfoo.so", b"garbage").ok(), Some(None));
        assert_eq!(
            inspect_object("libpython3.10-stub.so", object("libpython3.10.so.1.0")).ok(),
            Some(None)
        );
        assert_eq!(
            inspect_object("/usr/bin/python3.12", object("python3.12")).ok(),
            Some(None),
            "the launcher of libpython is not the interpreter"
        );
    }
}
