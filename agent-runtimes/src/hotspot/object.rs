//! Is a mapped object HotSpot's `libjvm.so`, and where are its tables.

use object::{Object, ObjectSymbol};

/// The table symbols of a `libjvm.so`, at link-time addresses (add the
/// object's load bias). Each holds, once the JVM initialized it, a value
/// (a pointer to a table, or an offset or stride of its entries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JvmObject {
    pub(crate) symbols: Vec<(&'static str, u64)>,
}

/// Every symbol firn reads: the four tables and how their entries are laid
/// out.
pub(crate) const SYMBOLS: &[&str] = &[
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMLongConstants",
    "gHotSpotVMLongConstantEntryArrayStride",
    "gHotSpotVMLongConstantEntryNameOffset",
    "gHotSpotVMLongConstantEntryValueOffset",
];

/// Why a `libjvm.so` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("could not parse libjvm.so as ELF")]
    Parse {
        #[source]
        source: ::object::Error,
    },
    #[error("libjvm.so has no symbol {name}")]
    MissingSymbol { name: &'static str },
}

impl JvmObject {
    /// The link-time address of `name` (one of [`SYMBOLS`]).
    pub(crate) fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols
            .iter()
            .find(|(symbol, _)| *symbol == name)
            .map(|(_, address)| *address)
    }

    /// Every symbol and its address.
    pub fn symbols(&self) -> &[(&'static str, u64)] {
        &self.symbols
    }

    /// The symbols as given, for objects read from elsewhere (fixtures).
    pub fn from_symbols(symbols: Vec<(&'static str, u64)>) -> Self {
        Self { symbols }
    }

    /// The same symbols moved by `bias` (the object's load bias): their
    /// run-time addresses.
    pub fn relocated(&self, bias: u64) -> JvmObject {
        JvmObject {
            symbols: self
                .symbols
                .iter()
                .map(|&(name, address)| (name, address.wrapping_add(bias)))
                .collect(),
        }
    }
}

/// Whether the object named `file_name` with the bytes `elf` is HotSpot:
/// `Ok(None)` if it is not `libjvm.so`, an error if it is one without the
/// tables (a JVM other than HotSpot, or one built without them).
pub fn inspect_object(file_name: &str, elf: &[u8]) -> Result<Option<JvmObject>, ObjectError> {
    let file_name = file_name.rsplit('/').next().unwrap_or(file_name);
    if file_name != "libjvm.so" {
        return Ok(None);
    }
    let file = ::object::File::parse(elf).map_err(|source| ObjectError::Parse { source })?;
    // One pass over the dynamic symbols (where the tables are exported),
    // the symbol table only for what they lack.
    let mut found: Vec<Option<u64>> = vec![None; SYMBOLS.len()];
    for symbols in [file.dynamic_symbols(), file.symbols()] {
        if found.iter().all(Option::is_some) {
            break;
        }
        for symbol in symbols {
            let Ok(name) = symbol.name() else { continue };
            if let Some(index) = SYMBOLS.iter().position(|&wanted| wanted == name)
                && symbol.is_definition()
            {
                found[index].get_or_insert(symbol.address());
            }
        }
    }
    let mut symbols = Vec::with_capacity(SYMBOLS.len());
    for (&name, address) in SYMBOLS.iter().zip(found) {
        symbols.push((name, address.ok_or(ObjectError::MissingSymbol { name })?));
    }
    Ok(Some(JvmObject { symbols }))
}
