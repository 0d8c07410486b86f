//! A profile's samples as the Python tests read them: every frame either
//! a Python frame (a location of the `[python]` mapping, named after the
//! code object) or a native one.

use std::collections::BTreeMap;

use agent_pprof::{FrameView, Reader, proto::Profile};

/// The mapping file name of every Python frame's location.
pub const PYTHON_MAPPING: &str = "[python]";
/// CPython's native interpreter loop, whose frames the Python frames
/// replace.
pub const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";

/// One frame of a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The function's name (a Python frame's `co_qualname` or `co_name`);
    /// `0x…` for a native frame nobody named, empty for a Python frame
    /// without a name.
    pub name: String,
    pub file: String,
    pub line: i64,
    pub python: bool,
    /// The mapping's file name; empty when the location has none.
    pub mapping: String,
}

impl Frame {
    fn of(frame: &FrameView<'_>) -> Self {
        let mapping = frame.mapping.map_or("", |mapping| mapping.filename);
        let python = mapping == PYTHON_MAPPING;
        Self {
            name: match python {
                true => frame.name.unwrap_or_default().to_owned(),
                false => frame.display_name(),
            },
            file: frame.file.to_owned(),
            line: frame.line,
            python,
            mapping: mapping.to_owned(),
        }
    }

    /// `name` for a native frame, `name@line` for a Python one.
    fn short(&self) -> String {
        match self.python {
            true => format!("{}@{}", self.name, self.line),
            false => self.name.clone(),
        }
    }
}

/// One sample of a process.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Leaf first.
    pub frames: Vec<Frame>,
    pub count: i64,
    /// The `thread_id` label: `None` on the main thread (which carries its
    /// pid as `thread_id` under `--thread-labels`, or no label without).
    pub thread: Option<String>,
}

impl Sample {
    /// The Python frames, innermost first.
    pub fn python(&self) -> Vec<&Frame> {
        self.frames.iter().filter(|frame| frame.python).collect()
    }

    pub fn python_names(&self) -> Vec<&str> {
        self.python()
            .into_iter()
            .map(|frame| frame.name.as_str())
            .collect()
    }

    pub fn has_python(&self) -> bool {
        self.frames.iter().any(|frame| frame.python)
    }

    /// Whether the thread was running Python code: a Python frame, or the
    /// native interpreter loop that runs it.
    pub fn in_interpreter(&self) -> bool {
        self.frames
            .iter()
            .any(|frame| frame.python || frame.name == EVAL_LOOP)
    }

    /// Where the first frame named `name` is, leaf first.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.frames.iter().position(|frame| frame.name == name)
    }

    /// Where the outermost Python frame is.
    pub fn outermost_python(&self) -> Option<usize> {
        self.frames.iter().rposition(|frame| frame.python)
    }

    /// The stack on one line, leaf first, Python frames with their line.
    pub fn render(&self) -> String {
        self.frames
            .iter()
            .map(Frame::short)
            .collect::<Vec<_>>()
            .join(" <- ")
    }
}

/// Every sample of process `pid` in `profile`.
pub fn samples_of(profile: &Profile, pid: u32) -> Vec<Sample> {
    let pid = pid.to_string();
    Reader::new(profile)
        .samples()
        .filter(|sample| sample.label("pid") == Some(pid.as_str()))
        .map(|sample| Sample {
            frames: sample.frames().iter().map(Frame::of).collect(),
            count: sample.count(),
            thread: sample
                .label("thread_id")
                .filter(|&tid| tid != pid)
                .map(str::to_owned),
        })
        .collect()
}

/// Whether any location of `profile` belongs to the Python mapping.
pub fn has_python_mapping(profile: &Profile) -> bool {
    Reader::new(profile)
        .mappings()
        .any(|mapping| mapping.filename == PYTHON_MAPPING)
}

/// Samples (weighted by count) among `samples` for which `good` holds, and
/// their total.
pub fn count<'a>(
    samples: impl IntoIterator<Item = &'a Sample>,
    good: impl Fn(&Sample) -> bool,
) -> (i64, i64) {
    samples
        .into_iter()
        .fold((0, 0), |(hits, total), sample| match good(sample) {
            true => (hits + sample.count, total + sample.count),
            false => (hits, total + sample.count),
        })
}

/// `hits` of `total` as a share (0 when there are none).
pub fn share((hits, total): (i64, i64)) -> f64 {
    hits as f64 / total.max(1) as f64
}

/// The heaviest stacks of `samples`, one a line, for assertion messages.
pub fn describe_samples<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> String {
    let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
    for sample in samples {
        *stacks.entry(sample.render()).or_default() += sample.count;
    }
    let mut heaviest: Vec<_> = stacks.into_iter().collect();
    heaviest.sort_by_key(|(_, count)| -count);
    heaviest
        .iter()
        .take(10)
        .map(|(stack, count)| format!("{count:>5}  {stack}"))
        .collect::<Vec<_>>()
        .join("\n")
}
