//! Types shared by the BPF program (`agent-ebpf`) and the daemon (`agent`).
//!
//! Everything here is `#[repr(C)]` and plain data: the BPF side writes these
//! records into the ring buffer and maps, the daemon reads them back
//! byte-for-byte. Change a layout here and both sides change with it; the
//! committed BPF object must then be rebuilt (`cargo xtask build-ebpf`).
#![no_std]

/// Most frames `bpf_get_stack` returns per stack (the kernel's
/// `sysctl_perf_event_max_stack` default is 127).
pub const MAX_STACK_DEPTH: usize = 127;

/// Length of `task_struct::comm`.
pub const COMM_LEN: usize = 16;

/// Granularity of the user stack copy's size.
pub const STACK_COPY_CHUNK: usize = 512;

/// The user stack is read a page at a time: a read that crosses the end of
/// the stack mapping fails as a whole, mappings end on page boundaries, so
/// page-aligned reads keep everything up to the end with the fewest helper
/// calls.
pub const STACK_READ_BYTES: usize = 4096;

/// Upper bound of the user stack copy carried by one sample: the kernel's
/// 127 frames at half a KiB each. Processes get what their stacks need
/// (the daemon fits each one's size); this is how far that may grow.
pub const MAX_STACK_COPY: usize = 64 * 1024;

/// Set in a process's `UNWIND_COPY` value (beside the copy size, which
/// never reaches this bit): its user stack is unwound from the copy
/// alone, so the BPF program skips the kernel's frame-pointer walk of it.
pub const UNWIND_COPY_NO_WALK: u32 = 1 << 31;

/// Set in a process's `UNWIND_COPY` value: a thread of it with an entry
/// in `THREAD_STACKS` gets its copy up to where that says its stack ends,
/// if that is less than the process's size.
pub const UNWIND_COPY_BY_THREAD: u32 = 1 << 30;

/// The bits of an `UNWIND_COPY` value that hold the copy size.
pub const UNWIND_COPY_BYTES: u32 = !(UNWIND_COPY_NO_WALK | UNWIND_COPY_BY_THREAD);

/// Most threads with their stack's end in `THREAD_STACKS` (an LRU map).
pub const MAX_THREAD_STACKS: u32 = 16_384;

/// Most processes with their own stack copy size in `UNWIND_COPY`.
pub const MAX_UNWIND_PROCESSES: u32 = 16_384;

/// Most executables whose new processes get their stack copy from
/// `EXEC_PRESETS` at their exec (an LRU map).
pub const MAX_EXEC_PRESETS: u32 = 4096;

/// Most processes `EXCLUDED` holds (those relabeling drops).
pub const MAX_EXCLUDED_PROCESSES: u32 = 16_384;

/// Most PIDs the in-kernel PID filter holds.
pub const MAX_PID_FILTER: u32 = 1024;

/// Most interpreter frames one sample carries; deeper stacks keep their
/// innermost frames and are flagged [`sample_flags::INTERPRETER_TRUNCATED`].
pub const MAX_INTERPRETER_FRAMES: usize = 128;

/// Most interpreter processes the BPF walker knows at once.
pub const MAX_INTERPRETER_PROCESSES: u32 = 4096;

/// Most executables whose new processes the BPF program registers with
/// the walker at their exec (`INTERPRETER_EXECUTABLES`, an LRU map).
pub const MAX_INTERPRETER_EXECUTABLES: u32 = 256;

/// An executable file as the kernel knows it: the key of
/// `INTERPRETER_EXECUTABLES`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExecutableKey {
    pub inode: u64,
    /// The file system's device as the kernel keeps it (`MKDEV`: major <<
    /// 20 | minor), not the userspace encoding.
    pub dev: u32,
    pub reserved: u32,
}

/// Bytes of an interpreter frame the walker reads in one go: every field it
/// needs lies within them, for every supported layout.
pub const INTERPRETER_FRAME_READ: usize = 128;

/// Bytes of a code object the walker reads in one go: its type and the
/// stamp lie within them, for every supported layout.
pub const INTERPRETER_CODE_READ: usize = 128;

/// Most threads the off-CPU programs follow at once (threads of profiled
/// processes waiting in a system call right now); a thread that finds the
/// map full is not followed through that wait, and that is counted
/// ([`Counter::OffCpuMapFull`]).
pub const MAX_OFFCPU_THREADS: u32 = 65_536;

