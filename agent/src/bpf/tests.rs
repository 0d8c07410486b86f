use agent_common::Counter;

use super::*;

#[test]
fn ring_buffer_scales_with_cpus_within_bounds() {
    assert_eq!(default_ring_buffer_bytes(1), 2 << 20);
    assert_eq!(default_ring_buffer_bytes(2), 2 << 20);
    assert_eq!(default_ring_buffer_bytes(3), 4 << 20);
    assert_eq!(default_ring_buffer_bytes(6), 8 << 20);
    assert_eq!(default_ring_buffer_bytes(64), 64 << 20);
    assert_eq!(default_ring_buffer_bytes(4096), 256 << 20);
}

#[test]
fn run_time_is_read_from_fdinfo() {
    let fdinfo = "pos:\t0\nflags:\t02000002\nprog_type:\t7\nprog_id:\t42\n\
                  run_time_ns:\t123456\nrun_cnt:\t789\nrecursion_misses:\t0\n";
    assert_eq!(
        parse_run_time(fdinfo),
        Some(ProgramRunTime {
            run_time_ns: 123_456,
            run_count: 789
        })
    );
    assert_eq!(parse_run_time("pos:\t0\nflags:\t0\n"), None);
}

#[test]
fn copy_sizes_follow_the_unwind_mode() {
    let mut config = SamplingConfig {
        leaf_stack_copy_bytes: 1024,
        stack_copy_bytes: 16384,
        ..SamplingConfig::default()
    };
    let sizes = |config: &SamplingConfig| {
        let bpf = bpf_config(config, 1 << 22, None);
        (bpf.stack_copy_bytes, bpf.exec_copy_bytes)
    };
    assert_eq!(
        sizes(&config),
        (16384, 16384),
        "undecided processes get the full copy"
    );
    config.unwind = UnwindMode::FramePointers;
    assert_eq!(sizes(&config), (1024, 0));
    config.unwind = UnwindMode::Dwarf;
    assert_eq!(sizes(&config), (16384, 0));
}

#[test]
fn counter_deltas_saturate() {
    let mut earlier = BpfCounters::default();
    let mut later = BpfCounters::default();
    earlier.values[0] = 10;
    later.values[0] = 25;
    later.values[1] = 3;
    let delta = later.since(&earlier);
    assert_eq!(delta.get(Counter::SamplesSeen), 15);
    assert_eq!(delta.get(Counter::SamplesWritten), 3);
    assert_eq!(earlier.since(&later).get(Counter::SamplesSeen), 0);
}

/// A function the compiler left out of line keeps its mangled name, and
/// that name hashes the path the object was built at: a fresh clone would
/// build a different object, and `cargo xtask build-ebpf --check` fail.
#[test]
fn the_bpf_object_names_no_function_after_its_build_path() {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(OBJECT).expect("the BPF object parses");
    let mangled: Vec<String> = file
        .symbols()
        .filter_map(|symbol| symbol.name().ok().map(str::to_owned))
        .filter(|name| name.starts_with("_R") || name.starts_with("_ZN"))
        .collect();
    assert!(mangled.is_empty(), "out-of-line functions: {mangled:?}");
    let programs: Vec<&str> = file
        .symbols()
        .filter_map(|symbol| symbol.name().ok())
        .filter(|name| *name == names::PROG_SAMPLE || names::PROG_WALKERS.contains(name))
        .collect();
    assert_eq!(
        programs.len(),
        1 + names::PROG_WALKERS.len(),
        "{programs:?}"
    );
}
