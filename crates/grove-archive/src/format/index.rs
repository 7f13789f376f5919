//! One archived snapshot's index root: for each segment of the volume's
//! blocks, the index page that maps it (page.rs), or none when every block
//! of the segment is a hole. Pages are shared between snapshots, so a push
//! writes pages only for the segments that changed, and a reader holds the
//! root and the pages it is using, not a whole map. Written once per
//! snapshot, never changed.
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
//! 40      4              crc32c of the entries
//! 44      4              crc32c of bytes 0..44
//! 48      segments x     page object id u64 (0: all holes), offset u32,
//!                        length u32, packs u32, then packs x pack id u64
//! ```
//!
//! Each segment names the packs its page's runs address (an address's
//! pack, copied or not): a push learns every pack the snapshot references
//! from the root alone, pages it shares unread, and expiry skips the
//! segments that address none of the packs it is looking for.

use super::{le_u32, le_u64};

pub const MAGIC: &[u8; 8] = b"GRVAINDX";
pub const VERSION: u32 = 2;
pub const HEADER_BYTES: usize = 48;
/// Bytes of a segment's entry before its pack ids.
pub const ENTRY_BYTES: usize = 20;
/// Blocks a page maps: 64 MiB of 4 KiB blocks, so that a page holds at
/// most 384 KiB of runs and a 64 GiB volume's root is 16 KiB.
pub const SEGMENT_BLOCKS: u32 = 1 << 14;

/// Where one page is: bytes `offset..offset + len` of page object `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageRef {
    pub object: u64,
    pub offset: u32,
    pub len: u32,
}

/// One segment of a root: its page, and the packs the page's runs address
/// (sorted, distinct).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segment {
    pub page: Option<PageRef>,
    pub packs: Vec<u64>,
}

/// A decoded index root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRoot {
    pub seq: u64,
    pub block_bytes: u32,
    pub size_bytes: u64,
    pub segment_blocks: u32,
    /// One entry a segment; a page of None: every block of it is a hole.
    pub segments: Vec<Segment>,
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

    /// The blocks of segment `segment` that lie inside the snapshot.
    pub fn segment_range(&self, segment: u64) -> std::ops::Range<u64> {
        let start = segment * u64::from(self.segment_blocks);
        start..(start + u64::from(self.segment_blocks)).min(self.blocks())
    }

    pub fn segment_of(&self, block: u64) -> u64 {
        block / u64::from(self.segment_blocks)
    }

    /// The page of `block`'s segment.
    pub fn page_of(&self, block: u64) -> Option<PageRef> {
        self.segments
            .get(self.segment_of(block) as usize)
            .and_then(|s| s.page)
    }

    /// Every pack the snapshot's pages address, once each.
    pub fn packs(&self) -> std::collections::BTreeSet<u64> {
        self.segments
            .iter()
            .flat_map(|s| s.packs.iter().copied())
            .collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.segments.len() * ENTRY_BYTES);
        for segment in &self.segments {
            let p = segment.page.unwrap_or(PageRef {
                object: 0,
                offset: 0,
                len: 0,
            });
            body.extend_from_slice(&p.object.to_le_bytes());
            body.extend_from_slice(&p.offset.to_le_bytes());
            body.extend_from_slice(&p.len.to_le_bytes());
            let packs = u32::try_from(segment.packs.len()).expect("a segment's packs fit a u32");
            body.extend_from_slice(&packs.to_le_bytes());
            for pack in &segment.packs {
                body.extend_from_slice(&pack.to_le_bytes());
            }
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.block_bytes.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.segment_blocks.to_le_bytes());
        let segments = u32::try_from(self.segments.len()).expect("segments fit a u32");
        out.extend_from_slice(&segments.to_le_bytes());
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
        if le_u32(bytes, 44) != crc32c::crc32c(&bytes[..44]) {
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
            segments: Vec::new(),
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
        let body = &bytes[HEADER_BYTES..];
        if le_u32(bytes, 40) != crc32c::crc32c(body) {
            return Err(
                "the index's entries fail their checksum (a damaged or truncated index)".into(),
            );
        }
        root.segments = decode_segments(body, segments)?;
        Ok(root)
    }
}

fn decode_segments(body: &[u8], segments: usize) -> Result<Vec<Segment>, String> {
    let truncated = || {
        format!(
            "{segments} segments in {} bytes (a truncated index)",
            body.len()
        )
    };
    let mut out = Vec::with_capacity(segments.min(body.len() / ENTRY_BYTES));
    let mut at = 0usize;
    for _ in 0..segments {
        let e = body.get(at..at + ENTRY_BYTES).ok_or_else(truncated)?;
        let object = le_u64(e, 0);
        let page = (object != 0).then(|| PageRef {
            object,
            offset: le_u32(e, 8),
            len: le_u32(e, 12),
        });
        let count = le_u32(e, 16) as usize;
        at += ENTRY_BYTES;
        let ids_len = count.checked_mul(8).ok_or_else(truncated)?;
        let ids = body.get(at..at + ids_len).ok_or_else(truncated)?;
        let packs: Vec<u64> = ids.chunks(8).map(|c| le_u64(c, 0)).collect();
        if packs.windows(2).any(|w| w[0] >= w[1]) || (page.is_none() && !packs.is_empty()) {
            return Err("a segment's packs are out of order, or name packs for holes".into());
        }
        at += ids_len;
        out.push(Segment { page, packs });
    }
    if at != body.len() {
        return Err(format!("{} bytes after the last segment", body.len() - at));
    }
    Ok(out)
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
            segments: (0..7)
                .map(|s| Segment {
                    page: (s % 3 != 0).then_some(PageRef {
                        object: 9,
                        offset: s * 100,
                        len: 80,
                    }),
                    packs: if s % 3 != 0 {
                        vec![1, 2 + u64::from(s)]
                    } else {
                        Vec::new()
                    },
                })
                .collect(),
        };
        let bytes = root.encode();
        assert_eq!(SnapshotRoot::decode(&bytes, 3, 4096).unwrap(), root);
        assert_eq!(root.segment_range(6), 96..100);
        assert_eq!(root.page_of(17), root.segments[1].page);
        assert!(root.packs().contains(&7) && !root.packs().contains(&5));
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
