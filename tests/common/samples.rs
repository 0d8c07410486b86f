//! A profile's samples as the runtime tests read them: per process, each
//! frame with its name, file, line and mapping, so that a test can tell a
//! runtime's frames (by their mapping) from native ones.

use agent_pprof::{Reader, proto::Profile};

/// One frame of a sample.
#[derive(Clone, Debug)]
pub struct SampleFrame {
    /// The function's name, or `0x…` for a native frame nobody named.
    pub name: String,
    pub file: String,
    pub line: i64,
    /// The mapping's file name; empty when the location has none.
    pub mapping: String,
    /// Named at all (not an address).
    pub named: bool,
}

/// One sample of a process, leaf first.
#[derive(Clone, Debug)]
pub struct ProcessSample {
    pub frames: Vec<SampleFrame>,
    pub count: i64,
    pub thread_id: Option<String>,
    pub thread_name: Option<String>,
}

impl ProcessSample {
    /// The first frame named `name`, by index.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.frames.iter().position(|frame| frame.name == name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.position(name).is_some()
    }
}

/// Every sample of `pid` in `profile`, all threads.
pub fn process_samples(profile: &Profile, pid: u32) -> Vec<ProcessSample> {
    let pid = pid.to_string();
    Reader::new(profile)
        .samples()
        .filter(|sample| sample.label("pid") == Some(pid.as_str()))
        .map(|sample| ProcessSample {
            frames: sample
                .frames()
                .iter()
                .map(|frame| SampleFrame {
                    name: frame.display_name(),
                    file: frame.file.to_owned(),
                    line: frame.line,
                    mapping: frame
                        .mapping
                        .map(|mapping| mapping.filename.to_owned())
                        .unwrap_or_default(),
                    named: frame.name.is_some(),
                })
                .collect(),
            count: sample.count(),
            thread_id: sample.label("thread_id").map(str::to_owned),
            thread_name: sample.label("thread_name").map(str::to_owned),
        })
        .collect()
}
