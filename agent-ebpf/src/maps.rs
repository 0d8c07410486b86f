//! The mappings of short-lived processes, captured from the kernel's side.
//!
//! The daemon unwinds and names frames from `/proc/PID/maps`, read when it
//! drains a process's samples; a process of a few milliseconds has exited
//! by then. So as the leader of a process that started while firn ran and
//! was sampled exits, `process_exit_maps` walks its address space with the
//! open-coded VMA iterator (`bpf_iter_task_vma_*`) and writes each
//! executable file mapping (range, offset, device, inode and path) to the
//! ring buffer, before `process_exit`'s exit event. Since 6.16
//! `sched_process_exit` fires before the task lets go of its memory map.
//!
//! The iterator functions are kfuncs, which neither aya nor bpf-linker
//! know how to call: the calls are written as raw instructions whose
//! immediate is a marker (0x0f1a0001-3 for the VMA iterator in
//! `iter_new`, `iter_next` and `iter_destroy`, 0x0f1a0004-6 for the number
//! iterator in `num_new`, `num_next` and `num_destroy`), and the daemon
//! replaces each marker with the function's BTF id in the running kernel
//! before loading the object. A kernel without them keeps the program
//! unloaded.
//!
//! Both loops are open-coded iterators whose loop-carried values the
//! verifier cannot tell apart from one step to the next (what they count
//! lives in `MAPS_WALKED`): it checks each loop's body about twice, not
//! once per step, so a path of many components costs no more to verify
//! than one of a few (a bounded `for` over 12 components, each step
//! checked on its own, took 70 ms at every start).

use core::{
    ffi::c_void,
    mem::MaybeUninit,
    ptr::{addr_of_mut, read_volatile},
};

use agent_common::{
    ExecutableKey, MAPPING_PATH_BYTES, MappingRecord, MapsConfig, MapsCounter, RecordKind,
    mapping_flags,
    maps::{MAX_MAPS_WANTED, MAX_PATH_COMPONENTS, MAX_VMAS_WALKED, wanted},
};
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_probe_read_kernel_str},
    },
    macros::{map, raw_tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::RawTracePointContext,
};

use crate::{EVENTS, config, wanted as filtered_in};

/// Written by the daemon before load.
// SAFETY: the loader finds the variable by this name, and no other symbol
// in the object has it.
#[unsafe(no_mangle)]
static MAPS_CONFIG: MapsConfig = MapsConfig {
    enabled: 0,
    task_pid: 0,
    task_tgid: 0,
    vma_bytes: 0,
    vma_start: 0,
    vma_end: 0,
    vma_pgoff: 0,
    vma_file: 0,
    vma_flags: 0,
    file_mnt: 0,
    file_dentry: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    dentry_parent: 0,
    dentry_name: 0,
    dentry_hash_pprev: 0,
    vfsmount_root: 0,
    mount_mnt: 0,
    mount_parent: 0,
    mount_mountpoint: 0,
    bprm_file: 0,
};

/// Processes started while firn runs (exec, or fork of a new process),
/// marked once sampled (`wanted`): their exit is walked. An LRU map: the
/// least recently touched make room, and lose only their capture.
#[map]
static MAPS_WANTED: LruHashMap<u32, u32> = LruHashMap::with_max_entries(MAX_MAPS_WANTED, 0);

/// Areas visited by the current walk (slot [`WALKED_AREAS`]) and the bytes
/// of the current path written (slot [`WALKED_PATH`]), per CPU: kept in a
/// map so that the verifier, which tracks no map contents, sees every
/// step of a walk alike and checks it once.
#[map]
static MAPS_WALKED: PerCpuArray<u32> = PerCpuArray::with_max_entries(2, 0);

const WALKED_AREAS: u32 = 0;
const WALKED_PATH: u32 = 1;

#[map]
static MAPS_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MapsCounter::COUNT, 0);

const VM_EXEC: u64 = 0x4;

#[inline(always)]
fn maps_config() -> MapsConfig {
    // SAFETY: as `crate::config`: the loader rewrites the read-only data.
    unsafe { read_volatile(&MAPS_CONFIG) }
}

#[inline(always)]
fn count(counter: MapsCounter) {
    if let Some(value) = MAPS_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's slot, valid while the program runs; a
        // concurrent sample on this CPU can lose one count, no more.
        unsafe { *value += 1 };
    }
}

/// A process started: follow it until its exit.
#[inline(always)]
pub fn started(tgid: u32) {
    if maps_config().enabled == 0 {
        return;
    }
    if MAPS_WANTED.insert(&tgid, &wanted::STARTED, 0).is_err() {
        count(MapsCounter::WantedFull);
    }
}

