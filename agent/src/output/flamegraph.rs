//! Flame graphs (SVG, inferno) from a built pprof profile.

use std::{fs::File, io::BufWriter, path::Path};

use super::OutputError;
use crate::pprof::{proto, sample_label};

const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Folded stacks, one line per sample: `comm;root;...;leaf count`, kernel
/// frames marked `_[k]` as perf's scripts do.
pub fn collapsed_stacks(profile: &proto::Profile) -> Vec<String> {
    let string = |index: i64| -> &str {
        profile
            .string_table
            .get(usize::try_from(index).unwrap_or(0))
            .map_or("", String::as_str)
    };
    let item = |id: u64, list_len: usize| {
        usize::try_from(id)
            .ok()
            .filter(|&i| i >= 1 && i <= list_len)
            .map(|i| i - 1)
    };
    let mut lines = Vec::with_capacity(profile.sample.len());
    for sample in &profile.sample {
        let mut frames: Vec<String> = Vec::new();
        // Root first: reverse the leaf-first location list, and each
        // location's inline list (caller last) too.
        for &location_id in sample.location_id.iter().rev() {
            let Some(location) =
                item(location_id, profile.location.len()).map(|i| &profile.location[i])
            else {
                continue;
            };
            let mapping =
                item(location.mapping_id, profile.mapping.len()).map(|i| &profile.mapping[i]);
            let is_kernel = mapping.is_some_and(|m| string(m.filename) == KERNEL_MAPPING);
            if location.line.is_empty() {
                let name = mapping
                    .map(|m| string(m.filename))
                    .filter(|name| !name.is_empty())
                    .map_or_else(
                        || "[unknown]".to_owned(),
                        |name| {
                            format!(
                                "[{}]",
                                name.rsplit('/')
                                    .next()
                                    .unwrap_or(name)
                                    .trim_matches(['[', ']'])
                            )
                        },
                    );
                frames.push(name);
                continue;
            }
            for line in location.line.iter().rev() {
                let name = item(line.function_id, profile.function.len())
                    .map_or("[unknown]", |i| string(profile.function[i].name));
                let mut name = name.replace(';', ":");
                if is_kernel {
                    name.push_str("_[k]");
                }
                frames.push(name);
            }
        }
        let comm = sample_label(profile, sample, "comm").unwrap_or("[unknown]");
        let count = sample.value.first().copied().unwrap_or(0);
        if count > 0 {
            lines.push(format!(
                "{};{} {count}",
                comm.replace(';', ":"),
                frames.join(";")
            ));
        }
    }
    lines.sort_unstable();
    lines
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
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    options.count_name = "samples".to_owned();
    if lines.is_empty() {
        // inferno refuses empty input; an empty graph still says "no samples".
        let placeholder = ["no samples 1"];
        return inferno::flamegraph::from_lines(
            &mut options,
            placeholder.iter().copied(),
            BufWriter::new(file),
        )
        .map_err(|source| OutputError::FlameGraph { source });
    }
    inferno::flamegraph::from_lines(
        &mut options,
        lines.iter().map(String::as_str),
        BufWriter::new(file),
    )
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
