//! Journal transactions. The journal is a circular region of blocks after
//! the superblocks. One commit writes one transaction, contiguously: a
//! descriptor (one or more blocks) followed by the full images of the
//! metadata blocks it changes. Allocations and frees ride in the descriptor
//! as extents; the allocation maps themselves are only written at checkpoint
//! (ddsnap's trick), so a commit writes no map blocks.

use super::{get_u32, get_u64, put_u32, put_u64};
use crate::types::{BlockAddr, VolumeId};

/// Identifies a transaction descriptor.
pub const JOURNAL_MAGIC: [u8; 4] = *b"GRVJ";

// Descriptor layout (a byte stream over descriptor_blocks whole blocks; the
// bytes after the extents are zero):
//
//   offset size field
//   0      4    magic "GRVJ"
//   4      4    crc32c of descriptor_blocks whole blocks with this field zeroed
//   8      8    sequence: the superblock's journal_sequence, +1 per transaction
//   16     16   pool_uuid: a transaction from another pool's store never replays
//   32     4    descriptor_blocks
//   36     4    image_count: metadata block images that follow the descriptor
//   40     4    extent_count: allocation extents after the home addresses
//   44     4    images_crc: crc32c of all images, in order; catches a torn transaction
//   48     8    volume_table_root after this transaction
//   56     1    volume_table_height after this transaction
//   57     7    reserved, zero
//   64     8    next_volume_id after this transaction
//   72     8    group_count after this transaction
//   80     8    birth_generation after this transaction
//   88     4    share_run_count: share-count runs after the extents
//   92     4    reserved, zero
//   96     8*image_count   home block address of each image, in order
//   then   16*extent_count allocation extents:
//                 0  8  first block
//                 8  4  block count
//                 12 1  change: 1 = allocated as data, 2 = allocated as metadata, 3 = freed
//                 13 3  reserved, zero
//   then   16*share_run_count share-count runs: blocks whose extra references
//          are now `extra` (an absolute value, so replaying twice is harmless):
//                 0  8  first block
//                 8  4  block count
//                 12 4  extra references of each of them
const MAGIC_OFFSET: usize = 0;
const CRC_OFFSET: usize = MAGIC_OFFSET + 4;
const SEQUENCE_OFFSET: usize = CRC_OFFSET + 4;
const UUID_OFFSET: usize = SEQUENCE_OFFSET + 8;
const DESCRIPTOR_BLOCKS_OFFSET: usize = UUID_OFFSET + 16;
const IMAGE_COUNT_OFFSET: usize = DESCRIPTOR_BLOCKS_OFFSET + 4;
const EXTENT_COUNT_OFFSET: usize = IMAGE_COUNT_OFFSET + 4;
const IMAGES_CRC_OFFSET: usize = EXTENT_COUNT_OFFSET + 4;
const VT_ROOT_OFFSET: usize = IMAGES_CRC_OFFSET + 4;
const VT_HEIGHT_OFFSET: usize = VT_ROOT_OFFSET + 8;
const NEXT_VOLUME_ID_OFFSET: usize = VT_HEIGHT_OFFSET + 8;
const GROUP_COUNT_OFFSET: usize = NEXT_VOLUME_ID_OFFSET + 8;
const BIRTH_GENERATION_OFFSET: usize = GROUP_COUNT_OFFSET + 8;
const SHARE_RUN_COUNT_OFFSET: usize = BIRTH_GENERATION_OFFSET + 8;
const HOMES_OFFSET: usize = SHARE_RUN_COUNT_OFFSET + 8;
const HOME_BYTES: usize = 8;
const EXTENT_BYTES: usize = 16;
/// Bytes of one share-count run.
pub const SHARE_RUN_BYTES: usize = 16;

/// Blocks `first .. first + count` now have `extra` extra references each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareRun {
    pub first: BlockAddr,
    pub count: u32,
    pub extra: u32,
}

/// How an extent of blocks changed in a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocChange {
    AllocatedData = 1,
    AllocatedMeta = 2,
    Freed = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocExtent {
    pub first: BlockAddr,
    pub count: u32,
    pub change: AllocChange,
}

