//! `grove archive list`: each archived snapshot with its rank, when the
//! policy lets it expire, and the bytes it alone holds (what expiring it
//! alone would free).

use crate::archive::Archive;
use crate::error::Result;
use crate::format::index::SnapshotIndex;
use crate::ledger;
use crate::verdicts;
use grove_retention::{Level, Policy};

/// One archived snapshot, as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ListedSnapshot {
    pub name: String,
    pub seq: u64,
    pub created_unix_secs: u64,
    /// The rank's level name, or "none" (pushed by hand).
    pub rank: String,
    /// About when the policy lets it go; None: kept until released, or no policy.
    pub expires_unix_secs: Option<u64>,
    pub why: String,
    pub size_bytes: u64,
    pub mapped_bytes: u64,
    /// Bytes of versions no other archived snapshot references.
    pub unique_bytes: u64,
    pub hash: String,
    /// Why its index cannot be read, if it cannot (`archive check` says more).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

/// The archive as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ArchiveListing {
    pub store: String,
    pub volume: String,
    pub snapshots: Vec<ListedSnapshot>,
    pub packs: usize,
    pub stored_bytes: u64,
    /// Bytes of the distinct block versions the archived snapshots map:
    /// what they need at the least (the store is this plus pack headers,
    /// block tables, checksums and indexes, and what expiry has not freed).
    pub needed_bytes: u64,
    pub totals: crate::format::catalog::Totals,
    /// A push that stopped part way, to be resumed by pushing it again.
    pub partial_push_packs: Option<usize>,
}

/// Lists the archive; with `policy`, says when each snapshot expires.
pub fn list(
    archive: &Archive,
    policy: Option<&Policy>,
    now_unix_secs: u64,
) -> Result<ArchiveListing> {
    let mut listing = ArchiveListing {
        store: archive.describe(),
        volume: archive.volume().to_string(),
        ..ArchiveListing::default()
    };
    let Some(catalog) = archive.load()? else {
        return Ok(listing);
    };
    let verdicts = policy.map(|p| verdicts::judge(&catalog, p, now_unix_secs));
    // A damaged index still lists its snapshot, marked, with what the
    // index would have said left empty.
    let mut damaged = Vec::new();
    let mut indexes = Vec::new();
    for s in &catalog.snapshots {
        match archive.index(&s.index, s.seq, catalog.block_bytes) {
            Ok(index) => {
                damaged.push(None);
                indexes.push(index);
            }
            Err(crate::error::ArchiveError::Damaged(why)) => {
                damaged.push(Some(why));
                indexes.push(SnapshotIndex {
                    seq: s.seq,
                    block_bytes: catalog.block_bytes,
                    size_bytes: s.size_bytes,
                    runs: Vec::new(),
                });
            }
            Err(e) => return Err(e),
        }
    }
    for (i, s) in catalog.snapshots.iter().enumerate() {
        let neighbours = [i.checked_sub(1).map(|j| &indexes[j]), indexes.get(i + 1)];
        let until = verdicts.as_ref().map(|v| v.kept_until(s.seq));
        listing.snapshots.push(ListedSnapshot {
            name: s.name.clone(),
            seq: s.seq,
            created_unix_secs: s.created_unix_secs,
            rank: Level::from_rank(s.rank).map_or("none".into(), |l| l.name().to_string()),
            expires_unix_secs: until.filter(|&u| u != u64::MAX && u != 0),
            why: verdicts
                .as_ref()
                .map_or("no archive policy".into(), |v| v.explain(s.seq).to_string()),
            size_bytes: s.size_bytes,
            mapped_bytes: indexes[i].mapped_bytes(),
            unique_bytes: unique_blocks(&indexes[i], &neighbours) * u64::from(catalog.block_bytes),
            hash: s.hash.clone(),
            damaged: damaged[i].take(),
        });
    }
    listing.needed_bytes = distinct_versions(&indexes) * u64::from(catalog.block_bytes);
    listing.packs = catalog.packs.len();
    listing.stored_bytes = ledger::stored_bytes(&catalog);
    listing.totals = catalog.totals.clone();
    listing.partial_push_packs = catalog.partial.as_ref().map(|p| p.packs.len());
    Ok(listing)
}

/// Blocks whose version in `index` neither neighbour holds. A version is
/// referenced by a contiguous range of snapshots, so the neighbours are
/// the only ones that could share it.
fn unique_blocks(index: &SnapshotIndex, neighbours: &[Option<&SnapshotIndex>; 2]) -> u64 {
    let mut unique = 0;
    for run in &index.runs {
        for i in 0..run.blocks {
            let block = run.first_block + u64::from(i);
            let mine = Some((run.pack, run.first_slot + i));
            if neighbours.iter().flatten().all(|n| n.lookup(block) != mine) {
                unique += 1;
            }
        }
    }
    unique
}

/// The distinct (pack, slot) versions the indexes map.
fn distinct_versions(indexes: &[SnapshotIndex]) -> u64 {
    let mut slots: std::collections::BTreeMap<u64, std::collections::BTreeSet<u32>> =
        std::collections::BTreeMap::new();
    for run in indexes.iter().flat_map(|i| &i.runs) {
        slots
            .entry(run.pack)
            .or_default()
            .extend(run.first_slot..run.first_slot + run.blocks);
    }
    slots.values().map(|s| s.len() as u64).sum()
}
