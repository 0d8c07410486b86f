//! Counters every stage updates: what was seen, dropped, unknown, cached.
//! Nothing is lost silently: the summaries log these and `/metrics`
//! exposes them. Each is declared once, in `catalog`: its metric family
//! (name, kind, help), its labels, and which `Stats` field or BPF counter
//! feeds it. The `Stats` struct, its snapshot and the metric table all
//! follow from that one declaration.

mod catalog;
pub mod cpu;

use std::sync::atomic::{AtomicU64, Ordering};

use agent_common::Counter;

pub use catalog::{DESTINATION_FAMILIES, FAMILIES, ROWS, Stats, StatsSnapshot};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One metric family. `name` is without the `firn_` prefix and, for
/// counters, without `_total` (the encoder adds both).
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

/// Where a series' value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A field of `StatsSnapshot`, by name.
    Stat(&'static str),
    /// A counter of the BPF program, summed over CPUs.
    Bpf(Counter),
}

/// One series: a source, its family and its labels.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub source: Source,
    pub family: &'static str,
    pub labels: &'static [(&'static str, &'static str)],
}

/// Declares the metric families in the order they are exposed, each with
/// the series that feed it: `stats` fields (which become the fields of
/// `Stats`) and `bpf` counters (the BPF program's, by `Counter` variant),
/// each with its labels. A field named twice does not compile.
macro_rules! declare_metrics {
    ($(
        $family:ident: $kind:ident, $help:literal {
            $( stats: [ $(
                $(#[doc = $doc:literal])*
                $field:ident { $( $field_label:ident = $field_value:literal ),* }
            ),* $(,)? ], )?
            $( bpf: [ $(
                $counter:ident { $( $counter_label:ident = $counter_value:literal ),* }
            ),* $(,)? ], )?
        }
    )*) => {
        /// Monotonic counters (and a few gauges), shared by the stages
        /// through an `Arc`.
        #[derive(Debug, Default)]
        pub struct Stats {
            $($($( $(#[doc = $doc])* pub $field: AtomicU64, )*)?)*
        }

        /// A point-in-time copy of [`Stats`].
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $($($( pub $field: u64, )*)?)*
        }

        impl Stats {
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($($( $field: self.$field.load(Ordering::Relaxed), )*)?)* }
            }
        }

        impl StatsSnapshot {
            /// Counter names and values, for logs and metrics.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![ $($($( (stringify!($field), self.$field), )*)?)* ]
            }

            /// What happened since `earlier`.
            pub fn since(&self, earlier: &Self) -> Self {
                Self { $($($( $field: self.$field.saturating_sub(earlier.$field), )*)?)* }
            }
        }

        /// Every family, in the order they are exposed.
        pub const FAMILIES: &[Family] = &[
            $( Family { name: stringify!($family), kind: Kind::$kind, help: $help }, )*
        ];

        /// Every series, once.
        pub const ROWS: &[Row] = &[
            $(
                $($( Row {
                    source: Source::Stat(stringify!($field)),
                    family: stringify!($family),
                    labels: &[ $( (stringify!($field_label), $field_value) ),* ],
                }, )*)?
                $($( Row {
                    source: Source::Bpf(Counter::$counter),
                    family: stringify!($family),
                    labels: &[ $( (stringify!($counter_label), $counter_value) ),* ],
                }, )*)?
            )*
        ];
    };
}

use declare_metrics;

impl Stats {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// For the few gauges among the counters.
    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn snapshots_subtract() {
        let stats = Stats::default();
        Stats::add(&stats.samples_received, 5);
        let first = stats.snapshot();
        Stats::inc(&stats.samples_received);
        Stats::inc(&stats.records_malformed);
        let delta = stats.snapshot().since(&first);
        assert_eq!(delta.samples_received, 1);
        assert_eq!(delta.records_malformed, 1);
        assert!(
            delta
                .fields()
                .iter()
                .any(|&(name, value)| name == "records_malformed" && value == 1)
        );
    }

    #[test]
    fn every_bpf_counter_has_exactly_one_row() {
        for counter in Counter::ALL {
            let rows = ROWS
                .iter()
                .filter(|row| row.source == Source::Bpf(counter))
                .count();
            assert_eq!(rows, 1, "{counter:?} needs exactly one row");
        }
    }

    #[test]
    fn rows_name_known_families_with_distinct_label_sets() {
        let valid = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let mut names = HashSet::new();
        for family in FAMILIES {
            assert!(valid(family.name), "{}", family.name);
            assert!(names.insert(family.name), "{} twice", family.name);
            assert!(
                !family.name.ends_with("_total"),
                "{}: the encoder adds _total",
                family.name
            );
            assert!(
                ROWS.iter().any(|row| row.family == family.name),
                "{} has no rows",
                family.name
            );
        }
        let mut series = HashSet::new();
        for row in ROWS {
            assert!(names.contains(row.family), "unknown family {}", row.family);
            for (key, _) in row.labels {
                assert!(valid(key), "{key}");
            }
            assert!(
                series.insert((row.family, row.labels)),
                "{} {:?} twice",
                row.family,
                row.labels
            );
        }
    }
}
