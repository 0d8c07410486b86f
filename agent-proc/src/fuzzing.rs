//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for the
//! `/proc` files of other processes. Each parses the bytes and then does
//! with the result what firn does with it. None may panic, hang or
//! allocate without bound on any input.

use std::path::Path;

use crate::{
    cgroup::CgroupInfo,
    maps::{executable, mapping_index, parse_maps},
    mountinfo::FuseMounts,
};

/// `/proc/PID/maps`, and the lookups firn makes in what it holds.
pub fn proc_maps(data: &[u8]) {
    let Ok(specs) = parse_maps(1, data) else {
        return;
    };
    for spec in &specs {
        for address in [spec.start, spec.end, spec.end.wrapping_sub(1)] {
            let _ = mapping_index(&specs, address);
        }
    }
    let _ = executable(&specs);
}

/// `/proc/PID/cgroup`.
pub fn cgroup(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = CgroupInfo::parse(text);
    }
}

/// `/proc/PID/mountinfo`: mount points are names a process chooses.
pub fn mountinfo(data: &[u8]) {
    let mounts = FuseMounts::parse(&String::from_utf8_lossy(data));
    for path in [
        "/",
        "/usr/lib/debug/.build-id/ab/cd.debug",
        "tmp/perf-1.map",
    ] {
        let _ = mounts.covers(Path::new(path));
    }
    let _ = mounts.has_device(0);
}

#[cfg(test)]
agent_fixtures::replays! {
    "proc_maps" => proc_maps,
    "cgroup" => cgroup,
    "mountinfo" => mountinfo,
}
