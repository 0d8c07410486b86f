//! Letting a file mapping's pages go while a long read runs over it.
//!
//! A read touching an object here and there (an index of its DWARF reads
//! every compilation unit's header) faults in far more than it reads: the
//! kernel maps the cached pages around each fault (64 KiB), so one pass
//! over a debug build's 10 MB `.debug_info` leaves most of it resident
//! until the pass ends. Code that makes such a pass in one call (addr2line
//! builds its index so) cannot let the pages go between its reads, so a
//! second thread does it on a short period while the call runs. The pages
//! stay in the page cache: what is still needed faults back in.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::Duration,
};

use crate::Bytes;

/// How often the pages are let go during the work.
const RELEASE_PERIOD: Duration = Duration::from_millis(2);

impl Bytes {
    /// Runs `work`, letting the kernel drop the pages of these bytes every
    /// few milliseconds until it returns, and once after. Bytes in memory
    /// have nothing to drop; if no thread can be started, `work` runs
    /// without one.
    pub fn releasing_pages_during<T>(&self, work: impl FnOnce() -> T) -> T {
        let done = AtomicBool::new(false);
        let result = thread::scope(|scope| {
            let releaser = thread::Builder::new()
                .name("firn-release".into())
                .spawn_scoped(scope, || {
                    while !done.load(Ordering::Acquire) {
                        thread::park_timeout(RELEASE_PERIOD);
                        self.release_pages();
                    }
                });
            // Set even if `work` panics: the scope waits for the releaser.
            let _stop = StopOnDrop {
                done: &done,
                releaser: releaser.as_ref().ok().map(|handle| handle.thread()),
            };
            work()
        });
        self.release_pages();
        result
    }
}

struct StopOnDrop<'a> {
    done: &'a AtomicBool,
    releaser: Option<&'a thread::Thread>,
}

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(releaser) = self.releaser {
            releaser.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        panic::{AssertUnwindSafe, catch_unwind},
        sync::{Arc, atomic::AtomicUsize},
        time::Instant,
    };

    use super::*;
    use crate::SharedBytes;

    #[derive(Default)]
    struct Counted {
        releases: AtomicUsize,
    }

    impl AsRef<[u8]> for Counted {
        fn as_ref(&self) -> &[u8] {
            b"bytes"
        }
    }

    impl SharedBytes for Counted {
        fn release_pages(&self) {
            self.releases.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn pages_are_let_go_while_the_work_runs_and_after() {
        let counted = Arc::new(Counted::default());
        let bytes = Bytes::new(counted.clone());
        let during = bytes.releasing_pages_during(|| {
            // The work waits until the releaser has been round twice.
            let deadline = Instant::now() + Duration::from_secs(10);
            while counted.releases.load(Ordering::Relaxed) < 2 && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            counted.releases.load(Ordering::Relaxed)
        });
        assert!(during >= 2, "released {during} times during the work");
        assert!(
            counted.releases.load(Ordering::Relaxed) > during,
            "and once after"
        );
    }

    #[test]
    fn a_panic_in_the_work_stops_the_releaser() {
        let bytes = Bytes::new(Arc::new(Counted::default()));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            bytes.releasing_pages_during(|| panic!("malformed input"))
        }));
        assert!(
            outcome.is_err(),
            "the panic reaches the caller, nothing hangs"
        );
    }
}
