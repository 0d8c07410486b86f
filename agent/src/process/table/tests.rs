use std::{path::Path, sync::Mutex};

use super::*;
use crate::process::MappingKind;

fn table(proc_root: &Path, stats: Arc<Stats>) -> ProcessTable {
    ProcessTable::new(
        proc_root.to_path_buf(),
        &ProcessTableConfig::default(),
        &DebugFileConfig {
            directories: Vec::new(),
        },
        stats,
    )
}

fn spec(start: u64, end: u64, path: &str) -> MappingSpec {
    MappingSpec {
        start,
        end,
        offset: 0,
        dev: 0,
        inode: 0,
        path: path.into(),
        kind: MappingKind::File,
        deleted: false,
    }
}

#[test]
fn mapping_index_finds_the_containing_mapping() {
    let image = ProcessImage::new(
        1,
        "x".into(),
        vec![spec(0x1000, 0x2000, "/a"), spec(0x5000, 0x6000, "/b")],
    );
    assert_eq!(image.mapping_index(0x1000), Some(0));
    assert_eq!(image.mapping_index(0x1fff), Some(0));
    assert_eq!(image.mapping_index(0x2000), None);
    assert_eq!(image.mapping_index(0x5800), Some(1));
    assert_eq!(image.mapping_index(0x10), None);
    assert_eq!(image.executable(), Some("/a"));
}

#[test]
fn own_process_is_read_and_its_objects_resolve() {
    let stats = Arc::new(Stats::default());
    let mut table = table(Path::new("/proc"), stats.clone());
    let pid = std::process::id();
    let image = table.image(pid, "fallback");
    assert!(!image.gone);
    let here = own_address();
    let index = image.mapping_index(here).expect("this function is mapped");
    let object = table.object(&image, index).expect("the test binary opens");
    assert!(object.build_id().is_some());
    assert!(image.mappings[index].object_vaddr(here).is_some());
    assert!(Arc::ptr_eq(&image, &table.image(pid, "fallback")), "cached");
}

fn own_address() -> u64 {
    own_address as *const () as usize as u64
}

#[test]
fn a_vanished_process_gets_an_empty_counted_image() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut table = table(dir.path(), stats.clone());
    let image = table.image(31337, "ghost");
    assert!(image.gone);
    assert_eq!(image.comm, "ghost");
    assert_eq!(image.mapping_index(0x1000), None);
    assert_eq!(stats.snapshot().processes_gone, 1);
    // Gone processes expire after the grace period.
    table.expire(Instant::now() + ProcessTableConfig::default().exited_process_grace);
    assert_eq!(table.sizes().processes, 0);
}

#[test]
fn exit_keeps_the_image_for_the_grace_period() {
    let stats = Arc::new(Stats::default());
    let mut table = table(Path::new("/proc"), stats);
    let pid = std::process::id();
    let image = table.image(pid, "me");
    table.on_exit(pid);
    table.expire(Instant::now());
    assert!(
        table
            .lookup(pid)
            .is_some_and(|kept| Arc::ptr_eq(&kept, &image))
    );
    table.expire(
        Instant::now()
            + ProcessTableConfig::default().exited_process_grace
            + Duration::from_secs(1),
    );
    assert!(table.lookup(pid).is_none());
}

