//! Nothing stalls unseen: each stage that handles work (draining the ring
//! buffer, building profiles) marks when it started and each step it makes;
//! a thread of its own notices a stage that makes no progress, turns
//! `/ready` (and, for longer, `/healthy`) to 503, and says which stage on
//! `/metrics` and in the log. It also enforces the shutdown deadline: once
//! a signal asks firn to stop, the process ends by the deadline even if a
//! stage never returns (the kernel detaches the BPF programs at exit).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use tracing::{error, info, warn};

use crate::{http::Health, stats::Stats, untrusted};

/// How often the stages are looked at: their thresholds are seconds, and
/// each wakeup costs a context switch (on a VM, tens of microseconds). A
/// shutdown deadline is slept to exactly once a signal asked for it.
const CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Exit status when the shutdown deadline forces the exit.
const FORCED_EXIT_STATUS: i32 = 1;

/// One stage of the pipeline, as the watchdog sees it.
#[derive(Debug)]
pub struct Stage {
    name: &'static str,
    origin: Instant,
    /// Milliseconds since `origin` of the last step, plus one; 0 while idle.
    busy_since: AtomicU64,
    /// No step for this long: not ready.
    stall_after: Duration,
    /// No step for this long: not healthy either (a restart is due).
    fail_after: Duration,
    stalled_gauge: fn(&Stats) -> &AtomicU64,
}

impl Stage {
    pub fn new(
        name: &'static str,
        stall_after: Duration,
        fail_after: Duration,
        stalled_gauge: fn(&Stats) -> &AtomicU64,
    ) -> Arc<Self> {
        Arc::new(Self {
            name,
            origin: Instant::now(),
            busy_since: AtomicU64::new(0),
            stall_after,
            fail_after,
            stalled_gauge,
        })
    }

    /// The stage took up work, or made a step in it.
    pub fn step(&self) {
        let since = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.busy_since.store(since + 1, Ordering::Relaxed);
    }

    /// The stage is idle (waiting for work is no stall).
    pub fn idle(&self) {
        self.busy_since.store(0, Ordering::Relaxed);
    }

    /// How long the stage has been on one step, if it is busy.
    fn stuck_for(&self) -> Option<Duration> {
        let since = self.busy_since.load(Ordering::Relaxed).checked_sub(1)?;
        Some(
            self.origin
                .elapsed()
                .saturating_sub(Duration::from_millis(since)),
        )
    }
}

/// The stages' health, as last judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Verdict {
    #[default]
    Fine,
    Stalled,
    Failing,
}

/// Set from a signal handler: when shutdown was first asked for, in
/// CLOCK_MONOTONIC nanoseconds (0: not yet).
static SHUTDOWN_ASKED_NS: AtomicU64 = AtomicU64::new(0);

/// CLOCK_MONOTONIC in nanoseconds, the clock of the samples' times
/// (`bpf_ktime_get_ns`); async-signal-safe.
pub(crate) fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we own; it is
    // async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

fn on_shutdown_signal() {
    let _ = SHUTDOWN_ASKED_NS.compare_exchange(
        0,
        monotonic_ns().max(1),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
}

/// Watches `stages`; when `health` is given, reports on it. When a
/// shutdown signal (SIGINT, SIGTERM, SIGHUP) comes, the process exits at
/// the latest `shutdown_deadline` after it (plus one check interval).
pub fn spawn(
    stages: Vec<Arc<Stage>>,
    health: Option<Arc<Health>>,
    stats: Arc<Stats>,
    shutdown_deadline: Duration,
) -> std::io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the action reads the clock and stores to an atomic, both
        // async-signal-safe; the registry chains it with tokio's handler.
        unsafe { signal_hook_registry::register(signal, on_shutdown_signal) }?;
    }
    thread::Builder::new()
        .name("firn-watchdog".into())
        .spawn(move || watch(&stages, health.as_deref(), &stats, shutdown_deadline))?;
    Ok(())
}

/// How long to sleep before the next look: [`CHECK_INTERVAL`], or less
/// when a shutdown asked at `asked_at` (0: none) reaches its deadline
/// sooner.
fn next_check(asked_at: u64, now: u64, shutdown_ns: u64) -> Duration {
    if asked_at == 0 {
        return CHECK_INTERVAL;
    }
    let left = asked_at.saturating_add(shutdown_ns).saturating_sub(now);
    CHECK_INTERVAL.min(Duration::from_nanos(left))
}

