use super::*;

/// Two processes: `app` (pid 10) spends 6 samples in `leaf` under
/// `main` (4 of them inside the kernel's `ksys_write`), `db` (pid 20)
/// 2 samples in a recursive `walk`.
fn profile() -> proto::Profile {
    let strings = [
        "",
        "samples",
        "count",
        "[kernel.kallsyms]",
        "/bin/app",
        "main",
        "leaf",
        "ksys_write",
        "walk",
        "comm",
        "pid",
        "app",
        "db",
        "10",
        "20",
    ];
    let s = |text: &str| strings.iter().position(|&x| x == text).expect("interned") as i64;
    let function = |id: u64, name: &str| proto::Function {
        id,
        name: s(name),
        ..Default::default()
    };
    let location = |id: u64, mapping_id: u64, function_id: u64| proto::Location {
        id,
        mapping_id,
        address: id * 16,
        line: vec![proto::Line {
            function_id,
            ..Default::default()
        }],
        ..Default::default()
    };
    let label = |key: &str, value: &str| proto::Label {
        key: s(key),
        str: s(value),
        ..Default::default()
    };
    let sample = |locations: Vec<u64>, count: i64, comm: &str, pid: &str| proto::Sample {
        location_id: locations,
        value: vec![count],
        label: vec![label("comm", comm), label("pid", pid)],
    };
    proto::Profile {
        sample_type: vec![proto::ValueType {
            r#type: s("samples"),
            unit: s("count"),
        }],
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
                ..Default::default()
            },
        ],
        function: vec![
            function(1, "main"),
            function(2, "leaf"),
            function(3, "ksys_write"),
            function(4, "walk"),
        ],
        location: vec![
            location(1, 2, 1),
            location(2, 2, 2),
            location(3, 1, 3),
            location(4, 2, 4),
        ],
        sample: vec![
            sample(vec![2, 1], 2, "app", "10"),
            sample(vec![3, 2, 1], 4, "app", "10"),
            sample(vec![4, 4, 4], 2, "db", "20"),
        ],
        ..Default::default()
    }
}

fn share<'a>(summary: &'a Summary, name: &str) -> &'a FunctionShare {
    summary
        .functions
        .iter()
        .find(|share| share.function.name == name)
        .unwrap_or_else(|| panic!("{name} in {summary:?}"))
}

#[test]
fn self_and_total_add_up_and_recursion_counts_once() {
    let summary = Summary::of(&profile(), &SampleFilter::default());
    assert_eq!(summary.total, 8);
    assert_eq!(summary.processes, 2);
    assert_eq!(summary.unit, "samples");
    let names: Vec<&str> = summary
        .functions
        .iter()
        .map(|share| share.function.name.as_str())
        .collect();
    assert_eq!(names, ["ksys_write", "leaf", "walk", "main"]);
    assert_eq!(
        (
            share(&summary, "main").self_count,
            share(&summary, "main").total_count
        ),
        (0, 6)
    );
    assert_eq!(
        (
            share(&summary, "leaf").self_count,
            share(&summary, "leaf").total_count
        ),
        (2, 6)
    );
    assert_eq!(
        (
            share(&summary, "walk").self_count,
            share(&summary, "walk").total_count
        ),
        (2, 2)
    );
    assert!(share(&summary, "ksys_write").function.kernel);
    assert_eq!(share(&summary, "leaf").function.object, "app");
}

#[test]
fn filters_keep_processes_by_pid_or_comm() {
    let by_pid = SampleFilter {
        pids: vec![20],
        comms: Vec::new(),
    };
    assert_eq!(Summary::of(&profile(), &by_pid).total, 2);
    let by_comm = SampleFilter {
        pids: Vec::new(),
        comms: vec!["app".into()],
    };
    let summary = Summary::of(&profile(), &by_comm);
    assert_eq!((summary.total, summary.processes), (6, 1));
    let nobody = SampleFilter {
        pids: vec![99],
        comms: Vec::new(),
    };
    let text = render_summary(&Summary::of(&profile(), &nobody), 5, None);
    assert!(text.contains("no samples"), "{text}");
}

#[test]
fn folded_stacks_merge_root_first_with_kernel_marks() {
    assert_eq!(
        folded_stacks(&profile(), &SampleFilter::default()),
        [
            "app;main;leaf 2",
            "app;main;leaf;ksys_write_[k] 4",
            "db;walk;walk;walk 2"
        ]
    );
}

#[test]
fn the_text_summary_lists_shares_and_stays_plain() {
    let mut profile = profile();
    profile.string_table[8] = "walk\u{1b}[2J".into();
    let text = render_summary(
        &Summary::of(&profile, &SampleFilter::default()),
        3,
        Some(60),
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# 8 samples, 2 processes");
    assert_eq!(lines[2], "   50.00%   50.00%  ksys_write [kernel]");
    assert_eq!(lines[3], "   75.00%   25.00%  leaf  (app)");
    assert!(lines[4].contains("walk?[2J"), "{text}");
    assert_eq!(lines.len(), 5);
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'));
    let folded = folded_stacks(&profile, &SampleFilter::default());
    assert_eq!(folded[2], "db;walk?[2J;walk?[2J;walk?[2J 2");
}

#[test]
fn a_numeric_pid_label_filters_too() {
    let mut profile = profile();
    let pid_key = profile
        .string_table
        .iter()
        .position(|s| s == "pid")
        .expect("interned") as i64;
    for sample in &mut profile.sample {
        let value: i64 = if sample.value[0] == 2 && sample.location_id[0] == 4 {
            20
        } else {
            10
        };
        sample.label.retain(|label| label.key != pid_key);
        sample.label.push(proto::Label {
            key: pid_key,
            num: value,
            ..Default::default()
        });
    }
    let by_pid = SampleFilter {
        pids: vec![20],
        comms: Vec::new(),
    };
    assert_eq!(Summary::of(&profile, &by_pid).total, 2);
}