/// A sample of `tgid`: its exit is walked, if it is followed.
#[inline(always)]
pub fn sampled(tgid: u32) {
    if let Some(state) = MAPS_WANTED.get_ptr_mut(&tgid) {
        // SAFETY: the map's value for `tgid`, valid while the program
        // runs; a plain store, the only value ever written over STARTED.
        unsafe {
            if read_volatile(state) != wanted::SAMPLED {
                core::ptr::write_volatile(state, wanted::SAMPLED);
            }
        }
    }
}

/// A new process (not a thread): on `sched_process_fork`, whose arguments
/// are the parent and the child task. Its first image is its parent's.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn process_fork_maps(ctx: RawTracePointContext) -> u32 {
    let maps = maps_config();
    if maps.enabled == 0 {
        return 0;
    }
    let child: u64 = ctx.arg(1);
    // SAFETY: the helper reads kernel memory and fails rather than
    // faults; the offsets are the running kernel's, from its BTF.
    let (pid, tgid) = unsafe {
        (
            bpf_probe_read_kernel((child + u64::from(maps.task_pid)) as *const i32),
            bpf_probe_read_kernel((child + u64::from(maps.task_tgid)) as *const i32),
        )
    };
    if let (Ok(pid), Ok(tgid)) = (pid, tgid)
        && pid == tgid
        && tgid > 0
        && filtered_in(&config(), (bpf_get_current_pid_tgid() >> 32) as u32)
    {
        started(tgid as u32);
    }
    0
}

/// Before `process_exit` (attached first, so its records precede the exit
/// event): the exiting leader's executable file mappings, if its process
/// is followed and was sampled.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit_maps(_ctx: RawTracePointContext) -> u32 {
    let maps = maps_config();
    if maps.enabled == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid != pid_tgid as u32 {
        return 0;
    }
    // SAFETY: copied out at once.
    let state = unsafe { MAPS_WANTED.get(&tgid) }.copied();
    let _ = MAPS_WANTED.remove(&tgid);
    if state != Some(wanted::SAMPLED) || !filtered_in(&config(), tgid) {
        return 0;
    }
    count(MapsCounter::Walked);
    // SAFETY: a helper without arguments; the running (exiting) task, a
    // trusted pointer the iterator takes.
    let task = unsafe { bpf_get_current_task_btf() } as *mut c_void;
    let mut iter = MaybeUninit::<u64>::uninit();
    // SAFETY: `iter` is this frame's stack slot of the iterator's size;
    // every path below ends it with `iter_destroy`.
    unsafe { iter_new(iter.as_mut_ptr(), task, 0) };
    let walked = MAPS_WALKED.get_ptr_mut(WALKED_AREAS);
    if let Some(walked) = walked {
        // SAFETY: this CPU's slot; programs on a tracepoint do not nest.
        unsafe { *walked = 0 };
    }
    loop {
        // SAFETY: the iterator begun above.
        let vma = unsafe { iter_next(iter.as_mut_ptr()) };
        if vma.is_null() {
            break;
        }
        if let Some(walked) = walked {
            // SAFETY: as above.
            let steps = unsafe { read_volatile(walked) } + 1;
            unsafe { core::ptr::write_volatile(walked, steps) };
            if steps > MAX_VMAS_WALKED {
                count(MapsCounter::WalkCut);
                break;
            }
        }
        // SAFETY: `vma` is the iterator's current area, valid until the
        // next step.
        unsafe { emit(&maps, tgid, vma) };
    }
    // SAFETY: the iterator begun above, ended once.
    unsafe { iter_destroy(iter.as_mut_ptr()) };
    0
}

/// Reads a kernel word at `base + offset`, zero where that fails.
#[inline(always)]
fn read_u64(base: u64, offset: u32) -> u64 {
    // SAFETY: the helper reads kernel memory and fails rather than faults.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const u64) }.unwrap_or(0)
}

/// The executable of a `sched_process_exec` (its `linux_binprm`, the
/// tracepoint's third argument), by inode and device; `None` without the
/// offsets.
#[inline(always)]
pub fn executable(ctx: &RawTracePointContext) -> Option<ExecutableKey> {
    let maps = maps_config();
    if maps.enabled == 0 || maps.bprm_file == 0 {
        return None;
    }
    let bprm: u64 = ctx.arg(2);
    let inode = read_u64(read_u64(bprm, maps.bprm_file), maps.file_inode);
    if inode == 0 {
        return None;
    }
    Some(ExecutableKey {
        inode: read_u64(inode, maps.inode_ino),
        dev: read_u64(read_u64(inode, maps.inode_sb), maps.sb_dev) as u32,
        reserved: 0,
    })
}

