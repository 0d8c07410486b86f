use agent_pprof::validate;

use super::*;

/// A profile as `firn record` builds them: `samples/count`, then time in
/// nanoseconds; one sample per `(function, thread id, thread name, count,
/// ns)`, the function under `main`.
fn profile(time: &str, samples: &[(&str, &str, &str, i64, i64)]) -> proto::Profile {
    let mut strings = vec![String::new()];
    let mut string = |text: &str| -> i64 {
        if let Some(index) = strings.iter().position(|s| s == text) {
            return index as i64;
        }
        strings.push(text.to_owned());
        strings.len() as i64 - 1
    };
    let value = |kind: i64, unit: i64| proto::ValueType { r#type: kind, unit };
    let sample_type = vec![
        value(string("samples"), string("count")),
        value(string(time), string("nanoseconds")),
    ];
    let mut profile = proto::Profile {
        sample_type,
        mapping: vec![proto::Mapping {
            id: 1,
            memory_start: 0x1000,
            memory_limit: 0x9000,
            filename: string("/bin/app"),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut function = |name: &str| {
        let name = string(name);
        let id = profile.function.len() as u64 + 1;
        profile.function.push(proto::Function {
            id,
            name,
            system_name: name,
            ..Default::default()
        });
        let location = profile.location.len() as u64 + 1;
        profile.location.push(proto::Location {
            id: location,
            mapping_id: 1,
            address: 0x1000 + location * 16,
            line: vec![proto::Line {
                function_id: id,
                ..Default::default()
            }],
            ..Default::default()
        });
        location
    };
    let main = function("main");
    let mut built = Vec::new();
    for &(leaf, tid, name, count, ns) in samples {
        built.push((function(leaf), tid, name, count, ns));
    }
    for (leaf, tid, name, count, ns) in built {
        let label = |key: &str, value: &str, string: &mut dyn FnMut(&str) -> i64| proto::Label {
            key: string(key),
            str: string(value),
            ..Default::default()
        };
        let labels = vec![
            label("pid", "7", &mut string),
            label("comm", "app", &mut string),
            label("thread_id", tid, &mut string),
            label("thread_name", name, &mut string),
        ];
        profile.sample.push(proto::Sample {
            location_id: vec![leaf, main],
            value: vec![count, ns],
            label: labels,
        });
    }
    profile.string_table = strings;
    profile
}

#[test]
fn each_thread_is_a_root_with_its_time_on_and_off_the_cpu() {
    let cpu = profile(
        "cpu",
        &[
            ("burn", "8", "worker", 3, 30_000_000),
            ("parse", "7", "app", 1, 10_000_000),
        ],
    );
    let off_cpu = profile(
        "off_cpu",
        &[
            ("sleep_wait", "8", "worker", 7, 70_000_000),
            ("pipe_wait", "8", "worker", 2, 20_000_000),
        ],
    );
    let wall = wall_profile(&cpu, &off_cpu);
    validate(&wall).expect("a valid profile");
    let reader = Reader::new(&wall);
    assert_eq!(reader.sample_types(), vec![("wall", "nanoseconds")]);
    let stacks: Vec<(Vec<String>, i64, Option<&str>)> = reader
        .samples()
        .map(|sample| {
            let mut names = sample.function_names();
            names.reverse();
            (names, sample.sample.value[0], sample.label(STATE))
        })
        .collect();
    let expected = |names: &[&str], ns: i64, state: &'static str| {
        (
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
            ns,
            Some(state),
        )
    };
    assert_eq!(
        stacks,
        vec![
            expected(&["worker 8", "main", "burn"], 30_000_000, ON_CPU),
            expected(&["app 7", "main", "parse"], 10_000_000, ON_CPU),
            expected(&["worker 8", "main", "sleep_wait"], 70_000_000, OFF_CPU),
            expected(&["worker 8", "main", "pipe_wait"], 20_000_000, OFF_CPU),
        ]
    );
    // Functions (main, burn, parse, sleep_wait, pipe_wait) and threads
    // (worker 8, app 7) are kept once; the empty string too.
    assert_eq!(wall.function.len(), 7, "{:?}", wall.function);
    assert_eq!(wall.string_table.iter().filter(|s| s.is_empty()).count(), 1);
    let times = thread_times(&wall);
    assert_eq!(
        times,
        vec![
            ThreadTime {
                thread: "worker 8".into(),
                on_cpu_ns: 30_000_000,
                off_cpu_ns: 90_000_000,
            },
            ThreadTime {
                thread: "app 7".into(),
                on_cpu_ns: 10_000_000,
                off_cpu_ns: 0,
            },
        ]
    );
    let table = render_thread_times(&times, 1);
    assert!(table.contains("25.0% on  worker 8"), "{table}");
    assert!(table.contains("(1 more threads)"), "{table}");
}
