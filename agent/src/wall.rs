//! The wall-clock view of a recording (`firn record --off-cpu`): each
//! thread's time on the CPU (its CPU samples, a sampling period each) and
//! off it (its off-CPU samples, the time waited) in one profile, the
//! thread as the root frame and `state` (`on-cpu`, `off-cpu`) a label,
//! so a thread's flame graph shows where its wall-clock time went.

use std::collections::{BTreeMap, HashMap};

use agent_pprof::{Reader, proto};

/// The one sample type: nanoseconds of wall-clock time.
pub const SAMPLE_TYPE: &str = "wall";
/// The label saying whether a sample ran or waited.
pub const STATE: &str = "state";
pub const ON_CPU: &str = "on-cpu";
pub const OFF_CPU: &str = "off-cpu";

/// One thread's wall-clock time, as the view holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadTime {
    /// `NAME TID`, as its root frame says.
    pub thread: String,
    pub on_cpu_ns: i64,
    pub off_cpu_ns: i64,
}

/// The CPU profile and the off-CPU one (both as `firn record` builds them:
/// `samples/count` then a time in nanoseconds) as one wall-clock profile.
pub fn wall_profile(cpu: &proto::Profile, off_cpu: &proto::Profile) -> proto::Profile {
    let mut merger = Merger::default();
    merger.out.string_table.push(String::new());
    merger.strings.insert(String::new(), 0);
    let wall = merger.string(SAMPLE_TYPE);
    let nanoseconds = merger.string("nanoseconds");
    merger.out.sample_type = vec![proto::ValueType {
        r#type: wall,
        unit: nanoseconds,
    }];
    merger.out.period_type = Some(proto::ValueType {
        r#type: wall,
        unit: nanoseconds,
    });
    merger.out.period = 1;
    merger.out.time_nanos = cpu.time_nanos;
    merger.out.duration_nanos = cpu.duration_nanos.max(off_cpu.duration_nanos);
    merger.add(cpu, ON_CPU);
    merger.add(off_cpu, OFF_CPU);
    merger.out
}

/// Each thread's time on and off the CPU in a wall-clock profile, the
/// threads with the most wall-clock time first.
pub fn thread_times(wall: &proto::Profile) -> Vec<ThreadTime> {
    let mut threads: BTreeMap<String, ThreadTime> = BTreeMap::new();
    for sample in Reader::new(wall).samples() {
        let Some(root) = sample.frames().last().map(|frame| frame.display_name()) else {
            continue;
        };
        let ns = sample.sample.value.first().copied().unwrap_or(0);
        let time = threads.entry(root.clone()).or_insert_with(|| ThreadTime {
            thread: root,
            ..ThreadTime::default()
        });
        match sample.label(STATE) {
            Some(OFF_CPU) => time.off_cpu_ns = time.off_cpu_ns.saturating_add(ns),
            _ => time.on_cpu_ns = time.on_cpu_ns.saturating_add(ns),
        }
    }
    let mut threads: Vec<ThreadTime> = threads.into_values().collect();
    threads.sort_by_key(|t| std::cmp::Reverse(t.on_cpu_ns.saturating_add(t.off_cpu_ns)));
    threads
}

/// The table of [`thread_times`], for `firn record`'s summary.
pub fn render_thread_times(threads: &[ThreadTime], top: usize) -> String {
    let seconds = |ns: i64| ns as f64 / 1e9;
    let mut text = String::from("# wall-clock per thread: on-CPU + off-CPU\n");
    for thread in threads.iter().take(top) {
        let total = thread.on_cpu_ns.saturating_add(thread.off_cpu_ns).max(1);
        text.push_str(&format!(
            "  {:>8.3}s on-CPU {:>8.3}s off-CPU {:>5.1}% on  {}\n",
            seconds(thread.on_cpu_ns),
            seconds(thread.off_cpu_ns),
            100.0 * thread.on_cpu_ns as f64 / total as f64,
            crate::report::strip_control(&thread.thread),
        ));
    }
    if threads.len() > top {
        text.push_str(&format!("  ({} more threads)\n", threads.len() - top));
    }
    text
}

/// The profile being built, and where each source's strings, functions,
/// mappings and locations went.
#[derive(Default)]
struct Merger {
    out: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64, i64), u64>,
    threads: HashMap<String, u64>,
}

/// One source profile's ids, mapped to the merged profile's.
#[derive(Default)]
struct Ids {
    mappings: HashMap<u64, u64>,
    locations: HashMap<u64, u64>,
}

