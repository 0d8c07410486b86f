//! The soak's tables.

use std::path::PathBuf;

use super::{
    Scenario,
    fixtures::Exit,
    monitor::{Counters, Point, Series},
};

/// The resident memory firn must stay under (at its peak, and once steady)
/// while a 200+ MB binary runs and the server is down.
const PEAK_TARGET_MB: f64 = 64.0;
const STEADY_TARGET_MB: f64 = 48.0;

pub enum Resumed {
    /// Seconds after the fault ended until the counter grew.
    After(f64, String),
    /// Not within these seconds.
    No(f64, String),
}

pub struct Outcome {
    pub scenario: Scenario,
    pub profile_seconds: u64,
    pub series: Option<Series>,
    pub exit: Option<Exit>,
    pub resumed: Option<Resumed>,
    pub notes: Vec<String>,
    /// The phase whose steady RSS and stalls are judged.
    pub fault_phase: usize,
    /// Judge the RSS against `PEAK_TARGET_MB` and `STEADY_TARGET_MB`.
    pub targets: bool,
    pub log: PathBuf,
    pub error: Option<String>,
}

impl Outcome {
    pub fn new(scenario: Scenario, profile_seconds: u64) -> Self {
        Self {
            scenario,
            profile_seconds,
            series: None,
            exit: None,
            resumed: None,
            notes: Vec::new(),
            fault_phase: 0,
            targets: false,
            log: PathBuf::new(),
            error: None,
        }
    }

    pub fn failed(scenario: Scenario, error: String) -> Self {
        Self {
            error: Some(error),
            ..Self::new(scenario, 0)
        }
    }

    fn points(&self) -> &[Point] {
        self.series.as_ref().map_or(&[], |s| s.points.as_slice())
    }

    fn phase_points(&self, phase: usize) -> Vec<Point> {
        self.points()
            .iter()
            .filter(|p| p.phase == phase)
            .cloned()
            .collect()
    }

    /// The longest stretch in which firn handled no sample, and when it
    /// began; a stalled drain shows here (and in climbing losses).
    fn longest_stall(&self) -> (f64, f64) {
        let mut longest = (0.0, 0.0);
        let mut last: Option<(f64, f64)> = None; // (time, samples) at the last growth
        for point in self.points() {
            let Some(counters) = point.counters else {
                continue;
            };
            match last {
                Some((at, samples)) if counters.samples <= samples => {
                    if point.at - at > longest.0 {
                        longest = (point.at - at, at);
                    }
                }
                _ => last = Some((point.at, counters.samples)),
            }
        }
        // Until the end of watching: a firn that stopped answering.
        if let (Some((at, _)), Some(series)) = (last, &self.series)
            && series.end - at > longest.0
        {
            longest = (series.end - at, at);
        }
        longest
    }

    /// "ok", or what went wrong.
    fn verdict(&self) -> String {
        if let Some(error) = &self.error {
            return format!("ERROR: {error}");
        }
        let mut problems = Vec::new();
        let (stall, at) = self.longest_stall();
        if stall > stall_threshold(self.profile_seconds) {
            problems.push(format!("stalled {stall:.0} s from t={at:.0}"));
        }
        if self.exit.as_ref().is_some_and(|exit| exit.status.is_none()) {
            problems.push("no exit on SIGTERM".to_owned());
        }
        if let Some(Resumed::No(..)) = self.resumed {
            problems.push("delivery did not resume".to_owned());
        }
        if self.targets {
            let memory = self.memory();
            if memory.peak >= PEAK_TARGET_MB || memory.steady >= STEADY_TARGET_MB {
                problems.push("over the memory targets".to_owned());
            }
        }
        if problems.is_empty() {
            "ok".to_owned()
        } else {
            problems.join("; ")
        }
    }

    /// Up to the end of the fault phase: the peak RSS (VmHWM, which sees
    /// peaks between two looks) and the peak anonymous RSS; over the fault
    /// phase's second half, the median RSS and anonymous RSS ("steady");
    /// the growth over the fault phase (median of its last quarter minus
    /// its first quarter). All MB.
    fn memory(&self) -> Memory {
        let until_fault_end = || self.points().iter().filter(|p| p.phase <= self.fault_phase);
        let fault = self.phase_points(self.fault_phase);
        let rss: Vec<f64> = fault.iter().map(|p| mb(p.rss_kb)).collect();
        let anon: Vec<f64> = fault.iter().map(|p| mb(p.anon_kb)).collect();
        let n = rss.len();
        Memory {
            peak: mb(until_fault_end().map(|p| p.hwm_kb).max().unwrap_or(0)),
            peak_anon: mb(until_fault_end().map(|p| p.anon_kb).max().unwrap_or(0)),
            steady: median(&rss[n / 2..]),
            steady_anon: median(&anon[n / 2..]),
            growth: if n >= 4 {
                median(&rss[n - n / 4..]) - median(&rss[..n / 4])
            } else {
                0.0
            },
        }
    }
}

