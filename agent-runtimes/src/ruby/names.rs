//! What names a method: its method entry's name (an ID, looked up in the
//! symbol table) and owner (a class, whose path is its `__classpath__`
//! instance variable until 3.1, its `classpath` field since; a singleton
//! class's object is its `__attached__`, or its `attached_object`).

use std::sync::Arc;

use super::{
    layout::{
        ClassFields, ClassNames, IMEMO_MENT, IvarLayout, Layout, T_CLASS, T_MODULE, T_STRING,
        TYPE_MASK,
    },
    namer::{Entry, Key, NameError, RubyNamer, RubyProcess, failed_read, is_imemo},
    read::{
        HEADER_BYTES, embedded_length, field_u32, field_u64, plausible, pointer, read, read_array,
        read_string, read_u64,
    },
};
use crate::Memory;

/// A method entry as decoded once.
pub(super) struct MethodEntry {
    /// Its `def`, `called_id` and `owner`: an entry at the same address
    /// with others is another one.
    definition: u64,
    called_id: u64,
    owner: u64,
    /// `Class#`, `Class.` (a singleton method), or empty (an anonymous
    /// class, or one whose path is unknown).
    pub prefix: Arc<str>,
    /// The method's original name (`def`'s `original_id`).
    pub name: Arc<str>,
}

/// The ID of `__classpath__` in one process, once looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClassPathId {
    Found(u64),
    /// Not among the first [`MAX_SCANNED_SERIALS`] symbols: classes are
    /// not named.
    Absent,
}

/// Instance variables of one class read at most.
const MAX_IVARS: u64 = 4096;
/// Symbols looked at for `__classpath__`: CRuby interns it while it
/// starts (serial 240 in 3.1), before any script runs.
const MAX_SCANNED_SERIALS: u64 = 4096;
/// String headers read in one system call while looking.
const SCAN_BATCH: usize = 64;
const CLASS_PATH: &[u8] = b"__classpath__";
/// A static Symbol: `ID << 8 | 0x0c`.
const STATIC_SYMBOL_MASK: u64 = 0xff;
const STATIC_SYMBOL_FLAG: u64 = 0x0c;
const SYMBOL_SHIFT: u32 = 8;
/// `st_table`'s mark of a deleted entry, in its hash.
const DELETED_HASH: u64 = u64::MAX;

impl RubyNamer {
    /// The method entry at `address` whose first bytes are `header`: the
    /// cached one if it still holds the same words, else read anew.
    pub(super) fn method_entry(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
        address: u64,
        header: &[u8],
    ) -> Result<(Arc<str>, Arc<str>), NameError> {
        let fields = &layout.method;
        let flags = field_u64(header, 0);
        if !is_imemo(flags, IMEMO_MENT) {
            return Err(NameError::NotMethodEntry { address, flags });
        }
        let (definition, called_id, owner) = (
            field_u64(header, fields.entry_definition),
            field_u64(header, fields.entry_called_id),
            field_u64(header, fields.entry_owner),
        );
        let key = Key::Method {
            process: process.key,
            address,
        };
        if let Some(Entry::Method(entry)) = self.cache.get(&key)
            && (entry.definition, entry.called_id, entry.owner) == (definition, called_id, owner)
        {
            return Ok((entry.prefix.clone(), entry.name.clone()));
        }
        let original = read_u64(
            memory,
            pointer(definition, "method definition")?.wrapping_add(fields.definition_original_id),
        )?;
        // Named by what it was defined as (an alias by its original), as
        // Ruby's backtraces do; an entry without one by what it was called.
        let id = if original != 0 { original } else { called_id };
        let name = self.id_name(process, layout, memory, id)?;
        let prefix = self.owner_prefix(process, layout, memory, owner)?;
        let entry = MethodEntry {
            definition,
            called_id,
            owner,
            prefix: prefix.clone(),
            name: name.clone(),
        };
        self.insert(key, Entry::Method(entry));
        Ok((prefix, name))
    }

