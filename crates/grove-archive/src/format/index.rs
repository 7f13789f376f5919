//! One archived snapshot's index root: for each segment of the volume's
//! blocks, the index page that maps it (page.rs), or none when every block
//! of the segment is a hole; and every pack the pages address, with how
//! many pages address it. Pages are shared between snapshots, so a push
//! writes pages only for the segments that changed and learns the packs
//! the snapshot references from its base's root and the pages it changed,
//! pages it shares unread. A reader holds the root and the pages it is
//! using, not a whole map. Written once per snapshot, never changed.
//!
//! ```text
//! offset  size           field
//! 0       8              magic "GRVAINDX"
//! 8       4              format version (2)
//! 12      4              block size in bytes
//! 16      8              the snapshot's sequence number in the archive
//! 24      8              the snapshot's size in bytes
//! 32      4              blocks per segment
//! 36      4              segments
//! 40      4              packs
//! 44      4              crc32c of the entries
//! 48      4              crc32c of bytes 0..48
//! 52      16 x segments  page object id u64 (0: all holes), offset u32, length u32
//! then    12 x packs     pack id u64, pages that address it u32; by pack id
//! ```

use super::{le_u32, le_u64};
use std::collections::BTreeSet;

pub const MAGIC: &[u8; 8] = b"GRVAINDX";
pub const VERSION: u32 = 2;
pub const HEADER_BYTES: usize = 52;
pub const PAGE_ENTRY_BYTES: usize = 16;
pub const PACK_ENTRY_BYTES: usize = 12;
/// Blocks a page maps: 64 MiB of 4 KiB blocks, so that a page holds at
/// most 384 KiB of runs and a 64 GiB volume's pages take 16 KiB of root.
pub const SEGMENT_BLOCKS: u32 = 1 << 14;

/// Where one page is: bytes `offset..offset + len` of page object `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageRef {
    pub object: u64,
    pub offset: u32,
    pub len: u32,
}

/// A decoded index root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRoot {
    pub seq: u64,
    pub block_bytes: u32,
    pub size_bytes: u64,
    pub segment_blocks: u32,
    /// One entry a segment; None: every block of it is a hole.
    pub pages: Vec<Option<PageRef>>,
    /// Every pack the pages' runs address, with how many pages address
    /// it; sorted by pack.
    pub packs: Vec<(u64, u32)>,
}

impl SnapshotRoot {
    /// The blocks of the snapshot (the last may be partly past its end).
    pub fn blocks(&self) -> u64 {
        self.size_bytes.div_ceil(u64::from(self.block_bytes))
    }

    /// The segments a snapshot of `blocks` blocks has.
    pub fn segments_for(blocks: u64, segment_blocks: u32) -> u64 {
        blocks.div_ceil(u64::from(segment_blocks))
    }

    pub fn segments(&self) -> u64 {
        self.pages.len() as u64
    }

    /// The blocks of segment `segment` that lie inside the snapshot.
    pub fn segment_range(&self, segment: u64) -> std::ops::Range<u64> {
        let start = segment * u64::from(self.segment_blocks);
        start..(start + u64::from(self.segment_blocks)).min(self.blocks())
    }

    pub fn segment_of(&self, block: u64) -> u64 {
        block / u64::from(self.segment_blocks)
    }

    /// The page of segment `segment`, if it has one.
    pub fn page(&self, segment: u64) -> Option<PageRef> {
        self.pages.get(segment as usize).copied().flatten()
    }

    /// Every pack the snapshot's pages address.
    pub fn pack_ids(&self) -> BTreeSet<u64> {
        self.packs.iter().map(|&(id, _)| id).collect()
    }