#[test]
fn a_pid_seen_again_after_its_exit_is_read_again() {
    let stats = Arc::new(Stats::default());
    let root = tempfile::tempdir().expect("tempdir");
    let process = root.path().join("42");
    std::fs::create_dir_all(&process).expect("mkdir");
    let maps = |path: &str| format!("55d4e0a01000-55d4e0a02000 r-xp 00001000 fe:01 7 {path}\n");
    std::fs::write(process.join("maps"), maps("/usr/bin/old")).expect("write");
    let mut table = table(root.path(), stats);
    assert_eq!(table.image(42, "old").executable(), Some("/usr/bin/old"));

    // The program is replaced without an exec event (pid reuse): still
    // the cached image while the process has not exited.
    std::fs::write(process.join("maps"), maps("/usr/bin/new")).expect("write");
    assert_eq!(table.image(42, "old").executable(), Some("/usr/bin/old"));

    table.on_exit(42);
    let entry = table
        .processes
        .peek_mut(&42)
        .expect("kept for the grace period");
    let image = Arc::get_mut(&mut entry.image).expect("no other holder");
    image.read_at = Instant::now()
        .checked_sub(REFRESH_INTERVAL)
        .expect("the clock is past the interval");
    let fresh = table.image(42, "new");
    assert_eq!(fresh.executable(), Some("/usr/bin/new"));
    assert!(
        table
            .lookup(42)
            .is_some_and(|kept| Arc::ptr_eq(&kept, &fresh)),
        "the new process replaces the exited one"
    );
    // Once gone for good, the exited image is what remains.
    table.on_exit(42);
    std::fs::remove_dir_all(&process).expect("rm");
    assert_eq!(table.image(42, "new").executable(), Some("/usr/bin/new"));
}

#[test]
fn jit_code_opens_the_perf_map_named_by_the_namespace_pid() {
    let stats = Arc::new(Stats::default());
    let root = tempfile::tempdir().expect("tempdir");
    let process = root.path().join("42");
    std::fs::create_dir_all(process.join("root/tmp")).expect("mkdir");
    // Pid 42 on the host is pid 7 in its container.
    std::fs::write(process.join("status"), "Name:\tnode\nNSpid:\t42\t7\n").expect("write");
    std::fs::write(
        process.join("mountinfo"),
        "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n",
    )
    .expect("write");
    std::fs::write(
        process.join("maps"),
        "7f0000000000-7f0000100000 r-xp 00000000 00:00 0 \n",
    )
    .expect("write");
    let mut table = table(root.path(), stats);
    let image = table.image(42, "node");
    assert_eq!(image.mappings[0].spec.kind, MappingKind::Anonymous);
    assert!(table.object(&image, 0).is_none());
    assert!(image.perf_map().is_none(), "no perf map written yet");

    std::fs::write(
        process.join("root/tmp/perf-7.map"),
        "7f0000000000 10 JS:*f\n",
    )
    .expect("write");
    table.object(&image, 0);
    assert!(
        image.perf_map().is_none(),
        "retried at most once per interval"
    );
    image.perf_map.lock().expect("not poisoned").tried_at.take();
    table.object(&image, 0);
    assert!(image.perf_map().is_some());
}

#[test]
fn the_table_is_bounded_and_counts_evictions() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ProcessTableConfig {
        max_processes: 2,
        ..ProcessTableConfig::default()
    };
    let no_debug_files = DebugFileConfig {
        directories: Vec::new(),
    };
    let mut table = ProcessTable::new(
        dir.path().to_path_buf(),
        &config,
        &no_debug_files,
        stats.clone(),
    );
    for pid in 1..=5 {
        table.image(pid, "p");
    }
    assert_eq!(table.sizes().processes, 2);
    assert_eq!(stats.snapshot().processes_evicted, 3);
}

/// A maps read that hangs (a process whose mmap lock is held by a fault on
/// a dead mount) costs the caller, the drain thread, one deadline; the
/// next process is read while it still hangs.
#[test]
fn a_hung_maps_read_does_not_hold_the_drain_thread() {
    const HUNG: u32 = 0x7fff_fff0;
    let stats = Arc::new(Stats::default());
    let mut table = table(Path::new("/proc"), stats.clone());
    let (release, hang) = std::sync::mpsc::channel::<()>();
    let hang = Mutex::new(hang);
    let entered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hung_entered = entered.clone();
    table.read_maps = Arc::new(move |proc_root: &Path, pid| {
        if pid == HUNG {
            hung_entered.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = hang.lock().unwrap_or_else(|p| p.into_inner()).recv();
        }
        read_maps(proc_root, pid)
    });
    let started = Instant::now();
    let image = table.image(HUNG, "stuck");
    let waited = started.elapsed();
    assert!(
        entered.load(std::sync::atomic::Ordering::SeqCst),
        "the read ran"
    );
    assert!(image.gone, "no mappings known");
    assert_eq!(image.comm, "stuck");
    assert!(waited >= MAPS_DEADLINE, "{waited:?}");
    assert!(
        waited < MAPS_DEADLINE + Duration::from_secs(2),
        "{waited:?}"
    );
    let counted = stats.snapshot();
    assert_eq!(counted.untrusted_refused_timed_out, 1);
    assert_eq!(counted.maps_read_failures, 1);
    // Still hanging: this process's maps are read, within the deadline,
    // on a new helper.
    let own = table.image(std::process::id(), "me");
    assert!(!own.gone);
    assert!(own.mapping_index(own_address()).is_some());
    release.send(()).expect("the hung read still waits");
}

