//! The shape of the radix trees for one block size.

use crate::format::node::{ENTRY_BYTES, NODE_LEVELS_MAX};
use crate::format::record::RECORD_BYTES;

/// Shape of the radix trees for one block size.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub block_size_bytes: u32,
    /// Entries per node: block size / 8 (512 at 4 KiB).
    pub entries_per_node: usize,
    /// log2(entries_per_node): bits of a block index consumed per level.
    pub bits_per_level: u32,
    /// Volume records per record block.
    pub records_per_block: u64,
}

impl Geometry {
    pub fn new(block_size_bytes: u32) -> Geometry {
        let entries_per_node = block_size_bytes as usize / ENTRY_BYTES;
        Geometry {
            block_size_bytes,
            entries_per_node,
            bits_per_level: entries_per_node.trailing_zeros(),
            records_per_block: (block_size_bytes as usize / RECORD_BYTES) as u64,
        }
    }

    pub fn block_bytes(&self) -> u64 {
        u64::from(self.block_size_bytes)
    }

    /// Blocks needed to hold `size_bytes` (the last one may be partial).
    pub fn blocks_for(&self, size_bytes: u64) -> u64 {
        size_bytes.div_ceil(self.block_bytes())
    }

    /// Fewest levels whose leaves can address `blocks` blocks (at least 1).
    pub fn height_for(&self, blocks: u64) -> u8 {
        let mut height = 1u8;
        while self.capacity_blocks(height) < blocks {
            height += 1;
        }
        assert!(height < NODE_LEVELS_MAX);
        height
    }

    /// Blocks addressable by a tree of `height` levels (saturating).
    pub fn capacity_blocks(&self, height: u8) -> u64 {
        let bits = self.bits_per_level * u32::from(height);
        if bits >= 64 {
            u64::MAX
        } else {
            1u64 << bits
        }
    }

    /// Blocks covered by one entry of a node at `level`.
    pub fn span_blocks(&self, level: u8) -> u64 {
        self.capacity_blocks(level)
    }

    /// Which entry of a level-`level` node leads toward `index`.
    pub fn slot(&self, index: u64, level: u8) -> usize {
        let shift = self.bits_per_level * u32::from(level);
        if shift >= 64 {
            return 0;
        }
        ((index >> shift) as usize) & (self.entries_per_node - 1)
    }
}
