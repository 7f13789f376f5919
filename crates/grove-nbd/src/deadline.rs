//! Deadlines, not inactivity timers. A socket timeout restarts with every
//! byte, so a client that trickles one byte at a time is never cut off;
//! and TLS reads and writes several socket pieces per call. Instead each
//! connection arms a deadline for what it waits on (the whole handshake,
//! TLS included; a request's payload; a reply being taken), and the
//! server's watchdog thread shuts the socket of any connection past its
//! deadline, which ends the blocked read or write whatever it was.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the watchdog looks at the deadlines: how late past its
/// deadline a connection may be cut off.
pub(crate) const WATCHDOG_TICK_MS: u64 = 100;

/// What a deadline bounds: the connection's reader, or the writer of its
/// replies (one reply at a time). Both may be armed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    Read = 0,
    Write = 1,
}

/// The time a transfer of `bytes` may take: the base allowance (which
/// covers latency and small transfers) plus the bytes at the minimum rate.
/// None when `base` is None: deadlines are off.
pub(crate) fn transfer_allowance(
    base: Option<Duration>,
    bytes: u64,
    min_rate_bytes_per_s: u64,
) -> Option<Duration> {
    let base = base?;
    let rate_ms = bytes.saturating_mul(1000) / min_rate_bytes_per_s.max(1);
    Some(base.saturating_add(Duration::from_millis(rate_ms)))
}

/// One connection's deadlines, shared by its threads and the watchdog.
/// Times are milliseconds since the server's epoch, plus one: 0 is unarmed.
pub(crate) struct Deadlines {
    epoch: Instant,
    slots: [AtomicU64; 2],
    expired: AtomicBool,
}

impl Deadlines {
    pub fn new(epoch: Instant) -> Deadlines {
        Deadlines {
            epoch,
            slots: [AtomicU64::new(0), AtomicU64::new(0)],
            expired: AtomicBool::new(false),
        }
    }

    /// Arms `slot` to expire `allowance` from now; None leaves it unarmed
    /// (deadlines are off).
    pub fn arm(&self, slot: Slot, allowance: Option<Duration>) {
        let Some(allowance) = allowance else {
            return self.disarm(slot);
        };
        let at_ms = self.since_epoch_ms(Instant::now() + allowance) + 1;
        self.slots[slot as usize].store(at_ms, Ordering::SeqCst);
        debug_assert!(self.slots[slot as usize].load(Ordering::SeqCst) > 0);
    }

    pub fn disarm(&self, slot: Slot) {
        self.slots[slot as usize].store(0, Ordering::SeqCst);
    }

    /// Which deadline has passed at `now`, the first time one has; the
    /// connection is then marked expired (see [`Deadlines::expired`]).
    pub fn check(&self, now: Instant) -> Option<Slot> {
        let now_ms = self.since_epoch_ms(now) + 1;
        let passed = [Slot::Read, Slot::Write].into_iter().find(|slot| {
            let at_ms = self.slots[*slot as usize].load(Ordering::SeqCst);
            at_ms != 0 && at_ms <= now_ms
        })?;
        // Reported once: the socket is shut then, and the connection leaves.
        (!self.expired.swap(true, Ordering::SeqCst)).then_some(passed)
    }

    /// Whether the watchdog cut this connection off: its reads and writes
    /// then fail, and this tells why.
    pub fn expired(&self) -> bool {
        self.expired.load(Ordering::SeqCst)
    }

    fn since_epoch_ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_passes_once_its_allowance_is_spent_whatever_happens_meanwhile() {
        let epoch = Instant::now();
        let deadlines = Deadlines::new(epoch);
        assert_eq!(deadlines.check(epoch + Duration::from_secs(3600)), None);
        deadlines.arm(Slot::Write, Some(Duration::from_millis(500)));
        let now = Instant::now();
        assert_eq!(deadlines.check(now), None);
        assert!(!deadlines.expired());
        assert_eq!(
            deadlines.check(now + Duration::from_millis(600)),
            Some(Slot::Write)
        );
        assert!(deadlines.expired());
        assert_eq!(
            deadlines.check(now + Duration::from_millis(700)),
            None,
            "reported once"
        );
        let fresh = Deadlines::new(epoch);
        fresh.arm(Slot::Read, Some(Duration::from_millis(1)));
        fresh.arm(Slot::Read, None);
        assert_eq!(fresh.check(now + Duration::from_secs(3600)), None);
    }

    #[test]
    fn the_allowance_grows_with_the_bytes_at_the_minimum_rate() {
        let base = Some(Duration::from_secs(2));
        assert_eq!(
            transfer_allowance(base, 0, 1 << 20),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            transfer_allowance(base, 32 << 20, 1 << 20),
            Some(Duration::from_secs(34))
        );
        assert_eq!(transfer_allowance(None, 32 << 20, 1 << 20), None);
        // A rate of zero is taken as one byte a second, not a division by zero.
        assert!(transfer_allowance(base, 10, 0).is_some());
    }
}
