//! The superblock: the root of everything in the store. Two copies live in
//! blocks 0 and 1. Each commit writes the slot the previous commit did not
//! use, with a higher generation, so a torn superblock write always leaves the
//! other slot intact. Open picks the valid slot with the highest generation.

use super::{crc_with_hole, get_u32, get_u64, put_u32, put_u64, FORMAT_VERSION};
use crate::error::{Error, ErrorKind, Result};
use crate::types::{is_valid_block_size, BlockAddr, VolumeId};

/// Identifies a grove store; also catches a superblock written to the wrong place.
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"GROVESB\0";
/// Number of superblock slots (blocks 0 and 1).
pub const SUPERBLOCK_SLOTS: u64 = 2;

// Superblock layout (one slot; the rest of its block is zero):
//
//   offset size field
//   0      8    magic "GROVESB\0"
//   8      4    format_version
//   12     4    crc32c of bytes [0, SUPERBLOCK_LEN) with this field zeroed
//   16     8    generation: +1 per commit; the higher valid slot wins
//   24     4    block_size_bytes
//   28     4    reserved, zero
//   32     8    journal_start: first block of the journal region
//   40     8    journal_blocks: length of the journal region
//   48     8    data_start: first block of allocation group 0
//   56     8    group_blocks: blocks per allocation group (its map block included)
//   64     8    group_count: allocation groups that exist in the store
//   72     8    capacity_blocks: most blocks the data area may span, 0 = grow while the host has space
//   80     8    volume_table_root: block of the volume table's root node, 0 = empty table
//   88     1    volume_table_height: levels of the volume table's radix tree
//   89     7    reserved, zero
//   96     8    next_volume_id: ids are handed out in increasing order, never reused
//   104    8    journal_sequence: sequence number of the next journal record (issue 4)
//   112    8    journal_head: block offset in the journal where replay starts (issue 4)
//   120    8    created_unix_secs
//   128    16   pool_uuid: random at init; journal records carry it
//   144    8    birth_generation: the generation new mappings are born in; it
//               advances at every snapshot, clone and rollback
//   152    360  reserved, zero
//   512         end (SUPERBLOCK_LEN)
const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = MAGIC_OFFSET + 8;
const CRC_OFFSET: usize = VERSION_OFFSET + 4;
const GENERATION_OFFSET: usize = CRC_OFFSET + 4;
const BLOCK_SIZE_OFFSET: usize = GENERATION_OFFSET + 8;
const JOURNAL_START_OFFSET: usize = BLOCK_SIZE_OFFSET + 8;
const JOURNAL_BLOCKS_OFFSET: usize = JOURNAL_START_OFFSET + 8;
const DATA_START_OFFSET: usize = JOURNAL_BLOCKS_OFFSET + 8;
const GROUP_BLOCKS_OFFSET: usize = DATA_START_OFFSET + 8;
const GROUP_COUNT_OFFSET: usize = GROUP_BLOCKS_OFFSET + 8;
const CAPACITY_BLOCKS_OFFSET: usize = GROUP_COUNT_OFFSET + 8;
const VOLUME_TABLE_ROOT_OFFSET: usize = CAPACITY_BLOCKS_OFFSET + 8;
const VOLUME_TABLE_HEIGHT_OFFSET: usize = VOLUME_TABLE_ROOT_OFFSET + 8;
const NEXT_VOLUME_ID_OFFSET: usize = VOLUME_TABLE_HEIGHT_OFFSET + 8;
const JOURNAL_SEQUENCE_OFFSET: usize = NEXT_VOLUME_ID_OFFSET + 8;
const JOURNAL_HEAD_OFFSET: usize = JOURNAL_SEQUENCE_OFFSET + 8;
const CREATED_OFFSET: usize = JOURNAL_HEAD_OFFSET + 8;
const UUID_OFFSET: usize = CREATED_OFFSET + 8;
const BIRTH_GENERATION_OFFSET: usize = UUID_OFFSET + 16;
const RESERVED_OFFSET: usize = BIRTH_GENERATION_OFFSET + 8;
/// Smallest journal region: room for a few transactions of a few blocks.
/// A superblock naming a smaller one is damage; `pool` refuses to make one.
pub const JOURNAL_REGION_BLOCKS_MIN: u64 = 32;
/// Largest journal region a superblock may name: 1 GiB at 4 KiB blocks.
/// A larger number is damage, not a choice grove ever makes.
pub const JOURNAL_BLOCKS_MAX: u64 = 1 << 18;
/// Bytes of a superblock slot that carry data; the smallest block size (1 KiB)
/// holds it with room to spare.
pub const SUPERBLOCK_LEN: usize = 512;
/// Sequence numbers a superblock's journal_sequence must leave before u64
/// wraps. Going from 0 to the bound at a million commits a second takes
/// over 500,000 years, so a sequence that leaves less is damage or a
/// crafted store; and after one that leaves more, `sequence + 1` cannot
/// wrap within 2,000 years of commits at that rate, in one run.
pub const JOURNAL_SEQUENCE_HEADROOM: u64 = 1 << 56;
/// Largest journal_sequence a superblock may carry when it is read.
pub const JOURNAL_SEQUENCE_MAX: u64 = u64::MAX - JOURNAL_SEQUENCE_HEADROOM;
/// Largest next_volume_id a superblock may carry when it is read. The
/// volume table addresses 2^58 ids within its tallest allowed tree at the
/// smallest block size (2^56 record blocks of 4 records), so ids below this
/// never make it too tall; and no pool creates 2^48 volumes, so the next id
/// cannot wrap either.
pub const NEXT_VOLUME_ID_MAX: u64 = 1 << 48;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub generation: u64,
    pub block_size_bytes: u32,
    pub journal_start: BlockAddr,
    pub journal_blocks: u64,
    pub data_start: BlockAddr,
    pub group_blocks: u64,
    pub group_count: u64,
    pub capacity_blocks: u64,
    pub volume_table_root: BlockAddr,
    pub volume_table_height: u8,
    pub next_volume_id: VolumeId,
    pub journal_sequence: u64,
    pub journal_head: u64,
    pub created_unix_secs: u64,
    pub pool_uuid: [u8; 16],
    pub birth_generation: u64,
}

