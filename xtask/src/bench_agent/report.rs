//! The agent bench's tables: one per workload and frequency, a column per
//! firn binary.

use super::{
    AgentWorkload, Binary, Cell, FIRST_WINDOW_SECONDS,
    measure::{Measurement, STAGES, Window},
};

/// The targets: µs of firn's CPU per sample in the steady state and over
/// the first minute, seconds to ready, peak RSS in MB.
const STEADY_US: f64 = 10.0;
const FIRST_MINUTE_US: f64 = 15.0;
const READY_SECONDS: f64 = 0.5;
const PEAK_RSS_MB: f64 = 64.0;

const LABEL_WIDTH: usize = 48;
const COLUMN_WIDTH: usize = 16;

fn row(label: &str, values: impl IntoIterator<Item = String>) {
    let mut line = format!("{label:<LABEL_WIDTH$}");
    for value in values {
        line.push_str(&format!("{value:>COLUMN_WIDTH$}"));
    }
    println!("{}", line.trim_end());
}

fn us(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".to_owned(), |value| format!("{value:.2}"))
}

pub fn print_cell(cell: &Cell, binaries: &[Binary], results: &[Measurement]) {
    let Cell {
        workload,
        frequency,
        seconds,
        exec_rate,
    } = *cell;
    let rate = match (workload, exec_rate) {
        (AgentWorkload::Mixed, Some(rate)) => format!(", {rate} more exec/s"),
        _ => String::new(),
    };
    println!();
    println!(
        "== agent, workload {}{rate}, {frequency} Hz, {seconds} s, pushing to Parca with upload on",
        workload.name()
    );
    if binaries.len() > 1 {
        for (index, binary) in binaries.iter().enumerate() {
            println!("   [{index}] {}", binary.name);
        }
    }
    row(
        "",
        (0..binaries.len()).map(|index| match binaries.len() {
            1 => "firn".to_owned(),
            _ => format!("[{index}]"),
        }),
    );
    row(
        "ready (spawn to /ready 200), s",
        results.iter().map(|m| format!("{:.3}", m.ready_seconds)),
    );
    let first = format!("first {FIRST_WINDOW_SECONDS:.0} s (start-up included)");
    print_window(&first, results, |m| m.first.as_ref());
    print_window("steady (after the first minute)", results, |m| {
        m.steady.as_ref()
    });
    row(
        "peak RSS (VmHWM), MB",
        results.iter().map(|m| format!("{:.1}", m.peak_rss_mb)),
    );
    row(
        "steady RSS (median VmRSS), MB",
        results.iter().map(|m| format!("{:.1}", m.steady_rss_mb)),
    );
    row(
        "samples handled",
        results.iter().map(|m| format!("{:.0}", m.samples)),
    );
    row(
        "samples lost",
        results.iter().map(|m| share(m.lost, m.samples)),
    );
    print_labelled("stacks truncated", results, |m| &m.truncated);
    row(
        "profiles sent",
        results.iter().map(|m| format!("{:.0}", m.sent)),
    );
    print_labelled("debuginfo uploads", results, |m| &m.uploads);
    if results.iter().any(|m| m.churn.is_some()) {
        row(
            "short-lived processes started, per s",
            results.iter().map(|m| {
                m.churn.map_or_else(
                    || "-".to_owned(),
                    |(count, seconds)| format!("{:.1}", count as f64 / seconds.max(1e-9)),
                )
            }),
        );
    }
    row(
        "/metrics unanswered",
        results.iter().map(|m| m.scrapes_failed.to_string()),
    );
    row("exit on SIGTERM", results.iter().map(|m| m.exit.clone()));
    print_targets(results);
}

fn share(part: f64, whole: f64) -> String {
    format!("{part:.0} ({:.2}%)", part * 100.0 / whole.max(1.0))
}

