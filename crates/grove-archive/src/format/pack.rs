//! A pack: one object holding block versions that share an owner (the
//! archived snapshot expected to need them longest), so that they expire
//! together. Written whole, never changed, deleted whole.
//!
//! ```text
//! offset  size        field
//! 0       8           magic "GRVAPACK"
//! 8       4           format version (1)
//! 12      4           block size in bytes
//! 16      8           pack id
//! 24      4           slots
//! 28      4           crc32c of bytes 0..28
//! 32      8 x slots   the volume block each slot holds a version of
//! then    slots x (4 + block size): crc32c(pack id, slot, data), data
//! ```
//!
//! A slot's checksum covers the pack id and slot number, so a slot read
//! from the wrong pack or place fails its check: a read returns the data
//! it asked for or an error, never other data.

use super::{le_u32, le_u64};

pub const MAGIC: &[u8; 8] = b"GRVAPACK";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 32;
/// Bytes of a slot's checksum, before its data.
pub const SLOT_CHECKSUM_BYTES: u64 = 4;

/// What a pack's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackHeader {
    pub id: u64,
    pub block_bytes: u32,
    pub slots: u32,
}

impl PackHeader {
    /// Where the block table ends and slot 0 starts.
    pub fn slots_start(&self) -> u64 {
        HEADER_BYTES + 8 * u64::from(self.slots)
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

fn slot_checksum(id: u64, slot: u32, data: &[u8]) -> u32 {
    let mut seed = [0u8; 12];
    seed[..8].copy_from_slice(&id.to_le_bytes());
    seed[8..].copy_from_slice(&slot.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&seed), data)
}

/// A pack holding `blocks[i]`'s version in slot i; `data` is the slots'
/// data back to back, one block each.
pub fn encode(id: u64, block_bytes: u32, blocks: &[u64], data: &[u8]) -> Vec<u8> {
    let bs = block_bytes as usize;
    assert_eq!(data.len(), blocks.len() * bs, "one block of data per slot");
    let header = PackHeader {
        id,
        block_bytes,
        slots: u32::try_from(blocks.len()).expect("a pack's slots fit a u32"),
    };
    let mut out = Vec::with_capacity(header.object_bytes() as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&block_bytes.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&header.slots.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    for block in blocks {
        out.extend_from_slice(&block.to_le_bytes());
    }
    for (slot, chunk) in data.chunks(bs).enumerate() {
        out.extend_from_slice(&slot_checksum(id, slot as u32, chunk).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    debug_assert_eq!(out.len() as u64, header.object_bytes());
    out
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

/// The block table: which volume block each slot holds a version of.
/// `bytes` starts at the pack's start and holds at least the table.
pub fn decode_blocks(bytes: &[u8], header: &PackHeader) -> Result<Vec<u64>, String> {
    let end = header.slots_start() as usize;
    if bytes.len() < end {
        return Err(format!(
            "{} bytes, shorter than its block table",
            bytes.len()
        ));
    }
    Ok((0..header.slots as usize)
        .map(|i| le_u64(bytes, HEADER_BYTES as usize + 8 * i))
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
        let bytes = encode(7, 512, &[10, 11, 40], &data);
        let header = decode_header(&bytes, 7, 512).unwrap();
        assert_eq!(header.slots, 3);
        assert_eq!(header.object_bytes(), bytes.len() as u64);
        assert_eq!(decode_blocks(&bytes, &header).unwrap(), vec![10, 11, 40]);
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
}
