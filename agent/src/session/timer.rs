//! The drain loop's periodic tick, from a timerfd: the kernel wakes the
//! loop once a period. A tokio interval longer than its timer wheel's
//! first level (64 ms) wakes it two or three times a period (the wheel
//! cascading, then the interval re-arming itself), and every wakeup costs,
//! more so on a virtual machine whose timer interrupts exit to the host:
//! on an idle host those wakeups were most of firn's CPU.

use std::{io, os::fd::OwnedFd, time::Duration};

use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
    timerfd_settime,
};
use tokio::io::{Interest, unix::AsyncFd};

pub struct DrainTimer {
    fd: AsyncFd<OwnedFd>,
    period: Duration,
}

impl DrainTimer {
    /// A timer that fires every `period` from now on.
    pub fn new(period: Duration) -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        arm(&fd, period)?;
        // SAFETY: the timer owns its descriptor, which stays open and
        // unchanged until this AsyncFd drops.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|error| error.into_parts().1)?;
        Ok(Self { fd, period })
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// Fires every `period` from now on instead.
    pub fn set_period(&mut self, period: Duration) -> io::Result<()> {
        arm(self.fd.get_ref(), period)?;
        self.period = period;
        Ok(())
    }

    /// Waits for the next expiry (any missed ones count as one).
    pub async fn tick(&self) -> io::Result<()> {
        loop {
            let mut ready = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            match rustix::io::read(ready.get_inner(), &mut expirations) {
                Ok(_) => {
                    // Read empty: the next tick waits for the kernel.
                    ready.clear_ready();
                    return Ok(());
                }
                Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                Err(error) => return Err(error.into()),
            }
        }
    }
}

fn arm(fd: &OwnedFd, period: Duration) -> io::Result<()> {
    let every = Timespec {
        tv_sec: i64::try_from(period.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(period.subsec_nanos()),
    };
    timerfd_settime(
        fd,
        TimerfdTimerFlags::empty(),
        &Itimerspec {
            it_interval: every,
            it_value: every,
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn ticks_once_a_period() {
        let period = Duration::from_millis(20);
        let timer = DrainTimer::new(period).expect("timerfd");
        let started = Instant::now();
        for _ in 0..3 {
            timer.tick().await.expect("tick");
        }
        let elapsed = started.elapsed();
        assert!(elapsed >= period * 3, "{elapsed:?}");
        // Periods missed while the loop was busy make one tick, not a
        // burst: the next waits for the period's end.
        std::thread::sleep(period * 3);
        timer.tick().await.expect("tick");
        let before = Instant::now();
        timer.tick().await.expect("tick");
        timer.tick().await.expect("tick");
        assert!(before.elapsed() > period, "{:?}", before.elapsed());
    }

    #[tokio::test]
    async fn a_new_period_counts_from_when_it_is_set() {
        let mut timer = DrainTimer::new(Duration::from_secs(3600)).expect("timerfd");
        let period = Duration::from_millis(20);
        timer.set_period(period).expect("rearmed");
        assert_eq!(timer.period(), period);
        let started = Instant::now();
        let two_ticks = async {
            timer.tick().await.expect("tick");
            timer.tick().await.expect("tick");
        };
        tokio::time::timeout(Duration::from_secs(10), two_ticks)
            .await
            .expect("the timer ticks at its new period, not the hour it had");
        assert!(started.elapsed() >= period * 2, "{:?}", started.elapsed());
    }
}
