//! Flame graphs (SVG, inferno) from a built pprof profile.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use agent_pprof::proto;

use super::OutputError;
use crate::report::{SampleFilter, folded_stacks};

/// Folded stacks, one line per distinct stack: `comm;root;...;leaf count`.
pub fn collapsed_stacks(profile: &proto::Profile) -> Vec<String> {
    folded_stacks(profile, &SampleFilter::default())
}

pub fn write_flamegraph(
    profile: &proto::Profile,
    title: &str,
    path: &Path,
) -> Result<(), OutputError> {
    let lines = collapsed_stacks(profile);
    let file = File::create(path).map_err(|source| OutputError::Write {
        path: path.display().to_string(),
        source,
    })?;
    render_flamegraph(&lines, title, BufWriter::new(file))
}

/// An SVG flame graph of folded stacks, into `writer`.
pub fn render_flamegraph(
    lines: &[String],
    title: &str,
    writer: impl Write,
) -> Result<(), OutputError> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    options.count_name = "samples".to_owned();
    // inferno refuses empty input; an empty graph still says "no samples".
    let placeholder = ["no samples 1".to_owned()];
    let lines = if lines.is_empty() {
        &placeholder[..]
    } else {
        lines
    };
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), writer)
        .map_err(|source| OutputError::FlameGraph { source })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ];
        let s = |text: &str| strings.iter().position(|&x| x == text).expect("interned") as i64;
        let function = |id: u64, name: &str| proto::Function {
            id,
            name: s(name),
            ..Default::default()
        };
        let line = |function_id| proto::Line {
            function_id,
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
                    ..Default::default()
                },
            ],
            function: vec![
                function(1, "main"),
                function(2, "inlined"),
                function(3, "ksys_write"),
            ],
            location: vec![
                proto::Location {
                    id: 1,
                    mapping_id: 1,
                    address: 1,
                    line: vec![line(3)],
                    ..Default::default()
                },
                proto::Location {
                    id: 2,
                    mapping_id: 2,
                    address: 2,
                    line: vec![line(2), line(1)],
                    ..Default::default()
                },
                proto::Location {
                    id: 3,
                    mapping_id: 2,
                    address: 3,
                    line: vec![],
                    ..Default::default()
                },
            ],
            sample: vec![proto::Sample {
                location_id: vec![1, 3, 2],
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

    #[test]
    fn stacks_fold_root_first_with_inlines_and_kernel_marks() {
        assert_eq!(
            collapsed_stacks(&profile()),
            ["app;main;inlined;[app];ksys_write_[k] 5"]
        );
    }

    #[test]
    fn svg_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("flame.svg");
        write_flamegraph(&profile(), "test", &path).expect("renders");
        let svg = std::fs::read_to_string(&path).expect("written");
        assert!(svg.contains("<svg") && svg.contains("ksys_write"));
        let empty = proto::Profile::default();
        write_flamegraph(&empty, "empty", &path).expect("empty profiles render too");
    }
}