    /// What a method of `owner` is prefixed with: `Path#`, `Path.` for a
    /// singleton class of a class or module, empty when there is no path.
    fn owner_prefix(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
        owner: u64,
    ) -> Result<Arc<str>, NameError> {
        let owner = pointer(owner, "method owner")?;
        let singleton = layout.class.singleton_flag;
        let flags = read_u64(memory, owner)? & (TYPE_MASK | singleton);
        let key = Key::Class {
            process: process.key,
            address: owner,
        };
        if let Some(Entry::Class {
            flags: cached,
            prefix,
        }) = self.cache.get(&key)
            && *cached == flags
        {
            return Ok(prefix.clone());
        }
        let prefix = match (flags & TYPE_MASK, flags & singleton != 0) {
            (T_CLASS, true) => {
                let attached = match &layout.class.names {
                    ClassNames::Ivars(ivars) => ivar(ivars, memory, owner, ivars.attached)?,
                    ClassNames::Fields(fields) => {
                        Some(read_u64(memory, owner.wrapping_add(fields.attached))?)
                    }
                };
                match attached {
                    Some(object) if is_class(memory, object)? => self
                        .class_path(process, layout, memory, object)?
                        .map(|path| format!("{path}.")),
                    _ => None,
                }
            }
            (T_CLASS | T_MODULE, false) => self
                .class_path(process, layout, memory, owner)?
                .map(|path| format!("{path}#")),
            _ => None,
        };
        let prefix: Arc<str> = Arc::from(prefix.unwrap_or_default());
        self.insert(
            key,
            Entry::Class {
                flags,
                prefix: prefix.clone(),
            },
        );
        Ok(prefix)
    }

