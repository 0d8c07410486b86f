//! The records firn's BPF program writes to its ring buffer, decoded into
//! plain values. The layouts are `agent-common`'s; the contents (lengths,
//! frame counts, names) are whatever the kernel handed the program about
//! the sampled task, so a record is checked against its own claims before
//! anything in it is read. No I/O: the daemon drains the ring buffer and
//! hands each record here.

use std::{borrow::Cow, fmt, mem::size_of};

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;

use agent_common::{
    COMM_LEN, ExecutableKey, InterpreterFrame, MAPPING_PATH_BYTES, MAX_INTERPRETER_FRAMES,
    MAX_STACK_DEPTH, MappingRecord, OffCpuInfo, ProcessRecord, RecordKind, SampleRecord, UserRegs,
    mapping_flags, sample_flags,
};

/// A task's name as the kernel stores it (at most 15 bytes and a NUL).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Comm([u8; COMM_LEN]);

impl Comm {
    pub fn new(raw: [u8; COMM_LEN]) -> Self {
        Self(raw)
    }

    pub fn as_bytes(&self) -> &[u8] {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
        &self.0[..end]
    }
}

impl Comm {
    /// The name as text, borrowed unless it is not UTF-8 (the kernel
    /// takes whatever bytes a task names itself): no allocation for a
    /// sample's usual name.
    pub fn to_str(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_str())
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl From<&str> for Comm {
    fn from(text: &str) -> Self {
        let mut raw = [0u8; COMM_LEN];
        let len = text.len().min(COMM_LEN - 1);
        raw[..len].copy_from_slice(&text.as_bytes()[..len]);
        Self(raw)
    }
}

/// One CPU sample as the BPF program captured it. The stack copy (up to
/// 64 KiB) is borrowed from the ring buffer record, which stays reserved
/// until the sample is handled: it is unwound where the BPF program wrote
/// it, never copied out.
#[derive(Clone, Debug, Default)]
pub struct RawSample<'a> {
    /// CLOCK_MONOTONIC nanoseconds.
    pub timestamp_ns: u64,
    pub cpu: u32,
    pub tgid: u32,
    pub tid: u32,
    pub cgroup_id: u64,
    /// The thread's name.
    pub comm: Comm,
    /// Innermost first; the first frame is the interrupted instruction.
    pub kernel_stack: Vec<u64>,
    /// Innermost first, from the kernel's frame-pointer walk; only the
    /// interrupted instruction where the walk was skipped (a process
    /// unwound from the stack copy alone).
    pub user_stack: Vec<u64>,
    pub kernel_stack_failed: bool,
    pub user_stack_failed: bool,
    /// The user registers, when the task has a user side and they were read.
    pub user_regs: Option<UserRegs>,
    /// Bytes copied from the user stack, starting at `user_regs.sp`.
    pub stack_copy: &'a [u8],
    /// What identifies each interpreter frame the thread was running,
    /// innermost first (empty outside interpreter processes).
    pub interpreter: Vec<InterpreterFrame>,
    /// The interpreter's stack was deeper than the BPF bound.
    pub interpreter_truncated: bool,
    /// Set on an off-CPU sample: the wait it stands for. Its stacks are
    /// where the thread waited.
    pub off_cpu: Option<OffCpuInfo>,
}

impl RawSample<'_> {
    /// The task was in a process when sampled: it has user frames or user
    /// registers. A kernel thread's samples have neither, need no maps and
    /// no runtime looks at them.
    pub fn has_user_side(&self) -> bool {
        !self.user_stack.is_empty() || self.user_regs.is_some()
    }
}

/// A whole process executed a new image or exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub tgid: u32,
    pub timestamp_ns: u64,
    pub comm: Comm,
    /// An exec's executable, when the kernel told.
    pub executable: Option<ExecutableKey>,
}

