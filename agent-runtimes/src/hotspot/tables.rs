//! HotSpot's structure tables (`vmStructs.cpp`), read out of the process:
//! fields (`gHotSpotVMStructs`: type, field, offset or static address),
//! types (`gHotSpotVMTypes`: name, size) and constants
//! (`gHotSpotVMIntConstants`, `gHotSpotVMLongConstants`). Each table is an
//! array ended by an entry whose name is null; how its entries are laid
//! out is exported too (`...EntryArrayStride`, `...NameOffset`).

use std::collections::HashMap;

use super::{
    HotSpotError,
    object::JvmObject,
    read::{c_string, field, field_u64, i32_at, read, u64_at},
};
use crate::Memory;

/// Most entries read of one table (JDK 17 has about 1,200 fields, 900
/// types, 400 int constants).
const MAX_ENTRIES: usize = 20_000;

/// Longest type, field or constant name read.
const MAX_NAME: usize = 256;

/// Largest entry stride believed.
const MAX_STRIDE: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("the JVM's tables are not initialized yet ({symbol} is null)")]
    NotInitialized { symbol: &'static str },
    #[error("the JVM's {symbol} ({value}) is not a plausible entry layout")]
    BadLayout { symbol: &'static str, value: u64 },
    #[error("the JVM's {table} table has more than {MAX_ENTRIES} entries")]
    TooLong { table: &'static str },
    #[error("could not read the JVM's {table} table")]
    Read {
        table: &'static str,
        #[source]
        source: HotSpotError,
    },
}

/// A field of a C++ type: an offset into its objects, or the address of a
/// static.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Offset(u64),
    Static(u64),
}

/// A field and the name of its C++ type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldEntry {
    pub(crate) field: Field,
    pub(crate) type_string: Option<String>,
}

/// The tables of one JVM, by name.
#[derive(Clone, Debug, Default)]
pub struct VmTables {
    /// `(type, field)` to the field.
    pub(crate) fields: HashMap<(String, String), FieldEntry>,
    /// Type name to its size in bytes.
    pub(crate) types: HashMap<String, u64>,
    pub(crate) int_constants: HashMap<String, i64>,
    pub(crate) long_constants: HashMap<String, i64>,
    /// `Abstract_VM_Version::_vm_major_version`, read with the tables:
    /// what they do not describe (how streams are coded) goes by it.
    pub(crate) major_version: Option<i64>,
}

/// How the entries of one table are laid out.
struct EntryLayout {
    table: u64,
    stride: u64,
}

/// The table symbols' values, read from the process.
struct Symbols<'a>(&'a JvmObject);

impl Symbols<'_> {
    fn value(&self, memory: &mut dyn Memory, name: &'static str) -> Result<u64, TableError> {
        let address = self
            .0
            .symbol(name)
            .ok_or(TableError::NotInitialized { symbol: name })?;
        u64_at(memory, address).map_err(|source| TableError::Read {
            table: name,
            source,
        })
    }

    /// An offset into entries of `layout`'s stride.
    fn offset(
        &self,
        memory: &mut dyn Memory,
        layout: &EntryLayout,
        name: &'static str,
    ) -> Result<u64, TableError> {
        let value = self.value(memory, name)?;
        if value < layout.stride {
            Ok(value)
        } else {
            Err(TableError::BadLayout {
                symbol: name,
                value,
            })
        }
    }

    fn table(
        &self,
        memory: &mut dyn Memory,
        table: &'static str,
        stride: &'static str,
    ) -> Result<EntryLayout, TableError> {
        let address = self.value(memory, table)?;
        if address == 0 {
            return Err(TableError::NotInitialized { symbol: table });
        }
        let stride = self.value(memory, stride)?;
        if stride == 0 || stride > MAX_STRIDE {
            return Err(TableError::BadLayout {
                symbol: "an entry stride",
                value: stride,
            });
        }
        Ok(EntryLayout {
            table: address,
            stride,
        })
    }
}