/// The log target of what the BPF programs say through `aya-log`: the
/// daemon shows those records when this target's debug level is on (e.g.
/// `--log-level info,firn::bpf=debug`) and keeps the programs silent
/// otherwise.
pub const LOG_TARGET: &str = "firn::bpf";

/// Names of the maps and programs in the BPF object.
pub mod names {
    pub const EVENTS: &str = "EVENTS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const PID_FILTER: &str = "PID_FILTER";
    pub const SCRATCH: &str = "SCRATCH";
    pub const CONFIG: &str = "CONFIG";
    pub const UNWIND_COPY: &str = "UNWIND_COPY";
    pub const THREAD_STACKS: &str = "THREAD_STACKS";
    pub const EXEC_PRESETS: &str = "EXEC_PRESETS";
    pub const EXCLUDED: &str = "EXCLUDED";
    pub const INTERPRETER_PROCESSES: &str = "INTERPRETER_PROCESSES";
    pub const INTERPRETER_EXECUTABLES: &str = "INTERPRETER_EXECUTABLES";
    pub const MAPS_WANTED: &str = "MAPS_WANTED";
    pub const MAPS_COUNTERS: &str = "MAPS_COUNTERS";
    pub const MAPS_CONFIG: &str = "MAPS_CONFIG";
    pub const PROG_EXIT_MAPS: &str = "process_exit_maps";
    pub const PROG_FORK_MAPS: &str = "process_fork_maps";
    pub const PROG_SAMPLE: &str = "sample_cpu";
    pub const PROG_EXEC: &str = "process_exec";
    pub const PROG_EXIT: &str = "process_exit";
    pub const PROG_FORK: &str = "follow_fork";
    /// The walker programs, by [`super::InterpreterKind`].
    pub const PROG_WALKERS: [&str; super::InterpreterKind::COUNT as usize] =
        ["python_walk", "ruby_walk"];
    pub const TAIL_CALLS: &str = "TAIL_CALLS";
    pub const OFFCPU_THREADS: &str = "OFFCPU_THREADS";
    pub const OFFCPU_SCRATCH: &str = "OFFCPU_SCRATCH";
    pub const OFFCPU_KSTACKS: &str = "OFFCPU_KSTACKS";
    pub const OFFCPU_TAIL_CALLS: &str = "OFFCPU_TAIL_CALLS";
    pub const PROG_OFFCPU_SWITCH: &str = "offcpu_switch";
    pub const PROG_OFFCPU_WAKEUP: &str = "offcpu_wakeup";
    pub const PROG_OFFCPU_SYSCALL_EXIT: &str = "offcpu_syscall_exit";
    pub const PROG_OFFCPU_WALKERS: [&str; super::InterpreterKind::COUNT as usize] =
        ["offcpu_python_walk", "offcpu_ruby_walk"];
}

/// The `TAIL_CALLS` program arrays: each interpreter's walker (at its
/// [`InterpreterKind`]) walks the interpreter stack of a sample, then
/// writes the sample.
pub mod tail_calls {
    pub const COUNT: u32 = super::InterpreterKind::COUNT;
}

/// First field of every ring buffer record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Sample = 1,
    Exec = 2,
    Exit = 3,
    /// A [`SampleRecord`] of a thread whose system call returns after
    /// waiting, with [`SampleRecord::off_cpu`] filled in.
    OffCpu = 4,
    /// A [`MappingRecord`]: one executable mapping of a process, captured
    /// as its leader exits, before its [`RecordKind::Exit`].
    Mapping = 5,
}

impl RecordKind {
    pub fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::Sample),
            2 => Some(Self::Exec),
            3 => Some(Self::Exit),
            4 => Some(Self::OffCpu),
            5 => Some(Self::Mapping),
            _ => None,
        }
    }
}

/// Bits of [`SampleRecord::flags`].
pub mod sample_flags {
    /// `bpf_get_stack` failed for the kernel stack.
    pub const KERNEL_STACK_FAILED: u32 = 1 << 0;
    /// `bpf_get_stack` failed for the user stack.
    pub const USER_STACK_FAILED: u32 = 1 << 1;
    /// `user_regs` holds the task's user registers.
    pub const USER_REGS_VALID: u32 = 1 << 2;
    /// The sample interrupted user mode (otherwise kernel mode).
    pub const USER_MODE: u32 = 1 << 3;
    /// The interpreter's stack was deeper than [`super::MAX_INTERPRETER_FRAMES`]:
    /// the outermost frames are missing.
    pub const INTERPRETER_TRUNCATED: u32 = 1 << 4;
    /// A read of the interpreter's frame chain failed part way: the frames
    /// recorded are the innermost ones.
    pub const INTERPRETER_READ_FAILED: u32 = 1 << 5;
    /// The kernel's walk of the user stack was skipped: the process is
    /// unwound from the stack copy alone ([`super::UNWIND_COPY_NO_WALK`]).
    /// Its one user frame is the interrupted instruction, `user_regs.ip`.
    pub const USER_WALK_SKIPPED: u32 = 1 << 6;
}