/// Why one superblock slot could not be used. Open reports these only when
/// neither slot is usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotProblem {
    /// No magic: never written, or not a grove store at all.
    NoMagic,
    /// Written by a newer grove.
    NewerVersion(u32),
    /// Written by an older grove, in a format this one no longer reads.
    OlderVersion(u32),
    /// Magic present but the checksum is wrong (a torn write, or damage).
    Damaged(String),
    /// The checksum is right but a field is impossible for this store: no
    /// torn write makes one, so open refuses the store instead of falling
    /// back to the other slot. Says which field, its value and the bound.
    Invalid(String),
}

impl Superblock {
    /// The slot this superblock is written to: generations alternate slots.
    pub fn slot(&self) -> u64 {
        self.generation % SUPERBLOCK_SLOTS
    }

    pub fn encode(&self) -> [u8; SUPERBLOCK_LEN] {
        self.assert_valid();
        let mut bytes = [0u8; SUPERBLOCK_LEN];
        bytes[MAGIC_OFFSET..MAGIC_OFFSET + 8].copy_from_slice(&SUPERBLOCK_MAGIC);
        put_u32(&mut bytes, VERSION_OFFSET, FORMAT_VERSION);
        put_u64(&mut bytes, GENERATION_OFFSET, self.generation);
        put_u32(&mut bytes, BLOCK_SIZE_OFFSET, self.block_size_bytes);
        put_u64(&mut bytes, JOURNAL_START_OFFSET, self.journal_start.0);
        put_u64(&mut bytes, JOURNAL_BLOCKS_OFFSET, self.journal_blocks);
        put_u64(&mut bytes, DATA_START_OFFSET, self.data_start.0);
        put_u64(&mut bytes, GROUP_BLOCKS_OFFSET, self.group_blocks);
        put_u64(&mut bytes, GROUP_COUNT_OFFSET, self.group_count);
        put_u64(&mut bytes, CAPACITY_BLOCKS_OFFSET, self.capacity_blocks);
        put_u64(
            &mut bytes,
            VOLUME_TABLE_ROOT_OFFSET,
            self.volume_table_root.0,
        );
        bytes[VOLUME_TABLE_HEIGHT_OFFSET] = self.volume_table_height;
        put_u64(&mut bytes, NEXT_VOLUME_ID_OFFSET, self.next_volume_id.0);
        put_u64(&mut bytes, JOURNAL_SEQUENCE_OFFSET, self.journal_sequence);
        put_u64(&mut bytes, JOURNAL_HEAD_OFFSET, self.journal_head);
        put_u64(&mut bytes, CREATED_OFFSET, self.created_unix_secs);
        bytes[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(&self.pool_uuid);
        put_u64(&mut bytes, BIRTH_GENERATION_OFFSET, self.birth_generation);
        let crc = crc_with_hole(&bytes, CRC_OFFSET);
        put_u32(&mut bytes, CRC_OFFSET, crc);
        bytes
    }

    /// Decodes one slot. `bytes` is at least SUPERBLOCK_LEN long.
    pub fn decode(bytes: &[u8]) -> Result<Superblock, SlotProblem> {
        let bytes = &bytes[..SUPERBLOCK_LEN];
        check_header(bytes)?;
        let superblock = Superblock::read_fields(bytes);
        superblock.check_fields().map_err(SlotProblem::Invalid)?;
        superblock
            .check_counters_when_read()
            .map_err(SlotProblem::Invalid)?;
        let reserved = [
            BLOCK_SIZE_OFFSET + 4..JOURNAL_START_OFFSET,
            VOLUME_TABLE_HEIGHT_OFFSET + 1..NEXT_VOLUME_ID_OFFSET,
            RESERVED_OFFSET..SUPERBLOCK_LEN,
        ];
        if reserved
            .iter()
            .any(|range| bytes[range.clone()].iter().any(|&b| b != 0))
        {
            return Err(SlotProblem::Invalid("reserved bytes are not zero".into()));
        }
        Ok(superblock)
    }

    /// Every field of a slot whose header `check_header` accepted, unchecked.
    fn read_fields(bytes: &[u8]) -> Superblock {
        let mut pool_uuid = [0u8; 16];
        pool_uuid.copy_from_slice(&bytes[UUID_OFFSET..UUID_OFFSET + 16]);
        Superblock {
            generation: get_u64(bytes, GENERATION_OFFSET),
            block_size_bytes: get_u32(bytes, BLOCK_SIZE_OFFSET),
            journal_start: BlockAddr(get_u64(bytes, JOURNAL_START_OFFSET)),
            journal_blocks: get_u64(bytes, JOURNAL_BLOCKS_OFFSET),
            data_start: BlockAddr(get_u64(bytes, DATA_START_OFFSET)),
            group_blocks: get_u64(bytes, GROUP_BLOCKS_OFFSET),
            group_count: get_u64(bytes, GROUP_COUNT_OFFSET),
            capacity_blocks: get_u64(bytes, CAPACITY_BLOCKS_OFFSET),
            volume_table_root: BlockAddr(get_u64(bytes, VOLUME_TABLE_ROOT_OFFSET)),
            volume_table_height: bytes[VOLUME_TABLE_HEIGHT_OFFSET],
            next_volume_id: VolumeId(get_u64(bytes, NEXT_VOLUME_ID_OFFSET)),
            journal_sequence: get_u64(bytes, JOURNAL_SEQUENCE_OFFSET),
            journal_head: get_u64(bytes, JOURNAL_HEAD_OFFSET),
            created_unix_secs: get_u64(bytes, CREATED_OFFSET),
            pool_uuid,
            birth_generation: get_u64(bytes, BIRTH_GENERATION_OFFSET),
        }
    }

    /// Counters checked when read, not when written: a pool that got past
    /// these by committing would have run for half a million years.
    fn check_counters_when_read(&self) -> Result<(), String> {
        if self.next_volume_id.0 > NEXT_VOLUME_ID_MAX {
            return Err(format!(
                "next_volume_id {} is past {NEXT_VOLUME_ID_MAX}, more ids than the volume table can hold",
                self.next_volume_id.0
            ));
        }
        if self.journal_sequence > JOURNAL_SEQUENCE_MAX {
            return Err(format!(
                "journal_sequence {} is past {JOURNAL_SEQUENCE_MAX}, too close to 2^64 for the journal to number its transactions",
                self.journal_sequence
            ));
        }
        Ok(())
    }

    /// Structural checks shared by the encoder (as assertions) and the
    /// decoder (as errors): the checksum alone cannot catch a bug that wrote
    /// a well-checksummed but impossible superblock. The steps run in this
    /// order so that a slot with several bad fields names the same one first.
    fn check_fields(&self) -> Result<(), String> {
        self.check_region_sizes()?;
        self.check_counter_limits()?;
        self.check_journal_place()?;
        self.check_groups_fit_capacity()?;
        self.check_volume_table()
    }

    /// Block size, journal length, group count and capacity within what
    /// the format can address.
    fn check_region_sizes(&self) -> Result<(), String> {
        if !is_valid_block_size(self.block_size_bytes) {
            return Err(format!(
                "block_size_bytes {} is not a power of two from 1 KiB to 64 KiB",
                self.block_size_bytes
            ));
        }
        if !(JOURNAL_REGION_BLOCKS_MIN..=JOURNAL_BLOCKS_MAX).contains(&self.journal_blocks) {
            return Err(format!(
                "journal_blocks {} is outside {}..={JOURNAL_BLOCKS_MAX}",
                self.journal_blocks, JOURNAL_REGION_BLOCKS_MIN
            ));
        }
        // Every block address must fit a radix-tree entry.
        let groups_max = (super::node::ENTRY_ADDR_MASK
            - self.data_start.0.min(super::node::ENTRY_ADDR_MASK))
            / self.group_blocks.max(1);
        if self.group_count > groups_max {
            return Err(format!(
                "group_count {} is past {groups_max}, the most whose blocks an address can name",
                self.group_count
            ));
        }
        if self.group_count == 0 {
            return Err("group_count 0 is below 1: a store has at least one group".into());
        }
        if self.capacity_blocks > super::node::ENTRY_ADDR_MASK {
            return Err(format!(
                "capacity_blocks {} is past {}, the largest address",
                self.capacity_blocks,
                super::node::ENTRY_ADDR_MASK
            ));
        }
        Ok(())
    }

    /// Tree height, birth generation and journal sequence within the
    /// values their encodings hold.
    fn check_counter_limits(&self) -> Result<(), String> {
        if self.volume_table_height >= super::node::NODE_LEVELS_MAX {
            return Err(format!(
                "volume_table_height {} is not below {}",
                self.volume_table_height,
                super::node::NODE_LEVELS_MAX
            ));
        }
        if self.birth_generation > super::node::BIRTH_GENERATION_MAX {
            return Err(format!(
                "birth_generation {} is past {}",
                self.birth_generation,
                super::node::BIRTH_GENERATION_MAX
            ));
        }
        if self.journal_sequence == u64::MAX {
            return Err(format!(
                "journal_sequence {} leaves no sequence for the next transaction",
                self.journal_sequence
            ));
        }
        Ok(())
    }

    /// The journal right after the superblocks, the data right after the
    /// journal, and groups as long as the block size makes them.
    fn check_journal_place(&self) -> Result<(), String> {
        // (A head equal to journal_blocks is where a transaction that ends
        // at the region's end leaves the write position.)
        if self.journal_head > self.journal_blocks {
            return Err(format!(
                "journal_head {} is past the journal's {} blocks",
                self.journal_head, self.journal_blocks
            ));
        }
        if self.journal_start.0 != SUPERBLOCK_SLOTS {
            return Err(format!(
                "journal_start {} is not {SUPERBLOCK_SLOTS}, the block after the superblocks",
                self.journal_start.0
            ));
        }
        if self.data_start.0 != self.journal_start.0 + self.journal_blocks {
            return Err(format!(
                "data_start {} is not {}, the block after the journal",
                self.data_start.0,
                self.journal_start.0 + self.journal_blocks
            ));
        }
        let group_blocks = super::group::group_blocks(self.block_size_bytes);
        if self.group_blocks != group_blocks {
            return Err(format!(
                "group_blocks {} is not {group_blocks}, what {}-byte blocks give",
                self.group_blocks, self.block_size_bytes
            ));
        }
        Ok(())
    }

    /// A set capacity holds every group, and the last group whole.
    fn check_groups_fit_capacity(&self) -> Result<(), String> {
        if self.capacity_blocks == 0 {
            return Ok(());
        }
        if self.group_count > self.capacity_blocks.div_ceil(self.group_blocks) {
            return Err(format!(
                "group_count {} is past {}, the groups capacity_blocks {} holds",
                self.group_count,
                self.capacity_blocks.div_ceil(self.group_blocks),
                self.capacity_blocks
            ));
        }
        // The last group must hold its own blocks and one more:
        // a group is only ever added with room for that.
        let needed =
            (self.group_count - 1) * self.group_blocks + super::group::GROUP_HEADER_BLOCKS + 1;
        if self.capacity_blocks < needed {
            return Err(format!(
                "capacity_blocks {} is below {needed}, what its {} groups occupy",
                self.capacity_blocks, self.group_count
            ));
        }
        Ok(())
    }

    /// The next volume id and the volume table's root and height agree,
    /// and the root lies in the data area.
    fn check_volume_table(&self) -> Result<(), String> {
        if self.next_volume_id.0 == 0 {
            return Err("next_volume_id is 0".into());
        }
        if self.volume_table_root.is_none() != (self.volume_table_height == 0) {
            return Err(format!(
                "volume_table_root {} and volume_table_height {} disagree",
                self.volume_table_root.0, self.volume_table_height
            ));
        }
        // (Whether it is one of a group's own blocks is checked at open,
        // with the allocator: `check_root`.)
        if !self.volume_table_root.is_none()
            && (self.volume_table_root.0 < self.data_start.0
                || self.volume_table_root.0 >= self.store_blocks())
        {
            return Err(format!(
                "volume_table_root {} is outside the data area {}..{}",
                self.volume_table_root.0,
                self.data_start.0,
                self.store_blocks()
            ));
        }
        Ok(())
    }

    fn assert_valid(&self) {
        if let Err(problem) = self.check_fields() {
            panic!("encoding an invalid superblock: {problem}");
        }
    }

    /// Total blocks the store spans.
    pub fn store_blocks(&self) -> u64 {
        self.data_start.0 + self.group_count * self.group_blocks
    }

    /// Blocks the store file must hold: its groups, but no further than the
    /// capacity reaches (a group of 64 KiB blocks spans 8 GiB, and a pool
    /// with a smaller capacity never uses the rest).
    pub fn device_blocks(&self) -> u64 {
        device_blocks(
            self.data_start.0,
            self.group_count * self.group_blocks,
            self.capacity_blocks,
        )
    }
}

/// Magic, version and checksum of one slot, in that order: the version is
/// checked before the checksum, because a newer format may checksum
/// differently and "upgrade grove" is the useful answer.
fn check_header(bytes: &[u8]) -> Result<(), SlotProblem> {
    if bytes[MAGIC_OFFSET..MAGIC_OFFSET + 8] != SUPERBLOCK_MAGIC {
        return Err(SlotProblem::NoMagic);
    }
    let version = get_u32(bytes, VERSION_OFFSET);
    if version > FORMAT_VERSION {
        return Err(SlotProblem::NewerVersion(version));
    }
    if (1..FORMAT_VERSION).contains(&version) {
        return Err(SlotProblem::OlderVersion(version));
    }
    let stored_crc = get_u32(bytes, CRC_OFFSET);
    let actual_crc = crc_with_hole(bytes, CRC_OFFSET);
    if stored_crc != actual_crc {
        return Err(SlotProblem::Damaged(format!(
            "checksum mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})"
        )));
    }
    if version == 0 {
        return Err(SlotProblem::Invalid("format_version is 0".into()));
    }
    Ok(())
}

/// Picks the newest valid slot, or explains why neither is usable.
pub fn choose_slot(slots: [Result<Superblock, SlotProblem>; 2], what: &str) -> Result<Superblock> {
    // A slot that passes its checksum but not the field checks was written
    // that way (a bug or a crafted store, not a torn write): falling back
    // to the other slot would hide it and roll the pool back.
    for (index, slot) in slots.iter().enumerate() {
        if let Err(SlotProblem::Invalid(why)) = slot {
            return Err(Error::corrupt(format!(
                "{what}: superblock slot {index} passes its checksum but {why}; refusing to open it"
            )));
        }
    }
    let mut best: Option<Superblock> = None;
    for superblock in slots.iter().flatten() {
        if best
            .as_ref()
            .is_none_or(|b| superblock.generation > b.generation)
        {
            best = Some(superblock.clone());
        }
    }
    if let Some(best) = best {
        return Ok(best);
    }
    for slot in &slots {
        if let Err(SlotProblem::NewerVersion(version)) = slot {
            return Err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "{what} uses on-disk format version {version}, but this grove supports up to version {FORMAT_VERSION}; upgrade grove to open it"
                ),
            ));
        }
    }
    for slot in &slots {
        if let Err(SlotProblem::OlderVersion(version)) = slot {
            return Err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "{what} uses on-disk format version {version}, which this grove no longer opens (it writes version {FORMAT_VERSION}); export the volumes with the grove that made it and import them into a new pool"
                ),
            ));
        }
    }
    match &slots {
        [Err(SlotProblem::NoMagic), Err(SlotProblem::NoMagic)] => Err(Error::new(
            ErrorKind::NotAPool,
            format!("{what} is not a grove store (no superblock)"),
        )),
        [a, b] => Err(Error::corrupt(format!(
            "{what}: both superblocks are damaged (slot 0: {}; slot 1: {})",
            describe(a),
            describe(b)
        ))),
    }
}

fn describe(slot: &Result<Superblock, SlotProblem>) -> String {
    match slot {
        Ok(_) => "valid".into(),
        Err(SlotProblem::NoMagic) => "no magic".into(),
        Err(SlotProblem::NewerVersion(v)) | Err(SlotProblem::OlderVersion(v)) => {
            format!("format version {v}")
        }
        Err(SlotProblem::Damaged(why)) | Err(SlotProblem::Invalid(why)) => why.clone(),
    }
}

/// See `Superblock::device_blocks`.
pub fn device_blocks(data_start: u64, group_span_blocks: u64, capacity_blocks: u64) -> u64 {
    match capacity_blocks {
        0 => data_start + group_span_blocks,
        capacity => data_start + group_span_blocks.min(capacity),
    }
}
