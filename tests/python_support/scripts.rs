//! What the frames of each workload script must be: names and the lines
//! its markers (`# call:NAME`, `# begin:NAME`…) point at.

use std::{
    ops::RangeInclusive,
    path::{Path, PathBuf},
};

use super::{
    body_of,
    frames::{Frame, Sample},
    line_with, script,
};

/// The lines chain.py's frames must report.
pub struct ChainLines {
    pub script: PathBuf,
    pub crunch: RangeInclusive<i64>,
    /// The call lines of stage_c, stage_b, stage_a and `<module>`.
    pub calls: [i64; 4],
}

/// chain.py's Python frames, innermost first.
pub const PYTHON_CHAIN: [&str; 5] = ["crunch", "stage_c", "stage_b", "stage_a", "<module>"];

impl ChainLines {
    pub fn new() -> Self {
        let script = script("chain.py");
        let call = |name: &str| line_with(&script, &format!("# call:{name}"));
        Self {
            crunch: body_of(&script, "crunch"),
            calls: [
                call("crunch"),
                call("stage_c"),
                call("stage_b"),
                call("stage_a"),
            ],
            script,
        }
    }

    /// The names, files and lines of the sample's Python frames are those
    /// of the chain.
    pub fn holds(&self, sample: &Sample) -> bool {
        let python = sample.python();
        sample.python_names() == PYTHON_CHAIN
            && python
                .iter()
                .all(|frame| Path::new(&frame.file) == self.script)
            && self.crunch.contains(&python[0].line)
            && python[1..]
                .iter()
                .zip(self.calls)
                .all(|(frame, line)| frame.line == line)
    }
}

/// The colour of the thread whose functions a sample holds.
pub fn colours(sample: &Sample) -> Vec<&'static str> {
    ["red", "green", "blue", "gold"]
        .into_iter()
        .filter(|colour| {
            let ends = format!("_{colour}");
            sample
                .python()
                .iter()
                .any(|frame| frame.name.ends_with(&ends))
        })
        .collect()
}

/// Python frames firn keeps of one sample, the innermost.
pub const KEPT_FRAMES: usize = 128;

/// The lines recursion.py's frames must report.
pub struct RecursionLines {
    pub crunch: RangeInclusive<i64>,
    pub call_crunch: i64,
    pub call_recurse: i64,
    pub bottom_loop: i64,
}

impl RecursionLines {
    pub fn new(script: &Path) -> Self {
        Self {
            crunch: body_of(script, "crunch"),
            call_crunch: line_with(script, "# call:crunch"),
            call_recurse: line_with(script, "# call:recurse"),
            bottom_loop: line_with(script, "# loop:bottom"),
        }
    }

    /// The kept frames are the innermost, exactly [`KEPT_FRAMES`] of them
    /// (the stack is deeper): crunch (or the bottom's loop), then recurse
    /// frames at their call lines, never the module.
    pub fn holds(&self, python: &[&Frame]) -> bool {
        let (innermost, rest) = match python {
            [leaf, caller, rest @ ..] if leaf.name == "crunch" => (
                self.crunch.contains(&leaf.line)
                    && caller.name == "recurse"
                    && caller.line == self.call_crunch,
                rest,
            ),
            [bottom, rest @ ..] if bottom.name == "recurse" => (
                [self.bottom_loop, self.call_crunch].contains(&bottom.line),
                rest,
            ),
            _ => return false,
        };
        innermost
            && python.len() == KEPT_FRAMES
            && rest
                .iter()
                .all(|frame| frame.name == "recurse" && frame.line == self.call_recurse)
    }
}

/// Names a frame may have without a `def` of that name: code objects
/// of modules, comprehensions and lambdas, and the scope of nested ones.
pub const ANONYMOUS: [&str; 6] = [
    "<module>",
    "<genexpr>",
    "<lambda>",
    "<listcomp>",
    "<dictcomp>",
    "<locals>",
];

/// Why `frame` is not a real Python function of its file, if it is not:
/// each part of its (qualified) name is defined in the file, its line in
/// range. Frozen modules, with no file, need only plausible names.
pub fn unreal(frame: &Frame) -> Option<String> {
    if frame.name.is_empty() || frame.file.is_empty() || frame.line <= 0 {
        return Some("empty name, file or line".into());
    }
    let parts: Vec<&str> = frame.name.split('.').collect();
    let Ok(source) = std::fs::read_to_string(&frame.file) else {
        let plausible = frame.file.starts_with("<frozen ")
            && parts.iter().all(|part| {
                ANONYMOUS.contains(part)
                    || part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        return (!plausible).then(|| "no such file, not a frozen module".into());
    };
    if frame.line as usize > source.lines().count() {
        return Some("line past the file's end".into());
    }
    let defined = |part: &str| {
        ANONYMOUS.contains(&part)
            || source.contains(&format!("def {part}("))
            || source.contains(&format!("class {part}("))
            || source.contains(&format!("class {part}:"))
    };
    parts
        .iter()
        .find(|part| !defined(part))
        .map(|part| format!("`{part}` is defined nowhere in the file"))
}
