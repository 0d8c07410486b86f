//! End to end: user and kernel stacks switched off in the BPF program
//! (`--collect-user-profile=false`, `--collect-kernel-profile=false`), the
//! real `firn record` on a syscall-heavy process and a user-space chain.

mod common;

use std::process::Command;

use agent_pprof::Reader;
use common::*;

/// Per sample of the whole profile: (kernel frames, user frames).
fn frame_kinds(profile: &agent_pprof::proto::Profile) -> Vec<(usize, usize, i64)> {
    Reader::new(profile)
        .samples()
        .map(|sample| {
            let frames = sample.frames();
            let kernel = frames.iter().filter(|f| f.is_kernel()).count();
            (kernel, frames.len() - kernel, sample.count())
        })
        .collect()
}

#[test]
fn kernel_only_and_user_only_recordings_hold_only_those_frames() {
    require_root();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let dd = TestProcess::spawn(Command::new("dd").args(["if=/dev/zero", "of=/dev/null", "bs=1M"]));
    let chain = start_chain(dir.path(), &FP_FLAGS);
    let (dd_pid, chain_pid) = (dd.pid().to_string(), chain.pid().to_string());
    let pids = ["--pid", &dd_pid, "--pid", &chain_pid];

    let (_, kernel_only) = record(
        dir.path(),
        &[
            &["--duration", "4s", "--collect-user-profile=false"][..],
            &pids,
        ]
        .concat(),
    );
    let kinds = frame_kinds(&kernel_only);
    let total: i64 = kinds.iter().map(|k| k.2).sum();
    assert!(
        total >= 50,
        "dd spends its time in the kernel: {total} samples"
    );
    assert!(
        kinds
            .iter()
            .all(|&(kernel, user, _)| kernel > 0 && user == 0),
        "kernel frames only: {kinds:?}"
    );
    let dd_stacks = stacks_of(&kernel_only, dd.pid());
    assert!(
        dd_stacks.iter().any(|(names, _)| names
            .iter()
            .any(|n| n.starts_with("ksys_read") || n == "vfs_read")),
        "dd's read path: {}",
        describe(&dd_stacks)
    );
    let chain_stacks = stacks_of(&kernel_only, chain.pid());
    assert!(
        chain_stacks
            .iter()
            .all(|(names, _)| !names.iter().any(|n| CHAIN.contains(&n.as_str()))),
        "no user frames of the chain: {}",
        describe(&chain_stacks)
    );

    let (_, user_only) = record(
        dir.path(),
        &[
            &["--duration", "4s", "--collect-kernel-profile=false"][..],
            &pids,
        ]
        .concat(),
    );
    let kinds = frame_kinds(&user_only);
    assert!(
        kinds
            .iter()
            .all(|&(kernel, user, _)| kernel == 0 && user > 0),
        "user frames only: {kinds:?}"
    );
    let chain_stacks = stacks_of(&user_only, chain.pid());
    let (share, samples) = chain_share(&chain_stacks, &CHAIN);
    assert!(
        samples >= 30 && share >= 0.9,
        "{share:.2} of {samples} chain samples hold the whole chain:\n{}",
        describe(&chain_stacks)
    );
    assert!(
        !stacks_of(&user_only, dd.pid()).is_empty(),
        "dd's user side (the libc wrappers) is still sampled"
    );

    // Both off leaves nothing to sample: refused before anything loads.
    let output = firn()
        .args(["record", "--duration", "1s"])
        .args([
            "--collect-user-profile=false",
            "--collect-kernel-profile=false",
        ])
        .output()
        .expect("firn runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("nothing to sample"), "{stderr}");
}
