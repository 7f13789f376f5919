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
//   32     8    root: block of the radix tree's root node
//   40     1    height: levels in the radix tree (1 = the root points at data)
//   41     1    kind: 1 = volume, 2 = snapshot (read-only), 3 = clone
//   42     1    name_len
//   43     5    reserved, zero
//   48     8    created_unix_secs
//   56     8    referenced_blocks: data blocks this volume maps
//   64     8    exclusive_blocks: data blocks reachable only through this volume
//   72     24   reserved, zero
//   96     128  name, UTF-8, name_len bytes, zero padded
//   224    32   reserved, zero
const MAGIC_OFFSET: usize = 0;
const CRC_OFFSET: usize = MAGIC_OFFSET + 4;
const ID_OFFSET: usize = CRC_OFFSET + 4;
const PARENT_OFFSET: usize = ID_OFFSET + 8;
const SIZE_OFFSET: usize = PARENT_OFFSET + 8;
const ROOT_OFFSET: usize = SIZE_OFFSET + 8;
const HEIGHT_OFFSET: usize = ROOT_OFFSET + 8;
const KIND_OFFSET: usize = HEIGHT_OFFSET + 1;
const NAME_LEN_OFFSET: usize = KIND_OFFSET + 1;
const CREATED_OFFSET: usize = NAME_LEN_OFFSET + 6;
const REFERENCED_OFFSET: usize = CREATED_OFFSET + 8;
const EXCLUSIVE_OFFSET: usize = REFERENCED_OFFSET + 8;
const NAME_OFFSET: usize = EXCLUSIVE_OFFSET + 8 + 24;
const TAIL_OFFSET: usize = NAME_OFFSET + VOLUME_NAME_MAX_BYTES;
const _: () = assert!(TAIL_OFFSET + 32 == RECORD_BYTES);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: VolumeId,
    pub parent: VolumeId,
    pub size_bytes: u64,
    pub root: BlockAddr,
    pub height: u8,
    pub kind: VolumeKind,
    pub name: String,
    pub created_unix_secs: u64,
    pub referenced_blocks: u64,
    pub exclusive_blocks: u64,
}

impl VolumeRecord {
    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), RECORD_BYTES);
        assert_ne!(self.id, VolumeId::NONE);
        assert!(!self.root.is_none());
        assert!(self.height >= 1);
        assert!(!self.name.is_empty() && self.name.len() <= VOLUME_NAME_MAX_BYTES);
        assert!(self.size_bytes <= VOLUME_SIZE_MAX_BYTES);
        assert!(self.exclusive_blocks <= self.referenced_blocks);
        out.fill(0);
        out[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&RECORD_MAGIC);
        put_u64(out, ID_OFFSET, self.id.0);
        put_u64(out, PARENT_OFFSET, self.parent.0);
        put_u64(out, SIZE_OFFSET, self.size_bytes);
        put_u64(out, ROOT_OFFSET, self.root.0);
        out[HEIGHT_OFFSET] = self.height;
        out[KIND_OFFSET] = self.kind as u8;
        out[NAME_LEN_OFFSET] = self.name.len() as u8;
        put_u64(out, CREATED_OFFSET, self.created_unix_secs);
        put_u64(out, REFERENCED_OFFSET, self.referenced_blocks);
        put_u64(out, EXCLUSIVE_OFFSET, self.exclusive_blocks);
        out[NAME_OFFSET..NAME_OFFSET + self.name.len()].copy_from_slice(self.name.as_bytes());
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
        let damaged = |why: String| {
            Error::corrupt(format!(
                "volume table record of volume #{} is damaged: {why}",
                slot_id.0
            ))
        };
        if bytes[MAGIC_OFFSET..MAGIC_OFFSET + 4] != RECORD_MAGIC {
            return Err(damaged("no record magic".into()));
        }
        let stored_crc = get_u32(bytes, CRC_OFFSET);
        let actual_crc = crc_with_hole(bytes, CRC_OFFSET);
        if stored_crc != actual_crc {
            return Err(damaged(format!(
                "checksum mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})"
            )));
        }
        let id = VolumeId(get_u64(bytes, ID_OFFSET));
        if id != slot_id {
            return Err(damaged(format!(
                "holds id {} in the slot of id {}",
                id.0, slot_id.0
            )));
        }
        let kind = match bytes[KIND_OFFSET] {
            1 => VolumeKind::Volume,
            2 => VolumeKind::Snapshot,
            3 => VolumeKind::Clone,
            other => return Err(damaged(format!("unknown kind {other}"))),
        };
        let name_len = usize::from(bytes[NAME_LEN_OFFSET]);
        if name_len == 0 || name_len > VOLUME_NAME_MAX_BYTES {
            return Err(damaged(format!("name length {name_len}")));
        }
        let name = std::str::from_utf8(&bytes[NAME_OFFSET..NAME_OFFSET + name_len])
            .map_err(|_| damaged("name is not UTF-8".into()))?
            .to_string();
        let record = VolumeRecord {
            id,
            parent: VolumeId(get_u64(bytes, PARENT_OFFSET)),
            size_bytes: get_u64(bytes, SIZE_OFFSET),
            root: BlockAddr(get_u64(bytes, ROOT_OFFSET)),
            height: bytes[HEIGHT_OFFSET],
            kind,
            name,
            created_unix_secs: get_u64(bytes, CREATED_OFFSET),
            referenced_blocks: get_u64(bytes, REFERENCED_OFFSET),
            exclusive_blocks: get_u64(bytes, EXCLUSIVE_OFFSET),
        };
        if record.root.is_none()
            || record.height == 0
            || record.height >= super::node::NODE_LEVELS_MAX
        {
            return Err(damaged(format!(
                "root {} at height {}",
                record.root.0, record.height
            )));
        }
        if record.size_bytes > VOLUME_SIZE_MAX_BYTES
            || !record.size_bytes.is_multiple_of(crate::types::SECTOR_BYTES)
        {
            return Err(damaged(format!("size {} bytes", record.size_bytes)));
        }
        if record.exclusive_blocks > record.referenced_blocks {
            return Err(damaged("more exclusive than referenced blocks".into()));
        }
        Ok(Some(record))
    }
}
