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
    /// Bytes of the archived snapshots' index objects: with `stored_bytes`,
    /// the store's size (the catalogs add a few KiB).
    pub index_bytes: u64,
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
    // Three indexes at a time (a snapshot and its neighbours), whatever
    // the number of snapshots: a version is referenced by a run of
    // consecutive snapshots, so only neighbours can share one.
    let count = catalog.snapshots.len();
    let mut previous: Option<SnapshotIndex> = None;
    let mut current = (count > 0)
        .then(|| load_index(archive, &catalog, 0))
        .transpose()?;
    let mut needed_blocks = 0;
    for (i, s) in catalog.snapshots.iter().enumerate() {
        let (index, damaged) = current.take().expect("one index a snapshot");
        let next = (i + 1 < count)
            .then(|| load_index(archive, &catalog, i + 1))
            .transpose()?;
        let neighbours = [previous.as_ref(), next.as_ref().map(|(n, _)| n)];
        needed_blocks += blocks_not_in(&index, previous.as_ref());
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
            mapped_bytes: index.mapped_bytes(),
            unique_bytes: unique_blocks(&index, &neighbours) * u64::from(catalog.block_bytes),
            hash: s.hash.clone(),
            damaged,
        });
        previous = Some(index);
        current = next;
    }
    listing.needed_bytes = needed_blocks * u64::from(catalog.block_bytes);
    listing.index_bytes = archive
        .list_objects()?
        .into_iter()
        .filter(|(name, _)| catalog.snapshots.iter().any(|s| &s.index == name))
        .map(|(_, size)| size)
        .sum();
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

/// Snapshot `i`'s index; a damaged one reads as empty, with why.
fn load_index(
    archive: &Archive,
    catalog: &crate::format::catalog::Catalog,
    i: usize,
) -> Result<(SnapshotIndex, Option<String>)> {
    let s = &catalog.snapshots[i];
    match archive.index(&s.index, s.seq, catalog.block_bytes) {
        Ok(index) => Ok((index, None)),
        Err(crate::error::ArchiveError::Damaged(why)) => Ok((
            SnapshotIndex {
                seq: s.seq,
                block_bytes: catalog.block_bytes,
                size_bytes: s.size_bytes,
                runs: Vec::new(),
            },
            Some(why),
        )),
        Err(e) => Err(e),
    }
}

/// Blocks whose version in `index` the previous snapshot does not hold:
/// summed over the snapshots in order, each distinct version once.
fn blocks_not_in(index: &SnapshotIndex, previous: Option<&SnapshotIndex>) -> u64 {
    let Some(previous) = previous else {
        return index.runs.iter().map(|r| u64::from(r.blocks)).sum();
    };
    unique_blocks(index, &[Some(previous), None])
}
