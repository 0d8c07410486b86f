use std::{os::unix::fs::MetadataExt, path::Path};

use super::*;

/// A host whose `/proc` is `dir`, without a cgroup hierarchy.
fn fake_host(dir: &Path) -> Host {
    Host::at(dir.to_path_buf(), dir.join("sys"))
}

#[test]
fn own_process_is_read_once_then_served_from_the_cache() {
    let stats = Arc::new(Stats::default());
    let mut reader =
        MetadataReader::new(&Host::system(), &MetadataLimits::default(), stats.clone());
    let pid = std::process::id();
    let (first, fresh) = reader.get(pid, 7);
    assert!(fresh);
    assert_eq!(first.pid, pid);
    let exe = std::env::current_exe().expect("own path");
    assert_eq!(
        first.executable_name(),
        exe.file_name().and_then(|n| n.to_str())
    );
    assert!(!first.cmdline.is_empty());
    assert!(!first.cgroup.path.is_empty());
    let (second, fresh) = reader.get(pid, 7);
    assert!(!fresh);
    assert!(Arc::ptr_eq(&first, &second));
    let snapshot = stats.snapshot();
    assert_eq!(
        (
            snapshot.process_metadata_cache_misses,
            snapshot.process_metadata_cache_hits
        ),
        (1, 1)
    );
    assert_eq!(snapshot.cgroup_cache_misses, 1);
    reader.forget(pid);
    let (third, fresh) = reader.get(pid, 7);
    assert!(fresh && !Arc::ptr_eq(&first, &third));
    assert_eq!(stats.snapshot().cgroup_cache_hits, 1, "same cgroup text");
}

#[test]
fn metadata_expires_by_the_time_given() {
    let stats = Arc::new(Stats::default());
    let limits = MetadataLimits::default();
    let mut reader = MetadataReader::new(&Host::system(), &limits, stats);
    let pid = std::process::id();
    let batch = Instant::now();
    assert!(reader.get_at(pid, 7, batch).1);
    assert!(!reader.get_at(pid, 7, batch).1, "one read for the batch");
    let later = batch + limits.process_ttl + Duration::from_secs(1);
    assert!(reader.get_at(pid, 7, later).1, "read again once expired");
}

#[test]
fn a_vanished_process_gets_unknown_metadata() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut reader = MetadataReader::new(&fake_host(dir.path()), &MetadataLimits::default(), stats);
    let (metadata, _) = reader.get(4_194_305, 1);
    assert_eq!(*metadata, ProcessMetadata::unknown(4_194_305));
    assert_eq!(metadata.executable_name(), None);
}

#[test]
fn caches_are_bounded_expire_and_count_evictions() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    for pid in 1..=3 {
        let process = dir.path().join(pid.to_string());
        std::fs::create_dir(&process).expect("dir");
        std::fs::write(process.join("cgroup"), format!("0::/slice/{pid}.service\n"))
            .expect("cgroup");
        std::fs::write(process.join("cmdline"), b"prog\0--flag\0").expect("cmdline");
    }
    let limits = MetadataLimits {
        max_processes: 2,
        max_cgroups: 2,
        ..MetadataLimits::default()
    };
    let mut reader = MetadataReader::new(&fake_host(dir.path()), &limits, stats.clone());
    for pid in 1..=3 {
        let (metadata, _) = reader.get(pid, 1);
        assert_eq!(metadata.cmdline, "prog --flag");
        assert_eq!(
            metadata.cgroup.systemd_unit.as_deref(),
            Some(format!("{pid}.service").as_str())
        );
    }
    assert_eq!(reader.len(), 2);
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.process_metadata_cache_evictions, 1);
    assert_eq!(snapshot.cgroup_cache_evictions, 1);

    let mut cache = TtlCache::new(4, Duration::from_secs(10));
    let start = Instant::now();
    cache.insert("a", 1, start);
    assert_eq!(cache.get(&"a", start + Duration::from_secs(9)), Some(1));
    assert_eq!(cache.get(&"a", start + Duration::from_secs(10)), None);
    assert_eq!(cache.peek_stale(&"a").map(|(v, _)| v), Some(1));
}