/// Writes the record of `vma` when it is an executable file mapping.
///
/// # Safety
///
/// `vma` is a `vm_area_struct` the iterator handed out.
#[inline(always)]
unsafe fn emit(maps: &MapsConfig, tgid: u32, vma: *const c_void) {
    // The offsets are the loader's constants: the verifier sees a fixed
    // offset into the trusted area, which the helper then reads.
    let vma = vma as u64;
    let file = read_u64(vma, maps.vma_file);
    if file == 0 || read_u64(vma, maps.vma_flags) & VM_EXEC == 0 {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<MappingRecord>(0) else {
        count(MapsCounter::Lost);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: the reserved entry, ours until submitted; every field is
    // written before the submit (the path up to `path_len`).
    unsafe {
        (*record).kind = RecordKind::Mapping as u32;
        (*record).tgid = tgid;
        (*record).start = read_u64(vma, maps.vma_start);
        (*record).end = read_u64(vma, maps.vma_end);
        (*record).pgoff = read_u64(vma, maps.vma_pgoff);
        let inode = read_u64(file, maps.file_inode);
        (*record).inode = read_u64(inode, maps.inode_ino);
        (*record).dev = read_u64(read_u64(inode, maps.inode_sb), maps.sb_dev) as u32;
        (*record).reserved = 0;
        let (path_len, flags) = walk_path(maps, file, addr_of_mut!((*record).path).cast());
        (*record).path_len = path_len;
        (*record).flags = flags;
        if flags & mapping_flags::PATH_COMPLETE == 0 {
            count(MapsCounter::PathIncomplete);
        }
    }
    entry.submit(0);
    count(MapsCounter::Mappings);
}

/// Writes the names from `file`'s dentry up to the root of its mount
/// namespace into `path` (each NUL-terminated, the file's first); returns
/// the bytes written and the [`mapping_flags`].
///
/// # Safety
///
/// `path` is valid for [`MAPPING_PATH_BYTES`] bytes of writes.
#[inline(always)]
unsafe fn walk_path(maps: &MapsConfig, file: u64, path: *mut u8) -> (u32, u32) {
    let mut flags = 0;
    let Some(written) = MAPS_WALKED.get_ptr_mut(WALKED_PATH) else {
        return (0, flags);
    };
    let mut dentry = read_u64(file, maps.file_dentry);
    let mut vfsmount = read_u64(file, maps.file_mnt);
    let mut mount = vfsmount.wrapping_sub(u64::from(maps.mount_mnt));
    if read_u64(dentry, maps.dentry_hash_pprev) == 0 {
        flags |= mapping_flags::DELETED;
    }
    // SAFETY: this CPU's slot, valid while the program runs; programs on
    // a tracepoint do not nest.
    unsafe { core::ptr::write_volatile(written, 0) };
    let mut steps = MaybeUninit::<u64>::uninit();
    // SAFETY: `steps` is this frame's stack slot of the iterator's size;
    // it is ended below, on every path out of the loop.
    unsafe { num_new(steps.as_mut_ptr(), 0, MAX_PATH_COMPONENTS as i32) };
    // SAFETY: the iterator begun above.
    while !unsafe { num_next(steps.as_mut_ptr()) }.is_null() {
        if dentry == 0 || vfsmount == 0 {
            break;
        }
        if dentry == read_u64(vfsmount, maps.vfsmount_root) {
            // The root of a mount: go on from where it is mounted.
            let parent = read_u64(mount, maps.mount_parent);
            if parent == mount || parent == 0 {
                flags |= mapping_flags::PATH_COMPLETE;
                break;
            }
            dentry = read_u64(mount, maps.mount_mountpoint);
            mount = parent;
            vfsmount = parent + u64::from(maps.mount_mnt);
            continue;
        }
        let parent = read_u64(dentry, maps.dentry_parent);
        if parent == dentry {
            // The root of a file system that is not a mount's root
            // (outside the namespace): nothing above it to name.
            break;
        }
        let name = read_u64(dentry, maps.dentry_name);
        // SAFETY: as above.
        let done = unsafe { read_volatile(written) } as usize;
        if done >= MAPPING_PATH_BYTES / 2 {
            break;
        }
        // SAFETY: the offset is masked below half the buffer and a read
        // writes at most the other half; the helper checks the kernel
        // address.
        let read = unsafe {
            bpf_probe_read_kernel_str(
                path.add(done & (MAPPING_PATH_BYTES / 2 - 1)).cast(),
                (MAPPING_PATH_BYTES / 2) as u32,
                name as *const c_void,
            )
        };
        if read <= 0 {
            break;
        }
        let done = done + (read as usize & (MAPPING_PATH_BYTES / 2 - 1));
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(written, done as u32) };
        dentry = parent;
    }
    // SAFETY: the iterator begun above, ended once.
    unsafe { num_destroy(steps.as_mut_ptr()) };
    // SAFETY: as above.
    let mut len = unsafe { read_volatile(written) } as usize;
    if len > MAPPING_PATH_BYTES {
        len = MAPPING_PATH_BYTES;
    }
    (len as u32, flags)
}

/// A kfunc call returning `$ret`: `$insn` is the whole call instruction
/// as a `.quad`, its immediate a marker the daemon patches (see the
/// module's notes); arguments go in r1-r3, the result comes back in r0,
/// and r1-r5 are clobbered (the kernel's calling convention). Expands to
/// an `unsafe` expression: the caller states what the function requires.
/// The result is typed as the function's (a pointer, not an integer cast
/// to one): the cast alone changed the code enough to cost the verifier
/// half as many instructions again.
macro_rules! kfunc {
    ($insn:literal -> $ret:ty, $r1:expr) => {{
        let ret: $ret;
        core::arch::asm!(
            concat!(".quad ", $insn),
            inout("r1") $r1 => _,
            lateout("r0") ret,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        );
        ret
    }};
    ($insn:literal -> $ret:ty, $r1:expr, $r2:expr, $r3:expr) => {{
        let ret: $ret;
        core::arch::asm!(
            concat!(".quad ", $insn),
            inout("r1") $r1 => _,
            inout("r2") $r2 => _,
            inout("r3") $r3 => _,
            lateout("r0") ret,
            lateout("r4") _,
            lateout("r5") _,
        );
        ret
    }};
}

/// `bpf_iter_task_vma_new(it, task, addr)`.
///
/// # Safety
///
/// `iter` is an uninitialized iterator slot on this program's stack and
/// `task` a trusted task pointer.
#[inline(always)]
unsafe fn iter_new(iter: *mut u64, task: *mut c_void, addr: u64) -> i64 {
    // SAFETY: the caller's promise.
    unsafe { kfunc!("0x0f1a000100002085" -> i64, iter, task, addr) }
}

/// `bpf_iter_task_vma_next(it)`: the next area, or null.
///
/// # Safety
///
/// `iter` was begun with [`iter_new`].
#[inline(always)]
unsafe fn iter_next(iter: *mut u64) -> *const c_void {
    // SAFETY: the caller's promise.
    unsafe { kfunc!("0x0f1a000200002085" -> *const c_void, iter) }
}

/// `bpf_iter_task_vma_destroy(it)`.
///
/// # Safety
///
/// `iter` was begun with [`iter_new`] and is not used after.
#[inline(always)]
unsafe fn iter_destroy(iter: *mut u64) {
    // SAFETY: the caller's promise.
    unsafe { kfunc!("0x0f1a000300002085" -> u64, iter) };
}

/// `bpf_iter_num_new(it, start, end)`: an iterator over `start..end`.
///
/// # Safety
///
/// `iter` is an uninitialized iterator slot on this program's stack.
#[inline(always)]
unsafe fn num_new(iter: *mut u64, start: i32, end: i32) -> i64 {
    // SAFETY: the caller's promise.
    unsafe { kfunc!("0x0f1a000400002085" -> i64, iter, i64::from(start), i64::from(end)) }
}

/// `bpf_iter_num_next(it)`: a pointer to the next number, or null.
///
/// # Safety
///
/// `iter` was begun with [`num_new`].
#[inline(always)]
unsafe fn num_next(iter: *mut u64) -> *const i32 {
    // SAFETY: the caller's promise.
    unsafe { kfunc!("0x0f1a000500002085" -> *const i32, iter) }
}

/// `bpf_iter_num_destroy(it)`.
///
/// # Safety
///
/// `iter` was begun with [`num_new`] and is not used after.
#[inline(always)]
unsafe fn num_destroy(iter: *mut u64) {
    // SAFETY: the caller's promise.
    unsafe { kfunc!("0x0f1a000600002085" -> u64, iter) };
}