/// Bits of [`InterpreterFrame::flags`].
pub mod interpreter_frame_flags {
    /// The outermost interpreter frame run by one call of the native
    /// interpreter loop (`_PyEval_EvalFrameDefault`): the frames from the
    /// previous entry (or the innermost) up to this one replace one native
    /// interpreter frame.
    pub const ENTRY: u32 = 1 << 0;
}

/// The x86_64 user registers a DWARF unwinder starts from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One CPU sample, sized to what was taken: the record is followed in the
/// ring buffer by `kernel_frames` then `user_frames` addresses (u64,
/// innermost first), then `stack_copy_len` bytes copied from the user
/// stack from `user_regs.sp` on, then `interpreter_frames`
/// [`InterpreterFrame`]s (innermost first).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SampleRecord {
    /// [`RecordKind::Sample`].
    pub kind: u32,
    pub cpu: u32,
    pub tgid: u32,
    pub tid: u32,
    /// `bpf_ktime_get_ns`, CLOCK_MONOTONIC.
    pub timestamp_ns: u64,
    pub cgroup_id: u64,
    /// The thread's name.
    pub comm: [u8; COMM_LEN],
    /// [`sample_flags`].
    pub flags: u32,
    pub kernel_frames: u32,
    pub user_frames: u32,
    pub stack_copy_len: u32,
    /// Interpreter frames at the end of the record, innermost first.
    pub interpreter_frames: u32,
    pub reserved: u32,
    pub user_regs: UserRegs,
    /// The wait an off-CPU sample stands for (zero in CPU samples).
    pub off_cpu: OffCpuInfo,
}

/// What an off-CPU sample ([`RecordKind::OffCpu`]) says about the wait.
///
/// Each wait of length `d` is kept as `floor(d / T)` periods of the
/// sampling period `T` (`BpfConfig::off_cpu_period_ns`), plus one more
/// with probability `(d mod T) / T`: the expected `periods * T` is `d`
/// exactly, a wait shorter than `T` is kept with probability `d / T`, and
/// a thread waiting a second yields at most `1 s / T` samples however
/// often it switches. The waits of one system call add up into one
/// sample.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuInfo {
    /// Periods of `T` this sample stands for (at least one).
    pub periods: u64,
    /// How long the thread was off the CPU in the waits kept,
    /// nanoseconds.
    pub blocked_ns: u64,
    /// The task state it last left the CPU in (`prev_state` of
    /// `sched_switch`: 1 interruptible sleep, 2 uninterruptible, ...).
    pub state: u32,
    /// The system call it waited in (`orig_ax` of its saved user
    /// registers).
    pub syscall: i32,
}

/// Room for both stacks' addresses in one sample.
pub const STACKS_BYTES: usize = 2 * MAX_STACK_DEPTH * core::mem::size_of::<u64>();

/// What identifies one interpreter frame at sample time; the daemon names
/// it later from the process's memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterpreterFrame {
    /// The code object's address.
    pub code: u64,
    /// Eight bytes of the code object (at [`PythonLayout::code_stamp`]) as
    /// they were when sampled: the daemon trusts what it reads at `code`
    /// (or remembers of it) only while they still match, so a freed code
    /// object whose address was reused is not named after the old one.
    pub stamp: u64,
    /// Where in the code the frame was: the raw instruction field
    /// ([`PythonInstruction`] says what it holds).
    pub instruction: u64,
    /// [`interpreter_frame_flags`].
    pub flags: u32,
    /// What else the runtime's walker keeps of the frame: zero for
    /// CPython; for CRuby the low half of the frame's environment flags
    /// (its frame type and `VM_FRAME_FLAG_*` bits).
    pub data: u32,
}

/// What a frame's instruction field holds, per interpreter version.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonInstruction {
    /// A 32-bit index (`f_lasti`, CPython 3.8-3.10).
    Index = 0,
    /// A pointer into the code object's bytecode (`prev_instr` of 3.11 and
    /// 3.12, `instr_ptr` of 3.13).
    Pointer = 1,
}

