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
