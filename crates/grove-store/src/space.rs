//! The space map: the one owner of which blocks are in use and how many
//! references each has. It holds the allocator (`alloc.rs`: nibble maps)
//! and the share counts (`shares.rs`: extra references), and nothing else
//! in the engine can change either: their fields are private here.
//!
//! Every change of a block's references goes through this file:
//!
//! - [`SpaceMap::take_reference`]: one more entry points at a block.
//! - [`SpaceMap::release_reference`]: one entry that pointed at a block is
//!   gone. A shared block loses a count; at its last reference the block is
//!   freed. This is the only place that decides "the last reference frees".
//!   A caller that must first walk a node's children (dropping a subtree,
//!   the reclaimer) asks [`SpaceMap::is_last_reference`] before it walks.
//! - [`SpaceMap::free_unreferenced`]: a block no entry points at (a leak
//!   that `check --repair` found, or a new block a failed write never
//!   mapped) is freed.
//!
//! Allocation for the write path (reserve, confirm, unreserve, allocate),
//! punching, repair and persistence (seal, replay, rebuild) have methods
//! of their own below; reads go through [`SpaceMap::alloc`] and
//! [`SpaceMap::shares`], which hand out shared references only.

use std::collections::HashMap;

use crate::alloc::{Allocator, BlockUse, SealedChanges};
use crate::error::Result;
use crate::format::group::NIBBLE_PENDING_FREE;
use crate::format::journal::{AllocExtent, ShareRun};
use crate::shares::Shares;
use crate::types::BlockAddr;

/// What [`SpaceMap::release_reference`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Others still point at the block: its count went down by one.
    Shared,
    /// That was the last reference: the block is freed (reusable once the
    /// transaction is durable). A damaged tree that points at a free block
    /// is refused quietly and counted by the allocator for `check`.
    Freed,
}

pub(crate) struct SpaceMap {
    alloc: Allocator,
    /// Extra reference counts: exact sharing.
    shares: Shares,
}

impl SpaceMap {
    pub(crate) fn new(alloc: Allocator, shares: Shares) -> SpaceMap {
        SpaceMap { alloc, shares }
    }

    // ----- read-only views -----

    /// The allocator, for queries (counters, nibbles, geometry of groups).
    pub(crate) fn alloc(&self) -> &Allocator {
        &self.alloc
    }

    /// The share counts, for queries (`extra`, `is_shared`, `all`).
    pub(crate) fn shares(&self) -> &Shares {
        &self.shares
    }

    /// Moves the capacity (see `Allocator::set_capacity`); only
    /// `capacity.rs` calls it, with the superblock kept in step.
    pub(crate) fn set_capacity(&mut self, capacity_blocks: u64) {
        self.alloc.set_capacity(capacity_blocks);
        debug_assert_eq!(self.alloc.capacity_blocks(), capacity_blocks);
    }

    /// True if `addr` has no other reference than the one a caller is
    /// about to release: releasing it will free it.
    pub(crate) fn is_last_reference(&self, addr: BlockAddr) -> bool {
        !self.is_shared(addr)
    }

    /// True if more than one entry points at `addr`: a write must copy it
    /// (dedicate-on-write), and accounting counts it as not unique.
    pub(crate) fn is_shared(&self, addr: BlockAddr) -> bool {
        self.shares.is_shared(addr)
    }

    /// How many entries point at `addr` (an allocated block has one at
    /// least), for walks that count references they meet.
    pub(crate) fn references(&self, addr: BlockAddr) -> u32 {
        self.shares.extra(addr).saturating_add(1)
    }

    // ----- references -----

    /// One more entry points at `addr`. Refused (as damage) rather than
    /// wrapped at `EXTRA_REFERENCES_MAX`.
    pub(crate) fn take_reference(&mut self, addr: BlockAddr) -> Result<()> {
        let (before, after) = self.shares.increment(addr)?;
        debug_assert_eq!(
            self.shares.extra(addr),
            before + 1,
            "{addr}: count did not grow"
        );
        debug_assert_eq!(after, before + 1);
        Ok(())
    }

    /// One entry that pointed at `addr` is gone: a shared block loses a
    /// count, the last reference frees the block.
    pub(crate) fn release_reference(&mut self, addr: BlockAddr) -> Release {
        let extra = self.shares.extra(addr);
        if extra > 0 {
            self.shares.decrement(addr);
            assert_eq!(self.shares.extra(addr), extra - 1, "{addr}: count");
            Release::Shared
        } else {
            self.free_in_allocator(addr);
            Release::Freed
        }
    }

    /// Frees `addr` in the allocator. A block freed must have been
    /// allocated: one that was not is damage on disk, refused and counted
    /// for `check`.
    fn free_in_allocator(&mut self, addr: BlockAddr) {
        let refused = self.alloc.inconsistent_frees();
        self.alloc.free(addr);
        debug_assert!(
            self.alloc.nibble(addr) == Some(NIBBLE_PENDING_FREE)
                || self.alloc.inconsistent_frees() == refused + 1,
            "{addr}: freed, or refused as damage"
        );
    }

    /// Frees a block that no entry or record points at: a leak found by
    /// `check --repair`, or a new block a failed write never mapped.
    pub(crate) fn free_unreferenced(&mut self, addr: BlockAddr) {
        debug_assert!(!self.shares.is_shared(addr), "{addr}: others point at it");
        self.free_in_allocator(addr);
    }

    // ----- allocation -----

    /// A new block, in use from now on and in the open transaction.
    pub(crate) fn allocate(&mut self, usage: BlockUse) -> Result<BlockAddr> {
        let addr = self.alloc.allocate(usage)?;
        debug_assert!(self.alloc.is_allocated(addr) && !self.shares.is_shared(addr));
        Ok(addr)
    }

