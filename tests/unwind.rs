//! End to end: stacks of code built without frame pointers, unwound with
//! DWARF CFI over the stack copies the real BPF program takes. Workloads
//! are built here (gcc, rustc, go) and checked by function names and their
//! order.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use agent_pprof::{Reader, proto::Profile};
use common::*;

const RUST_CHAIN: [&str; 5] = [
    "rust_chain::burn_leaf",
    "rust_chain::level_three",
    "rust_chain::level_two",
    "rust_chain::level_one",
    "rust_chain::main",
];

const GO_CHAIN: [&str; 5] = [
    "main.burn_leaf",
    "main.level_three",
    "main.level_two",
    "main.level_one",
    "main.main",
];

fn spawn_spinning(binary: &Path) -> TestProcess {
    let process = TestProcess::spawn(Command::new(binary).arg("100000"));
    process.wait_until_running();
    process
}

fn assert_complete(stacks: &[(Vec<String>, i64)], chain: &[&str], wanted: f64) {
    let (share, total) = chain_share(stacks, chain);
    assert!(total >= 150, "too few samples of the workload: {total}");
    assert!(
        share >= wanted,
        "only {:.1}% of {total} samples hold the whole chain {chain:?}:\n{}",
        share * 100.0,
        describe(stacks)
    );
}

#[test]
fn c_without_frame_pointers_has_complete_stacks() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = spawn_spinning(&build_no_fp_chain(dir.path()));
    let pid = workload.pid().to_string();

    let (log, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    let stacks = stacks_of(&profile, workload.pid());
    assert_complete(&stacks, &CHAIN, 0.95);
    assert!(
        summary_value(&log, "dwarf_stacks") > 0,
        "`auto` unwinds a binary without frame pointers with DWARF"
    );

    // The kernel's frame-pointer walk alone cannot follow this code: the
    // completeness above is the CFI's doing.
    let (_, walked) = record(
        dir.path(),
        &[
            "--duration",
            "2s",
            "--pid",
            &pid,
            "--unwind",
            "fp",
            "--leaf-stack-copy-bytes",
            "0",
        ],
    );
    let (share, _) = chain_share(&stacks_of(&walked, workload.pid()), &CHAIN);
    assert!(
        share < 0.5,
        "frame pointers alone should lose the chain, yet {:.1}% were complete",
        share * 100.0
    );
}

#[test]
fn frames_beyond_the_copy_are_kept_and_counted_as_truncated() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = spawn_spinning(&build_no_fp_chain(dir.path()));
    // level_two's frame alone is larger than this copy.
    let (log, profile) = record_busy(
        dir.path(),
        workload.pid(),
        Duration::from_secs(3),
        &["--unwind", "dwarf", "--stack-copy-bytes", "1KiB"],
    );
    let stacks = stacks_of(&profile, workload.pid());
    let (kept, total) = chain_share(&stacks, &CHAIN[..3]);
    let (complete, _) = chain_share(&stacks, &CHAIN);
    assert!(total >= 100, "too few samples: {total}");
    assert!(
        kept >= 0.95 && complete < 0.05,
        "the frames within the copy are kept ({:.1}%), the rest is cut ({:.1}% complete):\n{}",
        kept * 100.0,
        complete * 100.0,
        describe(&stacks)
    );
    let (truncated, unwound) = (
        summary_value(&log, "dwarf_truncated"),
        summary_value(&log, "dwarf_stacks"),
    );
    // Every sample is unwound with DWARF (`--unwind dwarf`), and cut.
    assert!(
        unwound * 10 >= total.unsigned_abs() * 9 && truncated * 100 >= unwound * 95,
        "truncated stacks are counted: {truncated} of {unwound} DWARF stacks, {total} samples"
    );
}

/// Samples of `stacks` whose stack is `spin_at_bottom`, `depth + 1`
/// frames of `descend`, then `main`: the whole recursion.
fn deep_share(stacks: &[(Vec<String>, i64)], depth: usize) -> (f64, i64) {
    let total: i64 = stacks.iter().map(|(_, count)| count).sum();
    let complete: i64 = stacks
        .iter()
        .filter(|(frames, _)| {
            let user: Vec<&str> = frames
                .iter()
                .map(String::as_str)
                .skip_while(|name| *name != "spin_at_bottom")
                .collect();
            user.len() > depth + 2
                && user[1..=depth + 1].iter().all(|name| *name == "descend")
                && user[depth + 2] == "main"
        })
        .map(|(_, count)| count)
        .sum();
    (complete as f64 / total.max(1) as f64, total)
}

