//! Stacks of the JVM's Java main thread, as a sample would see them: the
//! thread stopped with ptrace at whatever it ran, its registers and the
//! stack from its sp, then let go. Only stops in Java code whose unwind
//! reaches `Class.accumulate` are kept, and only the part of the stack
//! the unwind read.

use std::time::Duration;

use agent_runtimes::{
    Memory,
    hotspot::{CodeCache, FrameRegs, JavaNamer, Layout, step},
};
use anyhow::{Context, Result, bail};
use firn::runtimes::ProcessMemory;

/// Bytes of stack copied at a stop (what the BPF program copies at most).
const STACK_BYTES: usize = 64 << 10;

/// One stop of the thread: its registers and stack copy.
pub struct Stop {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack: Vec<u8>,
}

/// The Java main thread of `pid`: named `java`, not the launcher's.
pub fn main_thread(pid: u32) -> Result<u32> {
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let tid: u32 = entry?.file_name().to_string_lossy().parse()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))?;
        if tid != pid && comm.trim() == "java" {
            return Ok(tid);
        }
    }
    bail!("no Java main thread in {pid}")
}

/// Stops `tid` once and copies its registers and stack.
fn stop(pid: u32, tid: u32) -> Result<Stop> {
    let tid = tid as libc::pid_t;
    // SAFETY: ptrace and waitpid on a thread of a process we may trace
    // (root); the registers are written into a struct we own.
    let regs = unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
            bail!("PTRACE_SEIZE: {}", std::io::Error::last_os_error());
        }
        libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
        let mut status = 0;
        libc::waitpid(tid, &mut status, libc::__WALL);
        let mut regs: libc::user_regs_struct = std::mem::zeroed();
        let got = libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _);
        if got != 0 {
            libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
            bail!("PTRACE_GETREGS failed");
        }
        regs
    };
    // The stack as it is while the thread is stopped.
    let mut memory = ProcessMemory::new(pid);
    let mut stack = Vec::new();
    let mut page = vec![0u8; 4096];
    while stack.len() < STACK_BYTES {
        if memory
            .read(regs.rsp + stack.len() as u64, &mut page)
            .is_err()
        {
            break;
        }
        stack.extend_from_slice(&page);
    }
    // SAFETY: the thread seized above.
    unsafe {
        libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
    }
    Ok(Stop {
        ip: regs.rip,
        sp: regs.rsp,
        bp: regs.rbp,
        stack,
    })
}

/// Java frames of `stop` by name, unwound over its copy; the bytes of the
/// copy it read end at the returned length.
pub fn unwind(
    memory: &mut dyn Memory,
    cache: &CodeCache,
    layout: &Layout,
    stop: &Stop,
) -> Result<(Vec<String>, usize)> {
    let word = |address: u64| {
        let offset = usize::try_from(address.checked_sub(stop.sp)?).ok()?;
        let bytes = stop.stack.get(offset..offset + 8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    };
    let mut namer = JavaNamer::new();
    let mut regs = FrameRegs {
        ip: stop.ip,
        sp: stop.sp,
        bp: Some(stop.bp),
    };
    let mut names = Vec::new();
    let mut used = 0;
    for depth in 0..32 {
        if !cache.contains(regs.ip) {
            break;
        }
        let lookup = if depth == 0 { regs.ip } else { regs.ip - 1 };
        let blob = cache.find(memory, layout, lookup)?.context("no blob")?;
        let step = step(cache, layout, &blob, regs, depth == 0, &word)?;
        for named in namer.name(memory, layout, cache, &step.frame)? {
            names.push(format!("{}:{}", named.method.function(), named.line));
        }
        if let agent_runtimes::hotspot::JavaFrame::Stub { name } = &step.frame {
            names.push(format!("[{name}]"));
        }
        used = used.max((step.caller.sp - stop.sp) as usize);
        regs = step.caller;
    }
    Ok((names, used.min(stop.stack.len())))
}

/// Up to `wanted` stops whose Java frames reach `leaf`.
pub fn sample(
    pid: u32,
    memory: &mut dyn Memory,
    cache: &CodeCache,
    layout: &Layout,
    leaf: &str,
    wanted: usize,
) -> Result<Vec<(Stop, Vec<String>)>> {
    let tid = main_thread(pid)?;
    // A code cache of its own for the first look: what it remembers must
    // not spare the recorded one a read.
    let plain_cache = CodeCache::read(&mut ProcessMemory::new(pid), layout)?;
    let mut kept = Vec::new();
    for _ in 0..400 {
        if kept.len() >= wanted {
            break;
        }
        std::thread::sleep(Duration::from_millis(37));
        let mut stop = stop(pid, tid)?;
        if !cache.contains(stop.ip) {
            continue;
        }
        // Unwound first without the recorder: a stop that does not reach
        // the chain leaves nothing in the fixture.
        let mut plain = ProcessMemory::new(pid);
        match unwind(&mut plain, &plain_cache, layout, &stop) {
            Ok((names, _)) if names.first().is_some_and(|name| name.starts_with(leaf)) => {}
            _ => continue,
        }
        let (names, used) = unwind(memory, cache, layout, &stop)?;
        stop.stack.truncate(used);
        kept.push((stop, names));
    }
    Ok(kept)
}

/// Prints the stops and adds a `stack 0xIP 0xSP 0xBP HEX` line of each
/// to `meta`.
pub fn describe(stops: &[(Stop, Vec<String>)], meta: &mut String) -> Result<()> {
    use std::fmt::Write as _;
    for (stop, names) in stops {
        println!("stop at {:#x}: {}", stop.ip, names.join(" <- "));
        let hex: String = stop
            .stack
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        writeln!(
            meta,
            "stack {:#x} {:#x} {:#x} {hex}",
            stop.ip, stop.sp, stop.bp
        )?;
    }
    Ok(())
}
