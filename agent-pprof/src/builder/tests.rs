use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::*;
use crate::{Mapping, Reader, validate};

fn named(name: &str) -> Line {
    Line {
        function: name.to_owned(),
        system_name: format!("_Z{name}"),
        file: None,
        line: None,
    }
}

fn frame(mapping: Option<usize>, address: u64, origin: Origin, lines: Vec<Line>) -> Frame {
    Frame {
        mapping,
        address,
        origin,
        lines: lines.into(),
    }
}

fn stack(count: u64, labels: &[(&str, &str)], frames: &[usize]) -> Stack {
    Stack {
        count,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        frames: frames.into(),
    }
}

fn interval() -> Interval {
    Interval {
        start: SystemTime::now(),
        duration: Duration::from_secs(10),
        period_ns: 10_000_000,
    }
}

/// A kernel mapping, a user binary, and frames in both and outside.
fn frames() -> Frames {
    let worker = Mapping {
        path: "/bin/worker".into(),
        build_id: "beef".into(),
        start: 0x400000,
        limit: 0x500000,
        offset: 0x1000,
        kernel: false,
    };
    let library = Mapping {
        path: "/lib/libother.so".into(),
        build_id: String::new(),
        start: 0x7f00_0000_0000,
        limit: 0x7f00_0001_0000,
        offset: 0,
        kernel: false,
    };
    let inlined = Line {
        file: Some("worker.c".into()),
        line: Some(12),
        ..named("inlined")
    };
    let caller = Line {
        file: Some("worker.c".into()),
        line: Some(40),
        ..named("caller")
    };
    Frames {
        mappings: vec![Mapping::kernel("abcd".into()), worker, library],
        frames: vec![
            frame(
                Some(0),
                0xffff_ffff_8100_0010,
                Origin::Kernel,
                vec![named("ksys_write")],
            ),
            frame(Some(0), 0xffff_ffff_dead_0000, Origin::Kernel, vec![]),
            frame(Some(1), 0x401000, Origin::Object, vec![inlined, caller]),
            frame(Some(1), 0x402000, Origin::Object, vec![]),
            frame(None, 0x900000, Origin::NoObject, vec![]),
            frame(
                Some(2),
                0x7f00_0000_0100,
                Origin::Object,
                vec![named("other")],
            ),
        ],
    }
}

#[test]
fn profile_follows_the_parca_rules() {
    let frames = frames();
    let stacks = [
        stack(3, &[("pid", "42"), ("comm", "worker")], &[0, 2, 3]),
        stack(
            2,
            &[("pid", "42"), ("comm", "worker"), ("thread_id", "43")],
            &[1, 2, 4],
        ),
    ];
    let (profile, summary) = build(&frames, &stacks, interval());

    validate(&profile).expect("the profile follows the Parca rules");
    for sample in &profile.sample {
        assert_eq!(sample.value[1], sample.value[0] * 10_000_000);
    }
    let reader = Reader::new(&profile);
    assert_eq!(
        reader.sample_types(),
        [("samples", "count"), ("cpu", "nanoseconds")]
    );
    assert_eq!(reader.period_type(), Some(("cpu", "nanoseconds")));
    assert_eq!(profile.period, 10_000_000);
    assert!(profile.time_nanos > 0 && profile.duration_nanos == 10_000_000_000);

    assert_eq!(summary.samples, 5);
    assert_eq!(summary.unsymbolized_kernel_locations, 1);
    assert_eq!(summary.unsymbolized_user_locations, 1);
    assert_eq!(summary.unknown_user_locations, 1);
    assert_eq!(
        (summary.locations, summary.mappings, summary.functions),
        (5, 2, 3),
        "the library no stack uses is left out; the shared frame is one location"
    );

    let samples: Vec<_> = reader.samples().collect();
    let main = samples.iter().find(|s| s.count() == 3).expect("sample");
    let labels: Vec<_> = main.labels().collect();
    assert_eq!(labels, [("pid", "42"), ("comm", "worker")]);
    assert_eq!(
        main.function_names(),
        ["ksys_write", "inlined", "caller", "0x402000"]
    );
    let other = samples.iter().find(|s| s.count() == 2).expect("sample");
    assert_eq!(other.label("thread_id"), Some("43"));
    assert_eq!(
        other.function_names(),
        ["0xffffffffdead0000", "inlined", "caller", "0x900000"]
    );
    let frames = other.frames();
    assert!(frames[3].mapping.is_none(), "outside every mapping");
    assert_eq!((frames[1].file, frames[1].line), ("worker.c", 12));
    assert_eq!(frames[2].system_name, "_Zcaller");

    let mappings: Vec<_> = reader.mappings().collect();
    assert_eq!(
        (mappings[0].filename, mappings[0].build_id),
        ("[kernel.kallsyms]", "abcd")
    );
    assert!(mappings[0].is_kernel() && mappings[0].mapping.has_functions);
    let user = mappings[1];
    assert_eq!((user.filename, user.build_id), ("/bin/worker", "beef"));
    assert_eq!(
        (
            user.mapping.memory_start,
            user.mapping.memory_limit,
            user.mapping.file_offset
        ),
        (0x400000, 0x500000, 0x1000)
    );
    assert!(
        user.mapping.has_functions
            && user.mapping.has_filenames
            && user.mapping.has_line_numbers
            && user.mapping.has_inline_frames
    );
}

#[test]
fn profiles_cut_from_one_table_hold_only_what_they_use() {
    let frames = frames();
    let (profile, summary) = build(&frames, &[stack(1, &[], &[5])], interval());
    validate(&profile).expect("valid");
    assert_eq!((summary.mappings, summary.locations), (1, 1));
    let reader = Reader::new(&profile);
    let mapping = reader.mappings().next().expect("the library");
    assert_eq!(mapping.filename, "/lib/libother.so");
    assert!(mapping.mapping.has_functions && !mapping.mapping.has_filenames);
    assert_eq!(profile.location[0].mapping_id, 1, "ids restart per profile");
    assert!(profile.sample[0].label.is_empty());
}

#[test]
fn frames_beyond_the_table_are_left_out_and_empty_stacks_dropped() {
    let frames = frames();
    let stacks = [stack(2, &[], &[99]), stack(1, &[], &[99, 0])];
    let (profile, summary) = build(&frames, &stacks, interval());
    validate(&profile).expect("valid");
    assert_eq!(summary.samples, 3, "every sample is counted");
    assert_eq!(profile.sample.len(), 1);
    assert_eq!(profile.sample[0].location_id, [1]);
}

#[test]
fn functions_are_shared_between_locations() {
    let mut frames = frames();
    frames.frames[3].lines = Arc::from(vec![named("caller")]);
    let (profile, _) = build(&frames, &[stack(1, &[], &[3, 5])], interval());
    validate(&profile).expect("valid");
    // `caller` without a file differs from `caller` in worker.c.
    let (profile_both, _) = build(&frames, &[stack(1, &[], &[2, 3])], interval());
    assert_eq!(profile.function.len(), 2);
    assert_eq!(profile_both.function.len(), 3);
    let (again, _) = build(
        &frames,
        &[stack(1, &[], &[3]), stack(1, &[], &[3])],
        interval(),
    );
    assert_eq!((again.location.len(), again.function.len()), (1, 1));
}
