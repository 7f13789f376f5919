//! Foreground load: how many client requests (reads, writes, unmaps and
//! flushes through a [`Volume`](super::Volume)) have begun and how many are
//! running, so that background work (the reclaimer) can tell when clients
//! are busy and give way to them (issue 25 point 5, Thresher's λ).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Pool;

#[derive(Debug, Default)]
pub(super) struct ForegroundCounters {
    started: AtomicU64,
    in_flight: AtomicU64,
}

/// One look at the pool's foreground load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForegroundLoad {
    /// Requests begun since the pool was opened.
    pub started: u64,
    /// Requests running now.
    pub in_flight: u64,
}

impl ForegroundLoad {
    /// Whether clients were busy since `earlier` was taken: a request
    /// began since then, or one is running now.
    pub fn busy_since(&self, earlier: &ForegroundLoad) -> bool {
        self.started != earlier.started || self.in_flight > 0
    }
}

/// A request counted as running until dropped.
#[must_use = "the request counts as running only while this lives"]
pub struct ForegroundRequest<'a>(&'a ForegroundCounters);

impl Drop for ForegroundRequest<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ForegroundCounters {
    pub(super) fn begin(&self) -> ForegroundRequest<'_> {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        ForegroundRequest(self)
    }

    /// Requests running now.
    pub(super) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn load(&self) -> ForegroundLoad {
        ForegroundLoad {
            started: self.started.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }
}

impl Pool {
    /// The clients' load on this pool now (see `foreground.rs`).
    pub fn foreground_load(&self) -> ForegroundLoad {
        self.inner.foreground.load()
    }

    /// Counts a request as running until the guard is dropped: for I/O
    /// that reaches the pool other than through a `Volume`, and for tests
    /// that need a request in flight.
    pub fn begin_foreground_request(&self) -> ForegroundRequest<'_> {
        self.inner.foreground.begin()
    }
}