/// How the walker finds where one native interpreter loop call's frames
/// end (see [`interpreter_frame_flags::ENTRY`]).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonEntry {
    /// Every frame is its own call of the loop (CPython 3.8-3.10).
    EveryFrame = 0,
    /// A byte at [`PythonLayout::frame_entry`] is non-zero on the entry
    /// frame (`is_entry`, 3.11).
    Flag = 1,
    /// The loop pushes a shim frame whose owner byte at
    /// [`PythonLayout::frame_entry`] is `FRAME_OWNED_BY_CSTACK` (3): the
    /// frame before it is the entry, the shim itself is skipped (3.12+).
    Shim = 2,
}

/// Value of the owner byte of a CPython shim frame (`FRAME_OWNED_BY_CSTACK`).
pub const PYTHON_OWNER_CSTACK: u8 = 3;

/// Offset "not present" in an interpreter layout.
pub const NO_OFFSET: u16 = u16::MAX;

/// What the BPF walker needs to read one CPython process's frames: the
/// Python part of its [`InterpreterProcess`]. Offsets are in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonLayout {
    /// Address of the interpreter's `Py_tss_t autoTSSkey` in the process
    /// (`{ int _is_initialized; pthread_key_t _key; }`).
    pub tss_key_address: u64,
    /// Address of `PyCode_Type` in the process: a frame whose code object
    /// has another type is not a frame (the chain was read while the
    /// interpreter was changing it), and the walk stops there.
    pub code_type: u64,
    /// Offset from the thread pointer of glibc's first-level thread
    /// specific data array (`struct pthread::specific_1stblock`); entry
    /// `key` holds its value at `+ key * 16 + 8`.
    pub tsd_first_block: u32,
    /// `PY_VERSION_HEX >> 16` (e.g. `0x030b`), for the logs.
    pub version: u16,
    /// `PyThreadState`: the frame (3.8-3.10 `frame`, 3.13 `current_frame`)
    /// or the `cframe` pointer (3.11, 3.12).
    pub thread_frame: u16,
    /// `_PyCFrame::current_frame` when `thread_frame` points to a cframe,
    /// else [`NO_OFFSET`].
    pub cframe_current_frame: u16,
    /// The frame's code object (`f_code`, 3.13 `f_executable`).
    pub frame_code: u16,
    /// The calling frame (`f_back`, `previous`).
    pub frame_previous: u16,
    /// The instruction field ([`Self::instruction`] says which kind).
    pub frame_instruction: u16,
    /// The entry flag or owner byte, per [`Self::entry`].
    pub frame_entry: u16,
    /// Offset of the eight bytes of a code object copied into
    /// [`InterpreterFrame::stamp`].
    pub code_stamp: u16,
    /// [`PythonInstruction`] as u8.
    pub instruction: u8,
    /// [`PythonEntry`] as u8.
    pub entry: u8,
    pub reserved: [u8; 2],
}

/// What the BPF walker needs to read one CRuby process's control frames:
/// the Ruby part of its [`InterpreterProcess`]. Offsets are in bytes.
///
/// The walker takes the execution context of the thread holding the VM
/// lock (`ruby_single_main_ractor->threads.running_ec`, or the global
/// `ruby_current_execution_context_ptr` of Ruby 2.x) and walks it only
/// when that context's thread is the sampled one (its native thread id,
/// glibc's `pthread_t`, is the sampled thread's thread pointer): a sample
/// never carries another thread's frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RubyLayout {
    /// Address of the global pointer the running execution context is
    /// found through.
    pub context_global: u64,
    /// `RUBY_API_VERSION_MAJOR << 8 | MINOR`, for the logs.
    pub version: u16,
    /// Offset of the running context's pointer in what `context_global`
    /// points to (`rb_ractor_t.threads.running_ec`), or [`NO_OFFSET`]
    /// when it points to the context itself.
    pub running_context: u16,
    /// `rb_execution_context_t`: `vm_stack`, `vm_stack_size` (in words),
    /// `cfp`, `thread_ptr`.
    pub context_stack: u16,
    pub context_stack_size: u16,
    pub context_frame: u16,
    pub context_thread: u16,
    /// Offset of the native thread (`struct rb_native_thread *nt`, Ruby
    /// 3.3+) in `rb_thread_t`, or [`NO_OFFSET`] when its id is in the
    /// thread itself.
    pub thread_native: u16,
    /// Offset of the native thread id (`pthread_t`) in `rb_thread_t`, or
    /// in the native thread when [`Self::thread_native`] is set.
    pub native_thread_id: u16,
    /// `rb_control_frame_t`: its size and its `pc`, `iseq` and `ep`.
    pub frame_size: u16,
    pub frame_pc: u16,
    pub frame_iseq: u16,
    pub frame_ep: u16,
}

