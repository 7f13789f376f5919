//! The block allocator: the in-memory copy of every group's nibble map, with
//! next-fit allocation that scans circularly from where the last one ended
//! (RSnap §4.3), so a volume written sequentially gets contiguous blocks.

use crate::error::{Error, ErrorKind, Result};
use crate::format::group::{
    self, NIBBLE_ALLOCATED, NIBBLE_MARKED, NIBBLE_META, NIBBLE_PENDING_FREE,
};
use crate::format::node::ENTRY_ADDR_MASK;
use crate::types::BlockAddr;

/// What a block is used for; kept in the nibble map for the checker and GC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockUse {
    Data,
    Meta,
}

struct Group {
    /// One state per block of the group, in the low four bits.
    nibbles: Vec<u8>,
    free_blocks: u64,
    /// The map block must be written at the next commit.
    dirty: bool,
}

pub struct Allocator {
    data_start: u64,
    group_blocks: u64,
    /// 0 means the store may grow while the host file system has room.
    group_count_max: u64,
    groups: Vec<Group>,
    /// Next-fit position: the block after the last one handed out.
    cursor: u64,
    /// Blocks freed since the last commit. They stay unusable until that
    /// commit is durable (consistency contract, point 5).
    pending_free: Vec<BlockAddr>,
}

impl Allocator {
    /// An allocator over groups whose maps were already decoded.
    pub fn new(
        data_start: BlockAddr,
        group_blocks: u64,
        group_count_max: u64,
        group_nibbles: Vec<Vec<u8>>,
    ) -> Allocator {
        let groups = group_nibbles
            .into_iter()
            .map(|nibbles| Group {
                free_blocks: nibbles.iter().filter(|&&n| n == 0).count() as u64,
                nibbles,
                dirty: false,
            })
            .collect();
        Allocator {
            data_start: data_start.0,
            group_blocks,
            group_count_max,
            groups,
            cursor: data_start.0,
            pending_free: Vec::new(),
        }
    }

    pub fn group_count(&self) -> u64 {
        self.groups.len() as u64
    }

    /// First block of group `index`: its map block.
    pub fn group_start(&self, index: u64) -> BlockAddr {
        BlockAddr(self.data_start + index * self.group_blocks)
    }

