//! `cargo xtask bench --deep`: are deep stacks cut short? A recursive
//! program without frame pointers (`deep.c`, 384 bytes of locals a frame,
//! 20 to 80 KB of stack) spins at several depths at once, one process per
//! depth, while firn writes profiles to a local store. Per depth: the share of the program's samples whose stack
//! reaches `main`, those cut at the 127-frame limit (a stack deeper than
//! that cannot be whole) and those cut below it (the target: none); and
//! firn's `firn_stacks_truncated_total`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use agent_pprof::{Reader, decode};
use anyhow::{Context, Result, bail};

use super::Binary;
use crate::{
    soak::{
        fixtures::{Firn, Guard},
        monitor::{self, Scrape},
    },
    util,
};

const DEEP_C: &str = include_str!("deep.c");
/// Descend frames below `main`; the whole stack is 5 frames more (`_start`,
/// two of libc's, `main`, `burn`).
const DEPTHS: [u32; 3] = [50, 120, 200];
/// The frame limit of a stack (the kernel's `perf_event_max_stack`, and
/// firn's unwinder): a deeper stack is cut there.
const FRAME_LIMIT: usize = 127;
const SECONDS: u64 = 20;
const FREQUENCY: u64 = 100;

/// One depth's samples, as firn's profiles hold them.
#[derive(Debug, Default, PartialEq)]
struct Shares {
    total: i64,
    /// The stack reaches `main`.
    complete: i64,
    /// Cut short with the frame limit's frames or more.
    at_limit: i64,
    /// Cut short with fewer frames than the limit.
    below_limit: i64,
    /// The most user frames one sample held.
    deepest: usize,
}

pub fn run(work: &Path, binaries: &[Binary]) -> Result<()> {
    let dir = work.join("deep");
    fs::create_dir_all(&dir)?;
    let source = dir.join("deep.c");
    fs::write(&source, DEEP_C)?;
    let built = dir.join("deep");
    util::run(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
            .arg(&built)
            .arg(&source),
    )?;
    // One binary per depth, so each depth has a comm of its own.
    let mut programs = Vec::new();
    for depth in DEPTHS {
        let program = dir.join(format!("deep_{depth}"));
        fs::copy(&built, &program)?;
        programs.push((depth, program));
    }
    for binary in binaries {
        eprintln!("bench --deep: {}", binary.name);
        let outcome = run_one(&dir, &programs, binary)?;
        print(binary, &outcome);
    }
    Ok(())
}

struct Outcome {
    /// (depth, stack bytes the program reported, shares).
    depths: Vec<(u32, Option<u64>, Shares)>,
    truncated: Vec<(String, f64)>,
    samples: f64,
    profiles: usize,
}

fn run_one(dir: &Path, programs: &[(u32, PathBuf)], binary: &Binary) -> Result<Outcome> {
    let store = dir.join("profiles");
    if store.exists() {
        fs::remove_dir_all(&store)?;
    }
    fs::create_dir_all(&store)?;
    let mut workloads = Vec::new();
    for (depth, program) in programs {
        let report = dir.join(format!("deep_{depth}.out"));
        workloads.push(Guard::spawn(
            Command::new(program)
                .arg(depth.to_string())
                .arg((SECONDS + 60).to_string())
                .stdout(fs::File::create(&report)?)
                .stderr(Stdio::null()),
        )?);
    }
    let args = vec![
        "--local-store-directory".to_owned(),
        store.display().to_string(),
        "--frequency".to_owned(),
        FREQUENCY.to_string(),
        "--profiling-duration".to_owned(),
        "5s".to_owned(),
    ];
    let mut firn = Firn::start(&binary.path, &dir.join("firn"), &args)?;
    let end = Instant::now() + Duration::from_secs(SECONDS);
    while Instant::now() < end {
        if firn.exited() {
            bail!(
                "firn exited during the deep-stack run:\n{}",
                fs::read_to_string(&firn.log).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
    let scrape = match monitor::get(firn.metrics, "/metrics") {
        Some((200, text)) => Scrape::parse(&text),
        _ => bail!("firn's /metrics did not answer at the end of the deep-stack run"),
    };
    let exit = firn.terminate();
    drop(workloads);
    if !exit.status.is_some_and(|status| status.success()) {
        eprintln!("bench --deep: firn {}", exit.describe());
    }
    let profiles = profile_files(&store)?;
    let mut depths = Vec::new();
    for (depth, _) in programs {
        let comm = format!("deep_{depth}");
        let mut shares = Shares::default();
        for profile in &profiles {
            let bytes = fs::read(profile)?;
            let profile = decode(&bytes)
                .with_context(|| format!("could not decode {}", profile.display()))?;
            count(&Reader::new(&profile), &comm, &mut shares);
        }
        let report = fs::read_to_string(dir.join(format!("{comm}.out"))).unwrap_or_default();
        let stack_bytes = report
            .split_whitespace()
            .find_map(|field| field.strip_prefix("stack_bytes=")?.parse().ok());
        depths.push((*depth, stack_bytes, shares));
    }
    let mut truncated: Vec<(String, f64)> = scrape
        .family("firn_stacks_truncated_total")
        .map(|(labels, value)| (labels.to_owned(), value))
        .collect();
    truncated.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Outcome {
        depths,
        truncated,
        samples: scrape.sum("firn_samples_total"),
        profiles: profiles.len(),
    })
}

/// The pprof files under `store`, any depth of directories.
fn profile_files(store: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![store.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.to_string_lossy().ends_with(".pb.gz") {
                files.push(path);
            }
        }
    }
    if files.is_empty() {
        bail!("firn wrote no profile into {}", store.display());
    }
    Ok(files)
}

/// Adds the samples of `comm` in `reader` to `shares`.
fn count(reader: &Reader<'_>, comm: &str, shares: &mut Shares) {
    for sample in reader.samples() {
        if sample.label("comm") != Some(comm) {
            continue;
        }
        let frames = sample.frames();
        let user: Vec<_> = frames.iter().filter(|frame| !frame.is_kernel()).collect();
        let weight = sample.count();
        shares.total += weight;
        shares.deepest = shares.deepest.max(user.len());
        if user.iter().any(|frame| frame.name == Some("main")) {
            shares.complete += weight;
        } else if user.len() >= FRAME_LIMIT {
            shares.at_limit += weight;
        } else {
            shares.below_limit += weight;
        }
    }
}

fn percent(part: i64, whole: i64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole.max(1) as f64)
}