/// Values of [`InterpreterProcess::kind`], and the indexes of the walker
/// programs in the `TAIL_CALLS` program arrays.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InterpreterKind {
    Python = 0,
    Ruby = 1,
}

impl InterpreterKind {
    pub const COUNT: u32 = 2;
}

/// One interpreter's layout, by [`InterpreterProcess::kind`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union InterpreterLayout {
    pub python: PythonLayout,
    pub ruby: RubyLayout,
}

/// What the BPF walkers need of one interpreter process, written by the
/// daemon per tgid into `INTERPRETER_PROCESSES`: which interpreter, and
/// its layout. The sampler hands the sample over to that kind's walker.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct InterpreterProcess {
    /// [`InterpreterKind`] as u32.
    pub kind: u32,
    /// Offset of the user thread pointer (`thread.fsbase` on x86-64) in
    /// the kernel's `task_struct`, from the kernel's BTF.
    pub task_thread_pointer: u32,
    /// Until when (the low 32 bits of `bpf_ktime_get_ns` in milliseconds,
    /// compared with wrapping) a sample carrying this process's frames
    /// wakes the reader at once: a process that just started may be gone
    /// by the next timed drain, and its frames can only be named from its
    /// memory. 0: never.
    pub wake_until_ms: u32,
    pub reserved: u32,
    pub layout: InterpreterLayout,
}

impl InterpreterProcess {
    pub fn python(task_thread_pointer: u32, wake_until_ms: u32, python: PythonLayout) -> Self {
        // Zeroed first: the union's bytes past the Python layout are
        // written to the map as they are.
        let mut process = Self::zeroed(InterpreterKind::Python, task_thread_pointer, wake_until_ms);
        process.layout.python = python;
        process
    }

    pub fn ruby(task_thread_pointer: u32, wake_until_ms: u32, ruby: RubyLayout) -> Self {
        let mut process = Self::zeroed(InterpreterKind::Ruby, task_thread_pointer, wake_until_ms);
        process.layout.ruby = ruby;
        process
    }

    fn zeroed(kind: InterpreterKind, task_thread_pointer: u32, wake_until_ms: u32) -> Self {
        Self {
            kind: kind as u32,
            task_thread_pointer,
            wake_until_ms,
            reserved: 0,
            layout: InterpreterLayout {
                python: PythonLayout {
                    tss_key_address: 0,
                    code_type: 0,
                    tsd_first_block: 0,
                    version: 0,
                    thread_frame: 0,
                    cframe_current_frame: 0,
                    frame_code: 0,
                    frame_previous: 0,
                    frame_instruction: 0,
                    frame_entry: 0,
                    code_stamp: 0,
                    instruction: 0,
                    entry: 0,
                    reserved: [0; 2],
                },
            },
        }
    }

    /// The Python layout, if this is a Python process.
    pub fn as_python(&self) -> Option<PythonLayout> {
        // SAFETY: the union holds the Python layout when the kind says so;
        // both layouts are plain integers, valid for any bytes.
        match self.kind == InterpreterKind::Python as u32 {
            true => Some(unsafe { self.layout.python }),
            false => None,
        }
    }

    /// The Ruby layout, if this is a Ruby process.
    pub fn as_ruby(&self) -> Option<RubyLayout> {
        // SAFETY: as `as_python`.
        match self.kind == InterpreterKind::Ruby as u32 {
            true => Some(unsafe { self.layout.ruby }),
            false => None,
        }
    }
}

impl core::fmt::Debug for InterpreterProcess {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut out = f.debug_struct("InterpreterProcess");
        out.field("kind", &self.kind)
            .field("task_thread_pointer", &self.task_thread_pointer)
            .field("wake_until_ms", &self.wake_until_ms);
        if let Some(python) = self.as_python() {
            out.field("python", &python);
        }
        if let Some(ruby) = self.as_ruby() {
            out.field("ruby", &ruby);
        }
        out.finish()
    }
}

