//! How an object's functions are named where its DWARF does not name them:
//! a Go binary by its own `.gopclntab` (names, files and lines, stripped or
//! not, found by a binary search where the file is mapped), anything else
//! by its ELF symbol tables, read and sorted once.

use std::sync::OnceLock;

use agent_elf::{Bytes, SymbolTable, gopclntab::GoTable};
use tracing::debug;

/// A function covering an address, with the file and line there when the
/// table knows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FunctionName {
    pub name: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

pub(crate) struct FunctionNames {
    /// A Go binary's table and the object's bytes it is read from.
    go: Option<(GoTable, Bytes)>,
    /// The ELF symbols: read at once without a Go table; in a Go binary
    /// only when an address lies outside every Go function (C code linked
    /// in with cgo).
    symbols: OnceLock<SymbolTable>,
}

impl FunctionNames {
    /// The Go table of `bytes`, if the object is a Go binary firn reads.
    pub fn go(bytes: &Bytes) -> Option<Self> {
        let file = object::File::parse(&bytes[..]).ok()?;
        let table = GoTable::find(&file, &bytes[..])?;
        Some(Self {
            go: Some((table, bytes.clone())),
            symbols: OnceLock::new(),
        })
    }

    pub fn symbols(table: SymbolTable) -> Self {
        Self {
            go: None,
            symbols: OnceLock::from(table),
        }
    }

    pub fn lookup(&self, vaddr: u64) -> Option<FunctionName> {
        if let Some((table, bytes)) = &self.go
            && let Some(function) = table.function(&bytes[..], vaddr)
        {
            return Some(FunctionName {
                name: function.name.to_owned(),
                file: function.file.map(str::to_owned),
                line: function.line,
            });
        }
        let symbols = self.symbols.get_or_init(|| match &self.go {
            Some((_, bytes)) => {
                let table = agent_elf::read_symbols(bytes).unwrap_or_else(|error| {
                    debug!(%error, "no symbols beside the Go table");
                    SymbolTable::default()
                });
                bytes.release_pages();
                table
            }
            None => SymbolTable::default(),
        });
        symbols.lookup(vaddr).map(|hit| FunctionName {
            name: hit.name.to_owned(),
            file: None,
            line: None,
        })
    }

    /// Approximate heap bytes, for cache accounting (the Go table lies in
    /// the mapped file).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.symbols.get().map_or(0, SymbolTable::heap_bytes)
    }

    /// Lets the kernel drop the file pages lookups have touched.
    pub fn release_pages(&self) {
        if let Some((_, bytes)) = &self.go {
            bytes.release_pages();
        }
        if let Some(symbols) = self.symbols.get() {
            symbols.release_pages();
        }
    }
}
