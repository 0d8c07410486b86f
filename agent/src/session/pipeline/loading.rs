//! Processes a runtime waits for: caught before their loader mapped what
//! the runtime looks for (an interpreter and the C library), their maps
//! are read again when due, between drains if need be.

use std::time::Instant;

use super::Pipeline;

impl Pipeline {
    /// Reads again the maps of the processes due, for every runtime to
    /// look at.
    pub(super) fn read_loading(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .runtimes
            .iter_mut()
            .flat_map(|runtime| runtime.loading_due(now))
            .collect();
        for tgid in due {
            if let Some(image) = self.processes.read_again(tgid) {
                self.observe(&image);
            }
        }
    }

    /// When the next read is due.
    pub(crate) fn next_loading(&self) -> Option<Instant> {
        self.runtimes
            .iter()
            .filter_map(|runtime| runtime.next_loading())
            .min()
    }
}