fn watch(stages: &[Arc<Stage>], health: Option<&Health>, stats: &Stats, shutdown: Duration) {
    let mut verdicts = vec![Verdict::Fine; stages.len()];
    let shutdown_ns = u64::try_from(shutdown.as_nanos()).unwrap_or(u64::MAX);
    loop {
        thread::sleep(next_check(
            SHUTDOWN_ASKED_NS.load(Ordering::SeqCst),
            monotonic_ns(),
            shutdown_ns,
        ));
        // Counted by a signal handler, which cannot reach the stats.
        Stats::set(&stats.mapped_pages_truncated, untrusted::truncated_pages());
        Stats::set(
            &stats.mapped_files_unguarded,
            untrusted::unguarded_mappings(),
        );
        let asked_at = SHUTDOWN_ASKED_NS.load(Ordering::SeqCst);
        if asked_at != 0 && monotonic_ns().saturating_sub(asked_at) >= shutdown_ns {
            let stuck: Vec<&str> = stages
                .iter()
                .filter(|stage| stage.stuck_for().is_some())
                .map(|stage| stage.name)
                .collect();
            error!(
                deadline = ?shutdown,
                busy_stages = ?stuck,
                "shutdown did not finish by its deadline: exiting now"
            );
            // SAFETY: _exit ends the process without running exit
            // handlers, which could wait on locks a stuck thread holds.
            unsafe { libc::_exit(FORCED_EXIT_STATUS) };
        }
        for (stage, verdict) in stages.iter().zip(verdicts.iter_mut()) {
            let stuck_for = stage.stuck_for().unwrap_or_default();
            let now = if stuck_for >= stage.fail_after {
                Verdict::Failing
            } else if stuck_for >= stage.stall_after {
                Verdict::Stalled
            } else {
                Verdict::Fine
            };
            if now != *verdict {
                match now {
                    Verdict::Fine => info!(stage = stage.name, "stage makes progress again"),
                    Verdict::Stalled => warn!(
                        stage = stage.name,
                        stuck_for = ?stuck_for,
                        "stage makes no progress: not ready"
                    ),
                    Verdict::Failing => error!(
                        stage = stage.name,
                        stuck_for = ?stuck_for,
                        "stage makes no progress: not healthy"
                    ),
                }
                Stats::set(
                    (stage.stalled_gauge)(stats),
                    u64::from(now != Verdict::Fine),
                );
                *verdict = now;
            }
        }
        if let Some(health) = health {
            let stalled: Vec<&'static str> = stages
                .iter()
                .zip(&verdicts)
                .filter(|(_, verdict)| **verdict != Verdict::Fine)
                .map(|(stage, _)| stage.name)
                .collect();
            let failing = verdicts.contains(&Verdict::Failing);
            health.set_stalled(stalled, failing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shutdown_deadline_is_slept_to_exactly() {
        let second = 1_000_000_000;
        assert_eq!(next_check(0, 5 * second, second), CHECK_INTERVAL);
        // Asked at 5 s with a 10 s deadline: at 14.9 s, 0.1 s is left.
        assert_eq!(
            next_check(5 * second, 14 * second + 900_000_000, 10 * second),
            Duration::from_millis(100)
        );
        assert_eq!(
            next_check(5 * second, 6 * second, 10 * second),
            CHECK_INTERVAL
        );
        assert_eq!(
            next_check(5 * second, 20 * second, 10 * second),
            Duration::ZERO
        );
    }

    #[test]
    fn a_stage_is_stuck_only_while_busy() {
        let stage = Stage::new(
            "drain",
            Duration::from_secs(1),
            Duration::from_secs(2),
            |s| &s.stage_stalled_drain,
        );
        assert_eq!(stage.stuck_for(), None);
        stage.step();
        thread::sleep(Duration::from_millis(30));
        assert!(stage.stuck_for().expect("busy") >= Duration::from_millis(30));
        stage.step();
        assert!(stage.stuck_for().expect("busy") < Duration::from_millis(30));
        stage.idle();
        assert_eq!(stage.stuck_for(), None);
    }

    #[test]
    fn a_stalled_stage_turns_ready_off_then_healthy_off_and_recovers() {
        let stats = Arc::new(Stats::default());
        let health = Arc::new(Health::default());
        health.set_ready(true);
        let stage = Stage::new(
            "build",
            Duration::from_millis(300),
            Duration::from_millis(900),
            |s| &s.stage_stalled_build,
        );
        {
            let (stages, health, stats) = (vec![stage.clone()], health.clone(), stats.clone());
            // The watch loop never returns; the thread ends with the test.
            thread::spawn(move || watch(&stages, Some(&health), &stats, Duration::MAX));
        }
        let wait_for = |what: &str, check: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !check() {
                assert!(Instant::now() < deadline, "{what}");
                thread::sleep(Duration::from_millis(10));
            }
        };
        stage.step();
        wait_for("not ready", &|| !health.is_ready());
        assert!(health.is_healthy());
        assert_eq!(health.stalled_stages(), ["build"]);
        assert_eq!(stats.snapshot().stage_stalled_build, 1);
        wait_for("not healthy", &|| !health.is_healthy());
        stage.idle();
        wait_for("ready again", &|| health.is_ready() && health.is_healthy());
        assert_eq!(stats.snapshot().stage_stalled_build, 0);
    }
}
