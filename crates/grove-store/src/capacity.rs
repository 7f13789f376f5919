//! Raising a pool's capacity (auto-extension, or `grove space set
//! --capacity`). The capacity lives in the superblock, and replay refuses
//! a journaled allocation past it, so a raise must be durable before any
//! block past the old capacity is handed out: the store file is grown,
//! then a checkpoint writes a superblock with the new capacity, all under
//! the state lock. A crash before the superblock is durable leaves the old
//! capacity, and nothing was allocated past it.

use crate::error::{Error, ErrorKind, Result};
use crate::format::node::ENTRY_ADDR_MASK;
use crate::state::State;

impl State {
    /// Most blocks a capacity may name (the format's largest address).
    pub(crate) fn capacity_max_blocks(&self) -> u64 {
        ENTRY_ADDR_MASK - self.superblock().data_start.0
    }

    /// Raises the capacity to `capacity_blocks` and makes it durable. The
    /// caller has settled any commit in flight. On failure the capacity
    /// stays what it was, in memory as on disk.
    pub(crate) fn raise_capacity(&mut self, capacity_blocks: u64) -> Result<()> {
        let old = self.superblock().capacity_blocks;
        if old == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "this pool has no capacity limit (it grows while the host has room), so there is none to raise",
            ));
        }
        if capacity_blocks <= old || capacity_blocks > self.capacity_max_blocks() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "a capacity of {capacity_blocks} blocks is not a raise of the current {old} (nor past {} blocks)",
                    self.capacity_max_blocks()
                ),
            ));
        }
        self.space_map_mut().set_capacity(capacity_blocks);
        self.set_superblock_capacity(capacity_blocks);
        let made_durable = self.grow_device_to_store().and_then(|()| self.checkpoint());
        if let Err(e) = made_durable {
            // Nothing was allocated meanwhile (the lock is held), so the
            // slots the raise added are all free and can be taken back.
            self.space_map_mut().set_capacity(old);
            self.set_superblock_capacity(old);
            return Err(e);
        }
        assert_eq!(self.space_map().alloc().capacity_blocks(), capacity_blocks);
        Ok(())
    }
}
