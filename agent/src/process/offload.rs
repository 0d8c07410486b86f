//! Work that touches files a process controls runs on a helper thread, and
//! the caller waits for it only until a deadline: a path walk through a
//! filesystem whose server never answers (FUSE, a hung NFS mount) would
//! otherwise hold the thread that drains the ring buffer forever.
//!
//! A worker that misses its deadline is abandoned (it exits when its work
//! finally returns) and a new one takes over; while too many are stuck,
//! work is refused at once instead of piling up threads.

use std::{
    num::NonZeroUsize,
    os::unix::fs::MetadataExt,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use lru::LruCache;

use crate::stats::cpu::{self, CpuStage};

/// Longest the drain thread waits for one open (an object, its debug
/// files, a perf map). A normal open takes well under a millisecond; the
/// ring buffer holds about a second of samples.
pub const OPEN_DEADLINE: Duration = Duration::from_millis(250);
/// Abandoned workers that may still be running before work is refused.
const MAX_STUCK_WORKERS: usize = 4;

/// How long paths inside a mount namespace whose lookups missed their
/// deadline are left alone.
const SLOW_ROOT_PENALTY: Duration = Duration::from_secs(300);
/// Mount namespaces remembered as slow.
const SLOW_ROOTS: NonZeroUsize = NonZeroUsize::new(1024).expect("non-zero");

type Job = Box<dyn FnOnce() + Send>;

/// Mount namespaces in which a lookup missed its deadline (a FUSE server
/// that never answers, a dead NFS server): every other lookup there would
/// hang the same way and tie up another worker, so they are skipped for a
/// while. Shared by whoever looks up paths inside process roots.
#[derive(Clone)]
pub struct SlowRoots(Arc<Mutex<LruCache<u64, Instant>>>);

impl Default for SlowRoots {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(LruCache::new(SLOW_ROOTS))))
    }
}

impl SlowRoots {
    /// The mount namespace of the process at `process_dir` (`/proc/PID`).
    pub fn namespace(process_dir: &Path) -> Option<u64> {
        std::fs::metadata(process_dir.join("ns/mnt"))
            .ok()
            .map(|meta| meta.ino())
    }

    pub fn is_slow(&self, namespace: Option<u64>) -> bool {
        let Some(namespace) = namespace else {
            return false;
        };
        let mut slow = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match slow.get(&namespace) {
            Some(since) if since.elapsed() < SLOW_ROOT_PENALTY => true,
            Some(_) => {
                slow.pop(&namespace);
                false
            }
            None => false,
        }
    }

    pub fn mark(&self, namespace: Option<u64>) {
        if let Some(namespace) = namespace {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .put(namespace, Instant::now());
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    #[error("did not finish within {0:?}")]
    TimedOut(Duration),
    #[error("{MAX_STUCK_WORKERS} earlier jobs are still stuck")]
    TooManyStuck,
    #[error("the helper thread could not run it")]
    Unavailable,
}

struct Worker {
    jobs: mpsc::Sender<Job>,
    abandoned: Arc<AtomicBool>,
}

/// Runs closures on one helper thread at a time, each with a deadline.
pub struct Offload {
    name: &'static str,
    deadline: Duration,
    worker: Option<Worker>,
    stuck: Arc<AtomicUsize>,
}

impl Offload {
    pub fn new(name: &'static str, deadline: Duration) -> Self {
        Self {
            name,
            deadline,
            worker: None,
            stuck: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Workers abandoned at a deadline that have not returned yet.
    pub fn stuck(&self) -> usize {
        self.stuck.load(Ordering::Relaxed)
    }

    /// Runs `work` on the helper thread and returns its result, or an
    /// error once the deadline has passed (the work goes on, unobserved).
    pub fn run<T: Send + 'static>(
        &mut self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, OffloadError> {
        if self.stuck() >= MAX_STUCK_WORKERS {
            return Err(OffloadError::TooManyStuck);
        }
        let (reply, result) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = reply.send(work());
        });
        let job = match self.worker()?.jobs.send(job) {
            Ok(()) => None,
            // The worker died (its job panicked): one more try on a new one.
            Err(mpsc::SendError(job)) => Some(job),
        };
        if let Some(job) = job {
            self.worker = None;
            self.worker()?
                .jobs
                .send(job)
                .map_err(|_| OffloadError::Unavailable)?;
        }
        match result.recv_timeout(self.deadline) {
            Ok(value) => Ok(value),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(worker) = self.worker.take() {
                    worker.abandoned.store(true, Ordering::Relaxed);
                    self.stuck.fetch_add(1, Ordering::Relaxed);
                }
                Err(OffloadError::TimedOut(self.deadline))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.worker = None;
                Err(OffloadError::Unavailable)
            }
        }
    }

    fn worker(&mut self) -> Result<&Worker, OffloadError> {
        if self.worker.is_none() {
            let (jobs, queue) = mpsc::channel::<Job>();
            let abandoned = Arc::new(AtomicBool::new(false));
            let stuck = self.stuck.clone();
            let flag = abandoned.clone();
            thread::Builder::new()
                .name(self.name.into())
                .spawn(move || {
                    cpu::account_thread(CpuStage::Sample);
                    while let Ok(job) = queue.recv() {
                        job();
                        if flag.load(Ordering::Relaxed) {
                            stuck.fetch_sub(1, Ordering::Relaxed);
                            return;
                        }
                    }
                })
                .map_err(|_| OffloadError::Unavailable)?;
            self.worker = Some(Worker { jobs, abandoned });
        }
        self.worker.as_ref().ok_or(OffloadError::Unavailable)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn results_come_back() {
        let mut offload = Offload::new("firn-test", Duration::from_secs(5));
        for n in 0..10 {
            assert_eq!(offload.run(move || n * 2), Ok(n * 2));
        }
        assert_eq!(offload.stuck(), 0);
    }

    #[test]
    fn a_stuck_job_is_abandoned_and_the_next_runs_on_a_new_worker() {
        let mut offload = Offload::new("firn-test", Duration::from_millis(50));
        let (release, wait) = mpsc::channel::<()>();
        let started = Instant::now();
        assert_eq!(
            offload.run(move || wait.recv().is_ok()),
            Err(OffloadError::TimedOut(Duration::from_millis(50)))
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(offload.stuck(), 1);
        assert_eq!(offload.run(|| 7), Ok(7));
        // Once the stuck job returns, its worker exits and is uncounted.
        release.send(()).expect("the stuck job still waits");
        let deadline = Instant::now() + Duration::from_secs(10);
        while offload.stuck() > 0 {
            assert!(
                Instant::now() < deadline,
                "the abandoned worker never exited"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn too_many_stuck_jobs_refuse_at_once() {
        let mut offload = Offload::new("firn-test", Duration::from_millis(20));
        let mut releases = Vec::new();
        for _ in 0..MAX_STUCK_WORKERS {
            let (release, wait) = mpsc::channel::<()>();
            releases.push(release);
            assert!(matches!(
                offload.run(move || wait.recv().is_ok()),
                Err(OffloadError::TimedOut(_))
            ));
        }
        assert_eq!(offload.run(|| ()), Err(OffloadError::TooManyStuck));
        drop(releases);
    }

    #[test]
    fn a_panicking_job_does_not_take_the_offload_down() {
        let mut offload = Offload::new("firn-test", Duration::from_secs(5));
        assert_eq!(
            offload.run(|| -> u8 { panic!("a parser bug") }),
            Err(OffloadError::Unavailable)
        );
        assert_eq!(offload.run(|| 3), Ok(3));
    }
}