/// One executable file mapping of a process whose leader was exiting,
/// captured by the kernel before its exit event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedMapping {
    pub tgid: u32,
    pub start: u64,
    pub end: u64,
    /// Offset in the file, in pages.
    pub page_offset: u64,
    pub inode: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// The path inside the process's mount namespace; `None` when the
    /// kernel's walk did not reach its root (the file is then found by
    /// device and inode alone).
    pub path: Option<String>,
    /// The file was deleted.
    pub deleted: bool,
}

#[derive(Clone, Debug)]
pub enum Record<'a> {
    Sample(RawSample<'a>),
    Exec(ProcessEvent),
    Exit(ProcessEvent),
    Mapping(CapturedMapping),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is too short for its kind ({needed} bytes needed)")]
    TooShort { len: usize, needed: usize },
    #[error("unknown record kind {kind}")]
    UnknownKind { kind: u32 },
    #[error("record claims {frames} frames, more than {MAX_STACK_DEPTH}")]
    TooManyFrames { frames: u32 },
    #[error("record claims a {claimed}-byte stack copy but carries {carried} bytes")]
    StackCopyTruncated { claimed: u32, carried: usize },
    #[error("record claims {frames} interpreter frames, more than {MAX_INTERPRETER_FRAMES}")]
    TooManyInterpreterFrames { frames: u32 },
    #[error("off-CPU record stands for no period")]
    NoPeriods,
}

/// Decodes one ring buffer record.
pub fn decode(bytes: &[u8]) -> Result<Record<'_>, DecodeError> {
    let kind = read_u32(bytes).ok_or(DecodeError::TooShort {
        len: bytes.len(),
        needed: 4,
    })?;
    match RecordKind::from_u32(kind) {
        Some(RecordKind::Sample) => decode_sample(bytes).map(Record::Sample),
        Some(RecordKind::OffCpu) => {
            let mut sample = decode_sample(bytes)?;
            let info = read_struct::<SampleRecord>(bytes)?.off_cpu;
            if info.periods == 0 {
                return Err(DecodeError::NoPeriods);
            }
            sample.off_cpu = Some(info);
            Ok(Record::Sample(sample))
        }
        Some(RecordKind::Exec) => decode_process(bytes).map(Record::Exec),
        Some(RecordKind::Exit) => decode_process(bytes).map(Record::Exit),
        Some(RecordKind::Mapping) => decode_mapping(bytes).map(Record::Mapping),
        None => Err(DecodeError::UnknownKind { kind }),
    }
}

