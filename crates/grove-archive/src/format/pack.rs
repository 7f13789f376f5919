//! A pack: one object holding block versions that share an owner (the
//! archived snapshot expected to need them longest), so that they expire
//! together. Written whole, never changed, deleted whole.
//!
//! ```text
//! offset  size        field
//! 0       8           magic "GRVAPACK"
//! 8       4           format version (2)
//! 12      4           block size in bytes
//! 16      8           pack id
//! 24      4           slots
//! 28      4           crc32c of bytes 0..28
//! 32      20 x slots  per slot: the volume block (u64) it holds a version
//!                     of, and the version's address (origin pack u64,
//!                     origin slot u32)
//! then    4           crc32c of the slot table
//! then    slots x (4 + block size): crc32c(pack id, slot, data), data
//! ```
//!
//! A version's address is where a push first stored it; indexes name
//! versions by address, and a version copied by expiry keeps its address
//! (a forward table says where it went), so no index is rewritten.
//!
//! A slot's checksum covers the pack id and slot number, so a slot read
//! from the wrong pack or place fails its check: a read returns the data
//! it asked for or an error, never other data.

use super::{le_u32, le_u64};

pub const MAGIC: &[u8; 8] = b"GRVAPACK";
pub const VERSION: u32 = 2;
pub const HEADER_BYTES: u64 = 32;
/// Bytes of a slot's checksum, before its data.
pub const SLOT_CHECKSUM_BYTES: u64 = 4;
/// Bytes of one slot's entry in the slot table.
pub const TABLE_ENTRY_BYTES: u64 = 20;
/// Bytes of the slot table's checksum.
const TABLE_CHECKSUM_BYTES: u64 = 4;

/// A version's address: the pack a push first stored it in, and the slot.
pub type Address = (u64, u32);

/// What one slot holds: a version of `block`, addressed as `origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotEntry {
    pub block: u64,
    pub origin: Address,
}

/// What a pack's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackHeader {
    pub id: u64,
    pub block_bytes: u32,
    pub slots: u32,
}

impl PackHeader {
    /// Where the slot table and its checksum end and slot 0 starts.
    pub fn slots_start(&self) -> u64 {
        table_end(self.slots)
    }

    /// Bytes of one slot: its checksum and its data.
    pub fn slot_bytes(&self) -> u64 {
        SLOT_CHECKSUM_BYTES + u64::from(self.block_bytes)
    }

    /// Where slot `slot` starts.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        self.slots_start() + u64::from(slot) * self.slot_bytes()
    }

    /// The whole object's size.
    pub fn object_bytes(&self) -> u64 {
        self.slot_offset(self.slots)
    }
}

/// Where the slot table of a pack of `slots` slots ends, its checksum
/// included.
pub fn table_end(slots: u32) -> u64 {
    HEADER_BYTES + TABLE_ENTRY_BYTES * u64::from(slots) + TABLE_CHECKSUM_BYTES
}

fn slot_checksum(id: u64, slot: u32, data: &[u8]) -> u32 {
    let mut seed = [0u8; 12];
    seed[..8].copy_from_slice(&id.to_le_bytes());
    seed[8..].copy_from_slice(&slot.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&seed), data)
}

/// A pack holding `entries[i]`'s version in slot i; `data` is the slots'
/// data back to back, one block each.
pub fn encode(id: u64, block_bytes: u32, entries: &[SlotEntry], data: &[u8]) -> Vec<u8> {
    let bs = block_bytes as usize;
    assert_eq!(data.len(), entries.len() * bs, "one block of data per slot");
    let mut builder = PackBuilder::new(id, block_bytes, entries.len() as u32);
    for (entry, chunk) in entries.iter().zip(data.chunks(bs)) {
        builder.push(*entry, chunk);
    }
    builder.finish()
}

/// A pack filled slot by slot in the one buffer it is stored from: the
/// slot table's room is kept for `capacity` slots, and closed up when the
/// pack ends with fewer, so filling a pack holds its bytes once.
#[derive(Debug)]
pub struct PackBuilder {
    id: u64,
    block_bytes: u32,
    capacity: u32,
    slots: u32,
    bytes: Vec<u8>,
}

