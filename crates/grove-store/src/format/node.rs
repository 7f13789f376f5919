//! Radix-tree nodes. A node is one block of 64-bit entries: 512 of them in
//! 4 KiB, 128 in 1 KiB. Each entry points to a child (a lower node, a data
//! block, or a volume-table record block) and says whether the owner may
//! write that child in place.
//!
//! A node has no room for a separate header, so the node's header is striped
//! across the top two bytes of its entries: entry i carries header bytes 2i
//! and 2i+1. Addresses use only the low 46 bits, which still reaches 2^46
//! blocks (64 PiB at 1 KiB blocks).

use super::{get_u32, put_u32};
use crate::error::{Error, Result};
use crate::types::BlockAddr;

/// Identifies a node block.
pub const NODE_MAGIC: [u8; 4] = *b"GRVN";
/// Bytes per entry.
pub const ENTRY_BYTES: usize = 8;
/// Bits of an entry that hold the child's block address.
pub const ENTRY_ADDR_BITS: u32 = 46;
/// Mask of the address bits.
pub const ENTRY_ADDR_MASK: u64 = (1 << ENTRY_ADDR_BITS) - 1;
/// Set when the child may be reachable from another tree too: the owner must
/// copy it before writing (dedicate-on-write).
pub const ENTRY_SHARED: u64 = 1 << 46;
/// Must be zero; a set bit means damage or a newer format.
pub const ENTRY_RESERVED: u64 = 1 << 47;
/// The entry bits that are the entry's own (not the striped header).
pub const ENTRY_PAYLOAD_MASK: u64 = (1 << 48) - 1;
/// Bit position of the striped header bytes inside an entry.
const STRIPE_SHIFT: u32 = 48;

// Node header, striped over the top two bytes of the entries (little-endian
// entry bytes 6 and 7 of entry i are header bytes 2i and 2i+1):
//
//   header offset size field
//   0             4    crc32c of the whole block with these 4 header bytes zeroed
//   4             4    magic "GRVN"
//   8             1    kind: 1 = volume data tree, 2 = volume table
//   9             1    level: 0 = entries point at leaves of the tree (data or
//                      record blocks); level n points at level n-1 nodes
//   10            6    reserved, zero
//   16                 end (NODE_HEADER_LEN); the rest of the stripe is zero
//
// Entry (64 bits, after the stripe bytes are masked off):
//
//   bits 0..46   child block address, 0 = no child (a hole reads as zeros)
//   bit  46      SHARED: the child may be reachable from another volume
//   bit  47      reserved, zero
const HEADER_CRC_OFFSET: usize = 0;
const HEADER_MAGIC_OFFSET: usize = HEADER_CRC_OFFSET + 4;
const HEADER_KIND_OFFSET: usize = HEADER_MAGIC_OFFSET + 4;
const HEADER_LEVEL_OFFSET: usize = HEADER_KIND_OFFSET + 1;
const NODE_HEADER_LEN: usize = HEADER_LEVEL_OFFSET + 7;

/// Deepest tree: at 128 entries per node (1 KiB blocks), 9 levels cover
/// 2^63 blocks, more than any volume can have.
pub const NODE_LEVELS_MAX: u8 = 9;

/// Which tree a node belongs to; a node found in the wrong tree is damage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    VolumeData = 1,
    VolumeTable = 2,
}

/// One entry: a child address plus flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Entry(u64);

impl Entry {
    pub const EMPTY: Entry = Entry(0);

    pub fn new(addr: BlockAddr, shared: bool) -> Entry {
        assert!(addr.0 <= ENTRY_ADDR_MASK, "block address {addr} too large");
        Entry(addr.0 | if shared { ENTRY_SHARED } else { 0 })
    }

    pub fn addr(self) -> BlockAddr {
        BlockAddr(self.0 & ENTRY_ADDR_MASK)
    }

    pub fn is_empty(self) -> bool {
        self.addr().is_none()
    }

    pub fn is_shared(self) -> bool {
        self.0 & ENTRY_SHARED != 0
    }

    /// The same child, marked shared (after a snapshot copied the parent).
    pub fn as_shared(self) -> Entry {
        if self.is_empty() {
            self
        } else {
            Entry(self.0 | ENTRY_SHARED)
        }
    }

    pub fn raw(self) -> u64 {
        self.0
    }
}

/// A decoded node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub kind: NodeKind,
    pub level: u8,
    pub entries: Box<[Entry]>,
}

impl Node {
    pub fn empty(kind: NodeKind, level: u8, entries_per_node: usize) -> Node {
        Node {
            kind,
            level,
            entries: vec![Entry::EMPTY; entries_per_node].into_boxed_slice(),
        }
    }

