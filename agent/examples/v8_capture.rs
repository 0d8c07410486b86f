//! Fixtures for the V8 unit tests from a live Node.js process (as root):
//!
//! ```text
//! cargo run -p firn --example v8_capture -- PID [OUTPUT]
//! ```
//!
//! reads the post-mortem constants of `/proc/PID/exe`, stops the process
//! (ptrace) for the moment it takes to read its registers and walk its main
//! thread's frame pointers, and names the function slot of every frame
//! (name, file, line, tier), reading the process only through a recorder.
//! With OUTPUT it writes `OUTPUT.mem.gz` (every byte range read, in
//! `agent_fixtures::memory` format) and `OUTPUT.txt` (the registers the
//! walk started from, and where the process has V8's builtins); it
//! prints what it named, which the tests then expect of the same reads.
//!
//! ```text
//! cargo run -p firn --example v8_capture -- PID --samples N
//! ```
//!
//! stops the process N times, 10 ms apart, names each stop's frames the
//! same way and prints how many stops had JavaScript frames named and the
//! most frequent stacks (innermost first): a measure of the namer on a
//! live process, apart from the BPF program.

use std::{fmt::Write as _, io::Write as _};

use agent_fixtures::memory::Regions;
use agent_runtimes::{
    Memory, MemoryError,
    v8::{ChainFrame, FileMapping, Layout, V8Namer, V8Object, inspect_object},
};
use anyhow::{Context, Result, bail};
use firn::runtimes::ProcessMemory;

/// Frames walked at most.
const MAX_FRAMES: usize = agent_runtimes::v8::MAX_FRAMES;

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

struct Registers {
    rip: u64,
    rbp: u64,
    rsp: u64,
}

/// Stops `pid`, runs `while_stopped` with its registers, lets it go.
fn stopped<T>(pid: u32, while_stopped: impl FnOnce(&Registers) -> Result<T>) -> Result<T> {
    let pid = pid as libc::pid_t;
    // SAFETY: plain ptrace requests on a process id; the registers are
    // written into a struct we own.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) != 0 {
            bail!("PTRACE_SEIZE: {}", std::io::Error::last_os_error());
        }
        libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0);
        let mut status = 0;
        libc::waitpid(pid, &mut status, libc::__WALL);
        let mut regs: libc::user_regs_struct = std::mem::zeroed();
        let got = libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut regs as *mut _);
        let result = if got == 0 {
            while_stopped(&Registers {
                rip: regs.rip,
                rbp: regs.rbp,
                rsp: regs.rsp,
            })
        } else {
            Err(anyhow::anyhow!(
                "PTRACE_GETREGS: {}",
                std::io::Error::last_os_error()
            ))
        };
        libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
        result
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (pid, output) = match args.as_slice() {
        [_, pid] => (pid, None),
        [_, pid, flag, count] if flag == "--samples" => {
            return sample(pid.parse().context("PID")?, count.parse().context("N")?);
        }
        [_, pid, output] => (pid, Some(output.clone())),
        _ => bail!("usage: v8_capture PID [OUTPUT | --samples N]"),
    };
    let pid: u32 = pid.parse().context("PID")?;
    let exe = std::fs::read(format!("/proc/{pid}/exe")).context("reading the executable")?;
    let object = inspect_object(&exe)?.context("no v8dbg_ constants")?;
    let constants = object.constants.clone();
    println!(
        "{} constants ({} skipped), builtins {:x?}",
        constants.len(),
        constants.skipped,
        object.builtins
    );
    let layout = Layout::new(&constants)?;
    let builtins = builtins_in_process(pid, &object)?;
    let mut recorder = Recorder {
        process: ProcessMemory::new(pid),
        regions: Regions::default(),
    };
    let mut namer = V8Namer::new(layout);
    let mut meta = String::new();
    stopped(pid, |regs| {
        writeln!(
            meta,
            "registers {:#x} {:#x} {:#x}",
            regs.rip, regs.rbp, regs.rsp
        )?;
        for range in &builtins {
            writeln!(meta, "builtins {:#x} {:#x}", range.start, range.end)?;
        }
        let mut pc = regs.rip;
        let mut fp = regs.rbp;
        for index in 0..MAX_FRAMES {
            if fp == 0 {
                break;
            }
            print_frame(&mut recorder, &mut namer, &builtins, index, pc, fp);
            let mut next = [0; 16];
            if recorder.read(fp, &mut next).is_err() {
                break;
            }
            let caller_fp = u64::from_le_bytes(next[..8].try_into()?);
            pc = u64::from_le_bytes(next[8..].try_into()?);
            if caller_fp <= fp {
                break;
            }
            fp = caller_fp;
        }
        Ok(())
    })?;
    if let Some(output) = output {
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(format!("{output}.mem.gz"))?,
            flate2::Compression::best(),
        );
        gz.write_all(&recorder.regions.to_bytes())?;
        gz.finish()?;
        std::fs::write(format!("{output}.txt"), meta)?;
        println!(
            "{} bytes in {} regions",
            recorder.regions.total_bytes(),
            recorder.regions.0.len()
        );
    }
    Ok(())
}

