//! Interpreters caught before their loader ran, and how soon they are
//! heard of.
//!
//! firn reads a new program's maps at its exec, when only the executable
//! and the dynamic loader are mapped: the C library the walker needs (and
//! `libpython`, where the interpreter lives there) come a millisecond or
//! so later. Such a process is read again shortly after, a few times with
//! growing pauses, until they are mapped; a short script's first Python
//! frames run only after the interpreter's own start-up, some ten
//! milliseconds in, so it is registered before them. Once registered, its
//! samples wake the reader at once for a while, so that its frames are
//! named from its memory while it lives.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use agent_common::{ExecutableKey, InterpreterProcess};
use agent_runtimes::{libc::libc_kind, python::loads_libpython};

use super::{MAX_REMEMBERED_OBJECTS, ProcessState, PythonRuntime, remember};
use crate::{
    process::{MappingKind, ProcessImage, ProcessTable},
    stats::Stats,
};

/// The first read again, after the exec's.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// Reads again at most (the pauses double: 1 to 64 ms, ~130 ms in all);
/// a loader slower than that leaves the process to its samples, whose
/// addresses outside the image read it again.
const MAX_READS: u32 = 8;
/// How long a newly registered interpreter's samples wake the reader.
pub const WAKE_FOR: Duration = Duration::from_secs(1);

/// Processes whose maps are to be read again, and when.
#[derive(Default)]
pub struct Loading {
    due: HashMap<u32, Instant>,
}

impl Loading {
    /// `tgid`'s loader had not run when its image was read (`reads`
    /// times since its exec): read it again after a pause longer than the
    /// last. False once it was read again [`MAX_READS`] times.
    pub fn wait(&mut self, tgid: u32, reads: u32, now: Instant) -> bool {
        if reads >= MAX_READS {
            return false;
        }
        self.due.insert(tgid, now + FIRST_PAUSE * (1 << reads));
        true
    }

    /// The processes due at `now`, each handed out once (a read that finds
    /// the loader still running waits again).
    pub fn take_due(&mut self, now: Instant) -> Vec<u32> {
        let due: Vec<u32> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(&tgid, _)| tgid)
            .collect();
        for tgid in &due {
            self.due.remove(tgid);
        }
        due
    }

    pub fn next(&self) -> Option<Instant> {
        self.due.values().min().copied()
    }

    pub fn forget(&mut self, tgid: u32) {
        self.due.remove(&tgid);
    }
}

impl PythonRuntime {
    /// An interpreter in an executable loaded where it was linked (not
    /// position-independent): every process of it has the same layout, so
    /// the BPF program registers the next ones at their exec, before firn
    /// has read their maps (it still does, and checks).
    pub(super) fn register_executable(
        &mut self,
        image: &ProcessImage,
        index: usize,
        bias: u64,
        layout: InterpreterProcess,
    ) {
        let mapping = &image.mappings[index];
        if bias != 0 || Some(mapping.spec.path.as_str()) != image.executable() {
            return;
        }
        let dev = mapping.spec.dev;
        let executable = ExecutableKey {
            inode: mapping.spec.inode,
            dev: (libc::major(dev) << 20) | libc::minor(dev),
            reserved: 0,
        };
        if self.registered_at_exec.len() >= MAX_REMEMBERED_OBJECTS {
            Stats::add(
                &self.stats.python_executables_forgotten,
                self.registered_at_exec.len() as u64,
            );
            self.registered_at_exec.clear();
        }
        if self.registered_at_exec.insert(executable) {
            Stats::inc(&self.stats.python_executables_set);
            let wake_ms = u32::try_from(WAKE_FOR.as_millis()).unwrap_or(u32::MAX);
            self.map.set_executable(
                executable,
                InterpreterProcess {
                    wake_until_ms: wake_ms,
                    ..layout
                },
            );
        }
    }

    /// The process is read again shortly (`loading`), unless it was
    /// read often enough.
    pub(super) fn wait_for_loader(&mut self, tgid: u32, reads: u32) -> ProcessState {
        match self.loading.wait(tgid, reads, Instant::now()) {
            true => ProcessState::Loading { reads: reads + 1 },
            false => ProcessState::NotPython,
        }
    }

    /// Whether the image's executable loads `libpython3.*`, where its
    /// interpreter is.
    pub(super) fn launches_libpython(
        &mut self,
        image: &ProcessImage,
        processes: &mut ProcessTable,
    ) -> bool {
        let Some(index) = image
            .mappings
            .iter()
            .position(|m| Some(m.spec.path.as_str()) == image.executable())
        else {
            return false;
        };
        let Some(object) = processes.object(image, index) else {
            return false;
        };
        let key = object.content_key();
        if let Some(&launches) = self.launchers.get(&key) {
            return launches;
        }
        let launches = object.data().is_ok_and(|data| loads_libpython(&data));
        remember(&mut self.launchers, key, launches);
        launches
    }

    /// Processes caught before their loader ran whose maps are due to be
    /// read again at `now` (each handed out once).
    pub fn loading_due(&mut self, now: Instant) -> Vec<u32> {
        self.loading.take_due(now)
    }

    /// When the next such read is due.
    pub fn next_loading(&self) -> Option<Instant> {
        self.loading.next()
    }
}

/// Whether `image` was read before the dynamic loader mapped the C
/// library: glibc's loader is there, glibc is not.
pub fn loader_pending(image: &ProcessImage) -> bool {
    let mut loader = false;
    for mapping in &image.mappings {
        if mapping.spec.kind != MappingKind::File {
            continue;
        }
        let name = super::file_name(&mapping.spec.path);
        if libc_kind(name).is_some() {
            return false;
        }
        loader |=
            name.starts_with("ld-linux") || (name.starts_with("ld-2.") && name.ends_with(".so"));
    }
    loader
}

/// `CLOCK_MONOTONIC`, the BPF program's `bpf_ktime_get_ns`, in
/// milliseconds `after` from now, as `InterpreterProcess::wake_until_ms` keeps
/// it (the low 32 bits; never 0, which means never).
pub fn wake_until_ms(after: Duration) -> u32 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
        return 0;
    }
    let ms = (now.tv_sec as u64)
        .wrapping_mul(1000)
        .wrapping_add(now.tv_nsec as u64 / 1_000_000)
        .wrapping_add(after.as_millis() as u64);
    (ms as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_again_with_growing_pauses_until_the_limit() {
        let mut loading = Loading::default();
        let start = Instant::now();
        assert!(loading.wait(7, 0, start));
        assert_eq!(loading.next(), Some(start + FIRST_PAUSE));
        assert!(loading.take_due(start).is_empty());
        assert_eq!(loading.take_due(start + FIRST_PAUSE), [7]);
        assert!(
            loading.take_due(start + FIRST_PAUSE).is_empty(),
            "handed out once"
        );
        assert!(loading.wait(7, 1, start));
        assert_eq!(loading.next(), Some(start + 2 * FIRST_PAUSE));
        assert!(!loading.wait(7, MAX_READS, start));
        loading.forget(7);
        assert_eq!(loading.next(), None);
    }

    #[test]
    fn wake_deadline_is_ahead_of_the_clock() {
        let now = wake_until_ms(Duration::ZERO);
        let later = wake_until_ms(WAKE_FOR);
        assert!(later.wrapping_sub(now) as i32 >= 999);
    }
}