/// 100 frames of ~0.5 KiB: some 50 KiB of stack. `auto` copies the most
/// the BPF program can (64 KiB) until a process's unwinds say how much it
/// needs, so the recursion is whole from the first sample; a fixed 16 KiB
/// copy cuts every stack.
#[test]
fn deep_stacks_are_complete_from_the_first_sample() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_c(
        dir.path(),
        "deep_recursion.c",
        "deep_recursion",
        &NO_FP_FLAGS,
    );
    let depth = 100;
    let workload = TestProcess::spawn(Command::new(&binary).arg(depth.to_string()));
    let maps = format!("/proc/{}/maps", workload.pid());
    wait_for(
        "the workload to map libc",
        Duration::from_secs(10),
        || std::fs::read_to_string(&maps).is_ok_and(|maps| maps.contains("libc")),
        String::new,
    );
    let pid = workload.pid().to_string();

    let (log, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    // A first copy smaller than the stack would cut the first samples.
    assert_eq!(
        summary_value(&log, "dwarf_truncated"),
        0,
        "stacks cut beyond the copy"
    );
    let stacks = stacks_of(&profile, workload.pid());
    let (share, total) = deep_share(&stacks, depth);
    assert!(total >= 150, "too few samples of the workload: {total}");
    assert!(
        share >= 0.95,
        "only {:.1}% of {total} samples hold the whole recursion:\n{}",
        share * 100.0,
        describe(&stacks)
    );

    let (_, fixed) = record(
        dir.path(),
        &[
            "--duration",
            "2s",
            "--pid",
            &pid,
            "--unwind",
            "dwarf",
            "--stack-copy-bytes",
            "16KiB",
        ],
    );
    let (share, _) = deep_share(&stacks_of(&fixed, workload.pid()), depth);
    assert!(
        share < 0.05,
        "a fixed 16 KiB copy should cut these stacks, yet {:.1}% were whole",
        share * 100.0
    );
}

#[test]
fn signal_handler_stacks_continue_into_the_interrupted_code() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_c(dir.path(), "signal_chain.c", "signal_chain", &NO_FP_FLAGS);
    let workload = TestProcess::spawn(&mut Command::new(binary));
    workload.wait_until_running();
    let (_, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    let stacks = stacks_of(&profile, workload.pid());
    let in_handler: Vec<_> = stacks
        .iter()
        .filter(|(names, _)| holds_chain(names, &["handler_burn", "on_alarm"]))
        .cloned()
        .collect();
    let (share, total) = chain_share(&in_handler, &["spin_loop", "level_one", "main"]);
    assert!(
        total >= 50,
        "the handler runs about half the time, got {total} samples in it:\n{}",
        describe(&stacks)
    );
    assert!(
        share >= 0.95,
        "{:.1}% of the handler's samples continue past the signal frame:\n{}",
        share * 100.0,
        describe(&in_handler)
    );
    // The signal frame sits between the handler and the interrupted code.
    let (names, _) = &in_handler[0];
    let handler = names.iter().position(|n| n == "on_alarm");
    let interrupted = names.iter().position(|n| n == "spin_loop");
    assert!(
        matches!((handler, interrupted), (Some(h), Some(i)) if i == h + 2),
        "handler, trampoline, interrupted code: {names:?}"
    );
}

#[test]
fn rust_release_binary_without_frame_pointers_is_complete_and_demangled() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = dir.path().join("rust_chain");
    let status = Command::new("rustc")
        .args(["-C", "opt-level=2", "-C", "force-frame-pointers=no", "-o"])
        .arg(&binary)
        .arg(workloads_dir().join("rust_chain.rs"))
        .status()
        .unwrap_or_else(|error| panic!("rustc is needed to build the Rust workload: {error}"));
    assert!(status.success(), "rustc failed to build rust_chain.rs");
    let workload = spawn_spinning(&binary);
    let (_, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(4), &[]);
    let stacks = stacks_of(&profile, workload.pid());
    assert_complete(&stacks, &RUST_CHAIN, 0.95);
}

