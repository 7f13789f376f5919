//! Radix-tree nodes. A node is one block of 64-bit entries: 512 of them in
//! 4 KiB, 128 in 1 KiB. Each entry points to a child (a lower node, a data
//! block, or a volume-table record block) and carries the generation in
//! which that mapping was born (ZFS's birth txg), so the changes since any
//! snapshot are found by skipping subtrees born before it, unread.
//!
//! A node has no room for a separate header, so the 16-byte header is
//! striped over the top bit of the entries: entry k carries header bit k.
//! Even a 1 KiB node has the 128 entries this needs.

use super::{get_u32, put_u32};
use crate::error::{Error, Result};
use crate::types::BlockAddr;

/// Identifies a node block.
pub const NODE_MAGIC: [u8; 4] = *b"GRVN";
/// Bytes per entry.
pub const ENTRY_BYTES: usize = 8;
/// Bits of an entry that hold the child's block address: 2^37 blocks is
/// 512 TiB of store at 4 KiB blocks (128 TiB at 1 KiB).
pub const ENTRY_ADDR_BITS: u32 = 37;
/// Mask of the address bits.
pub const ENTRY_ADDR_MASK: u64 = (1 << ENTRY_ADDR_BITS) - 1;
/// Bits of an entry that hold the birth generation.
pub const ENTRY_BIRTH_BITS: u32 = 26;
/// Largest birth generation an entry can hold. The pool's generation
/// advances once per snapshot, clone or rollback, so this is 67 million of
/// them over a pool's life.
pub const BIRTH_GENERATION_MAX: u64 = (1 << ENTRY_BIRTH_BITS) - 1;
const BIRTH_SHIFT: u32 = ENTRY_ADDR_BITS;
/// The entry bits that are the entry's own (not the striped header).
pub const ENTRY_PAYLOAD_MASK: u64 = (1 << (ENTRY_ADDR_BITS + ENTRY_BIRTH_BITS)) - 1;
/// Bit position of the striped header bit inside an entry.
const STRIPE_SHIFT: u32 = 63;
const _: () = assert!(ENTRY_ADDR_BITS + ENTRY_BIRTH_BITS == STRIPE_SHIFT);

// Node header, 16 bytes = 128 bits, striped over bit 63 of the entries
// (header bit k, counting from the least significant bit of header byte 0,
// is bit 63 of entry k):
//
//   header offset size field
//   0             4    crc32c of the whole block with these 32 header bits zeroed
//   4             4    magic "GRVN"
//   8             1    kind: 1 = volume data tree, 2 = volume table
//   9             1    level: 0 = entries point at leaves of the tree (data or
//                      record blocks); level n points at level n-1 nodes
//   10            6    reserved, zero
//   16                 end (NODE_HEADER_LEN); the stripe bits of entries 128.. are zero
//
// Entry (64 bits, after the stripe bit is masked off):
//
//   bits 0..37   child block address, 0 = no child (a hole reads as zeros)
//   bits 37..63  birth generation: when this mapping was last changed. A
//                parent's entry is at least as new as every entry below it.
//                A hole may carry a birth too: when it was unmapped.
//                Volume-table entries are always born in generation 0.
const HEADER_CRC_OFFSET: usize = 0;
const HEADER_MAGIC_OFFSET: usize = HEADER_CRC_OFFSET + 4;
const HEADER_KIND_OFFSET: usize = HEADER_MAGIC_OFFSET + 4;
const HEADER_LEVEL_OFFSET: usize = HEADER_KIND_OFFSET + 1;
const NODE_HEADER_LEN: usize = HEADER_LEVEL_OFFSET + 7;
/// Entries whose stripe bit carries the checksum.
const CRC_STRIPE_ENTRIES: usize = 32;

/// Deepest tree: at 128 entries per node (1 KiB blocks), 9 levels cover
/// 2^63 blocks, more than any volume can have.
pub const NODE_LEVELS_MAX: u8 = 9;

