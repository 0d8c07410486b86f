//! CPU time of firn's own threads, by stage: what `/metrics` shows as
//! `firn_cpu_seconds_total{stage}`, so an operator (and the benchmark) can
//! see where firn's CPU goes without a profiler of its own.
//!
//! Long-lived threads say once which stage they serve
//! ([`account_thread`]); their clocks are read when someone asks, so the
//! hot paths pay nothing. The builder thread serves four stages in turn
//! and times each step instead ([`measure`]). Whatever no stage claims
//! (start-up on threads that ended, the allocator's trim) is `other`: the
//! process's own CPU time minus the rest, so the series sum to it.

use std::{
    cell::RefCell,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

/// The stages firn's CPU time is split into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuStage {
    /// Reading the ring buffer, the process images, unwinding and
    /// aggregating (the main thread and its helpers).
    Sample,
    /// Naming frames, once per interval.
    Symbolize,
    /// Labels and relabeling, once per interval.
    Label,
    /// Building and compressing the pprof profiles.
    Encode,
    /// Handing profiles to the exporter (writing files for the local store).
    Export,
    /// Sending profiles to the server.
    Push,
    /// Reading and sending debug information to the server.
    Upload,
    /// Serving `/metrics` and the health endpoints.
    Http,
}

impl CpuStage {
    pub const ALL: [CpuStage; 8] = [
        Self::Sample,
        Self::Symbolize,
        Self::Label,
        Self::Encode,
        Self::Export,
        Self::Push,
        Self::Upload,
        Self::Http,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Sample => "sample",
            Self::Symbolize => "symbolize",
            Self::Label => "label",
            Self::Encode => "encode",
            Self::Export => "export",
            Self::Push => "push",
            Self::Upload => "upload",
            Self::Http => "http",
        }
    }
}

struct LiveThread {
    id: u64,
    stage: CpuStage,
    clock: libc::clockid_t,
}

struct Accounts {
    /// CPU time of threads that ended and of measured steps, in ns.
    finished: [AtomicU64; CpuStage::ALL.len()],
    live: Mutex<Vec<LiveThread>>,
    next_id: AtomicU64,
}

static ACCOUNTS: Accounts = Accounts {
    finished: [const { AtomicU64::new(0) }; CpuStage::ALL.len()],
    live: Mutex::new(Vec::new()),
    next_id: AtomicU64::new(0),
};

/// The calling thread's entry; on thread exit its final CPU time moves to
/// `finished`.
struct Registration {
    id: u64,
    stage: CpuStage,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Under the lock, so a reader never sees the thread both live and
        // finished, nor reads a clock of a thread that has gone.
        let mut live = lock_live();
        add(self.stage, clock_ns(libc::CLOCK_THREAD_CPUTIME_ID));
        live.retain(|thread| thread.id != self.id);
    }
}

thread_local! {
    static REGISTRATION: RefCell<Option<Registration>> = const { RefCell::new(None) };
}

/// Counts the calling thread's CPU time, from its start to its end,
/// towards `stage`. A second call moves it (and what it has used so far
/// stays with the first stage).
pub fn account_thread(stage: CpuStage) {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `pthread_self` is always valid for the calling thread and
    // `clock` is a valid place for the answer.
    if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } != 0 {
        return;
    }
    let id = ACCOUNTS.next_id.fetch_add(1, Ordering::Relaxed);
    // The old registration (if any) is dropped outside the lock below.
    let previous = REGISTRATION.with(|slot| slot.borrow_mut().take());
    drop(previous);
    lock_live().push(LiveThread { id, stage, clock });
    REGISTRATION.with(|slot| *slot.borrow_mut() = Some(Registration { id, stage }));
}

/// Runs `step` on this thread and counts the CPU time it took towards
/// `stage`. For threads that serve several stages; not for a thread
/// registered with [`account_thread`], which would count it twice.
pub fn measure<T>(stage: CpuStage, step: impl FnOnce() -> T) -> T {
    let before = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let result = step();
    add(
        stage,
        clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(before),
    );
    result
}

/// CPU time so far by stage, then what is left of the process's own
/// (`other`).
pub fn totals() -> (Vec<(CpuStage, Duration)>, Duration) {
    let mut ns: Vec<u64> = ACCOUNTS
        .finished
        .iter()
        .map(|value| value.load(Ordering::Relaxed))
        .collect();
    {
        let live = lock_live();
        for thread in live.iter() {
            ns[index(thread.stage)] += clock_ns(thread.clock);
        }
    }
    let process = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let other = process.saturating_sub(ns.iter().sum());
    let stages = CpuStage::ALL
        .iter()
        .zip(ns)
        .map(|(&stage, ns)| (stage, Duration::from_nanos(ns)))
        .collect();
    (stages, Duration::from_nanos(other))
}

fn index(stage: CpuStage) -> usize {
    CpuStage::ALL
        .iter()
        .position(|&s| s == stage)
        .unwrap_or_default()
}

fn add(stage: CpuStage, ns: u64) {
    ACCOUNTS.finished[index(stage)].fetch_add(ns, Ordering::Relaxed);
}

fn lock_live() -> std::sync::MutexGuard<'static, Vec<LiveThread>> {
    // The list stays consistent whatever a panicking holder did.
    ACCOUNTS.live.lock().unwrap_or_else(|e| e.into_inner())
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid place for the answer; a clock id of a live
    // thread of this process (the callers hold the registry's lock or ask
    // for their own) or a process-wide clock.
    if unsafe { libc::clock_gettime(clock, &mut time) } != 0 {
        return 0;
    }
    u64::try_from(time.tv_sec).unwrap_or(0) * 1_000_000_000
        + u64::try_from(time.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns `duration` of this thread's CPU time, however loaded the
    /// machine is.
    fn spin(duration: Duration) {
        let start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        let mut x = 0u64;
        while clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - start < duration.as_nanos() as u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }

    fn stage_total(stage: CpuStage) -> Duration {
        totals()
            .0
            .into_iter()
            .find(|(s, _)| *s == stage)
            .map(|(_, d)| d)
            .unwrap_or_default()
    }

    #[test]
    fn a_registered_thread_is_counted_while_it_runs_and_after_it_ends() {
        let before = stage_total(CpuStage::Http);
        let (ready, wait) = std::sync::mpsc::channel();
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            account_thread(CpuStage::Http);
            spin(Duration::from_millis(50));
            ready.send(()).expect("the test waits");
            finished.recv().expect("the test says when");
        });
        wait.recv().expect("the thread spun");
        let live = stage_total(CpuStage::Http) - before;
        assert!(live >= Duration::from_millis(50), "{live:?}");
        finish.send(()).expect("the thread waits");
        thread.join().expect("the thread ends");
        let ended = stage_total(CpuStage::Http) - before;
        assert!(ended >= live, "{ended:?} < {live:?}");
    }

    #[test]
    fn measured_steps_are_added_to_their_stage() {
        let before = stage_total(CpuStage::Label);
        measure(CpuStage::Label, || spin(Duration::from_millis(20)));
        let added = stage_total(CpuStage::Label) - before;
        assert!(added >= Duration::from_millis(20), "{added:?}");
    }
}
