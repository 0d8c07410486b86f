//! A bound on the bytes of debug files held in memory at once, across
//! every upload: a count of uploads alone would let four uploads of
//! arbitrarily large reads add up.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone)]
pub struct ByteBudget {
    permits: Arc<Semaphore>,
    total: u32,
}

/// Bytes taken from the budget until dropped.
pub struct Reservation {
    /// `None` only if the semaphore were closed, which it never is.
    _permit: Option<OwnedSemaphorePermit>,
}

impl ByteBudget {
    pub fn new(bytes: usize) -> Self {
        let total = u32::try_from(bytes).unwrap_or(u32::MAX).max(1);
        Self {
            permits: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// Waits until `bytes` fit. A request larger than the whole budget
    /// waits for all of it, so it still runs, alone.
    pub async fn reserve(&self, bytes: usize) -> Reservation {
        let wanted = u32::try_from(bytes).unwrap_or(u32::MAX).min(self.total);
        let permit = self.permits.clone().acquire_many_owned(wanted).await;
        Reservation {
            _permit: permit.ok(),
        }
    }

    #[cfg(test)]
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

/// `buf` as `Bytes` that give their reservation back when the last
/// reference goes, i.e. once the gRPC encoder has copied them out.
pub fn reserved_bytes(buf: Vec<u8>, reservation: Reservation) -> Bytes {
    struct Owned {
        buf: Vec<u8>,
        _reservation: Reservation,
    }
    impl AsRef<[u8]> for Owned {
        fn as_ref(&self) -> &[u8] {
            &self.buf
        }
    }
    Bytes::from_owner(Owned {
        buf,
        _reservation: reservation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_hold_their_reservation_until_dropped() {
        let budget = ByteBudget::new(100);
        let first = reserved_bytes(vec![1; 60], budget.reserve(60).await);
        assert_eq!(budget.available(), 40);
        let copy = first.clone();
        drop(first);
        assert_eq!(budget.available(), 40, "a clone still holds it");
        // Does not fit until the bytes are gone.
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.reserve(50).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(copy);
        let reservation = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("granted once the bytes are dropped")
            .expect("task");
        assert_eq!(budget.available(), 50);
        drop(reservation);
        assert_eq!(budget.available(), 100);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_budget_takes_all_of_it() {
        let budget = ByteBudget::new(10);
        let all = budget.reserve(1000).await;
        assert_eq!(budget.available(), 0);
        drop(all);
        assert_eq!(budget.available(), 10);
    }
}
