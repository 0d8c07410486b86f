//! The metric families firn exposes: name, type and help. Which counter
//! feeds which family is in `table`.

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

const fn family(name: &'static str, kind: Kind, help: &'static str) -> Family {
    Family { name, kind, help }
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
         the BPF stack walk's 127 frames), beyond_stack_copy (the DWARF unwind went on past \
         the copied stack; see --stack-copy-bytes; the frames up to there are kept).",
    ),
    family(
        "unwind_failures",
        C,
        "Stacks or frames that could not be unwound, by reason: kernel_stack and user_stack \
         (the kernel's stack walk failed), user_registers (the task's user registers could \
         not be read), leaf_repair (no CFI recovered a leaf frame's caller); and DWARF \
         unwinds that stopped early: no_cfi (code without CFI where rbp led nowhere), \
         unmapped (an address outside every mapping), unsupported_rule (a CFI rule firn \
         does not evaluate), not_progressing (the CFA did not move up: corrupt CFI or \
         stack), too_deep (the frame limit), no_user_registers (a DWARF process's sample \
         came without registers; the kernel's frame-pointer walk is kept).",
    ),
    family(
        "unwind_dwarf_stacks",
        C,
        "User stacks unwound in firn with DWARF CFI over the copied stack.",
    ),
    family(
        "unwind_dwarf_stacks_complete",
        C,
        "DWARF-unwound stacks that reached the outermost frame.",
    ),
    family(
        "unwind_dwarf_stacks_stitched",
        C,
        "DWARF-unwound stacks that stopped short and were continued with the kernel's \
         frame-pointer walk.",
    ),
    family(
        "unwind_frames_without_cfi",
        C,
        "Frames the DWARF unwinder stepped over without CFI, by kind: frame_pointer (code \
         without CFI, such as JIT code, unwound by following rbp), signal (signal \
         trampolines).",
    ),
    family(
        "unwind_images_decided",
        C,
        "Process images --unwind auto looked at, by the unwinding chosen: dwarf (the \
         stack is copied for them) or frame_pointers (nothing extra is copied).",
    ),
    family(
        "unwind_images_switched_to_dwarf",
        C,
        "Images left to frame pointers whose stacks then showed callers without frame \
         pointers, switched to DWARF.",
    ),
    family(
        "unwind_copy_map_failures",
        C,
        "Processes whose stack copy size could not be set, by reason: map_full (the BPF \
         UNWIND_COPY map was full when a new image ran), update_failed (firn's update of \
         the map failed).",
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
        "mapped_file_pages_truncated",
        C,
        "Pages of mapped objects and debug files that were cut off by their file shrinking \
         underneath (read as zeros instead of crashing).",
    ),
    family(
        "stage_stalled",
        G,
        "1 while a stage makes no progress on work it took up: drain (the ring buffer \
         reader), build (symbolizing and writing or queueing profiles). /ready answers 503 \
         meanwhile, and /healthy too once it lasts.",
    ),
    family(
        "untrusted_files_refused",
        C,
        "Files another process controls (objects, debug files, perf maps) that firn would not \
         read, by reason: not_regular (a FIFO, socket, device or directory), too_large, fuse \
         (served by a process that may never answer), timed_out (opening it missed its \
         deadline).",
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
        "Profiles written: a file per interval in the local store, or a profile per \
         series queued for the remote store. For the remote store written = sent + \
         dropped (reasons queue and rejected) + queue_profiles, all in profiles.",
    ),
    family(
        "profiles_sent",
        C,
        "Profiles (one per series) the remote store accepted.",
    ),
    family(
        "profiles_dropped",
        C,
        "Profiles lost, by reason: pipeline (never written: the builder was behind, a \
         whole interval counting as one, or the exporter failed), queue (the remote \
         store queue was full, or the shutdown deadline came), rejected (the remote \
         store refused them for good).",
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
        "queue_profiles",
        G,
        "Profiles (series) waiting to be sent to the remote store, or being sent.",
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
