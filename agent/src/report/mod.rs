//! Reading a profile for a person: the hottest functions by self and total
//! share (`perf report --stdio`'s head), and the folded stacks flame graph
//! tools take. Works on any pprof profile, firn's or another profiler's;
//! samples can be narrowed to processes by their `pid` and `comm` labels.

mod text;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
};

use agent_pprof::{FrameView, Reader, SampleView, proto};

pub use text::{render_summary, strip_control};

/// `firn report`.
#[derive(Clone, Debug)]
pub struct ReportConfig {
    pub profile: PathBuf,
    /// Functions the text summary lists.
    pub top: usize,
    pub filter: SampleFilter,
    pub format: ReportFormat,
    /// `None`: standard output.
    pub output: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportFormat {
    /// The hottest functions by self and total share.
    Text,
    /// Folded stacks.
    Folded,
    /// An SVG flame graph.
    Flamegraph,
}

/// Which samples count: all when both lists are empty, else those whose
/// `pid` label is one of `pids` or whose `comm` label is one of `comms`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleFilter {
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
}

impl SampleFilter {
    pub fn keeps(&self, sample: &SampleView<'_>) -> bool {
        if self.pids.is_empty() && self.comms.is_empty() {
            return true;
        }
        let pid = sample
            .label("pid")
            .and_then(|pid| pid.parse::<u32>().ok())
            .or_else(|| {
                sample
                    .num_label("pid")
                    .and_then(|pid| u32::try_from(pid).ok())
            });
        pid.is_some_and(|pid| self.pids.contains(&pid))
            || sample
                .label("comm")
                .is_some_and(|comm| self.comms.iter().any(|wanted| wanted == comm))
    }
}

/// How a function is told apart: its name (or its object's, for frames
/// nobody named), and which side of the kernel boundary it runs on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionKey {
    pub name: String,
    /// The object's file name, without its directory; empty when unknown.
    pub object: String,
    pub kernel: bool,
}

impl FunctionKey {
    fn of(frame: &FrameView<'_>) -> Self {
        let object = frame
            .mapping
            .map(|mapping| mapping.filename)
            .filter(|name| !name.is_empty())
            .map(|name| {
                name.rsplit('/')
                    .next()
                    .unwrap_or(name)
                    .trim_matches(['[', ']'])
                    .to_owned()
            })
            .unwrap_or_default();
        let name = match frame.name {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ if object.is_empty() => "[unknown]".to_owned(),
            _ => format!("[{object}]"),
        };
        Self {
            name,
            object,
            kernel: frame.is_kernel(),
        }
    }
}

/// One function's share of the samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionShare {
    pub function: FunctionKey,
    /// Samples where it was the innermost frame.
    pub self_count: i64,
    /// Samples where it was anywhere on the stack (counted once per sample).
    pub total_count: i64,
}

/// What a profile's samples add up to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Sum of the kept samples' first value.
    pub total: i64,
    /// What the first value counts (`samples`, `count`, ...).
    pub unit: String,
    /// Distinct `pid` labels among the kept samples.
    pub processes: usize,
    /// Every function seen, hottest (by self, then total) first.
    pub functions: Vec<FunctionShare>,
}

impl Summary {
    pub fn of(profile: &proto::Profile, filter: &SampleFilter) -> Self {
        let reader = Reader::new(profile);
        let mut shares: HashMap<FunctionKey, (i64, i64)> = HashMap::new();
        let mut pids = HashSet::new();
        let mut total = 0i64;
        for sample in reader.samples().filter(|sample| filter.keeps(sample)) {
            let count = sample.count();
            if count <= 0 {
                continue;
            }
            total = total.saturating_add(count);
            if let Some(pid) = sample.label("pid") {
                pids.insert(pid);
            }
            let keys: Vec<FunctionKey> = sample.frames().iter().map(FunctionKey::of).collect();
            if let Some(leaf) = keys.first() {
                let entry = shares.entry(leaf.clone()).or_default();
                entry.0 = entry.0.saturating_add(count);
            }
            // A recursive function counts once per sample.
            let mut seen = HashSet::with_capacity(keys.len());
            for key in keys {
                if seen.insert(key.clone()) {
                    let entry = shares.entry(key).or_default();
                    entry.1 = entry.1.saturating_add(count);
                }
            }
        }
        let mut functions: Vec<FunctionShare> = shares
            .into_iter()
            .map(|(function, (self_count, total_count))| FunctionShare {
                function,
                self_count,
                total_count,
            })
            .collect();
        functions.sort_by(|a, b| {
            b.self_count
                .cmp(&a.self_count)
                .then(b.total_count.cmp(&a.total_count))
                .then_with(|| a.function.cmp(&b.function))
        });
        Self {
            total,
            unit: reader
                .sample_types()
                .first()
                .map(|(kind, _)| (*kind).to_owned())
                .unwrap_or_default(),
            processes: pids.len(),
            functions,
        }
    }
}

/// A frame as folded stacks name it (the flame graph's convention): `;`
/// would split it, kernel functions are marked `_[k]` as perf's scripts do;
/// control characters are replaced, as in the text summary.
pub fn folded_name(frame: &FrameView<'_>) -> String {
    let key = FunctionKey::of(frame);
    let mut name = strip_control(&key.name).replace(';', ":");
    if key.kernel {
        name.push_str("_[k]");
    }
    name
}

/// Folded stacks, `comm;root;...;leaf count`, one line per distinct stack
/// and sorted: what inferno, FlameGraph and speedscope read.
pub fn folded_stacks(profile: &proto::Profile, filter: &SampleFilter) -> Vec<String> {
    let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
    for sample in Reader::new(profile)
        .samples()
        .filter(|sample| filter.keeps(sample))
    {
        let count = sample.count();
        if count <= 0 {
            continue;
        }
        let comm = strip_control(sample.label("comm").unwrap_or("[unknown]")).replace(';', ":");
        // Root first: the frames come leaf first.
        let stack = std::iter::once(comm)
            .chain(sample.frames().iter().rev().map(folded_name))
            .collect::<Vec<_>>()
            .join(";");
        let entry = stacks.entry(stack).or_default();
        *entry = entry.saturating_add(count);
    }
    stacks
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect()
}

#[cfg(test)]
mod tests;
