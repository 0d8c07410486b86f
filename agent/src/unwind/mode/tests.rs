use std::{path::PathBuf, sync::Mutex};

use super::*;
use crate::{
    process::{DebugFileConfig, ProcessTableConfig},
    unwind::UnwinderConfig,
};

/// The leaf copy the tests' policies give frame-pointer processes.
const LEAF: u32 = 1024;

#[derive(Default)]
struct FakeMap {
    entries: Arc<Mutex<Vec<(u32, u32)>>>,
    threads: Arc<Mutex<Vec<(u32, u64)>>>,
    presets: Presets,
    full: bool,
}

impl CopySizeMap for FakeMap {
    fn set(&mut self, tgid: u32, bytes: u32) -> Result<(), CopyMapError> {
        if self.full {
            return Err(CopyMapError {
                tgid,
                source: "full".into(),
            });
        }
        // The flag every DWARF process has is left out of what the
        // tests compare.
        let bytes = bytes & !UNWIND_COPY_BY_THREAD;
        self.entries.lock().expect("lock").push((tgid, bytes));
        Ok(())
    }

    fn set_thread(&mut self, tid: u32, end: u64) -> Result<(), ThreadStackError> {
        self.threads.lock().expect("lock").push((tid, end));
        Ok(())
    }

    fn remove_thread(&mut self, tid: u32) {
        self.threads
            .lock()
            .expect("lock")
            .retain(|&(entry, _)| entry != tid);
    }

    fn remove(&mut self, tgid: u32) {
        self.entries
            .lock()
            .expect("lock")
            .retain(|&(entry, _)| entry != tgid);
    }

    fn set_exec_preset(
        &mut self,
        executable: agent_common::ExecutableKey,
        entry: u32,
    ) -> Result<(), ExecPresetError> {
        if self.full {
            return Err(ExecPresetError {
                executable,
                source: "full".into(),
            });
        }
        self.presets.lock().expect("lock").push((executable, entry));
        Ok(())
    }
}

/// The (tgid, bytes) a `FakeMap` was given, in order.
type Written = Arc<Mutex<Vec<(u32, u32)>>>;

/// An `auto` policy with a 8 KiB copy over a map that records every
/// size written, in order.
fn auto_policy(stats: Arc<Stats>) -> (UnwindPolicy, Written) {
    let entries = Arc::new(Mutex::new(Vec::new()));
    let map = FakeMap {
        entries: entries.clone(),
        ..FakeMap::default()
    };
    let policy = UnwindPolicy::new(UnwindMode::Auto, 8192, 8, stats).with_map(Box::new(map), LEAF);
    (policy, entries)
}

fn setup() -> (Arc<Stats>, ProcessTable, Unwinder) {
    let stats = Arc::new(Stats::default());
    let processes = ProcessTable::new(
        "/proc".into(),
        &ProcessTableConfig::default(),
        &DebugFileConfig {
            directories: Vec::new(),
        },
        stats.clone(),
    );
    let unwinder = Unwinder::new(
        &UnwinderConfig {
            cache_bytes: 1 << 20,
        },
        stats.clone(),
    );
    (stats, processes, unwinder)
}

#[test]
fn fixed_modes_need_no_look_at_the_process() {
    let (stats, mut processes, mut unwinder) = setup();
    let image = processes.image(std::process::id(), "me");
    for (mode, expected) in [
        (UnwindMode::FramePointers, ProcessUnwinding::FramePointers),
        (UnwindMode::Dwarf, ProcessUnwinding::Dwarf),
    ] {
        let mut policy = UnwindPolicy::new(mode, 16384, 8, stats.clone());
        assert_eq!(
            policy.decide(&image, &mut processes, &mut unwinder),
            expected
        );
    }
    assert_eq!(stats.snapshot().unwind_dwarf_images, 0);
}

/// A fixture binary running as a child (killed on drop), and the
/// directory its file lives in (when it wrote the file).
struct Child(std::process::Child, Option<tempfile::TempDir>);