    /// The path of the class or module `class` (`Foo::Bar`), `None` for an
    /// anonymous one, or one whose path is not permanent.
    fn class_path(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
        class: u64,
    ) -> Result<Option<Arc<str>>, NameError> {
        let path = match &layout.class.names {
            ClassNames::Ivars(ivars) => {
                let ClassPathId::Found(id) = self.class_path_id(process, layout, memory)? else {
                    return Ok(None);
                };
                ivar(ivars, memory, class, id)?
            }
            ClassNames::Fields(fields) => class_path_field(fields, memory, class)?,
        };
        match path {
            Some(path) if path != layout.nil && path != 0 => {
                read_string(memory, &layout.string, path, None).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The name of the ID `id`, from the symbol table.
    pub(super) fn id_name(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
        id: u64,
    ) -> Result<Arc<str>, NameError> {
        let key = Key::Id {
            process: process.key,
            id,
        };
        if let Some(Entry::Id(name)) = self.cache.get(&key) {
            return Ok(name.clone());
        }
        let symbols = &layout.symbols;
        let serial = if id > symbols.last_operator {
            id >> symbols.serial_shift
        } else {
            id
        };
        let [string, symbol] = symbol_entry(layout, memory, process.symbols, serial)?
            .ok_or(NameError::UnknownId { id })?;
        // The entry names this ID (not one whose serial a forged ID shares).
        if symbol_id(layout, memory, symbol)? != Some(id) || string == layout.nil {
            return Err(NameError::UnknownId { id });
        }
        let name = read_string(memory, &layout.string, string, None)?;
        self.insert(key, Entry::Id(name.clone()));
        Ok(name)
    }

    /// The ID of `__classpath__` in the process, looked for once.
    fn class_path_id(
        &mut self,
        process: &RubyProcess,
        layout: &Layout,
        memory: &mut dyn Memory,
    ) -> Result<ClassPathId, NameError> {
        if let Some(known) = self.class_path_ids.get(&process.key) {
            return Ok(*known);
        }
        self.missed = true;
        let found = find_class_path_id(layout, memory, process.symbols)?;
        self.class_path_ids.insert(process.key, found);
        Ok(found)
    }
}

/// The instance variable `id` of the class `class`, from its `iv_tbl`
/// (until 3.1).
fn ivar(
    fields: &IvarLayout,
    memory: &mut dyn Memory,
    class: u64,
    id: u64,
) -> Result<Option<u64>, NameError> {
    let ext = read_u64(memory, class.wrapping_add(fields.class_ext))?;
    let table = read_u64(
        memory,
        pointer(ext, "class ext")?.wrapping_add(fields.ext_ivars),
    )?;
    if table == 0 {
        return Ok(None);
    }
    let mut header = [0; 64];
    let header = &mut header[..fields.table_header];
    read(memory, pointer(table, "ivar table")?, header)?;
    let start = field_u64(header, fields.table_start);
    let bound = field_u64(header, fields.table_bound);
    let count = bound.saturating_sub(start).min(MAX_IVARS);
    if count == 0 {
        return Ok(None);
    }
    let entries = pointer(field_u64(header, fields.table_entries), "ivar entries")?;
    let mut bytes = vec![0; (count * fields.table_entry_size) as usize];
    read(
        memory,
        entries.wrapping_add(start.wrapping_mul(fields.table_entry_size)),
        &mut bytes,
    )?;
    Ok(bytes
        .chunks_exact(fields.table_entry_size as usize)
        .find(|entry| {
            field_u64(entry, 0) != DELETED_HASH && field_u64(entry, fields.table_entry_key) == id
        })
        .map(|entry| field_u64(entry, fields.table_entry_record)))
}

/// The `classpath` of the class `class` if it is permanent (3.2+): both
/// fields in one read.
fn class_path_field(
    fields: &ClassFields,
    memory: &mut dyn Memory,
    class: u64,
) -> Result<Option<u64>, NameError> {
    let start = fields.permanent_byte.min(fields.path);
    let end = (fields.permanent_byte + 1).max(fields.path + 8);
    let mut bytes = [0; 64];
    let bytes = bytes
        .get_mut(..(end - start) as usize)
        .ok_or(failed_read(class, (end - start) as usize))?;
    read(memory, class.wrapping_add(start), bytes)?;
    let permanent = bytes[(fields.permanent_byte - start) as usize] & fields.permanent_bit != 0;
    Ok(permanent.then(|| field_u64(bytes, fields.path - start)))
}

/// Whether `object` is a class or a module (not a singleton class's
/// ordinary object, nor a special constant).
fn is_class(memory: &mut dyn Memory, object: u64) -> Result<bool, NameError> {
    if !plausible(object) {
        return Ok(false);
    }
    let flags = read_u64(memory, object)?;
    Ok(matches!(flags & TYPE_MASK, T_CLASS | T_MODULE))
}

/// `last_id` and `ids` of the symbol table at `symbols`.
fn symbol_table(
    layout: &Layout,
    memory: &mut dyn Memory,
    symbols: u64,
) -> Result<(u64, u64), NameError> {
    let fields = &layout.symbols;
    let mut header = [0; 64];
    let length = (fields.ids.max(fields.last_id) + 8) as usize;
    let header = header
        .get_mut(..length)
        .ok_or(failed_read(symbols, length))?;
    read(memory, symbols, header)?;
    Ok((
        u64::from(field_u32(header, fields.last_id)),
        field_u64(header, fields.ids),
    ))
}

/// The String and Symbol of the ID of `serial`; `None` for a serial not
/// given out.
fn symbol_entry(
    layout: &Layout,
    memory: &mut dyn Memory,
    symbols: u64,
    serial: u64,
) -> Result<Option<[u64; 2]>, NameError> {
    let fields = &layout.symbols;
    let (last_id, ids) = symbol_table(layout, memory, symbols)?;
    if serial == 0 || serial > last_id {
        return Ok(None);
    }
    let chunks = read_array(memory, &layout.array, ids)?;
    let chunk_index = serial / fields.ids_per_chunk;
    if chunk_index >= chunks.length {
        return Ok(None);
    }
    let chunk_elements = pointer(chunks.elements, "symbol chunks")?;
    let chunk = read_u64(memory, chunk_elements.wrapping_add(chunk_index * 8))?;
    let chunk = read_array(memory, &layout.array, chunk)?;
    let slot = serial % fields.ids_per_chunk * fields.values_per_id;
    if slot + 1 >= chunk.length {
        return Ok(None);
    }
    let mut pair = [0; 16];
    let elements = pointer(chunk.elements, "symbol chunk")?;
    read(memory, elements.wrapping_add(slot * 8), &mut pair)?;
    Ok(Some([field_u64(&pair, 0), field_u64(&pair, 8)]))
}

/// The ID a Symbol stands for: a static one holds it, a dynamic one
/// (`struct RSymbol`) points to it.
fn symbol_id(
    layout: &Layout,
    memory: &mut dyn Memory,
    symbol: u64,
) -> Result<Option<u64>, NameError> {
    if symbol & STATIC_SYMBOL_MASK == STATIC_SYMBOL_FLAG {
        return Ok(Some(symbol >> SYMBOL_SHIFT));
    }
    if !plausible(symbol) {
        return Ok(None);
    }
    read_u64(memory, symbol.wrapping_add(layout.symbols.symbol_id)).map(Some)
}

/// Looks through the first symbols for `__classpath__`: reads each
/// chunk's elements at once, then the Strings' headers in batches.
fn find_class_path_id(
    layout: &Layout,
    memory: &mut dyn Memory,
    symbols: u64,
) -> Result<ClassPathId, NameError> {
    let fields = &layout.symbols;
    let (last_id, ids) = symbol_table(layout, memory, symbols)?;
    let last = last_id.min(MAX_SCANNED_SERIALS);
    let chunks = read_array(memory, &layout.array, ids)?;
    let per_chunk = fields.ids_per_chunk;
    let mut chunk_index = 0;
    while chunk_index * per_chunk <= last && chunk_index < chunks.length {
        let chunk_elements = pointer(chunks.elements, "symbol chunks")?;
        let chunk = read_u64(memory, chunk_elements.wrapping_add(chunk_index * 8))?;
        let chunk = read_array(memory, &layout.array, chunk)?;
        let serials = (last + 1 - chunk_index * per_chunk).min(per_chunk);
        let values = (serials * fields.values_per_id).min(chunk.length);
        let mut bytes = vec![0; (values * 8) as usize];
        read(memory, pointer(chunk.elements, "symbol chunk")?, &mut bytes)?;
        let pairs: Vec<[u64; 2]> = bytes
            .chunks_exact((fields.values_per_id * 8) as usize)
            .map(|pair| [field_u64(pair, 0), field_u64(pair, 8)])
            .collect();
        for batch in pairs.chunks(SCAN_BATCH) {
            if let Some(symbol) = find_in_batch(layout, memory, batch)? {
                return Ok(match symbol_id(layout, memory, symbol)? {
                    Some(id) => ClassPathId::Found(id),
                    None => ClassPathId::Absent,
                });
            }
        }
        chunk_index += 1;
    }
    Ok(ClassPathId::Absent)
}

/// The Symbol of the pair whose String is `__classpath__`, if one is.
/// A String that cannot be read fails the search (to be made again): a
/// search that passed it by could miss the one it looks for, and name no
/// class.
fn find_in_batch(
    layout: &Layout,
    memory: &mut dyn Memory,
    pairs: &[[u64; 2]],
) -> Result<Option<u64>, NameError> {
    let strings: Vec<u64> = pairs
        .iter()
        .map(|[string, _]| *string)
        .filter(|&string| plausible(string))
        .collect();
    let mut headers = vec![[0u8; HEADER_BYTES]; strings.len()];
    let mut reads: Vec<(u64, &mut [u8])> = strings
        .iter()
        .zip(headers.iter_mut())
        .map(|(&address, header)| (address, &mut header[..]))
        .collect();
    let whole = memory.read_many(&mut reads);
    for (index, (&address, header)) in strings.iter().zip(headers.iter_mut()).enumerate() {
        if index >= whole {
            read(memory, address, header)?;
        }
        let flags = field_u64(header, 0);
        let named = flags & TYPE_MASK == T_STRING
            && if flags & layout.string.heap_flag == 0 {
                is_class_path(layout, header)
            } else {
                field_u64(header, layout.string.heap_length) == CLASS_PATH.len() as u64
                    && read_string(memory, &layout.string, address, Some(header))?.as_bytes()
                        == CLASS_PATH
            };
        if named {
            return Ok(pairs
                .iter()
                .find(|[string, _]| *string == address)
                .map(|[_, symbol]| *symbol));
        }
    }
    Ok(None)
}

/// Whether the embedded String whose header is `header` says
/// `__classpath__` (checked without allocating: most are not).
fn is_class_path(layout: &Layout, header: &[u8]) -> bool {
    let string = &layout.string;
    let length = embedded_length(string, header);
    let start = string.embedded as usize;
    length == CLASS_PATH.len() as u64
        && header.get(start..start + CLASS_PATH.len()) == Some(CLASS_PATH)
}
