use super::*;

/// Written by hand, as another tool (or Parca) would: a kernel frame, an
/// inlined pair, an unnamed location, and broken references.
fn profile() -> proto::Profile {
    let strings = [
        "",
        "[kernel.kallsyms]",
        "/bin/app",
        "main",
        "inlined",
        "ksys_write",
        "comm",
        "app",
        "app.c",
        "_Z7inlinedv",
        "abcd",
    ];
    let s = |text: &str| strings.iter().position(|&x| x == text).expect("interned") as i64;
    let function = |id: u64, name: &str| proto::Function {
        id,
        name: s(name),
        filename: s("app.c"),
        ..Default::default()
    };
    proto::Profile {
        string_table: strings.iter().map(|x| x.to_string()).collect(),
        mapping: vec![
            proto::Mapping {
                id: 1,
                filename: s("[kernel.kallsyms]"),
                ..Default::default()
            },
            proto::Mapping {
                id: 2,
                filename: s("/bin/app"),
                build_id: s("abcd"),
                ..Default::default()
            },
        ],
        function: vec![
            function(1, "main"),
            proto::Function {
                system_name: s("_Z7inlinedv"),
                ..function(2, "inlined")
            },
            function(3, "ksys_write"),
        ],
        location: locations(),
        sample: vec![proto::Sample {
            location_id: vec![1, 3, 0, 2, 42],
            value: vec![5, 50],
            label: vec![proto::Label {
                key: s("comm"),
                str: s("app"),
                ..Default::default()
            }],
        }],
        ..Default::default()
    }
}

/// A kernel location, one holding an inlined pair and an unknown function,
/// and one in a mapping that does not exist.
fn locations() -> Vec<proto::Location> {
    let line = |function_id, line| proto::Line {
        function_id,
        line,
        ..Default::default()
    };
    vec![
        proto::Location {
            id: 1,
            mapping_id: 1,
            address: 0xffff_ffff_8100_0000,
            line: vec![line(3, 0)],
            ..Default::default()
        },
        proto::Location {
            id: 2,
            mapping_id: 2,
            address: 0x1234,
            line: vec![line(2, 7), line(1, 20), line(9, 1)],
            ..Default::default()
        },
        proto::Location {
            id: 3,
            mapping_id: 7,
            address: 0x5678,
            line: vec![],
            ..Default::default()
        },
    ]
}

#[test]
fn samples_resolve_into_frames_leaf_first() {
    let profile = profile();
    let reader = Reader::new(&profile);
    let sample = reader.samples().next().expect("one sample");
    assert_eq!(sample.count(), 5);
    assert_eq!(
        sample.function_names(),
        ["ksys_write", "0x5678", "inlined", "main", ""],
        "unknown locations are skipped, unknown functions read empty"
    );
    let frames = sample.frames();
    assert!(frames[0].is_kernel());
    assert!(frames[1].name.is_none() && frames[1].mapping.is_none());
    let inlined = frames[2];
    assert_eq!(
        (
            inlined.system_name,
            inlined.file,
            inlined.line,
            inlined.address
        ),
        ("_Z7inlinedv", "app.c", 7, 0x1234)
    );
    let mapping = inlined.mapping.expect("mapped");
    assert_eq!((mapping.filename, mapping.build_id), ("/bin/app", "abcd"));
    assert!(!mapping.is_kernel());
    assert_eq!((frames[3].name, frames[3].line), (Some("main"), 20));
}

#[test]
fn labels_and_strings_read_safely() {
    let profile = profile();
    let reader = Reader::new(&profile);
    let sample = reader.samples().next().expect("one sample");
    assert_eq!(sample.label("comm"), Some("app"));
    assert_eq!(sample.label("pid"), None);
    assert_eq!(sample.labels().collect::<Vec<_>>(), [("comm", "app")]);
    assert_eq!(reader.string(-1), "");
    assert_eq!(reader.string(1000), "");
    assert!(reader.sample_types().is_empty() && reader.period_type().is_none());
    assert_eq!(reader.mappings().count(), 2);

    let empty = proto::Profile::default();
    assert_eq!(Reader::new(&empty).samples().count(), 0);
}
