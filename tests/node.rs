//! End to end: JavaScript frames of Node.js processes named from V8's heap
//! by the real `firn` binary (no `--perf-basic-prof`), for
//! `tests/workloads/node/chain.js` run by the interpreter (`--max-opt=0`,
//! or `--no-opt --no-sparkplug` where V8 lacks it) and optimized (TurboFan, after warm-up,
//! inlining off so each function keeps its frame): the chain in order with
//! its script file, a class method (by its class) and a closure, an async
//! function resumed after `await`, a function TurboFan inlined into its
//! caller as a frame of its own (inlining on); with `--nodejs=false`,
//! native stacks as before. Each check runs on Debian's Node 20
//! (`/usr/bin/node`) and on every Node named by `FIRN_NODE_18`,
//! `FIRN_NODE_22` and `FIRN_NODE_24` (`cargo xtask setup` installs them,
//! `cargo xtask test` sets them).

mod common;
mod node_support;

use std::{path::Path, time::Duration};

use agent_pprof::Reader;
use common::*;
// The chain here is the Node workload's, not common's.
use node_support::{CHAIN, *};

#[test]
fn function_lines_run_from_the_declaration() {
    let declared = |text: &str| {
        let source = std::fs::read_to_string(script()).expect("chain.js");
        source
            .lines()
            .position(|line| line.contains(text))
            .map(|index| index as i64 + 1)
            .expect("declaration")
    };
    assert_eq!(
        *function_lines("accumulate").start(),
        declared("function accumulate(")
    );
    assert_eq!(*function_lines("post").start(), declared("  post(seed) {"));
    assert_eq!(
        *function_lines("tally").start(),
        declared("return function tally(")
    );
}