/// A process event (exec or exit of a whole process).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessRecord {
    /// [`RecordKind::Exec`] or [`RecordKind::Exit`].
    pub kind: u32,
    pub tgid: u32,
    pub timestamp_ns: u64,
    pub comm: [u8; COMM_LEN],
    /// An exec's new executable (zeros when the kernel's offsets are not
    /// known, and in exit events): what firn keys per-executable choices
    /// by without reading the process's maps.
    pub executable: ExecutableKey,
}

/// Scratch space where a sample is assembled before it is copied into the
/// ring buffer with its exact length, one per CPU (an array map indexed by
/// CPU number: a per-CPU map's values are limited to 32 KiB, less than a
/// deep stack's copy).
#[repr(C)]
pub struct SampleScratch {
    pub record: SampleRecord,
    /// What follows the record, packed: the kernel's and the user's
    /// frames, the stack copy and the interpreter frames.
    pub tail: [u8; STACKS_BYTES + MAX_STACK_COPY + INTERPRETER_BYTES],
    /// Where the walker reads one interpreter frame before picking its
    /// fields.
    pub frame: [u64; INTERPRETER_FRAME_READ / 8],
    /// Where the walker reads the start of a frame's code object (its
    /// type and stamp).
    pub code: [u64; INTERPRETER_CODE_READ / 8],
    /// The interpreter walk's progress. Kept in the map, not on the BPF
    /// stack: the verifier tracks no map contents, so each step of the
    /// unrolled walk is checked once, not once per count of frames so far;
    /// and the walk goes on across the walker's tail calls.
    pub walk: InterpreterWalk,
    /// The user stack copy's progress, kept in the map for the same
    /// reason: each chunk of the copy loop is checked once, whichever way
    /// the sample got there.
    pub copy: StackCopy,
}

/// See [`SampleScratch::copy`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackCopy {
    /// Where in `SampleScratch::tail` the copy goes: after the stacks.
    pub base: u32,
    /// Bytes asked for.
    pub wanted: u32,
    /// The user stack pointer, where the copy starts.
    pub sp: u64,
    /// Bytes copied so far.
    pub copied: u64,
}

/// See [`SampleScratch::walk`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InterpreterWalk {
    /// The process's layout, copied from the map once per walk.
    pub layout: InterpreterProcess,
    /// The next frame to look at; zero at the end of the chain.
    pub frame: u64,
    /// Where the frames end (CRuby: the end of the VM stack, where its
    /// control frames start from); zero when a null link ends them.
    pub end: u64,
    /// Frames recorded so far.
    pub recorded: u32,
    /// `sample_flags` to add to the record.
    pub flags: u32,
    /// Where in `SampleScratch::tail` the frames go: after the stacks and
    /// the stack copy.
    pub base: u32,
    /// Steps taken so far, shims included.
    pub steps: u32,
    /// Non-zero once the walker program found the first frame (its first
    /// run does, not the sampler).
    pub started: u32,
    pub reserved: u32,
}

/// Room for the interpreter frames of one sample.
pub const INTERPRETER_BYTES: usize =
    MAX_INTERPRETER_FRAMES * core::mem::size_of::<InterpreterFrame>();

