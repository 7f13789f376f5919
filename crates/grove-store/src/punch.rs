//! Space back to the host: blocks whose free is durable are punched out of
//! the store (`BlockDevice::punch`, fallocate(PUNCH_HOLE) on a file), so
//! that the store file's allocated size follows what the pool uses.
//!
//! When: in `State::make_reusable`, after the commit that frees the blocks
//! is durable and before the allocator may hand them out again, under the
//! state lock and the exclusive I/O gate. Earlier, a crash could bring back
//! a tree that still points at them; later, a new owner's data could be in
//! them. The gate also means no reader that translated an address before
//! the commit is still reading the block. Neighbouring blocks are punched
//! as one extent, one call each. The calls run under the state lock: a punch
//! is a metadata operation of the host file system (tens of microseconds an
//! extent on ext4), and moving it out would need a third state for blocks
//! (freed, durable, not yet reusable) that every path would have to know.
//!
//! A punch is an optimisation, never a reason to fail: a device that cannot
//! punch (EOPNOTSUPP, a file system without hole punching) turns punching
//! off for the pool with one log line; any other error is logged, counted
//! in [`PunchStats`] and ignored. Group header blocks (maps, share counts)
//! are never punched: they are never freed.

use crate::device::is_punch_unsupported;
use crate::format::group::NIBBLE_PENDING_FREE;
use crate::state::State;
use crate::types::BlockAddr;

/// What hole punching did on the pool's device since the pool was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PunchStats {
    /// Extents punched: one device call each.
    pub extents: u64,
    /// Blocks in those extents.
    pub blocks: u64,
    /// Punches that failed for another reason than "cannot punch"; their
    /// blocks keep their host space until they are written and freed again
    /// (or `check --repair` punches every free extent).
    pub errors: u64,
    /// The device cannot punch holes: punching is off.
    pub unsupported: bool,
}

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

impl State {
    /// Punches the blocks of `frees` that are still waiting to be made
    /// reusable (a repair may have taken one back in use since it was
    /// freed), just before `make_reusable` releases them. Returns the
    /// blocks punched or tried, for the caller's check after the release.
    pub(crate) fn punch_durable_frees(&mut self, frees: &[BlockAddr]) -> Vec<BlockAddr> {
        if self.punch.unsupported || frees.is_empty() {
            return Vec::new();
        }
        let mut blocks: Vec<BlockAddr> = frees
            .iter()
            .copied()
            .filter(|&addr| self.alloc.nibble(addr) == Some(NIBBLE_PENDING_FREE))
            .collect();
        for &addr in &blocks {
            assert!(
                !self.alloc.is_group_header(addr),
                "{addr} is a group's own block and is never freed"
            );
        }
        let extents = coalesce(&mut blocks);
        self.punch_extents(&extents);
        blocks
    }

    /// Punches every free extent of every group: for a store written by a
    /// grove that did not punch (or whose punches failed), so that its free
    /// blocks give their host space back. One pass over the maps in
    /// memory, one device call per free extent; `check --repair` runs it.
    /// Returns the blocks punched.
    pub(crate) fn punch_free_space(&mut self) -> u64 {
        let data_start = self.superblock.data_start.0;
        // Slots past a capacity that ends inside the last group are not
        // free space: they are not in the store at all.
        let end = match self.alloc.capacity_blocks() {
            0 => self.alloc.store_end(),
            capacity => self.alloc.store_end().min(data_start + capacity),
        };
        let before = self.punch.blocks;
        let mut run: Option<(BlockAddr, u64)> = None;
        for addr in (data_start..end).map(BlockAddr) {
            if self.punch.unsupported {
                break;
            }
            if self.alloc.nibble(addr) == Some(0) {
                debug_assert!(!self.alloc.is_group_header(addr));
                run = match run {
                    Some((first, count)) => Some((first, count + 1)),
                    None => Some((addr, 1)),
                };
            } else if let Some(extent) = run.take() {
                self.punch_extents(&[extent]);
            }
        }
        if let Some(extent) = run {
            self.punch_extents(&[extent]);
        }
        self.punch.blocks - before
    }

    fn punch_extents(&mut self, extents: &[(BlockAddr, u64)]) {
        let block_bytes = self.geometry.block_bytes();
        let mut failed: Option<std::io::Error> = None;
        let mut failures = 0u64;
        for &(first, count) in extents {
            match self
                .device
                .punch(first.0 * block_bytes, count * block_bytes)
            {
                Ok(()) => {
                    self.punch.extents += 1;
                    self.punch.blocks += count;
                }
                Err(e) if is_punch_unsupported(&e) => {
                    self.punch.unsupported = true;
                    tracing::info!(
                        "{} cannot punch holes ({e}): freed blocks keep their space on the host",
                        self.device.describe()
                    );
                    return;
                }
                Err(e) => {
                    failures += 1;
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            self.punch.errors += failures;
            tracing::warn!(
                "cannot punch {failures} freed extents out of {} ({e}); their space stays allocated on the host",
                self.device.describe()
            );
        }
    }

    /// What punching did since the pool was opened.
    pub(crate) fn punch_stats(&self) -> PunchStats {
        self.punch
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
