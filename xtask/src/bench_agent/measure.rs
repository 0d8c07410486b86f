//! From what the monitor saw once a second to the figures of one run: CPU
//! per sample over the first minute and the steady state, by stage; RSS;
//! losses and truncated stacks.

use std::collections::BTreeMap;

use super::FIRST_WINDOW_SECONDS;
use crate::{
    bench::median,
    soak::monitor::{Point, Scrape, Series},
};

/// firn's CPU by stage of its own threads.
pub const STAGE_FAMILY: &str = "firn_cpu_seconds_total";
/// The stages in pipeline order; any other stage firn reports follows.
pub const STAGES: [&str; 9] = [
    "sample",
    "symbolize",
    "label",
    "encode",
    "export",
    "push",
    "upload",
    "http",
    "other",
];
const SAMPLES: &str = "firn_samples_total";
const LOST: &str = "firn_samples_lost_total";
const BPF_RUN_TIME: &str = "firn_bpf_run_time_seconds_total";
const BPF_SEEN: &str = "firn_bpf_samples_seen_total";
const TRUNCATED: &str = "firn_stacks_truncated_total";
const SENT: &str = "firn_profiles_sent_total";
const UPLOADS: &str = "firn_debuginfo_uploads_total";

/// What changed between two looks at firn.
#[derive(Clone, Debug, Default)]
pub struct Window {
    pub seconds: f64,
    /// firn's user and system CPU (its CPU-time clock).
    pub cpu_seconds: f64,
    pub samples: f64,
    /// None when firn does not expose the BPF run time.
    pub bpf_seconds: Option<f64>,
    pub bpf_seen: f64,
    /// CPU seconds by stage; None when firn does not expose them.
    pub stages: Option<BTreeMap<String, f64>>,
}

impl Window {
    /// Microseconds of `seconds` per handled sample.
    pub fn per_sample(&self, seconds: f64) -> Option<f64> {
        (self.samples > 0.0).then(|| seconds * 1e6 / self.samples)
    }

    /// The BPF program's run time per tick it ran, in µs.
    pub fn bpf_per_sample(&self) -> Option<f64> {
        let seconds = self.bpf_seconds?;
        (self.bpf_seen > 0.0).then(|| seconds * 1e6 / self.bpf_seen)
    }

    /// CPU seconds no stage accounted for.
    pub fn unattributed(&self) -> Option<f64> {
        let stages = self.stages.as_ref()?;
        Some(self.cpu_seconds - stages.values().sum::<f64>())
    }
}

/// The figures of one run.
#[derive(Debug, Default)]
pub struct Measurement {
    pub ready_seconds: f64,
    /// From the spawn to the end of the first minute (start-up included).
    pub first: Option<Window>,
    /// From the end of the first minute to the end of the run.
    pub steady: Option<Window>,
    pub peak_rss_mb: f64,
    /// Median VmRSS over the steady window (over the run without one).
    pub steady_rss_mb: f64,
    pub samples: f64,
    pub lost: f64,
    /// `stack="…",reason="…"` and how many.
    pub truncated: Vec<(String, f64)>,
    pub sent: f64,
    pub uploads: Vec<(String, f64)>,
    /// Looks at `/metrics` that got no answer.
    pub scrapes_failed: usize,
    pub exit: String,
    /// With the mixed workload: processes started and over how long.
    pub churn: Option<(u64, f64)>,
}