impl Child {
    fn spawn(bytes: &[u8]) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("workload");
        std::fs::write(&path, bytes).expect("write the fixture");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut child = Self::run(&path);
        child.1 = Some(dir);
        child
    }

    /// Runs `path` and waits (at most 5 s) until the loader has mapped
    /// libc: until then the image is incomplete.
    fn run(path: &Path) -> Self {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // A child another test thread forked while the fixture was being
        // written holds the file open for writing until it executes: the
        // exec fails with ETXTBSY meanwhile.
        let process = loop {
            match std::process::Command::new(path).arg("1000").spawn() {
                Ok(process) => break process,
                Err(error)
                    if error.kind() == std::io::ErrorKind::ExecutableFileBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(error) => panic!("the fixture runs: {error}"),
            }
        };
        let child = Self(process, None);
        let maps = format!("/proc/{}/maps", child.0.id());
        while !std::fs::read_to_string(&maps).is_ok_and(|maps| maps.contains("libc")) {
            assert!(
                std::time::Instant::now() < deadline,
                "the fixture did not map libc within 5 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child
    }

    fn path(&self) -> PathBuf {
        self.1
            .as_ref()
            .expect("a fixture file")
            .path()
            .join("workload")
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn auto_decides_from_the_objects_and_writes_the_map() {
    let (stats, mut processes, mut unwinder) = setup();
    let (mut policy, entries) = auto_policy(stats.clone());

    let framed = Child::spawn(agent_fixtures::CHAIN);
    let image = processes.image(framed.0.id(), "chain");
    assert_eq!(
        policy.decide(&image, &mut processes, &mut unwinder),
        ProcessUnwinding::FramePointers
    );
    // Undecided processes get the full copy: a decided one with frame
    // pointers gets the leaf copy.
    assert_eq!(*entries.lock().expect("lock"), [(framed.0.id(), LEAF)]);

    let frameless = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let pid = frameless.0.id();
    let image = processes.image(pid, "chain_inline");
    assert_eq!(
        policy.decide(&image, &mut processes, &mut unwinder),
        ProcessUnwinding::Dwarf
    );
    // Decided once per image.
    policy.decide(&image, &mut processes, &mut unwinder);
    assert_eq!(
        *entries.lock().expect("lock"),
        [(framed.0.id(), LEAF), (pid, 8192)]
    );
    let snapshot = stats.snapshot();
    assert_eq!(
        (snapshot.unwind_dwarf_images, snapshot.unwind_fp_images),
        (1, 1)
    );

    // Exit: the BPF program removed the entry; a sweep leaves live
    // processes alone.
    policy.on_exit(pid);
    policy.sweep(Path::new("/proc"));
    assert_eq!(entries.lock().expect("lock").len(), 2);
}

#[test]
fn the_copy_is_fitted_to_the_stacks_unwinds_need() {
    let (stats, mut processes, mut unwinder) = setup();
    let (mut policy, entries) = auto_policy(stats.clone());
    let frameless = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let pid = frameless.0.id();
    let image = processes.image(pid, "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    let sizes = || -> Vec<u32> {
        entries
            .lock()
            .expect("lock")
            .iter()
            .map(|&(_, bytes)| bytes)
            .collect()
    };
    for _ in 1..SHRINK_AFTER {
        policy.observe_stack(&image, StackNeed::Used(1000), 8192);
    }
    assert_eq!(sizes(), [8192], "not before enough unwinds");
    policy.observe_stack(&image, StackNeed::Used(600), 8192);
    // 1000 + 250 + 1024, up to the next 512.
    assert_eq!(sizes(), [8192, 2560]);
    // A copy that ended short of the size asked (the stack's top) is
    // no reason to grow.
    policy.observe_stack(&image, StackNeed::MoreThanCopied, 1000);
    assert_eq!(sizes(), [8192, 2560]);
    // A stack that did not fit: at once to the most the BPF program
    // copies, and for good, as the process outgrew its fitted copy.
    let max = MAX_STACK_COPY as u32;
    policy.observe_stack(&image, StackNeed::MoreThanCopied, 2560);
    assert_eq!(sizes(), [8192, 2560, max]);
    for _ in 0..2 * SHRINK_AFTER {
        policy.observe_stack(&image, StackNeed::Used(100), max as usize);
    }
    policy.observe_stack(&image, StackNeed::MoreThanCopied, max as usize);
    assert_eq!(sizes(), [8192, 2560, max]);
    let snapshot = stats.snapshot();
    assert_eq!(
        (snapshot.unwind_copy_shrunk, snapshot.unwind_copy_grown),
        (1, 1)
    );
}

/// A DWARF process whose unwinds complete over the copy loses the
/// kernel's walk of its stack (flagged in its entry, kept through a
/// resize); a frame-pointer one keeps it whatever it is told.
#[test]
fn the_walk_is_skipped_for_processes_unwound_from_the_copy_alone() {
    let (stats, mut processes, mut unwinder) = setup();
    let (mut policy, entries) = auto_policy(stats.clone());
    let frameless = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let pid = frameless.0.id();
    let image = processes.image(pid, "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    let framed = Child::spawn(agent_fixtures::CHAIN);
    let framed_image = processes.image(framed.0.id(), "chain");
    policy.decide(&framed_image, &mut processes, &mut unwinder);
    for _ in 0..SHRINK_AFTER {
        policy.observe_walk(&image, WalkUse::Unneeded);
        policy.observe_walk(&framed_image, WalkUse::Unneeded);
    }
    let no_walk = 8192 | UNWIND_COPY_NO_WALK;
    assert_eq!(
        *entries.lock().expect("lock"),
        [(pid, 8192), (framed.0.id(), LEAF), (pid, no_walk)]
    );
    policy.observe_stack(&image, StackNeed::MoreThanCopied, 8192);
    let last = entries.lock().expect("lock").last().copied();
    assert_eq!(
        last,
        Some((pid, MAX_STACK_COPY as u32 | UNWIND_COPY_NO_WALK))
    );
    assert_eq!(stats.snapshot().unwind_walk_skipped, 1);
}

/// A DWARF process's threads get their copies bounded where their
/// unwinds end; a frame-pointer process's threads never.
#[test]
fn threads_of_dwarf_processes_are_copied_up_to_their_stacks_end() {
    let (stats, mut processes, mut unwinder) = setup();
    let threads = Arc::new(Mutex::new(Vec::new()));
    let map = FakeMap {
        threads: threads.clone(),
        ..FakeMap::default()
    };
    let mut policy =
        UnwindPolicy::new(UnwindMode::Auto, 8192, 8, stats.clone()).with_map(Box::new(map), LEAF);
    let frameless = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let image = processes.image(frameless.0.id(), "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    let framed = Child::spawn(agent_fixtures::CHAIN);
    let framed_image = processes.image(framed.0.id(), "chain");
    policy.decide(&framed_image, &mut processes, &mut unwinder);
    for _ in 0..16 {
        policy.observe_thread(&image, (7, 0x7000), StackNeed::Used(0x100), 8192);
        policy.observe_thread(&framed_image, (8, 0x7000), StackNeed::Used(0x100), 8192);
    }
    assert_eq!(*threads.lock().expect("lock"), [(7, 0x7100 + 512)]);
    assert_eq!(stats.snapshot().unwind_thread_stack_set, 1);
    assert_eq!(
        entry(4096, ProcessUnwinding::Dwarf, false),
        4096 | UNWIND_COPY_BY_THREAD | UNWIND_COPY_NO_WALK
    );
    assert_eq!(entry(LEAF, ProcessUnwinding::FramePointers, true), LEAF);
}

#[test]
fn the_next_process_of_an_executable_starts_with_the_copy_it_needed() {
    let (stats, mut processes, mut unwinder) = setup();
    let (mut policy, entries) = auto_policy(stats);
    let first = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let image = processes.image(first.0.id(), "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    policy.observe_stack(&image, StackNeed::MoreThanCopied, 8192);
    // The same file run again.
    let second = Child::run(&first.path());
    let image = processes.image(second.0.id(), "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    let max = MAX_STACK_COPY as u32;
    assert_eq!(
        *entries.lock().expect("lock"),
        [
            (first.0.id(), 8192),
            (first.0.id(), max),
            (second.0.id(), max)
        ]
    );
}

/// A copy fitted to one process would cut the first samples of the
/// next whose stacks run deeper: the next process starts with what
/// every earlier one needed, short ones that never fitted included.
#[test]
fn the_learned_copy_covers_every_earlier_process_of_the_executable() {
    let (stats, mut processes, mut unwinder) = setup();
    let (mut policy, entries) = auto_policy(stats);
    let short = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let image = processes.image(short.0.id(), "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    for _ in 0..10 {
        policy.observe_stack(&image, StackNeed::Used(4000), 8192);
    }
    let long = Child::run(&short.path());
    let image = processes.image(long.0.id(), "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    for _ in 0..SHRINK_AFTER {
        policy.observe_stack(&image, StackNeed::Used(1000), 8192);
    }
    let next = Child::run(&short.path());
    let image = processes.image(next.0.id(), "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    assert_eq!(
        *entries.lock().expect("lock"),
        [
            (short.0.id(), 8192),
            (long.0.id(), 8192),
            // Its own stacks: 1000 + 250 + 1024, up to the next 512.
            (long.0.id(), 2560),
            // The short process's 4000 + 1000 + 1024, up to 512.
            (next.0.id(), 6144),
        ]
    );
}

#[test]
fn a_deep_process_grows_then_fits_its_deepest_stacks() {
    let (stats, mut processes, mut unwinder) = setup();
    let (mut policy, entries) = auto_policy(stats.clone());
    let frameless = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let image = processes.image(frameless.0.id(), "chain_inline");
    policy.decide(&image, &mut processes, &mut unwinder);
    policy.observe_stack(&image, StackNeed::MoreThanCopied, 8192);
    for _ in 0..SHRINK_AFTER {
        policy.observe_stack(&image, StackNeed::Used(20_000), MAX_STACK_COPY);
    }
    let sizes: Vec<u32> = entries.lock().expect("lock").iter().map(|e| e.1).collect();
    // 20 000 + 5 000 + 1 024, up to the next 512.
    assert_eq!(sizes, [8192, MAX_STACK_COPY as u32, 26_112]);
}

#[test]
fn stacks_without_frame_pointers_switch_a_process_to_dwarf() {
    let (stats, mut processes, mut unwinder) = setup();
    let (mut policy, entries) = auto_policy(stats.clone());
    let framed = Child::spawn(agent_fixtures::CHAIN);
    let image = processes.image(framed.0.id(), "chain");
    policy.decide(&image, &mut processes, &mut unwinder);
    policy.require_dwarf(&image);
    assert_eq!(
        policy.decide(&image, &mut processes, &mut unwinder),
        ProcessUnwinding::Dwarf
    );
    assert_eq!(
        *entries.lock().expect("lock"),
        [(framed.0.id(), LEAF), (framed.0.id(), 8192)]
    );
    assert_eq!(stats.snapshot().unwind_switched_to_dwarf, 1);
}

#[test]
fn a_full_map_is_counted() {
    let (stats, mut processes, mut unwinder) = setup();
    let map = FakeMap {
        full: true,
        ..FakeMap::default()
    };
    let mut policy =
        UnwindPolicy::new(UnwindMode::Auto, 8192, 8, stats.clone()).with_map(Box::new(map), LEAF);
    let frameless = Child::spawn(agent_fixtures::CHAIN_INLINE);
    let image = processes.image(frameless.0.id(), "chain_inline");
    assert_eq!(
        policy.decide(&image, &mut processes, &mut unwinder),
        ProcessUnwinding::Dwarf
    );
    assert_eq!(stats.snapshot().unwind_copy_map_failures, 1);
}

#[test]
fn entries_of_vanished_processes_are_swept() {
    let stats = Arc::new(Stats::default());
    let entries = Arc::new(Mutex::new(vec![(4_194_305, 8192)]));
    let map = FakeMap {
        entries: entries.clone(),
        ..FakeMap::default()
    };
    let mut policy =
        UnwindPolicy::new(UnwindMode::Auto, 8192, 8, stats).with_map(Box::new(map), LEAF);
    // An exec the daemon saw, of a process gone before it was decided.
    policy.on_exec(4_194_305);
    let dir = tempfile::tempdir().expect("tempdir");
    policy.sweep(dir.path());
    assert!(entries.lock().expect("lock").is_empty());
}

#[test]
fn system_library_paths() {
    assert!(is_system_library("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    assert!(is_system_library("/lib64/ld-linux-x86-64.so.2"));
    assert!(!is_system_library("/usr/bin/python3"));
    assert!(!is_system_library("/opt/app/lib/libapp.so"));
    assert!(!is_system_library("/usr/library/x"));
    // A mapping is judged once, by its path.
    let mapping = |path: &str| {
        crate::process::Mapping::new(crate::process::MappingSpec {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            dev: 1,
            inode: 2,
            path: path.into(),
            kind: crate::process::MappingKind::File,
            deleted: false,
        })
    };
    assert!(mapping("/usr/lib/x86_64-linux-gnu/libc.so.6").system);
    assert!(!mapping("/opt/app/lib/libapp.so").system);
}

/// The (executable, entry) presets a `FakeMap` was given, in order.
type Presets = Arc<Mutex<Vec<(agent_common::ExecutableKey, u32)>>>;

/// A policy in `mode` over a map that records the presets written (or
/// refuses them all when `full`), and an executable to preset.
fn preset_policy(
    mode: UnwindMode,
    full: bool,
    stats: Arc<Stats>,
) -> (UnwindPolicy, Presets, agent_common::ExecutableKey) {
    let presets = Arc::new(Mutex::new(Vec::new()));
    let map = FakeMap {
        presets: presets.clone(),
        full,
        ..FakeMap::default()
    };
    let policy = UnwindPolicy::new(mode, 8192, 8, stats).with_map(Box::new(map), LEAF);
    let executable = agent_common::ExecutableKey {
        inode: 7,
        dev: 0x80_0001,
        reserved: 0,
    };
    (policy, presets, executable)
}

#[test]
fn an_executables_preset_is_written_for_the_bpf_program_once_per_value() {
    let stats = Arc::new(Stats::default());
    let (mut policy, presets, executable) = preset_policy(UnwindMode::Auto, false, stats.clone());
    policy.publish_preset(executable, Preset::frame_pointers());
    policy.publish_preset(executable, Preset::frame_pointers());
    // Another copy for the same executable is written again.
    policy.publish_preset(executable, Preset::dwarf());
    assert_eq!(
        *presets.lock().expect("lock"),
        vec![
            (executable, LEAF),
            (executable, 8192 | UNWIND_COPY_BY_THREAD)
        ]
    );
    assert_eq!(stats.snapshot().unwind_exec_presets_set, 2);

    // Outside `auto` every process gets the configured copy: no preset.
    let (mut fixed, fixed_presets, executable) = preset_policy(UnwindMode::Dwarf, false, stats);
    fixed.publish_preset(executable, Preset::dwarf());
    assert!(fixed_presets.lock().expect("lock").is_empty());
}

#[test]
fn a_preset_the_map_refuses_is_counted_and_not_remembered() {
    let stats = Arc::new(Stats::default());
    let (mut policy, _, executable) = preset_policy(UnwindMode::Auto, true, stats.clone());
    policy.publish_preset(executable, Preset::frame_pointers());
    policy.publish_preset(executable, Preset::frame_pointers());
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.unwind_exec_presets_set, 0);
    assert_eq!(
        snapshot.unwind_copy_map_failures, 2,
        "tried again, not remembered"
    );
}
