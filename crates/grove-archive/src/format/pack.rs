//! A pack: one object holding block versions that share an owner (the
//! archived snapshot expected to need them longest), so that they expire
//! together. Written once, never changed, deleted whole.
//!
//! ```text
//! offset  size        field
//! 0       8           magic "GRVAPACK"
//! 8       4           format version (3)
//! 12      4           block size in bytes
//! 16      8           pack id
//! 24      4           zero
//! 28      4           crc32c of bytes 0..28
//! 32      slots x (4 + block size): crc32c(pack id, slot, data), data
//! then    20 x slots  the slot table: per slot, the volume block (u64) it
//!                     holds a version of, and the version's address
//!                     (origin pack u64, origin slot u32)
//! then    20          the footer: slots (u32), format version (u32, 3),
//!                     magic "GRVAPACK", crc32c of the pack id, the block
//!                     size, the table and the footer before it (u32)
//! ```
//!
//! The table is at the end so that a pack is written front to back as it
//! fills (streamed to its object, never held whole), and its slots sit at
//! offsets that do not depend on how many there are. The catalog records
//! each pack's slots, so a reader finds the table and footer from the end
//! in one read. Version 2 had the table after the header; it is refused.
//!
//! A version's address is where a push first stored it; indexes name
//! versions by address, and a version copied by expiry keeps its address
//! (a forward table says where it went), so no index is rewritten.
//!
//! A slot's checksum covers the pack id and slot number, and the table's
//! covers the pack id, so a slot or table read from the wrong pack or
//! place fails its check: a read returns the data it asked for or an
//! error, never other data.

use super::{le_u32, le_u64};

pub const MAGIC: &[u8; 8] = b"GRVAPACK";
pub const VERSION: u32 = 3;
pub const HEADER_BYTES: u64 = 32;
/// Bytes of a slot's checksum, before its data.
pub const SLOT_CHECKSUM_BYTES: u64 = 4;
/// Bytes of one slot's entry in the slot table.
pub const TABLE_ENTRY_BYTES: u64 = 20;
/// Bytes of the footer after the table.
pub const FOOTER_BYTES: u64 = 20;

/// A version's address: the pack a push first stored it in, and the slot.
pub type Address = (u64, u32);

/// What one slot holds: a version of `block`, addressed as `origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotEntry {
    pub block: u64,
    pub origin: Address,
}

/// A pack's shape, as the catalog records it and its footer confirms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackHeader {
    pub id: u64,
    pub block_bytes: u32,
    pub slots: u32,
}

impl PackHeader {
    /// Bytes of one slot: its checksum and its data.
    pub fn slot_bytes(&self) -> u64 {
        SLOT_CHECKSUM_BYTES + u64::from(self.block_bytes)
    }

    /// Where slot `slot` starts.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        HEADER_BYTES + u64::from(slot) * self.slot_bytes()
    }

    /// Where the slot table starts: after the last slot.
    pub fn table_offset(&self) -> u64 {
        self.slot_offset(self.slots)
    }

    /// The whole object's size.
    pub fn object_bytes(&self) -> u64 {
        self.table_offset() + tail_bytes(self.slots)
    }
}

/// Bytes of the slot table and footer of a pack of `slots` slots.
pub fn tail_bytes(slots: u32) -> u64 {
    TABLE_ENTRY_BYTES * u64::from(slots) + FOOTER_BYTES
}

fn slot_checksum(id: u64, slot: u32, data: &[u8]) -> u32 {
    let mut seed = [0u8; 12];
    seed[..8].copy_from_slice(&id.to_le_bytes());
    seed[8..].copy_from_slice(&slot.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&seed), data)
}

/// The footer's checksum over the table and the footer's first fields.
fn tail_checksum(id: u64, block_bytes: u32, covered: &[u8]) -> u32 {
    let mut seed = [0u8; 12];
    seed[..8].copy_from_slice(&id.to_le_bytes());
    seed[8..].copy_from_slice(&block_bytes.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&seed), covered)
}

/// A pack holding `entries[i]`'s version in slot i; `data` is the slots'
/// data back to back, one block each.
pub fn encode(id: u64, block_bytes: u32, entries: &[SlotEntry], data: &[u8]) -> Vec<u8> {
    let bs = block_bytes as usize;
    assert_eq!(data.len(), entries.len() * bs, "one block of data per slot");
    let mut encoder = PackEncoder::new(id, block_bytes, entries.len() as u32);
    let mut bytes = encoder.header().to_vec();
    for (entry, chunk) in entries.iter().zip(data.chunks(bs)) {
        bytes.extend_from_slice(&encoder.slot(*entry, chunk));
        bytes.extend_from_slice(chunk);
    }
    bytes.extend_from_slice(&encoder.finish());
    bytes
}