/// µs of CPU per handled sample in one window: the total, the BPF
/// program's, and by stage.
fn print_window(
    title: &str,
    results: &[Measurement],
    window: impl Fn(&Measurement) -> Option<&Window>,
) {
    let windows: Vec<Option<&Window>> = results.iter().map(&window).collect();
    println!("{title}:");
    if windows.iter().all(Option::is_none) {
        println!("  (the run was too short)");
        return;
    }
    let each = |f: &dyn Fn(&Window) -> Option<f64>| -> Vec<String> {
        windows.iter().map(|w| us(w.and_then(f))).collect()
    };
    row(
        "  seconds, samples handled",
        windows.iter().map(|w| {
            w.map_or_else(
                || "-".to_owned(),
                |w| format!("{:.0} s, {:.0}", w.seconds, w.samples),
            )
        }),
    );
    row(
        "  userspace CPU (process clock), us per sample",
        each(&|w| w.per_sample(w.cpu_seconds)),
    );
    row("  BPF program, us per tick", each(&|w| w.bpf_per_sample()));
    row(
        "  userspace + BPF, us per sample",
        each(&|w| {
            let bpf = w.bpf_seconds.unwrap_or(0.0);
            w.per_sample(w.cpu_seconds + bpf)
        }),
    );
    if windows.iter().flatten().all(|w| w.stages.is_none()) {
        println!("  (no firn_cpu_seconds_total{{stage}}: totals only)");
        return;
    }
    for stage in stage_names(&windows) {
        row(
            &format!("    {stage}"),
            each(&|w| {
                let seconds = w.stages.as_ref()?.get(&stage).copied().unwrap_or(0.0);
                w.per_sample(seconds)
            }),
        );
    }
    row(
        "    unattributed (total - stages)",
        each(&|w| w.per_sample(w.unattributed()?)),
    );
}

/// The stages in pipeline order, then any other stage some firn reported.
fn stage_names(windows: &[Option<&Window>]) -> Vec<String> {
    let mut names: Vec<String> = STAGES.iter().map(|&s| s.to_owned()).collect();
    for window in windows.iter().flatten() {
        for name in window.stages.iter().flat_map(|stages| stages.keys()) {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

fn print_labelled(
    title: &str,
    results: &[Measurement],
    series: impl Fn(&Measurement) -> &Vec<(String, f64)>,
) {
    let mut labels: Vec<&str> = results
        .iter()
        .flat_map(|m| series(m).iter().map(|(labels, _)| labels.as_str()))
        .collect();
    labels.sort();
    labels.dedup();
    if labels.is_empty() {
        row(title, results.iter().map(|_| "0".to_owned()));
        return;
    }
    println!("{title}:");
    for labels in labels {
        row(
            &format!("  {{{labels}}}"),
            results.iter().map(|m| {
                let value = series(m)
                    .iter()
                    .find(|(other, _)| other == labels)
                    .map_or(0.0, |(_, value)| *value);
                match title {
                    "stacks truncated" => share(value, m.samples),
                    _ => format!("{value:.0}"),
                }
            }),
        );
    }
}

/// The targets, met (✓) or missed (✗); printed, not asserted. The CPU
/// targets are checked against firn's userspace CPU per sample.
fn print_targets(results: &[Measurement]) {
    let mark = |ok: Option<bool>| match ok {
        Some(true) => "✓",
        Some(false) => "✗",
        None => "?",
    };
    let cpu = |window: Option<&Window>, limit: f64| {
        window
            .and_then(|w| w.per_sample(w.cpu_seconds))
            .map(|value| value <= limit)
    };
    println!(
        "targets (userspace CPU per sample <= {STEADY_US} us steady, <= {FIRST_MINUTE_US} us \
         first minute; ready <= {READY_SECONDS} s; peak RSS <= {PEAK_RSS_MB} MB):"
    );
    row(
        "  steady, first minute, ready, peak RSS",
        results.iter().map(|m| {
            format!(
                "{} {} {} {}",
                mark(cpu(m.steady.as_ref(), STEADY_US)),
                mark(cpu(m.first.as_ref(), FIRST_MINUTE_US)),
                mark(Some(m.ready_seconds <= READY_SECONDS)),
                mark(Some(m.peak_rss_mb <= PEAK_RSS_MB)),
            )
        }),
    );
}
