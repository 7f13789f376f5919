//! Volume records: the persistent description of one volume. The volume
//! table is a radix tree indexed by volume id whose leaves are record blocks;
//! the record of volume `id` is slot `id % records_per_block` of record block
//! `id / records_per_block`.

use super::{crc_with_hole, get_u32, get_u64, put_u32, put_u64};
use crate::error::{Error, Result};
use crate::types::{BlockAddr, VolumeId, VOLUME_NAME_MAX_BYTES, VOLUME_SIZE_MAX_BYTES};

/// Bytes per record; a 1 KiB block holds 4, a 4 KiB block 16.
pub const RECORD_BYTES: usize = 256;
/// Identifies a live record.
pub const RECORD_MAGIC: [u8; 4] = *b"GRVR";

/// How a volume came to be, which also fixes whether it is writable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeKind {
    /// Created empty with `grove create`; writable.
    Volume = 1,
    /// Read-only snapshot of another volume.
    Snapshot = 2,
    /// Writable snapshot of another volume.
    Clone = 3,
}

impl VolumeKind {
    pub fn is_writable(self) -> bool {
        self != VolumeKind::Snapshot
    }

    pub fn as_str(self) -> &'static str {
        match self {
            VolumeKind::Volume => "volume",
            VolumeKind::Snapshot => "snapshot",
            VolumeKind::Clone => "clone",
        }
    }
}