    /// Appends an empty group whose only used block is its own map block.
    pub fn add_group(&mut self) -> Result<u64> {
        let index = self.groups.len() as u64;
        if self.group_count_max != 0 && index >= self.group_count_max {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "the pool is full: all {} allocation groups are in use and the capacity limit allows no more",
                    self.group_count_max
                ),
            ));
        }
        let end = self.data_start + (index + 1) * self.group_blocks;
        if end > ENTRY_ADDR_MASK {
            return Err(Error::new(
                ErrorKind::NoSpace,
                "the store has reached its largest possible size",
            ));
        }
        let mut nibbles = vec![0u8; self.group_blocks as usize];
        nibbles[0] = NIBBLE_ALLOCATED | NIBBLE_META;
        self.groups.push(Group {
            nibbles,
            free_blocks: self.group_blocks - 1,
            dirty: true,
        });
        Ok(index)
    }

    /// Hands out a free block, growing the store by a group when all are full.
    pub fn allocate(&mut self, usage: BlockUse) -> Result<BlockAddr> {
        let addr = match self.find_free() {
            Some(addr) => addr,
            None => {
                let index = self.add_group()?;
                self.group_start(index).0 + 1
            }
        };
        let (group, slot) = self.locate(BlockAddr(addr));
        let group = &mut self.groups[group];
        debug_assert_eq!(group.nibbles[slot], 0);
        group.nibbles[slot] = NIBBLE_ALLOCATED
            | if usage == BlockUse::Meta {
                NIBBLE_META
            } else {
                0
            };
        group.free_blocks -= 1;
        group.dirty = true;
        self.cursor = addr + 1;
        Ok(BlockAddr(addr))
    }

    fn find_free(&self) -> Option<u64> {
        let group_count = self.groups.len() as u64;
        if group_count == 0 {
            return None;
        }
        let store_end = self.data_start + group_count * self.group_blocks;
        let cursor = if self.cursor >= store_end {
            self.data_start
        } else {
            self.cursor
        };
        let (start_group, start_slot) = self.locate(BlockAddr(cursor));
        // Visit the cursor's group from the cursor on, then every other group,
        // then the cursor's group before the cursor.
        for step in 0..=group_count {
            let g = ((start_group as u64 + step) % group_count) as usize;
            let group = &self.groups[g];
            if group.free_blocks == 0 {
                continue;
            }
            let range = match step {
                0 => start_slot..group.nibbles.len(),
                s if s == group_count => 0..start_slot,
                _ => 0..group.nibbles.len(),
            };
            if let Some(slot) = group.nibbles[range.clone()].iter().position(|&n| n == 0) {
                return Some(self.group_start(g as u64).0 + (range.start + slot) as u64);
            }
        }
        None
    }

    /// Frees a block. It becomes reusable only after `release_pending`.
    pub fn free(&mut self, addr: BlockAddr) {
        let (group, slot) = self.locate(addr);
        let group = &mut self.groups[group];
        let nibble = group.nibbles[slot];
        assert!(
            nibble & NIBBLE_ALLOCATED != 0,
            "freeing {addr}, which is not allocated (nibble {nibble:#x})"
        );
        assert!(slot != 0, "freeing the map block of a group");
        group.nibbles[slot] = NIBBLE_PENDING_FREE;
        group.dirty = true;
        self.pending_free.push(addr);
    }

    /// Makes the blocks freed before the last durable commit reusable.
    pub fn release_pending(&mut self) {
        for addr in std::mem::take(&mut self.pending_free) {
            let (group, slot) = self.locate(addr);
            let group = &mut self.groups[group];
            if group.nibbles[slot] == NIBBLE_PENDING_FREE {
                group.nibbles[slot] = 0;
                group.free_blocks += 1;
            }
        }
    }

    pub fn is_allocated(&self, addr: BlockAddr) -> bool {
        self.nibble(addr).is_some_and(|n| n & NIBBLE_ALLOCATED != 0)
    }

    pub fn nibble(&self, addr: BlockAddr) -> Option<u8> {
        if addr.0 < self.data_start || addr.0 >= self.store_end() {
            return None;
        }
        let (group, slot) = self.locate(addr);
        Some(self.groups[group].nibbles[slot])
    }

    /// One past the last block of the store.
    pub fn store_end(&self) -> u64 {
        self.data_start + self.groups.len() as u64 * self.group_blocks
    }

    /// Blocks in use, the groups' own map blocks included.
    pub fn used_blocks(&self) -> u64 {
        self.groups
            .iter()
            .map(|g| self.group_blocks - g.free_blocks)
            .sum()
    }

    /// Blocks in use that hold metadata.
    pub fn meta_blocks(&self) -> u64 {
        self.groups
            .iter()
            .map(|g| g.nibbles.iter().filter(|&&n| n & NIBBLE_META != 0).count() as u64)
            .sum()
    }

    /// Blocks free in the groups that exist (the store can also grow).
    pub fn free_blocks(&self) -> u64 {
        self.groups.iter().map(|g| g.free_blocks).sum()
    }

    pub fn group_count_max(&self) -> u64 {
        self.group_count_max
    }

    /// Encoded map blocks of every group changed since the last call, as
    /// (address, block bytes). Pending frees are written as free: once this
    /// commit is durable they are.
    pub fn take_dirty_maps(&mut self, block_size_bytes: u32) -> Vec<(BlockAddr, Vec<u8>)> {
        let mut out = Vec::new();
        for index in 0..self.groups.len() {
            if !self.groups[index].dirty {
                continue;
            }
            let persisted: Vec<u8> = self.groups[index]
                .nibbles
                .iter()
                .map(|&n| n & !(NIBBLE_PENDING_FREE | NIBBLE_MARKED))
                .collect();
            let mut block = vec![0u8; block_size_bytes as usize];
            group::encode(index as u64, &persisted, &mut block);
            out.push((self.group_start(index as u64), block));
            self.groups[index].dirty = false;
        }
        out
    }

    /// (group index, slot in the group) of a block in the data area.
    fn locate(&self, addr: BlockAddr) -> (usize, usize) {
        assert!(
            addr.0 >= self.data_start && addr.0 < self.store_end(),
            "{addr} is outside the data area"
        );
        let relative = addr.0 - self.data_start;
        (
            (relative / self.group_blocks) as usize,
            (relative % self.group_blocks) as usize,
        )
    }
}