impl PackBuilder {
    pub fn new(id: u64, block_bytes: u32, capacity: u32) -> PackBuilder {
        let full = PackHeader {
            id,
            block_bytes,
            slots: capacity,
        };
        let mut bytes = Vec::with_capacity(full.object_bytes() as usize);
        bytes.resize(full.slots_start() as usize, 0);
        PackBuilder {
            id,
            block_bytes,
            capacity,
            slots: 0,
            bytes,
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

    /// Adds `entry`'s version, `data` (one block), as the next slot.
    pub fn push(&mut self, entry: SlotEntry, data: &[u8]) {
        assert!(
            self.slots < self.capacity,
            "a pack takes no slot past its capacity"
        );
        assert_eq!(
            data.len(),
            self.block_bytes as usize,
            "one block of data per slot"
        );
        let at = (HEADER_BYTES + TABLE_ENTRY_BYTES * u64::from(self.slots)) as usize;
        self.bytes[at..at + 8].copy_from_slice(&entry.block.to_le_bytes());
        self.bytes[at + 8..at + 16].copy_from_slice(&entry.origin.0.to_le_bytes());
        self.bytes[at + 16..at + 20].copy_from_slice(&entry.origin.1.to_le_bytes());
        let crc = slot_checksum(self.id, self.slots, data);
        self.bytes.extend_from_slice(&crc.to_le_bytes());
        self.bytes.extend_from_slice(data);
        self.slots += 1;
    }

    /// The pack's bytes: header, table and its checksum, slots.
    pub fn finish(mut self) -> Vec<u8> {
        let header = PackHeader {
            id: self.id,
            block_bytes: self.block_bytes,
            slots: self.slots,
        };
        let room = table_end(self.capacity) as usize;
        let start = header.slots_start() as usize;
        // Close up the table's room for slots never filled.
        self.bytes.copy_within(room.., start);
        self.bytes.truncate(self.bytes.len() - (room - start));
        self.bytes[..8].copy_from_slice(MAGIC);
        self.bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        self.bytes[12..16].copy_from_slice(&self.block_bytes.to_le_bytes());
        self.bytes[16..24].copy_from_slice(&self.id.to_le_bytes());
        self.bytes[24..28].copy_from_slice(&self.slots.to_le_bytes());
        let crc = crc32c::crc32c(&self.bytes[..28]);
        self.bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        let table_crc_at = start - TABLE_CHECKSUM_BYTES as usize;
        let table_crc = crc32c::crc32c(&self.bytes[HEADER_BYTES as usize..table_crc_at]);
        self.bytes[table_crc_at..start].copy_from_slice(&table_crc.to_le_bytes());
        debug_assert_eq!(self.bytes.len() as u64, header.object_bytes());
        self.bytes
    }
}

/// The header at the start of a pack, checked against the id and block
/// size the catalog expects.
pub fn decode_header(bytes: &[u8], id: u64, block_bytes: u32) -> Result<PackHeader, String> {
    if bytes.len() < HEADER_BYTES as usize {
        return Err(format!("{} bytes, shorter than a pack header", bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a grove archive pack (bad magic)".into());
    }
    if le_u32(bytes, 28) != crc32c::crc32c(&bytes[..28]) {
        return Err("the pack header's checksum does not match".into());
    }
    let version = le_u32(bytes, 8);
    if version != VERSION {
        return Err(format!(
            "pack format version {version}, this grove reads {VERSION}"
        ));
    }
    let header = PackHeader {
        block_bytes: le_u32(bytes, 12),
        id: le_u64(bytes, 16),
        slots: le_u32(bytes, 24),
    };
    if header.id != id {
        return Err(format!("holds pack {:016x}, expected {id:016x}", header.id));
    }
    if header.block_bytes != block_bytes {
        return Err(format!(
            "block size {}, the archive's is {block_bytes}",
            header.block_bytes
        ));
    }
    Ok(header)
}

/// The slot table: which volume block each slot holds a version of, and
/// the version's address. `bytes` starts at the pack's start and holds at
/// least the table.
pub fn decode_table(bytes: &[u8], header: &PackHeader) -> Result<Vec<SlotEntry>, String> {
    let end = header.slots_start() as usize;
    if bytes.len() < end {
        return Err(format!(
            "{} bytes, shorter than its slot table",
            bytes.len()
        ));
    }
    let table = &bytes[HEADER_BYTES as usize..end - TABLE_CHECKSUM_BYTES as usize];
    if le_u32(bytes, end - TABLE_CHECKSUM_BYTES as usize) != crc32c::crc32c(table) {
        return Err("the slot table's checksum does not match".into());
    }
    Ok(table
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
        let header = decode_header(&bytes, 7, 512).unwrap();
        assert_eq!(header.slots, 3);
        assert_eq!(header.object_bytes(), bytes.len() as u64);
        assert_eq!(decode_table(&bytes, &header).unwrap(), entries);
        for at in HEADER_BYTES as usize..header.slots_start() as usize {
            let mut bad = bytes.clone();
            bad[at] ^= 4;
            assert!(decode_table(&bad, &header).is_err(), "table flip at {at}");
        }
        let table = &bytes[..header.slots_start() as usize];
        for len in 0..table.len() {
            assert!(decode_table(&table[..len], &header).is_err());
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
        // A pack filled short of its capacity is the same pack.
        let mut builder = PackBuilder::new(7, 512, 10);
        for (entry, chunk) in entries.iter().zip(data.chunks(512)) {
            builder.push(*entry, chunk);
        }
        assert_eq!(builder.finish(), bytes);
    }
}
