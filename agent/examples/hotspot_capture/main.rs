//! Fixtures for the HotSpot unit tests from a live JVM (as root):
//!
//! ```text
//! cargo run -p firn --example hotspot_capture -- PID CLASS OUTPUT
//! ```
//!
//! reads the JVM's tables, layout and code cache, finds the compiled
//! methods of `CLASS`, names every scope of their debug information (and
//! the interpreter's blob), and stops the Java main thread with ptrace
//! until six stops in `CLASS.accumulate` were unwound through their Java
//! frames, reading the process only through a recorder. It writes `OUTPUT.mem.gz` (every byte range read, in
//! `agent_fixtures::memory` format) and `OUTPUT.txt` (the table symbols'
//! run-time addresses, the nmethods named, the stops' registers and
//! stacks), and prints what it named,
//! which the tests then expect of the same reads.

mod stacks;

use std::{fmt::Write as _, io::Write as _};

use agent_fixtures::memory::Regions;
use agent_runtimes::{
    Memory, MemoryError,
    hotspot::{BlobKind, CodeCache, Layout, MethodNamer, NmethodDebug, VmTables, inspect_object},
};
use anyhow::{Context, Result, bail};
use firn::runtimes::ProcessMemory;
use object::{Object, ObjectSegment};

/// Reads through to the process, keeping a copy of all it read.
struct Recorder {
    process: ProcessMemory,
    regions: Regions,
}

impl Memory for Recorder {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.process.read(address, buf)?;
        self.regions.add(address, buf);
        Ok(())
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, pid, class, output] = args.as_slice() else {
        bail!("usage: hotspot_capture PID CLASS OUTPUT");
    };
    let pid: u32 = pid.parse().context("PID")?;
    let symbols = jvm_symbols(pid)?;
    let mut recorder = Recorder {
        process: ProcessMemory::new(pid),
        regions: Regions::default(),
    };
    let tables = VmTables::read(&mut recorder, &symbols)?;
    let layout = match Layout::new(&tables) {
        Ok(layout) => layout,
        Err(error) => {
            // What the tables hold, to see what a new JDK changed.
            std::fs::write(format!("{output}.tables.txt"), format!("{tables:#?}"))?;
            return Err(error).context(format!("the tables are in {output}.tables.txt"));
        }
    };
    let cache = CodeCache::read(&mut recorder, &layout)?;
    let mut major = [0u8; 4];
    recorder.read(layout.vm_major_version, &mut major)?;
    println!(
        "JDK {} tables: {:?} (fields, types, constants)",
        i32::from_le_bytes(major),
        tables.counts()
    );

    let chosen = nmethods_of(pid, &layout, class)?;
    let mut meta = String::new();
    for (name, address) in symbols_of(&symbols) {
        writeln!(meta, "symbol {name} {address:#x}")?;
    }
    let mut namer = MethodNamer::new();
    for pc in chosen {
        let blob = cache
            .find(&mut recorder, &layout, pc)?
            .context("blob gone")?;
        let (method, _) = namer.method(&mut recorder, &layout, blob.method)?;
        writeln!(meta, "nmethod {:#x}", blob.code.start)?;
        println!(
            "{} {:?} {} frame {} code {:#x}..{:#x}",
            method.function(),
            blob.kind,
            blob.name,
            blob.frame_size,
            blob.code.start,
            blob.code.end
        );
        let debug = NmethodDebug::read(&mut recorder, &layout, &blob)?;
        for offset in debug.pc_offsets().collect::<Vec<_>>() {
            let Ok(scopes) = debug.scopes_at(i64::from(offset), true) else {
                continue;
            };
            // The blob as a return address there finds it.
            let pc = blob.code.start.wrapping_add(offset as u64);
            cache.find(&mut recorder, &layout, pc)?;
            let mut line = format!("  +{offset:#x}:");
            for scope in scopes {
                let (method, _) = namer.method(&mut recorder, &layout, scope.method)?;
                write!(
                    line,
                    " {}{} bci {} line {};",
                    method.function(),
                    method.signature,
                    scope.bci,
                    method.line(scope.bci)
                )?;
            }
            println!("{line}");
        }
    }

    let interpreter = cache.interpreter_start();
    let found = cache.find(&mut recorder, &layout, interpreter)?;
    println!(
        "interpreter at {interpreter:#x}: {:?}",
        found.map(|blob| (blob.kind, blob.name))
    );

    // Stops of the main thread in the chain, with the part of their stack
    // copies the unwind read (in hex: the stops overlap in address).
    let leaf = format!("{class}.accumulate");
    let stops = stacks::sample(pid, &mut recorder, &cache, &layout, &leaf, 6)?;
    stacks::describe(&stops, &mut meta)?;
    write(output, &recorder.regions, &meta)?;
    Ok(())
}