/// Records each Node running chain.js in `mode` at `tier` and checks the
/// share of the main thread's samples holding `chain`, and the share of
/// those whose frames carry the lines being run (interpreted frames by
/// their bytecode offset, optimized ones by their pc).
fn chain_is_named(tier: Tier, mode: &str, chain: &[(&[&str], &str)], compiled: &[&str]) {
    require_root();
    let _serial = serial();
    let mut failures = Vec::new();
    for (name, node) in nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = NodeProcess::start(dir.path(), &node, tier, mode, compiled);
        let pid = process.pid().to_string();
        let (_, profile) = record(dir.path(), &["--duration", "4s", "--pid", &pid]);
        let samples = main_thread(&profile, process.pid());
        let total: i64 = samples.iter().map(|(_, count)| count).sum();
        // With inlining on, the leaf is the function inlined, the rest
        // frames of their own; else none is inlined.
        let inlined = |frames: &[Frame]| {
            let Some(leaf) = frames
                .iter()
                .position(|frame| chain[0].0.contains(&frame.name.as_str()))
            else {
                return false;
            };
            let inlined: Vec<&str> = frames[leaf..]
                .iter()
                .take(chain.len())
                .filter(|frame| frame.inlined())
                .map(|frame| frame.name.as_str())
                .collect();
            match tier {
                Tier::Inlined => inlined == chain[0].0[..1],
                _ => inlined.is_empty(),
            }
        };
        let named: i64 = samples
            .iter()
            .filter(|(frames, _)| holds(frames, chain) && inlined(frames))
            .map(|(_, count)| count)
            .sum();
        let share = named as f64 / total.max(1) as f64;
        println!("{name} {tier:?} {mode}: {named} of {total} samples hold the chain ({share:.3})");
        if total < ENOUGH || share < MOST {
            failures.push(format!(
                "{name} {tier:?} {mode}: {named} of {total} samples hold the chain:\n{}",
                describe_frames(&samples)
            ));
        }
        let running: i64 = samples
            .iter()
            .filter(|(frames, _)| runs_marked_lines(frames, chain))
            .map(|(_, count)| count)
            .sum();
        let running_share = running as f64 / named.max(1) as f64;
        println!(
            "{name} {tier:?} {mode}: {running} of {named} at the lines being run ({running_share:.3})"
        );
        if running_share < MOST {
            failures.push(format!(
                "{name} {tier:?} {mode}: {running} of {named} samples at the lines being run:\n{}",
                describe_frames(&samples)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn unoptimized_chain_is_named() {
    chain_is_named(Tier::Unoptimized, "chain", CHAIN, &[]);
}

#[test]
fn optimized_chain_is_named() {
    chain_is_named(
        Tier::Optimized,
        "chain",
        CHAIN,
        &["accumulate", "reconcile", "settle"],
    );
}

#[test]
fn class_method_and_closure_are_named() {
    chain_is_named(Tier::Unoptimized, "method", METHOD_CHAIN, &[]);
}

#[test]
fn optimized_class_method_and_closure_are_named() {
    chain_is_named(
        Tier::Optimized,
        "method",
        METHOD_CHAIN,
        &["accumulate", "post", "tally"],
    );
}

#[test]
fn async_function_resumed_after_await_is_named() {
    chain_is_named(Tier::Unoptimized, "async", ASYNC_CHAIN, &[]);
}

#[test]
fn optimized_async_function_resumed_after_await_is_named() {
    chain_is_named(
        Tier::Optimized,
        "async",
        ASYNC_CHAIN,
        &["accumulate", "pump"],
    );
}

/// blend, which TurboFan inlined into mix, named as a frame of its own
/// above mix, on the stack where mix runs it.
#[test]
fn function_inlined_by_turbofan_is_a_frame_of_its_own() {
    chain_is_named(Tier::Inlined, "inline", INLINE_CHAIN, &["mix"]);
}

/// `--nodejs=false`: no JavaScript frame, the JIT code's frames as the
/// native unwind finds them (`[anon]` where no perf map names them).
#[test]
fn nodejs_off_leaves_native_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let process = NodeProcess::start(
        dir.path(),
        Path::new("/usr/bin/node"),
        Tier::Unoptimized,
        "chain",
        &[],
    );
    let (_, profile) = record_busy(
        dir.path(),
        process.pid(),
        Duration::from_secs(3),
        &["--nodejs=false"],
    );
    let any_js = Reader::new(&profile)
        .mappings()
        .any(|mapping| mapping.filename == JS_MAPPING);
    let samples = stacks_of(&profile, process.pid());
    let total: i64 = samples.iter().map(|(_, count)| count).sum();
    let trampolines: i64 = samples
        .iter()
        .filter(|(names, _)| {
            names
                .iter()
                .any(|name| name == "Builtins_InterpreterEntryTrampoline")
        })
        .map(|(_, count)| count)
        .sum();
    assert!(total >= ENOUGH, "too few samples of node: {total}");
    assert!(
        !any_js
            && samples.iter().all(|(names, _)| {
                names
                    .iter()
                    .all(|name| !["settle", "reconcile", "accumulate"].contains(&name.as_str()))
            })
            && trampolines * 10 >= total * 9,
        "--nodejs=false: JavaScript frames, or native stacks not as before:\n{}",
        describe(&samples)
    );
}

/// The agent on the whole host, one Node started before it and the others
/// after: every one is found (`firn_node_processes_total` by V8 version)
/// and its frames named (`firn_node_frames_total`), none skipped.
#[test]
fn node_processes_before_and_after_firn_are_counted_by_v8_version() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = nodes();
    let mut wanted = std::collections::BTreeMap::<String, f64>::new();
    for (_, node) in &nodes {
        *wanted.entry(v8_major(node)).or_default() += 1.0;
    }
    let (_, first) = &nodes[0];
    let before = NodeProcess::start(dir.path(), first, Tier::Unoptimized, "chain", &[]);
    let store = dir.path().join("store");
    let agent = Agent::start(
        &dir.path().join("firn.log"),
        &[
            "--profiling-duration",
            "2s",
            "--local-store-directory",
            store.to_str().expect("utf-8"),
        ],
        &[],
    );
    let address = agent.http_address();
    agent.wait_until("samples", Duration::from_secs(120), || {
        metric(address, "firn_node_frames_total").is_some_and(|value| value > 0.0)
    });
    let after: Vec<NodeProcess> = nodes[1..]
        .iter()
        .map(|(_, node)| NodeProcess::start(dir.path(), node, Tier::Unoptimized, "method", &[]))
        .collect();
    let found = |major: &str| {
        metric(
            address,
            &format!("firn_node_processes_total{{v8=\"{major}\"}}"),
        )
        .unwrap_or(0.0)
    };
    agent.wait_until(
        "every Node counted by its V8 version",
        Duration::from_secs(60),
        || wanted.iter().all(|(major, count)| found(major) >= *count),
    );
    for reason in ["layout", "unreadable"] {
        let name = format!("firn_node_processes_skipped_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(address, &name), Some(0.0), "{name}");
    }
    drop(after);
    drop(before);
    let stopped = agent.stop();
    assert!(stopped.status.success(), "{}", stopped.log);
}

/// A JavaScript function calling `zlib.deflateSync` in a loop: the native
/// frames of the call (Node's zlib binding, zlib's deflate) sit above the
/// JavaScript frame `compress`, which sits above `main`.
#[test]
fn native_frames_of_zlib_sit_above_their_javascript_caller() {
    require_root();
    let _serial = serial();
    let mut failures = Vec::new();
    for (name, node) in nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = NodeProcess::start(dir.path(), &node, Tier::Unoptimized, "zlib", &[]);
        let pid = process.pid().to_string();
        let (_, profile) = record(dir.path(), &["--duration", "4s", "--pid", &pid]);
        let samples = main_thread(&profile, process.pid());
        let total: i64 = samples.iter().map(|(_, count)| count).sum();
        let good: i64 = samples
            .iter()
            .filter(|(frames, _)| {
                let Some(caller) = frames.iter().position(|frame| {
                    frame.javascript()
                        && frame.name == "compress"
                        && frame.file.ends_with("node/chain.js")
                }) else {
                    return false;
                };
                frames[caller + 1].javascript()
                    && frames[caller + 1].name == "main"
                    && frames[..caller].iter().any(|frame| {
                        !frame.javascript()
                            && (frame.name.contains("deflate") || frame.name.contains("Zlib"))
                    })
            })
            .map(|(_, count)| count)
            .sum();
        let share = good as f64 / total.max(1) as f64;
        println!("{name} zlib: {good} of {total} samples hold zlib above compress ({share:.3})");
        // Some samples are in JavaScript of Node's zlib module, or in the
        // garbage collector: most are in deflate.
        if total < ENOUGH || share < 0.7 {
            failures.push(format!(
                "{name}: zlib above compress in {good} of {total} samples:\n{}",
                describe_frames(&samples)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A worker thread names its own function (`spin`, busy in `accumulate`)
/// while the main thread runs the chain.
#[test]
fn worker_thread_names_its_own_functions() {
    require_root();
    let _serial = serial();
    let mut failures = Vec::new();
    for (name, node) in nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = NodeProcess::start(dir.path(), &node, Tier::Unoptimized, "worker", &[]);
        let pid = process.pid().to_string();
        let (_, profile) = record(dir.path(), &["--duration", "4s", "--pid", &pid]);
        let worker: Vec<_> = all_threads(&profile, process.pid())
            .into_iter()
            .filter(|(frames, _)| {
                frames.iter().any(|frame| frame.name == "spin")
                    || frames.iter().all(|frame| frame.name != "node::Start")
                        && frames.iter().any(|frame| frame.javascript())
            })
            .collect();
        let total: i64 = worker.iter().map(|(_, count)| count).sum();
        let spin: &[(&[&str], &str)] = &[(&["accumulate"], "accumulate"), (&["spin"], "spin")];
        let named: i64 = worker
            .iter()
            .filter(|(frames, _)| holds(frames, spin))
            .map(|(_, count)| count)
            .sum();
        let main: i64 = main_thread(&profile, process.pid())
            .iter()
            .filter(|(frames, _)| holds(frames, CHAIN))
            .map(|(_, count)| count)
            .sum();
        let share = named as f64 / total.max(1) as f64;
        println!(
            "{name} worker: {named} of {total} worker samples in spin ({share:.3}); main chain in {main}"
        );
        if total < ENOUGH || share < MOST || main < ENOUGH {
            failures.push(format!(
                "{name}: spin in {named} of {total} worker samples, main chain in {main}:\n{}",
                describe_frames(&worker)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