/// Seconds without a sample handled that count as a stall: three profile
/// intervals, at least 10 s.
fn stall_threshold(profile_seconds: u64) -> f64 {
    (3 * profile_seconds).max(10) as f64
}

struct Memory {
    peak: f64,
    peak_anon: f64,
    steady: f64,
    steady_anon: f64,
    growth: f64,
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Counter growth from the first to the last point that has counters.
fn delta(points: &[Point], field: fn(&Counters) -> f64) -> f64 {
    let mut with = points.iter().filter_map(|p| p.counters);
    match (with.next(), with.next_back()) {
        (Some(first), Some(last)) => field(&last) - field(&first),
        _ => 0.0,
    }
}

fn max_of(points: &[Point], field: fn(&Counters) -> f64) -> f64 {
    points
        .iter()
        .filter_map(|p| p.counters)
        .map(|c| field(&c))
        .fold(0.0, f64::max)
}

pub fn print_scenario(outcome: &Outcome) {
    let Some(series) = &outcome.series else {
        return;
    };
    println!(
        "\n== {} ({} s profiles) ==",
        outcome.scenario.name(),
        outcome.profile_seconds
    );
    print_phases(outcome, series);
    print_memory_over_time(series);
    match &outcome.resumed {
        Some(Resumed::After(seconds, what)) => {
            println!("delivery resumed: yes ({what} grew {seconds:.1} s after the fault ended)")
        }
        Some(Resumed::No(seconds, what)) => {
            println!("delivery resumed: NO ({what} did not grow within {seconds:.0} s)")
        }
        None => {}
    }
    if outcome.targets {
        let m = outcome.memory();
        println!(
            "memory targets: peak RSS (VmHWM) {:.1} MB (< {PEAK_TARGET_MB}), steady {:.1} MB \
             (< {STEADY_TARGET_MB}), growth over the fault phase {:+.1} MB; anonymous: peak \
             {:.1} MB, steady {:.1} MB",
            m.peak, m.steady, m.growth, m.peak_anon, m.steady_anon
        );
    }
    for note in &outcome.notes {
        println!("{note}");
    }
    if let Some(exit) = &outcome.exit {
        println!("SIGTERM: {}", exit.describe());
        if !exit.wait_channels.is_empty() {
            println!("  firn's threads were waiting in: {}", exit.wait_channels);
        }
    }
    println!(
        "verdict: {}   (log: {})",
        outcome.verdict(),
        outcome.log.display()
    );
}

/// One row per phase: memory, CPU and the counters' growth in it.
fn print_phases(outcome: &Outcome, series: &Series) {
    println!(
        "{:<10}{:>6}{:>20}{:>9}{:>9}{:>8}{:>9}{:>9}{:>8}{:>8}{:>7}{:>8}{:>11}{:>7}",
        "phase",
        "secs",
        "RSS MB min/med/max",
        "anon mx",
        "file mx",
        "CPU s",
        "us/smpl",
        "samples",
        "lost",
        "written",
        "sent",
        "dropped",
        "queue mxKB",
        "procs"
    );
    for (index, name) in series.phases.iter().enumerate() {
        // Each phase's deltas run from the last point before it.
        let mut points = outcome.phase_points(index);
        if let Some(before) = series.points.iter().rev().find(|p| p.phase < index) {
            points.insert(0, before.clone());
        }
        let own = outcome.phase_points(index);
        if own.is_empty() {
            continue;
        }
        let rss: Vec<f64> = own.iter().map(|p| mb(p.rss_kb)).collect();
        let cpu = points.last().map_or(0.0, |p| p.cpu_seconds)
            - points.first().map_or(0.0, |p| p.cpu_seconds);
        let samples = delta(&points, |c| c.samples);
        println!(
            "{:<10}{:>6.0}{:>20}{:>9.1}{:>9.1}{:>8.2}{:>9.1}{:>9.0}{:>8.0}{:>8.0}{:>7.0}{:>8.0}{:>11.0}{:>7.0}",
            name,
            own.last().map_or(0.0, |p| p.at) - points.first().map_or(0.0, |p| p.at),
            format!(
                "{:.1}/{:.1}/{:.1}",
                rss.iter().copied().fold(f64::MAX, f64::min),
                median(&rss),
                rss.iter().copied().fold(0.0, f64::max)
            ),
            mb(own.iter().map(|p| p.anon_kb).max().unwrap_or(0)),
            mb(own.iter().map(|p| p.file_kb).max().unwrap_or(0)),
            cpu,
            cpu * 1e6 / samples.max(1.0),
            samples,
            delta(&points, |c| c.lost),
            delta(&points, |c| c.written),
            delta(&points, |c| c.sent),
            delta(&points, |c| c.dropped),
            max_of(&own, |c| c.queue_bytes) / 1024.0,
            max_of(&own, |c| c.processes),
        );
    }
}

/// RSS through the run, and what went wrong while watching it.
fn print_memory_over_time(series: &Series) {
    let points = &series.points;
    let span = points.last().map_or(0.0, |p| p.at);
    let step = (span / 12.0).ceil().max(1.0);
    let mut next = 0.0;
    let mut line = Vec::new();
    for point in points {
        if point.at >= next {
            line.push(format!("{:.1}", mb(point.rss_kb)));
            next += step;
        }
    }
    println!("RSS MB every {step:.0} s: {}", line.join(" "));
    let last = points.last();
    println!(
        "VmHWM at the end: {:.1} MB; objects tracked max {:.0}; drops: pipeline {:.0}, \
         queue {:.0}; push failures {:.0}; process events lost {:.0}",
        mb(last.map_or(0, |p| p.hwm_kb)),
        max_of(points, |c| c.objects),
        max_of(points, |c| c.dropped_pipeline),
        max_of(points, |c| c.dropped_queue),
        max_of(points, |c| c.push_failures),
        max_of(points, |c| c.events_lost),
    );
    let scrapes_failed = points
        .iter()
        .filter(|p| p.scraping && p.counters.is_none())
        .count();
    if scrapes_failed > 0 {
        println!("/metrics did not answer {scrapes_failed} times");
    }
    if series.unanswered > 0 {
        println!(
            "firn's /proc files did not answer within 5 s {} times (firn blocked in the kernel)",
            series.unanswered
        );
    }
}

pub fn print_summary(outcomes: &[Outcome]) {
    println!("\n== summary ==");
    println!(
        "{:<14}{:>6}{:>8}{:>12}{:>11}{:>9}{:>8}{:>9}{:>9}{:>9}{:>7}{:>8}{:>11}{:>9}{:>9}  verdict",
        "scenario",
        "secs",
        "HWM MB",
        "sampled MB",
        "steady MB",
        "anon MB",
        "CPU s",
        "us/smpl",
        "lost",
        "written",
        "sent",
        "dropped",
        "queue mxKB",
        "resumed",
        "exit s"
    );
    for outcome in outcomes {
        let points = outcome.points();
        let memory = outcome.memory();
        let hwm = mb(points.iter().map(|p| p.hwm_kb).max().unwrap_or(0));
        let peak = mb(points.iter().map(|p| p.rss_kb).max().unwrap_or(0));
        let anon = mb(points.iter().map(|p| p.anon_kb).max().unwrap_or(0));
        let cpu = points.last().map_or(0.0, |p| p.cpu_seconds);
        let samples = delta(points, |c| c.samples);
        let resumed = match &outcome.resumed {
            Some(Resumed::After(seconds, _)) => format!("{seconds:.0} s"),
            Some(Resumed::No(..)) => "NO".to_owned(),
            None => "-".to_owned(),
        };
        let exit = match &outcome.exit {
            Some(Exit {
                status: Some(_),
                seconds,
                ..
            }) => format!("{seconds:.1}"),
            Some(_) => "KILLED".to_owned(),
            None => "-".to_owned(),
        };
        println!(
            "{:<14}{:>6.0}{:>8.1}{:>12.1}{:>11.1}{:>9.1}{:>8.2}{:>9.1}{:>9.0}{:>9.0}{:>7.0}{:>8.0}{:>11.0}{:>9}{:>9}  {}",
            outcome.scenario.name(),
            points.last().map_or(0.0, |p| p.at),
            hwm,
            peak,
            memory.steady,
            anon,
            cpu,
            cpu * 1e6 / samples.max(1.0),
            delta(points, |c| c.lost),
            delta(points, |c| c.written),
            delta(points, |c| c.sent),
            delta(points, |c| c.dropped),
            max_of(points, |c| c.queue_bytes) / 1024.0,
            resumed,
            exit,
            outcome.verdict()
        );
    }
}
