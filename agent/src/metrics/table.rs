//! Which counter feeds which metric: every field of `stats::Stats` and
//! every BPF-side `Counter` has one row here (tests enforce it), grouped
//! into families with labels where several counters are one question
//! ("why were samples lost?"). A new counter gets a row, and a family if
//! none fits.

use agent_common::Counter;

/// Where a series' value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A field of `StatsSnapshot`, by name.
    Stat(&'static str),
    /// A counter of the BPF program, summed over CPUs.
    Bpf(Counter),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One metric family. `name` is without the `firn_` prefix and, for
/// counters, without `_total` (the encoder adds both).
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

/// One series: a source, its family and its labels.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub source: Source,
    pub family: &'static str,
    pub labels: &'static [(&'static str, &'static str)],
}

const fn family(name: &'static str, kind: Kind, help: &'static str) -> Family {
    Family { name, kind, help }
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

use Kind::{Counter as C, Gauge as G};

/// In the order they are exposed.
pub const FAMILIES: &[Family] = &[
    family(
        "samples",
        C,
        "Samples read from the ring buffer and handled (unwound and aggregated).",
    ),
    family(
        "samples_lost",
        C,
        "Samples lost before reaching a profile, by reason: ring_buffer_full (firn read too \
         slowly; see --ring-buffer-size), scratch_unavailable (BPF), max_stacks_per_profile \
         (the profile's --max-stacks-per-profile was reached).",
    ),
    family(
        "samples_dropped_by_relabeling",
        C,
        "Samples left out because relabel_configs dropped their process.",
    ),
    family(
        "bpf_samples_seen",
        C,
        "Times the BPF sampling program ran (each tick of each CPU's clock).",
    ),
    family(
        "bpf_samples_written",
        C,
        "Samples the BPF program wrote into the ring buffer.",
    ),
    family(
        "bpf_samples_skipped",
        C,
        "Ticks the BPF program skipped on purpose, by reason: idle (the idle task), \
         pid_filter (a process outside --pid).",
    ),
    family(
        "bpf_stack_copies_short",
        C,
        "Samples whose copy of the user stack ended short of what was asked (end of the \
         stack mapping or an unmapped page).",
    ),
    family(
        "stacks_truncated",
        C,
        "Stacks cut short, by stack (kernel, user) and reason: max_depth (the stack filled \
         the BPF stack walk's 127 frames).",
    ),
    family(
        "unwind_failures",
        C,
        "Stacks or frames that could not be unwound, by reason: kernel_stack and user_stack \
         (the kernel's stack walk failed), user_registers (the task's user registers could \
         not be read), leaf_repair (no CFI recovered a leaf frame's caller).",
    ),
    family(
        "leaf_frames_repaired",
        C,
        "Leaf frames whose caller was recovered with CFI from the copied stack.",
    ),
    family(
        "frames_unsymbolized",
        C,
        "Frames firn could not name (kept as addresses), by stack and reason: unmapped \
         (outside every known mapping: process gone, JIT), no_symbol (no symbol covers \
         the address).",
    ),
    family(
        "symbolizer_cache_hits",
        C,
        "Symbolizer cache lookups answered from the cache, by cache.",
    ),
    family(
        "symbolizer_cache_misses",
        C,
        "Symbolizer cache lookups that had to read the object, by cache.",
    ),
    family(
        "symbolizer_cache_evictions",
        C,
        "Entries the symbolizer caches dropped to stay within their size, by cache.",
    ),
    family(
        "symbolizer_errors",
        C,
        "Debug information that could not be used, by kind: symbol_table (malformed ELF \
         symbol tables), dwarf (malformed or truncated DWARF), perf_map (perf map lines \
         that did not parse).",
    ),
    family(
        "symbolizer_limited",
        C,
        "What the symbolizer read only in part to stay within its caches, by reason: \
         dwarf_too_large (the object's frames are named from its symbol table), \
         perf_map_truncated (a perf map larger than --perf-map-cache-size).",
    ),
    family(
        "debug_files",
        C,
        "Separate debug files looked at, by result: found (matched their object by build \
         id or CRC), rejected (did not match or did not parse).",
    ),
    family("cache_hits", C, "Other caches' lookups answered, by cache."),
    family(
        "cache_misses",
        C,
        "Other caches' lookups that had to do the work, by cache.",
    ),
    family(
        "cache_evictions",
        C,
        "Entries other caches dropped to stay within their size, by cache.",
    ),
    family(
        "ring_buffer_records_malformed",
        C,
        "Ring buffer records that could not be decoded.",
    ),
    family(
        "process_events",
        C,
        "Exec and exit events read from the ring buffer.",
    ),
    family(
        "process_events_lost",
        C,
        "Exec and exit events lost because the ring buffer was full.",
    ),
    family(
        "process_maps_read_failures",
        C,
        "Reads of /proc/PID/maps that failed, by reason: exited (the process was gone), \
         error.",
    ),
    family(
        "process_maps_refreshed",
        C,
        "Memory maps read again because an address fell outside every known mapping.",
    ),
    family(
        "processes_evicted",
        C,
        "Processes dropped from the process table to stay within its size.",
    ),
    family("objects_opened", C, "ELF objects opened."),
    family(
        "object_open_failures",
        C,
        "ELF objects that could not be opened or parsed.",
    ),
    family(
        "objects_evicted",
        C,
        "ELF objects dropped from the registry to stay within its size.",
    ),
    family(
        "processes_tracked",
        G,
        "Processes in the process table (exited ones stay for a grace period).",
    ),
    family("objects_tracked", G, "ELF objects kept open."),
    family(
        "profiles_written",
        C,
        "Profiles handed to the exporter: a file written to the local store, or an \
         interval queued for the remote store.",
    ),
    family(
        "profiles_sent",
        C,
        "Profiles (one per series) the remote store accepted.",
    ),
    family(
        "profiles_dropped",
        C,
        "Profiles lost, by reason: pipeline (the builder was behind or the exporter \
         failed), queue (the remote store queue was full, or the shutdown deadline came), \
         rejected (the remote store refused them for good).",
    ),
    family(
        "local_profiles_deleted",
        C,
        "Old local profiles deleted to stay within --local-store-max-bytes.",
    ),
    family(
        "push_failures",
        C,
        "Pushes to the remote store that failed, every attempt counted.",
    ),
    family(
        "push_retries",
        C,
        "Pushes to the remote store that were retries of a failed one.",
    ),
    family(
        "queue_bytes",
        G,
        "Bytes of profiles waiting to be sent to the remote store (bounded by \
         --remote-store-queue-bytes).",
    ),
    family(
        "debuginfo_uploads",
        C,
        "Debug information uploads to the remote store, by result: uploaded, failed \
         (retried later), skipped (not wanted, none found, or the backlog was full).",
    ),
    family(
        "kubernetes_watch_events",
        C,
        "Pod watch events read from the Kubernetes API server.",
    ),
    family(
        "kubernetes_watch_errors",
        C,
        "Failed lists or watches of pods, and malformed events or pods.",
    ),
    family(
        "kubernetes_pods_skipped",
        C,
        "Pods not indexed because the pod index was full.",
    ),
];

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
