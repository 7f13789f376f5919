//! One archived snapshot's index: which pack slot holds each block's
//! version, as runs of consecutive blocks in consecutive slots of one pack.
//! A block no run covers reads as zeros (a hole). Written whole, once per
//! snapshot and catalog generation, never changed.
//!
//! ```text
//! offset  size       field
//! 0       8          magic "GRVAINDX"
//! 8       4          format version (1)
//! 12      4          block size in bytes
//! 16      8          the snapshot's sequence number in the archive
//! 24      8          the snapshot's size in bytes
//! 32      8          runs
//! 40      4          crc32c of the runs
//! 44      4          crc32c of bytes 0..44
//! 48      24 x runs  first block u64, pack id u64, first slot u32, blocks u32
//! ```

use super::{le_u32, le_u64};

pub const MAGIC: &[u8; 8] = b"GRVAINDX";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 48;
pub const RUN_BYTES: usize = 24;

/// Blocks `first_block..first_block + blocks` are in slots
/// `first_slot..first_slot + blocks` of pack `pack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first_block: u64,
    pub pack: u64,
    pub first_slot: u32,
    pub blocks: u32,
}

impl Run {
    pub fn end_block(&self) -> u64 {
        self.first_block + u64::from(self.blocks)
    }

    /// Whether `next` continues this run (the next block, the next slot).
    pub fn is_continued_by(&self, next: &Run) -> bool {
        next.first_block == self.end_block()
            && next.pack == self.pack
            && u64::from(next.first_slot) == u64::from(self.first_slot) + u64::from(self.blocks)
            && u64::from(self.blocks) + u64::from(next.blocks) <= u64::from(u32::MAX)
    }
}

/// A decoded index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotIndex {
    pub seq: u64,
    pub block_bytes: u32,
    pub size_bytes: u64,
    /// Sorted by block, not overlapping.
    pub runs: Vec<Run>,
}

impl SnapshotIndex {
    /// The blocks of the snapshot (the last may be partly past its end).
    pub fn blocks(&self) -> u64 {
        self.size_bytes.div_ceil(u64::from(self.block_bytes))
    }

    /// The pack and slot holding `block`, or None for a hole.
    pub fn lookup(&self, block: u64) -> Option<(u64, u32)> {
        let i = self.runs.partition_point(|r| r.end_block() <= block);
        let run = self.runs.get(i)?;
        (run.first_block <= block)
            .then(|| (run.pack, run.first_slot + (block - run.first_block) as u32))
    }

