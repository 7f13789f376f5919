//! Share-count blocks: how many extra references each block has. Sharing
//! is exact (dm-thin, btrfs): a block referenced by n parent entries or
//! volume records has n - 1 extra references, and it is free at zero
//! references. Most blocks have exactly one reference, so only the extra
//! count is stored, and a block absent from every count block has none.
//!
//! Every allocation group keeps its counts in the SHARE_BLOCKS_PER_GROUP
//! blocks right after its map block; count block k of a group covers the
//! group's slots [k * counts_per_block, (k + 1) * counts_per_block). The last
//! one reaches past the group's end: those slots are the next group's,
//! counted by its own first count block, so they are written as zeros and
//! ignored when read. They are
//! written at checkpoint from the durable counts, like the maps: changes
//! ride in journal descriptors as runs. A count block that was never
//! written is a hole in the store; the group map's header says which ones
//! hold counts, so a damaged one is never mistaken for "no counts".

use super::{crc_with_hole, get_u32, get_u64, put_u32, put_u64};
use crate::error::{Error, Result};
use crate::types::BlockAddr;

/// Identifies a share-count block.
pub const SHARES_MAGIC: [u8; 4] = *b"GRVC";
/// Count blocks after each group's map block.
pub const SHARE_BLOCKS_PER_GROUP: u64 = 8;

// Share-count block layout:
//
//   offset size field
//   0      4    magic "GRVC"
//   4      4    crc32c of the whole block with this field zeroed
//   8      8    first: the store block whose count comes first (catches a
//               count block written to the wrong place)
//   16     4*n  extra references of blocks first, first + 1, ... (u32 each),
//               n = counts_per_block = (block size - 16) / 4
const MAGIC_OFFSET: usize = 0;
const CRC_OFFSET: usize = MAGIC_OFFSET + 4;
const FIRST_OFFSET: usize = CRC_OFFSET + 4;
const COUNTS_OFFSET: usize = FIRST_OFFSET + 8;
const COUNT_BYTES: usize = 4;

/// Counts one block of `block_size_bytes` holds.
pub fn counts_per_block(block_size_bytes: u32) -> u64 {
    ((block_size_bytes as usize - COUNTS_OFFSET) / COUNT_BYTES) as u64
}

/// Encodes a count block covering `counts.len()` blocks from `first`.
pub fn encode(first: BlockAddr, counts: &[u32], block: &mut [u8]) {
    assert_eq!(counts.len() as u64, counts_per_block(block.len() as u32));
    block.fill(0);
    block[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&SHARES_MAGIC);
    put_u64(block, FIRST_OFFSET, first.0);
    for (i, &count) in counts.iter().enumerate() {
        put_u32(block, COUNTS_OFFSET + i * COUNT_BYTES, count);
    }
    let crc = crc_with_hole(block, CRC_OFFSET);
    put_u32(block, CRC_OFFSET, crc);
}

/// Decodes and verifies the count block that covers blocks from `first`.
pub fn decode(first: BlockAddr, block: &[u8]) -> Result<Vec<u32>> {
    let damaged = |why: String| {
        Error::corrupt(format!(
            "share-count block for blocks from {} is damaged: {why}",
            first.0
        ))
    };
    if block[MAGIC_OFFSET..MAGIC_OFFSET + 4] != SHARES_MAGIC {
        return Err(damaged("no share-count magic".into()));
    }
    let stored_crc = get_u32(block, CRC_OFFSET);
    let actual_crc = crc_with_hole(block, CRC_OFFSET);
    if stored_crc != actual_crc {
        return Err(damaged(format!(
            "checksum mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})"
        )));
    }
    let stored_first = get_u64(block, FIRST_OFFSET);
    if stored_first != first.0 {
        return Err(damaged(format!(
            "it holds the counts of blocks from {stored_first}"
        )));
    }
    let n = counts_per_block(block.len() as u32) as usize;
    Ok((0..n)
        .map(|i| get_u32(block, COUNTS_OFFSET + i * COUNT_BYTES))
        .collect())
}