    pub fn encode(&self, block: &mut [u8]) {
        assert_eq!(block.len(), self.entries.len() * ENTRY_BYTES);
        assert!(self.level < NODE_LEVELS_MAX);
        let mut header = [0u8; NODE_HEADER_LEN];
        header[HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4].copy_from_slice(&NODE_MAGIC);
        header[HEADER_KIND_OFFSET] = self.kind as u8;
        header[HEADER_LEVEL_OFFSET] = self.level;
        for (i, entry) in self.entries.iter().enumerate() {
            // Entries never carry stripe bits or the reserved bit in memory.
            assert_eq!(entry.0 & (ENTRY_RESERVED | !ENTRY_PAYLOAD_MASK), 0);
            let stripe = stripe_pair(&header, i);
            let raw = entry.0 | (u64::from(stripe) << STRIPE_SHIFT);
            block[i * ENTRY_BYTES..(i + 1) * ENTRY_BYTES].copy_from_slice(&raw.to_le_bytes());
        }
        let crc = node_crc(block);
        let mut crc_bytes = [0u8; 4];
        put_u32(&mut crc_bytes, 0, crc);
        set_header_bytes(block, HEADER_CRC_OFFSET, &crc_bytes);
    }

    /// Decodes and verifies a node read from `addr`. Every non-empty child
    /// must lie inside `valid_children` (the store's data area).
    pub fn decode(
        block: &[u8],
        addr: BlockAddr,
        expected_kind: NodeKind,
        expected_level: u8,
        valid_children: std::ops::Range<u64>,
    ) -> Result<Node> {
        let damaged =
            |why: String| Error::corrupt(format!("radix node at {addr} is damaged: {why}"));
        let mut header = [0u8; NODE_HEADER_LEN];
        header_bytes(block, 0, &mut header);
        if header[HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4] != NODE_MAGIC {
            return Err(damaged("no node magic".into()));
        }
        let stored_crc = get_u32(&header, HEADER_CRC_OFFSET);
        let actual_crc = node_crc(block);
        if stored_crc != actual_crc {
            return Err(damaged(format!(
                "checksum mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})"
            )));
        }
        let kind = match header[HEADER_KIND_OFFSET] {
            1 => NodeKind::VolumeData,
            2 => NodeKind::VolumeTable,
            other => return Err(damaged(format!("unknown node kind {other}"))),
        };
        if kind != expected_kind {
            return Err(damaged(format!(
                "a {kind:?} node where a {expected_kind:?} node belongs"
            )));
        }
        let level = header[HEADER_LEVEL_OFFSET];
        if level != expected_level {
            return Err(damaged(format!(
                "level {level} where level {expected_level} belongs"
            )));
        }
        let entry_count = block.len() / ENTRY_BYTES;
        let mut entries = Vec::with_capacity(entry_count);
        for i in 0..entry_count {
            let raw = u64::from_le_bytes(
                block[i * ENTRY_BYTES..(i + 1) * ENTRY_BYTES]
                    .try_into()
                    .expect("8 bytes"),
            );
            let entry = Entry(raw & ENTRY_PAYLOAD_MASK);
            if entry.0 & ENTRY_RESERVED != 0 {
                return Err(damaged(format!("entry {i} has a reserved bit set")));
            }
            if !entry.is_empty() && !valid_children.contains(&entry.addr().0) {
                return Err(damaged(format!(
                    "entry {i} points at block {}, outside the data area",
                    entry.addr().0
                )));
            }
            if entry.is_empty() && entry.is_shared() {
                return Err(damaged(format!("entry {i} is empty but marked shared")));
            }
            entries.push(entry);
        }
        Ok(Node {
            kind,
            level,
            entries: entries.into_boxed_slice(),
        })
    }
}

/// Header bytes 2i and 2i+1, as the 16-bit value striped into entry i.
fn stripe_pair(header: &[u8], entry_index: usize) -> u16 {
    let lo = header.get(2 * entry_index).copied().unwrap_or(0);
    let hi = header.get(2 * entry_index + 1).copied().unwrap_or(0);
    u16::from_le_bytes([lo, hi])
}

/// Byte position in the block of header byte `k`.
fn header_byte_position(k: usize) -> usize {
    (k / 2) * ENTRY_BYTES + 6 + (k % 2)
}

fn header_bytes(block: &[u8], start: usize, out: &mut [u8]) {
    for (k, byte) in out.iter_mut().enumerate() {
        *byte = block[header_byte_position(start + k)];
    }
}

fn set_header_bytes(block: &mut [u8], start: usize, bytes: &[u8]) {
    for (k, &byte) in bytes.iter().enumerate() {
        block[header_byte_position(start + k)] = byte;
    }
}

/// CRC-32C of the block with the four header checksum bytes taken as zero.
fn node_crc(block: &[u8]) -> u32 {
    // Header bytes 0..4 sit at block offsets 6, 7, 14 and 15.
    let crc = crc32c::crc32c(&block[..6]);
    let crc = crc32c::crc32c_append(crc, &[0, 0]);
    let crc = crc32c::crc32c_append(crc, &block[8..14]);
    let crc = crc32c::crc32c_append(crc, &[0, 0]);
    crc32c::crc32c_append(crc, &block[16..])
}
