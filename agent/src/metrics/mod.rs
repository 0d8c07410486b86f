//! What `/metrics` serves, in the OpenMetrics text format
//! (`prometheus-client`), every name prefixed `firn_`: each counter of
//! [`Stats`] and of the BPF program, as `stats` declares them, read at
//! scrape time; the BPF program's run time; firn's CPU time by stage; the
//! push duration histogram; the build info.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, OnceLock},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet},
    metrics::{MetricType, histogram::Histogram},
    registry::Registry,
};

use crate::{
    bpf::BpfProbe,
    output::destination::{DestinationStats, Destinations},
    stats::{DESTINATION_FAMILIES, FAMILIES, Kind, ROWS, Source, Stats, cpu},
};

/// The content type of [`Metrics::encode`]'s text, which Prometheus and
/// other OpenMetrics scrapers accept.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Push latency buckets, seconds: a healthy push takes milliseconds, a
/// struggling server up to `--remote-store-rpc-unary-timeout`.
const PUSH_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The registry and the handles the stages feed.
pub struct Metrics {
    registry: Registry,
    push_duration: Histogram,
    bpf: Arc<OnceLock<BpfProbe>>,
    destinations: Arc<Destinations>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new(stats: Arc<Stats>) -> Self {
        let mut registry = Registry::with_prefix("firn");
        let push_duration = Histogram::new(PUSH_BUCKETS);
        registry.register(
            "push_duration_seconds",
            "Time each push to the remote store took, failed ones included.",
            push_duration.clone(),
        );
        let bpf = Arc::new(OnceLock::new());
        let destinations = Arc::new(Destinations::default());
        registry.register_collector(Box::new(Counters {
            stats,
            bpf: bpf.clone(),
            destinations: destinations.clone(),
        }));
        Self {
            registry,
            push_duration,
            bpf,
            destinations,
        }
    }

    /// The counters of one more destination, exposed from now on.
    pub fn destination(&self, name: &str) -> Arc<DestinationStats> {
        self.destinations.register(name)
    }

    /// The histogram the remote store's delivery observes.
    pub fn push_duration(&self) -> Histogram {
        self.push_duration.clone()
    }

    /// From now on the BPF counters and run time are exposed too.
    pub fn attach_bpf(&self, probe: BpfProbe) {
        let _ = self.bpf.set(probe);
    }

    /// The whole exposition, ending in `# EOF`.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Reads the counters at each scrape, so they are never stale and cost
/// nothing between scrapes.
#[derive(Debug)]
struct Counters {
    stats: Arc<Stats>,
    bpf: Arc<OnceLock<BpfProbe>>,
    destinations: Arc<Destinations>,
}

impl Counters {
    fn encode_destinations(&self, encoder: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
        let destinations = self.destinations.all();
        if destinations.is_empty() {
            return Ok(());
        }
        let values: Vec<_> = destinations.iter().map(|d| d.values()).collect();
        for (index, family) in DESTINATION_FAMILIES.iter().enumerate() {
            let metric_type = match family.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, metric_type)?;
            for (destination, values) in destinations.iter().zip(&values) {
                let labels = [("destination", destination.name.as_str())];
                encode_value(
                    &mut metric.encode_family(&labels)?,
                    family.kind,
                    values[index].1,
                )?;
            }
        }
        Ok(())
    }
}

