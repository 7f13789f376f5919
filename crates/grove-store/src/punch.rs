//! Space back to the host: blocks whose free is durable are punched out of
//! the store (`BlockDevice::punch`, fallocate(PUNCH_HOLE) on a file), so
//! that the store file's allocated size follows what the pool uses.
//!
//! When: `State::make_reusable` (after the commit that frees the blocks is
//! durable, under the exclusive I/O gate, so no reader that translated an
//! address before the commit is still reading) puts them on a backlog as it
//! makes them reusable. The pool punches the backlog when it lets the state
//! lock go after a flush, a reclaim batch or at close (`pool/locking.rs`,
//! `punch_freed`): under the lock it takes the blocks that are still free
//! (a block reused meanwhile holds new data and is skipped) and reserves
//! them in the allocator, as a write reserves its new block; then it punches
//! them without the lock, in neighbouring extents, one call each; then it
//! gives them back. A punch costs the host file system real work (0.1 to
//! 2 ms an extent of data on ext4 on the 2-core test machine), far too much
//! to hold the pool's lock for.
//!
//! A punch is an optimisation, never a reason to fail: a device that cannot
//! punch (EOPNOTSUPP, a file system without hole punching) turns punching
//! off for the pool with one log line; any other error is logged, counted
//! in [`PunchStats`] and ignored. Group header blocks (maps, share counts)
//! are never punched: they are never freed.

use std::sync::Arc;

use crate::device::{is_punch_unsupported, BlockDevice};
use crate::format::group::NIBBLE_PENDING_FREE;
pub use crate::io::PunchStats;
use crate::state::State;
use crate::types::BlockAddr;

/// Most blocks one run reserves while it punches without the lock: they
/// cannot be allocated meanwhile.
pub(crate) const PUNCH_RUN_BLOCKS_MAX: usize = 16 * 1024;

/// Sorts `blocks` and merges neighbours into extents (first block, count).
pub(crate) fn coalesce(blocks: &mut [BlockAddr]) -> Vec<(BlockAddr, u64)> {
    blocks.sort_unstable();
    let mut extents: Vec<(BlockAddr, u64)> = Vec::new();
    for &addr in blocks.iter() {
        match extents.last_mut() {
            Some((first, count)) if first.0 + *count == addr.0 => *count += 1,
            // A duplicate would be a block freed twice: never punch it twice.
            Some((first, count)) if first.0 + *count > addr.0 => {}
            _ => extents.push((addr, 1)),
        }
    }
    extents
}

/// Extents of reserved free blocks to punch without the state lock.
pub(crate) struct PunchRun {
    device: Arc<dyn BlockDevice>,
    block_bytes: u64,
    extents: Vec<(BlockAddr, u64)>,
}

/// What a run's calls did.
pub(crate) struct PunchOutcome {
    extents: u64,
    blocks: u64,
    failures: u64,
    first_error: Option<std::io::Error>,
    unsupported: Option<std::io::Error>,
    elapsed_us: u64,
}

impl PunchRun {
    /// The device calls; touches no engine state, so it runs without locks.
    pub(crate) fn execute(&self) -> PunchOutcome {
        let started = std::time::Instant::now();
        let mut outcome = PunchOutcome {
            extents: 0,
            blocks: 0,
            failures: 0,
            first_error: None,
            unsupported: None,
            elapsed_us: 0,
        };
        for &(first, count) in &self.extents {
            let offset = first.0 * self.block_bytes;
            match self.device.punch(offset, count * self.block_bytes) {
                Ok(()) => {
                    outcome.extents += 1;
                    outcome.blocks += count;
                }
                Err(e) if is_punch_unsupported(&e) => {
                    outcome.unsupported = Some(e);
                    break;
                }
                Err(e) => {
                    outcome.failures += 1;
                    outcome.first_error.get_or_insert(e);
                }
            }
        }
        outcome.elapsed_us = started.elapsed().as_micros() as u64;
        outcome
    }
}

impl State {
    /// Puts the blocks of `frees` that are still waiting to be made
    /// reusable (a repair may have taken one back in use since it was
    /// freed) on the punch backlog, just before `make_reusable` releases
    /// them.
    pub(crate) fn queue_durable_frees(&mut self, frees: &[BlockAddr]) {
        if self.puncher().is_off() {
            return;
        }
        for &addr in frees {
            if self.space_map().alloc().nibble(addr) != Some(NIBBLE_PENDING_FREE) {
                continue;
            }
            assert!(
                !self.space_map().alloc().is_group_header(addr),
                "{addr} is a group's own block and is never freed"
            );
            self.puncher_mut().queue(addr);
        }
    }