/// The roots a transaction leaves behind: what the superblock would say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Roots {
    pub volume_table_root: BlockAddr,
    pub volume_table_height: u8,
    pub next_volume_id: VolumeId,
    pub group_count: u64,
    /// The generation new mappings are born in.
    pub birth_generation: u64,
}

/// A decoded descriptor (the images are read separately).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub sequence: u64,
    pub pool_uuid: [u8; 16],
    pub descriptor_blocks: u32,
    pub images_crc: u32,
    pub roots: Roots,
    pub homes: Vec<BlockAddr>,
    pub extents: Vec<AllocExtent>,
    pub share_runs: Vec<ShareRun>,
}

impl Descriptor {
    /// Bytes the descriptor needs before padding to whole blocks.
    pub fn encoded_len(image_count: usize, extent_count: usize, share_run_count: usize) -> usize {
        HOMES_OFFSET
            + image_count * HOME_BYTES
            + extent_count * EXTENT_BYTES
            + share_run_count * SHARE_RUN_BYTES
    }

    /// Encodes into `descriptor_blocks` whole blocks.
    pub fn encode(&self, block_size_bytes: usize) -> Vec<u8> {
        let len = Self::encoded_len(self.homes.len(), self.extents.len(), self.share_runs.len());
        assert_eq!(
            len.div_ceil(block_size_bytes),
            self.descriptor_blocks as usize
        );
        assert!(self.roots.next_volume_id.0 > 0);
        let mut bytes = vec![0u8; self.descriptor_blocks as usize * block_size_bytes];
        bytes[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&JOURNAL_MAGIC);
        put_u64(&mut bytes, SEQUENCE_OFFSET, self.sequence);
        bytes[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(&self.pool_uuid);
        put_u32(&mut bytes, DESCRIPTOR_BLOCKS_OFFSET, self.descriptor_blocks);
        put_u32(&mut bytes, IMAGE_COUNT_OFFSET, self.homes.len() as u32);
        put_u32(&mut bytes, EXTENT_COUNT_OFFSET, self.extents.len() as u32);
        put_u32(&mut bytes, IMAGES_CRC_OFFSET, self.images_crc);
        put_u64(&mut bytes, VT_ROOT_OFFSET, self.roots.volume_table_root.0);
        bytes[VT_HEIGHT_OFFSET] = self.roots.volume_table_height;
        put_u64(
            &mut bytes,
            NEXT_VOLUME_ID_OFFSET,
            self.roots.next_volume_id.0,
        );
        put_u64(&mut bytes, GROUP_COUNT_OFFSET, self.roots.group_count);
        put_u64(
            &mut bytes,
            BIRTH_GENERATION_OFFSET,
            self.roots.birth_generation,
        );
        put_u32(
            &mut bytes,
            SHARE_RUN_COUNT_OFFSET,
            self.share_runs.len() as u32,
        );
        let mut offset = HOMES_OFFSET;
        for home in &self.homes {
            assert!(!home.is_none());
            put_u64(&mut bytes, offset, home.0);
            offset += HOME_BYTES;
        }
        for extent in &self.extents {
            assert!(extent.count > 0);
            put_u64(&mut bytes, offset, extent.first.0);
            put_u32(&mut bytes, offset + 8, extent.count);
            bytes[offset + 12] = extent.change as u8;
            offset += EXTENT_BYTES;
        }
        for run in &self.share_runs {
            assert!(run.count > 0);
            put_u64(&mut bytes, offset, run.first.0);
            put_u32(&mut bytes, offset + 8, run.count);
            put_u32(&mut bytes, offset + 12, run.extra);
            offset += SHARE_RUN_BYTES;
        }
        let crc = super::crc_with_hole(&bytes, CRC_OFFSET);
        put_u32(&mut bytes, CRC_OFFSET, crc);
        bytes
    }

    /// Reads the descriptor's first block: how many blocks the whole
    /// descriptor spans, if the block looks like a descriptor of `sequence`.
    /// A wrong magic or sequence is the normal end of the journal, not damage.
    pub fn peek_blocks(first_block: &[u8], sequence: u64, pool_uuid: &[u8; 16]) -> Option<u32> {
        if first_block[MAGIC_OFFSET..MAGIC_OFFSET + 4] != JOURNAL_MAGIC
            || get_u64(first_block, SEQUENCE_OFFSET) != sequence
            || first_block[UUID_OFFSET..UUID_OFFSET + 16] != pool_uuid[..]
        {
            return None;
        }
        let blocks = get_u32(first_block, DESCRIPTOR_BLOCKS_OFFSET);
        (blocks > 0).then_some(blocks)
    }

    /// Decodes and verifies a whole descriptor. None means "not a valid
    /// transaction here": replay stops at it. (`decode_checked` tells a
    /// torn descriptor from a well-checksummed impossible one.)
    pub fn decode(
        bytes: &[u8],
        sequence: u64,
        pool_uuid: &[u8; 16],
        block_size_bytes: usize,
    ) -> Option<Descriptor> {
        Self::decode_checked(bytes, sequence, pool_uuid, block_size_bytes)
            .ok()
            .flatten()
    }

    /// Decodes and verifies a whole descriptor. Ok(None) means "not a
    /// transaction of `sequence` here": another magic, sequence or pool, or
    /// a checksum that does not match, which is what a torn write leaves
    /// (the normal end of the journal after a crash). Err says why a
    /// descriptor that passes its checksum is impossible: no crash makes
    /// one, and replay refuses it rather than drop it and what follows.
    pub fn decode_checked(
        bytes: &[u8],
        sequence: u64,
        pool_uuid: &[u8; 16],
        block_size_bytes: usize,
    ) -> Result<Option<Descriptor>, String> {
        let Some(blocks) = Self::peek_blocks(bytes, sequence, pool_uuid) else {
            return Ok(None);
        };
        let blocks = blocks as usize;
        if bytes.len() != blocks * block_size_bytes {
            return Ok(None);
        }
        if get_u32(bytes, CRC_OFFSET) != super::crc_with_hole(bytes, CRC_OFFSET) {
            return Ok(None);
        }
        let image_count = get_u32(bytes, IMAGE_COUNT_OFFSET) as usize;
        let extent_count = get_u32(bytes, EXTENT_COUNT_OFFSET) as usize;
        let share_run_count = get_u32(bytes, SHARE_RUN_COUNT_OFFSET) as usize;
        let needed_blocks = Self::encoded_len(image_count, extent_count, share_run_count)
            .div_ceil(block_size_bytes);
        if needed_blocks != blocks {
            return Err(format!(
                "image_count {image_count}, extent_count {extent_count} and share_run_count {share_run_count} need {needed_blocks} descriptor blocks, not descriptor_blocks {blocks}"
            ));
        }
        if get_u32(bytes, SHARE_RUN_COUNT_OFFSET + 4) != 0
            || bytes[VT_HEIGHT_OFFSET + 1..NEXT_VOLUME_ID_OFFSET]
                .iter()
                .any(|&b| b != 0)
        {
            return Err("its reserved bytes are not zero".into());
        }
        let mut pool = [0u8; 16];
        pool.copy_from_slice(&bytes[UUID_OFFSET..UUID_OFFSET + 16]);
        let (homes, extents, share_runs) =
            decode_lists(bytes, image_count, extent_count, share_run_count)?;
        let roots = decode_roots(bytes)?;
        Ok(Some(Descriptor {
            sequence,
            pool_uuid: pool,
            descriptor_blocks: blocks as u32,
            images_crc: get_u32(bytes, IMAGES_CRC_OFFSET),
            roots,
            homes,
            extents,
            share_runs,
        }))
    }
}

/// A descriptor's homes, extents and share runs.
type DescriptorLists = (Vec<BlockAddr>, Vec<AllocExtent>, Vec<ShareRun>);

/// A descriptor's homes, extents and share runs, laid one after the other
/// from HOMES_OFFSET, with nothing but zeros after the last; `bytes` was
/// checked long enough for the counts.
fn decode_lists(
    bytes: &[u8],
    image_count: usize,
    extent_count: usize,
    share_run_count: usize,
) -> Result<DescriptorLists, String> {
    let mut offset = HOMES_OFFSET;
    let mut homes = Vec::with_capacity(image_count);
    for index in 0..image_count {
        let home = BlockAddr(get_u64(bytes, offset));
        if home.is_none() {
            return Err(format!("home {index} is block 0"));
        }
        homes.push(home);
        offset += HOME_BYTES;
    }
    let mut extents = Vec::with_capacity(extent_count);
    for index in 0..extent_count {
        let extent = decode_extent(&bytes[offset..offset + EXTENT_BYTES])
            .map_err(|why| format!("extent {index}: {why}"))?;
        extents.push(extent);
        offset += EXTENT_BYTES;
    }
    let mut share_runs = Vec::with_capacity(share_run_count);
    for index in 0..share_run_count {
        let run = decode_share_run(&bytes[offset..offset + SHARE_RUN_BYTES])
            .map_err(|why| format!("share run {index}: {why}"))?;
        share_runs.push(run);
        offset += SHARE_RUN_BYTES;
    }
    // The layout says the rest is zero: anything else is damage.
    if bytes[offset..].iter().any(|&b| b != 0) {
        return Err("bytes after its last share run are not zero".into());
    }
    Ok((homes, extents, share_runs))
}

/// One allocation extent of a descriptor, or why it is impossible.
fn decode_extent(bytes: &[u8]) -> Result<AllocExtent, String> {
    let change = match bytes[12] {
        1 => AllocChange::AllocatedData,
        2 => AllocChange::AllocatedMeta,
        3 => AllocChange::Freed,
        other => return Err(format!("change {other} is none of 1, 2 and 3")),
    };
    let count = get_u32(bytes, 8);
    if count == 0 {
        return Err("count 0".into());
    }
    if bytes[13..16].iter().any(|&b| b != 0) {
        return Err("reserved bytes are not zero".into());
    }
    Ok(AllocExtent {
        first: BlockAddr(get_u64(bytes, 0)),
        count,
        change,
    })
}

/// One share-count run of a descriptor, or why it is impossible.
fn decode_share_run(bytes: &[u8]) -> Result<ShareRun, String> {
    let count = get_u32(bytes, 8);
    if count == 0 {
        return Err("count 0".into());
    }
    Ok(ShareRun {
        first: BlockAddr(get_u64(bytes, 0)),
        count,
        extra: get_u32(bytes, 12),
    })
}

/// The roots a descriptor carries. Roots a superblock could not hold would
/// fail at the next checkpoint: they are refused here, where they are read.
fn decode_roots(bytes: &[u8]) -> Result<Roots, String> {
    let roots = Roots {
        volume_table_root: BlockAddr(get_u64(bytes, VT_ROOT_OFFSET)),
        volume_table_height: bytes[VT_HEIGHT_OFFSET],
        next_volume_id: VolumeId(get_u64(bytes, NEXT_VOLUME_ID_OFFSET)),
        group_count: get_u64(bytes, GROUP_COUNT_OFFSET),
        birth_generation: get_u64(bytes, BIRTH_GENERATION_OFFSET),
    };
    if roots.next_volume_id.0 == 0 {
        return Err("next_volume_id is 0".into());
    }
    if roots.volume_table_height >= super::node::NODE_LEVELS_MAX {
        return Err(format!(
            "volume_table_height {} is not below {}",
            roots.volume_table_height,
            super::node::NODE_LEVELS_MAX
        ));
    }
    if roots.volume_table_root.is_none() != (roots.volume_table_height == 0) {
        return Err(format!(
            "volume_table_root {} and volume_table_height {} disagree",
            roots.volume_table_root, roots.volume_table_height
        ));
    }
    if roots.birth_generation > super::node::BIRTH_GENERATION_MAX {
        return Err(format!(
            "birth_generation {} is past {}",
            roots.birth_generation,
            super::node::BIRTH_GENERATION_MAX
        ));
    }
    Ok(roots)
}
