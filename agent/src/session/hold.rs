//! Samples held until their process's maps can be trusted.
//!
//! A process of a few milliseconds is gone before its samples are
//! drained, and one drained while it still runs may not have mapped its
//! libraries when firn read its maps (at its exec). With the kernel
//! capturing each exiting process's mappings (`Record::Mapping`, before
//! its exit event, and before its exec event when it executes another
//! program), such samples wait: on that event they are placed with the
//! captured mappings; a process that lives on is read (again,
//! if it was read at its exec) once it has run [`SETTLE_AFTER`]: a new
//! program firn needs nothing of before then is not read before, so the
//! many that exit first cost no read at all. Bounded in bytes; a sample that finds the
//! bound reached is handled at once (counted), as without the capture.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use std::sync::atomic::Ordering;

use agent_proc::maps::{MappingKind, MappingSpec};
use agent_records::CapturedMapping;

use super::Pipeline;
use crate::{
    bpf::BpfSampler,
    sampler::{self, Record},
    stats::Stats,
};

/// Held samples' bytes at most (records are copied out of the ring).
pub const MAX_HELD_BYTES: usize = 32 << 20;
/// A live process's held samples are released once its maps are read this
/// long after its first held sample (at the first drain after it): past
/// its dynamic loader by then, which takes a few milliseconds, and soon
/// enough that an interpreter is registered with the walker about when it
/// was without holding (its exec drained at the next timed drain).
pub const SETTLE_AFTER: Duration = Duration::from_millis(50);
/// Longest a sample waits: then it is handled with what firn has.
pub const HOLD_GRACE: Duration = Duration::from_secs(2);
/// Processes whose captured mappings wait for their exit event at once,
/// and mappings kept per process.
const MAX_CAPTURING: usize = 4096;
const MAX_CAPTURED_MAPPINGS: usize = 1024;

struct Held {
    since: Instant,
    comm: String,
    records: Vec<Box<[u8]>>,
}

#[derive(Default)]
pub struct HeldSamples {
    held: HashMap<u32, Held>,
    bytes: usize,
    captured: HashMap<u32, Vec<MappingSpec>>,
}

impl HeldSamples {
    /// Keeps a copy of `record`, a sample of `tgid`; false when the bound
    /// is reached (the caller handles it at once).
    pub fn hold(&mut self, tgid: u32, comm: &str, record: &[u8]) -> bool {
        if self.bytes + record.len() > MAX_HELD_BYTES {
            return false;
        }
        self.bytes += record.len();
        self.held
            .entry(tgid)
            .or_insert_with(|| Held {
                since: Instant::now(),
                comm: comm.to_owned(),
                records: Vec::new(),
            })
            .records
            .push(record.into());
        true
    }

    /// Whether no sample waits.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The held samples of `tgid`, in the order they came.
    pub fn take(&mut self, tgid: u32) -> Vec<Box<[u8]>> {
        let records = self
            .held
            .remove(&tgid)
            .map(|held| held.records)
            .unwrap_or_default();
        self.bytes -= records.iter().map(|record| record.len()).sum::<usize>();
        records
    }

    /// Processes whose samples have waited [`SETTLE_AFTER`], with their
    /// name and whether they waited past [`HOLD_GRACE`].
    pub fn waiting(&self, now: Instant) -> Vec<(u32, String, bool)> {
        self.held
            .iter()
            .filter(|(_, held)| now.duration_since(held.since) >= SETTLE_AFTER)
            .map(|(&tgid, held)| {
                let expired = now.duration_since(held.since) >= HOLD_GRACE;
                (tgid, held.comm.clone(), expired)
            })
            .collect()
    }

    /// A mapping the kernel captured as `mapping.tgid` exited.
    pub fn capture(&mut self, mapping: CapturedMapping, page_size: u64) {
        if !self.captured.contains_key(&mapping.tgid) && self.captured.len() >= MAX_CAPTURING {
            // Exit events that never came (lost): the oldest are as good
            // as any to forget.
            self.captured.clear();
        }
        let specs = self.captured.entry(mapping.tgid).or_default();
        if specs.len() < MAX_CAPTURED_MAPPINGS {
            specs.push(spec(&mapping, page_size));
        }
    }

    /// The mappings captured for `tgid`, at its exit event.
    pub fn captured(&mut self, tgid: u32) -> Option<Vec<MappingSpec>> {
        let mut specs = self.captured.remove(&tgid)?;
        specs.sort_by_key(|spec| spec.start);
        Some(specs)
    }
}