/// Which tree a node belongs to; a node found in the wrong tree is damage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    VolumeData = 1,
    VolumeTable = 2,
}

/// One entry: a child address plus the generation the mapping was born in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Entry(u64);

impl Entry {
    pub const EMPTY: Entry = Entry(0);

    pub fn new(addr: BlockAddr, birth: u64) -> Entry {
        assert!(addr.0 <= ENTRY_ADDR_MASK, "block address {addr} too large");
        assert!(birth <= BIRTH_GENERATION_MAX, "birth {birth} too large");
        Entry(addr.0 | (birth << BIRTH_SHIFT))
    }

    /// No child, unmapped in generation `birth`.
    pub fn hole(birth: u64) -> Entry {
        Entry::new(BlockAddr::NONE, birth)
    }

    pub fn addr(self) -> BlockAddr {
        BlockAddr(self.0 & ENTRY_ADDR_MASK)
    }

    pub fn birth(self) -> u64 {
        (self.0 & ENTRY_PAYLOAD_MASK) >> BIRTH_SHIFT
    }

    /// The same child, born in `birth`.
    pub fn with_birth(self, birth: u64) -> Entry {
        Entry::new(self.addr(), birth)
    }

    pub fn is_empty(self) -> bool {
        self.addr().is_none()
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
        assert!(self.entries.len() >= NODE_HEADER_LEN * 8);
        for (i, entry) in self.entries.iter().enumerate() {
            // Entries never carry the stripe bit in memory.
            assert_eq!(entry.0 & !ENTRY_PAYLOAD_MASK, 0);
            if self.kind == NodeKind::VolumeTable {
                assert_eq!(entry.birth(), 0, "volume-table entries have no birth");
            }
            let raw = entry.0 | (u64::from(header_bit(&header, i)) << STRIPE_SHIFT);
            block[i * ENTRY_BYTES..(i + 1) * ENTRY_BYTES].copy_from_slice(&raw.to_le_bytes());
        }
        let crc = node_crc(block);
        let mut crc_bytes = [0u8; 4];
        put_u32(&mut crc_bytes, 0, crc);
        set_header_bytes(block, HEADER_CRC_OFFSET, &crc_bytes);
    }

    /// Decodes and verifies a node read from `addr`. Every non-empty child
    /// must lie inside `valid_children` (the store's data area), and no
    /// entry may be born after `birth_max` (the pool's current generation).
    pub fn decode(
        block: &[u8],
        addr: BlockAddr,
        expected_kind: NodeKind,
        expected_level: u8,
        valid_children: std::ops::Range<u64>,
        birth_max: u64,
    ) -> Result<Node> {
        let damaged =
            |why: String| Error::corrupt(format!("radix node at {addr} is damaged: {why}"));
        let (kind, level) = decode_header(block, expected_kind, expected_level).map_err(damaged)?;
        let entries = decode_entries(block, kind, &valid_children, birth_max).map_err(damaged)?;
        Ok(Node {
            kind,
            level,
            entries: entries.into_boxed_slice(),
        })
    }
}

/// A node's size, magic, checksum, kind and level, in that order: the
/// kind and level are only worth reading once the checksum vouches for them.
fn decode_header(
    block: &[u8],
    expected_kind: NodeKind,
    expected_level: u8,
) -> std::result::Result<(NodeKind, u8), String> {
    if block.len() < NODE_HEADER_LEN * 8 * ENTRY_BYTES {
        return Err(format!("a node of {} bytes is too small", block.len()));
    }
    let mut header = [0u8; NODE_HEADER_LEN];
    header_bytes(block, 0, &mut header);
    if header[HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4] != NODE_MAGIC {
        return Err("no node magic".into());
    }
    let stored_crc = get_u32(&header, HEADER_CRC_OFFSET);
    let actual_crc = node_crc(block);
    if stored_crc != actual_crc {
        return Err(format!(
            "checksum mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})"
        ));
    }
    let kind = match header[HEADER_KIND_OFFSET] {
        1 => NodeKind::VolumeData,
        2 => NodeKind::VolumeTable,
        other => return Err(format!("unknown node kind {other}")),
    };
    if kind != expected_kind {
        return Err(format!(
            "a {kind:?} node where a {expected_kind:?} node belongs"
        ));
    }
    if header[HEADER_LEVEL_OFFSET + 1..].iter().any(|&b| b != 0) {
        return Err("reserved header bytes are not zero".into());
    }
    let level = header[HEADER_LEVEL_OFFSET];
    if level != expected_level {
        return Err(format!(
            "level {level} where level {expected_level} belongs"
        ));
    }
    Ok((kind, level))
}