// Volume record layout (RECORD_BYTES = 256; an all-zero record is an empty slot):
//
//   offset size field
//   0      4    magic "GRVR"
//   4      4    crc32c of the 256 bytes with this field zeroed
//   8      8    volume id (never 0 in a live record)
//   16     8    parent id: the volume this one was snapshotted or cloned from, 0 = none
//   24     8    size_bytes: a multiple of 512
//   32     8    root: block of the radix tree's root node; 0 only in a removed
//               record whose tree is all given back
//   40     1    height: levels in the radix tree (1 = the root points at data)
//   41     1    kind: 1 = volume, 2 = snapshot (read-only), 3 = clone
//   42     1    name_len
//   43     1    flags: bit 0 = removed (its tree, if any, is being given back;
//               kept while it has children, or as a bookmark to diff from);
//               bit 1 = receiving (a partial `grove receive`: live but hidden,
//               its name reserved); bit 2 = cursor (a replication cursor: a
//               removed snapshot record kept whatever rm and retention do,
//               named after its target); bit 3 = hold (a hold on the
//               snapshot whose GUID it carries, named after its tag: a
//               removed snapshot record with no tree, like a cursor)
//   44     1    rank: 0 = none; else the retention level the snapshot was
//               taken or later ranked at (1 = lowest; see grove-retention)
//   45     3    reserved, zero
//   48     8    created_unix_secs
//   56     8    referenced_blocks: data blocks this volume maps
//   64     8    created_generation: the pool's birth generation when it was made;
//               for a snapshot, everything born after it is newer than it
//   72     8    share_floor_generation: the newest generation in which a
//               snapshot, clone or rollback shared this tree; a data block
//               born no later is never written in place
//   80     8    written_base_generation: `written` counts data born after it
//   88     8    receive progress: with the receiving flag, bytes of the target
//               applied so far (durable with the commit that wrote them);
//               otherwise zero
//   96     128  name, UTF-8, name_len bytes, zero padded
//   224    16   guid: random, unique across pools (replication will name volumes by it)
//   240    8    hold lease: with the hold flag, the Unix time the hold ends
//               by itself; 0 = held until released. Otherwise zero
//   248    8    reserved, zero
const MAGIC_OFFSET: usize = 0;
const CRC_OFFSET: usize = MAGIC_OFFSET + 4;
const ID_OFFSET: usize = CRC_OFFSET + 4;
const PARENT_OFFSET: usize = ID_OFFSET + 8;
const SIZE_OFFSET: usize = PARENT_OFFSET + 8;
const ROOT_OFFSET: usize = SIZE_OFFSET + 8;
const HEIGHT_OFFSET: usize = ROOT_OFFSET + 8;
const KIND_OFFSET: usize = HEIGHT_OFFSET + 1;
const NAME_LEN_OFFSET: usize = KIND_OFFSET + 1;
const FLAGS_OFFSET: usize = NAME_LEN_OFFSET + 1;
const RANK_OFFSET: usize = FLAGS_OFFSET + 1;
const CREATED_OFFSET: usize = FLAGS_OFFSET + 5;
const REFERENCED_OFFSET: usize = CREATED_OFFSET + 8;
const CREATED_GENERATION_OFFSET: usize = REFERENCED_OFFSET + 8;
const SHARE_FLOOR_OFFSET: usize = CREATED_GENERATION_OFFSET + 8;
const WRITTEN_BASE_OFFSET: usize = SHARE_FLOOR_OFFSET + 8;
const RECEIVE_PROGRESS_OFFSET: usize = WRITTEN_BASE_OFFSET + 8;
const NAME_OFFSET: usize = RECEIVE_PROGRESS_OFFSET + 8;
const GUID_OFFSET: usize = NAME_OFFSET + VOLUME_NAME_MAX_BYTES;
const HOLD_UNTIL_OFFSET: usize = GUID_OFFSET + 16;
const TAIL_OFFSET: usize = HOLD_UNTIL_OFFSET + 8;
const _: () = assert!(TAIL_OFFSET + 8 == RECORD_BYTES);
/// Flag bit: the volume was removed.
const FLAG_REMOVED: u8 = 0x1;
/// Flag bit: a partial receive (see `receive_progress`).
const FLAG_RECEIVING: u8 = 0x2;
/// Flag bit: a replication cursor (see `cursor`).
const FLAG_CURSOR: u8 = 0x4;
/// Flag bit: a hold (see `hold`).
const FLAG_HOLD: u8 = 0x8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: VolumeId,
    pub parent: VolumeId,
    pub size_bytes: u64,
    /// Root node; NONE once a removed volume's tree is given back.
    pub root: BlockAddr,
    pub height: u8,
    pub kind: VolumeKind,
    pub name: String,
    /// Removed: not listed, its name free; see the layout above.
    pub removed: bool,
    pub created_unix_secs: u64,
    pub referenced_blocks: u64,
    pub created_generation: u64,
    pub share_floor_generation: u64,
    pub written_base_generation: u64,
    pub guid: [u8; 16],
    /// Some(bytes applied) while this live record is a partial receive:
    /// hidden from listings and lookups by name, its name reserved for the
    /// snapshot it becomes. Its guid is already the target's.
    pub receive_progress: Option<u64>,
    /// A replication cursor: a removed snapshot record (no tree) kept as
    /// the base of the next incremental to the target it is named after.
    /// Its guid, parent and created generation are those of the snapshot
    /// last sent there.
    pub cursor: bool,
    /// Retention rank: 0 for none, else the level a snapshot was ranked at.
    pub rank: u8,
    /// A hold: a removed snapshot record (no tree) named after its tag,
    /// whose guid is the held snapshot's; `hold_until_unix_secs` is when
    /// its lease ends (0: held until released).
    pub hold: bool,
    pub hold_until_unix_secs: u64,
}