/// Indexes of the per-CPU `COUNTERS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Times the perf event program ran.
    SamplesSeen = 0,
    /// Samples written to the ring buffer.
    SamplesWritten = 1,
    /// Samples lost because the ring buffer was full.
    SamplesLostRingFull = 2,
    /// Samples of the idle task, not recorded.
    IdleSkipped = 3,
    /// Samples of processes outside the PID filter.
    Filtered = 4,
    /// `bpf_get_stack` failures on the kernel stack.
    KernelStackFailed = 5,
    /// `bpf_get_stack` failures on the user stack.
    UserStackFailed = 6,
    /// Reading the task's saved user registers failed.
    UserRegsFailed = 7,
    /// The stack copy stopped short of what was asked (end of the mapping
    /// or an unmapped page).
    StackCopyShort = 8,
    /// Exec/exit events lost because the ring buffer was full.
    ProcessEventsLost = 9,
    /// The scratch buffer was unavailable (cannot happen on a sane kernel).
    ScratchUnavailable = 10,
    /// A new image could not get the full stack copy: `UNWIND_COPY` full.
    UnwindCopyMapFull = 11,
    /// Samples of a known interpreter process whose interpreter stack was
    /// walked (whether or not the thread ran interpreted code).
    InterpreterWalks = 12,
    /// Interpreter frames recorded.
    InterpreterFrames = 13,
    /// Interpreter stacks cut at `MAX_INTERPRETER_FRAMES`.
    InterpreterTruncated = 14,
    /// Interpreter walks that failed on a read (thread state, frame or
    /// code object).
    InterpreterReadFailed = 15,
    /// Samples of an interpreter process whose thread had no interpreter
    /// state (a native thread, or one before the interpreter started).
    InterpreterNoThreadState = 16,
    /// A process started by a filtered one could not be followed:
    /// `PID_FILTER` full.
    PidFilterFull = 17,
    /// Samples not recorded because the only stack left on (user or
    /// kernel, see `BpfConfig::stacks_off`) was empty.
    NoStackLeft = 18,
    /// Samples of an interpreter process whose interpreter stack was not
    /// walked: the walker program could not be called (not expected).
    InterpreterWalkerUnavailable = 19,
    /// Threads of profiled processes that left the CPU waiting (not
    /// preempted) and whose switch-out time was stored.
    OffCpuWaits = 20,
    /// Waits not kept: shorter than the period and not drawn.
    OffCpuNotKept = 21,
    /// Waits not followed: `OFFCPU_THREADS` was full.
    OffCpuMapFull = 22,
    /// Off-CPU samples written to the ring buffer.
    OffCpuWritten = 23,
    /// Off-CPU samples lost because the ring buffer was full.
    OffCpuLostRingFull = 24,
    /// Waits of profiled threads outside any system call (a page fault),
    /// not followed: no return of theirs is seen in the thread's context.
    OffCpuOutsideSyscall = 25,
    /// Kept waits not written: the system call that returned was not the
    /// one that waited (its stack would not be the wait's).
    OffCpuStale = 26,
    /// Samples of processes in `EXCLUDED` (relabeling drops them), not
    /// recorded.
    Excluded = 27,
    /// New images whose executable was in `EXEC_PRESETS`: given their
    /// stack copy at exec, without waking the daemon.
    ExecPresetsApplied = 28,
    /// The `Interpreter*` counters above are CPython's; these are CRuby's
    /// ([`Counter::of_kind`]).
    RubyWalks = 29,
    RubyFrames = 30,
    RubyTruncated = 31,
    RubyReadFailed = 32,
    RubyNoThreadState = 33,
    RubyWalkerUnavailable = 34,
    /// Samples of a Ruby process whose thread was not running Ruby code:
    /// another thread held the VM lock (the GVL), so the running execution
    /// context was not this thread's.
    RubyOtherThread = 35,
}

impl Counter {
    pub const COUNT: u32 = 36;

    /// The counter of an interpreter walk's event for interpreters of
    /// `kind`: the `Interpreter*` counters are CPython's, each has a CRuby
    /// twin. Other counters are their own.
    #[inline(always)]
    pub fn of_kind(self, kind: u32) -> Self {
        if kind != InterpreterKind::Ruby as u32 {
            return self;
        }
        match self {
            Self::InterpreterWalks => Self::RubyWalks,
            Self::InterpreterFrames => Self::RubyFrames,
            Self::InterpreterTruncated => Self::RubyTruncated,
            Self::InterpreterReadFailed => Self::RubyReadFailed,
            Self::InterpreterNoThreadState => Self::RubyNoThreadState,
            Self::InterpreterWalkerUnavailable => Self::RubyWalkerUnavailable,
            other => other,
        }
    }
    pub const ALL: [Counter; Self::COUNT as usize] = [
        Self::SamplesSeen,
        Self::SamplesWritten,
        Self::SamplesLostRingFull,
        Self::IdleSkipped,
        Self::Filtered,
        Self::KernelStackFailed,
        Self::UserStackFailed,
        Self::UserRegsFailed,
        Self::StackCopyShort,
        Self::ProcessEventsLost,
        Self::ScratchUnavailable,
        Self::UnwindCopyMapFull,
        Self::InterpreterWalks,
        Self::InterpreterFrames,
        Self::InterpreterTruncated,
        Self::InterpreterReadFailed,
        Self::InterpreterNoThreadState,
        Self::PidFilterFull,
        Self::NoStackLeft,
        Self::InterpreterWalkerUnavailable,
        Self::OffCpuWaits,
        Self::OffCpuNotKept,
        Self::OffCpuMapFull,
        Self::OffCpuWritten,
        Self::OffCpuLostRingFull,
        Self::OffCpuOutsideSyscall,
        Self::OffCpuStale,
        Self::Excluded,
        Self::ExecPresetsApplied,
        Self::RubyWalks,
        Self::RubyFrames,
        Self::RubyTruncated,
        Self::RubyReadFailed,
        Self::RubyNoThreadState,
        Self::RubyWalkerUnavailable,
        Self::RubyOtherThread,
    ];
}

