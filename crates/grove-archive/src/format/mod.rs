//! The archive's objects, byte by byte: encoders, and decoders that refuse
//! anything malformed with a reason and never panic.
//!
//! - `pack`: block versions with the same owner, each checksummed.
//! - `index`: one archived snapshot's root: a page per segment of blocks.
//! - `page`: the runs of one segment, shared by the snapshots it maps.
//! - `runs`: runs of blocks and the addresses of their versions.
//! - `forward`: where the versions of a deleted pack were copied.
//! - `catalog`: the archive's state, one create-only object per commit.

pub mod catalog;
pub mod forward;
pub mod index;
pub mod pack;
pub mod page;
pub mod runs;

/// Reads a little-endian integer at `at`; the caller checked the length.
fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}
