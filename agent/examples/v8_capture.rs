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

use std::{fmt::Write as _, io::Write as _};

use agent_fixtures::memory::Regions;
use agent_runtimes::{
    Memory, MemoryError,
    v8::{Layout, V8Namer, inspect_object},
};
use anyhow::{Context, Result, bail};
use firn::runtimes::ProcessMemory;

/// Frames walked at most.
const MAX_FRAMES: usize = 256;

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
        [_, pid, output] => (pid, Some(output.clone())),
        _ => bail!("usage: v8_capture PID [OUTPUT]"),
    };
    let pid: u32 = pid.parse().context("PID")?;
    let exe = std::fs::read(format!("/proc/{pid}/exe")).context("reading the executable")?;
    let constants = inspect_object(&exe)?.context("no v8dbg_ constants")?;
    println!(
        "{} constants ({} skipped)",
        constants.len(),
        constants.skipped
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
