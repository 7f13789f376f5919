//! The reaction to the pruning level: the one call the space watcher
//! makes when use is past `space.prune`. Choosing which snapshots go is
//! the retention planner's work (rank-tree policies and holds, issue 25
//! points 1 to 3), which replaces this body.

use anyhow::Result;
use grove_store::Pool;

/// Frees at least `bytes_wanted` bytes if policy allows, by removing the
/// lowest-ranked snapshots that no hold or minimum keeps; returns the
/// bytes the removals give back (the reclaimer frees them).
///
/// PLACEHOLDER: no retention policy exists yet, so nothing is pruned.
pub fn free_space(pool: &Pool, bytes_wanted: u64) -> Result<u64> {
    tracing::warn!(
        "pool {}: past the pruning level: {bytes_wanted} bytes over; no retention policy prunes yet",
        pool.dir().display()
    );
    Ok(0)
}
