//! Newtypes for addresses and identifiers, and the named limits of the format.

use std::fmt;

/// Smallest block size a pool may be created with.
pub const BLOCK_SIZE_MIN_BYTES: u32 = 1024;
/// Largest block size a pool may be created with.
pub const BLOCK_SIZE_MAX_BYTES: u32 = 64 * 1024;
/// Block size used when `grove init` is not told otherwise.
pub const BLOCK_SIZE_DEFAULT_BYTES: u32 = 4096;
/// Volume sizes and NBD requests are expressed in these units.
pub const SECTOR_BYTES: u64 = 512;
/// Longest volume name, in bytes of UTF-8.
pub const VOLUME_NAME_MAX_BYTES: usize = 128;
/// Largest volume: 2^56 bytes (64 PiB) keeps every byte offset and block
/// count comfortably inside u64 arithmetic.
pub const VOLUME_SIZE_MAX_BYTES: u64 = 1 << 56;

/// A physical block number inside the store file. Block 0 is the first
/// superblock, so 0 doubles as "no block" in radix-tree entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BlockAddr(pub u64);

impl BlockAddr {
    pub const NONE: BlockAddr = BlockAddr(0);

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for BlockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

/// A volume's identity. Ids are never reused within a pool, so a stale
/// handle can never reach a newer volume that took the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct VolumeId(pub u64);

impl VolumeId {
    /// Id 0 is never given to a volume: it marks an empty volume-table slot
    /// and "no parent".
    pub const NONE: VolumeId = VolumeId(0);
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "volume #{}", self.0)
    }
}

/// A block index inside one volume's address space (byte offset / block size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogicalBlock(pub u64);

/// Checks that a block size is a power of two within the supported range.
pub fn is_valid_block_size(block_size_bytes: u32) -> bool {
    block_size_bytes.is_power_of_two()
        && (BLOCK_SIZE_MIN_BYTES..=BLOCK_SIZE_MAX_BYTES).contains(&block_size_bytes)
}

/// A hasher for maps keyed by block addresses and ids: one multiplication
/// (Fibonacci hashing) instead of SipHash, which took a third of the
/// instructions of a sequential write. Keys come from the engine, not from
/// clients, so there is no hash-flooding concern.
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(FIBONACCI_MULTIPLIER);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(FIBONACCI_MULTIPLIER);
    }
}

/// 2^64 divided by the golden ratio, odd.
const FIBONACCI_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// A HashMap keyed by block addresses or ids, with `AddrHasher`.
pub type AddrMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<AddrHasher>>;
