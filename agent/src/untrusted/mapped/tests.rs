use std::{os::unix::process::ExitStatusExt, process::Command};

use super::*;

/// A file of three pages, mapped, then truncated to nothing.
fn truncated_under(map: impl FnOnce(&File) -> io::Result<()>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("object");
    std::fs::write(&path, vec![0xab; 3 * 4096]).expect("write");
    let file = File::open(&path).expect("open");
    map(&file).expect("map");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing")
        .set_len(0)
        .expect("truncate");
    dir
}

#[test]
fn a_mapped_file_truncated_underneath_reads_as_zeros() {
    guard_mapped_files().expect("handler installed");
    let mut mapped = None;
    let _dir = truncated_under(|file| {
        mapped = Some(MappedFile::map(file)?);
        Ok(())
    });
    let map = mapped.expect("mapped");
    let before = truncated_pages();
    assert_eq!(map[3 * 4096 - 1], 0, "a page of zeros instead of SIGBUS");
    assert_eq!(map[4096], 0);
    assert!(truncated_pages() >= before + 2);
    let start = map.as_ptr() as usize;
    assert!(RANGES.covers(start));
    drop(map);
    assert!(!RANGES.covers(start), "unregistered when unmapped");
}

#[test]
fn slots_are_reused_and_a_full_table_refuses() {
    let ranges = Ranges::<4>::new();
    let base = 0x7000_0000_0000_usize;
    let slots: Vec<Option<usize>> = (0..4)
        .map(|i| ranges.register(base + i * 0x1000, base + (i + 1) * 0x1000))
        .collect();
    assert_eq!(slots, [Some(0), Some(1), Some(2), Some(3)]);
    assert_eq!(ranges.register(base + 0x10_0000, base + 0x11_0000), None);
    assert!(ranges.covers(base + 0x1800));
    assert!(!ranges.covers(base + 0x4000), "the end is not inside");
    assert!(!ranges.covers(base - 1));
    ranges.unregister(1);
    assert!(!ranges.covers(base + 0x1800));
    assert_eq!(ranges.register(base + 0x10_0000, base + 0x11_0000), Some(1));
    assert!(ranges.covers(base + 0x10_0fff));
}

/// Runs [`sigbus_child`] in a child process, in `mode`.
fn child(mode: &str) -> std::process::ExitStatus {
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "untrusted::mapped::tests::sigbus_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FIRN_SIGBUS_CHILD", mode)
        .output()
        .expect("child runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("handler installed"), "{mode}: {stdout}");
    output.status
}

/// Any SIGBUS outside firn's registered mappings kills as if there were no
/// handler: a fault in another mapping, and one sent by another process.
/// A registered mapping's truncation, in the same child, is survived.
#[test]
fn other_bus_errors_still_kill() {
    assert!(
        child("registered").success(),
        "a registered mapping survives"
    );
    for mode in ["unregistered", "sent"] {
        let status = child(mode);
        assert_eq!(status.signal(), Some(libc::SIGBUS), "{mode}: {status:?}");
    }
}

/// Not a test of its own: the child process of [`other_bus_errors_still_kill`].
#[test]
#[ignore = "run by other_bus_errors_still_kill in a child process"]
fn sigbus_child() {
    let Ok(mode) = std::env::var("FIRN_SIGBUS_CHILD") else {
        return;
    };
    // No core file for the deaths that are the point.
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit with a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
    guard_mapped_files().expect("handler");
    println!("handler installed");
    match mode.as_str() {
        "registered" => {
            let mut mapped = None;
            let _dir = truncated_under(|file| {
                mapped = Some(MappedFile::map(file)?);
                Ok(())
            });
            assert_eq!(mapped.expect("mapped")[4096], 0);
        }
        "unregistered" => {
            let mut mapped = None;
            let _dir = truncated_under(|file| {
                // SAFETY: the point of the test: an unguarded mapping.
                mapped = Some(unsafe { memmap2::Mmap::map(file) }?);
                Ok(())
            });
            let map = mapped.expect("mapped");
            let byte = std::hint::black_box(&map[..])[4096];
            println!("survived with {byte}");
        }
        "sent" => {
            // SAFETY: raise has no preconditions.
            unsafe { libc::raise(libc::SIGBUS) };
            println!("survived");
        }
        other => panic!("unknown mode {other}"),
    }
}
