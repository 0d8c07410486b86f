//! Counters every stage updates: what was seen, dropped, unknown, cached.
//! Nothing is lost silently; the summaries log these and the metrics
//! endpoint exposes them (a new counter needs its row in
//! `metrics::table`, which a test enforces).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $name:ident ),* $(,)?) => {
        /// Monotonic counters, shared by the stages through an `Arc`.
        #[derive(Debug, Default)]
        pub struct Stats {
            $( $(#[doc = $doc])* pub $name: AtomicU64, )*
        }

        /// A point-in-time copy of [`Stats`].
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $( pub $name: u64, )*
        }

        impl Stats {
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }

        impl StatsSnapshot {
            /// Counter names and values, for logs and metrics.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }

            /// What happened since `earlier`.
            pub fn since(&self, earlier: &Self) -> Self {
                Self { $( $name: self.$name.saturating_sub(earlier.$name), )* }
            }
        }
    };
}

counters! {
    /// Sample records read from the ring buffer.
    samples_received,
    /// Ring buffer records that could not be decoded.
    records_malformed,
    /// Exec and exit events read from the ring buffer.
    process_events,
    /// Processes whose maps could not be read because they had exited.
    processes_gone,
    /// Other failures reading /proc/PID/maps.
    maps_read_failures,
    /// Processes dropped from the table to stay within its size.
    processes_evicted,
    /// Maps re-read because an address fell outside every known mapping.
    maps_refreshed,
    /// ELF objects opened.
    objects_opened,
    /// ELF objects that could not be opened or parsed.
    object_open_failures,
    /// Objects dropped from the registry to stay within its size.
    objects_evicted,
    /// Files of other processes (objects, debug files, perf maps) not read,
    /// by reason: a FIFO, device or directory; absurdly large; on FUSE;
    /// opening them missed its deadline.
    untrusted_refused_not_regular,
    untrusted_refused_too_large,
    untrusted_refused_fuse,
    untrusted_refused_timed_out,
    /// Pages of mapped objects and debug files read as zeros because the
    /// file shrank underneath (copied from `untrusted::truncated_pages`).
    mapped_pages_truncated,
    /// Gauges: 1 while a stage makes no progress (see `watchdog`).
    stage_stalled_drain,
    stage_stalled_build,
    /// Leaf frames whose caller was recovered with CFI.
    leaf_frames_repaired,
    /// Leaf frames where CFI could not be applied (no CFI, unsupported
    /// rule, or the return address lay beyond the stack copy).
    leaf_repair_failures,
    /// User frames outside every known mapping (process gone, JIT, ...).
    user_frames_unknown,
    /// User frames in a known object without a symbol for the address.
    user_frames_unsymbolized,
    /// Kernel frames without a kallsyms symbol.
    kernel_frames_unsymbolized,
    /// Samples not aggregated because the profile hit its stack limit.
    samples_dropped_stack_limit,
    /// Symbol table cache.
    symbol_cache_hits,
    symbol_cache_misses,
    symbol_cache_evictions,
    /// ELF symbol tables that could not be read (malformed objects).
    symbol_table_errors,
    /// DWARF cache (line tables and inline trees).
    debuginfo_cache_hits,
    debuginfo_cache_misses,
    debuginfo_cache_evictions,
    /// DWARF that could not be used: malformed or truncated sections.
    dwarf_errors,
    /// Objects whose DWARF would take more than the whole DWARF cache;
    /// their frames are named from the symbol table.
    debuginfo_too_large,
    /// Separate debug files that matched their object (build id or CRC).
    debug_files_found,
    /// Debug file candidates that did not match their object or did not
    /// parse.
    debug_files_rejected,
    /// JIT perf map cache.
    perf_map_cache_hits,
    perf_map_cache_misses,
    perf_map_cache_evictions,
    /// Perf map lines that did not parse.
    perf_map_parse_errors,
    /// Perf maps larger than the cache may read.
    perf_maps_truncated,
    /// Unwind table cache.
    unwind_cache_hits,
    unwind_cache_misses,
    unwind_cache_evictions,
    /// User stacks unwound with DWARF over the stack copy.
    unwind_dwarf_stacks,
    /// DWARF stacks unwound to the outermost frame.
    unwind_dwarf_complete,
    /// DWARF stacks that went on beyond the stack copy (kept as far as
    /// unwound).
    unwind_truncated,
    /// DWARF unwinds stopped at code without CFI where rbp led nowhere.
    unwind_failed_no_cfi,
    /// DWARF unwinds stopped at an address outside every mapping.
    unwind_failed_unmapped,
    /// DWARF unwinds stopped at a CFI rule firn does not evaluate.
    unwind_failed_unsupported_rule,
    /// DWARF unwinds stopped because the CFA did not move up the stack
    /// (corrupt CFI or stack).
    unwind_failed_not_progressing,
    /// DWARF unwinds stopped at the frame limit.
    unwind_failed_too_deep,
    /// DWARF stacks that stopped short and were continued with the
    /// kernel's frame-pointer walk.
    unwind_stitched,
    /// Frames without CFI unwound by following rbp (JIT code).
    unwind_rbp_frames,
    /// Signal frames unwound.
    unwind_signal_frames,
    /// Samples of DWARF processes without user registers (they keep the
    /// kernel's frame-pointer walk).
    unwind_without_registers,
    /// Process images `--unwind auto` decided to unwind with DWARF.
    unwind_dwarf_images,
    /// Process images `--unwind auto` left to frame pointers.
    unwind_fp_images,
    /// Of those, images whose stacks then held callers without frame
    /// pointers: switched to DWARF.
    unwind_switched_to_dwarf,
    /// Processes whose stack copy size could not be set in the BPF map.
    unwind_copy_map_failures,
    /// Profiles written locally (one file per interval) or queued for the
    /// remote store (one per series). For the remote store,
    /// `profiles_written = remote_profiles_sent + remote_profiles_dropped +
    /// remote_profiles_rejected + remote_queue_profiles`.
    profiles_written,
    /// Profiles lost before they were written (exporter failure, a profile
    /// that broke the pprof rules, or the builder behind: a whole interval,
    /// never cut into series, counts as one).
    profiles_dropped,
    /// Old local profiles deleted to respect the size limit.
    local_profiles_deleted,
    /// Profiles (one per series) the remote store accepted.
    remote_profiles_sent,
    /// Pushes to the remote store that failed, each attempt counted.
    remote_send_failures,
    /// Pushes that were attempts after a failure.
    remote_send_retries,
    /// Profiles dropped unsent: the queue was full (oldest first), or the
    /// shutdown deadline came.
    remote_profiles_dropped,
    /// Profiles the server refused for good (bad request, credentials).
    remote_profiles_rejected,
    /// Bytes of profiles waiting to be sent: a gauge, not a counter.
    remote_queue_bytes,
    /// Profiles (series) waiting to be sent or being sent: a gauge.
    remote_queue_profiles,
    /// Debug files uploaded to the remote store.
    debuginfo_uploads,
    /// Debug file uploads that failed (retried later).
    debuginfo_upload_failures,
    /// Objects not uploaded: the server did not want them, no debug
    /// information was found, or the upload backlog was full.
    debuginfo_uploads_skipped,
    /// Process metadata (cgroups, command line) served from the per-pid
    /// cache, read from /proc, or evicted to stay within its size.
    process_metadata_cache_hits,
    process_metadata_cache_misses,
    process_metadata_cache_evictions,
    /// Cgroup parses served from the per-cgroup cache, done, or evicted.
    cgroup_cache_hits,
    cgroup_cache_misses,
    cgroup_cache_evictions,
    /// Samples left out because relabeling dropped their process.
    samples_dropped_relabel,
    /// Pod watch events read from the Kubernetes API server.
    kubernetes_watch_events,
    /// Failed lists or watches of pods, and malformed events or pods.
    kubernetes_watch_errors,
    /// Pods not indexed because the index was full.
    kubernetes_pods_skipped,
    /// Samples whose kernel or user stack filled the BPF stack walk's
    /// 127 frames, so its outermost frames are most likely missing.
    stacks_truncated_kernel,
    stacks_truncated_user,
    /// Processes and objects in the process table: gauges, not counters.
    processes_tracked,
    objects_tracked,
}

impl Stats {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// For the few gauges among the counters.
    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_subtract() {
        let stats = Stats::default();
        Stats::add(&stats.samples_received, 5);
        let first = stats.snapshot();
        Stats::inc(&stats.samples_received);
        Stats::inc(&stats.records_malformed);
        let delta = stats.snapshot().since(&first);
        assert_eq!(delta.samples_received, 1);
        assert_eq!(delta.records_malformed, 1);
        assert!(
            delta
                .fields()
                .iter()
                .any(|&(name, value)| name == "records_malformed" && value == 1)
        );
    }
}
