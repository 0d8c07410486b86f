//! Every metric firn exposes, declared once (see `declare_metrics!`).

use std::sync::atomic::{AtomicU64, Ordering};

use agent_common::Counter;

use super::{Family, Kind, Row, Source, declare_metrics};

declare_metrics! {
    samples: Counter,
        "Samples read from the ring buffer and handled (unwound and aggregated)."
    {
        stats: [
            /// Sample records read from the ring buffer.
            samples_received {},
        ],
    }
    samples_lost: Counter,
        "Samples lost before reaching a profile, by reason: ring_buffer_full (firn read too \
        slowly; see --ring-buffer-size), scratch_unavailable (BPF), max_stacks_per_profile \
        (the profile's --max-stacks-per-profile was reached)."
    {
        stats: [
            /// Samples not aggregated because the profile hit its stack limit.
            samples_dropped_stack_limit { reason = "max_stacks_per_profile" },
        ],
        bpf: [
            SamplesLostRingFull { reason = "ring_buffer_full" },
            ScratchUnavailable { reason = "scratch_unavailable" },
        ],
    }
    samples_dropped_by_relabeling: Counter,
        "Samples left out because relabel_configs dropped their process."
    {
        stats: [
            /// Samples left out because relabeling dropped their process.
            samples_dropped_relabel {},
        ],
    }
    processes_excluded: Counter,
        "Processes relabel_configs drop, found on their first sample: their samples are \
        neither unwound nor symbolized (only where the rules read labels known at once; \
        with Kubernetes or container runtime labels the output stage drops them)."
    {
        stats: [
            /// Processes the keep/drop rules exclude, decided on their first sample.
            processes_excluded {},
        ],
    }
    samples_excluded: Counter,
        "Samples of processes relabel_configs drop, left out before unwinding, by where (at): \
        userspace (the process's first samples), bpf (the BPF program, told the process's \
        tgid, stopped before copying its stack)."
    {
        stats: [
            /// Samples of excluded processes left out before unwinding.
            samples_excluded { at = "userspace" },
        ],
        bpf: [
            Excluded { at = "bpf" },
        ],
    }
    exclusion_map_full: Counter,
        "Excluded processes the BPF map of excluded tgids had no room for (their samples \
        are still left out, in userspace)."
    {
        stats: [
            /// Excluded processes the BPF exclusion map refused.
            exclusion_map_full {},
        ],
    }
    bpf_samples_seen: Counter,
        "Times the BPF sampling program ran (each tick of each CPU's clock)."
    {
        bpf: [
            SamplesSeen {},
        ],
    }
    bpf_samples_written: Counter,
        "Samples the BPF program wrote into the ring buffer."
    {
        bpf: [
            SamplesWritten {},
        ],
    }
    bpf_samples_skipped: Counter,
        "Ticks the BPF program skipped on purpose, by reason: idle (the idle task), \
        pid_filter (a process outside --pid), no_stack_left (with user or kernel stacks \
        switched off, the other stack was empty: a kernel thread without kernel stacks, \
        user code without user stacks)."
    {
        bpf: [
            IdleSkipped { reason = "idle" },
            Filtered { reason = "pid_filter" },
            NoStackLeft { reason = "no_stack_left" },
        ],
    }
    processes_not_followed: Counter,
        "Processes started by a profiled one (--pid, firn record's command) that are not \
        profiled because the kernel's PID filter (1024 processes) was full."
    {
        bpf: [
            PidFilterFull {},
        ],
    }
    following_unavailable: Counter,
        "1 when processes were named (--pid, firn record's command) but the processes \
        they start are not followed, so only the named ones are profiled: the kernel's BTF \
        did not say where a task's tgid is, or the fork hook could not be attached (the \
        reason is logged once)."
    {
        stats: [
            /// Set once when the children of the named processes are not followed.
            following_unavailable {},
        ],
    }
    bpf_stack_copies_short: Counter,
        "Samples whose copy of the user stack ended short of what was asked (end of the \
        stack mapping or an unmapped page)."
    {
        bpf: [
            StackCopyShort {},
        ],
    }
    stacks_truncated: Counter,
        "Stacks cut short, by stack (kernel, user) and reason: max_depth (the stack filled \
        the BPF stack walk's 127 frames), beyond_stack_copy (the DWARF unwind went on past \
        the copied stack; see --stack-copy-bytes; the frames up to there are kept)."
    {
        stats: [
            /// Samples whose kernel or user stack filled the BPF stack walk's
            /// 127 frames, so its outermost frames are most likely missing.
            stacks_truncated_kernel { stack = "kernel", reason = "max_depth" },
            stacks_truncated_user { stack = "user", reason = "max_depth" },
            /// DWARF stacks that went on beyond the stack copy (kept as far as
            /// unwound).
            unwind_truncated { stack = "user", reason = "beyond_stack_copy" },
        ],
    }
    unwind_failures: Counter,
        "Stacks or frames that could not be unwound, by reason: kernel_stack and user_stack \
        (the kernel's stack walk failed), user_registers (the task's user registers could \
        not be read), leaf_repair (no CFI recovered a leaf frame's caller); and DWARF \
        unwinds that stopped early: no_cfi (code without CFI where rbp led nowhere), \
        unmapped (an address outside every mapping), unsupported_rule (a CFI rule firn \
        does not evaluate), not_progressing (the CFA did not move up: corrupt CFI or \
        stack), too_deep (the frame limit), no_user_registers (a DWARF process's sample \
        came without registers; the kernel's frame-pointer walk is kept)."
    {
        stats: [
            /// Leaf frames where CFI could not be applied (no CFI, unsupported
            /// rule, or the return address lay beyond the stack copy).
            leaf_repair_failures { reason = "leaf_repair" },
            /// DWARF unwinds stopped at code without CFI where rbp led nowhere.
            unwind_failed_no_cfi { reason = "no_cfi" },
            /// DWARF unwinds stopped at an address outside every mapping.
            unwind_failed_unmapped { reason = "unmapped" },
            /// DWARF unwinds stopped at a CFI rule firn does not evaluate.
            unwind_failed_unsupported_rule { reason = "unsupported_rule" },
            /// DWARF unwinds stopped because the CFA did not move up the stack
            /// (corrupt CFI or stack).
            unwind_failed_not_progressing { reason = "not_progressing" },
            /// DWARF unwinds stopped at the frame limit.
            unwind_failed_too_deep { reason = "too_deep" },
            /// Samples of DWARF processes without user registers (they keep the
            /// kernel's frame-pointer walk).
            unwind_without_registers { reason = "no_user_registers" },
        ],
        bpf: [
            KernelStackFailed { reason = "kernel_stack" },
            UserStackFailed { reason = "user_stack" },
            UserRegsFailed { reason = "user_registers" },
        ],
    }
    unwind_dwarf_stacks: Counter,
        "User stacks unwound in firn with DWARF CFI over the copied stack."
    {
        stats: [
            /// User stacks unwound with DWARF over the stack copy.
            unwind_dwarf_stacks {},
        ],
    }
    unwind_dwarf_stacks_complete: Counter,
        "DWARF-unwound stacks that reached the outermost frame."
    {
        stats: [
            /// DWARF stacks unwound to the outermost frame.
            unwind_dwarf_complete {},
        ],
    }
    unwind_dwarf_stacks_stitched: Counter,
        "DWARF-unwound stacks that stopped short and were continued with the kernel's \
        frame-pointer walk."
    {
        stats: [
            /// DWARF stacks that stopped short and were continued with the
            /// kernel's frame-pointer walk.
            unwind_stitched {},
        ],
    }
    unwind_frames_without_cfi: Counter,
        "Frames the DWARF unwinder stepped over without CFI, by kind: frame_pointer (code \
        without CFI, such as JIT code, unwound by following rbp), runtime (JIT code a \
        runtime unwound by its own frame layout: HotSpot's), signal (signal trampolines)."
    {
        stats: [
            /// Frames without CFI unwound by following rbp (JIT code).
            unwind_rbp_frames { kind = "frame_pointer" },
            /// Frames of JIT code unwound by their runtime (HotSpot).
            unwind_jit_frames { kind = "runtime" },
            /// Signal frames unwound.
            unwind_signal_frames { kind = "signal" },
        ],
    }
    unwind_images_decided: Counter,
        "Process images --unwind auto looked at, by the unwinding chosen: dwarf (the \
        stack is copied for them) or frame_pointers (nothing extra is copied)."
    {
        stats: [
            /// Process images `--unwind auto` decided to unwind with DWARF.
            unwind_dwarf_images { unwinding = "dwarf" },
            /// Process images `--unwind auto` left to frame pointers.
            unwind_fp_images { unwinding = "frame_pointers" },
        ],
    }
    unwind_images_switched_to_dwarf: Counter,
        "Images left to frame pointers whose stacks then showed callers without frame \
        pointers, switched to DWARF."
    {
        stats: [
            /// Of those, images whose stacks then held callers without frame
            /// pointers: switched to DWARF.
            unwind_switched_to_dwarf {},
        ],
    }
    unwind_copy_map_failures: Counter,
        "Processes whose stack copy size could not be set, by reason: map_full (the BPF \
        UNWIND_COPY map was full when a new image ran), update_failed (firn's update of \
        the map failed)."
    {
        stats: [
            /// Processes whose stack copy size could not be set in the BPF map.
            unwind_copy_map_failures { reason = "update_failed" },
        ],
        bpf: [
            UnwindCopyMapFull { reason = "map_full" },
        ],
    }
    unwind_exec_presets: Counter,
        "Presets of executables whose new processes the BPF program gives their stack copy \
        at exec (EXEC_PRESETS, an LRU map of 4096), without waking firn, by event: set (an \
        executable written, or written again with a new copy size), applied (a new process \
        given its executable's preset at exec). An executable the map let go wakes firn at \
        its next exec and is written again."
    {
        stats: [
            /// Executables written to EXEC_PRESETS.
            unwind_exec_presets_set { event = "set" },
        ],
        bpf: [
            ExecPresetsApplied { event = "applied" },
        ],
    }
    unwind_stack_copy_resized: Counter,
        "Stack copies of processes unwound with DWARF fitted to their stacks, by direction: \
        grown (an unwind needed more than a full copy; grown to the most the BPF program \
        copies, 64 KiB), shrunk (once, to what 200 complete unwinds needed, with a margin)."
    {
        stats: [
            /// Stack copies doubled after an unwind ran past a full copy.
            unwind_copy_grown { direction = "grown" },
            /// Stack copies shrunk to fit the process's stacks.
            unwind_copy_shrunk { direction = "shrunk" },
        ],
    }
    unwind_user_walk_switched: Counter,
        "Processes unwound with DWARF whose user stack the kernel stopped or resumed \
        walking, by direction: skipped (at most 1% of 200 unwinds needed the walk to \
        continue them: their samples carry the stack copy alone), restored (more unwinds \
        stopped short without it)."
    {
        stats: [
            /// The kernel's user stack walk skipped for a DWARF process.
            unwind_walk_skipped { direction = "skipped" },
            /// The kernel's user stack walk taken again for a DWARF process.
            unwind_walk_restored { direction = "restored" },
        ],
    }
    unwind_thread_stacks: Counter,
        "Threads of processes unwound with DWARF whose stack copy was bounded by where \
        their own stack ends, by event: set (learned from 16 complete unwinds, with 512 \
        bytes to spare), removed (an unwind needed more: learned anew)."
    {
        stats: [
            /// Threads whose copy now ends where their stack does.
            unwind_thread_stack_set { event = "set" },
            /// Threads back to their process's copy.
            unwind_thread_stack_removed { event = "removed" },
        ],
    }
    leaf_frames_repaired: Counter,
        "Leaf frames whose caller was recovered with CFI from the copied stack."
    {
        stats: [
            /// Leaf frames whose caller was recovered with CFI.
            leaf_frames_repaired {},
        ],
    }
    frames_unsymbolized: Counter,
        "Frames firn could not name (kept as addresses), by stack and reason: unmapped \
        (outside every known mapping: process gone, JIT), no_symbol (no symbol covers \
        the address)."
    {
        stats: [
            /// User frames outside every known mapping (process gone, JIT, ...).
            user_frames_unknown { stack = "user", reason = "unmapped" },
            /// User frames in a known object without a symbol for the address.
            user_frames_unsymbolized { stack = "user", reason = "no_symbol" },
            /// Kernel frames without a kallsyms symbol.
            kernel_frames_unsymbolized { stack = "kernel", reason = "no_symbol" },
        ],
    }
    symbolizer_cache_hits: Counter,
        "Symbolizer cache lookups answered from the cache, by cache."
    {
        stats: [
            /// Symbol table cache.
            symbol_cache_hits { cache = "symbol_table" },
            /// DWARF cache (line tables and inline trees).
            debuginfo_cache_hits { cache = "dwarf" },
            /// JIT perf map cache.
            perf_map_cache_hits { cache = "perf_map" },
            /// Named frames kept from one profile to the next.
            frame_cache_hits { cache = "frames" },
        ],
    }
    symbolizer_cache_misses: Counter,
        "Symbolizer cache lookups that had to read the object, by cache."
    {
        stats: [
            symbol_cache_misses { cache = "symbol_table" },
            debuginfo_cache_misses { cache = "dwarf" },
            perf_map_cache_misses { cache = "perf_map" },
            frame_cache_misses { cache = "frames" },
        ],
    }
    symbolizer_cache_evictions: Counter,
        "Entries the symbolizer caches dropped to stay within their size, by cache."
    {
        stats: [
            symbol_cache_evictions { cache = "symbol_table" },
            debuginfo_cache_evictions { cache = "dwarf" },
            perf_map_cache_evictions { cache = "perf_map" },
            frame_cache_evictions { cache = "frames" },
        ],
    }
    dwarf_units: Counter,
        "Compilation units of DWARF parsed for lookups (parsed), and let go after profiles \
        that did not use them (dropped); both rising steadily means units are parsed again \
        and again."
    {
        stats: [
            dwarf_units_parsed { event = "parsed" },
            dwarf_units_dropped { event = "dropped" },
        ],
    }
    symbolizer_errors: Counter,
        "Debug information that could not be used, by kind: symbol_table (malformed ELF \
        symbol tables), dwarf (malformed or truncated DWARF), perf_map (perf map lines \
        that did not parse)."
    {
        stats: [
            /// ELF symbol tables that could not be read (malformed objects).
            symbol_table_errors { kind = "symbol_table" },
            /// DWARF that could not be used: malformed or truncated sections.
            dwarf_errors { kind = "dwarf" },
            /// Perf map lines that did not parse.
            perf_map_parse_errors { kind = "perf_map" },
        ],
    }
    symbolizer_limited: Counter,
        "What the symbolizer read only in part to stay within its caches, by reason: \
        dwarf_too_large (the object's frames are named from its symbol table), \
        perf_map_truncated (a perf map larger than --perf-map-cache-size)."
    {
        stats: [
            /// Objects whose DWARF would take more than the whole DWARF cache;
            /// their frames are named from the symbol table.
            debuginfo_too_large { reason = "dwarf_too_large" },
            /// Perf maps larger than the cache may read.
            perf_maps_truncated { reason = "perf_map_truncated" },
        ],
    }
    debug_files: Counter,
        "Separate debug files looked at, by result: found (matched their object by build \
        id or CRC), rejected (did not match or did not parse)."
    {
        stats: [
            /// Separate debug files that matched their object (build id or CRC).
            debug_files_found { result = "found" },
            /// Debug file candidates that did not match their object or did not
            /// parse.
            debug_files_rejected { result = "rejected" },
        ],
    }
    cache_hits: Counter,
        "Other caches' lookups answered, by cache."
    {
        stats: [
            /// Unwind table cache.
            unwind_cache_hits { cache = "unwind_table" },
            /// Process metadata (cgroups, command line) served from the per-pid
            /// cache, read from /proc, or evicted to stay within its size.
            process_metadata_cache_hits { cache = "process_metadata" },
            /// Cgroup parses served from the per-cgroup cache, done, or evicted.
            cgroup_cache_hits { cache = "cgroup" },
            /// Cgroup facts known by v2 cgroup id: used for a process (its
            /// /proc/PID/cgroup not read, or a process gone), not usable
            /// (unknown, or the id does not tell), or evicted.
            cgroup_id_cache_hits { cache = "cgroup_id" },
        ],
    }
    cache_misses: Counter,
        "Other caches' lookups that had to do the work, by cache."
    {
        stats: [
            unwind_cache_misses { cache = "unwind_table" },
            process_metadata_cache_misses { cache = "process_metadata" },
            cgroup_cache_misses { cache = "cgroup" },
            cgroup_id_cache_misses { cache = "cgroup_id" },
        ],
    }
    cache_evictions: Counter,
        "Entries other caches dropped to stay within their size, by cache."
    {
        stats: [
            unwind_cache_evictions { cache = "unwind_table" },
            process_metadata_cache_evictions { cache = "process_metadata" },
            cgroup_cache_evictions { cache = "cgroup" },
            cgroup_id_cache_evictions { cache = "cgroup_id" },
        ],
    }
    process_metadata_unreadable: Counter,
        "Processes gone before firn read their metadata (a short-lived process, whose samples \
        waited for its exit), by where their cgroup facts (container, pod, systemd unit) came \
        from: cgroup_id (the processes of the cgroup id their sample carries, read alive), \
        none (not known: no such labels). Their command line and executable are unknown."
    {
        stats: [
            /// Unreadable processes given the cgroup facts of their sample's
            /// cgroup id.
            process_metadata_from_cgroup_id { source = "cgroup_id" },
            /// Unreadable processes left without cgroup facts.
            process_metadata_unknown { source = "none" },
        ],
    }
    ring_buffer_records_malformed: Counter,
        "Ring buffer records that could not be decoded."
    {
        stats: [
            /// Ring buffer records that could not be decoded.
            records_malformed {},
        ],
    }
    process_events: Counter,
        "Exec and exit events read from the ring buffer."
    {
        stats: [
            /// Exec and exit events read from the ring buffer.
            process_events {},
        ],
    }
    process_events_lost: Counter,
        "Exec and exit events lost because the ring buffer was full."
    {
        bpf: [
            ProcessEventsLost { reason = "ring_buffer_full" },
        ],
    }
    process_maps_reads: Counter,
        "Reads of /proc/PID/maps started (each exec read, first, settling or refreshing read)."
    {
        stats: [
            /// Reads of /proc/PID/maps started.
            maps_reads {},
        ],
    }
    process_maps_read_failures: Counter,
        "Reads of /proc/PID/maps that failed, by reason: exited (the process was gone), \
        error."
    {
        stats: [
            /// Processes whose maps could not be read because they had exited.
            processes_gone { reason = "exited" },
            /// Other failures reading /proc/PID/maps.
            maps_read_failures { reason = "error" },
        ],
    }
    short_lived_samples_held: Counter,
        "Samples of processes whose maps firn could not trust yet (a new program, or a \
        process gone before its samples were drained), held until the mappings the kernel \
        captured as the process exited, or a read of its maps, by how they were released: \
        exit_maps (placed with the mappings captured at exit), exec_maps (captured as it \
        executed another program), maps_read (the process lived \
        on and its maps were read), no_maps (it exited without a capture: placed as well as \
        its maps allowed), expired (neither came within 2 s)."
    {
        stats: [
            /// Held samples placed with the mappings captured at exit.
            held_exit_maps { how = "exit_maps" },
            /// Held samples placed with the mappings captured as the
            /// process executed another program.
            held_exec_maps { how = "exec_maps" },
            /// Held samples released once the process's maps were read.
            held_maps_read { how = "maps_read" },
            /// Held samples of a process that exited without a capture.
            held_no_maps { how = "no_maps" },
            /// Held samples released after the grace period.
            held_expired { how = "expired" },
        ],
    }
    short_lived_samples_not_held: Counter,
        "Samples that would have been held (see firn_short_lived_samples_held_total) but the \
        held samples had reached their bound (32 MiB): handled at once, as well as the \
        process's maps allowed."
    {
        stats: [
            /// Samples handled at once because the held samples were full.
            held_dropped {},
        ],
    }
    process_maps_captured_at_exit: Counter,
        "Exiting processes (started while firn ran, and sampled) whose executable mappings \
        the kernel captured before their exit event (Linux 6.16 or later)."
    {
        stats: [
            /// Mirrors the BPF exit walk's count (set, not added).
            exit_maps_walked {},
        ],
    }
    process_images_from_exit_maps: Counter,
        "Process images firn built from the mappings the kernel captured at exit (replacing \
        what it had read, or could not read, from /proc)."
    {
        stats: [
            /// Images built from the mappings captured at exit.
            exit_maps_installed {},
        ],
    }
    process_mappings_captured: Counter,
        "Executable mappings the kernel captured at process exit, by outcome: written, lost \
        (the ring buffer was full), no_path (the file's path could not be walked whole: \
        found by device and inode alone), walk_cut (walks stopped at 8192 areas)."
    {
        stats: [
            /// Mirrors of the BPF exit walk's counters (set, not added).
            exit_maps_mappings { outcome = "written" },
            exit_maps_lost { outcome = "lost" },
            exit_maps_no_path { outcome = "no_path" },
            exit_maps_cut { outcome = "walk_cut" },
        ],
    }
    process_maps_capture_unavailable: Gauge,
        "1 when the kernel cannot capture the mappings of exiting processes (before Linux \
        6.16, or without the VMA iterator): processes gone before their samples are drained \
        keep only what /proc/PID/maps still showed."
    {
        stats: [
            /// Set once at start when the exit walk is not attached.
            exit_maps_unavailable {},
        ],
    }
    process_maps_refreshed: Counter,
        "Memory maps read again because an address fell outside every known mapping."
    {
        stats: [
            /// Maps re-read because an address fell outside every known mapping.
            maps_refreshed {},
        ],
    }
    process_maps_deferred: Counter,
        "New programs whose maps were not read at their exec: no runtime registers a process \
        of their executable at once, so the read waits for the first sample (most short-lived \
        processes have none), and with the mappings captured at exit until the samples \
        settle (most sampled short-lived processes exit first and are never read)."
    {
        stats: [
            /// New programs whose maps read waits for their samples.
            maps_deferred {},
        ],
    }
    plain_executables_forgotten: Counter,
        "Executables firn had found need no read of their maps at exec, forgotten to stay \
        within the table's size (their next process is read at its exec again)."
    {
        stats: [
            /// Executables let go from the table of those needing no read at exec.
            plain_executables_forgotten {},
        ],
    }
    processes_evicted: Counter,
        "Processes dropped from the process table to stay within its size: the least \
        recently used, or an exited one before its grace period ends when more processes \
        exit within it than the table holds."
    {
        stats: [
            /// Processes dropped from the table to stay within its size.
            processes_evicted {},
        ],
    }
    objects_opened: Counter,
        "ELF objects opened."
    {
        stats: [
            /// ELF objects opened.
            objects_opened {},
        ],
    }
    object_open_failures: Counter,
        "ELF objects that could not be opened or parsed."
    {
        stats: [
            /// ELF objects that could not be opened or parsed.
            object_open_failures {},
        ],
    }
    mapped_file_pages_truncated: Counter,
        "Pages of mapped objects and debug files that were cut off by their file shrinking \
        underneath (read as zeros instead of crashing)."
    {
        stats: [
            /// Pages of mapped objects and debug files read as zeros because the
            /// file shrank underneath (copied from `untrusted::truncated_pages`).
            mapped_pages_truncated {},
        ],
    }
    mapped_files_unguarded: Counter,
        "Mappings of objects and debug files made while the table of guarded mappings was \
        full: a truncation of one of them underneath would kill firn with SIGBUS."
    {
        stats: [
            /// Mappings not registered with the SIGBUS handler (copied from
            /// `untrusted::unguarded_mappings`).
            mapped_files_unguarded {},
        ],
    }
    stage_stalled: Gauge,
        "1 while a stage makes no progress on work it took up: drain (the ring buffer \
        reader), build (symbolizing and writing or queueing profiles). /ready answers 503 \
        meanwhile, and /healthy too once it lasts."
    {
        stats: [
            /// Gauges: 1 while a stage makes no progress (see `watchdog`).
            stage_stalled_drain { stage = "drain" },
            stage_stalled_build { stage = "build" },
        ],
    }
    untrusted_files_refused: Counter,
        "Files another process controls (objects, debug files, perf maps) that firn would not \
        read, by reason: not_regular (a FIFO, socket, device or directory), too_large, fuse \
        (served by a process that may never answer), timed_out (opening it missed its \
        deadline)."
    {
        stats: [
            /// Files of other processes (objects, debug files, perf maps) not read,
            /// by reason: a FIFO, device or directory; absurdly large; on FUSE;
            /// opening them missed its deadline.
            untrusted_refused_not_regular { reason = "not_regular" },
            untrusted_refused_too_large { reason = "too_large" },
            untrusted_refused_fuse { reason = "fuse" },
            untrusted_refused_timed_out { reason = "timed_out" },
        ],
    }
    objects_evicted: Counter,
        "ELF objects dropped from the registry to stay within its size."
    {
        stats: [
            /// Objects dropped from the registry to stay within its size.
            objects_evicted {},
        ],
    }
    processes_tracked: Gauge,
        "Processes in the process table (exited ones stay for a grace period)."
    {
        stats: [
            /// Processes and objects in the process table: gauges, not counters.
            processes_tracked {},
        ],
    }
    objects_tracked: Gauge,
        "ELF objects kept open."
    {
        stats: [
            objects_tracked {},
        ],
    }
    profiles_written: Counter,
        "Profiles written: a file per interval in the local store, or a profile per \
        series queued for each remote destination. For remote destinations written = \
        sent + dropped (reasons queue and rejected) + queue_profiles, all in profiles."
    {
        stats: [
            /// Profiles written locally (one file per interval) or queued for the
            /// remote store (one per series). For the remote store,
            /// `profiles_written = remote_profiles_sent + remote_profiles_dropped +
            /// remote_profiles_rejected + remote_queue_profiles`.
            profiles_written {},
        ],
    }
    profiles_sent: Counter,
        "Profiles (one per series) the remote store accepted."
    {
        stats: [
            /// Profiles (one per series) the remote store accepted.
            remote_profiles_sent {},
        ],
    }
    profiles_dropped: Counter,
        "Profiles lost, by reason: pipeline (never written: the builder was behind, a \
        whole interval counting as one, or the exporter failed), queue (the remote \
        store queue was full, or the shutdown deadline came), rejected (the remote \
        store refused them for good)."
    {
        stats: [
            /// Profiles lost before they were written (exporter failure, a profile
            /// that broke the pprof rules, or the builder behind: a whole interval,
            /// never cut into series, counts as one).
            profiles_dropped { reason = "pipeline" },
            /// Profiles dropped unsent: the queue was full (oldest first), or the
            /// shutdown deadline came.
            remote_profiles_dropped { reason = "queue" },
            /// Profiles the server refused for good (bad request, credentials).
            remote_profiles_rejected { reason = "rejected" },
        ],
    }
    local_profiles_deleted: Counter,
        "Old local profiles deleted to stay within --local-store-max-bytes."
    {
        stats: [
            /// Old local profiles deleted to respect the size limit.
            local_profiles_deleted {},
        ],
    }
    push_failures: Counter,
        "Pushes to the remote store that failed, every attempt counted."
    {
        stats: [
            /// Pushes to the remote store that failed, each attempt counted.
            remote_send_failures {},
        ],
    }
    push_retries: Counter,
        "Pushes to the remote store that were retries of a failed one."
    {
        stats: [
            /// Pushes that were attempts after a failure.
            remote_send_retries {},
        ],
    }
    queue_bytes: Gauge,
        "Bytes of profiles waiting to be sent to the remote store (bounded by \
        --remote-store-queue-bytes)."
    {
        stats: [
            /// Bytes of profiles waiting to be sent: a gauge, not a counter.
            remote_queue_bytes {},
        ],
    }
    queue_profiles: Gauge,
        "Profiles (series) waiting to be sent to the remote store, or being sent."
    {
        stats: [
            /// Profiles (series) waiting to be sent or being sent: a gauge.
            remote_queue_profiles {},
        ],
    }
    debuginfo_uploads: Counter,
        "Debug information uploads to the remote store, by result: uploaded, failed \
        (retried later), skipped (not wanted, none found, or the backlog was full)."
    {
        stats: [
            /// Debug files uploaded to the remote store.
            debuginfo_uploads { result = "uploaded" },
            /// Debug file uploads that failed (retried later).
            debuginfo_upload_failures { result = "failed" },
            /// Objects not uploaded: the server did not want them, no debug
            /// information was found, or the upload backlog was full.
            debuginfo_uploads_skipped { result = "skipped" },
        ],
    }
    kubernetes_watch_events: Counter,
        "Pod watch events read from the Kubernetes API server."
    {
        stats: [
            /// Pod watch events read from the Kubernetes API server.
            kubernetes_watch_events {},
        ],
    }
    kubernetes_watch_errors: Counter,
        "Failed lists or watches of pods, and malformed events or pods."
    {
        stats: [
            /// Failed lists or watches of pods, and malformed events or pods.
            kubernetes_watch_errors {},
        ],
    }
    kubernetes_pods_skipped: Counter,
        "Pods not indexed because the pod index was full."
    {
        stats: [
            /// Pods not indexed because the index was full.
            kubernetes_pods_skipped {},
        ],
    }
    python_processes: Counter,
        "CPython processes found whose frames firn walks, by version."
    {
        stats: [
            /// CPython processes registered with the BPF walker, by version.
            python_processes_3_8 { version = "3.8" },
            python_processes_3_9 { version = "3.9" },
            python_processes_3_10 { version = "3.10" },
            python_processes_3_11 { version = "3.11" },
            python_processes_3_12 { version = "3.12" },
            python_processes_3_13 { version = "3.13" },
        ],
    }
    python_executables: Counter,
        "Interpreter executables loaded where they were linked, whose processes the BPF \
        program registers at their exec (PYTHON_EXECUTABLES), by event: set (written to the \
        map, an LRU of 256: past 256 each new one displaces the least recently used), \
        forgotten (the daemon's record of those it set, cleared at 4096: each is set again \
        at its next registration)."
    {
        stats: [
            /// Executables written to PYTHON_EXECUTABLES.
            python_executables_set { event = "set" },
            /// Executables dropped from the daemon's record of those set.
            python_executables_forgotten { event = "forgotten" },
        ],
    }
    python_processes_skipped: Counter,
        "CPython processes whose frames firn does not walk (their native frames are still \
        profiled), by reason: unsupported_version (outside 3.8-3.13), missing_symbols (a \
        build without the symbols firn needs, e.g. a static one stripped of _PyRuntime), \
        musl (no glibc thread-specific data to find the thread state through), \
        libc_unknown (glibc's thread-specific data layout not recognized, or no libc \
        found), no_thread_pointer (the kernel's BTF did not say where a task's thread \
        pointer is), map_full (the BPF map of interpreter processes was full), \
        unreadable (the interpreter's object could not be read)."
    {
        stats: [
            /// CPython processes skipped: version outside 3.8-3.13.
            python_skipped_version { reason = "unsupported_version" },
            /// CPython processes skipped: symbols missing.
            python_skipped_symbols { reason = "missing_symbols" },
            /// CPython processes skipped: musl libc.
            python_skipped_musl { reason = "musl" },
            /// CPython processes skipped: libc layout unknown.
            python_skipped_libc { reason = "libc_unknown" },
            /// CPython processes skipped: no thread pointer offset.
            python_skipped_thread_pointer { reason = "no_thread_pointer" },
            /// CPython processes skipped: the BPF map was full.
            python_skipped_map_full { reason = "map_full" },
            /// CPython processes skipped: the interpreter object was unreadable.
            python_skipped_unreadable { reason = "unreadable" },
        ],
    }
    off_cpu_waits: Counter,
        "Waits of threads of profiled processes seen by the off-CPU programs (--off-cpu), by \
        result: followed (the switch-out time was stored), not_kept (shorter than the \
        period and not drawn: expected, it is how the cost stays bounded), map_full (not \
        followed: too many threads were off the CPU at once), outside_syscall (a wait outside \
        any system call, e.g. a page fault: not sampled), stale (kept, but the system call \
        that returned was not the one that waited: not written)."
    {
        bpf: [
            OffCpuWaits { result = "followed" },
            OffCpuNotKept { result = "not_kept" },
            OffCpuMapFull { result = "map_full" },
            OffCpuOutsideSyscall { result = "outside_syscall" },
            OffCpuStale { result = "stale" },
        ],
    }
    off_cpu_samples: Counter,
        "Off-CPU samples (--off-cpu) the BPF program wrote to the ring buffer, and those lost \
        because it was full."
    {
        stats: [
            /// Off-CPU sample records read from the ring buffer.
            off_cpu_samples_received { result = "received" },
        ],
        bpf: [
            OffCpuWritten { result = "written" },
            OffCpuLostRingFull { result = "ring_buffer_full" },
        ],
    }
    python_walks: Counter,
        "Samples of CPython processes whose thread's interpreter stack the BPF program \
        walked."
    {
        bpf: [
            InterpreterWalks {},
        ],
    }
    python_walker_unavailable: Counter,
        "Samples of CPython processes whose interpreter stack was not walked because the \
        BPF walker program could not be called (not expected; the samples are kept, \
        without Python frames)."
    {
        bpf: [
            InterpreterWalkerUnavailable {},
        ],
    }
    python_threads_without_state: Counter,
        "Samples of CPython processes whose thread had no interpreter state (a native \
        thread, or before the interpreter started)."
    {
        bpf: [
            InterpreterNoThreadState {},
        ],
    }
    python_frames: Counter,
        "Python frames recorded by the BPF program."
    {
        bpf: [
            InterpreterFrames {},
        ],
    }
    python_stacks_truncated: Counter,
        "Python stacks deeper than the BPF walker's 128 frames (the innermost are kept)."
    {
        bpf: [
            InterpreterTruncated {},
        ],
    }
    python_read_failures: Counter,
        "Python frames or stacks that could not be read, by stage: bpf (a read of the \
        thread state or frame chain failed; the frames up to there are kept), name (a code \
        object could not be read from the process), stale (the code object at a sampled \
        address had changed by the time firn read it, so the frame is left unnamed rather \
        than misnamed)."
    {
        stats: [
            /// Python frames whose code object could not be read.
            python_name_failures { stage = "name" },
            /// Python frames whose code object changed after the sample.
            python_name_stale { stage = "stale" },
        ],
        bpf: [
            InterpreterReadFailed { stage = "bpf" },
        ],
    }
    python_code_cache: Counter,
        "Lookups in firn's cache of Python code objects, by result: hit, shared_hit (an \
        entry another process of the same interpreter object and user read: a code object \
        in the interpreter's data), miss, and eviction (entries dropped to stay within the \
        cache's size)."
    {
        stats: [
            /// Code object cache hits on the process's own entries.
            python_code_cache_hits { result = "hit" },
            /// Code object cache hits on an entry another process read.
            python_code_cache_shared_hits { result = "shared_hit" },
            /// Code object cache misses (the object was read from the process).
            python_code_cache_misses { result = "miss" },
            /// Code object cache entries evicted by the byte bound.
            python_code_cache_evictions { result = "eviction" },
        ],
    }
    ruby_processes: Counter,
        "CRuby processes whose Ruby frames the BPF program walks and firn names, by the \
        interpreter's version."
    {
        stats: [
            /// Ruby processes registered with the walker, Ruby 2.7.
            ruby_processes_2_7 { version = "2.7" },
            /// Ruby 3.1.
            ruby_processes_3_1 { version = "3.1" },
            /// Ruby 3.3.
            ruby_processes_3_3 { version = "3.3" },
            /// Ruby 3.4.
            ruby_processes_3_4 { version = "3.4" },
            /// Another version firn has a layout for.
            ruby_processes_other { version = "other" },
        ],
    }
    ruby_processes_skipped: Counter,
        "CRuby processes whose Ruby frames firn does not walk (their native frames are still \
        profiled), by reason: unsupported_version (no layout for this Ruby: never guessed), \
        missing_symbols (the interpreter lacks a symbol firn needs), no_thread_pointer (the \
        kernel's BTF did not tell where the thread pointer is), map_full (the BPF map of \
        interpreter processes was full), unreadable (the interpreter object could not be \
        read)."
    {
        stats: [
            /// Ruby processes skipped: no layout for their version.
            ruby_skipped_version { reason = "unsupported_version" },
            /// Ruby processes skipped: a symbol or code firn reads was not found.
            ruby_skipped_symbols { reason = "missing_symbols" },
            /// Ruby processes skipped: no thread pointer offset.
            ruby_skipped_thread_pointer { reason = "no_thread_pointer" },
            /// Ruby processes skipped: the BPF map was full.
            ruby_skipped_map_full { reason = "map_full" },
            /// Ruby processes skipped: the interpreter object was unreadable.
            ruby_skipped_unreadable { reason = "unreadable" },
        ],
    }
    ruby_walks: Counter,
        "Samples of CRuby processes whose thread's control frames the BPF program walked."
    {
        bpf: [
            RubyWalks {},
        ],
    }
    ruby_walker_unavailable: Counter,
        "Samples of CRuby processes whose frames were not walked because the BPF walker \
        program could not be called (not expected; the samples are kept, without Ruby \
        frames)."
    {
        bpf: [
            RubyWalkerUnavailable {},
        ],
    }
    ruby_threads_not_running: Counter,
        "Samples of CRuby processes whose thread ran no Ruby code, by reason: no_context \
        (no execution context yet, or several ractors), other_thread (another thread held \
        the VM lock: this one was in native code that released it, or waiting for it; its \
        native frames are kept)."
    {
        bpf: [
            RubyNoThreadState { reason = "no_context" },
            RubyOtherThread { reason = "other_thread" },
        ],
    }
    ruby_frames: Counter,
        "Ruby control frames recorded by the BPF program."
    {
        bpf: [
            RubyFrames {},
        ],
    }
    ruby_stacks_truncated: Counter,
        "Ruby stacks deeper than the BPF walker's 128 frames (the innermost are kept)."
    {
        bpf: [
            RubyTruncated {},
        ],
    }
    ruby_read_failures: Counter,
        "Ruby frames or stacks that could not be read, by stage: bpf (a read of the \
        execution context or a control frame failed; the frames up to there are kept), name \
        (an instruction sequence or method entry could not be read from the process), stale \
        (what a sampled address held had changed by the time firn read it, so the frame is \
        left unnamed rather than misnamed)."
    {
        stats: [
            /// Ruby frames whose instruction sequence could not be read.
            ruby_name_failures { stage = "name" },
            /// Ruby frames whose objects changed after the sample.
            ruby_name_stale { stage = "stale" },
        ],
        bpf: [
            RubyReadFailed { stage = "bpf" },
        ],
    }
    ruby_cache: Counter,
        "Lookups in firn's cache of decoded Ruby instruction sequences and method names, by \
        result: hit, miss, and eviction (entries dropped to stay within the cache's size)."
    {
        stats: [
            /// Ruby cache hits.
            ruby_cache_hits { result = "hit" },
            /// Ruby cache misses (read from the process).
            ruby_cache_misses { result = "miss" },
            /// Ruby cache entries evicted by the byte bound.
            ruby_cache_evictions { result = "eviction" },
        ],
    }
    java_processes: Counter,
        "HotSpot JVMs found whose Java frames firn unwinds and names, by the JVM's major \
        version (other: one outside 8, 11, 17, 21, 25, or unreadable)."
    {
        stats: [
            /// JVMs whose tables and code cache were read, JDK 8.
            java_processes_8 { version = "8" },
            /// JDK 11.
            java_processes_11 { version = "11" },
            /// JDK 17.
            java_processes_17 { version = "17" },
            /// JDK 21.
            java_processes_21 { version = "21" },
            /// JDK 25.
            java_processes_25 { version = "25" },
            /// Another version.
            java_processes_other { version = "other" },
        ],
    }
    java_processes_skipped: Counter,
        "JVMs whose Java frames firn does not unwind (their native frames are still \
        profiled), by reason: layout (the JVM's structure tables lack a field firn needs), \
        no_tables (a libjvm.so without the structure tables: not HotSpot, or built without \
        them), unreadable (libjvm.so or the tables could not be read)."
    {
        stats: [
            /// JVMs skipped: a field firn needs is missing from their tables.
            java_skipped_layout { reason = "layout" },
            /// JVMs skipped: libjvm.so has no structure tables.
            java_skipped_no_tables { reason = "no_tables" },
            /// JVMs skipped: libjvm.so or the tables could not be read.
            java_skipped_unreadable { reason = "unreadable" },
        ],
    }
    java_thread_names: Counter,
        "Thread names of JVM threads with thread labels on, by result: java (the whole \
        java.lang.Thread name), comm (the OS thread's name: the JVM's layout was not \
        understood, the thread is not in its list yet, or its name could not be read)."
    {
        stats: [
            /// Thread names read from the JVM.
            java_thread_names_java { result = "java" },
            /// Thread names left to the OS thread's name.
            java_thread_names_comm { result = "comm" },
        ],
    }
    java_frames: Counter,
        "Java frames named, by how they ran: interpreted, c1, c2, inlined (a method inlined \
        by the compiler, a frame of its own), native (a native method's frame)."
    {
        stats: [
            /// Interpreted Java frames named.
            java_frames_interpreted { kind = "interpreted" },
            /// C1-compiled Java frames named.
            java_frames_c1 { kind = "c1" },
            /// C2-compiled Java frames named.
            java_frames_c2 { kind = "c2" },
            /// Inlined Java frames named.
            java_frames_inlined { kind = "inlined" },
            /// Native methods' frames named.
            java_frames_native { kind = "native" },
        ],
    }
    java_read_failures: Counter,
        "Java frames that could not be made sense of, by stage: unwind (no code blob at \
        the frame's pc, or its frame did not lead back into Java code; the stack ends \
        there), name (its method or debug information could not be read or did not check \
        out), stale (its compiled method gone or replaced by the time firn named it, or a \
        code blob the unwind took as remembered changed: the stack ends there); \
        a frame not named is shown as <unknown>, never misnamed."
    {
        stats: [
            /// Java frames not unwound.
            java_unwind_failures { stage = "unwind" },
            /// Java frames not named.
            java_name_failures { stage = "name" },
            /// Java frames whose nmethod changed after the sample.
            java_name_stale { stage = "stale" },
        ],
    }
    java_method_cache: Counter,
        "Lookups in firn's cache of named Java methods, by result: hit, miss (the method \
        read from the process)."
    {
        stats: [
            /// Java method cache hits.
            java_method_cache_hits { result = "hit" },
            /// Java method cache misses.
            java_method_cache_misses { result = "miss" },
        ],
    }
    java_blob_cache: Counter,
        "Lookups of the code blob holding a Java frame's pc, by result: hit (a blob found \
        before, believed after its header was read again and said the same), miss (found \
        through the code heap's segment map)."
    {
        stats: [
            /// Code blobs checked by their header alone.
            java_blob_cache_hits { result = "hit" },
            /// Code blobs found through the segment map.
            java_blob_cache_misses { result = "miss" },
        ],
    }
    node_processes: Counter,
        "V8 processes (Node.js) found whose JavaScript frames firn names, by V8's major \
        version (`other`: an embedder other than Node, or a version firn does not list)."
    {
        stats: [
            /// V8 10 (Node 18).
            node_processes_v8_10 { v8 = "10" },
            /// V8 11 (Node 20).
            node_processes_v8_11 { v8 = "11" },
            /// V8 12 (Node 22).
            node_processes_v8_12 { v8 = "12" },
            /// V8 13 (Node 24).
            node_processes_v8_13 { v8 = "13" },
            /// Another V8.
            node_processes_v8_other { v8 = "other" },
        ],
    }
    node_processes_skipped: Counter,
        "V8 processes whose JavaScript frames firn does not name from V8's heap (a perf map \
        still names them where the process writes one), by reason: layout (the build lacks \
        a post-mortem constant firn needs), unreadable (the object could not be read)."
    {
        stats: [
            /// V8 processes skipped: a constant is missing.
            node_skipped_layout { reason = "layout" },
            /// V8 processes skipped: the object could not be read.
            node_skipped_unreadable { reason = "unreadable" },
        ],
    }
    node_frames: Counter,
        "JavaScript frames named."
    {
        stats: [
            /// JavaScript frames named.
            node_frames {},
        ],
    }
    node_lines: Counter,
        "JavaScript frames named, by the line they carry: run (the line being run, from an \
        interpreted frame's bytecode offset or an optimized frame's pc), start (where the \
        function starts: baseline frames, and frames whose tables firn could not read)."
    {
        stats: [
            /// JavaScript frames with the line being run.
            node_lines_run { line = "run" },
            /// JavaScript frames with the line their function starts at.
            node_lines_start { line = "start" },
        ],
    }
    node_inlined_frames: Counter,
        "JavaScript functions TurboFan or Maglev inlined into an optimized frame, named as \
        frames of their own."
    {
        stats: [
            /// Inlined JavaScript functions named.
            node_inlined_frames {},
        ],
    }
    node_inline_failures: Counter,
        "Optimized JavaScript frames named without the functions inlined into them, by \
        reason: no_code (no code object that links back holds the frame's pc), \
        deoptimization_data (the code's deoptimization data was not found or is another \
        function's), table (its position or inlining tables do not decode), read (memory \
        unreadable), stale (an object on the way had changed)."
    {
        stats: [
            /// Inlined functions not read: no code object at the pc.
            node_inline_no_code { reason = "no_code" },
            /// Inlined functions not read: no deoptimization data.
            node_inline_no_deoptimization_data { reason = "deoptimization_data" },
            /// Inlined functions not read: a table did not decode.
            node_inline_bad_table { reason = "table" },
            /// Inlined functions not read: memory unreadable.
            node_inline_read { reason = "read" },
            /// Inlined functions not read: objects changed since the sample.
            node_inline_stale { reason = "stale" },
        ],
    }
    node_read_failures: Counter,
        "JavaScript frames shown as <unknown> rather than misnamed, by stage: read (the \
        process's memory could not be read), stale (an object on the way had changed or \
        moved since the sample), name (a name or script could not be decoded)."
    {
        stats: [
            /// JavaScript frames not named: memory unreadable.
            node_read_failures { stage = "read" },
            /// JavaScript frames not named: objects changed since the sample.
            node_name_stale { stage = "stale" },
            /// JavaScript frames not named: a string could not be decoded.
            node_name_failures { stage = "name" },
        ],
    }
    node_memory_reads: Counter,
        "Reads of V8 processes' memory made to name their samples, by result: recent (answered \
        from a block read after the sample was taken, for an earlier sample of its batch), \
        read (a call to the process: a block, a larger read, or the blocks of a level of \
        objects read ahead at once)."
    {
        stats: [
            /// V8 memory reads answered from blocks read after the sample.
            node_recent_hits { result = "recent" },
            /// V8 memory reads made of the process.
            node_memory_reads { result = "read" },
        ],
    }
}