/// Every entry of a node whose header checked out, each in the data area
/// and born no later than `birth_max`; the first bad one is named.
fn decode_entries(
    block: &[u8],
    kind: NodeKind,
    valid_children: &std::ops::Range<u64>,
    birth_max: u64,
) -> std::result::Result<Vec<Entry>, String> {
    let entry_count = block.len() / ENTRY_BYTES;
    let mut entries = Vec::with_capacity(entry_count);
    for i in 0..entry_count {
        let raw = u64::from_le_bytes(
            block[i * ENTRY_BYTES..(i + 1) * ENTRY_BYTES]
                .try_into()
                .expect("8 bytes"),
        );
        if i >= NODE_HEADER_LEN * 8 && raw & !ENTRY_PAYLOAD_MASK != 0 {
            return Err(format!("entry {i} has its stripe bit set"));
        }
        let entry = Entry(raw & ENTRY_PAYLOAD_MASK);
        if !entry.is_empty() && !valid_children.contains(&entry.addr().0) {
            return Err(format!(
                "entry {i} points at block {}, outside the data area",
                entry.addr().0
            ));
        }
        if entry.birth() > birth_max {
            return Err(format!(
                "entry {i} was born in generation {}, after the pool's generation {birth_max}",
                entry.birth()
            ));
        }
        if kind == NodeKind::VolumeTable && entry.birth() != 0 {
            return Err(format!("volume-table entry {i} has a birth"));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Header bit `k`: bit k % 8 of header byte k / 8; it is striped into entry k.
fn header_bit(header: &[u8], k: usize) -> u8 {
    header.get(k / 8).map_or(0, |byte| (byte >> (k % 8)) & 1)
}

/// The stripe bit of entry `k`: the entry's top bit, in its last byte.
fn stripe_byte_position(k: usize) -> usize {
    k * ENTRY_BYTES + ENTRY_BYTES - 1
}

fn header_bytes(block: &[u8], start: usize, out: &mut [u8]) {
    for (j, byte) in out.iter_mut().enumerate() {
        *byte = 0;
        for bit in 0..8 {
            let k = (start + j) * 8 + bit;
            *byte |= (block[stripe_byte_position(k)] >> 7) << bit;
        }
    }
}

fn set_header_bytes(block: &mut [u8], start: usize, bytes: &[u8]) {
    for (j, &byte) in bytes.iter().enumerate() {
        for bit in 0..8 {
            let k = (start + j) * 8 + bit;
            let position = stripe_byte_position(k);
            block[position] = (block[position] & 0x7f) | (((byte >> bit) & 1) << 7);
        }
    }
}

/// CRC-32C of the block with the 32 stripe bits of the checksum taken as zero.
fn node_crc(block: &[u8]) -> u32 {
    let crc_span = CRC_STRIPE_ENTRIES * ENTRY_BYTES;
    let mut head = [0u8; CRC_STRIPE_ENTRIES * ENTRY_BYTES];
    head.copy_from_slice(&block[..crc_span]);
    for k in 0..CRC_STRIPE_ENTRIES {
        head[stripe_byte_position(k)] &= 0x7f;
    }
    let crc = crc32c::crc32c(&head);
    crc32c::crc32c_append(crc, &block[crc_span..])
}