impl VmTables {
    /// Reads the tables of the JVM whose table symbols (run-time
    /// addresses) are `symbols`.
    pub fn read(memory: &mut dyn Memory, symbols: &JvmObject) -> Result<Self, TableError> {
        let symbols = Symbols(symbols);
        let mut tables = VmTables::default();
        tables.read_fields(memory, &symbols)?;
        if let Some(address) = tables.static_address("Abstract_VM_Version", "_vm_major_version") {
            tables.major_version = Some(i64::from(i32_at(memory, address).map_err(|source| {
                TableError::Read {
                    table: "the major version",
                    source,
                }
            })?));
        }
        tables.read_types(memory, &symbols)?;
        for (table, stride, name_offset, value_offset, width) in [
            (
                "gHotSpotVMIntConstants",
                "gHotSpotVMIntConstantEntryArrayStride",
                "gHotSpotVMIntConstantEntryNameOffset",
                "gHotSpotVMIntConstantEntryValueOffset",
                4,
            ),
            (
                "gHotSpotVMLongConstants",
                "gHotSpotVMLongConstantEntryArrayStride",
                "gHotSpotVMLongConstantEntryNameOffset",
                "gHotSpotVMLongConstantEntryValueOffset",
                8,
            ),
        ] {
            let entries = symbols.table(memory, table, stride)?;
            let name_at = symbols.offset(memory, &entries, name_offset)?;
            let value_at = symbols.offset(memory, &entries, value_offset)?;
            let into = if width == 4 {
                &mut tables.int_constants
            } else {
                &mut tables.long_constants
            };
            each_entry(memory, &entries, table, |memory, entry| {
                let name = field_u64(entry, name_at);
                if name == 0 {
                    return Ok(false);
                }
                let name = c_string(memory, name, MAX_NAME)?;
                let raw = field(entry, value_at, width);
                let value = if width == 4 {
                    i64::from(raw as u32 as i32)
                } else {
                    raw as i64
                };
                into.insert(name, value);
                Ok(true)
            })?;
        }
        Ok(tables)
    }

    fn read_fields(
        &mut self,
        memory: &mut dyn Memory,
        symbols: &Symbols,
    ) -> Result<(), TableError> {
        let entries = symbols.table(
            memory,
            "gHotSpotVMStructs",
            "gHotSpotVMStructEntryArrayStride",
        )?;
        let type_name = symbols.offset(memory, &entries, "gHotSpotVMStructEntryTypeNameOffset")?;
        let field_name =
            symbols.offset(memory, &entries, "gHotSpotVMStructEntryFieldNameOffset")?;
        let type_string =
            symbols.offset(memory, &entries, "gHotSpotVMStructEntryTypeStringOffset")?;
        let is_static = symbols.offset(memory, &entries, "gHotSpotVMStructEntryIsStaticOffset")?;
        let offset = symbols.offset(memory, &entries, "gHotSpotVMStructEntryOffsetOffset")?;
        let address = symbols.offset(memory, &entries, "gHotSpotVMStructEntryAddressOffset")?;
        each_entry(memory, &entries, "fields", |memory, entry| {
            let name = field_u64(entry, type_name);
            if name == 0 {
                return Ok(false);
            }
            let type_name = c_string(memory, name, MAX_NAME)?;
            let field_name = c_string(memory, field_u64(entry, field_name), MAX_NAME)?;
            let value = if field(entry, is_static, 4) != 0 {
                Field::Static(field_u64(entry, address))
            } else {
                Field::Offset(field_u64(entry, offset))
            };
            let type_string = match field_u64(entry, type_string) {
                0 => None,
                address => Some(c_string(memory, address, MAX_NAME)?),
            };
            self.fields.insert(
                (type_name, field_name),
                FieldEntry {
                    field: value,
                    type_string,
                },
            );
            Ok(true)
        })
    }