/// The samples of the Go workload taken in the chain's leaf. The runtime's
/// own threads (`sysmon`, preemption through `mcall`) take a share of the
/// process's samples that varies from run to run (10-17%); their stacks
/// are whole but are not the chain.
fn chain_samples(profile: &Profile, pid: u32) -> Vec<(Vec<String>, i64)> {
    stacks_of(profile, pid)
        .into_iter()
        .filter(|(names, _)| names.iter().any(|name| name == GO_CHAIN[0]))
        .collect()
}

/// `tests/workloads/go_chain` built into `dir/name` with `flags`.
fn build_go_chain(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let binary = dir.join(name);
    let status = Command::new("go")
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg("main.go")
        .current_dir(workloads_dir().join("go_chain"))
        .env("GOFLAGS", "-buildvcs=false")
        .status()
        .unwrap_or_else(|error| {
            panic!("Go is needed to build the Go workload (cargo xtask setup installs it): {error}")
        });
    assert!(status.success(), "go build failed for {name}");
    binary
}

#[test]
fn go_program_has_complete_stacks_with_go_names() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_go_chain(dir.path(), "go_chain", &[]);
    let workload = spawn_spinning(&binary);
    // Go keeps frame pointers: `auto` walks them; DWARF (.debug_frame)
    // must agree.
    for unwind in ["auto", "dwarf"] {
        let (_, profile) = record_busy(
            dir.path(),
            workload.pid(),
            Duration::from_secs(3),
            &["--unwind", unwind],
        );
        assert_complete(&chain_samples(&profile, workload.pid()), &GO_CHAIN, 0.95);
    }
}

/// A Go binary stripped of its symbol table and DWARF (`-ldflags=-s -w`,
/// common in containers) is named from its `.gopclntab`, with the file and
/// line of each frame of the chain.
#[test]
fn stripped_go_program_is_named_from_its_own_table() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = build_go_chain(dir.path(), "go_chain_stripped", &["-ldflags=-s -w"]);
    let sections = Command::new("readelf")
        .args(["-S", "-W"])
        .arg(&binary)
        .output()
        .expect("readelf (binutils) runs");
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(
        !sections.contains(".symtab") && !sections.contains(".debug_info"),
        "the binary is stripped:\n{sections}"
    );
    let workload = spawn_spinning(&binary);
    let (_, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(3), &[]);
    assert_complete(&chain_samples(&profile, workload.pid()), &GO_CHAIN, 0.95);
    // Each function of the chain has its file and a line in it.
    let pid = workload.pid().to_string();
    let placed = Reader::new(&profile)
        .samples()
        .filter(|sample| sample.label("pid") == Some(pid.as_str()))
        .flat_map(|sample| sample.frames())
        .filter(|frame| frame.name.is_some_and(|name| GO_CHAIN.contains(&name)))
        .filter(|frame| frame.file.ends_with("go_chain/main.go") && frame.line > 0)
        .filter_map(|frame| frame.name)
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(
        placed,
        GO_CHAIN.iter().copied().collect(),
        "functions of the chain with their file and line"
    );
}

#[test]
fn frame_pointer_processes_pay_nothing_extra_in_auto() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = start_chain(dir.path(), &FP_FLAGS);
    let (log, profile) = record_busy(dir.path(), workload.pid(), Duration::from_secs(3), &[]);
    assert_complete(&stacks_of(&profile, workload.pid()), &CHAIN, 0.90);
    assert_eq!(
        summary_value(&log, "dwarf_stacks"),
        0,
        "a frame-pointer binary is walked with frame pointers"
    );

    // Forced DWARF unwinds the same code just as completely.
    let (log, profile) = record_busy(
        dir.path(),
        workload.pid(),
        Duration::from_secs(3),
        &["--unwind", "dwarf"],
    );
    assert_complete(&stacks_of(&profile, workload.pid()), &CHAIN, 0.90);
    let stacks = summary_value(&log, "dwarf_stacks");
    let complete = summary_value(&log, "dwarf_complete");
    assert!(
        stacks > 0 && complete * 100 >= stacks * 95,
        "{complete} of {stacks} DWARF stacks reached the outermost frame"
    );
}