#[test]
fn with_exit_maps_a_new_program_is_held_until_settled_or_captured() {
    let stats = Arc::new(Stats::default());
    let root = tempfile::tempdir().expect("tempdir");
    let process = root.path().join("42");
    std::fs::create_dir_all(&process).expect("mkdir");
    let program = "55d4e0a01000-55d4e0a02000 r-xp 00001000 fe:01 7 /usr/bin/short\n";
    std::fs::write(process.join("maps"), program).expect("write");
    let mut table = table(root.path(), stats.clone());

    // Without the kernel's capture nothing is held, and nothing waits.
    table.on_exec(42, "short", true);
    assert!(!table.unread(42), "read at its exec");
    assert!(!table.holds(42, "short"));

    table.set_captures_exit_maps(true);
    table.on_exec(42, "short", false);
    assert!(!table.unread(42));
    assert!(table.holds(42, "short"), "read at its exec: unsettled");
    assert!(table.settle(42, "short"), "alive: its maps read again");
    assert!(!table.holds(42, "short"));

    // Deferred: read neither at its exec nor at its first sample (a
    // process that is never sampled, or exits before its samples settle,
    // costs no read), but when its samples settle.
    std::fs::remove_file(process.join("maps")).expect("rm");
    table.on_exec(42, "short", true);
    assert!(table.unread(42));
    assert!(table.lookup(42).is_none(), "not read yet");
    assert_eq!(stats.snapshot().maps_deferred, 1);
    assert!(table.holds(42, "short"), "held unread");
    assert!(table.unread(42), "not read at its first sample");
    std::fs::write(process.join("maps"), program).expect("write");
    assert!(table.settle(42, "short"), "alive: read as it settles");
    assert!(!table.unread(42));
    let image = table.lookup(42).expect("read");
    assert_eq!(image.comm, "short", "the exec event's name");
    assert!(image.mapping_index(0x55d4_e0a0_1800).is_some());
    assert!(!table.holds(42, "short"));

    // Deferred, then another program (or its exit without a capture):
    // never read, so its samples are not placed in the next image's maps.
    table.on_exec(42, "short", true);
    table.unreadable(42);
    assert!(!table.unread(42));
    assert!(table.lookup(42).expect("kept").gone);

    // Gone before its samples were drained, its exit not yet handled:
    // held for the capture, which replaces the image.
    table.on_exec(42, "short", false);
    std::fs::remove_dir_all(&process).expect("rm");
    assert!(!table.settle(42, "short"), "gone: nothing to read");
    assert!(table.holds(42, "short"));
    table.install_captured(
        42,
        "short",
        vec![
            spec(0x55d4_e0a0_1000, 0x55d4_e0a0_2000, "/usr/bin/short"),
            spec(0x7f00_0000_1000, 0x7f00_0000_9000, "/usr/lib/libc.so.6"),
        ],
    );
    table.on_exit(42);
    let image = table.lookup(42).expect("kept");
    assert!(image.mapping_index(0x7f00_0000_2000).is_some());
    assert_eq!(image.comm, "short");
    assert!(!table.holds(42, "short"));
    assert_eq!(stats.snapshot().exit_maps_installed, 1);
    // First seen gone (a fork, or a process older than firn), its exit
    // still to come: held for that; once its exit is handled, not.
    assert!(table.holds(43, "other"));
    table.on_exit(43);
    assert!(!table.holds(43, "other"));
}
