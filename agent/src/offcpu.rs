//! Off-CPU profiles (`--off-cpu`): what a wait's record says turned into
//! the `off_cpu_reason` label, and the profile made to say what its values
//! are. The sampling itself is the BPF side's (`agent-ebpf/src/offcpu.rs`).

use std::path::{Path, PathBuf};

use agent_common::OffCpuInfo;
use agent_pprof::proto;

/// The pprof sample type of the time waited: each sample's value is its
/// periods times the period, nanoseconds.
pub const SAMPLE_TYPE: &str = "off_cpu";

/// `TASK_UNINTERRUPTIBLE`: a wait nothing but its event ends (disk I/O,
/// a page being read in, some kernel locks).
const UNINTERRUPTIBLE: u32 = 2;

/// Why a thread waited, from the task state it left in and its system
/// call (x86-64 numbers): `futex` (locks, condition variables, joins),
/// `sleep`, `poll` (poll, select, epoll), `io` (reads and writes of files,
/// pipes and sockets, accept, connect), `wait` (for a child), `disk` (an
/// uninterruptible wait in any other call), `other`.
pub fn reason(wait: &OffCpuInfo) -> &'static str {
    match wait.syscall {
        202 | 449 => "futex",
        35 | 230 | 34 => "sleep",
        7 | 23 | 232 | 270 | 271 | 281 | 441 => "poll",
        0 | 1 | 17 | 18 | 19 | 20 | 42 | 43 | 44 | 45 | 46 | 47 | 288 | 295 | 296 | 299 | 307
        | 327 | 328 => "io",
        61 | 247 => "wait",
        _ if wait.state & UNINTERRUPTIBLE != 0 => "disk",
        _ => "other",
    }
}

/// Turns a profile built like a CPU one (`samples`/`count` and
/// `cpu`/`nanoseconds`, period the off-CPU period) into an off-CPU one:
/// the time values become `off_cpu`/`nanoseconds`, the count stays the
/// number of periods waited.
pub fn mark_profile(profile: &mut proto::Profile) {
    let name = intern(profile, SAMPLE_TYPE);
    if let Some(time) = profile.sample_type.get_mut(1) {
        time.r#type = name;
    }
    if let Some(period) = profile.period_type.as_mut() {
        period.r#type = name;
    }
}

fn intern(profile: &mut proto::Profile, text: &str) -> i64 {
    match profile.string_table.iter().position(|s| s == text) {
        Some(index) => index as i64,
        None => {
            profile.string_table.push(text.to_owned());
            (profile.string_table.len() - 1) as i64
        }
    }
}

/// Where `firn record` writes the off-CPU profile beside `output` (and
/// its flame graph beside the CPU one's): `NAME.offcpu.EXT`, the
/// extension being everything after the name's first dot
/// (`profile.pb.gz` -> `profile.offcpu.pb.gz`).
pub fn beside(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let renamed = match name.split_once('.') {
        Some((stem, extension)) if !stem.is_empty() => format!("{stem}.offcpu.{extension}"),
        _ => format!("{name}.offcpu"),
    };
    output.with_file_name(renamed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(syscall: i32, state: u32) -> OffCpuInfo {
        OffCpuInfo {
            periods: 1,
            blocked_ns: 1,
            state,
            syscall,
        }
    }

    #[test]
    fn reasons_come_from_the_call_then_the_state() {
        assert_eq!(reason(&wait(202, 1)), "futex");
        assert_eq!(reason(&wait(230, 1)), "sleep");
        assert_eq!(reason(&wait(0, 1)), "io");
        assert_eq!(reason(&wait(232, 1)), "poll");
        assert_eq!(reason(&wait(74, 2)), "disk", "fsync, uninterruptible");
        assert_eq!(reason(&wait(74, 1)), "other");
    }

    #[test]
    fn the_off_cpu_profile_goes_beside_the_cpu_one() {
        assert_eq!(
            beside(Path::new("/tmp/p.pb.gz")),
            Path::new("/tmp/p.offcpu.pb.gz")
        );
        assert_eq!(beside(Path::new("out.svg")), Path::new("out.offcpu.svg"));
        assert_eq!(beside(Path::new("profile")), Path::new("profile.offcpu"));
    }
}
