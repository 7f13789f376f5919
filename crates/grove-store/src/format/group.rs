//! Allocation groups and their nibble maps (RSnap §4.3). The data area is a
//! run of equal groups; the first block of each group is its map block, which
//! holds one 4-bit state per block of the group (the map block included).
//! The share-count blocks follow it (`shares.rs`). A store grows by
//! appending a group, so neither ever has to move.

use super::{crc_with_hole, get_u32, get_u64, put_u32, put_u64};
use crate::error::{Error, Result};

/// Identifies a group map block.
pub const GROUP_MAGIC: [u8; 4] = *b"GRVG";
/// Bytes at the start of a map block before the nibbles.
pub const GROUP_HEADER_BYTES: usize = 64;

/// Nibble bit: the block is in use (RSnap's "reserved").
pub const NIBBLE_ALLOCATED: u8 = 0x1;
/// Nibble bit: the block holds metadata (a node, a record block, a map block).
pub const NIBBLE_META: u8 = 0x2;
/// Nibble bit: freed, waiting for the commit that frees it (journal issue).
pub const NIBBLE_PENDING_FREE: u8 = 0x8;
/// The nibble of a block holding metadata, as stored on disk.
const NIBBLE_META_ON_DISK: u8 = NIBBLE_ALLOCATED | NIBBLE_META;

// Group map block layout:
//
//   offset size field
//   0      4    magic "GRVG"
//   4      4    crc32c of the whole block with this field zeroed
//   8      8    group index (catches a map block written to the wrong group)
//   16     1    share blocks present: bit k set = share-count block k of the
//               group holds counts (clear = never written, no extra references)
//   17     47   reserved, zero
//   64     ...  nibbles: block i of the group is the low nibble of byte
//                64 + i/2 when i is even, the high nibble when i is odd
const MAGIC_OFFSET: usize = 0;
const CRC_OFFSET: usize = MAGIC_OFFSET + 4;
const INDEX_OFFSET: usize = CRC_OFFSET + 4;
const SHARES_PRESENT_OFFSET: usize = INDEX_OFFSET + 8;
const RESERVED_OFFSET: usize = SHARES_PRESENT_OFFSET + 1;
const _: () = assert!(RESERVED_OFFSET + 47 == GROUP_HEADER_BYTES);
const _: () = assert!(super::shares::SHARE_BLOCKS_PER_GROUP <= 8);

/// Blocks at the start of every group that are its own metadata: the map
/// block, then the share-count blocks. They are always allocated metadata.
pub const GROUP_HEADER_BLOCKS: u64 = 1 + super::shares::SHARE_BLOCKS_PER_GROUP;

/// Blocks per group for a block size: two nibbles per map byte.
pub fn group_blocks(block_size_bytes: u32) -> u64 {
    (block_size_bytes as u64 - GROUP_HEADER_BYTES as u64) * 2
}

/// Encodes a group's map block from one nibble per block (in the low 4 bits).
pub fn encode(group_index: u64, nibbles: &[u8], shares_present: u8, block: &mut [u8]) {
    assert_eq!(nibbles.len() as u64, group_blocks(block.len() as u32));
    assert!(
        nibbles[..GROUP_HEADER_BLOCKS as usize]
            .iter()
            .all(|&n| n == NIBBLE_META_ON_DISK),
        "the map and share-count blocks are in use as metadata"
    );
    block.fill(0);
    block[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&GROUP_MAGIC);
    put_u64(block, INDEX_OFFSET, group_index);
    block[SHARES_PRESENT_OFFSET] = shares_present;
    for (i, &nibble) in nibbles.iter().enumerate() {
        // The decoder refuses anything else: marks and pending frees are
        // states of memory, never of the disk.
        assert!(
            matches!(nibble, 0 | NIBBLE_ALLOCATED | NIBBLE_META_ON_DISK),
            "block {i} of group {group_index} has the in-memory state {nibble:#x}"
        );
        block[GROUP_HEADER_BYTES + i / 2] |= nibble << (4 * (i % 2));
    }
    let crc = crc_with_hole(block, CRC_OFFSET);
    put_u32(block, CRC_OFFSET, crc);
}

/// A decoded map block.
pub struct DecodedMap {
    /// One state per block of the group, in the low four bits.
    pub nibbles: Vec<u8>,
    /// Which share-count blocks of the group hold counts (bit k = block k).
    pub shares_present: u8,
}

impl DecodedMap {
    /// The map a group is given while its own map block is unusable: only
    /// the group's own blocks in use, no share-count block present. It is
    /// replaced by the map rebuilt from the trees before the pool is used.
    pub fn placeholder(group_blocks: u64) -> DecodedMap {
        let mut nibbles = vec![0u8; group_blocks as usize];
        nibbles[..GROUP_HEADER_BLOCKS as usize].fill(NIBBLE_META_ON_DISK);
        DecodedMap {
            nibbles,
            shares_present: 0,
        }
    }
}

/// Decodes and verifies group `group_index`'s map block.
pub fn decode(group_index: u64, block: &[u8]) -> Result<DecodedMap> {
    let damaged = |why: String| {
        Error::corrupt(format!(
            "allocation map of group {group_index} is damaged: {why}"
        ))
    };
    if block[MAGIC_OFFSET..MAGIC_OFFSET + 4] != GROUP_MAGIC {
        return Err(damaged("no map magic".into()));
    }
    let stored_crc = get_u32(block, CRC_OFFSET);
    let actual_crc = crc_with_hole(block, CRC_OFFSET);
    if stored_crc != actual_crc {
        return Err(damaged(format!(
            "checksum mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})"
        )));
    }
    let stored_index = get_u64(block, INDEX_OFFSET);
    if stored_index != group_index {
        return Err(damaged(format!("it is the map of group {stored_index}")));
    }
    if block[RESERVED_OFFSET..GROUP_HEADER_BYTES]
        .iter()
        .any(|&b| b != 0)
    {
        return Err(damaged("reserved bytes are not zero".into()));
    }
    let count = group_blocks(block.len() as u32) as usize;
    let nibbles: Vec<u8> = (0..count)
        .map(|i| (block[GROUP_HEADER_BYTES + i / 2] >> (4 * (i % 2))) & 0xf)
        .collect();
    // On disk a block is free (0), data (allocated) or metadata (allocated
    // and meta); the other bits live only in memory.
    if let Some(slot) = nibbles
        .iter()
        .position(|&n| !matches!(n, 0 | NIBBLE_ALLOCATED | NIBBLE_META_ON_DISK))
    {
        return Err(damaged(format!(
            "block {slot} of the group has the state {:#x}",
            nibbles[slot]
        )));
    }
    if nibbles[..GROUP_HEADER_BLOCKS as usize]
        .iter()
        .any(|&n| n != NIBBLE_META_ON_DISK)
    {
        return Err(damaged(
            "the map and share-count blocks are not marked as allocated metadata".into(),
        ));
    }
    let shares_present = block[SHARES_PRESENT_OFFSET];
    if u32::from(shares_present) >> super::shares::SHARE_BLOCKS_PER_GROUP != 0 {
        return Err(damaged(format!(
            "it names share-count block bits {shares_present:#04x}"
        )));
    }
    Ok(DecodedMap {
        nibbles,
        shares_present,
    })
}
