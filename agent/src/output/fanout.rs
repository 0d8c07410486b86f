//! Several destinations at once (a Parca and a Pyroscope server, say):
//! each batch goes to every exporter, each with its own queue and network
//! thread, so a slow or unreachable one never holds back another.

use std::time::Instant;

use tracing::error;

use super::{ExportReceipt, Exporter, Grouping, OutputError, ProfileBatch};

pub struct FanOut {
    exporters: Vec<Box<dyn Exporter>>,
}

impl FanOut {
    /// Remote exporters only: they all cut an interval per process.
    pub fn new(exporters: Vec<Box<dyn Exporter>>) -> Self {
        debug_assert!(
            exporters
                .iter()
                .all(|exporter| exporter.grouping() == Grouping::PerProcess)
        );
        Self { exporters }
    }
}

impl Exporter for FanOut {
    fn grouping(&self) -> Grouping {
        Grouping::PerProcess
    }

    /// Hands the batch to every exporter; one failing does not keep it
    /// from the others, and the batch fails only if it reached none.
    fn export(&mut self, batch: ProfileBatch) -> Result<ExportReceipt, OutputError> {
        let mut receipts = Vec::new();
        let mut failures = Vec::new();
        let mut outcome = |result| match result {
            Ok(receipt) => receipts.push(receipt),
            Err(failure) => failures.push(failure),
        };
        if let Some((last, rest)) = self.exporters.split_last_mut() {
            for exporter in rest {
                outcome(exporter.export(batch.clone()));
            }
            // The last one takes the batch itself: one copy fewer.
            outcome(last.export(batch));
        }
        if receipts.is_empty()
            && let Some(failure) = failures.pop()
        {
            for other in failures {
                error!(error = %format!("{:#}", anyhow::Error::from(other)), "a destination could not take the profiles");
            }
            return Err(failure);
        }
        for failure in failures {
            error!(error = %format!("{:#}", anyhow::Error::from(failure)), "a destination could not take the profiles");
        }
        Ok(ExportReceipt {
            action: receipts.first().map_or("profiles queued", |r| r.action),
            destination: receipts
                .iter()
                .map(|r| r.destination.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            bytes: receipts.iter().map(|r| r.bytes).sum(),
        })
    }

    fn finish(self: Box<Self>, deadline: Instant) {
        // Each flushes on its own thread; they stop together.
        std::thread::scope(|scope| {
            for exporter in self.exporters {
                scope.spawn(move || exporter.finish(deadline));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::SystemTime,
    };

    use super::*;
    use crate::output::{ProfileKind, SeriesProfile};

    /// Records what it is given; fails every export when `fail`.
    struct Recorder {
        name: &'static str,
        fail: bool,
        seen: Arc<Mutex<Vec<(&'static str, usize)>>>,
    }

    impl Exporter for Recorder {
        fn grouping(&self) -> Grouping {
            Grouping::PerProcess
        }

        fn export(&mut self, batch: ProfileBatch) -> Result<ExportReceipt, OutputError> {
            if self.fail {
                return Err(OutputError::FlameGraph {
                    source: std::io::Error::other("down"),
                });
            }
            self.seen
                .lock()
                .expect("lock")
                .push((self.name, batch.profiles.len()));
            Ok(ExportReceipt {
                action: "profiles queued",
                destination: self.name.to_owned(),
                bytes: 10,
            })
        }

        fn finish(self: Box<Self>, _: Instant) {}
    }

    fn batch() -> ProfileBatch {
        ProfileBatch {
            kind: ProfileKind::Cpu,
            start: SystemTime::now(),
            profiles: vec![
                SeriesProfile {
                    labels: Vec::new(),
                    gzipped: vec![1],
                    samples: 1,
                };
                3
            ],
            debuginfo_candidates: Vec::new(),
            symbolized_objects: Vec::new(),
            unsymbolized_objects: 0,
        }
    }

    #[test]
    fn every_destination_gets_the_batch_and_one_failing_stops_no_other() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = |name, fail| -> Box<dyn Exporter> {
            Box::new(Recorder {
                name,
                fail,
                seen: seen.clone(),
            })
        };
        let mut fan = FanOut::new(vec![
            recorder("parca", false),
            recorder("broken", true),
            recorder("pyroscope", false),
        ]);
        let receipt = fan.export(batch()).expect("two took it");
        assert_eq!(receipt.destination, "parca, pyroscope");
        assert_eq!(receipt.bytes, 20);
        assert_eq!(
            *seen.lock().expect("lock"),
            [("parca", 3), ("pyroscope", 3)]
        );
        let mut none = FanOut::new(vec![recorder("a", true), recorder("b", true)]);
        assert!(none.export(batch()).is_err(), "reached no destination");
        Box::new(fan).finish(Instant::now());
    }
}
