//! `frozen.py` run again and again: its frames in a deep-frozen code
//! object (`posixpath.join`), named once for every process of one
//! interpreter.

use std::{path::Path, time::Duration};

use super::{
    Interpreter,
    brief::BriefRuns,
    expect::{Check, assert_all},
    frames::{Sample, describe_samples, samples_of},
    line_with, script, stored_profiles,
};
use crate::common::{Agent, metric};

/// What firn's /metrics calls a code object named from another process's
/// read.
pub const SHARED_HITS_METRIC: &str = "firn_python_code_cache_total{result=\"shared_hit\"}";

/// The frozen function the script spends its time in, and its file as
/// the interpreter names it.
const FROZEN: (&str, &str) = ("join", "<frozen posixpath>");

/// Judges the runs' samples in what the script's `spin` calls: the frame
/// it calls is always `join`, named after the frozen module, with `spin`
/// at the line of the call. Figures and how many of the runs had such
/// samples, or why not. (The interpreter's start-up calls `join` too, from
/// `site`: those samples are not judged.)
pub fn check_frozen_runs(
    runs: &BriefRuns,
    samples_of_run: impl Fn(u32) -> Vec<Sample>,
    script: &Path,
) -> Result<(String, usize), String> {
    let call = line_with(script, "# call:join");
    let who = &runs.interpreter.name;
    let mut sampled = 0;
    let mut frames = 0;
    for &pid in &runs.pids {
        let samples = samples_of_run(pid);
        let in_call: Vec<&Sample> = samples
            .iter()
            .filter(|sample| {
                let python = sample.python();
                python
                    .iter()
                    .position(|frame| frame.name == "spin" && Path::new(&frame.file) == script)
                    .is_some_and(|spin| spin > 0)
            })
            .collect();
        if in_call.is_empty() {
            continue;
        }
        sampled += 1;
        for sample in &in_call {
            let python = sample.python();
            let spin = python
                .iter()
                .position(|frame| frame.name == "spin")
                .expect("chosen for it");
            let called = python[spin - 1];
            if (called.name.as_str(), called.file.as_str()) != FROZEN
                || called.line <= 0
                || python[spin].line != call
            {
                return Err(format!(
                    "{who}: what `spin`@{call} calls not named as {FROZEN:?}:\n{}",
                    describe_samples(in_call.iter().copied())
                ));
            }
            frames += 1;
        }
    }
    if sampled < 2 {
        return Err(format!(
            "{who}: {sampled} of {} runs sampled in `join`: too few to judge",
            runs.pids.len()
        ));
    }
    Ok((
        format!(
            "{who}: {frames} samples in `join` over {sampled} of {} runs, all named {FROZEN:?}",
            runs.pids.len()
        ),
        sampled,
    ))
}

/// Every run but the first that sampled the frozen function names it
/// from the first one's read: at least that many shared hits.
pub fn check_shared_hits(shared_hits: f64, runs_sampled: &[usize]) -> Check {
    let wanted: usize = runs_sampled.iter().map(|runs| runs - 1).sum();
    if shared_hits >= wanted as f64 {
        Ok(format!(
            "{SHARED_HITS_METRIC} rose by {shared_hits}, wanted {wanted} or more"
        ))
    } else {
        Err(format!(
            "{SHARED_HITS_METRIC} rose by {shared_hits}, wanted {wanted} or more"
        ))
    }
}

/// `frozen.py` run six times under each of `interpreters` while firn
/// profiles the whole system: every run's `join` frames named after the
/// frozen module, and every run but the first that sampled it named it
/// from that one's read (shared hits).
pub fn frozen_runs_are_named_once(interpreters: &[&Interpreter]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = script("frozen.py");
    let store = dir.path().join("store");
    let store_arg = store.to_str().expect("utf-8");
    let args = [
        "--profiling-duration",
        "2s",
        "--local-store-directory",
        store_arg,
    ];
    let agent = Agent::start(&dir.path().join("firn.log"), &args, &[]);
    agent.wait_for_samples(1.0);
    let address = agent.http_address();
    let before = metric(address, SHARED_HITS_METRIC).unwrap_or(0.0);
    let runs: Vec<BriefRuns> = interpreters
        .iter()
        .map(|interpreter| BriefRuns::run(interpreter, &script, "0.2", 6))
        .collect();
    // The last run's samples are named by the time the profile after
    // next is written.
    let written = agent.log().matches("profile written").count();
    agent.wait_until("two more profiles", Duration::from_secs(60), || {
        agent.log().matches("profile written").count() >= written + 2
    });
    let shared_hits = metric(address, SHARED_HITS_METRIC).unwrap_or(0.0) - before;
    agent.stop();
    let profiles = stored_profiles(&store);
    let samples_of_run = |pid| {
        profiles
            .iter()
            .flat_map(|profile| samples_of(profile, pid))
            .collect()
    };
    let mut sampled = Vec::new();
    let mut checks: Vec<Check> = runs
        .iter()
        .map(|runs| {
            let (figures, runs_sampled) = check_frozen_runs(runs, samples_of_run, &script)?;
            sampled.push(runs_sampled);
            Ok(figures)
        })
        .collect();
    checks.push(check_shared_hits(shared_hits, &sampled));
    assert_all("frozen", checks);
}
