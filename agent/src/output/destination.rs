//! What each destination (a Parca or Pyroscope server) did with the
//! profiles sent to it, beside the totals over all destinations in
//! [`Stats`]: with several destinations one that is down must be told
//! apart from one that is fine. Exposed on `/metrics` with a
//! `destination` label (see `stats::DESTINATION_FAMILIES`).

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};

use crate::stats::Stats;

/// One destination's counters and queue gauges.
#[derive(Debug, Default)]
pub struct DestinationStats {
    /// The `destination` label: `parca`, `pyroscope`, or the name the
    /// config file gives.
    pub name: String,
    pub profiles_sent: AtomicU64,
    pub profiles_dropped: AtomicU64,
    pub profiles_rejected: AtomicU64,
    pub push_failures: AtomicU64,
    pub push_retries: AtomicU64,
    pub queue_bytes: AtomicU64,
    pub queue_profiles: AtomicU64,
}

impl DestinationStats {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// `(family, value)` for each series, in `DESTINATION_FAMILIES` order.
    pub fn values(&self) -> [(&'static str, u64); 7] {
        let read = |value: &AtomicU64| value.load(Ordering::Relaxed);
        [
            ("destination_profiles_sent", read(&self.profiles_sent)),
            ("destination_profiles_dropped", read(&self.profiles_dropped)),
            (
                "destination_profiles_rejected",
                read(&self.profiles_rejected),
            ),
            ("destination_push_failures", read(&self.push_failures)),
            ("destination_push_retries", read(&self.push_retries)),
            ("destination_queue_bytes", read(&self.queue_bytes)),
            ("destination_queue_profiles", read(&self.queue_profiles)),
        ]
    }
}

/// Every destination of this run, for `/metrics`.
#[derive(Debug, Default)]
pub struct Destinations(Mutex<Vec<Arc<DestinationStats>>>);

impl Destinations {
    /// A new destination's counters; a name already taken gets a number.
    pub fn register(&self, name: &str) -> Arc<DestinationStats> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let taken = |candidate: &str| all.iter().any(|d| d.name == candidate);
        let mut unique = name.to_owned();
        let mut n = 2;
        while taken(&unique) {
            unique = format!("{name}-{n}");
            n += 1;
        }
        let stats = Arc::new(DestinationStats::new(&unique));
        all.push(stats.clone());
        stats
    }

    pub fn all(&self) -> Vec<Arc<DestinationStats>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Counts an event for one destination and in the totals at once.
#[derive(Clone, Debug)]
pub struct Tally {
    total: Arc<Stats>,
    own: Arc<DestinationStats>,
}

impl Tally {
    pub fn new(total: Arc<Stats>, own: Arc<DestinationStats>) -> Self {
        Self { total, own }
    }

    pub fn name(&self) -> &str {
        &self.own.name
    }

    pub fn sent(&self, profiles: u64) {
        Stats::add(&self.total.remote_profiles_sent, profiles);
        Stats::add(&self.own.profiles_sent, profiles);
    }

    pub fn dropped(&self, profiles: u64) {
        Stats::add(&self.total.remote_profiles_dropped, profiles);
        Stats::add(&self.own.profiles_dropped, profiles);
    }

    pub fn rejected(&self, profiles: u64) {
        Stats::add(&self.total.remote_profiles_rejected, profiles);
        Stats::add(&self.own.profiles_rejected, profiles);
    }

    pub fn failure(&self) {
        Stats::inc(&self.total.remote_send_failures);
        Stats::inc(&self.own.push_failures);
    }

    pub fn retry(&self) {
        Stats::inc(&self.total.remote_send_retries);
        Stats::inc(&self.own.push_retries);
    }

    /// Series handed to this destination: `profiles_written` counts each
    /// destination's copy, so `written = sent + dropped + rejected +
    /// queued` holds over the totals too.
    pub fn written(&self, profiles: u64) {
        Stats::add(&self.total.profiles_written, profiles);
    }

    /// The queue now holds this much; the totals move by the difference.
    pub fn queue_level(&self, bytes: u64, profiles: u64) {
        for (own, total, now) in [
            (&self.own.queue_bytes, &self.total.remote_queue_bytes, bytes),
            (
                &self.own.queue_profiles,
                &self.total.remote_queue_profiles,
                profiles,
            ),
        ] {
            let before = own.swap(now, Ordering::Relaxed);
            // Added before subtracted, so the total never dips below zero.
            total.fetch_add(now, Ordering::Relaxed);
            total.fetch_sub(before, Ordering::Relaxed);
        }
    }

    /// The debuginfo uploader counts into the totals only.
    pub fn total(&self) -> &Arc<Stats> {
        &self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_destination_counts_apart_and_the_totals_add_up() {
        let total = Arc::new(Stats::default());
        let destinations = Destinations::default();
        let parca = Tally::new(total.clone(), destinations.register("parca"));
        let pyroscope = Tally::new(total.clone(), destinations.register("pyroscope"));
        let again = destinations.register("pyroscope");
        assert_eq!(again.name, "pyroscope-2");
        parca.sent(3);
        pyroscope.sent(2);
        pyroscope.failure();
        parca.queue_level(100, 1);
        pyroscope.queue_level(50, 2);
        parca.queue_level(10, 1);
        let snapshot = total.snapshot();
        assert_eq!(snapshot.remote_profiles_sent, 5);
        assert_eq!(snapshot.remote_send_failures, 1);
        assert_eq!(snapshot.remote_queue_bytes, 60);
        assert_eq!(snapshot.remote_queue_profiles, 3);
        let values = destinations.all()[1].values();
        assert_eq!(values[0], ("destination_profiles_sent", 2));
        assert_eq!(values[3], ("destination_push_failures", 1));
        assert_eq!(values[5], ("destination_queue_bytes", 50));
    }
}
