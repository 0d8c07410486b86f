//! What reading a process's executable mappings costs: the kernel's
//! `PROCMAP_QUERY` (one executable mapping a call, Linux 6.11+) against the
//! text of `/proc/PID/maps` (every mapping printed, parsed, most dropped).
//! Measured on this process as it is (a small Rust program's few dozen
//! mappings), then with 2000 more data mappings (a JVM's or a Go
//! program's heap and thread stacks), then on each PID given.
//!
//! `cargo bench -p firn --bench maps -- [PID ...]`. Under `cargo test` it
//! reads once each way, as a smoke test. Prints figures, asserts nothing
//! about speed.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use firn::process::{MappingSpec, read_maps, read_maps_as_text};

/// Data mappings added to this process for the second case.
const EXTRA_MAPPINGS: usize = 2000;
/// How long each way is timed per process.
const BUDGET: Duration = Duration::from_millis(500);

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let benchmarking = arguments.iter().any(|a| a == "--bench");
    let pids: Vec<u32> = arguments.iter().filter_map(|a| a.parse().ok()).collect();
    let own = std::process::id();
    let proc_root = Path::new("/proc");

    println!(
        "{:<28} {:>8} {:>6} {:>12} {:>12} {:>7}",
        "process", "mappings", "kept", "query, us", "text, us", "ratio"
    );
    compare("this process", proc_root, own, benchmarking);
    let _extra = DataMappings::new(EXTRA_MAPPINGS);
    compare(
        &format!("this process, +{EXTRA_MAPPINGS} data"),
        proc_root,
        own,
        benchmarking,
    );
    for pid in pids {
        compare(&format!("pid {pid}"), proc_root, pid, benchmarking);
    }
}

fn compare(name: &str, proc_root: &Path, pid: u32, benchmarking: bool) {
    let lines = std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps"))
        .map(|text| text.lines().count())
        .unwrap_or(0);
    let queried = time(|| read_maps(proc_root, pid), benchmarking);
    let text = time(|| read_maps_as_text(proc_root, pid), benchmarking);
    match (queried, text) {
        (Some((query_us, kept)), Some((text_us, text_kept))) => {
            if kept != text_kept {
                eprintln!("{name}: the two ways disagree ({kept} and {text_kept} mappings)");
                std::process::exit(1);
            }
            println!(
                "{name:<28} {lines:>8} {kept:>6} {query_us:>12.1} {text_us:>12.1} {:>6.2}x",
                text_us / query_us
            );
        }
        _ => println!("{name:<28} unreadable"),
    }
}

/// Microseconds per read and the mappings kept, or None when unreadable.
fn time<E>(
    mut read: impl FnMut() -> Result<Vec<MappingSpec>, E>,
    benchmarking: bool,
) -> Option<(f64, usize)> {
    let kept = read().ok()?.len();
    if !benchmarking {
        return Some((1.0, kept));
    }
    let started = Instant::now();
    let mut reads = 0u32;
    while started.elapsed() < BUDGET {
        read().ok()?;
        reads += 1;
    }
    Some((
        started.elapsed().as_secs_f64() * 1e6 / f64::from(reads),
        kept,
    ))
}

/// Pages mapped one by one, alternately read-only and read-write so that
/// the kernel does not merge them; unmapped when dropped.
struct DataMappings(Vec<(*mut libc::c_void, usize)>);

impl DataMappings {
    fn new(count: usize) -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let mut mappings = Vec::with_capacity(count);
        for index in 0..count {
            let protection = match index % 2 {
                0 => libc::PROT_READ,
                _ => libc::PROT_READ | libc::PROT_WRITE,
            };
            // SAFETY: a fresh anonymous mapping, no address asked for.
            let address = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page,
                    protection,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if address != libc::MAP_FAILED {
                mappings.push((address, page));
            }
        }
        Self(mappings)
    }
}

impl Drop for DataMappings {
    fn drop(&mut self) {
        for &(address, length) in &self.0 {
            // SAFETY: mapped by `new`, unmapped once.
            unsafe { libc::munmap(address, length) };
        }
    }
}
