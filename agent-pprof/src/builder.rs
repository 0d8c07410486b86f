//! Symbolized stacks -> pprof, following the rules a Parca server
//! enforces: string 0 is "", ids sequential from 1, one value per sample
//! type, non-zero location ids, real mapping ranges and runtime addresses,
//! lines on every location that was named.

use std::time::UNIX_EPOCH;

// Every string, location and function of a profile goes through these maps;
// the keys come from firn, not from an adversary, so a fast hash will do.
use foldhash::HashMap;

use crate::{
    input::{Frame, Frames, Interval, Line, Origin, Stack},
    proto,
};

/// Counts from one build, for the interval's summary and counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildSummary {
    pub samples: u64,
    pub locations: usize,
    pub functions: usize,
    pub mappings: usize,
    /// Distinct user locations without an object (outside every mapping,
    /// JIT code its perf map does not name, files that could not be read).
    pub unknown_user_locations: usize,
    /// Distinct user locations in a known object without a name.
    pub unsymbolized_user_locations: usize,
    pub unsymbolized_kernel_locations: usize,
}

impl BuildSummary {
    /// Adds another build's counts (profiles of one interval).
    pub fn add(&mut self, other: &Self) {
        self.samples += other.samples;
        self.locations += other.locations;
        self.functions += other.functions;
        self.mappings += other.mappings;
        self.unknown_user_locations += other.unknown_user_locations;
        self.unsymbolized_user_locations += other.unsymbolized_user_locations;
        self.unsymbolized_kernel_locations += other.unsymbolized_kernel_locations;
    }
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut strings = Self::default();
        strings.intern("");
        strings
    }

    fn intern(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.index.get(text) {
            return index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), index);
        index
    }
}

struct Builder<'a> {
    input: &'a Frames,
    strings: Strings,
    mappings: Vec<proto::Mapping>,
    /// By index into the input's mappings.
    mapping_ids: HashMap<usize, u64>,
    locations: Vec<proto::Location>,
    /// By index into the input's frames.
    location_ids: HashMap<usize, u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(i64, i64, i64), u64>,
    summary: BuildSummary,
}

/// Builds one profile of `stacks`, which point into `frames`. Only the
/// frames and mappings the stacks use become locations and mappings.
pub fn build(
    frames: &Frames,
    stacks: &[Stack],
    interval: Interval,
) -> (proto::Profile, BuildSummary) {
    let mut builder = Builder {
        input: frames,
        strings: Strings::new(),
        mappings: Vec::new(),
        mapping_ids: HashMap::default(),
        locations: Vec::new(),
        location_ids: HashMap::default(),
        functions: Vec::new(),
        function_ids: HashMap::default(),
        summary: BuildSummary::default(),
    };
    let samples_type = builder.value_type("samples", "count");
    let cpu_type = builder.value_type("cpu", "nanoseconds");
    let mut samples = Vec::with_capacity(stacks.len());
    for stack in stacks {
        let count = i64::try_from(stack.count).unwrap_or(i64::MAX);
        samples.push(proto::Sample {
            location_id: builder.stack_locations(stack),
            value: vec![count, count.saturating_mul(interval.period_ns)],
            label: builder.labels(stack),
        });
        builder.summary.samples += count as u64;
    }
    // Samples with no frames at all cannot be sent (Parca rejects empty
    // stacks); every sampled stack has at least its instruction pointer.
    samples.retain(|s| !s.location_id.is_empty());

    let summary = BuildSummary {
        locations: builder.locations.len(),
        functions: builder.functions.len(),
        mappings: builder.mappings.len(),
        ..builder.summary
    };
    let time_nanos = interval
        .start
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let profile = proto::Profile {
        sample_type: vec![samples_type, cpu_type],
        sample: samples,
        mapping: builder.mappings,
        location: builder.locations,
        function: builder.functions,
        string_table: builder.strings.table,
        time_nanos,
        duration_nanos: i64::try_from(interval.duration.as_nanos())
            .unwrap_or(i64::MAX)
            .max(1),
        period_type: Some(cpu_type),
        period: interval.period_ns,
        ..Default::default()
    };
    (profile, summary)
}

