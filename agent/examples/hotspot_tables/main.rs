//! Lists a live JVM's structure tables (as root), sorted, one entry a
//! line, to see what a JDK exports before firn relies on it:
//!
//! ```text
//! cargo run -p firn --example hotspot_tables -- PID [threads]
//! ```
//!
//! With `threads`, lists instead each Java thread's id and Java name as
//! firn reads them.

use agent_runtimes::hotspot::{
    Field, JvmObject, ObjectLayout, ThreadLayout, VmTables, inspect_object, java_threads,
};
use anyhow::{Context, Result, bail};
use firn::runtimes::ProcessMemory;
use object::{Object, ObjectSegment};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (pid, threads) = match args.as_slice() {
        [_, pid] => (pid, false),
        [_, pid, mode] if mode == "threads" => (pid, true),
        _ => bail!("usage: hotspot_tables PID [threads]"),
    };
    let pid: u32 = pid.parse().context("PID")?;
    let mut memory = ProcessMemory::new(pid);
    let tables = VmTables::read(&mut memory, &jvm_symbols(pid)?)?;
    if threads {
        let threads = ThreadLayout::new(&tables)?;
        let objects = ObjectLayout::read(&mut memory, &threads)?;
        println!("{objects:?}");
        for (tid, thread) in java_threads(&mut memory, &threads)? {
            match objects.thread_name(&mut memory, &threads, thread) {
                Ok(name) => println!("{tid} {name}"),
                Err(error) => println!("{tid} ({error})"),
            }
        }
        return Ok(());
    }
    let mut lines: Vec<String> = tables
        .each_field()
        .map(|(type_name, field, at, type_string)| {
            let type_string = type_string.unwrap_or("?");
            match at {
                Field::Offset(offset) => {
                    format!("field {type_name}::{field} {offset:#x} {type_string}")
                }
                Field::Static(address) => {
                    format!("static {type_name}::{field} {address:#x} {type_string}")
                }
            }
        })
        .chain(
            tables
                .each_type()
                .map(|(name, size)| format!("type {name} {size}")),
        )
        .chain(
            tables
                .each_constant()
                .map(|(name, value)| format!("constant {name} {value}")),
        )
        .collect();
    lines.sort();
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

/// The table symbols of `pid`'s `libjvm.so` at their run-time addresses.
fn jvm_symbols(pid: u32) -> Result<JvmObject> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let (start, path) = maps
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = *fields.get(5)?;
            let offset = u64::from_str_radix(fields.get(2)?, 16).ok()?;
            let start = fields[0].split('-').next()?;
            (path.ends_with("/libjvm.so") && offset == 0)
                .then(|| (u64::from_str_radix(start, 16).ok(), path))
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
    Ok(inspect_object(path, &elf)?
        .context("not HotSpot")?
        .relocated(start.wrapping_sub(vaddr)))
}