    fn read_types(&mut self, memory: &mut dyn Memory, symbols: &Symbols) -> Result<(), TableError> {
        let entries = symbols.table(memory, "gHotSpotVMTypes", "gHotSpotVMTypeEntryArrayStride")?;
        let type_name = symbols.offset(memory, &entries, "gHotSpotVMTypeEntryTypeNameOffset")?;
        let size = symbols.offset(memory, &entries, "gHotSpotVMTypeEntrySizeOffset")?;
        each_entry(memory, &entries, "types", |memory, entry| {
            let name = field_u64(entry, type_name);
            if name == 0 {
                return Ok(false);
            }
            let name = c_string(memory, name, MAX_NAME)?;
            self.types.insert(name, field_u64(entry, size));
            Ok(true)
        })
    }

    /// The offset of `field` in objects of `type_name`.
    pub fn offset(&self, type_name: &str, field: &str) -> Option<u64> {
        match self
            .fields
            .get(&(type_name.to_owned(), field.to_owned()))?
            .field
        {
            Field::Offset(offset) => Some(offset),
            Field::Static(_) => None,
        }
    }

    /// The address of the static `field` of `type_name`.
    pub fn static_address(&self, type_name: &str, field: &str) -> Option<u64> {
        match self
            .fields
            .get(&(type_name.to_owned(), field.to_owned()))?
            .field
        {
            Field::Static(address) => Some(address),
            Field::Offset(_) => None,
        }
    }

    /// The C++ type of a field, as the tables spell it.
    pub(crate) fn type_string(&self, type_name: &str, field: &str) -> Option<&str> {
        self.fields
            .get(&(type_name.to_owned(), field.to_owned()))?
            .type_string
            .as_deref()
    }

    /// The size of `type_name` in bytes.
    pub fn size(&self, type_name: &str) -> Option<u64> {
        self.types.get(type_name).copied()
    }

    /// An int or long constant.
    pub fn constant(&self, name: &str) -> Option<i64> {
        self.int_constants
            .get(name)
            .or_else(|| self.long_constants.get(name))
            .copied()
    }

    /// The JVM's major version (17 for JDK 17).
    pub fn major_version(&self) -> Option<i64> {
        self.major_version
    }

    /// Every field as `(type, field, offset or static address, its C++
    /// type)`, for tools that list the tables.
    pub fn each_field(&self) -> impl Iterator<Item = (&str, &str, Field, Option<&str>)> {
        self.fields.iter().map(|((type_name, field), entry)| {
            (
                type_name.as_str(),
                field.as_str(),
                entry.field,
                entry.type_string.as_deref(),
            )
        })
    }

    /// Every type and its size, then every constant.
    pub fn each_type(&self) -> impl Iterator<Item = (&str, u64)> {
        self.types.iter().map(|(name, size)| (name.as_str(), *size))
    }

    pub fn each_constant(&self) -> impl Iterator<Item = (&str, i64)> {
        self.int_constants
            .iter()
            .chain(&self.long_constants)
            .map(|(name, value)| (name.as_str(), *value))
    }

    /// How many fields, types and constants were read.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.fields.len(),
            self.types.len(),
            self.int_constants.len() + self.long_constants.len(),
        )
    }
}

/// Calls `entry` with the bytes of each entry of a table in turn (read in
/// batches), until it returns `false` (the terminating entry).
fn each_entry(
    memory: &mut dyn Memory,
    layout: &EntryLayout,
    table: &'static str,
    mut entry: impl FnMut(&mut dyn Memory, &[u8]) -> Result<bool, HotSpotError>,
) -> Result<(), TableError> {
    const BATCH: usize = 64;
    let stride = layout.stride as usize;
    let mut batch = vec![0; stride * BATCH];
    let mut index = 0;
    let failed = |source| TableError::Read { table, source };
    while index < MAX_ENTRIES {
        let address = layout.table.wrapping_add((index * stride) as u64);
        // A batch may run past the table's end into memory that is not
        // mapped: then read entry by entry.
        let filled = match read(memory, address, &mut batch) {
            Ok(()) => BATCH,
            Err(_) => {
                read(memory, address, &mut batch[..stride]).map_err(failed)?;
                1
            }
        };
        for chunk in batch[..filled * stride].chunks_exact(stride) {
            if !entry(memory, chunk).map_err(failed)? {
                return Ok(());
            }
            index += 1;
        }
    }
    Err(TableError::TooLong { table })
}
