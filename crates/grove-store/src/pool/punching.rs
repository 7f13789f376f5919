//! When freed blocks go back to the host (`punch.rs` punches them): at
//! once, whenever the pool lets its state lock go after a commit (the
//! default), or, once a daemon that paces background work asks for it
//! (`Pool::defer_punching`), only when that daemon says (`punch_some`).
//!
//! Why a daemon defers: a punch holds the store file's inode lock, which
//! every client write to the file takes too. Under random writes on ext4
//! on the 2-core test machine a punch of one scattered extent took 5 to
//! 60 ms, and every client's write waited for it: pruning 3,000 snapshots
//! beside a writing client cost it 8 % of its writes, and none without
//! the punches. A punch gives space to the host, never to the pool (the
//! blocks are reusable already), so it can wait for the clients to pause.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::state_lock::lock_state;
use super::{Inner, Pool};
use crate::punch::PUNCH_RUN_BLOCKS_MAX;

/// Punches the backlog after a commit or a reclaim batch, unless a daemon
/// deferred punching to its own pace.
pub(super) fn punch_freed(inner: &Inner) {
    if !inner.punch_deferred.load(Ordering::Relaxed) {
        punch_backlog(inner, usize::MAX);
    }
}

/// Punches up to `max_blocks` of the backlog (taken and given back under
/// the state lock, punched without it, a run at a time). Returns the
/// blocks taken off the backlog.
pub(super) fn punch_backlog(inner: &Inner, max_blocks: usize) -> usize {
    let mut taken = 0;
    while taken < max_blocks {
        let run_blocks = (max_blocks - taken).min(PUNCH_RUN_BLOCKS_MAX);
        let Some((run, off_backlog)) = lock_state(inner).take_punch_run(run_blocks) else {
            break;
        };
        taken += off_backlog;
        let outcome = run.execute();
        lock_state(inner).finish_punch_run(run, outcome);
    }
    taken
}

/// Longest `Pool::close` punches the backlog: a daemon's shutdown must
/// end within its grace, and on RADOS a punch costs a round trip or two
/// an extent. What is left keeps its space on the host until its blocks
/// are written and freed again, or `check --repair` punches it.
const CLOSE_PUNCH_MAX: Duration = Duration::from_secs(2);

/// Blocks `punch_backlog_within` takes at a time, so that it looks at the
/// clock often.
const CLOSE_PUNCH_STEP_BLOCKS: usize = 1024;

/// Punches the backlog for at most `CLOSE_PUNCH_MAX`, then gives up on the
/// rest, saying so.
pub(super) fn punch_backlog_within(inner: &Inner) {
    let started = Instant::now();
    while started.elapsed() < CLOSE_PUNCH_MAX {
        if punch_backlog(inner, CLOSE_PUNCH_STEP_BLOCKS) == 0 {
            return;
        }
    }
    let mut state = lock_state(inner);
    let dropped = state.drop_punch_backlog();
    if dropped > 0 {
        tracing::warn!(
            "closing {}: {dropped} freed blocks left unpunched after {CLOSE_PUNCH_MAX:?}; they keep their space on the host until reused (grove check --repair gives it back)",
            state.device().describe()
        );
    }
    debug_assert_eq!(state.punch_backlog_len(), 0);
}

impl Pool {
    /// Leaves freed blocks on the punch backlog after commits, for the
    /// caller to punch at its own pace (`punch_some`); `close` still
    /// punches the backlog, for a bounded time. For a daemon that paces
    /// background work by its clients' load.
    pub fn defer_punching(&self) {
        self.inner.punch_deferred.store(true, Ordering::Relaxed);
    }

    /// Freed blocks waiting to be punched out of the store.
    pub fn punch_backlog_blocks(&self) -> usize {
        self.state().punch_backlog_len()
    }

    /// Punches up to `max_blocks` of the backlog now; returns the blocks
    /// taken off it (a block reused since it was freed is taken off, not
    /// punched).
    pub fn punch_some(&self, max_blocks: usize) -> usize {
        punch_backlog(&self.inner, max_blocks)
    }
}