/// A host laid out in `dir`: `proc/PID/{cgroup,cmdline}` for each
/// `(pid, cgroup text)` (no cgroup file where it is `None`) and a v2
/// hierarchy with a directory for each of `cgroups`, whose ids (inode
/// numbers) are returned in that order.
fn host_with(dir: &Path, processes: &[(u32, Option<&str>)], cgroups: &[&str]) -> (Host, Vec<u64>) {
    for (pid, text) in processes {
        let process = dir.join(format!("proc/{pid}"));
        std::fs::create_dir_all(&process).expect("pid dir");
        std::fs::write(process.join("cmdline"), format!("prog\0{pid}\0")).expect("cmdline");
        if let Some(text) = text {
            std::fs::write(process.join("cgroup"), text).expect("cgroup");
        }
    }
    let root = dir.join("sys/fs/cgroup");
    std::fs::create_dir_all(&root).expect("cgroup root");
    std::fs::write(root.join("cgroup.controllers"), "cpu memory\n").expect("controllers");
    let ids = cgroups
        .iter()
        .map(|path| {
            let cgroup = root.join(path);
            std::fs::create_dir_all(&cgroup).expect("cgroup dir");
            std::fs::metadata(&cgroup).expect("cgroup dir").ino()
        })
        .collect();
    (Host::at(dir.join("proc"), dir.join("sys")), ids)
}

#[test]
fn a_gone_process_gets_the_cgroup_facts_of_its_cgroup_id() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, ids) = host_with(
        dir.path(),
        &[(1, Some("0::/system.slice/app.service\n"))],
        &["system.slice/app.service", "system.slice/other.service"],
    );
    let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats.clone());
    let (live, _) = reader.get(1, ids[0]);
    assert_eq!(live.cmdline, "prog 1");
    assert_eq!(live.cgroup.systemd_unit.as_deref(), Some("app.service"));

    // Pid 2 is gone (no /proc/2) and its sample was taken in the cgroup
    // of pid 1.
    let (gone, _) = reader.get(2, ids[0]);
    assert!(Arc::ptr_eq(&gone.cgroup, &live.cgroup));
    assert_eq!((gone.pid, gone.cgroup_id), (2, ids[0]));
    assert_eq!(
        (gone.cmdline.as_str(), gone.executable.as_deref()),
        ("", None)
    );
    // Another cgroup no live process was read in: nothing known.
    let (unknown, _) = reader.get(3, ids[1]);
    assert_eq!(*unknown, ProcessMetadata::unknown(3));
    let snapshot = stats.snapshot();
    assert_eq!(
        (
            snapshot.process_metadata_from_cgroup_id,
            snapshot.process_metadata_unknown
        ),
        (1, 1)
    );
}

#[test]
fn a_v2_only_cgroup_file_is_not_read_again_for_a_known_id() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let unified = "0::/system.slice/app.service\n";
    let hybrid = "4:cpu:/\n0::/hybrid.scope\n";
    // Pids 2 and 4 have a command line but no cgroup file: where it
    // is read, they count as gone.
    let (host, ids) = host_with(
        dir.path(),
        &[(1, Some(unified)), (2, None), (3, Some(hybrid)), (4, None)],
        &["system.slice/app.service", "hybrid.scope"],
    );
    let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats.clone());
    let (first, _) = reader.get(1, ids[0]);
    let before = stats.snapshot();
    let (second, _) = reader.get(2, ids[0]);
    assert_eq!(second.cmdline, "prog 2", "read, without its cgroup file");
    assert!(Arc::ptr_eq(&second.cgroup, &first.cgroup));
    let after = stats.snapshot().since(&before);
    assert_eq!(after.cgroup_cache_hits + after.cgroup_cache_misses, 0);
    assert_eq!(after.cgroup_id_cache_hits, 1);

    // With v1 lines the text does not follow from the id: read.
    let (third, _) = reader.get(3, ids[1]);
    assert_eq!(third.cgroup.systemd_unit.as_deref(), Some("hybrid.scope"));
    let (fourth, _) = reader.get(4, ids[1]);
    assert_eq!(
        fourth.cmdline, "",
        "taken for gone: its cgroup file is missing"
    );
    assert!(Arc::ptr_eq(&fourth.cgroup, &third.cgroup));
    assert_eq!(stats.snapshot().process_metadata_from_cgroup_id, 1);
}