    /// Whether any page addresses pack `pack`.
    pub fn addresses(&self, pack: u64) -> bool {
        self.packs
            .binary_search_by_key(&pack, |&(id, _)| id)
            .is_ok()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(
            self.pages.len() * PAGE_ENTRY_BYTES + self.packs.len() * PACK_ENTRY_BYTES,
        );
        for page in &self.pages {
            let p = page.unwrap_or(PageRef {
                object: 0,
                offset: 0,
                len: 0,
            });
            body.extend_from_slice(&p.object.to_le_bytes());
            body.extend_from_slice(&p.offset.to_le_bytes());
            body.extend_from_slice(&p.len.to_le_bytes());
        }
        for (pack, pages) in &self.packs {
            body.extend_from_slice(&pack.to_le_bytes());
            body.extend_from_slice(&pages.to_le_bytes());
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.block_bytes.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.segment_blocks.to_le_bytes());
        let count = |n: usize| u32::try_from(n).expect("a root's entries fit a u32");
        out.extend_from_slice(&count(self.pages.len()).to_le_bytes());
        out.extend_from_slice(&count(self.packs.len()).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a root and checks it is the one expected: snapshot `seq` of
    /// an archive with blocks of `block_bytes`.
    pub fn decode(bytes: &[u8], seq: u64, block_bytes: u32) -> Result<SnapshotRoot, String> {
        if bytes.len() < HEADER_BYTES {
            return Err(format!(
                "{} bytes, shorter than an index header",
                bytes.len()
            ));
        }
        if &bytes[..8] != MAGIC {
            return Err("not a grove archive index (bad magic)".into());
        }
        if le_u32(bytes, 48) != crc32c::crc32c(&bytes[..48]) {
            return Err("the index header's checksum does not match".into());
        }
        let version = le_u32(bytes, 8);
        if version != VERSION {
            return Err(format!(
                "index format version {version}, this grove reads {VERSION}"
            ));
        }
        let mut root = SnapshotRoot {
            block_bytes: le_u32(bytes, 12),
            seq: le_u64(bytes, 16),
            size_bytes: le_u64(bytes, 24),
            segment_blocks: le_u32(bytes, 32),
            pages: Vec::new(),
            packs: Vec::new(),
        };
        if root.seq != seq || root.block_bytes != block_bytes {
            return Err(format!(
                "the index of snapshot {} with {}-byte blocks, expected snapshot {seq} with {block_bytes}",
                root.seq, root.block_bytes
            ));
        }
        if root.block_bytes == 0 || root.segment_blocks == 0 {
            return Err("an index with no blocks per segment".into());
        }
        let segments = le_u32(bytes, 36) as usize;
        if segments as u64 != Self::segments_for(root.blocks(), root.segment_blocks) {
            return Err(format!(
                "{segments} segments for a snapshot of {} bytes",
                root.size_bytes
            ));
        }
        let packs = le_u32(bytes, 40) as usize;
        let body = &bytes[HEADER_BYTES..];
        if segments * PAGE_ENTRY_BYTES + packs * PACK_ENTRY_BYTES != body.len() {
            return Err(format!(
                "{segments} segments and {packs} packs in {} bytes (a truncated index)",
                body.len()
            ));
        }
        if le_u32(bytes, 44) != crc32c::crc32c(body) {
            return Err("the index's entries fail their checksum".into());
        }
        let (pages, packs_bytes) = body.split_at(segments * PAGE_ENTRY_BYTES);
        root.pages = pages.chunks(PAGE_ENTRY_BYTES).map(page_entry).collect();
        root.packs = packs_bytes
            .chunks(PACK_ENTRY_BYTES)
            .map(|e| (le_u64(e, 0), le_u32(e, 8)))
            .collect();
        if root.packs.windows(2).any(|w| w[0].0 >= w[1].0) || root.packs.iter().any(|p| p.1 == 0) {
            return Err("the index's packs are out of order or counted zero times".into());
        }
        Ok(root)
    }
}

fn page_entry(e: &[u8]) -> Option<PageRef> {
    let object = le_u64(e, 0);
    (object != 0).then(|| PageRef {
        object,
        offset: le_u32(e, 8),
        len: le_u32(e, 12),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let root = SnapshotRoot {
            seq: 3,
            block_bytes: 4096,
            size_bytes: 100 * 4096,
            segment_blocks: 16,
            pages: (0..7)
                .map(|s| {
                    (s % 3 != 0).then_some(PageRef {
                        object: 9,
                        offset: s * 100,
                        len: 80,
                    })
                })
                .collect(),
            packs: vec![(1, 4), (3, 1), (7, 2)],
        };
        let bytes = root.encode();
        assert_eq!(SnapshotRoot::decode(&bytes, 3, 4096).unwrap(), root);
        assert_eq!(root.segment_range(6), 96..100);
        assert_eq!(root.page(1), root.pages[1]);
        assert!(root.addresses(7) && !root.addresses(5));
        assert!(
            SnapshotRoot::decode(&bytes, 4, 4096).is_err(),
            "another snapshot's"
        );
        for len in 0..bytes.len() {
            assert!(SnapshotRoot::decode(&bytes[..len], 3, 4096).is_err());
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(SnapshotRoot::decode(&bad, 3, 4096).is_err(), "flip at {at}");
        }
    }
}
