//! Fixtures for the CRuby unit tests from a live `ruby` process (as root):
//!
//! ```text
//! cargo run -p firn --example ruby_capture -- PID OUTPUT.json.gz
//! ```
//!
//! finds libruby (or a ruby with it linked in) in `/proc/PID/maps` and
//! inspects it as the agent does, stops the process (SIGSTOP) for the
//! moment it takes to walk its running thread's control frames exactly as
//! the BPF walker does (`ruby_single_main_ractor->threads.running_ec`, or
//! 2.7's `ruby_current_execution_context_ptr`, `cfp` up to the end of the
//! VM stack, each frame's environment and its
//! method's) and to name each frame, reading the process only through a
//! recorder, then lets it go (SIGCONT). It prints what it named and writes
//! OUTPUT: gzipped JSON of the version, the run-time addresses, the
//! frames as the walker would have recorded them (with what was named)
//! and every byte range read (`regions`, hex), which the tests of
//! `agent_runtimes::ruby` replay.

use std::{io::Write as _, time::Duration};

use agent_common::{INTERPRETER_FRAME_READ, InterpreterFrame, MAX_INTERPRETER_FRAMES, NO_OFFSET};
use agent_fixtures::memory::Regions;
use agent_runtimes::{
    Memory, MemoryError,
    ruby::{RubyNamer, RubyObject, RubyProcess, inspect_object, walker_layout},
};
use anyhow::{Context, Result, bail};
use firn::runtimes::ProcessMemory;
use object::{Object, ObjectSegment};
use serde_json::{Value, json};

/// `VM_ENV_FLAG_LOCAL`, `VM_FRAME_FLAG_FINISH`, and the environments
/// followed from a block's to its method's, as in the BPF walker.
const ENV_LOCAL: u64 = 0x2;
const FRAME_FINISH: u64 = 0x20;
const MAX_ENV_HOPS: usize = 3;
const MAX_STACK_WORDS: u64 = 1 << 24;

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

/// The interpreter object a process maps: its path and load bias.
struct Mapped {
    path: String,
    bias: u64,
    object: RubyObject,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, pid, output] = args.as_slice() else {
        bail!("usage: ruby_capture PID OUTPUT.json.gz");
    };
    let pid: u32 = pid.parse().context("PID")?;
    let mapped = find_interpreter(pid)?;
    let object = &mapped.object;
    println!(
        "{} (Ruby {}), load bias {:#x}: context global {:#x}, symbols {:#x}, vm_exec_core {:#x?}",
        mapped.path,
        object.version,
        mapped.bias,
        object.context_global,
        object.symbols,
        object.eval_loop
    );
    let process = RubyProcess {
        key: 1,
        version: object.version,
        symbols: object.symbols + mapped.bias,
    };
    let mut recorder = Recorder {
        process: ProcessMemory::new(pid),
        regions: Regions::default(),
    };
    let frames = stopped(pid, || {
        let frames = walk(&mut recorder, &mapped)?;
        let mut namer = RubyNamer::new(16 << 20);
        Ok(frames
            .into_iter()
            .map(|frame| {
                let named = match namer.name(&process, &mut recorder, &frame) {
                    Ok(Some(named)) => json!({
                        "function": &*named.function,
                        "file": &*named.file,
                        "line": named.line,
                    }),
                    Ok(None) => Value::Null,
                    Err(error) => json!({ "error": format!("{error:#}") }),
                };
                println!(
                    "{:#014x} pc {:#014x} stamp {:#014x} data {:#010x} flags {} {named}",
                    frame.code, frame.instruction, frame.stamp, frame.data, frame.flags
                );
                (frame, named)
            })
            .collect::<Vec<_>>())
    })?;
    write(output, &mapped, &process, &frames, &recorder.regions)?;
    println!(
        "{} frames, {} bytes in {} regions",
        frames.len(),
        recorder.regions.total_bytes(),
        recorder.regions.0.len()
    );
    Ok(())
}

/// Writes the capture: gzipped JSON, addresses and bytes in hex.
fn write(
    output: &str,
    mapped: &Mapped,
    process: &RubyProcess,
    frames: &[(InterpreterFrame, Value)],
    regions: &Regions,
) -> Result<()> {
    let hex = |value: u64| format!("{value:#x}");
    let object = &mapped.object;
    let eval_loop = &object.eval_loop;
    let capture = json!({
        "ruby": object.version.to_string(),
        "library": mapped.path,
        "load_bias": hex(mapped.bias),
        "context_global": hex(object.context_global + mapped.bias),
        "symbols": hex(process.symbols),
        "eval_loop": [hex(eval_loop.start + mapped.bias), hex(eval_loop.end + mapped.bias)],
        "frames": frames.iter().map(|(frame, named)| json!({
            "code": hex(frame.code),
            "stamp": hex(frame.stamp),
            "instruction": hex(frame.instruction),
            "flags": frame.flags,
            "data": hex(u64::from(frame.data)),
            "named": named,
        })).collect::<Vec<_>>(),
        "regions": regions.0.iter().map(|(address, bytes)| {
            let bytes: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
            json!([hex(*address), bytes])
        }).collect::<Vec<_>>(),
    });
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(output).with_context(|| format!("creating {output}"))?,
        flate2::Compression::best(),
    );
    gz.write_all(serde_json::to_string_pretty(&capture)?.as_bytes())?;
    gz.finish()?;
    Ok(())
}

