//! Mappings captured in the kernel as a process exits: what the daemon
//! needs to place the frames of a process whose `/proc/PID/maps` it could
//! not read in time (a process of a few milliseconds is gone before the
//! daemon drains its samples).

/// Bytes of a mapping's path a [`MappingRecord`] carries: its components
/// from the file up, each NUL-terminated. A component starts within the
/// first half, and one is at most `NAME_MAX` (255) bytes and its NUL.
pub const MAPPING_PATH_BYTES: usize = 512;

/// Most processes `MAPS_WANTED` follows at once (an LRU map: the least
/// recently sampled make room).
pub const MAX_MAPS_WANTED: u32 = 16_384;

/// Most virtual memory areas one exit walk visits; a process with more
/// (rare: JIT heaps) keeps those visited first, and the cut is counted.
pub const MAX_VMAS_WALKED: u32 = 8192;

/// Most path components walked up from a mapped file (a mount crossed
/// takes one step too); the names written stop sooner, where the next
/// would start past the first half of [`MAPPING_PATH_BYTES`]. A path cut
/// short is left out and its object found by device and inode among those
/// open. The walk is an open-coded iterator the verifier checks about
/// twice whatever this bound (a bounded loop, checked step by step, took
/// 90 ms of verification at every start for 12).
pub const MAX_PATH_COMPONENTS: u32 = 64;

/// Values of `MAPS_WANTED`.
pub mod wanted {
    /// The process started (exec or fork) while firn ran.
    pub const STARTED: u32 = 1;
    /// ...and was sampled since: its exit is walked.
    pub const SAMPLED: u32 = 2;
}

/// One executable file mapping of an exiting process.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MappingRecord {
    /// [`crate::RecordKind::Mapping`].
    pub kind: u32,
    pub tgid: u32,
    pub start: u64,
    pub end: u64,
    /// Offset of the mapping in its file, in pages.
    pub pgoff: u64,
    pub inode: u64,
    /// The file's device as the kernel keeps it (`MKDEV`: major << 20 |
    /// minor), not the userspace encoding.
    pub dev: u32,
    /// [`mapping_flags`] bits.
    pub flags: u32,
    /// Bytes of `path` in use.
    pub path_len: u32,
    pub reserved: u32,
    /// The path's components, the file's name first, each NUL-terminated,
    /// up to the root of the process's mount namespace.
    pub path: [u8; MAPPING_PATH_BYTES],
}

/// Bits of [`MappingRecord::flags`].
pub mod mapping_flags {
    /// The walk reached the root: `path` is the whole path.
    pub const PATH_COMPLETE: u32 = 1 << 0;
    /// The file was unlinked (its dentry is unhashed).
    pub const DELETED: u32 = 1 << 1;
}

/// Kernel structure offsets for the exit walk, from the running kernel's
/// BTF, written by the daemon before load. All zero: the walk is off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapsConfig {
    /// Non-zero: walk exiting processes (the daemon found every offset
    /// and the iterator functions).
    pub enabled: u32,
    /// `task_struct.pid` and `.tgid`, to tell a new process from a thread
    /// at fork.
    pub task_pid: u32,
    pub task_tgid: u32,
    /// Bytes of `vm_area_struct` read at once (every field below lies
    /// within them).
    pub vma_bytes: u32,
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_pgoff: u32,
    pub vma_file: u32,
    pub vma_flags: u32,
    /// `file.f_path.mnt` and `file.f_path.dentry`.
    pub file_mnt: u32,
    pub file_dentry: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    pub dentry_parent: u32,
    /// `dentry.d_name.name`.
    pub dentry_name: u32,
    /// `dentry.d_hash.pprev`: null once the dentry is unhashed (deleted).
    pub dentry_hash_pprev: u32,
    pub vfsmount_root: u32,
    /// `mount.mnt` (the `vfsmount` inside a `mount`), `.mnt_parent`,
    /// `.mnt_mountpoint`.
    pub mount_mnt: u32,
    pub mount_parent: u32,
    pub mount_mountpoint: u32,
    /// `linux_binprm.file`: the executable at `sched_process_exec`, to
    /// register a known interpreter's new process there (0: not done).
    pub bprm_file: u32,
}

/// Indexes of `MAPS_COUNTERS` (per CPU, summed by the daemon).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapsCounter {
    /// Exiting processes whose mappings were walked.
    Walked = 0,
    /// Mapping records written.
    Mappings = 1,
    /// Mapping records lost: the ring buffer was full.
    Lost = 2,
    /// Mappings whose path walk did not reach the root (too deep or
    /// too long, or a read failed).
    PathIncomplete = 3,
    /// Walks cut at [`MAX_VMAS_WALKED`].
    WalkCut = 4,
    /// Processes started that `MAPS_WANTED` could not take.
    WantedFull = 5,
}

impl MapsCounter {
    pub const COUNT: u32 = 6;
    pub const ALL: [MapsCounter; Self::COUNT as usize] = [
        Self::Walked,
        Self::Mappings,
        Self::Lost,
        Self::PathIncomplete,
        Self::WalkCut,
        Self::WantedFull,
    ];
}

const _: () = assert!(core::mem::size_of::<MappingRecord>() == 56 + MAPPING_PATH_BYTES);
const _: () = assert!(core::mem::size_of::<MapsConfig>() == 92);