fn read_u32(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

fn read_struct<T: Copy>(bytes: &[u8]) -> Result<T, DecodeError> {
    let needed = size_of::<T>();
    if bytes.len() < needed {
        return Err(DecodeError::TooShort {
            len: bytes.len(),
            needed,
        });
    }
    // SAFETY: the length is checked above and T is a plain `#[repr(C)]`
    // record of integers from agent-common, valid for any bit pattern.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn decode_sample(bytes: &[u8]) -> Result<RawSample<'_>, DecodeError> {
    let record: SampleRecord = read_struct(bytes)?;
    for frames in [record.kernel_frames, record.user_frames] {
        if frames as usize > MAX_STACK_DEPTH {
            return Err(DecodeError::TooManyFrames { frames });
        }
    }
    if record.interpreter_frames as usize > MAX_INTERPRETER_FRAMES {
        return Err(DecodeError::TooManyInterpreterFrames {
            frames: record.interpreter_frames,
        });
    }
    // The record is followed by the kernel's and the user's frames, the
    // stack copy and the interpreter frames, each as long as it says.
    let kernel_bytes = record.kernel_frames as usize * size_of::<u64>();
    let user_bytes = record.user_frames as usize * size_of::<u64>();
    let tail = &bytes[size_of::<SampleRecord>()..];
    let Some((kernel, tail)) = tail.split_at_checked(kernel_bytes) else {
        return Err(too_short(bytes, kernel_bytes));
    };
    let Some((user, tail)) = tail.split_at_checked(user_bytes) else {
        return Err(too_short(bytes, kernel_bytes + user_bytes));
    };
    let claimed = record.stack_copy_len;
    let Some((copy, tail)) = tail.split_at_checked(claimed as usize) else {
        return Err(DecodeError::StackCopyTruncated {
            claimed,
            carried: tail.len(),
        });
    };
    let interpreter_bytes = record.interpreter_frames as usize * size_of::<InterpreterFrame>();
    let Some(frames) = tail.get(..interpreter_bytes) else {
        return Err(too_short(
            bytes,
            kernel_bytes + user_bytes + claimed as usize + interpreter_bytes,
        ));
    };
    let interpreter = frames
        .chunks_exact(size_of::<InterpreterFrame>())
        .map(read_struct::<InterpreterFrame>)
        .collect::<Result<Vec<_>, _>>()?;
    let regs_valid = record.flags & sample_flags::USER_REGS_VALID != 0;
    let mut user_stack = addresses(user);
    // A process unwound from the copy alone: the kernel did not walk its
    // stack, and the walk's first frame is the interrupted instruction.
    if record.flags & sample_flags::USER_WALK_SKIPPED != 0 && regs_valid && user_stack.is_empty() {
        user_stack.push(record.user_regs.ip);
    }
    Ok(RawSample {
        timestamp_ns: record.timestamp_ns,
        cpu: record.cpu,
        tgid: record.tgid,
        tid: record.tid,
        cgroup_id: record.cgroup_id,
        comm: Comm(record.comm),
        kernel_stack: addresses(kernel),
        user_stack,
        kernel_stack_failed: record.flags & sample_flags::KERNEL_STACK_FAILED != 0,
        user_stack_failed: record.flags & sample_flags::USER_STACK_FAILED != 0,
        user_regs: regs_valid.then_some(record.user_regs),
        stack_copy: if regs_valid { copy } else { &[] },
        interpreter,
        interpreter_truncated: record.flags & sample_flags::INTERPRETER_TRUNCATED != 0,
        off_cpu: None,
    })
}

/// `bytes` ends before the part of its tail that ends `tail_bytes` in.
fn too_short(bytes: &[u8], tail_bytes: usize) -> DecodeError {
    DecodeError::TooShort {
        len: bytes.len(),
        needed: size_of::<SampleRecord>() + tail_bytes,
    }
}

/// Frame addresses as the BPF program wrote them, eight bytes each.
fn addresses(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(size_of::<u64>())
        .map(|word| {
            let mut address = [0; size_of::<u64>()];
            address.copy_from_slice(word);
            u64::from_ne_bytes(address)
        })
        .collect()
}

fn decode_process(bytes: &[u8]) -> Result<ProcessEvent, DecodeError> {
    let record: ProcessRecord = read_struct(bytes)?;
    Ok(ProcessEvent {
        tgid: record.tgid,
        timestamp_ns: record.timestamp_ns,
        comm: Comm(record.comm),
        executable: (record.executable.inode != 0).then_some(record.executable),
    })
}

fn decode_mapping(bytes: &[u8]) -> Result<CapturedMapping, DecodeError> {
    let record: MappingRecord = read_struct(bytes)?;
    let used = (record.path_len as usize).min(MAPPING_PATH_BYTES);
    let complete = record.flags & mapping_flags::PATH_COMPLETE != 0;
    // Components from the file up, each NUL-terminated.
    let path = complete
        .then(|| {
            let mut components: Vec<&[u8]> = record.path[..used]
                .split(|&b| b == 0)
                .filter(|name| !name.is_empty())
                .collect();
            components.reverse();
            let mut path = String::new();
            for name in components {
                if name.contains(&b'/') || name == b"." || name == b".." {
                    return None;
                }
                path.push('/');
                path.push_str(std::str::from_utf8(name).ok()?);
            }
            (!path.is_empty()).then_some(path)
        })
        .flatten();
    Ok(CapturedMapping {
        tgid: record.tgid,
        start: record.start,
        end: record.end,
        page_offset: record.pgoff,
        inode: record.inode,
        dev_major: record.dev >> 20,
        dev_minor: record.dev & 0xf_ffff,
        path,
        deleted: record.flags & mapping_flags::DELETED != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_borrowed_unless_it_is_not_utf8() {
        let mut raw = [0; COMM_LEN];
        raw[..4].copy_from_slice(b"java");
        let comm = Comm::new(raw);
        assert!(matches!(comm.to_str(), Cow::Borrowed("java")));
        raw[..2].copy_from_slice(&[0xff, 0xfe]);
        let odd = Comm::new(raw);
        assert_eq!(odd.to_str(), "\u{fffd}\u{fffd}va");
        assert_eq!(odd.to_string(), odd.to_str());
        // All sixteen bytes used: no NUL ends it.
        assert_eq!(Comm::new([b'a'; COMM_LEN]).to_str().len(), COMM_LEN);
    }

    #[test]
    fn a_captured_mapping_gets_its_path_root_first() {
        let mut record = MappingRecord {
            kind: RecordKind::Mapping as u32,
            tgid: 7,
            start: 0x7f00_0000_0000,
            end: 0x7f00_0001_0000,
            pgoff: 2,
            inode: 1234,
            dev: (254 << 20) | 1,
            flags: mapping_flags::PATH_COMPLETE,
            path_len: 0,
            reserved: 0,
            path: [0; MAPPING_PATH_BYTES],
        };
        let names = b"libc.so.6\0x86_64-linux-gnu\0lib\0usr\0";
        record.path[..names.len()].copy_from_slice(names);
        record.path_len = names.len() as u32;
        let Record::Mapping(mapping) = decode(&as_bytes(&record)).expect("decodes") else {
            panic!("not a mapping");
        };
        assert_eq!(
            mapping.path.as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!((mapping.dev_major, mapping.dev_minor), (254, 1));
        // A walk that stopped short names no path; `..` is no name.
        record.flags = 0;
        let Record::Mapping(mapping) = decode(&as_bytes(&record)).expect("decodes") else {
            panic!("not a mapping");
        };
        assert_eq!(mapping.path, None);
        record.flags = mapping_flags::PATH_COMPLETE;
        record.path[..3].copy_from_slice(b"..\0");
        let Record::Mapping(mapping) = decode(&as_bytes(&record)).expect("decodes") else {
            panic!("not a mapping");
        };
        assert_eq!(mapping.path, None);
    }

    fn as_bytes<T>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain repr(C) value.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    const KERNEL: [u64; 2] = [0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020];
    const USER: [u64; 3] = [0x401000, 0x401100, 0x401200];

    fn sample_record() -> SampleRecord {
        SampleRecord {
            kind: RecordKind::Sample as u32,
            cpu: 1,
            tgid: 100,
            tid: 101,
            timestamp_ns: 123_456,
            cgroup_id: 7,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
            flags: sample_flags::USER_REGS_VALID,
            kernel_frames: KERNEL.len() as u32,
            user_frames: USER.len() as u32,
            stack_copy_len: 8,
            interpreter_frames: 0,
            reserved: 0,
            user_regs: UserRegs {
                ip: 0x401000,
                sp: 0x7ffc_0000,
                bp: 0x7ffc_0100,
            },
            off_cpu: OffCpuInfo::default(),
        }
    }

    #[test]
    fn off_cpu_samples_carry_their_wait() {
        let mut record = sample_record();
        record.kind = RecordKind::OffCpu as u32;
        record.stack_copy_len = 0;
        record.off_cpu = OffCpuInfo {
            periods: 3,
            blocked_ns: 31_000_000,
            state: 1,
            syscall: 230,
        };
        let bytes = with_stacks(&record);
        let Record::Sample(sample) = decode(&bytes).expect("decodes") else {
            panic!("not a sample");
        };
        assert_eq!(sample.off_cpu, Some(record.off_cpu));
        assert_eq!(sample.user_stack, USER);
        record.off_cpu.periods = 0;
        assert_eq!(
            decode(&with_stacks(&record)).map(|_| ()),
            Err(DecodeError::NoPeriods)
        );
        record.kind = RecordKind::Sample as u32;
        let bytes = with_stacks(&record);
        let Record::Sample(cpu) = decode(&bytes).expect("decodes") else {
            panic!("not a sample");
        };
        assert_eq!(cpu.off_cpu, None, "a CPU sample is no wait");
    }

    #[test]
    fn a_kernel_threads_sample_has_no_user_side() {
        let mut record = sample_record();
        record.stack_copy_len = 0;
        let whole = with_stacks(&record);
        let Record::Sample(sample) = decode(&whole).expect("decodes") else {
            panic!("not a sample");
        };
        assert!(sample.has_user_side());
        let mut kernel_only = record;
        kernel_only.flags = 0;
        kernel_only.user_frames = 0;
        let mut bytes = as_bytes(&kernel_only);
        for address in KERNEL {
            bytes.extend_from_slice(&address.to_ne_bytes());
        }
        let Record::Sample(sample) = decode(&bytes).expect("decodes") else {
            panic!("not a sample");
        };
        assert_eq!(sample.kernel_stack, KERNEL);
        assert!(!sample.has_user_side());
        // Registers alone (the walk skipped, nothing copied) are a user side.
        kernel_only.flags = sample_flags::USER_REGS_VALID;
        bytes[..size_of::<SampleRecord>()].copy_from_slice(&as_bytes(&kernel_only));
        let Record::Sample(sample) = decode(&bytes).expect("decodes") else {
            panic!("not a sample");
        };
        assert!(sample.user_stack.is_empty());
        assert!(sample.has_user_side());
    }

    /// The record followed by its frames, as the BPF program writes it.
    fn with_stacks(record: &SampleRecord) -> Vec<u8> {
        let mut bytes = as_bytes(record);
        for address in KERNEL.iter().chain(&USER) {
            bytes.extend_from_slice(&address.to_ne_bytes());
        }
        bytes
    }

    #[test]
    fn interpreter_frames_follow_the_stack_copy() {
        let mut record = sample_record();
        record.interpreter_frames = 2;
        record.flags |= sample_flags::INTERPRETER_TRUNCATED;
        let frames = [
            InterpreterFrame {
                code: 0x7f00_0000_1000,
                stamp: 11,
                instruction: 0x7f00_0000_1040,
                flags: 0,
                data: 0,
            },
            InterpreterFrame {
                code: 0x7f00_0000_2000,
                stamp: 12,
                instruction: 6,
                flags: agent_common::interpreter_frame_flags::ENTRY,
                data: 0,
            },
        ];
        let mut bytes = with_stacks(&record);
        bytes.extend_from_slice(&0x401234u64.to_ne_bytes());
        for frame in &frames {
            bytes.extend_from_slice(&as_bytes(frame));
        }
        let Ok(Record::Sample(sample)) = decode(&bytes) else {
            panic!("expected a sample");
        };
        assert_eq!(sample.interpreter, frames);
        assert!(sample.interpreter_truncated);
        assert_eq!(sample.stack_copy, 0x401234u64.to_ne_bytes());
        assert_eq!(sample.user_stack, USER);

        // Frames claimed but not carried.
        bytes.truncate(bytes.len() - 16);
        assert!(matches!(decode(&bytes), Err(DecodeError::TooShort { .. })));
    }

    #[test]
    fn sample_decodes_with_its_stack_copy() {
        let mut bytes = with_stacks(&sample_record());
        bytes.extend_from_slice(&0x401234u64.to_ne_bytes());
        let Ok(Record::Sample(sample)) = decode(&bytes) else {
            panic!("expected a sample");
        };
        assert_eq!(sample.tgid, 100);
        assert_eq!(sample.tid, 101);
        assert_eq!(sample.comm.to_string(), "worker");
        assert_eq!(sample.kernel_stack, KERNEL);
        assert_eq!(sample.user_stack, USER);
        assert_eq!(sample.user_regs.map(|r| r.sp), Some(0x7ffc_0000));
        assert_eq!(sample.stack_copy, 0x401234u64.to_ne_bytes());
    }

    /// A process unwound from the copy alone: no walk, its one user
    /// frame the interrupted instruction; none without registers.
    #[test]
    fn a_skipped_walk_leaves_the_interrupted_instruction() {
        let mut record = sample_record();
        record.flags |= sample_flags::USER_WALK_SKIPPED;
        record.user_frames = 0;
        record.user_regs.ip = 0x401777;
        let mut bytes = as_bytes(&record);
        for address in KERNEL {
            bytes.extend_from_slice(&address.to_ne_bytes());
        }
        bytes.extend_from_slice(&0x401234u64.to_ne_bytes());
        let Ok(Record::Sample(sample)) = decode(&bytes) else {
            panic!("expected a sample");
        };
        assert_eq!(sample.kernel_stack, KERNEL);
        assert_eq!(sample.user_stack, [0x401777]);
        assert_eq!(sample.stack_copy, 0x401234u64.to_ne_bytes());

        record.flags &= !sample_flags::USER_REGS_VALID;
        record.stack_copy_len = 0;
        let mut bytes = as_bytes(&record);
        for address in KERNEL {
            bytes.extend_from_slice(&address.to_ne_bytes());
        }
        let Ok(Record::Sample(sample)) = decode(&bytes) else {
            panic!("expected a sample");
        };
        assert!(sample.user_stack.is_empty(), "no registers, no user side");
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        assert!(matches!(decode(&[]), Err(DecodeError::TooShort { .. })));
        assert!(matches!(
            decode(&9u32.to_ne_bytes()),
            Err(DecodeError::UnknownKind { kind: 9 })
        ));
        let bytes = with_stacks(&sample_record());
        assert!(matches!(
            decode(&bytes[..90]),
            Err(DecodeError::TooShort { .. })
        ));
        // Claims five frames but carries four.
        assert!(matches!(
            decode(&bytes[..bytes.len() - 8]),
            Err(DecodeError::TooShort { .. })
        ));
        // Claims 8 bytes of stack copy but carries none.
        assert!(matches!(
            decode(&bytes),
            Err(DecodeError::StackCopyTruncated { claimed: 8, .. })
        ));
        let mut record = sample_record();
        record.user_frames = 500;
        assert!(matches!(
            decode(&as_bytes(&record)),
            Err(DecodeError::TooManyFrames { frames: 500 })
        ));
    }

    #[test]
    fn process_events_decode() {
        let record = ProcessRecord {
            kind: RecordKind::Exec as u32,
            tgid: 55,
            timestamp_ns: 9,
            comm: *b"sh\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            executable: ExecutableKey {
                inode: 12,
                dev: 0x80_0001,
                reserved: 0,
            },
        };
        let Ok(Record::Exec(event)) = decode(&as_bytes(&record)) else {
            panic!("expected exec");
        };
        assert_eq!(event.tgid, 55);
        assert_eq!(event.comm.to_string(), "sh");
        assert_eq!(event.executable, Some(record.executable));
        let unknown = ProcessRecord {
            executable: ExecutableKey {
                inode: 0,
                dev: 0,
                reserved: 0,
            },
            ..record
        };
        let Ok(Record::Exec(event)) = decode(&as_bytes(&unknown)) else {
            panic!("expected exec");
        };
        assert_eq!(event.executable, None, "zeros: not known");
    }

    #[test]
    fn comm_from_long_str_keeps_the_nul() {
        let comm = Comm::from("a-very-long-process-name");
        assert_eq!(comm.as_bytes().len(), COMM_LEN - 1);
    }
}
