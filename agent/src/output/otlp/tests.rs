use agent_pprof::proto as pprof;
use prost::Message;

use super::{
    convert::{BUILD_ID, FRAME_TYPE, RequestBuilder, frame_type},
    proto::{self, any_value, legacy},
};

const STRINGS: [&str; 16] = [
    "",
    "samples",
    "count",
    "cpu",
    "nanoseconds",
    "/usr/bin/app",
    "abcd",
    "[kernel.kallsyms]",
    "main",
    "work",
    "app.c",
    "do_syscall_64",
    "thread_name",
    "worker",
    "thread_id",
    "42",
];

/// A pprof as firn builds one: two sample types, a kernel and a user
/// mapping, a thread label.
fn profile() -> pprof::Profile {
    let function = |id, name| pprof::Function {
        id,
        name,
        system_name: name,
        filename: if name == 11 { 0 } else { 10 },
        start_line: 0,
    };
    let location = |id, mapping_id, function_id| pprof::Location {
        id,
        mapping_id,
        address: 0x1000 * id,
        line: vec![pprof::Line {
            function_id,
            line: i64::try_from(id).expect("small"),
            column: 0,
        }],
        is_folded: false,
    };
    pprof::Profile {
        sample_type: vec![
            pprof::ValueType { r#type: 1, unit: 2 },
            pprof::ValueType { r#type: 3, unit: 4 },
        ],
        sample: vec![
            pprof::Sample {
                location_id: vec![3, 2, 1],
                value: vec![5, 50],
                label: vec![],
            },
            pprof::Sample {
                location_id: vec![2, 1],
                value: vec![2, 20],
                label: vec![
                    pprof::Label {
                        key: 12,
                        str: 13,
                        ..Default::default()
                    },
                    pprof::Label {
                        key: 14,
                        str: 15,
                        ..Default::default()
                    },
                ],
            },
        ],
        mapping: vec![
            pprof::Mapping {
                id: 1,
                memory_start: 0x1000,
                memory_limit: 0x9000,
                filename: 5,
                build_id: 6,
                ..Default::default()
            },
            pprof::Mapping {
                id: 2,
                memory_start: 0xffff_8000_0000_0000,
                memory_limit: u64::MAX,
                filename: 7,
                ..Default::default()
            },
        ],
        location: vec![location(1, 1, 1), location(2, 1, 2), location(3, 2, 3)],
        function: vec![function(1, 8), function(2, 9), function(3, 11)],
        string_table: STRINGS.iter().map(|s| (*s).to_owned()).collect(),
        period_type: Some(pprof::ValueType { r#type: 3, unit: 4 }),
        period: 10_000_000,
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    }
}

fn labels() -> Vec<(String, String)> {
    [
        ("service_name", "shop/app"),
        ("pid", "1234"),
        ("executable", "app"),
        ("namespace", "shop"),
        ("pod", "app-1"),
        ("container", "app"),
        ("comm", "app"),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
    .collect()
}

fn text(value: Option<&proto::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

#[test]
fn a_profile_keeps_its_stacks_totals_and_conventions() {
    let mut builder = RequestBuilder::default();
    builder.add(&labels(), &profile(), 0).expect("converts");
    builder.add(&labels(), &profile(), 1).expect("converts");
    let request = builder.finish();
    let dictionary = request.dictionary.as_ref().expect("dictionary");
    assert_eq!(dictionary.string_table[0], "");
    assert_eq!(request.resource_profiles.len(), 2);
    // One dictionary: the second series adds no stacks.
    assert_eq!(dictionary.stack_table.len(), 3, "zero entry and two stacks");
    let resource = request.resource_profiles[0]
        .resource
        .as_ref()
        .expect("resource");
    let attribute = |key: &str| {
        resource
            .attributes
            .iter()
            .find(|a| a.key == key)
            .map(|a| text(a.value.as_ref()))
    };
    assert_eq!(attribute("service.name").as_deref(), Some("shop/app"));
    assert_eq!(attribute("process.pid").as_deref(), Some("1234"));
    assert_eq!(attribute("k8s.container.name").as_deref(), Some("app"));
    assert_eq!(attribute("k8s.namespace.name").as_deref(), Some("shop"));
    assert_eq!(
        attribute("process.executable.path").as_deref(),
        Some("/usr/bin/app")
    );
    let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
    let total: i64 = profile.samples.iter().flat_map(|s| &s.values).sum();
    assert_eq!(total, 7, "the samples/count total of the pprof");
    assert_eq!(profile.period, 10_000_000);
    // The first sample's stack, leaf first, named and typed.
    let stack = &dictionary.stack_table[profile.samples[0].stack_index as usize];
    let frames: Vec<(String, String)> = stack
        .location_indices
        .iter()
        .map(|&index| {
            let location = &dictionary.location_table[index as usize];
            let function = &dictionary.function_table[location.lines[0].function_index as usize];
            let kind = location
                .attribute_indices
                .iter()
                .map(|&a| &dictionary.attribute_table[a as usize])
                .find(|a| dictionary.string_table[a.key_strindex as usize] == FRAME_TYPE)
                .map(|a| text(a.value.as_ref()))
                .unwrap_or_default();
            (
                dictionary.string_table[function.name_strindex as usize].clone(),
                kind,
            )
        })
        .collect();
    let expected = [
        ("do_syscall_64", "kernel"),
        ("work", "native"),
        ("main", "native"),
    ];
    assert_eq!(
        frames,
        expected.map(|(f, k)| (f.to_owned(), k.to_owned())).to_vec()
    );
    // The user mapping carries its build id.
    let location = &dictionary.location_table[stack.location_indices[1] as usize];
    let mapping = &dictionary.mapping_table[location.mapping_index as usize];
    let build_id = &dictionary.attribute_table[mapping.attribute_indices[0] as usize];
    assert_eq!(
        dictionary.string_table[build_id.key_strindex as usize],
        BUILD_ID
    );
    assert_eq!(text(build_id.value.as_ref()), "abcd");
    // Thread labels become thread.name and thread.id.
    let keys: Vec<&str> = profile.samples[1]
        .attribute_indices
        .iter()
        .map(|&a| {
            let attribute = &dictionary.attribute_table[a as usize];
            dictionary.string_table[attribute.key_strindex as usize].as_str()
        })
        .collect();
    assert_eq!(keys, ["thread.name", "thread.id"]);
}

#[test]
fn the_older_release_differs_only_in_how_samples_are_numbered() {
    let mut builder = RequestBuilder::default();
    builder.add(&labels(), &profile(), 0).expect("converts");
    let current = builder.finish();
    let old = legacy::from_current(current.clone());
    let old_bytes = old.encode_to_vec();
    assert_ne!(old_bytes, current.encode_to_vec());
    let back = legacy::ExportProfilesServiceRequest::decode(old_bytes.as_slice()).expect("decodes");
    let sample = &back.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    assert_eq!(sample.values, [5]);
    // Read as the newer release, the older one's samples are refused or
    // lose their values: the user has to pick the receiver's release.
    let misread = proto::ExportProfilesServiceRequest::decode(old_bytes.as_slice());
    let values_survive = misread.is_ok_and(|request| {
        !request.resource_profiles[0].scope_profiles[0].profiles[0].samples[0]
            .values
            .is_empty()
    });
    assert!(!values_survive);
}

#[test]
fn frame_kinds_follow_the_mapping() {
    assert_eq!(frame_type("[kernel.kallsyms]"), "kernel");
    assert_eq!(frame_type("[python]"), "cpython");
    assert_eq!(frame_type("[java]"), "jvm");
    assert_eq!(frame_type("[java:c2]"), "jvm");
    assert_eq!(frame_type("[java:interpreted]"), "jvm");
    assert_eq!(frame_type("[javascript]"), "v8js");
    assert_eq!(frame_type("[javascript:inlined]"), "v8js");
    assert_eq!(frame_type("[ruby]"), "ruby");
    assert_eq!(frame_type("[anon]"), "jit");
    assert_eq!(frame_type("[vdso]"), "native");
    assert_eq!(frame_type("/usr/lib/libc.so.6"), "native");
}

#[test]
fn an_off_cpu_profile_keeps_its_time_waited() {
    let mut off_cpu = profile();
    crate::offcpu::mark_profile(&mut off_cpu);
    let mut builder = RequestBuilder::default();
    builder.add(&labels(), &off_cpu, 0).expect("converts");
    let request = builder.finish();
    let dictionary = request.dictionary.as_ref().expect("dictionary");
    let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
    let sample_type = profile.sample_type.as_ref().expect("sample type");
    let text = |index: i32| dictionary.string_table[index as usize].as_str();
    assert_eq!(
        (
            text(sample_type.type_strindex),
            text(sample_type.unit_strindex)
        ),
        ("off_cpu", "nanoseconds")
    );
    let waited: i64 = profile.samples.iter().flat_map(|s| &s.values).sum();
    let expected: i64 = off_cpu.sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(waited, expected, "the time values, not the counts");
}