/// A pack encoded front to back for a writer that streams it: the header,
/// then each slot's checksum (before its data) as it comes, then the table
/// and footer. It holds only the table.
#[derive(Debug)]
pub struct PackEncoder {
    id: u64,
    block_bytes: u32,
    capacity: u32,
    slots: u32,
    table: Vec<u8>,
}

impl PackEncoder {
    pub fn new(id: u64, block_bytes: u32, capacity: u32) -> PackEncoder {
        PackEncoder {
            id,
            block_bytes,
            capacity,
            slots: 0,
            table: Vec::with_capacity(tail_bytes(capacity) as usize),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn is_full(&self) -> bool {
        self.slots == self.capacity
    }

    /// The pack's first bytes.
    pub fn header(&self) -> [u8; HEADER_BYTES as usize] {
        let mut header = [0u8; HEADER_BYTES as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&self.block_bytes.to_le_bytes());
        header[16..24].copy_from_slice(&self.id.to_le_bytes());
        let crc = crc32c::crc32c(&header[..28]);
        header[28..32].copy_from_slice(&crc.to_le_bytes());
        header
    }

    /// Takes `entry`'s version, `data` (one block), as the next slot;
    /// returns the slot's checksum, which goes before its data.
    pub fn slot(&mut self, entry: SlotEntry, data: &[u8]) -> [u8; SLOT_CHECKSUM_BYTES as usize] {
        assert!(
            self.slots < self.capacity,
            "a pack takes no slot past its capacity"
        );
        assert_eq!(
            data.len(),
            self.block_bytes as usize,
            "one block of data per slot"
        );
        self.table.extend_from_slice(&entry.block.to_le_bytes());
        self.table.extend_from_slice(&entry.origin.0.to_le_bytes());
        self.table.extend_from_slice(&entry.origin.1.to_le_bytes());
        let crc = slot_checksum(self.id, self.slots, data);
        self.slots += 1;
        crc.to_le_bytes()
    }

    /// The pack's last bytes: the slot table and the footer.
    pub fn finish(mut self) -> Vec<u8> {
        self.table.extend_from_slice(&self.slots.to_le_bytes());
        self.table.extend_from_slice(&VERSION.to_le_bytes());
        self.table.extend_from_slice(MAGIC);
        let crc = tail_checksum(self.id, self.block_bytes, &self.table);
        self.table.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(self.table.len() as u64, tail_bytes(self.slots));
        self.table
    }
}

/// Checks the header at the start of a pack against the id and block size
/// the catalog expects.
pub fn decode_header(bytes: &[u8], id: u64, block_bytes: u32) -> Result<(), String> {
    if bytes.len() < HEADER_BYTES as usize {
        return Err(format!("{} bytes, shorter than a pack header", bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a grove archive pack (bad magic)".into());
    }
    if le_u32(bytes, 28) != crc32c::crc32c(&bytes[..28]) {
        return Err("the pack header's checksum does not match".into());
    }
    check_fields(
        le_u32(bytes, 8),
        le_u64(bytes, 16),
        le_u32(bytes, 12),
        id,
        block_bytes,
    )
}

fn check_fields(
    version: u32,
    found_id: u64,
    found_bs: u32,
    id: u64,
    bs: u32,
) -> Result<(), String> {
    if version != VERSION {
        return Err(format!(
            "pack format version {version}, this grove reads {VERSION}"
        ));
    }
    if found_id != id {
        return Err(format!("holds pack {found_id:016x}, expected {id:016x}"));
    }
    if found_bs != bs {
        return Err(format!("block size {found_bs}, the archive's is {bs}"));
    }
    Ok(())
}

/// The slot table: which volume block each slot holds a version of, and
/// the version's address. `tail` is the pack's bytes from
/// `header.table_offset()` to its end: the table and the footer.
pub fn decode_table(tail: &[u8], header: &PackHeader) -> Result<Vec<SlotEntry>, String> {
    let expected = tail_bytes(header.slots);
    if tail.len() as u64 != expected {
        return Err(format!(
            "{} bytes of slot table and footer, expected {expected}",
            tail.len()
        ));
    }
    let footer = tail.len() - FOOTER_BYTES as usize;
    if &tail[footer + 8..footer + 16] != MAGIC {
        return Err(
            "no pack footer where the catalog's slots put it (an older pack format, a truncated pack or damage)"
                .into(),
        );
    }
    let crc_at = tail.len() - 4;
    if le_u32(tail, crc_at) != tail_checksum(header.id, header.block_bytes, &tail[..crc_at]) {
        return Err("the slot table's checksum does not match".into());
    }
    check_fields(
        le_u32(tail, footer + 4),
        header.id,
        header.block_bytes,
        header.id,
        header.block_bytes,
    )?;
    let slots = le_u32(tail, footer);
    if slots != header.slots {
        return Err(format!("{slots} slots, the catalog says {}", header.slots));
    }
    Ok(tail[..footer]
        .chunks(TABLE_ENTRY_BYTES as usize)
        .map(|e| SlotEntry {
            block: le_u64(e, 0),
            origin: (le_u64(e, 8), le_u32(e, 16)),
        })
        .collect())
}

/// The data of slot `slot` from its stored bytes (checksum and data), or
/// why it cannot be trusted.
pub fn verify_slot<'a>(
    header: &PackHeader,
    slot: u32,
    record: &'a [u8],
) -> Result<&'a [u8], String> {
    if record.len() as u64 != header.slot_bytes() {
        return Err(format!(
            "slot {slot} is {} bytes, expected {} (a truncated pack)",
            record.len(),
            header.slot_bytes()
        ));
    }
    let data = &record[SLOT_CHECKSUM_BYTES as usize..];
    if le_u32(record, 0) != slot_checksum(header.id, slot, data) {
        return Err(format!(
            "slot {slot}'s checksum does not match (damaged data)"
        ));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let data: Vec<u8> = (0..3 * 512).map(|i| (i % 251) as u8).collect();
        let entries: Vec<SlotEntry> = [(10, (7, 0)), (11, (3, 9)), (40, (7, 2))]
            .into_iter()
            .map(|(block, origin)| SlotEntry { block, origin })
            .collect();
        let bytes = encode(7, 512, &entries, &data);
        decode_header(&bytes, 7, 512).unwrap();
        let header = PackHeader {
            id: 7,
            block_bytes: 512,
            slots: 3,
        };
        assert_eq!(header.object_bytes(), bytes.len() as u64);
        let tail = &bytes[header.table_offset() as usize..];
        assert_eq!(decode_table(tail, &header).unwrap(), entries);
        for at in 0..tail.len() {
            let mut bad = tail.to_vec();
            bad[at] ^= 4;
            assert!(decode_table(&bad, &header).is_err(), "tail flip at {at}");
        }
        for len in 0..tail.len() {
            assert!(decode_table(&tail[..len], &header).is_err());
            assert!(decode_table(&tail[tail.len() - len..], &header).is_err());
        }
        for other in [
            PackHeader { id: 8, ..header },
            PackHeader {
                block_bytes: 4096,
                ..header
            },
            PackHeader { slots: 2, ..header },
        ] {
            let tail = &bytes[(bytes.len() as u64 - tail_bytes(other.slots)) as usize..];
            assert!(decode_table(tail, &other).is_err(), "{other:?}");
        }
        let at = header.slot_offset(2) as usize;
        let slot = &bytes[at..at + header.slot_bytes() as usize];
        assert_eq!(verify_slot(&header, 2, slot).unwrap(), &data[1024..]);
        assert!(
            verify_slot(&header, 1, slot).is_err(),
            "a slot read as another"
        );
        let mut flipped = slot.to_vec();
        flipped[100] ^= 1;
        assert!(verify_slot(&header, 2, &flipped).is_err());
        assert!(verify_slot(&header, 2, &slot[..10]).is_err());
        assert!(decode_header(&bytes, 8, 512).is_err(), "a foreign pack");
        assert!(decode_header(&bytes, 7, 4096).is_err());
        for len in 0..HEADER_BYTES as usize {
            assert!(decode_header(&bytes[..len], 7, 512).is_err());
        }
        let mut bad = bytes.clone();
        bad[13] ^= 1;
        assert!(decode_header(&bad, 7, 512).is_err());
    }

    #[test]
    fn the_older_format_is_refused_in_one_line() {
        let mut bytes = encode(7, 512, &[], &[]);
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..28]);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        let why = decode_header(&bytes, 7, 512).unwrap_err();
        assert_eq!(why, "pack format version 2, this grove reads 3");
    }
}