    /// Takes up to `max_blocks` (at most `PUNCH_RUN_BLOCKS_MAX`) blocks off
    /// the backlog, reserves those still free, and returns them as extents
    /// to punch without the lock, with how many blocks came off the
    /// backlog; None when the backlog is empty. `finish_punch_run` must
    /// follow.
    pub(crate) fn take_punch_run(&mut self, max_blocks: usize) -> Option<(PunchRun, usize)> {
        if self.puncher().is_off() {
            self.puncher_mut().clear_backlog();
        }
        if self.puncher().backlog_len() == 0 || max_blocks == 0 {
            return None;
        }
        let mut blocks = self
            .puncher_mut()
            .take(max_blocks.min(PUNCH_RUN_BLOCKS_MAX));
        let take = blocks.len();
        blocks.sort_unstable();
        blocks.dedup();
        // A block reused since it was queued holds its new owner's data.
        blocks.retain(|&addr| self.space_map().alloc().nibble(addr) == Some(0));
        for &addr in &blocks {
            debug_assert!(!self.space_map().alloc().is_group_header(addr));
            self.space_map_mut().reserve_free(addr);
        }
        let run = PunchRun {
            device: self.device().clone(),
            block_bytes: self.geometry().block_bytes(),
            extents: coalesce(&mut blocks),
        };
        Some((run, take))
    }

    /// Freed blocks waiting to be punched.
    /// Gives up punching the backlog (counted dropped); returns how many
    /// blocks were on it.
    pub(crate) fn drop_punch_backlog(&mut self) -> usize {
        self.puncher_mut().drop_backlog()
    }

    pub(crate) fn punch_backlog_len(&self) -> usize {
        self.puncher().backlog_len()
    }

    /// Gives a run's blocks back to the allocator and records what it did.
    pub(crate) fn finish_punch_run(&mut self, run: PunchRun, outcome: PunchOutcome) {
        for &(first, count) in &run.extents {
            for addr in (first.0..first.0 + count).map(BlockAddr) {
                assert!(
                    self.space_map().alloc().is_reserved(addr),
                    "{addr} was not held for punching"
                );
                self.space_map_mut().unreserve(addr);
            }
        }
        self.record_punches(outcome);
    }

    fn record_punches(&mut self, outcome: PunchOutcome) {
        self.puncher_mut().count(
            outcome.extents,
            outcome.blocks,
            outcome.failures,
            outcome.elapsed_us,
        );
        if let Some(e) = outcome.unsupported {
            if self.puncher_mut().turn_off() {
                tracing::info!(
                    "{} cannot punch holes ({e}): freed blocks keep their space on the host",
                    self.device().describe()
                );
            }
        }
        if let Some(e) = outcome.first_error {
            tracing::warn!(
                "cannot punch {} freed extents out of {} ({e}); their space stays allocated on the host",
                outcome.failures,
                self.device().describe()
            );
        }
    }

    /// Punches every free extent of every group, with the state lock held:
    /// for a store written by a grove that did not punch (or whose punches
    /// failed), so that its free blocks give their host space back. One
    /// pass over the maps in memory, one device call per free extent;
    /// `check --repair` runs it. Returns the blocks punched.
    pub(crate) fn punch_free_space(&mut self) -> u64 {
        let data_start = self.superblock().data_start.0;
        // Slots past a capacity that ends inside the last group are not
        // free space: they are not in the store at all.
        let end = match self.space_map().alloc().capacity_blocks() {
            0 => self.space_map().alloc().store_end(),
            capacity => self
                .space_map()
                .alloc()
                .store_end()
                .min(data_start + capacity),
        };
        let mut extents = Vec::new();
        let mut run: Option<(BlockAddr, u64)> = None;
        for addr in (data_start..end).map(BlockAddr) {
            if self.space_map().alloc().nibble(addr) == Some(0) {
                debug_assert!(!self.space_map().alloc().is_group_header(addr));
                run = match run {
                    Some((first, count)) => Some((first, count + 1)),
                    None => Some((addr, 1)),
                };
            } else if let Some(extent) = run.take() {
                extents.push(extent);
            }
        }
        extents.extend(run);
        let before = self.puncher().stats().blocks;
        // Every free block is punched now: the backlog has nothing left.
        self.puncher_mut().clear_backlog();
        if !self.puncher().is_off() {
            let run = PunchRun {
                device: self.device().clone(),
                block_bytes: self.geometry().block_bytes(),
                extents,
            };
            let outcome = run.execute();
            self.record_punches(outcome);
        }
        self.puncher().stats().blocks - before
    }

    /// What punching did since the pool was opened.
    pub(crate) fn punch_stats(&self) -> PunchStats {
        self.puncher().stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_merge_into_one_extent_each_and_order_does_not_matter() {
        let mut blocks: Vec<BlockAddr> = [9, 3, 4, 10, 5, 20, 11, 1]
            .into_iter()
            .map(BlockAddr)
            .collect();
        assert_eq!(
            coalesce(&mut blocks),
            [
                (BlockAddr(1), 1),
                (BlockAddr(3), 3),
                (BlockAddr(9), 3),
                (BlockAddr(20), 1)
            ]
        );
        assert!(coalesce(&mut []).is_empty());
        let mut twice = vec![BlockAddr(7), BlockAddr(7), BlockAddr(8)];
        assert_eq!(coalesce(&mut twice), [(BlockAddr(7), 2)]);
    }
}