/// The first mapped object of the process that is a CRuby interpreter.
fn find_interpreter(pid: u32) -> Result<Mapped> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut seen = std::collections::HashSet::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(offset), Some(path)) = (fields.next(), fields.nth(1), fields.nth(2))
        else {
            continue;
        };
        if !path.starts_with('/') || offset != "00000000" || !seen.insert(path.to_owned()) {
            continue;
        }
        // The mapping itself (as the agent opens it), then the path in
        // the process's root. A chrooted process's paths in `maps` are
        // as seen from this process's root, not its own: the second
        // would miss them.
        let opened = [
            format!("/proc/{pid}/map_files/{range}"),
            format!("/proc/{pid}/root{path}"),
        ]
        .iter()
        .find_map(|file| std::fs::read(file).ok());
        let Some(elf) = opened else {
            continue;
        };
        let Some(object) = inspect_object(path, &elf)? else {
            continue;
        };
        let start = u64::from_str_radix(range.split('-').next().unwrap_or_default(), 16)?;
        // The first load segment is mapped at the start of the file's
        // first mapping.
        let first_load = object::File::parse(&*elf)?
            .segments()
            .map(|segment| segment.address())
            .min()
            .unwrap_or(0);
        return Ok(Mapped {
            path: inside_root(pid, path),
            bias: start - (first_load & !0xfff),
            object,
        });
    }
    bail!("process {pid} maps no CRuby interpreter")
}

/// `path` (from `maps`, as this process sees it) as the process sees it:
/// without the directory it is chrooted to.
fn inside_root(pid: u32, path: &str) -> String {
    let root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_default();
    match path.strip_prefix(&*root.to_string_lossy()) {
        Some(inside) if root != std::path::Path::new("/") && inside.starts_with('/') => {
            inside.to_owned()
        }
        _ => path.to_owned(),
    }
}

/// Stops `pid` (SIGSTOP, waited for), runs `while_stopped`, lets it go.
fn stopped<T>(pid: u32, while_stopped: impl FnOnce() -> Result<T>) -> Result<T> {
    let pid = pid as libc::pid_t;
    // SAFETY: signals to a process id.
    if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
        bail!("SIGSTOP: {}", std::io::Error::last_os_error());
    }
    for _ in 0..100 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(") ")
            .next()
            .and_then(|rest| rest.chars().next());
        if state == Some('T') {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let result = while_stopped();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    result
}

fn read_u64(memory: &mut dyn Memory, address: u64) -> Result<u64> {
    let mut word = [0; 8];
    memory.read(address, &mut word)?;
    Ok(u64::from_le_bytes(word))
}

fn field(bytes: &[u8], offset: u16) -> u64 {
    let at = usize::from(offset);
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
}

/// The running thread's control frames, innermost first, as the BPF
/// walker records them (`agent-ebpf/src/ruby.rs`).
fn walk(memory: &mut dyn Memory, mapped: &Mapped) -> Result<Vec<InterpreterFrame>> {
    let layout = walker_layout(
        mapped.object.version,
        mapped.object.context_global + mapped.bias,
    )?;
    let global = read_u64(memory, layout.context_global)?;
    // 2.x: the global is the running context itself.
    let context = match layout.running_context {
        NO_OFFSET => global,
        offset => read_u64(memory, global + u64::from(offset))?,
    };
    if context == 0 {
        bail!("no running execution context");
    }
    let mut window = [0; INTERPRETER_FRAME_READ];
    memory.read(context, &mut window)?;
    let stack = field(&window, layout.context_stack);
    let words = field(&window, layout.context_stack_size);
    let mut frame = field(&window, layout.context_frame);
    let thread = field(&window, layout.context_thread);
    // 3.3+: the pthread_t is in the thread's native thread.
    let native = match layout.thread_native {
        NO_OFFSET => thread,
        offset => read_u64(memory, thread + u64::from(offset))?,
    };
    let thread_id = read_u64(memory, native + u64::from(layout.native_thread_id))?;
    println!("context {context:#x}, thread {thread:#x} (pthread {thread_id:#x})");
    if words > MAX_STACK_WORDS || frame < stack {
        bail!("a VM stack of {words} words at {stack:#x}, frame {frame:#x}");
    }
    let end = stack + words * 8;
    let size = u64::from(layout.frame_size);
    let mut frames = Vec::new();
    while frame != 0 && frame < end && frames.len() < MAX_INTERPRETER_FRAMES {
        let mut bytes = vec![0; usize::from(layout.frame_size)];
        memory.read(frame, &mut bytes)?;
        let pc = field(&bytes, layout.frame_pc);
        let iseq = field(&bytes, layout.frame_iseq);
        let ep = field(&bytes, layout.frame_ep);
        let mut env = read_env(memory, ep);
        let flags = env.map_or(0, |env| env[2]);
        for _ in 0..MAX_ENV_HOPS {
            match env {
                Some(words) if words[2] & ENV_LOCAL == 0 => env = read_env(memory, words[1] & !3),
                _ => break,
            }
        }
        let method = match env {
            Some(words) if words[2] & ENV_LOCAL != 0 => words[0],
            _ => 0,
        };
        frames.push(InterpreterFrame {
            code: iseq,
            stamp: method,
            instruction: pc,
            flags: u32::from(flags & FRAME_FINISH != 0)
                * agent_common::interpreter_frame_flags::ENTRY,
            data: flags as u32,
        });
        frame += size;
    }
    Ok(frames)
}

/// The three words before and at `ep`: method entry or cref, specval,
/// flags. `None` if unreadable (the walker then takes no flags and no
/// method entry).
fn read_env(memory: &mut dyn Memory, ep: u64) -> Option<[u64; 3]> {
    let mut bytes = [0; 24];
    if ep < 16 || memory.read(ep - 16, &mut bytes).is_err() {
        return None;
    }
    Some([field(&bytes, 0), field(&bytes, 8), field(&bytes, 16)])
}