#[test]
fn an_id_is_learned_from_its_cgroup_not_from_a_sample_taken_before_a_move() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, ids) = host_with(
        dir.path(),
        &[(1, Some("0::/b.service\n"))],
        &["a.service", "b.service"],
    );
    let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats);
    // Sampled in a.service, read once it was in b.service.
    let (moved, _) = reader.get(1, ids[0]);
    assert_eq!(moved.cgroup.systemd_unit.as_deref(), Some("b.service"));
    assert_eq!(*reader.get(2, ids[0]).0, ProcessMetadata::unknown(2));
    let (gone, _) = reader.get(3, ids[1]);
    assert_eq!(gone.cgroup.systemd_unit.as_deref(), Some("b.service"));
}

#[test]
fn a_unit_made_again_is_learned_under_its_new_id() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, ids) = host_with(
        dir.path(),
        &[(1, Some("0::/a.service\n")), (2, Some("0::/a.service\n"))],
        &["a.service"],
    );
    let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats);
    reader.get(1, ids[0]);
    // Restarted: a new directory, so a new id, under the same path.
    let root = dir.path().join("sys/fs/cgroup");
    std::fs::rename(root.join("a.service"), root.join("old")).expect("rename");
    std::fs::create_dir(root.join("a.service")).expect("made again");
    let new_id = std::fs::metadata(root.join("a.service"))
        .expect("dir")
        .ino();
    assert_ne!(new_id, ids[0]);
    reader.get(2, new_id);
    let (gone, _) = reader.get(3, new_id);
    assert_eq!(gone.cgroup.systemd_unit.as_deref(), Some("a.service"));
}

#[test]
fn an_id_whose_processes_differ_in_v1_tells_nothing() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let container = format!("4:cpu:/docker/{}\n0::/shared.service\n", "a".repeat(64));
    let (host, ids) = host_with(
        dir.path(),
        &[
            (1, Some("4:cpu:/\n0::/shared.service\n")),
            (2, Some(&container)),
        ],
        &["shared.service"],
    );
    let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats);
    assert!(reader.get(1, ids[0]).0.cgroup.container.is_none());
    assert!(reader.get(2, ids[0]).0.cgroup.container.is_some());
    assert_eq!(*reader.get(3, ids[0]).0, ProcessMetadata::unknown(3));
}

#[test]
fn without_a_v2_hierarchy_nothing_is_learned() {
    let stats = Arc::new(Stats::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, ids) = host_with(dir.path(), &[(1, Some("0::/a.service\n"))], &["a.service"]);
    let host = Host::at(dir.path().join("proc"), dir.path().join("no-sys"));
    let mut reader = MetadataReader::new(&host, &MetadataLimits::default(), stats.clone());
    assert!(reader.get(1, ids[0]).0.cgroup.systemd_unit.is_some());
    assert_eq!(*reader.get(2, ids[0]).0, ProcessMetadata::unknown(2));
    assert_eq!(stats.snapshot().process_metadata_unknown, 1);
}

#[test]
fn an_image_ended_in_an_exec_is_not_read_again() {
    let stats = Arc::new(Stats::default());
    let mut reader =
        MetadataReader::new(&Host::system(), &MetadataLimits::default(), stats.clone());
    let pid = std::process::id();
    // Its samples are handled after the exec: /proc shows the next
    // program, so nothing is read for them.
    reader.image_ended(pid);
    let (metadata, _) = reader.get(pid, 7);
    assert_eq!(metadata.executable, None);
    assert!(metadata.cmdline.is_empty());
    // The next program's samples are read as usual.
    reader.forget(pid);
    let (metadata, fresh) = reader.get(pid, 7);
    assert!(fresh);
    assert!(!metadata.cmdline.is_empty());
    // What was read before the exec still labels the image's samples.
    reader.image_ended(pid);
    let (kept, fresh) = reader.get(pid, 7);
    assert!(!fresh && Arc::ptr_eq(&kept, &metadata));
}