/// Where the process runs the embedded builtins: the executable's
/// mappings read from `/proc/PID/maps`.
fn builtins_in_process(pid: u32, object: &V8Object) -> Result<Vec<std::ops::Range<u64>>> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    let exe = exe.to_string_lossy();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mappings: Vec<FileMapping> = maps
        .lines()
        .filter(|line| line.ends_with(&*exe))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let offset = fields.nth(1)?;
            let hex = |text: &str| u64::from_str_radix(text, 16).ok();
            Some(FileMapping {
                addresses: hex(start)?..hex(end)?,
                offset: hex(offset)?,
            })
        })
        .collect();
    Ok(object.builtins_in_process(&mappings))
}

/// Names one frame and prints it.
fn print_frame(
    recorder: &mut Recorder,
    namer: &mut V8Namer,
    builtins: &[std::ops::Range<u64>],
    index: usize,
    pc: u64,
    fp: u64,
) {
    let layout = *namer.layout();
    let frame = read_frame(recorder, &layout, pc, fp);
    let named = frame
        .function
        .map(|function| namer.name(recorder, function));
    match named {
        Some(Ok(named)) => {
            let tier = namer
                .tier(recorder, &frame, builtins)
                .map_or("?", |tier| tier.as_str());
            println!(
                "{index:3} pc {pc:#x} fp {fp:#x} {} {}{} [{tier}]",
                named.name,
                named.file,
                named
                    .position
                    .map(|at| format!(":{}:{}", at.line, at.column))
                    .unwrap_or_default()
            );
        }
        Some(Err(error)) => {
            println!("{index:3} pc {pc:#x} fp {fp:#x} ({})", error.reason())
        }
        None => println!("{index:3} pc {pc:#x} fp {fp:#x} slot unreadable"),
    }
}

/// A frame's slots, read through `memory` (so a capture holds them).
fn read_frame(memory: &mut dyn Memory, layout: &Layout, pc: u64, fp: u64) -> ChainFrame {
    let mut slot = |offset: i64| {
        let mut word = [0; 8];
        memory
            .read(fp.wrapping_add_signed(offset), &mut word)
            .ok()
            .map(|()| u64::from_le_bytes(word))
    };
    ChainFrame {
        pc,
        fp,
        function: slot(layout.frame.function),
        bytecode: [
            slot(layout.frame.bytecode_array),
            slot(layout.frame.bytecode_offset),
        ],
    }
}

/// The JavaScript frames of one stop, innermost first, and how many
/// frames the chain had.
fn named_stack(
    memory: &mut dyn Memory,
    namer: &mut V8Namer,
    regs: &Registers,
) -> (Vec<String>, usize) {
    let layout = *namer.layout();
    let mut names = Vec::new();
    let mut fp = regs.rbp;
    let mut frames = 0;
    while fp != 0 && frames < MAX_FRAMES {
        frames += 1;
        let frame = read_frame(memory, &layout, 0, fp);
        if let Some(function) = frame.function
            && let Ok(named) = namer.name(memory, function)
        {
            let file = named.file.rsplit('/').next().unwrap_or_default().to_owned();
            let line = named
                .position
                .map(|at| format!(":{}", at.line))
                .unwrap_or_default();
            let tier = namer
                .tier(memory, &frame, &[])
                .map_or("?", |tier| tier.as_str());
            names.push(format!("{}@{file}{line}/{tier}", named.name));
        }
        let mut word = [0; 8];
        if memory.read(fp, &mut word).is_err() {
            break;
        }
        let caller = u64::from_le_bytes(word);
        if caller <= fp {
            break;
        }
        fp = caller;
    }
    (names, frames)
}

fn sample(pid: u32, count: usize) -> Result<()> {
    let exe = std::fs::read(format!("/proc/{pid}/exe")).context("reading the executable")?;
    let constants = inspect_object(&exe)?
        .context("no v8dbg_ constants")?
        .constants;
    let mut namer = V8Namer::new(Layout::new(&constants)?);
    let mut memory = ProcessMemory::new(pid);
    let mut stacks: std::collections::HashMap<Vec<String>, usize> = Default::default();
    let mut with_js = 0;
    for _ in 0..count {
        let (names, _) = stopped(pid, |regs| Ok(named_stack(&mut memory, &mut namer, regs)))?;
        with_js += usize::from(!names.is_empty());
        *stacks.entry(names).or_default() += 1;
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    println!("{with_js} of {count} stops with JavaScript frames named");
    let mut stacks: Vec<_> = stacks.into_iter().collect();
    stacks.sort_by_key(|(_, seen)| std::cmp::Reverse(*seen));
    for (names, seen) in stacks.iter().take(8) {
        let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
        println!("{seen:5} {}", shown.join(" < "));
    }
    Ok(())
}