impl Pipeline {
    /// Handles the samples of `tgid` that were held, counted as `how`.
    pub(super) fn release(&mut self, tgid: u32, how: Released) {
        let records = self.held.take(tgid);
        if records.is_empty() {
            return;
        }
        let counter = match how {
            Released::ExitMaps => &self.stats.held_exit_maps,
            Released::ExecMaps => &self.stats.held_exec_maps,
            Released::MapsRead => &self.stats.held_maps_read,
            Released::NoMaps => &self.stats.held_no_maps,
            Released::Expired => &self.stats.held_expired,
        };
        counter.fetch_add(records.len() as u64, Ordering::Relaxed);
        for record in records {
            if let Ok(Record::Sample(sample)) = sampler::decode(&record) {
                self.count_truncated(&sample);
                self.sample(sample);
            }
        }
    }

    /// The image `tgid` ran until this exit or exec is over: its held
    /// samples are placed with the mappings the kernel captured just
    /// before (counted as `captured`), else with what firn has of it.
    pub(super) fn release_image(&mut self, tgid: u32, comm: &str, captured: Released) {
        match self.held.captured(tgid) {
            Some(specs) => {
                self.processes.install_captured(tgid, comm, specs);
                self.release(tgid, captured);
            }
            None => {
                self.processes.unreadable(tgid);
                self.release(tgid, Released::NoMaps);
            }
        }
    }

    /// Held samples of processes that lived on are placed with their maps
    /// read now; those that waited too long with what firn has.
    pub(super) fn release_waiting(&mut self) {
        for (tgid, comm, expired) in self.held.waiting(Instant::now()) {
            let deferred = self.processes.unread(tgid);
            if self.processes.settle(tgid, &comm) {
                // Its first read: decided as a first sample would be.
                if deferred {
                    self.prepare(tgid);
                }
                self.release(tgid, Released::MapsRead);
            } else if expired {
                self.release(tgid, Released::Expired);
            }
        }
    }
}

/// How held samples were let go.
#[derive(Clone, Copy)]
pub(super) enum Released {
    ExitMaps,
    ExecMaps,
    MapsRead,
    NoMaps,
    Expired,
}

pub(super) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size)
        .ok()
        .filter(|&size| size > 0)
        .unwrap_or(4096)
}

/// Copies the exit walk's BPF counters into the stats (they are totals).
pub(super) fn mirror_exit_maps(bpf: &BpfSampler, stats: &Stats) {
    use agent_common::MapsCounter;
    let values = bpf.exit_maps_counters();
    for (counter, stat) in [
        (MapsCounter::Walked, &stats.exit_maps_walked),
        (MapsCounter::Mappings, &stats.exit_maps_mappings),
        (MapsCounter::Lost, &stats.exit_maps_lost),
        (MapsCounter::PathIncomplete, &stats.exit_maps_no_path),
        (MapsCounter::WalkCut, &stats.exit_maps_cut),
    ] {
        Stats::set(stat, values[counter as usize]);
    }
}

/// The mapping as `/proc/PID/maps` would have shown it.
fn spec(mapping: &CapturedMapping, page_size: u64) -> MappingSpec {
    MappingSpec {
        start: mapping.start,
        end: mapping.end,
        offset: mapping.page_offset.saturating_mul(page_size),
        dev: agent_proc::makedev(u64::from(mapping.dev_major), u64::from(mapping.dev_minor)),
        inode: mapping.inode,
        // Without a path the object is found by device and inode among
        // those already open.
        path: mapping.path.clone().unwrap_or_default(),
        kind: MappingKind::File,
        deleted: mapping.deleted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(tgid: u32, start: u64) -> CapturedMapping {
        CapturedMapping {
            tgid,
            start,
            end: start + 0x1000,
            page_offset: 2,
            inode: 7,
            dev_major: 254,
            dev_minor: 1,
            path: Some("/usr/lib/libc.so.6".into()),
            deleted: false,
        }
    }

    #[test]
    fn captured_mappings_come_back_sorted_as_maps_would_show_them() {
        let mut held = HeldSamples::default();
        held.capture(mapping(5, 0x7000), 4096);
        held.capture(mapping(5, 0x5000), 4096);
        held.capture(mapping(6, 0x1000), 4096);
        let specs = held.captured(5).expect("captured");
        assert_eq!(
            specs.iter().map(|s| s.start).collect::<Vec<_>>(),
            [0x5000, 0x7000]
        );
        assert_eq!(specs[0].offset, 2 * 4096);
        assert_eq!(specs[0].dev, agent_proc::makedev(254, 1));
        assert!(held.captured(5).is_none(), "taken once");
    }

    #[test]
    fn held_samples_are_bounded_and_given_back_in_order() {
        let mut held = HeldSamples::default();
        assert!(held.hold(1, "a", &[1, 2]));
        assert!(held.hold(1, "a", &[3]));
        assert!(!held.hold(2, "b", &vec![0; MAX_HELD_BYTES]));
        assert_eq!(held.take(1), vec![Box::from([1u8, 2]), Box::from([3u8])]);
        assert!(held.take(1).is_empty());
        assert!(held.hold(2, "b", &vec![0; MAX_HELD_BYTES]), "room again");
    }
}
