//! firn's BPF programs.
//!
//! `sample_cpu` runs on every tick of the software `cpu-clock` perf event,
//! one event per online CPU. It records who was running (tgid, tid, comm,
//! cgroup), the kernel and user stacks (frame-pointer walks done by the
//! kernel), the user registers and a copy of the top of the user stack, so
//! the daemon can repair or replace the frame-pointer walk with CFI. How
//! much stack is copied is decided per process: `UNWIND_COPY` (written by
//! the daemon) holds the size for processes unwound with DWARF; everyone
//! else gets the small default the leaf repair needs.
//!
//! For interpreter processes the daemon has registered in
//! `INTERPRETER_PROCESSES`, it also records the sampled thread's
//! interpreter frames, in the walker program of the interpreter's kind
//! (`interpreter`; `python`, `ruby`).
//!
//! `process_exec` / `process_exit` tell the daemon when a process image
//! changes or goes away, in the same ring buffer and therefore in order with
//! the samples. They also keep `UNWIND_COPY` and `INTERPRETER_PROCESSES` in step:
//! a fresh image gets the full copy until the daemon has decided and loses
//! its interpreter layout, an exited process loses both entries.
//!
//! Where a read, a walk or a write fails, the program bumps a counter and
//! says why through `aya-log` at debug level under the daemon's `firn::bpf`
//! log target (`failed!`). The daemon leaves `AYA_LOG_LEVEL` at zero unless
//! that target's debug level is on; the verifier then sees the logging
//! branches as dead, so by default no record is built or sent.
#![no_std]
#![no_main]
// The exit walk's kfunc calls are raw instructions (see `maps`).
#![feature(asm_experimental_arch)]

/// Says why something failed, at debug level under the daemon's log
/// target. Only ever on a failure path: the success path of a sample must
/// not pay for it even when debug logging is on. Defined before the
/// modules, which see a `macro_rules!` only after its definition.
macro_rules! failed {
    ($ctx:expr, $($message:tt)+) => {
        aya_log_ebpf::debug!($ctx, target: LOG_TARGET, $($message)+)
    };
}

mod interpreter;
mod maps;
mod offcpu;
mod process;
mod python;
mod ruby;
mod sample;
mod user;

use agent_common::{
    BpfConfig, Counter, ExecutableKey, MAX_EXCLUDED_PROCESSES, MAX_EXEC_PRESETS, MAX_PID_FILTER,
    MAX_THREAD_STACKS, MAX_UNWIND_PROCESSES, SampleScratch, tail_calls,
};
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};

/// Written by the daemon before load (`EbpfLoader::override_global`).
// SAFETY: the loader finds the variable by this name, and no other symbol
// in the object has it, so nothing clashes.
#[unsafe(no_mangle)]
static CONFIG: BpfConfig = BpfConfig::DEFAULT;

/// Samples and process events. The daemon sets the real size at load time.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// One sample's scratch space per CPU, by CPU number; the daemon sizes it
/// to the possible CPUs. Not a per-CPU map: their values are limited to
/// 32 KiB, less than a deep stack's copy.
#[map]
static SCRATCH: Array<SampleScratch> = Array::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// tgids to sample when `CONFIG.filter_pids` is set. `follow_fork` adds
/// the processes they start; `process_exit` removes every process that ends.
#[map]
static PID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PID_FILTER, 0);

/// tgids whose samples are not recorded: processes the daemon found
/// relabeling drops. Cleared by their exec (a new image is judged anew)
/// and their exit.
#[map]
static EXCLUDED: HashMap<u32, u8> = HashMap::with_max_entries(MAX_EXCLUDED_PROCESSES, 0);

/// Stack copy size per tgid, for processes that differ from
/// `CONFIG.stack_copy_bytes` (those unwound with DWARF).
#[map]
static UNWIND_COPY: HashMap<u32, u32> = HashMap::with_max_entries(MAX_UNWIND_PROCESSES, 0);

/// The `UNWIND_COPY` value a new process of an executable gets at its exec,
/// by the executable's device and inode, for executables whose processes
/// need nothing of the daemon before their first sample: written by the
/// daemon once one of their processes was decided. Such an exec does not
/// wake the daemon at once.
#[map]
static EXEC_PRESETS: LruHashMap<ExecutableKey, u32> =
    LruHashMap::with_max_entries(MAX_EXEC_PRESETS, 0);

/// Where the stack of a thread ends (the highest address its unwinds
/// read, with a margin), by tid, for threads of processes flagged
/// `UNWIND_COPY_BY_THREAD`: the daemon learns it from the thread's
/// complete unwinds, so a thread with shallow stacks is not copied as far
/// as its process's deepest thread needs.
#[map]
static THREAD_STACKS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_THREAD_STACKS, 0);

/// The programs `sample_cpu` hands a sample over to (`tail_calls`); the
/// daemon fills it after loading them.
#[map]
static TAIL_CALLS: ProgramArray = ProgramArray::with_max_entries(tail_calls::COUNT, 0);

#[inline(always)]
fn config() -> BpfConfig {
    // The loader rewrites the read-only data; a plain read would be
    // constant-folded to the compile-time default.
    // SAFETY: a reference to a static is valid and aligned, and `BpfConfig`
    // is plain integers, valid for whatever bytes the loader wrote.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

#[inline(always)]
fn count(counter: Counter) {
    count_by(counter, 1);
}

#[inline(always)]
fn count_by(counter: Counter, by: u64) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the lookup returned this CPU's slot of the array, valid
        // while the program runs. The only other writer at the same time
        // is the sampler interrupting a tracepoint program on this CPU;
        // that can lose one count, never tear the u64 or touch other memory.
        unsafe { *value += by };
    }
}

#[inline(always)]
fn wanted(config: &BpfConfig, tgid: u32) -> bool {
    // SAFETY: `get` is unsafe because the daemon may rewrite the value under
    // the reference; only the entry's presence is used, never the value.
    config.filter_pids == 0 || unsafe { PID_FILTER.get(&tgid) }.is_some()
}

/// Wake the reader only once enough has accumulated; it also drains on a
/// timer, so a quiet ring never waits long.
#[inline(always)]
fn wakeup_flag(config: &BpfConfig) -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= config.wakeup_bytes {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY: the kernel reads the program's license from this section, and it
// holds nothing but the NUL-terminated string; no other symbol is named
// LICENSE.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