impl VolumeRecord {
    fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.removed {
            flags |= FLAG_REMOVED;
        }
        if self.receive_progress.is_some() {
            flags |= FLAG_RECEIVING;
        }
        if self.cursor {
            flags |= FLAG_CURSOR;
        }
        if self.hold {
            flags |= FLAG_HOLD;
        }
        flags
    }

    /// Listed, and found by name: not a partial receive.
    pub fn is_visible(&self) -> bool {
        !self.removed && self.receive_progress.is_none()
    }

    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), RECORD_BYTES);
        if let Err(problem) = self.check_fields() {
            panic!("encoding an invalid volume record: {problem}");
        }
        out.fill(0);
        out[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&RECORD_MAGIC);
        put_u64(out, ID_OFFSET, self.id.0);
        put_u64(out, PARENT_OFFSET, self.parent.0);
        put_u64(out, SIZE_OFFSET, self.size_bytes);
        put_u64(out, ROOT_OFFSET, self.root.0);
        out[HEIGHT_OFFSET] = self.height;
        out[KIND_OFFSET] = self.kind as u8;
        out[NAME_LEN_OFFSET] = self.name.len() as u8;
        out[FLAGS_OFFSET] = self.flags();
        out[RANK_OFFSET] = self.rank;
        put_u64(out, HOLD_UNTIL_OFFSET, self.hold_until_unix_secs);
        put_u64(out, CREATED_OFFSET, self.created_unix_secs);
        put_u64(out, REFERENCED_OFFSET, self.referenced_blocks);
        put_u64(out, CREATED_GENERATION_OFFSET, self.created_generation);
        put_u64(out, SHARE_FLOOR_OFFSET, self.share_floor_generation);
        put_u64(out, WRITTEN_BASE_OFFSET, self.written_base_generation);
        put_u64(
            out,
            RECEIVE_PROGRESS_OFFSET,
            self.receive_progress.unwrap_or(0),
        );
        out[NAME_OFFSET..NAME_OFFSET + self.name.len()].copy_from_slice(self.name.as_bytes());
        out[GUID_OFFSET..GUID_OFFSET + 16].copy_from_slice(&self.guid);
        let crc = crc_with_hole(out, CRC_OFFSET);
        put_u32(out, CRC_OFFSET, crc);
    }

    /// Decodes slot `slot_id` (the id this slot must hold). Returns None for
    /// an empty slot.
    pub fn decode(bytes: &[u8], slot_id: VolumeId) -> Result<Option<VolumeRecord>> {
        assert_eq!(bytes.len(), RECORD_BYTES);
        if bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        Self::decode_written(bytes, slot_id)
            .map(Some)
            .map_err(|why| {
                Error::corrupt(format!(
                    "volume table record of volume #{} is damaged: {why}",
                    slot_id.0
                ))
            })
    }

    /// Decodes a slot that is not all zeros; an error says what is damaged.
    fn decode_written(
        bytes: &[u8],
        slot_id: VolumeId,
    ) -> std::result::Result<VolumeRecord, String> {
        check_envelope(bytes, slot_id)?;
        let kind = match bytes[KIND_OFFSET] {
            1 => VolumeKind::Volume,
            2 => VolumeKind::Snapshot,
            3 => VolumeKind::Clone,
            other => return Err(format!("unknown kind {other}")),
        };
        let name = read_name(bytes)?;
        let flags = bytes[FLAGS_OFFSET];
        if flags & !(FLAG_REMOVED | FLAG_RECEIVING | FLAG_CURSOR | FLAG_HOLD) != 0 {
            return Err(format!("unknown flags {flags:#04x}"));
        }
        let reserved = [
            RANK_OFFSET + 1..CREATED_OFFSET,
            NAME_OFFSET + name.len()..GUID_OFFSET,
            TAIL_OFFSET..RECORD_BYTES,
        ];
        if reserved
            .iter()
            .any(|range| bytes[range.clone()].iter().any(|&b| b != 0))
        {
            return Err("reserved bytes are not zero".into());
        }
        let record = Self::read_fields(bytes, kind, name, flags);
        if record.receive_progress.is_none() && get_u64(bytes, RECEIVE_PROGRESS_OFFSET) != 0 {
            return Err("receive progress without the receiving flag".into());
        }
        record.check_fields()?;
        Ok(record)
    }

    /// The record's fields, once kind, name and flags are known good.
    fn read_fields(bytes: &[u8], kind: VolumeKind, name: String, flags: u8) -> VolumeRecord {
        let mut guid = [0u8; 16];
        guid.copy_from_slice(&bytes[GUID_OFFSET..GUID_OFFSET + 16]);
        VolumeRecord {
            id: VolumeId(get_u64(bytes, ID_OFFSET)),
            parent: VolumeId(get_u64(bytes, PARENT_OFFSET)),
            size_bytes: get_u64(bytes, SIZE_OFFSET),
            root: BlockAddr(get_u64(bytes, ROOT_OFFSET)),
            height: bytes[HEIGHT_OFFSET],
            kind,
            name,
            removed: flags & FLAG_REMOVED != 0,
            created_unix_secs: get_u64(bytes, CREATED_OFFSET),
            referenced_blocks: get_u64(bytes, REFERENCED_OFFSET),
            created_generation: get_u64(bytes, CREATED_GENERATION_OFFSET),
            share_floor_generation: get_u64(bytes, SHARE_FLOOR_OFFSET),
            written_base_generation: get_u64(bytes, WRITTEN_BASE_OFFSET),
            guid,
            receive_progress: (flags & FLAG_RECEIVING != 0)
                .then(|| get_u64(bytes, RECEIVE_PROGRESS_OFFSET)),
            cursor: flags & FLAG_CURSOR != 0,
            rank: bytes[RANK_OFFSET],
            hold: flags & FLAG_HOLD != 0,
            hold_until_unix_secs: get_u64(bytes, HOLD_UNTIL_OFFSET),
        }
    }

    /// Checks shared by the encoder (as assertions) and the decoder (as
    /// errors): a well-checksummed record can still be impossible.
    fn check_fields(&self) -> std::result::Result<(), String> {
        if self.id == VolumeId::NONE {
            return Err("id 0".into());
        }
        if self.parent == self.id {
            return Err("it is its own parent".into());
        }
        if self.root.is_none() && !self.removed {
            return Err("a live volume without a root".into());
        }
        if self.height == 0 || self.height >= super::node::NODE_LEVELS_MAX {
            return Err(format!("a tree of {} levels", self.height));
        }
        if self.name.is_empty() || self.name.len() > VOLUME_NAME_MAX_BYTES {
            return Err(format!("name length {}", self.name.len()));
        }
        if self.size_bytes > VOLUME_SIZE_MAX_BYTES
            || !self.size_bytes.is_multiple_of(crate::types::SECTOR_BYTES)
        {
            return Err(format!("size {} bytes", self.size_bytes));
        }
        if self.receive_progress.is_some()
            && (self.removed || self.cursor || !self.kind.is_writable())
        {
            return Err("a partial receive that is removed, a cursor or read-only".into());
        }
        if self.cursor
            && (!self.removed || !self.root.is_none() || self.kind != VolumeKind::Snapshot)
        {
            return Err("a cursor that is live, has a tree or is not a snapshot".into());
        }
        if self.hold
            && (!self.removed
                || !self.root.is_none()
                || self.kind != VolumeKind::Snapshot
                || self.cursor)
        {
            return Err("a hold that is live, has a tree, is a cursor or not a snapshot".into());
        }
        if !self.hold && self.hold_until_unix_secs != 0 {
            return Err("a hold lease on a record that is not a hold".into());
        }
        if self.rank != 0 && self.kind != VolumeKind::Snapshot {
            return Err(format!("a {} with a retention rank", self.kind.as_str()));
        }
        let generation_max = super::node::BIRTH_GENERATION_MAX;
        if self.created_generation > generation_max
            || self.share_floor_generation > generation_max
            || self.written_base_generation > generation_max
        {
            return Err("a generation past the largest one".into());
        }
        Ok(())
    }
}