fn print(binary: &Binary, outcome: &Outcome) {
    println!();
    println!(
        "== deep stacks, {} (local store, {FREQUENCY} Hz, {SECONDS} s, {} profiles; \
         frame limit {FRAME_LIMIT})",
        binary.name, outcome.profiles
    );
    println!(
        "{:<8}{:>8}{:>12}{:>10}{:>12}{:>16}{:>16}{:>10}",
        "depth",
        "frames",
        "stack KiB",
        "samples",
        "complete",
        "cut at limit",
        "cut below",
        "deepest"
    );
    for (depth, stack_bytes, shares) in &outcome.depths {
        println!(
            "{:<8}{:>8}{:>12}{:>10}{:>12}{:>16}{:>16}{:>10}",
            depth,
            depth + 5,
            stack_bytes.map_or_else(|| "?".to_owned(), |b| format!("{:.1}", b as f64 / 1024.0)),
            shares.total,
            percent(shares.complete, shares.total),
            percent(shares.at_limit, shares.total),
            percent(shares.below_limit, shares.total),
            shares.deepest,
        );
    }
    let below: i64 = outcome
        .depths
        .iter()
        .map(|(_, _, shares)| shares.below_limit)
        .sum();
    println!(
        "target: no stack shorter than the limit cut short: {}",
        match below {
            0 => "✓".to_owned(),
            n => format!("✗ ({n} samples cut with fewer than {FRAME_LIMIT} frames)"),
        }
    );
    println!(
        "firn_stacks_truncated_total (whole host, {:.0} samples):",
        outcome.samples
    );
    if outcome.truncated.is_empty() {
        println!("  none");
    }
    for (labels, value) in &outcome.truncated {
        println!(
            "  {:<46}{:>8.0} ({:.2}%)",
            format!("{{{labels}}}"),
            value,
            value * 100.0 / outcome.samples.max(1.0)
        );
    }
}

#[cfg(test)]
mod tests {
    use agent_pprof::proto;

    use super::*;

    /// A profile of one comm whose samples hold these stacks (leaf first)
    /// with these counts.
    fn profile(comm: &str, stacks: &[(Vec<&str>, i64)]) -> proto::Profile {
        let mut strings = vec![String::new(), "comm".to_owned(), comm.to_owned()];
        let mut intern = |text: &str| -> i64 {
            let index = strings.iter().position(|s| s == text).unwrap_or_else(|| {
                strings.push(text.to_owned());
                strings.len() - 1
            });
            i64::try_from(index).unwrap_or_default()
        };
        let mut profile = proto::Profile::default();
        for (stack, count) in stacks {
            let mut location_ids = Vec::new();
            for name in stack {
                let id = profile.location.len() as u64 + 1;
                profile.function.push(proto::Function {
                    id,
                    name: intern(name),
                    ..Default::default()
                });
                profile.location.push(proto::Location {
                    id,
                    line: vec![proto::Line {
                        function_id: id,
                        ..Default::default()
                    }],
                    ..Default::default()
                });
                location_ids.push(id);
            }
            profile.sample.push(proto::Sample {
                location_id: location_ids,
                value: vec![*count],
                label: vec![proto::Label {
                    key: 1,
                    str: 2,
                    ..Default::default()
                }],
            });
        }
        profile.string_table = strings;
        profile
    }

    #[test]
    fn samples_are_complete_cut_at_the_limit_or_cut_below() {
        let complete = ["burn", "descend", "descend", "main", "__libc_start_main"];
        let at_limit = vec!["descend"; FRAME_LIMIT];
        let below = ["burn", "descend", "descend"];
        let profile = profile(
            "deep_9",
            &[(complete.to_vec(), 5), (at_limit, 2), (below.to_vec(), 1)],
        );
        let mut shares = Shares::default();
        count(&Reader::new(&profile), "deep_9", &mut shares);
        count(&Reader::new(&profile), "other", &mut shares);
        assert_eq!(
            shares,
            Shares {
                total: 8,
                complete: 5,
                at_limit: 2,
                below_limit: 1,
                deepest: FRAME_LIMIT,
            }
        );
    }
}
