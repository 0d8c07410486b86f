//! Is a mapped object a V8 embedder (Node's executable, `libnode.so`, an
//! Electron or Chromium binary), and what post-mortem constants it carries.
//!
//! V8 builds that keep post-mortem support export one `v8dbg_NAME` symbol
//! per constant (`tools/gen-postmortem-metadata.py`): a 4-byte `int` whose
//! value is what a debugger needs (a field offset, a type tag, a frame
//! slot). The values are link-time constants, so they are read from the
//! object's bytes, not from the process: a constant of value 0 lands in
//! `.bss` and has no bytes in the file.

use std::{collections::BTreeMap, ops::Range};

use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

/// Every `v8dbg_` symbol read is this long (`int`); another size is skipped
/// and counted rather than misread.
const CONSTANT_SIZE: u64 = 4;
/// More constants than any V8 exports (about 550); a file with more is not
/// read further (a hostile symbol table stays bounded).
pub(crate) const MAX_CONSTANTS: usize = 4096;
/// The prefix every post-mortem symbol carries.
const PREFIX: &str = "v8dbg_";
/// The prefix of V8's builtins (`Builtins_InterpreterEntryTrampoline`,
/// the bytecode handlers, ...) in the symbol table of an embedder whose
/// builtins are embedded in its text.
const BUILTINS_PREFIX: &str = "Builtins_";

/// A V8 embedder as its ELF file shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V8Object {
    pub constants: Constants,
    /// Link-time addresses of the embedded builtins (add the object's load
    /// bias): frames there are V8's, as are frames in anonymous executable
    /// memory (generated code, and the copy of the builtins V8 makes next
    /// to it when short builtin calls are on, as in Node 24). `None` when
    /// the symbol table (stripped) does not name them.
    pub builtins: Option<Range<u64>>,
    /// Where in the file the builtins start: V8 may map that part of the
    /// file a second time, next to its generated code, and run the copy
    /// ([`V8Object::builtins_in_process`]).
    pub builtins_file_offset: Option<u64>,
}

/// One mapping of the embedder's file in a process (`/proc/PID/maps`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMapping {
    pub addresses: Range<u64>,
    /// The file offset the mapping starts at.
    pub offset: u64,
}

impl V8Object {
    /// Where a process that maps this embedder as `mappings` has its
    /// builtins: in its text segment, and, with short builtin calls (Node
    /// 20 to 24 on x86-64), in a second mapping of that part of the file
    /// next to V8's generated code. V8 runs both (calls from generated code
    /// go to the near copy), so a pc in any of them is a builtin's.
    pub fn builtins_in_process(&self, mappings: &[FileMapping]) -> Vec<Range<u64>> {
        let (Some(builtins), Some(file_offset)) =
            (self.builtins.as_ref(), self.builtins_file_offset)
        else {
            return Vec::new();
        };
        let length = builtins.end.saturating_sub(builtins.start);
        mappings
            .iter()
            .filter_map(|mapping| {
                let size = mapping
                    .addresses
                    .end
                    .saturating_sub(mapping.addresses.start);
                let skip = file_offset.checked_sub(mapping.offset)?;
                if skip.saturating_add(length) > size {
                    return None;
                }
                let start = mapping.addresses.start + skip;
                Some(start..start + length)
            })
            .take(MAX_BUILTIN_MAPPINGS)
            .collect()
    }
}

/// More mappings of the builtins than V8 makes (two) are not all kept.
const MAX_BUILTIN_MAPPINGS: usize = 4;

/// A V8 embedder's post-mortem constants, by name without the `v8dbg_`
/// prefix (`off_fp_function`, `type_JSFunction__JS_FUNCTION_TYPE`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Constants {
    values: BTreeMap<String, i64>,
    /// `v8dbg_` symbols of an unexpected size or without bytes where the
    /// file should have them: left out.
    pub skipped: usize,
}

