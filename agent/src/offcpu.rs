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

/// How a server names an off-CPU profile, so its UI shows it as the
/// off-CPU profile of the agents it knows: the series' `__name__`, the
/// time value's sample type and the period type (none: the server's
/// profile type has empty period fields). The count stays
/// `samples/count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerNames {
    pub series: &'static str,
    pub time: &'static str,
    pub period: Option<(&'static str, &'static str)>,
}

/// Parca Agent's off-CPU profile, which Parca's UI lists as "Off-CPU":
/// `parca_agent:wallclock:nanoseconds:samples:count:delta`.
pub const PARCA: ServerNames = ServerNames {
    series: "parca_agent",
    time: "wallclock",
    period: Some(("samples", "count")),
};

/// Grafana Alloy's `pyroscope.ebpf` off-CPU profile:
/// `offcpu:offcpu:nanoseconds::` in Pyroscope.
pub const PYROSCOPE: ServerNames = ServerNames {
    series: "offcpu",
    time: "offcpu",
    period: None,
};

#[derive(Debug, thiserror::Error)]
pub enum RenameError {
    #[error("an off-CPU profile firn built does not decode")]
    Decode {
        #[source]
        source: agent_pprof::PprofError,
    },
}

/// `gzipped`, an off-CPU profile as [`mark_profile`] made it, with the
/// value and period names `names` gives. With a period type of counts,
/// the period is one (a sample is its own count).
pub fn rename(gzipped: &[u8], names: &ServerNames) -> Result<Vec<u8>, RenameError> {
    let mut profile =
        agent_pprof::decode(gzipped).map_err(|source| RenameError::Decode { source })?;
    let time = intern(&mut profile, names.time);
    if let Some(value) = profile.sample_type.get_mut(1) {
        value.r#type = time;
    }
    match names.period {
        Some((kind, unit)) => {
            let (kind, unit) = (intern(&mut profile, kind), intern(&mut profile, unit));
            profile.period_type = Some(proto::ValueType { r#type: kind, unit });
            profile.period = 1;
        }
        None => {
            profile.period_type = None;
            profile.period = 1;
        }
    }
    Ok(agent_pprof::encode_gzip(&profile))
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
    beside_as(output, "offcpu")
}

/// [`beside`] with another infix: `NAME.INFIX.EXT` (`wall`, for the
/// wall-clock view).
pub fn beside_as(output: &Path, infix: &str) -> PathBuf {
    let name = output
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let renamed = match name.split_once('.') {
        Some((stem, extension)) if !stem.is_empty() => format!("{stem}.{infix}.{extension}"),
        _ => format!("{name}.{infix}"),
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
    fn each_server_gets_the_off_cpu_names_it_knows() {
        let strings = ["", "samples", "count", "cpu", "nanoseconds"];
        let value = |kind, unit| proto::ValueType { r#type: kind, unit };
        let mut profile = proto::Profile {
            string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
            sample_type: vec![value(1, 2), value(3, 4)],
            period_type: Some(value(3, 4)),
            period: 10_000_000,
            sample: vec![proto::Sample {
                value: vec![3, 30_000_000],
                ..Default::default()
            }],
            ..Default::default()
        };
        mark_profile(&mut profile);
        let gzipped = agent_pprof::encode_gzip(&profile);
        let text = |p: &proto::Profile, t: &proto::ValueType| {
            (
                p.string_table[t.r#type as usize].clone(),
                p.string_table[t.unit as usize].clone(),
            )
        };
        let types = |p: &proto::Profile| -> Vec<(String, String)> {
            p.sample_type.iter().map(|t| text(p, t)).collect()
        };
        assert_eq!(
            types(&profile),
            [("samples", "count"), ("off_cpu", "nanoseconds")].map(|(a, b)| (a.into(), b.into()))
        );
        let parca =
            agent_pprof::decode(&rename(&gzipped, &PARCA).expect("renamed")).expect("pprof");
        assert_eq!(
            types(&parca),
            [("samples", "count"), ("wallclock", "nanoseconds")].map(|(a, b)| (a.into(), b.into()))
        );
        assert_eq!(
            text(&parca, parca.period_type.as_ref().expect("period type")),
            ("samples".into(), "count".into())
        );
        let pyroscope =
            agent_pprof::decode(&rename(&gzipped, &PYROSCOPE).expect("renamed")).expect("pprof");
        assert_eq!(
            types(&pyroscope),
            [("samples", "count"), ("offcpu", "nanoseconds")].map(|(a, b)| (a.into(), b.into()))
        );
        assert_eq!(pyroscope.period_type, None);
        for renamed in [&parca, &pyroscope] {
            assert_eq!(renamed.sample[0].value, [3, 30_000_000], "values unchanged");
        }
        assert!(rename(b"not a profile", &PARCA).is_err());
    }

    #[test]
    fn the_off_cpu_profile_goes_beside_the_cpu_one() {
        assert_eq!(
            beside(Path::new("/tmp/p.pb.gz")),
            Path::new("/tmp/p.offcpu.pb.gz")
        );
        assert_eq!(beside(Path::new("out.svg")), Path::new("out.offcpu.svg"));
        assert_eq!(beside(Path::new("profile")), Path::new("profile.offcpu"));
        assert_eq!(
            beside_as(Path::new("/tmp/p.pb.gz"), "wall"),
            Path::new("/tmp/p.wall.pb.gz")
        );
    }
}