    /// Bytes of data the snapshot maps.
    pub fn mapped_bytes(&self) -> u64 {
        self.runs.iter().map(|r| u64::from(r.blocks)).sum::<u64>() * u64::from(self.block_bytes)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.runs.len() * RUN_BYTES);
        for run in &self.runs {
            body.extend_from_slice(&run.first_block.to_le_bytes());
            body.extend_from_slice(&run.pack.to_le_bytes());
            body.extend_from_slice(&run.first_slot.to_le_bytes());
            body.extend_from_slice(&run.blocks.to_le_bytes());
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.block_bytes.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&(self.runs.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes an index and checks it is the one expected: snapshot `seq`
    /// of an archive with blocks of `block_bytes`.
    pub fn decode(bytes: &[u8], seq: u64, block_bytes: u32) -> Result<SnapshotIndex, String> {
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
        let index = SnapshotIndex {
            block_bytes: le_u32(bytes, 12),
            seq: le_u64(bytes, 16),
            size_bytes: le_u64(bytes, 24),
            runs: Vec::new(),
        };
        if index.seq != seq || index.block_bytes != block_bytes {
            return Err(format!(
                "the index of snapshot {} with {}-byte blocks, expected snapshot {seq} with {block_bytes}",
                index.seq, index.block_bytes
            ));
        }
        let body = &bytes[HEADER_BYTES..];
        let runs = le_u64(bytes, 32);
        if runs.checked_mul(RUN_BYTES as u64) != Some(body.len() as u64) {
            return Err(format!(
                "{runs} runs in {} bytes (a truncated index)",
                body.len()
            ));
        }
        if le_u32(bytes, 40) != crc32c::crc32c(body) {
            return Err("the index's runs fail their checksum".into());
        }
        index.with_runs(body)
    }

    fn with_runs(mut self, body: &[u8]) -> Result<SnapshotIndex, String> {
        let blocks = self.blocks();
        let mut end = 0u64;
        for at in (0..body.len()).step_by(RUN_BYTES) {
            let run = Run {
                first_block: le_u64(body, at),
                pack: le_u64(body, at + 8),
                first_slot: le_u32(body, at + 16),
                blocks: le_u32(body, at + 20),
            };
            let run_end = run.first_block.checked_add(u64::from(run.blocks));
            if run.blocks == 0 || run.first_block < end || run_end.is_none_or(|e| e > blocks) {
                return Err(format!(
                    "run at block {} is empty, out of order or past the end",
                    run.first_block
                ));
            }
            if u64::from(run.first_slot) + u64::from(run.blocks) > u64::from(u32::MAX) {
                return Err(format!(
                    "run at block {} has slots past any pack",
                    run.first_block
                ));
            }
            end = run.end_block();
            self.runs.push(run);
        }
        Ok(self)
    }
}

/// Runs sorted by block with neighbours that continue each other merged.
pub fn coalesce(runs: impl IntoIterator<Item = Run>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for run in runs {
        match out.last_mut() {
            Some(last) if last.is_continued_by(&run) => last.blocks += run.blocks,
            _ => out.push(run),
        }
    }
    out
}

/// `base` with every block in `changed` (sorted, disjoint block ranges)
/// dropped, and `written` (sorted runs, inside `changed`) put in: the index
/// of a snapshot from its predecessor's and what differs.
pub fn apply_changes(base: &[Run], changed: &[(u64, u64)], written: &[Run]) -> Vec<Run> {
    let mut kept = Vec::with_capacity(base.len() + written.len());
    let mut c = 0;
    for run in base {
        let mut start = run.first_block;
        let end = run.end_block();
        while c < changed.len() && changed[c].1 <= start {
            c += 1;
        }
        let mut k = c;
        while start < end {
            let next_change = changed.get(k).copied().filter(|&(a, _)| a < end);
            let piece_end = next_change.map_or(end, |(a, _)| a.max(start));
            if piece_end > start {
                kept.push(slice(run, start, piece_end));
            }
            match next_change {
                Some((_, b)) => {
                    start = b.max(start).min(end);
                    k += 1;
                }
                None => start = end,
            }
        }
    }
    kept.extend_from_slice(written);
    kept.sort_by_key(|r| r.first_block);
    coalesce(kept)
}

/// Blocks `from..to` of `run`.
fn slice(run: &Run, from: u64, to: u64) -> Run {
    Run {
        first_block: from,
        pack: run.pack,
        first_slot: run.first_slot + (from - run.first_block) as u32,
        blocks: (to - from) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(first_block: u64, pack: u64, first_slot: u32, blocks: u32) -> Run {
        Run {
            first_block,
            pack,
            first_slot,
            blocks,
        }
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let index = SnapshotIndex {
            seq: 3,
            block_bytes: 4096,
            size_bytes: 100 * 4096,
            runs: vec![run(0, 1, 0, 10), run(20, 2, 5, 3)],
        };
        let bytes = index.encode();
        assert_eq!(SnapshotIndex::decode(&bytes, 3, 4096).unwrap(), index);
        assert_eq!(index.lookup(21), Some((2, 6)));
        assert_eq!(index.lookup(10), None);
        assert!(
            SnapshotIndex::decode(&bytes, 4, 4096).is_err(),
            "another snapshot's"
        );
        for len in 0..bytes.len() {
            assert!(SnapshotIndex::decode(&bytes[..len], 3, 4096).is_err());
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(
                SnapshotIndex::decode(&bad, 3, 4096).is_err(),
                "flip at {at}"
            );
        }
    }

    fn lookup_all(runs: &[Run], blocks: u64) -> Vec<Option<(u64, u32)>> {
        let index = SnapshotIndex {
            seq: 0,
            block_bytes: 1,
            size_bytes: blocks,
            runs: runs.to_vec(),
        };
        (0..blocks).map(|b| index.lookup(b)).collect()
    }

    proptest! {
        #[test]
        fn apply_changes_matches_a_block_map(
            base_map in proptest::collection::vec(proptest::option::of(0u64..3), 64),
            changes in proptest::collection::vec((any::<bool>(), proptest::option::of(Just(9u64))), 64),
        ) {
            // The base: block b in pack base_map[b] at slot b.
            let base = coalesce(base_map.iter().enumerate().filter_map(|(b, p)| {
                p.map(|p| run(b as u64, p, b as u32, 1))
            }));
            let mut changed = Vec::new();
            let mut written = Vec::new();
            let mut expected = lookup_all(&base, 64);
            for (b, (is_changed, new)) in changes.iter().enumerate() {
                if *is_changed {
                    changed.push((b as u64, b as u64 + 1));
                    expected[b] = new.map(|p| (p, 100 + b as u32));
                    if let Some(p) = new {
                        written.push(run(b as u64, *p, 100 + b as u32, 1));
                    }
                }
            }
            let changed = coalesce_ranges(&changed);
            let result = apply_changes(&base, &changed, &coalesce(written));
            prop_assert_eq!(lookup_all(&result, 64), expected);
            prop_assert!(result.windows(2).all(|w| w[0].end_block() <= w[1].first_block));
        }
    }

    fn coalesce_ranges(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(a, b) in ranges {
            match out.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => out.push((a, b)),
            }
        }
        out
    }
}
