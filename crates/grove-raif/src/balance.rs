//! Load balancing of replicated reads (thesis §2.6): each branch keeps an
//! exponentially weighted moving average of its read latency, and a read
//! goes to one of the copies with probability inversely proportional to
//! that average. A slow branch thus gets fewer reads, but never none, so
//! its average keeps following it when it recovers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Weight of a new sample in the average: 1 / EWMA_WEIGHT_DIVISOR.
pub const EWMA_WEIGHT_DIVISOR: u64 = 8;
/// Latency assumed for a branch not measured yet: new branches get reads.
pub const LATENCY_UNKNOWN_NS: u64 = 1;
/// Floor of a latency sample, so that one weight can never be infinite.
pub const LATENCY_MIN_NS: u64 = 1_000;

/// Per-branch latency averages, shared by every reader of a mount.
#[derive(Debug)]
pub struct Balancer {
    latency_ns: Vec<AtomicU64>,
    reads: Vec<AtomicU64>,
    /// State of the xorshift generator that draws a copy.
    seed: AtomicU64,
}

impl Balancer {
    pub fn new(branches: usize) -> Balancer {
        Balancer {
            latency_ns: (0..branches).map(|_| AtomicU64::new(0)).collect(),
            reads: (0..branches).map(|_| AtomicU64::new(0)).collect(),
            seed: AtomicU64::new(0x9e37_79b9_7f4a_7c15),
        }
    }

    /// Folds one measured read latency into the branch's average.
    pub fn record(&self, branch: usize, elapsed: Duration) {
        let Some(slot) = self.latency_ns.get(branch) else {
            return;
        };
        let sample = (elapsed.as_nanos() as u64).max(LATENCY_MIN_NS);
        let old = slot.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / EWMA_WEIGHT_DIVISOR + sample / EWMA_WEIGHT_DIVISOR
        };
        slot.store(new, Ordering::Relaxed);
        self.reads[branch].fetch_add(1, Ordering::Relaxed);
    }

    /// The current average latency of a branch, in nanoseconds (0: unknown).
    pub fn latency_ns(&self, branch: usize) -> u64 {
        self.latency_ns
            .get(branch)
            .map_or(0, |l| l.load(Ordering::Relaxed))
    }

    /// Reads measured on a branch so far.
    pub fn reads(&self, branch: usize) -> u64 {
        self.reads
            .get(branch)
            .map_or(0, |r| r.load(Ordering::Relaxed))
    }

    fn next_random(&self) -> u64 {
        let mut x = self.seed.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.seed.store(x, Ordering::Relaxed);
        x
    }

    /// One of `copies`, drawn with weight 1 / latency. An unmeasured
    /// branch is taken at once, so that every branch gets measured.
    pub fn choose(&self, copies: &[usize]) -> usize {
        if let Some(&fresh) = copies.iter().find(|&&b| self.latency_ns(b) == 0) {
            return fresh;
        }
        let weights: Vec<f64> = copies
            .iter()
            .map(|&b| 1.0 / self.latency_ns(b).max(LATENCY_UNKNOWN_NS) as f64)
            .collect();
        let total: f64 = weights.iter().sum();
        let mut draw = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64 * total;
        for (&b, w) in copies.iter().zip(&weights) {
            if draw < *w {
                return b;
            }
            draw -= w;
        }
        copies[copies.len() - 1]
    }
}