/// The same per destination (a Parca or Pyroscope server), with a
/// `destination` label, in the order `DestinationStats::values` gives; the
/// families above are the totals over all destinations.
pub const DESTINATION_FAMILIES: &[Family] = &[
    Family {
        name: "destination_profiles_sent",
        kind: Kind::Counter,
        help: "Profiles (one per series) this destination accepted.",
    },
    Family {
        name: "destination_profiles_dropped",
        kind: Kind::Counter,
        help: "Profiles dropped unsent for this destination: its queue was full, or the \
               shutdown deadline came.",
    },
    Family {
        name: "destination_profiles_rejected",
        kind: Kind::Counter,
        help: "Profiles this destination refused for good (bad request, credentials, tenant).",
    },
    Family {
        name: "destination_push_failures",
        kind: Kind::Counter,
        help: "Pushes to this destination that failed, every attempt counted.",
    },
    Family {
        name: "destination_push_retries",
        kind: Kind::Counter,
        help: "Pushes to this destination that were retries of a failed one.",
    },
    Family {
        name: "destination_queue_bytes",
        kind: Kind::Gauge,
        help: "Bytes of profiles waiting to be sent to this destination.",
    },
    Family {
        name: "destination_queue_profiles",
        kind: Kind::Gauge,
        help: "Profiles (series) waiting to be sent to this destination, or being sent.",
    },
];
