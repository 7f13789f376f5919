//! The on-disk format. Each structure has its byte layout as a comment above
//! its encoder; `docs/design.md` gathers them in one place. All integers are
//! little-endian. Every metadata block carries a CRC-32C, so corruption is
//! reported as an error naming the object, never returned as data.

pub mod group;
pub mod journal;
pub mod node;
pub mod record;
pub mod shares;
pub mod superblock;

/// Version of the on-disk format written by this build. A pool with a larger
/// number was written by a newer grove and is refused rather than misread.
pub const FORMAT_VERSION: u32 = 2;

pub(crate) fn get_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

pub(crate) fn get_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

pub(crate) fn put_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

/// CRC-32C of `bytes` with the 4-byte checksum field at `crc_offset` taken
/// as zero, so a block can carry its own checksum.
pub(crate) fn crc_with_hole(bytes: &[u8], crc_offset: usize) -> u32 {
    let crc = crc32c::crc32c(&bytes[..crc_offset]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &bytes[crc_offset + 4..])
}