impl Constants {
    /// The value of `name` (without the `v8dbg_` prefix).
    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.get(name).copied()
    }

    /// Constants whose names start with `prefix`, in name order.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, i64)> + 'a {
        self.values
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(name, _)| name.starts_with(prefix))
            .map(|(name, value)| (name.as_str(), *value))
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Constants given as `name value` lines (fixtures, tests). A name may
    /// carry the `v8dbg_` prefix or not.
    pub fn parse(text: &str) -> Result<Self, ObjectError> {
        let mut values = BTreeMap::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || ObjectError::BadLine {
                line: index + 1,
                text: line.chars().take(80).collect(),
            };
            let mut fields = line.split_whitespace();
            let (Some(name), Some(value), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(bad());
            };
            let value: i64 = value.parse().map_err(|_| bad())?;
            let name = name.strip_prefix(PREFIX).unwrap_or(name);
            values.insert(name.to_owned(), value);
            if values.len() > MAX_CONSTANTS {
                return Err(ObjectError::TooMany {
                    limit: MAX_CONSTANTS,
                });
            }
        }
        Ok(Self { values, skipped: 0 })
    }

    pub(crate) fn insert(&mut self, name: &str, value: i64) {
        self.values.insert(name.to_owned(), value);
    }
}

/// Why an object that carries `v8dbg_` symbols could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("could not parse the V8 embedder as ELF")]
    Parse {
        #[source]
        source: object::Error,
    },
    #[error("more than {limit} v8dbg_ constants")]
    TooMany { limit: usize },
    #[error("line {line} is not `name value`: {text:?}")]
    BadLine { line: usize, text: String },
}

/// Whether the object with the bytes `elf` embeds V8 with its post-mortem
/// constants: `Ok(None)` if it has none (not V8, or a build without
/// post-mortem support, which firn cannot name).
///
/// The constants are exported (`.dynsym`) by Node's executable; the symbol
/// table is read as well, for embedders that keep them local, and for the
/// builtins, which are local symbols.
pub fn inspect_object(elf: &[u8]) -> Result<Option<V8Object>, ObjectError> {
    // The prefix in the bytes at all is a cheap test that spares parsing
    // the symbol tables of every other object a process maps.
    if memchr::memmem::find(elf, PREFIX.as_bytes()).is_none() {
        return Ok(None);
    }
    let file = object::File::parse(elf).map_err(|source| ObjectError::Parse { source })?;
    let mut constants = Constants::default();
    let mut builtins: Option<Range<u64>> = None;
    for symbols in [file.dynamic_symbols(), file.symbols()] {
        for symbol in symbols {
            let Ok(name) = symbol.name() else { continue };
            if name.starts_with(BUILTINS_PREFIX)
                && symbol.kind() == object::SymbolKind::Text
                && symbol.is_definition()
            {
                let end = symbol.address().saturating_add(symbol.size());
                builtins = Some(match builtins {
                    Some(range) => range.start.min(symbol.address())..range.end.max(end),
                    None => symbol.address()..end,
                });
                continue;
            }
            let Some(name) = name.strip_prefix(PREFIX) else {
                continue;
            };
            if !symbol.is_definition() || constants.get(name).is_some() {
                continue;
            }
            match constant_value(&file, &symbol) {
                Some(value) => constants.insert(name, value),
                None => constants.skipped += 1,
            }
            if constants.len() > MAX_CONSTANTS {
                return Err(ObjectError::TooMany {
                    limit: MAX_CONSTANTS,
                });
            }
        }
    }
    let builtins_file_offset = builtins.as_ref().and_then(|builtins| {
        file.sections().find_map(|section| {
            let (offset, _) = section.file_range()?;
            let within = builtins.start.checked_sub(section.address())?;
            (within < section.size()).then_some(offset + within)
        })
    });
    Ok((!constants.is_empty()).then_some(V8Object {
        constants,
        builtins,
        builtins_file_offset,
    }))
}

/// The `int` a constant symbol defines: its bytes in its section, or 0 in
/// a section without bytes (`.bss`).
fn constant_value<'data>(
    file: &object::File<'data>,
    symbol: &object::Symbol<'data, '_>,
) -> Option<i64> {
    if symbol.size() != CONSTANT_SIZE {
        return None;
    }
    let index = symbol.section_index()?;
    let section = file.section_by_index(index).ok()?;
    if matches!(
        section.kind(),
        SectionKind::UninitializedData | SectionKind::UninitializedTls
    ) {
        return Some(0);
    }
    let bytes = section.data_range(symbol.address(), CONSTANT_SIZE).ok()??;
    let bytes = <[u8; 4]>::try_from(bytes).ok()?;
    Some(i64::from(i32::from_le_bytes(bytes)))
}
