//! Taking the pool's state lock: the one way in, which every other part of
//! the pool (commits and their locks, punching, off-lock walks, volumes)
//! builds on. A lock poisoned by a panic stops the pool taking changes.

use std::sync::MutexGuard;

use super::Inner;
use crate::state::State;

/// Locks the state for one operation (the node store begins it).
pub(super) fn lock_state(inner: &Inner) -> MutexGuard<'_, State> {
    // A panic while the lock was held leaves the in-memory state suspect,
    // but the on-disk state is only ever changed by whole commits: go on
    // reading, and take no more changes (as after a failed commit).
    let mut state = inner.state.lock().unwrap_or_else(|poisoned| {
        let mut state = poisoned.into_inner();
        state.mark_failed(
            "an operation on the pool panicked; what it left in memory is not trusted".into(),
        );
        state
    });
    state.nodes_mut().begin_operation();
    state
}
