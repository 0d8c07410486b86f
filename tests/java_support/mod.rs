//! Helpers of the Java tests beyond the chain: `Shapes.java` and its
//! plugins compiled and started, and the samples of a JVM read with their
//! threads and each frame's mapping (where a Java frame's kind shows).

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use agent_pprof::proto::Profile;

use crate::common::*;

/// The prefix of the mappings of Java frames: `[java]` for the JVM's
/// generated code, `[java:KIND]` for Java methods by how they ran.
pub const JAVA_MAPPING_PREFIX: &str = "[java";

/// A frame of a JVM's sample, read by the shared reader.
pub type JFrame = SampleFrame;

/// A sample of a JVM, leaf first.
pub type JSample = ProcessSample;

impl SampleFrame {
    pub fn java(&self) -> bool {
        self.mapping.starts_with(JAVA_MAPPING_PREFIX)
    }

    /// A Java method's kind as its mapping says: `interpreted`, `c1`,
    /// `c2`, `inlined`, `native`.
    pub fn kind(&self) -> Option<&str> {
        self.mapping
            .strip_prefix("[java:")
            .and_then(|kind| kind.strip_suffix(']'))
    }
}

/// Every sample of `pid` in `profile`.
pub fn jvm_samples(profile: &Profile, pid: u32) -> Vec<JSample> {
    process_samples(profile, pid)
}

/// The sum of the counts of `samples`.
pub fn total<'a>(samples: impl IntoIterator<Item = &'a JSample>) -> i64 {
    samples.into_iter().map(|sample| sample.count).sum()
}