/// Settings the daemon writes into the BPF object's read-only data before
/// loading it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpfConfig {
    /// Non-zero: only processes whose tgid is in `PID_FILTER` are sampled.
    pub filter_pids: u32,
    /// Bytes of user stack to copy per sample for processes without an
    /// entry in `UNWIND_COPY`, a multiple of [`STACK_COPY_CHUNK`], at most
    /// [`MAX_STACK_COPY`].
    pub stack_copy_bytes: u32,
    /// Non-zero: a process that executes a new image gets this copy size in
    /// `UNWIND_COPY` until the daemon has looked at the image and decided.
    pub exec_copy_bytes: u32,
    /// Stacks not walked at all ([`stacks_off`] bits): what is off costs
    /// nothing in the kernel.
    pub stacks_off: u32,
    /// Byte offset of `tgid` in the kernel's `task_struct`, from its BTF:
    /// where `follow_fork` reads a new process's id. Zero: unknown, and no
    /// child is followed.
    pub task_tgid_offset: u32,
    /// Byte offset of `pid` (the thread id) in `task_struct`: where the
    /// off-CPU program reads the id of the task woken. Zero: unknown, and
    /// no wait is kept.
    pub task_pid_offset: u32,
    /// Wake the reader once this many bytes are waiting in the ring buffer;
    /// below that the daemon drains on its own timer.
    pub wakeup_bytes: u64,
    /// Off-CPU sampling period `T` in nanoseconds (see [`OffCpuInfo`]);
    /// zero when off-CPU profiling is off.
    pub off_cpu_period_ns: u64,
}

impl BpfConfig {
    pub const DEFAULT: Self = Self {
        filter_pids: 0,
        stack_copy_bytes: 0,
        exec_copy_bytes: 0,
        stacks_off: 0,
        task_tgid_offset: 0,
        task_pid_offset: 0,
        wakeup_bytes: 0,
        off_cpu_period_ns: 0,
    };
}

/// Bits of [`BpfConfig::stacks_off`].
pub mod stacks_off {
    /// No kernel stack walk.
    pub const KERNEL: u32 = 1;
    /// No user stack walk, stack copy or interpreter walk.
    pub const USER: u32 = 2;
}

pub mod maps;
pub use maps::{MAPPING_PATH_BYTES, MappingRecord, MapsConfig, MapsCounter, mapping_flags};

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `#[repr(C)]` integers, no padding, valid for any bytes.
    unsafe impl aya::Pod for super::MapsConfig {}
    // SAFETY: plain `#[repr(C)]` integers, no padding, valid for any bytes.
    unsafe impl aya::Pod for super::BpfConfig {}
    // SAFETY: plain `#[repr(C)]` integers, no padding, valid for any bytes.
    unsafe impl aya::Pod for super::InterpreterProcess {}
    // SAFETY: plain `#[repr(C)]` integers, no padding, valid for any bytes.
    unsafe impl aya::Pod for super::ExecutableKey {}
}

// Layout checks: the daemon decodes records by these sizes.
const _: () = assert!(core::mem::size_of::<ExecutableKey>() == 16);
const _: () = assert!(core::mem::size_of::<UserRegs>() == 24);
const _: () = assert!(core::mem::size_of::<OffCpuInfo>() == 24);
const _: () = assert!(core::mem::size_of::<SampleRecord>() == 120);
const _: () = assert!(core::mem::size_of::<InterpreterFrame>() == 32);
const _: () = assert!(core::mem::size_of::<PythonLayout>() == 40);
const _: () = assert!(core::mem::size_of::<RubyLayout>() == 32);
const _: () = assert!(core::mem::size_of::<InterpreterProcess>() == 56);
const _: () = assert!(core::mem::size_of::<ProcessRecord>() == 48);
const _: () = assert!(core::mem::size_of::<BpfConfig>() == 40);
const _: () = assert!(MAX_STACK_COPY.is_multiple_of(STACK_COPY_CHUNK));
const _: () = assert!(MAX_STACK_COPY >= 16 * 1024 + STACK_READ_BYTES);
// `--stack-copy-bytes`'s help and the README give this bound (64 KiB).
const _: () = assert!(MAX_STACK_COPY == 65_536);