/// Writes `OUTPUT.mem.gz` and `OUTPUT.txt`.
fn write(output: &str, regions: &Regions, meta: &str) -> Result<()> {
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(format!("{output}.mem.gz"))?,
        flate2::Compression::best(),
    );
    gz.write_all(&regions.to_bytes())?;
    gz.finish()?;
    std::fs::write(format!("{output}.txt"), meta)?;
    println!(
        "{} regions, {} bytes",
        regions.0.len(),
        regions.total_bytes()
    );
    Ok(())
}

/// The run-time addresses of the table symbols of the process's libjvm.
fn jvm_symbols(pid: u32) -> Result<agent_runtimes::hotspot::JvmObject> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let (start, path) =
        maps.lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let path = *fields.get(5)?;
                (path.ends_with("/libjvm.so") && u64::from_str_radix(fields[2], 16).ok()? == 0)
                    .then(|| {
                        let start = fields[0].split('-').next().unwrap_or_default();
                        (u64::from_str_radix(start, 16).ok(), path)
                    })
            })
            .context("no libjvm.so mapped")?;
    let start = start.context("maps")?;
    let elf = std::fs::read(format!("/proc/{pid}/root{path}"))?;
    let file = object::File::parse(elf.as_slice())?;
    let vaddr = file
        .segments()
        .find(|segment| segment.file_range().0 == 0)
        .map(|segment| segment.address())
        .context("no segment at offset 0")?;
    let bias = start.wrapping_sub(vaddr);
    Ok(inspect_object(path, &elf)?
        .context("not HotSpot")?
        .relocated(bias))
}

/// The code starts of the compiled methods of `class`, looked for
/// without the recorder.
fn nmethods_of(pid: u32, layout: &Layout, class: &str) -> Result<Vec<u64>> {
    // Which nmethods are the class's: looked for without the recorder.
    let mut plain = ProcessMemory::new(pid);
    // A code cache of its own: what it remembers must not spare the
    // recorded one a read.
    let cache = &CodeCache::read(&mut plain, layout)?;
    let mut namer = MethodNamer::new();
    let mut chosen = Vec::new();
    for blob in cache.blobs(&mut plain, layout)? {
        let found = match cache.find(&mut plain, layout, blob) {
            Ok(Some(found)) => found,
            Ok(None) => continue,
            Err(error) => {
                let mut header = [0u8; 0x70];
                plain.read(blob, &mut header)?;
                println!("skipped blob {blob:#x}: {error} {header:02x?}");
                continue;
            }
        };
        if !matches!(found.kind, BlobKind::Compiled { .. }) {
            continue;
        }
        if let Ok((method, _)) = namer.method(&mut plain, layout, found.method)
            && &*method.class == class
        {
            chosen.push(found.code.start);
        }
    }
    if chosen.is_empty() {
        bail!("no compiled method of {class}");
    }
    Ok(chosen)
}

fn symbols_of(symbols: &agent_runtimes::hotspot::JvmObject) -> Vec<(&'static str, u64)> {
    symbols.symbols().to_vec()
}
