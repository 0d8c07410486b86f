//! Fixtures for the V8 unit tests from a live Node.js process (as root):
//!
//! ```text
//! cargo run -p firn --example v8_capture -- PID [OUTPUT]
//! ```
//!
//! reads the post-mortem constants of `/proc/PID/exe`, stops the process
//! (ptrace) for the moment it takes to read its registers and walk its main
//! thread's frame pointers, and names the function slot of every frame,
//! reading the process only through a recorder. With OUTPUT it writes
//! `OUTPUT.mem.gz` (every byte range read, in `agent_fixtures::memory`
//! format) and `OUTPUT.txt` (the registers the walk started from); it
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
    v8::{Layout, V8Namer, inspect_object},
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
    let constants = object.constants;
    println!(
        "{} constants ({} skipped), builtins {:x?}",
        constants.len(),
        constants.skipped,
        object.builtins
    );
    let layout = Layout::new(&constants)?;
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
        let mut pc = regs.rip;
        let mut fp = regs.rbp;
        for index in 0..MAX_FRAMES {
            if fp == 0 {
                break;
            }
            let slot = fp.wrapping_add_signed(layout.frame.function);
            let mut word = [0; 8];
            let function = recorder
                .read(slot, &mut word)
                .map(|()| u64::from_le_bytes(word));
            match function.map(|function| namer.name(&mut recorder, function)) {
                Ok(Ok(named)) => println!(
                    "{index:3} pc {pc:#x} fp {fp:#x} {} {}",
                    named.name, named.file
                ),
                Ok(Err(error)) => println!("{index:3} pc {pc:#x} fp {fp:#x} ({})", error.reason()),
                Err(error) => println!("{index:3} pc {pc:#x} fp {fp:#x} slot unreadable: {error}"),
            }
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
        let mut word = [0; 8];
        if memory
            .read(fp.wrapping_add_signed(layout.frame.function), &mut word)
            .is_ok()
            && let Ok(named) = namer.name(memory, u64::from_le_bytes(word))
        {
            let file = named.file.rsplit('/').next().unwrap_or_default().to_owned();
            names.push(format!("{}@{file}", named.name));
        }
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