    /// A data block for a write that maps it later (see `Allocator::reserve`).
    pub(crate) fn reserve(&mut self) -> Result<BlockAddr> {
        let addr = self.alloc.reserve()?;
        debug_assert!(self.alloc.is_reserved(addr) && !self.shares.is_shared(addr));
        Ok(addr)
    }

    /// A reserved block is mapped now: it joins the open transaction.
    pub(crate) fn confirm(&mut self, addr: BlockAddr) {
        self.alloc.confirm(addr);
        debug_assert!(self.alloc.is_allocated(addr) && !self.alloc.is_reserved(addr));
    }

    /// A reserved block will not be mapped (or was punched): free again.
    pub(crate) fn unreserve(&mut self, addr: BlockAddr) {
        self.alloc.unreserve(addr);
        debug_assert!(!self.alloc.is_allocated(addr) && !self.alloc.is_reserved(addr));
    }

    /// Takes the free block `addr` while its host space is punched.
    pub(crate) fn reserve_free(&mut self, addr: BlockAddr) {
        self.alloc.reserve_free(addr);
        debug_assert!(self.alloc.is_reserved(addr));
    }

    /// Makes blocks freed by a now-durable transaction reusable.
    pub(crate) fn release_durable_frees(&mut self, frees: Vec<BlockAddr>) {
        let free_before = self.alloc.free_blocks();
        let count = frees.len() as u64;
        self.alloc.release(frees);
        // Only blocks still pending free turn free (a repair may have put
        // one back in use): never more than were given.
        debug_assert!(self.alloc.free_blocks() - free_before <= count);
    }

    // ----- repair -----

    /// Marks a block a tree reaches as allocated with the right use.
    pub(crate) fn mark_in_use(&mut self, addr: BlockAddr, usage: BlockUse) {
        self.alloc.set_allocated(addr, usage);
        debug_assert!(self.alloc.is_allocated(addr));
    }

    /// Sets a block's extra references outright, as the trees count them.
    pub(crate) fn set_share_count(&mut self, addr: BlockAddr, extra: u32) {
        self.shares.set_exact(addr, extra);
        debug_assert_eq!(self.shares.extra(addr), extra);
    }

    // ----- persistence -----

    /// The open transaction's share-count runs.
    pub(crate) fn pending_share_runs(&mut self) -> Vec<ShareRun> {
        let runs = self.shares.pending_runs();
        debug_assert_eq!(runs.is_empty(), self.shares.change_count() == 0);
        runs
    }

    /// The open transaction is durable: both fold it into their durable
    /// copies.
    pub(crate) fn seal(&mut self) -> SealedChanges {
        let sealed = self.alloc.seal();
        self.shares.seal();
        debug_assert!(!self.alloc.has_changes() && self.shares.change_count() == 0);
        sealed
    }

    /// Applies a replayed transaction to the durable copies.
    pub(crate) fn replay(
        &mut self,
        extents: &[AllocExtent],
        share_runs: &[ShareRun],
        group_count: u64,
    ) -> Result<()> {
        self.alloc.replay(extents, group_count)?;
        let store_end = self.alloc.store_end();
        self.shares.replay(share_runs, store_end)?;
        debug_assert!(!self.alloc.has_changes() && self.shares.change_count() == 0);
        Ok(())
    }

    /// After replay, the live state starts from the durable one.
    pub(crate) fn finish_replay(&mut self) {
        self.alloc.finish_replay();
        debug_assert!(
            !self.alloc.has_changes(),
            "the live maps start from the durable ones"
        );
    }

    /// The allocation maps are written.
    pub(crate) fn mark_maps_clean(&mut self) {
        self.alloc.mark_maps_clean();
        debug_assert!(!self.alloc.has_dirty_maps());
    }

    /// The count blocks in `written` (group, index) are written (or are
    /// written before the maps): their groups' maps say they hold counts.
    pub(crate) fn mark_count_blocks_present(&mut self, written: &[(u64, u32)]) {
        for &(group, index) in written {
            self.alloc.mark_shares_present(group, index);
            debug_assert!(self.alloc.shares_present(group) & (1 << index) != 0);
        }
    }

    /// The dirty count blocks are durable: none is dirty any more.
    pub(crate) fn mark_count_blocks_clean(&mut self) {
        self.shares.mark_count_blocks_clean();
        debug_assert!(!self.shares.has_dirty_count_blocks());
    }

    /// Loads the counts of one count block read at open.
    pub(crate) fn load_share_counts(&mut self, first: u64, counts: &[u32]) {
        self.shares.load(first, counts);
        debug_assert_eq!(self.shares.change_count(), 0, "loaded counts are durable");
    }

    /// Replaces every count with what the trees say.
    pub(crate) fn rebuild_shares(&mut self, extra: HashMap<u64, u32>) {
        self.shares.rebuild(extra);
        debug_assert_eq!(self.shares.change_count(), 0, "rebuilt counts are durable");
    }

    pub(crate) fn mark_count_block_dirty(&mut self, first: u64) {
        self.shares.mark_count_block_dirty(first);
        debug_assert!(self.shares.has_dirty_count_blocks());
    }

    /// Replaces a group's map with one rebuilt from the trees.
    pub(crate) fn rebuild_group(&mut self, group: u64, nibbles: &[u8]) {
        self.alloc.rebuild_group(group, nibbles);
        debug_assert!(
            (0..nibbles.len() as u64).all(|slot| {
                let addr = BlockAddr(self.alloc.group_start(group).0 + slot);
                self.alloc.nibble(addr) == Some(nibbles[slot as usize])
            }),
            "group {group}: the map is what the trees say"
        );
    }
}
