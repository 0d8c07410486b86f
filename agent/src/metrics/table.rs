//! Which counter feeds which metric: every field of `stats::Stats` and
//! every BPF-side `Counter` has one row here (tests enforce it), grouped
//! into families with labels where several counters are one question
//! ("why were samples lost?"). A new counter gets a row, and a family if
//! none fits.

use agent_common::Counter;

pub use super::families::{FAMILIES, Family, Kind};

/// Where a series' value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A field of `StatsSnapshot`, by name.
    Stat(&'static str),
    /// A counter of the BPF program, summed over CPUs.
    Bpf(Counter),
}

/// One series: a source, its family and its labels.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub source: Source,
    pub family: &'static str,
    pub labels: &'static [(&'static str, &'static str)],
}

const fn stat(
    field: &'static str,
    family: &'static str,
    labels: &'static [(&'static str, &'static str)],
) -> Row {
    Row {
        source: Source::Stat(field),
        family,
        labels,
    }
}

const fn bpf(
    counter: Counter,
    family: &'static str,
    labels: &'static [(&'static str, &'static str)],
) -> Row {
    Row {
        source: Source::Bpf(counter),
        family,
        labels,
    }
}

/// Every source, once.
pub const ROWS: &[Row] = &[
    stat("samples_received", "samples", &[]),
    bpf(
        Counter::SamplesLostRingFull,
        "samples_lost",
        &[("reason", "ring_buffer_full")],
    ),
    bpf(
        Counter::ScratchUnavailable,
        "samples_lost",
        &[("reason", "scratch_unavailable")],
    ),
    stat(
        "samples_dropped_stack_limit",
        "samples_lost",
        &[("reason", "max_stacks_per_profile")],
    ),
    stat(
        "samples_dropped_relabel",
        "samples_dropped_by_relabeling",
        &[],
    ),
    bpf(Counter::SamplesSeen, "bpf_samples_seen", &[]),
    bpf(Counter::SamplesWritten, "bpf_samples_written", &[]),
    bpf(
        Counter::IdleSkipped,
        "bpf_samples_skipped",
        &[("reason", "idle")],
    ),
    bpf(
        Counter::Filtered,
        "bpf_samples_skipped",
        &[("reason", "pid_filter")],
    ),
    bpf(Counter::StackCopyShort, "bpf_stack_copies_short", &[]),
    stat(
        "stacks_truncated_kernel",
        "stacks_truncated",
        &[("stack", "kernel"), ("reason", "max_depth")],
    ),
    stat(
        "stacks_truncated_user",
        "stacks_truncated",
        &[("stack", "user"), ("reason", "max_depth")],
    ),
    bpf(
        Counter::KernelStackFailed,
        "unwind_failures",
        &[("reason", "kernel_stack")],
    ),
    bpf(
        Counter::UserStackFailed,
        "unwind_failures",
        &[("reason", "user_stack")],
    ),
    bpf(
        Counter::UserRegsFailed,
        "unwind_failures",
        &[("reason", "user_registers")],
    ),
    stat(
        "leaf_repair_failures",
        "unwind_failures",
        &[("reason", "leaf_repair")],
    ),
    stat("leaf_frames_repaired", "leaf_frames_repaired", &[]),
    stat(
        "unwind_truncated",
        "stacks_truncated",
        &[("stack", "user"), ("reason", "beyond_stack_copy")],
    ),
    stat(
        "unwind_failed_no_cfi",
        "unwind_failures",
        &[("reason", "no_cfi")],
    ),
    stat(
        "unwind_failed_unmapped",
        "unwind_failures",
        &[("reason", "unmapped")],
    ),
    stat(
        "unwind_failed_unsupported_rule",
        "unwind_failures",
        &[("reason", "unsupported_rule")],
    ),
    stat(
        "unwind_failed_not_progressing",
        "unwind_failures",
        &[("reason", "not_progressing")],
    ),
    stat(
        "unwind_failed_too_deep",
        "unwind_failures",
        &[("reason", "too_deep")],
    ),
    stat(
        "unwind_without_registers",
        "unwind_failures",
        &[("reason", "no_user_registers")],
    ),
    stat("unwind_dwarf_stacks", "unwind_dwarf_stacks", &[]),
    stat("unwind_dwarf_complete", "unwind_dwarf_stacks_complete", &[]),
    stat("unwind_stitched", "unwind_dwarf_stacks_stitched", &[]),
    stat(
        "unwind_rbp_frames",
        "unwind_frames_without_cfi",
        &[("kind", "frame_pointer")],
    ),
    stat(
        "unwind_signal_frames",
        "unwind_frames_without_cfi",
        &[("kind", "signal")],
    ),
    stat(
        "unwind_dwarf_images",
        "unwind_images_decided",
        &[("unwinding", "dwarf")],
    ),
    stat(
        "unwind_fp_images",
        "unwind_images_decided",
        &[("unwinding", "frame_pointers")],
    ),
    stat(
        "unwind_switched_to_dwarf",
        "unwind_images_switched_to_dwarf",
        &[],
    ),
    bpf(
        Counter::UnwindCopyMapFull,
        "unwind_copy_map_failures",
        &[("reason", "map_full")],
    ),
    stat(
        "unwind_copy_map_failures",
        "unwind_copy_map_failures",
        &[("reason", "update_failed")],
    ),
    stat(
        "user_frames_unknown",
        "frames_unsymbolized",
        &[("stack", "user"), ("reason", "unmapped")],
    ),
    stat(
        "user_frames_unsymbolized",
        "frames_unsymbolized",
        &[("stack", "user"), ("reason", "no_symbol")],
    ),
    stat(
        "kernel_frames_unsymbolized",
        "frames_unsymbolized",
        &[("stack", "kernel"), ("reason", "no_symbol")],
    ),
    stat(
        "symbol_cache_hits",
        "symbolizer_cache_hits",
        &[("cache", "symbol_table")],
    ),
    stat(
        "symbol_cache_misses",
        "symbolizer_cache_misses",
        &[("cache", "symbol_table")],
    ),
    stat(
        "symbol_cache_evictions",
        "symbolizer_cache_evictions",
        &[("cache", "symbol_table")],
    ),
    stat(
        "debuginfo_cache_hits",
        "symbolizer_cache_hits",
        &[("cache", "dwarf")],
    ),
    stat(
        "debuginfo_cache_misses",
        "symbolizer_cache_misses",
        &[("cache", "dwarf")],
    ),
    stat(
        "debuginfo_cache_evictions",
        "symbolizer_cache_evictions",
        &[("cache", "dwarf")],
    ),
    stat(
        "perf_map_cache_hits",
        "symbolizer_cache_hits",
        &[("cache", "perf_map")],
    ),
    stat(
        "perf_map_cache_misses",
        "symbolizer_cache_misses",
        &[("cache", "perf_map")],
    ),
    stat(
        "perf_map_cache_evictions",
        "symbolizer_cache_evictions",
        &[("cache", "perf_map")],
    ),
    stat(
        "symbol_table_errors",
        "symbolizer_errors",
        &[("kind", "symbol_table")],
    ),
    stat("dwarf_errors", "symbolizer_errors", &[("kind", "dwarf")]),
    stat(
        "perf_map_parse_errors",
        "symbolizer_errors",
        &[("kind", "perf_map")],
    ),
    stat(
        "debuginfo_too_large",
        "symbolizer_limited",
        &[("reason", "dwarf_too_large")],
    ),
    stat(
        "perf_maps_truncated",
        "symbolizer_limited",
        &[("reason", "perf_map_truncated")],
    ),
    stat("debug_files_found", "debug_files", &[("result", "found")]),
    stat(
        "debug_files_rejected",
        "debug_files",
        &[("result", "rejected")],
    ),
    stat(
        "unwind_cache_hits",
        "cache_hits",
        &[("cache", "unwind_table")],
    ),
    stat(
        "unwind_cache_misses",
        "cache_misses",
        &[("cache", "unwind_table")],
    ),
    stat(
        "unwind_cache_evictions",
        "cache_evictions",
        &[("cache", "unwind_table")],
    ),
    stat(
        "process_metadata_cache_hits",
        "cache_hits",
        &[("cache", "process_metadata")],
    ),
    stat(
        "process_metadata_cache_misses",
        "cache_misses",
        &[("cache", "process_metadata")],
    ),
    stat(
        "process_metadata_cache_evictions",
        "cache_evictions",
        &[("cache", "process_metadata")],
    ),
    stat("cgroup_cache_hits", "cache_hits", &[("cache", "cgroup")]),
    stat(
        "cgroup_cache_misses",
        "cache_misses",
        &[("cache", "cgroup")],
    ),
    stat(
        "cgroup_cache_evictions",
        "cache_evictions",
        &[("cache", "cgroup")],
    ),
    stat("records_malformed", "ring_buffer_records_malformed", &[]),
    stat("process_events", "process_events", &[]),
    bpf(
        Counter::ProcessEventsLost,
        "process_events_lost",
        &[("reason", "ring_buffer_full")],
    ),
    stat(
        "processes_gone",
        "process_maps_read_failures",
        &[("reason", "exited")],
    ),
    stat(
        "maps_read_failures",
        "process_maps_read_failures",
        &[("reason", "error")],
    ),
    stat("maps_refreshed", "process_maps_refreshed", &[]),
    stat("processes_evicted", "processes_evicted", &[]),
    stat("objects_opened", "objects_opened", &[]),
    stat("object_open_failures", "object_open_failures", &[]),
    stat("mapped_pages_truncated", "mapped_file_pages_truncated", &[]),
    stat(
        "stage_stalled_drain",
        "stage_stalled",
        &[("stage", "drain")],
    ),
    stat(
        "stage_stalled_build",
        "stage_stalled",
        &[("stage", "build")],
    ),
    stat(
        "untrusted_refused_not_regular",
        "untrusted_files_refused",
        &[("reason", "not_regular")],
    ),
    stat(
        "untrusted_refused_too_large",
        "untrusted_files_refused",
        &[("reason", "too_large")],
    ),
    stat(
        "untrusted_refused_fuse",
        "untrusted_files_refused",
        &[("reason", "fuse")],
    ),
    stat(
        "untrusted_refused_timed_out",
        "untrusted_files_refused",
        &[("reason", "timed_out")],
    ),
    stat("objects_evicted", "objects_evicted", &[]),
    stat("processes_tracked", "processes_tracked", &[]),
    stat("objects_tracked", "objects_tracked", &[]),
    stat("profiles_written", "profiles_written", &[]),
    stat("remote_profiles_sent", "profiles_sent", &[]),
    stat(
        "profiles_dropped",
        "profiles_dropped",
        &[("reason", "pipeline")],
    ),
    stat(
        "remote_profiles_dropped",
        "profiles_dropped",
        &[("reason", "queue")],
    ),
    stat(
        "remote_profiles_rejected",
        "profiles_dropped",
        &[("reason", "rejected")],
    ),
    stat("local_profiles_deleted", "local_profiles_deleted", &[]),
    stat("remote_send_failures", "push_failures", &[]),
    stat("remote_send_retries", "push_retries", &[]),
    stat("remote_queue_bytes", "queue_bytes", &[]),
    stat("remote_queue_profiles", "queue_profiles", &[]),
    stat(
        "debuginfo_uploads",
        "debuginfo_uploads",
        &[("result", "uploaded")],
    ),
    stat(
        "debuginfo_upload_failures",
        "debuginfo_uploads",
        &[("result", "failed")],
    ),
    stat(
        "debuginfo_uploads_skipped",
        "debuginfo_uploads",
        &[("result", "skipped")],
    ),
    stat("kubernetes_watch_events", "kubernetes_watch_events", &[]),
    stat("kubernetes_watch_errors", "kubernetes_watch_errors", &[]),
    stat("kubernetes_pods_skipped", "kubernetes_pods_skipped", &[]),
];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::stats::StatsSnapshot;

    #[test]
    fn every_stats_field_has_exactly_one_row() {
        let fields: Vec<&str> = StatsSnapshot::default()
            .fields()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        for field in &fields {
            let rows = ROWS
                .iter()
                .filter(|row| row.source == Source::Stat(field))
                .count();
            assert_eq!(
                rows, 1,
                "stats field `{field}` needs exactly one row in metrics::table::ROWS"
            );
        }
        for row in ROWS {
            if let Source::Stat(field) = row.source {
                assert!(fields.contains(&field), "no stats field `{field}`");
            }
        }
    }

    #[test]
    fn every_bpf_counter_has_exactly_one_row() {
        for counter in Counter::ALL {
            let rows = ROWS
                .iter()
                .filter(|row| row.source == Source::Bpf(counter))
                .count();
            assert_eq!(rows, 1, "{counter:?} needs exactly one row");
        }
    }

    #[test]
    fn rows_name_known_families_with_distinct_label_sets() {
        let valid = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let mut names = HashSet::new();
        for family in FAMILIES {
            assert!(valid(family.name), "{}", family.name);
            assert!(names.insert(family.name), "{} twice", family.name);
            assert!(
                !family.name.ends_with("_total"),
                "{}: the encoder adds _total",
                family.name
            );
            assert!(
                ROWS.iter().any(|row| row.family == family.name),
                "{} has no rows",
                family.name
            );
        }
        let mut series = HashSet::new();
        for row in ROWS {
            assert!(names.contains(row.family), "unknown family {}", row.family);
            for (key, _) in row.labels {
                assert!(valid(key), "{key}");
            }
            assert!(
                series.insert((row.family, row.labels)),
                "{} {:?} twice",
                row.family,
                row.labels
            );
        }
    }
}