impl Collector for Counters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let stats: HashMap<&str, u64> = self.stats.snapshot().fields().into_iter().collect();
        let probe = self.bpf.get();
        let bpf = probe.map(BpfProbe::counters);
        for family in FAMILIES {
            let series: Vec<(&[(&str, &str)], u64)> = ROWS
                .iter()
                .filter(|row| row.family == family.name)
                .filter_map(|row| {
                    let value = match row.source {
                        Source::Stat(field) => stats.get(field).copied(),
                        // Not until the programs are loaded.
                        Source::Bpf(counter) => bpf.map(|counters| counters.get(counter)),
                    }?;
                    Some((row.labels, value))
                })
                .collect();
            if series.is_empty() {
                continue;
            }
            let metric_type = match family.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, metric_type)?;
            for (labels, value) in &series {
                // An empty label set would be written as `{}`.
                if labels.is_empty() {
                    encode_value(&mut metric, family.kind, *value)?;
                } else {
                    encode_value(&mut metric.encode_family(labels)?, family.kind, *value)?;
                }
            }
        }
        self.encode_destinations(&mut encoder)?;
        if let Some(run_time) = probe.and_then(BpfProbe::run_time) {
            let mut metric = encoder.encode_descriptor(
                "bpf_run_time_seconds",
                "CPU time spent in the BPF sampling program, from the kernel's BPF \
                 statistics (divide by firn_bpf_samples_seen_total for the cost per sample).",
                None,
                MetricType::Counter,
            )?;
            let seconds = run_time.run_time_ns as f64 / 1e9;
            metric.encode_counter::<NoLabelSet, _, u64>(&seconds, None)?;
        }
        encode_cpu_time(&mut encoder)?;
        let labels = [("version", env!("CARGO_PKG_VERSION"))];
        encoder
            .encode_descriptor(
                "build_info",
                "The firn version running (always 1).",
                None,
                MetricType::Gauge,
            )?
            .encode_family(&labels)?
            .encode_gauge(&1u64)
    }
}

fn encode_cpu_time(encoder: &mut DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
    let (stages, other) = cpu::totals();
    let mut metric = encoder.encode_descriptor(
        "cpu_seconds",
        "CPU time of firn's own threads by stage: sample (ring buffer, process images, \
         unwinding, aggregation), symbolize, label, encode (pprof), export, push, upload \
         (debug information), http, other (the rest of the process's CPU time). The BPF \
         program's time is firn_bpf_run_time_seconds.",
        None,
        MetricType::Counter,
    )?;
    let named = stages
        .into_iter()
        .map(|(stage, time)| (stage.name(), time))
        .chain([("other", other)]);
    for (stage, time) in named {
        metric
            .encode_family(&[("stage", stage)])?
            .encode_counter::<NoLabelSet, _, u64>(&time.as_secs_f64(), None)?;
    }
    Ok(())
}

fn encode_value(metric: &mut MetricEncoder<'_>, kind: Kind, value: u64) -> Result<(), fmt::Error> {
    match kind {
        Kind::Counter => metric.encode_counter::<NoLabelSet, _, u64>(&value, None),
        Kind::Gauge => metric.encode_gauge(&value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_are_exposed_with_their_labels() {
        let stats = Arc::new(Stats::default());
        Stats::add(&stats.samples_received, 1234);
        Stats::add(&stats.samples_dropped_stack_limit, 7);
        Stats::set(&stats.remote_queue_bytes, 4096);
        Stats::add(&stats.symbol_cache_hits, 3);
        let metrics = Metrics::new(stats);
        metrics.push_duration().observe(0.02);
        let text = metrics.encode().expect("encodes");
        for line in [
            "# TYPE firn_samples counter",
            "firn_samples_total 1234",
            "firn_samples_lost_total{reason=\"max_stacks_per_profile\"} 7",
            "# TYPE firn_queue_bytes gauge",
            "firn_queue_bytes 4096",
            "firn_symbolizer_cache_hits_total{cache=\"symbol_table\"} 3",
            "firn_push_duration_seconds_bucket{le=\"0.025\"} 1",
            "firn_push_duration_seconds_count 1",
            "firn_unwind_failures_total{reason=\"leaf_repair\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
        assert!(text.contains("firn_build_info{version=\""), "{text}");
        assert!(text.ends_with("# EOF\n"));
        // Without BPF programs there is nothing to say about them yet.
        assert!(!text.contains("firn_bpf_samples_seen"), "{text}");
    }
}
