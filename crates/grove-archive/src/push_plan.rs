//! What a push stores: the blocks that differ from the newest archived
//! snapshot, read from the pool's diff (or everything the snapshot maps,
//! with no base the pool still knows).

use crate::archive::Archive;
use crate::error::Result;
use crate::format::catalog::{ArchivedSnapshot, Catalog};
use crate::format::index::SnapshotRoot;
use crate::ledger;
use grove_store::{DiffFrom, Pool};

/// Where the push starts from: the base's index and the blocks that differ.
pub(crate) struct Plan {
    pub base: Option<ArchivedSnapshot>,
    pub base_root: Option<SnapshotRoot>,
    /// Sorted, disjoint block ranges that differ from the base.
    pub changed: Vec<(u64, u64)>,
    /// Of those, the ranges the snapshot maps data in.
    pub with_data: Vec<(u64, u64)>,
}

/// What differs from the newest archived snapshot, read from the pool's
/// diff; without a base the pool still knows, everything the snapshot maps.
pub(crate) fn plan(
    archive: &Archive,
    pool: &Pool,
    catalog: &Catalog,
    snapshot: &str,
) -> Result<Plan> {
    let block_bytes = u64::from(catalog.block_bytes);
    let base = ledger::newest(catalog).cloned();
    let diff = base.as_ref().and_then(|b| {
        let guid: [u8; 16] = hex::decode(&b.guid).ok()?.try_into().ok()?;
        pool.diff_from(&DiffFrom::Guid(guid), snapshot).ok()
    });
    let Some(diff) = diff else {
        return full_plan(pool, snapshot, block_bytes);
    };
    let base = base.expect("a diff has a base");
    let base_root = archive.root(&base.index, base.seq, catalog.block_bytes)?;
    if base_root.segment_blocks != catalog.segment_blocks {
        // An index cut into other segments: push it whole.
        return full_plan(pool, snapshot, block_bytes);
    }
    let changed = to_block_ranges(
        diff.extents
            .iter()
            .map(|e| (e.offset_bytes, e.length_bytes)),
        block_bytes,
    );
    let with_data = to_block_ranges(
        diff.extents
            .iter()
            .filter(|e| e.data)
            .map(|e| (e.offset_bytes, e.length_bytes)),
        block_bytes,
    );
    Ok(Plan {
        base: Some(base),
        base_root: Some(base_root),
        changed,
        with_data,
    })
}

/// Everything the snapshot maps, with no base.
fn full_plan(pool: &Pool, snapshot: &str, block_bytes: u64) -> Result<Plan> {
    let mapped = pool.volume(snapshot)?.mapped_extents()?;
    let ranges = to_block_ranges(mapped.into_iter(), block_bytes);
    Ok(Plan {
        base: None,
        base_root: None,
        changed: ranges.clone(),
        with_data: ranges,
    })
}

/// Byte extents as sorted, merged block ranges.
fn to_block_ranges(extents: impl Iterator<Item = (u64, u64)>, block_bytes: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = extents
        .filter(|&(_, len)| len > 0)
        .map(|(off, len)| (off / block_bytes, (off + len).div_ceil(block_bytes)))
        .collect();
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if last.1 >= a => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

pub(crate) fn ranges_blocks(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|(a, b)| b - a).sum()
}
