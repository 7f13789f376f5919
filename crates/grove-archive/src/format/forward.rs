//! A forward table: where the surviving versions of a deleted pack went.
//! Indexes name a version by its address (the pack a push first stored it
//! in, and the slot); when expiry deletes that pack and copies the
//! versions kept snapshots still need, the pack's forward table maps each
//! of their slots to its new place, so no index is rewritten. A table is
//! replaced whole (a new object) when its versions move again, and deleted
//! once no kept snapshot lies in the deleted pack's reference range.
//!
//! ```text
//! offset  size          field
//! 0       8             magic "GRVAFWRD"
//! 8       4             format version (1)
//! 12      4             entries
//! 16      8             the deleted pack's id (the addresses' pack)
//! 24      4             crc32c of the entries
//! 28      4             crc32c of bytes 0..28
//! 32      16 x entries  origin slot u32, pack u64, slot u32; by origin slot
//! ```

use super::{le_u32, le_u64};
use std::collections::BTreeMap;

pub const MAGIC: &[u8; 8] = b"GRVAFWRD";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 32;
pub const ENTRY_BYTES: usize = 16;

/// Where each moved slot of pack `origin` is now: origin slot → (pack, slot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardTable {
    pub origin: u64,
    pub moved: BTreeMap<u32, (u64, u32)>,
}

impl ForwardTable {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.moved.len() * ENTRY_BYTES);
        for (slot, (pack, to)) in &self.moved {
            body.extend_from_slice(&slot.to_le_bytes());
            body.extend_from_slice(&pack.to_le_bytes());
            body.extend_from_slice(&to.to_le_bytes());
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        let entries = u32::try_from(self.moved.len()).expect("a pack's slots fit a u32");
        out.extend_from_slice(&entries.to_le_bytes());
        out.extend_from_slice(&self.origin.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes the forward table of deleted pack `origin`.
    pub fn decode(bytes: &[u8], origin: u64) -> Result<ForwardTable, String> {
        if bytes.len() < HEADER_BYTES {
            return Err(format!(
                "{} bytes, shorter than a forward table's header",
                bytes.len()
            ));
        }
        if &bytes[..8] != MAGIC {
            return Err("not a grove archive forward table (bad magic)".into());
        }
        if le_u32(bytes, 28) != crc32c::crc32c(&bytes[..28]) {
            return Err("the forward table's header checksum does not match".into());
        }
        let version = le_u32(bytes, 8);
        if version != VERSION {
            return Err(format!(
                "forward table format version {version}, this grove reads {VERSION}"
            ));
        }
        if le_u64(bytes, 16) != origin {
            return Err(format!(
                "the forward table of pack {:016x}, expected {origin:016x}",
                le_u64(bytes, 16)
            ));
        }
        let body = &bytes[HEADER_BYTES..];
        let entries = le_u32(bytes, 12) as usize;
        if entries.checked_mul(ENTRY_BYTES) != Some(body.len()) {
            return Err(format!(
                "{entries} entries in {} bytes (a truncated forward table)",
                body.len()
            ));
        }
        if le_u32(bytes, 24) != crc32c::crc32c(body) {
            return Err("the forward table's entries fail their checksum".into());
        }
        let mut moved = BTreeMap::new();
        for e in body.chunks(ENTRY_BYTES) {
            let slot = le_u32(e, 0);
            if moved
                .last_key_value()
                .is_some_and(|(&last, _)| last >= slot)
            {
                return Err(format!("entry for slot {slot} out of order"));
            }
            moved.insert(slot, (le_u64(e, 4), le_u32(e, 12)));
        }
        Ok(ForwardTable { origin, moved })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let table = ForwardTable {
            origin: 5,
            moved: [(0, (9, 3)), (7, (9, 4)), (8, (12, 0))]
                .into_iter()
                .collect(),
        };
        let bytes = table.encode();
        assert_eq!(ForwardTable::decode(&bytes, 5).unwrap(), table);
        assert!(
            ForwardTable::decode(&bytes, 6).is_err(),
            "another pack's table"
        );
        for len in 0..bytes.len() {
            assert!(
                ForwardTable::decode(&bytes[..len], 5).is_err(),
                "truncated at {len}"
            );
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(ForwardTable::decode(&bad, 5).is_err(), "flip at {at}");
        }
    }
}
