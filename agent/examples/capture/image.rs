//! A captured process as the unwinder sees it, whether over its real
//! objects (while it runs) or over their extracts (read back from the
//! fixture files): executable mappings, objects by path, the JIT perf map.
//! Frames are named the way the replaying tests name them: one function
//! per frame from the symbol tables (no inline frames), demangled without
//! parameters.

use std::{collections::HashMap, sync::Arc};

use agent_elf::{self as elf, Bytes, ElfLayout, SymbolTable};
use agent_fixtures::capture::{ExecMapping, SampleLine};
use agent_unwind::{Mapped, ObjectLookup, Sample, Unwinder, Unwound};
use anyhow::{Context, Result};

/// The CFI budget of the unwinder: everything stays cached.
const CFI_CACHE_BYTES: usize = 256 << 20;

pub struct Object {
    pub bytes: Bytes,
    pub layout: ElfLayout,
    pub symbols: SymbolTable,
}

impl Object {
    /// `data`, named by the symbols of `data` and `debug` (its separate
    /// debug file) together.
    pub fn new(data: Vec<u8>, debug: Option<Vec<u8>>) -> Result<Self> {
        let bytes = Bytes::new(Arc::new(data));
        let layout = elf::read_layout(&bytes)?;
        let mut inputs = vec![bytes.clone()];
        inputs.extend(debug.map(|debug| Bytes::new(Arc::new(debug))));
        let symbols = elf::read_symbols_from(&inputs)?;
        Ok(Self {
            bytes,
            layout,
            symbols,
        })
    }
}

/// An owned JIT perf map entry.
#[derive(Clone, Debug)]
pub struct JitSymbol {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

/// The entries of a JIT perf map text.
pub fn jit_symbols(text: &str) -> Result<Vec<JitSymbol>> {
    Ok(agent_fixtures::capture::parse_perf_map(text)?
        .into_iter()
        .map(|entry| JitSymbol {
            start: entry.start,
            size: entry.size,
            name: entry.name.to_owned(),
        })
        .collect())
}

impl JitSymbol {
    pub fn contains(&self, address: u64) -> bool {
        address >= self.start && address - self.start < self.size
    }
}

pub struct Image {
    pub mappings: Vec<ExecMapping>,
    /// By the path they are mapped from.
    pub objects: HashMap<String, Object>,
    pub perf_map: Vec<JitSymbol>,
}

/// Where an address is.
pub enum Place<'a> {
    Unmapped,
    /// Anonymous code (JIT output).
    Anonymous,
    /// A mapped file firn has no object for.
    NoObject {
        path: &'a str,
    },
    Object {
        path: &'a str,
        object: &'a Object,
        vaddr: u64,
    },
}

impl Image {
    pub fn place(&self, address: u64) -> Place<'_> {
        let Some(mapping) = self.mappings.iter().find(|m| m.contains(address)) else {
            return Place::Unmapped;
        };
        if mapping.path.is_empty() {
            return Place::Anonymous;
        }
        let path = mapping.path.as_str();
        let found = self.objects.get(path).and_then(|object| {
            let vaddr = object
                .layout
                .vaddr_for_file_offset(mapping.file_offset(address))?;
            Some(Place::Object {
                path,
                object,
                vaddr,
            })
        });
        found.unwrap_or(Place::NoObject { path })
    }

    /// The function of the frame at `depth` (0: the interrupted
    /// instruction, else a return address, looked up one byte back so a
    /// call at a function's very end is named after its caller).
    pub fn frame_name(&self, depth: usize, address: u64) -> String {
        let lookup = if depth == 0 {
            address
        } else {
            address.wrapping_sub(1)
        };
        match self.place(lookup) {
            Place::Unmapped => "[unmapped]".to_owned(),
            Place::Anonymous => self
                .perf_map
                .iter()
                .rev()
                .find(|symbol| symbol.contains(lookup))
                .map_or_else(|| "[unknown JIT code]".to_owned(), |s| s.name.clone()),
            Place::NoObject { path } => format!("[unknown in {}]", file_name(path)),
            Place::Object {
                path,
                object,
                vaddr,
            } => object.symbols.lookup(vaddr).map_or_else(
                || format!("[unknown in {}]", file_name(path)),
                |hit| demangle(hit.name),
            ),
        }
    }

    /// A sample unwound as the agent unwinds a DWARF-mode process: the
    /// unwind over the stack copy, continued by the kernel's walk where it
    /// stops short and the two meet.
    pub fn unwind(&mut self, sample: &SampleLine, stack: &[u8]) -> Unwound {
        let mut unwinder = Unwinder::new(CFI_CACHE_BYTES);
        let sample = Sample {
            regs: agent_common::UserRegs {
                ip: sample.ip,
                sp: sample.sp,
                bp: sample.bp,
            },
            stack,
            walk: &sample.walk,
        };
        unwinder.dwarf(sample, self)
    }

    /// Frames by name, innermost first.
    pub fn frame_names(&self, frames: &[u64]) -> Vec<String> {
        frames
            .iter()
            .enumerate()
            .map(|(depth, &address)| self.frame_name(depth, address))
            .collect()
    }
}

impl ObjectLookup for Image {
    type Key = String;

    fn object(&mut self, address: u64) -> Mapped<String> {
        match self.place(address) {
            Place::Unmapped => Mapped::Unmapped,
            Place::Anonymous | Place::NoObject { .. } => Mapped::NoObject,
            Place::Object { path, vaddr, .. } => Mapped::Object {
                key: path.to_owned(),
                vaddr,
                system: false,
            },
        }
    }

    fn bytes(&mut self, address: u64) -> Option<Bytes> {
        match self.place(address) {
            Place::Object { object, .. } => Some(object.bytes.clone()),
            _ => None,
        }
    }
}

pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Rust and C++ names demangled, without hashes, parameters or return
/// types; others as they are.
pub fn demangle(name: &str) -> String {
    if let Ok(demangled) = rustc_demangle::try_demangle(name) {
        return format!("{demangled:#}");
    }
    if name.starts_with("_Z") {
        let options = cpp_demangle::DemangleOptions::new()
            .no_params()
            .no_return_type();
        let demangled = cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|symbol| symbol.demangle_with_options(&options).ok());
        if let Some(demangled) = demangled {
            return demangled;
        }
    }
    name.to_owned()
}

/// Checks a replay of the fixture files against what the capture saw.
pub fn check_same(what: &str, seen: &[Vec<String>], replayed: &[Vec<String>]) -> Result<()> {
    for (index, (seen, replayed)) in seen.iter().zip(replayed).enumerate() {
        anyhow::ensure!(
            seen == replayed,
            "{what}: sample {index} unwinds differently over the extracts:\n\
             live:     {seen:?}\nreplayed: {replayed:?}"
        );
    }
    anyhow::ensure!(seen.len() == replayed.len(), "{what}: sample counts differ");
    Ok(())
}

/// An object's extract or file, for error messages.
pub fn read(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("could not read {}", path.display()))
}
