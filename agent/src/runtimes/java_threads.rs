//! The Java names of a JVM's threads, read through its thread list every
//! so often and remembered, bounded.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use agent_runtimes::hotspot::{HotSpotError, ObjectLayout, ThreadLayout, java_threads};
use tracing::debug;

use super::ProcessMemory;

/// Most thread names remembered of one JVM.
const MAX_THREAD_NAMES: usize = 4096;

/// How long a JVM's thread names are believed (a thread may rename
/// itself), and how soon after a read an unknown thread reads them again.
const THREAD_NAMES_FRESH: Duration = Duration::from_secs(10);
const THREAD_NAMES_RETRY: Duration = Duration::from_secs(1);

/// The Java names of one JVM's threads, as last read.
pub(super) struct JvmThreads {
    layout: ThreadLayout,
    /// Read once the JVM has loaded `Thread` and `String`.
    objects: Option<ObjectLayout>,
    names: HashMap<u32, Arc<str>>,
    read_at: Option<Instant>,
}

impl JvmThreads {
    pub(super) fn new(layout: ThreadLayout) -> Self {
        Self {
            layout,
            objects: None,
            names: HashMap::new(),
            read_at: None,
        }
    }

    /// `now`: the time of the sample, read once for a batch of them.
    pub(super) fn name(&mut self, tgid: u32, tid: u32, now: Instant) -> Option<Arc<str>> {
        let age = self.read_at.map(|at| now.saturating_duration_since(at));
        let stale = match age {
            None => true,
            Some(age) => {
                age > THREAD_NAMES_FRESH
                    || (!self.names.contains_key(&tid) && age > THREAD_NAMES_RETRY)
            }
        };
        if stale {
            self.read_at = Some(now);
            self.names.clear();
            if let Err(error) = self.read(tgid) {
                debug!(tgid, %error, "Java thread names not read");
            }
        }
        self.names.get(&tid).cloned()
    }

    fn read(&mut self, tgid: u32) -> Result<(), HotSpotError> {
        let mut memory = ProcessMemory::new(tgid);
        let objects = match &self.objects {
            Some(objects) => objects,
            None => self
                .objects
                .insert(ObjectLayout::read(&mut memory, &self.layout)?),
        };
        for (tid, thread) in java_threads(&mut memory, &self.layout)? {
            if self.names.len() >= MAX_THREAD_NAMES {
                break;
            }
            if thread == 0 {
                continue;
            }
            match objects.thread_name(&mut memory, &self.layout, thread) {
                Ok(name) => {
                    self.names.insert(tid, name.into());
                }
                Err(error) => debug!(tgid, tid, %error, "Java thread name not read"),
            }
        }
        Ok(())
    }
}