/// The most frequent stacks of `samples`, for failure messages.
pub fn describe_samples<'a>(samples: impl IntoIterator<Item = &'a JSample>) -> String {
    let mut sorted: Vec<&JSample> = samples.into_iter().collect();
    sorted.sort_by_key(|sample| -sample.count);
    sorted
        .iter()
        .take(8)
        .map(|sample| {
            let names: Vec<String> = sample
                .frames
                .iter()
                .map(|frame| match frame.java() {
                    true => format!("{}:{}{}", frame.name, frame.line, frame.mapping),
                    false => frame.name.clone(),
                })
                .collect();
            format!(
                "{:>5} [{}] {}",
                sample.count,
                sample.thread_name.as_deref().unwrap_or("-"),
                names.join(" <- ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `Shapes.java` compiled into `DIR/app`, `Plugin.java` and `Other.java`
/// into `DIR/plugin` (off the class path: loaded by class loaders of
/// their own). Returns both directories.
pub fn compile_shapes(java_home: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let java = workloads_dir().join("java");
    let app = dir.join("app");
    let plugin = dir.join("plugin");
    for (out, sources) in [
        (&app, vec![java.join("Shapes.java")]),
        (
            &plugin,
            vec![
                java.join("plugin/Plugin.java"),
                java.join("plugin/Other.java"),
            ],
        ),
    ] {
        let status = Command::new(java_home.join("bin/javac"))
            .arg("-d")
            .arg(out)
            .args(sources)
            .status()
            .expect("javac runs");
        assert!(status.success(), "javac failed");
    }
    (app, plugin)
}

/// A JVM started by a test, its standard output in a file; killed when
/// dropped.
pub struct Jvm {
    pub process: TestProcess,
    pub stdout: PathBuf,
}

impl Jvm {
    /// `java FLAGS -cp CLASSES MAIN ARGS`, its output into `DIR/NAME.out`.
    pub fn start(
        java_home: &Path,
        dir: &Path,
        name: &str,
        flags: &[&str],
        classes: &Path,
        main_and_args: &[&str],
    ) -> Self {
        let stdout = dir.join(format!("{name}.out"));
        let file = std::fs::File::create(&stdout).expect("JVM output file");
        let mut command = Command::new(java_home.join("bin/java"));
        command
            .args(flags)
            .arg("-cp")
            .arg(classes)
            .args(main_and_args);
        Self {
            process: TestProcess::spawn_with_stdout(&mut command, Stdio::from(file)),
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
}

/// Whether `jcmd PID Compiler.codelist` lists `method` compiled at `tier`.
pub fn compiled_at(java_home: &Path, pid: u32, method: &str, tier: u32) -> bool {
    codelist(java_home, pid)
        .lines()
        .any(|line| line.contains(method) && line.split(' ').nth(1) == Some(&tier.to_string()))
}

pub fn codelist(java_home: &Path, pid: u32) -> String {
    Command::new(java_home.join("bin/jcmd"))
        .args([pid.to_string().as_str(), "Compiler.codelist"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default()
}

/// The line of `file` (under tests/workloads/java) marked `// line: NAME`.
pub fn marked(file: &str, name: &str) -> i64 {
    let source = std::fs::read_to_string(workloads_dir().join("java").join(file))
        .unwrap_or_else(|error| panic!("{file}: {error}"));
    let marker = format!("// line: {name}");
    source
        .lines()
        .position(|line| line.trim_end().ends_with(&marker))
        .map(|index| index as i64 + 1)
        .unwrap_or_else(|| panic!("no marker {marker} in {file}"))
}

/// Of the samples of the thread labelled `thread`: how many hold a frame
/// `wanted` takes, and how many there are.
pub fn held_in_thread(
    samples: &[JSample],
    thread: &str,
    wanted: impl Fn(&JFrame) -> bool,
) -> (i64, i64) {
    let own: Vec<&JSample> = samples
        .iter()
        .filter(|sample| sample.thread_name.as_deref() == Some(thread))
        .collect();
    let held = total(
        own.iter()
            .copied()
            .filter(|sample| sample.frames.iter().any(&wanted)),
    );
    (held, total(own))
}

/// What runs called from `runner`: samples holding `method` (of `file`)
/// above it, the frames above it named otherwise (wrong names; the JDK's
/// own methods it calls are not), and the `<unknown>` frames above it.
pub fn called_from(
    samples: &[JSample],
    runner: &str,
    method: &str,
    file: &str,
) -> (i64, Vec<String>, i64) {
    let mut right = 0;
    let mut wrong = Vec::new();
    let mut unknown = 0;
    for sample in samples {
        let Some(at) = sample.position(runner) else {
            continue;
        };
        let above: Vec<&JFrame> = sample.frames[..at]
            .iter()
            .filter(|frame| frame.kind().is_some() || frame.name == "<unknown>")
            .collect();
        if above
            .iter()
            .any(|frame| frame.name == method && frame.file == file)
        {
            right += sample.count;
        }
        for frame in above {
            if frame.name == "<unknown>" {
                unknown += sample.count;
            } else if (frame.name != method || frame.file != file) && !is_jdk_method(&frame.name) {
                wrong.push(format!("{}:{} ({})", frame.name, frame.line, frame.file));
            }
        }
    }
    (right, wrong, unknown)
}

/// The JDK's own classes, which a runner calls (`System.nanoTime` for
/// its deadline) beside the method it runs.
fn is_jdk_method(name: &str) -> bool {
    ["java.", "javax.", "jdk.", "sun."]
        .iter()
        .any(|package| name.starts_with(package))
}

/// The JDK's major version, from its `release` file.
pub fn java_major_version(home: &Path) -> String {
    let release = std::fs::read_to_string(home.join("release")).expect("the JDK's release file");
    release
        .lines()
        .find_map(|line| line.strip_prefix("JAVA_VERSION=\""))
        .and_then(|version| version.split(['.', '"']).next())
        .map(str::to_owned)
        .expect("JAVA_VERSION in the release file")
}

/// The `thread_name` label of a Java thread named `name`: the whole Java
/// name (firn reads it from the thread's `java.lang.Thread`), not the
/// OS thread's name the JVM sets from it, cut at 15 bytes.
pub fn thread_label(name: &str) -> String {
    name.to_owned()
}

/// `Shapes loader` run under `firn record`: started, recorded from before
/// the go file is made until `Other` has run 3 s after Plugin was
/// unloaded. Returns the JVM (still running) and the profile.
pub fn record_loader(java_home: &Path, dir: &Path, app: &Path, plugin: &Path) -> (Jvm, Profile) {
    let go = dir.join("go");
    let jvm = Jvm::start(
        java_home,
        dir,
        "loader",
        &["-Xlog:class+unload=info"],
        app,
        &[
            "Shapes",
            "loader",
            plugin.to_str().expect("utf-8"),
            go.to_str().expect("utf-8"),
        ],
    );
    wait_for_cpu_time(jvm.pid(), Duration::from_secs(1), Duration::from_secs(60));
    let pid = jvm.pid().to_string();
    let mut recording = Recording::start(dir, &["--duration", "120s", "--pid", &pid]);
    recording.wait_until_sampling();
    std::fs::write(&go, b"").expect("go");
    let after = dir.join("go.after");
    wait_for(
        "Plugin unloaded and Other run for 3 s",
        Duration::from_secs(120),
        || after.exists(),
        || jvm.output(),
    );
    let (_, profile) = recording.interrupt();
    let output = jvm.output();
    assert!(
        output.contains("unloading class Plugin") && output.contains("unloaded"),
        "the JVM did not unload Plugin:\n{output}"
    );
    (jvm, profile)
}