impl Merger {
    fn string(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.strings.get(text) {
            return index;
        }
        let index = self.out.string_table.len() as i64;
        self.out.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), index);
        index
    }

    fn source_string(&mut self, source: &proto::Profile, index: i64) -> i64 {
        let text = usize::try_from(index)
            .ok()
            .and_then(|index| source.string_table.get(index))
            .map_or("", String::as_str);
        self.string(text)
    }

    /// Every sample of `source`, its time value (the last one, nanoseconds)
    /// as the wall-clock time, under its thread's root frame.
    fn add(&mut self, source: &proto::Profile, state: &str) {
        let mut ids = Ids::default();
        let state_key = self.string(STATE);
        let state_value = self.string(state);
        let reader = Reader::new(source);
        for view in reader.samples() {
            let ns = view.sample.value.last().copied().unwrap_or(0);
            if ns <= 0 {
                continue;
            }
            let thread = thread_frame(&view);
            let mut location_id: Vec<u64> = view
                .sample
                .location_id
                .iter()
                .filter_map(|&id| self.location(source, &mut ids, id))
                .collect();
            location_id.push(self.thread_location(&thread));
            let mut label: Vec<proto::Label> = view
                .sample
                .label
                .iter()
                .map(|label| proto::Label {
                    key: self.source_string(source, label.key),
                    str: self.source_string(source, label.str),
                    num: label.num,
                    num_unit: self.source_string(source, label.num_unit),
                })
                .collect();
            label.push(proto::Label {
                key: state_key,
                str: state_value,
                ..Default::default()
            });
            self.out.sample.push(proto::Sample {
                location_id,
                value: vec![ns],
                label,
            });
        }
    }

    fn thread_location(&mut self, thread: &str) -> u64 {
        if let Some(&id) = self.threads.get(thread) {
            return id;
        }
        let name = self.string(thread);
        let function = self.function(name, name, 0);
        let id = self.out.location.len() as u64 + 1;
        self.out.location.push(proto::Location {
            id,
            line: vec![proto::Line {
                function_id: function,
                ..Default::default()
            }],
            ..Default::default()
        });
        self.threads.insert(thread.to_owned(), id);
        id
    }

    fn function(&mut self, name: i64, system_name: i64, filename: i64) -> u64 {
        let key = (name, system_name, filename);
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.out.function.len() as u64 + 1;
        self.out.function.push(proto::Function {
            id,
            name,
            system_name,
            filename,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    fn mapping(&mut self, source: &proto::Profile, ids: &mut Ids, id: u64) -> u64 {
        if id == 0 {
            return 0;
        }
        if let Some(&mapped) = ids.mappings.get(&id) {
            return mapped;
        }
        let Some(mapping) = source.mapping.iter().find(|m| m.id == id) else {
            return 0;
        };
        let mapped = self.out.mapping.len() as u64 + 1;
        let mut copy = *mapping;
        copy.id = mapped;
        copy.filename = self.source_string(source, mapping.filename);
        copy.build_id = self.source_string(source, mapping.build_id);
        self.out.mapping.push(copy);
        ids.mappings.insert(id, mapped);
        mapped
    }

    fn location(&mut self, source: &proto::Profile, ids: &mut Ids, id: u64) -> Option<u64> {
        if let Some(&mapped) = ids.locations.get(&id) {
            return Some(mapped);
        }
        let location = source.location.iter().find(|l| l.id == id)?;
        let mapping_id = self.mapping(source, ids, location.mapping_id);
        let mut line = Vec::with_capacity(location.line.len());
        for source_line in &location.line {
            let Some(function) = source
                .function
                .iter()
                .find(|f| f.id == source_line.function_id)
            else {
                continue;
            };
            let name = self.source_string(source, function.name);
            let system_name = self.source_string(source, function.system_name);
            let filename = self.source_string(source, function.filename);
            line.push(proto::Line {
                function_id: self.function(name, system_name, filename),
                line: source_line.line,
                ..Default::default()
            });
        }
        let mapped = self.out.location.len() as u64 + 1;
        self.out.location.push(proto::Location {
            id: mapped,
            mapping_id,
            address: location.address,
            line,
            is_folded: location.is_folded,
        });
        ids.locations.insert(id, mapped);
        Some(mapped)
    }
}

/// A sample's thread as its root frame names it: `NAME TID`, from the
/// thread labels `firn record` gives every sample (the process's `comm`
/// and `pid` for a main thread without them).
fn thread_frame(sample: &agent_pprof::SampleView<'_>) -> String {
    let tid = sample
        .label("thread_id")
        .or_else(|| sample.label("pid"))
        .unwrap_or("?");
    let name = sample
        .label("thread_name")
        .or_else(|| sample.label("comm"))
        .unwrap_or("[unknown]");
    format!("{name} {tid}")
}

#[cfg(test)]
mod tests;