impl Measurement {
    /// `ready_seconds`: from the spawn to the monitor's start, which
    /// followed right after `/ready` answered.
    pub fn from_series(series: &Series, ready_seconds: f64) -> Self {
        let scraped: Vec<(&Point, &Scrape)> = series
            .points
            .iter()
            .filter_map(|point| Some((point, point.scrape.as_deref()?)))
            .collect();
        let since_spawn = |point: &Point| point.at + ready_seconds;
        // The last look inside the first minute ends the first window.
        let split = scraped
            .iter()
            .rposition(|(point, _)| since_spawn(point) <= FIRST_WINDOW_SECONDS + 0.5);
        // At the spawn every counter is zero and no CPU was used.
        let zero = Scrape::default();
        let first = split.map(|index| {
            let (point, scrape) = scraped[index];
            window(
                (0.0, 0.0, &zero),
                (since_spawn(point), point.cpu_seconds, scrape),
            )
        });
        let steady = split.and_then(|index| {
            let (start, start_scrape) = scraped[index];
            let (end, end_scrape) = *scraped.last()?;
            // A steady window needs a few looks to say anything.
            (end.at - start.at >= 5.0).then(|| {
                window(
                    (start.at, start.cpu_seconds, start_scrape),
                    (end.at, end.cpu_seconds, end_scrape),
                )
            })
        });
        let steady_points: Vec<&Point> = match steady {
            Some(_) => series
                .points
                .iter()
                .filter(|point| since_spawn(point) > FIRST_WINDOW_SECONDS)
                .collect(),
            None => series.points.iter().collect(),
        };
        let last = scraped.last().map(|(_, scrape)| *scrape);
        let labelled = |family: &str| -> Vec<(String, f64)> {
            let mut series: Vec<(String, f64)> = last
                .map(|scrape| {
                    scrape
                        .family(family)
                        .map(|(labels, value)| (labels.to_owned(), value))
                        .collect()
                })
                .unwrap_or_default();
            series.sort_by(|a, b| a.0.cmp(&b.0));
            series
        };
        let total = |family: &str| last.map_or(0.0, |scrape| scrape.sum(family));
        Self {
            ready_seconds,
            first,
            steady,
            peak_rss_mb: mb(series.points.iter().map(|p| p.hwm_kb).max().unwrap_or(0)),
            steady_rss_mb: median(steady_points.iter().map(|p| p.rss_kb as f64)) / 1024.0,
            samples: total(SAMPLES),
            lost: total(LOST),
            truncated: labelled(TRUNCATED),
            sent: total(SENT),
            uploads: labelled(UPLOADS),
            scrapes_failed: series
                .points
                .iter()
                .filter(|p| p.scraping && p.scrape.is_none())
                .count(),
            ..Self::default()
        }
    }
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// The growth from `start` to `end`, each (seconds, CPU seconds, scrape).
fn window(start: (f64, f64, &Scrape), end: (f64, f64, &Scrape)) -> Window {
    let (start_at, start_cpu, before) = start;
    let (end_at, end_cpu, after) = end;
    let delta = |family: &str| after.sum(family) - before.sum(family);
    let stages = after.has(STAGE_FAMILY).then(|| {
        let mut stages = BTreeMap::new();
        for (labels, value) in after.family(STAGE_FAMILY) {
            let earlier = before
                .family(STAGE_FAMILY)
                .find(|(other, _)| *other == labels)
                .map_or(0.0, |(_, value)| value);
            *stages.entry(stage_name(labels)).or_insert(0.0) += value - earlier;
        }
        stages
    });
    Window {
        seconds: end_at - start_at,
        cpu_seconds: end_cpu - start_cpu,
        samples: delta(SAMPLES),
        bpf_seconds: after.has(BPF_RUN_TIME).then(|| delta(BPF_RUN_TIME)),
        bpf_seen: delta(BPF_SEEN),
        stages,
    }
}

/// `stage="sample"` → `sample`.
fn stage_name(labels: &str) -> String {
    labels
        .split(',')
        .find_map(|label| label.strip_prefix("stage=\""))
        .and_then(|value| value.strip_suffix('"'))
        .unwrap_or(labels)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn point(at: f64, cpu: f64, rss_kb: u64, metrics: &str) -> Point {
        Point {
            at,
            cpu_seconds: cpu,
            rss_kb,
            hwm_kb: rss_kb + 1024,
            scraping: true,
            scrape: Some(Arc::new(Scrape::parse(metrics))),
            ..Point::default()
        }
    }

    /// A look at `/proc` only, between scrapes.
    fn proc_only(at: f64, cpu: f64, rss_kb: u64) -> Point {
        Point {
            at,
            cpu_seconds: cpu,
            rss_kb,
            hwm_kb: rss_kb + 1024,
            ..Point::default()
        }
    }

    fn metrics(samples: u64, sample_cpu: f64, bpf: f64) -> String {
        format!(
            "firn_samples_total {samples}\n\
             firn_bpf_samples_seen_total {samples}\n\
             firn_bpf_run_time_seconds_total {bpf}\n\
             firn_cpu_seconds_total{{stage=\"sample\"}} {sample_cpu}\n\
             firn_cpu_seconds_total{{stage=\"push\"}} 0.5\n\
             firn_stacks_truncated_total{{stack=\"user\",reason=\"max_depth\"}} 3\n"
        )
    }

    #[test]
    fn windows_split_at_the_first_minute() {
        let series = Series {
            points: vec![
                point(0.0, 0.5, 10_240, &metrics(0, 0.1, 0.0)),
                point(59.0, 2.0, 20_480, &metrics(10_000, 1.0, 0.02)),
                point(89.0, 3.0, 30_720, &metrics(16_000, 1.6, 0.03)),
            ],
            phases: Vec::new(),
            end: 90.0,
            unanswered: 0,
        };
        let measurement = Measurement::from_series(&series, 1.0);
        let first = measurement.first.expect("a first window");
        assert_eq!(first.cpu_seconds, 2.0);
        assert_eq!(first.per_sample(first.cpu_seconds), Some(200.0));
        assert_eq!(first.bpf_per_sample(), Some(2.0));
        let stages = first.stages.as_ref().expect("stages");
        assert_eq!(stages["sample"], 1.0);
        assert_eq!(first.unattributed(), Some(0.5));
        let steady = measurement.steady.expect("a steady window");
        assert_eq!(steady.seconds, 30.0);
        assert_eq!(steady.samples, 6000.0);
        let per_sample = steady.per_sample(steady.cpu_seconds).expect("samples");
        assert!((per_sample - 166.666).abs() < 0.01);
        let stages = steady.stages.as_ref().expect("stages");
        assert!((stages["sample"] - 0.6).abs() < 1e-9);
        assert_eq!(stages["push"], 0.0);
        assert_eq!(measurement.peak_rss_mb, 31.0);
        assert_eq!(measurement.steady_rss_mb, 30.0);
        assert_eq!(
            measurement.truncated,
            [("stack=\"user\",reason=\"max_depth\"".to_owned(), 3.0)]
        );
    }

    /// Windows run between scrapes; the looks between them count only
    /// towards memory, and a scrape without an answer is counted.
    #[test]
    fn looks_without_a_scrape_give_memory_only() {
        let unanswered = Point {
            scraping: true,
            ..proc_only(70.0, 2.5, 40_960)
        };
        let series = Series {
            points: vec![
                point(0.0, 0.0, 10_240, &metrics(0, 0.0, 0.0)),
                proc_only(30.0, 1.0, 51_200),
                point(60.0, 2.0, 20_480, &metrics(12_000, 1.0, 0.02)),
                unanswered,
                point(90.0, 3.0, 20_480, &metrics(18_000, 1.5, 0.03)),
            ],
            phases: Vec::new(),
            end: 90.0,
            unanswered: 0,
        };
        let measurement = Measurement::from_series(&series, 0.1);
        let first = measurement.first.expect("a first window");
        assert_eq!((first.seconds, first.samples), (60.1, 12_000.0));
        let steady = measurement.steady.expect("a steady window");
        assert_eq!((steady.seconds, steady.samples), (30.0, 6_000.0));
        assert_eq!(measurement.peak_rss_mb, 51.0, "from a look between scrapes");
        assert_eq!(measurement.scrapes_failed, 1);
    }

    #[test]
    fn a_firn_without_the_stage_metric_has_totals_only() {
        let series = Series {
            points: vec![point(10.0, 1.0, 1024, "firn_samples_total 100\n")],
            phases: Vec::new(),
            end: 10.0,
            unanswered: 0,
        };
        let measurement = Measurement::from_series(&series, 0.5);
        let first = measurement.first.expect("a first window");
        assert!(first.stages.is_none());
        assert!(first.bpf_per_sample().is_none());
        assert_eq!(first.per_sample(first.cpu_seconds), Some(10_000.0));
        assert!(measurement.steady.is_none());
    }
}