/// A written record's magic, checksum and id, in that order: the id is
/// only worth reading once the checksum vouches for it.
fn check_envelope(bytes: &[u8], slot_id: VolumeId) -> std::result::Result<(), String> {
    if bytes[MAGIC_OFFSET..MAGIC_OFFSET + 4] != RECORD_MAGIC {
        return Err("no record magic".into());
    }
    let stored_crc = get_u32(bytes, CRC_OFFSET);
    let actual_crc = crc_with_hole(bytes, CRC_OFFSET);
    if stored_crc != actual_crc {
        return Err(format!(
            "checksum mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})"
        ));
    }
    let id = VolumeId(get_u64(bytes, ID_OFFSET));
    if id != slot_id {
        return Err(format!("holds id {} in the slot of id {}", id.0, slot_id.0));
    }
    Ok(())
}

/// The record's name: 1 to VOLUME_NAME_MAX_BYTES bytes of UTF-8.
fn read_name(bytes: &[u8]) -> std::result::Result<String, String> {
    let name_len = usize::from(bytes[NAME_LEN_OFFSET]);
    if name_len == 0 || name_len > VOLUME_NAME_MAX_BYTES {
        return Err(format!("name length {name_len}"));
    }
    std::str::from_utf8(&bytes[NAME_OFFSET..NAME_OFFSET + name_len])
        .map(str::to_string)
        .map_err(|_| "name is not UTF-8".into())
}
