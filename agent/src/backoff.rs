//! The one retry backoff of the agent's own loops (kube's watcher brings
//! its own for its retries).

use std::time::Duration;

/// Doubling waits up to a cap, each drawn from its upper half so agents
/// that failed together do not retry together.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self { next: first, max }
    }

    pub fn wait(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = ceiling / 2;
        half + half.mul_f64(fastrand::f64())
    }

    pub fn reset(&mut self, first: Duration) {
        self.next = first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let waits: Vec<Duration> = (0..6).map(|_| backoff.wait()).collect();
        let ceilings = [100, 200, 400, 800, 800, 800];
        for (wait, ceiling) in waits.iter().zip(ceilings) {
            let ceiling = Duration::from_millis(ceiling);
            assert!(
                *wait >= ceiling / 2 && *wait <= ceiling,
                "{wait:?} not within [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        backoff.reset(Duration::from_millis(100));
        assert!(backoff.wait() <= Duration::from_millis(100));
    }
}