impl Builder<'_> {
    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.strings.intern(kind),
            unit: self.strings.intern(unit),
        }
    }

    fn labels(&mut self, stack: &Stack) -> Vec<proto::Label> {
        stack
            .labels
            .iter()
            .map(|(key, value)| proto::Label {
                key: self.strings.intern(key),
                str: self.strings.intern(value),
                ..Default::default()
            })
            .collect()
    }

    /// Location ids, leaf first. A frame index beyond the table (a bug in
    /// the caller) is left out rather than panicking the build.
    fn stack_locations(&mut self, stack: &Stack) -> Vec<u64> {
        stack
            .frames
            .iter()
            .filter_map(|&index| self.location(index))
            .collect()
    }

    fn location(&mut self, index: usize) -> Option<u64> {
        if let Some(&id) = self.location_ids.get(&index) {
            return Some(id);
        }
        let input = self.input;
        let frame = input.frames.get(index)?;
        self.count_unnamed(frame);
        let mapping_id = match frame.mapping {
            Some(mapping) => self.mapping(mapping, &frame.lines),
            None => 0,
        };
        let lines = frame
            .lines
            .iter()
            .map(|line| proto::Line {
                function_id: self.function(line),
                line: line.line.map_or(0, i64::from),
                column: 0,
            })
            .collect();
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: frame.address,
            line: lines,
            is_folded: false,
        });
        self.location_ids.insert(index, id);
        Some(id)
    }

    fn count_unnamed(&mut self, frame: &Frame) {
        if !frame.lines.is_empty() {
            return;
        }
        let counter = match frame.origin {
            Origin::Kernel => &mut self.summary.unsymbolized_kernel_locations,
            Origin::Object => &mut self.summary.unsymbolized_user_locations,
            Origin::NoObject => &mut self.summary.unknown_user_locations,
        };
        *counter += 1;
    }

    /// The id of input mapping `index` (0 when beyond the table), which
    /// says from now on whatever `lines` hold.
    fn mapping(&mut self, index: usize, lines: &[Line]) -> u64 {
        let id = match self.mapping_ids.get(&index) {
            Some(&id) => id,
            None => {
                let Some(mapping) = self.input.mappings.get(index) else {
                    return 0;
                };
                let id = self.mappings.len() as u64 + 1;
                self.mappings.push(proto::Mapping {
                    id,
                    memory_start: mapping.start,
                    memory_limit: mapping.limit,
                    file_offset: mapping.offset,
                    filename: self.strings.intern(&mapping.path),
                    build_id: self.strings.intern(&mapping.build_id),
                    has_functions: mapping.kernel,
                    ..Default::default()
                });
                self.mapping_ids.insert(index, id);
                id
            }
        };
        let is_user = self.input.mappings.get(index).is_some_and(|m| !m.kernel);
        if is_user
            && !lines.is_empty()
            && let Some(mapping) = self.mappings.get_mut((id - 1) as usize)
        {
            mapping.has_functions = true;
            mapping.has_filenames |= lines.iter().any(|line| line.file.is_some());
            mapping.has_line_numbers |= lines.iter().any(|line| line.line.is_some());
            mapping.has_inline_frames |= lines.len() > 1;
        }
        id
    }

    fn function(&mut self, line: &Line) -> u64 {
        let name = self.strings.intern(&line.function);
        let system_name = self.strings.intern(&line.system_name);
        let filename = self.strings.intern(line.file.as_deref().unwrap_or(""));
        let key = (name, system_name, filename);
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        self.functions.push(proto::Function {
            id,
            name,
            system_name,
            filename,
            start_line: 0,
        });
        self.function_ids.insert(key, id);
        id
    }
}

#[cfg(test)]
mod tests;
