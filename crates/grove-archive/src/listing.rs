//! `grove archive list`: each archived snapshot with its rank, when the
//! policy lets it expire, and the bytes it alone holds (what expiring it
//! alone would free).

use crate::archive::Archive;
use crate::error::{ArchiveError, Result};
use crate::format::catalog::Catalog;
use crate::format::index::{PageRef, SnapshotRoot};
use crate::format::runs::{lookup, mapped_blocks, Run};
use crate::ledger;
use crate::lru::Lru;
use crate::reader::PackReader;
use crate::verdicts;
use grove_retention::{Level, Policy};
use std::sync::Arc;

/// The mapped blocks of pages counted, remembered within this many bytes.
const MAPPED_MEMO_BYTES: u64 = 4 << 20;

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
    /// Bytes of the index: roots, page objects and forward tables. With
    /// `stored_bytes`, the store's size (the catalogs add a few KiB).
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
    // Three roots at a time (a snapshot and its neighbours), whatever the
    // number of snapshots: a version is referenced by a run of consecutive
    // snapshots, so only neighbours can share one. Pages go through the
    // reader's bounded cache.
    let reader = PackReader::default();
    let mut mapped = Lru::new(MAPPED_MEMO_BYTES);
    let count = catalog.snapshots.len();
    let mut previous: Option<SnapshotRoot> = None;
    let mut current = (count > 0)
        .then(|| load_root(archive, &catalog, 0))
        .transpose()?;
    let mut needed_blocks = 0;
    for (i, s) in catalog.snapshots.iter().enumerate() {
        let (root, mut damaged) = current.take().expect("one root a snapshot");
        let next = (i + 1 < count)
            .then(|| load_root(archive, &catalog, i + 1))
            .transpose()?;
        let neighbours = [
            previous.as_ref(),
            next.as_ref().and_then(|(n, _)| n.as_ref()),
        ];
        let counts = match &root {
            Some(root) => compare(archive, (&reader, &mut mapped), root, neighbours)?,
            None => Counts::default(),
        };
        damaged = damaged.or(counts.damaged);
        needed_blocks += counts.not_in_previous;
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
            mapped_bytes: counts.mapped * u64::from(catalog.block_bytes),
            unique_bytes: counts.unique * u64::from(catalog.block_bytes),
            hash: s.hash.clone(),
            damaged,
        });
        previous = root;
        current = next;
    }
    listing.needed_bytes = needed_blocks * u64::from(catalog.block_bytes);
    listing.index_bytes = ledger::index_bytes(&catalog);
    listing.packs = catalog.packs.len();
    listing.stored_bytes = ledger::stored_bytes(&catalog);
    listing.totals = catalog.totals.clone();
    listing.partial_push_packs = catalog.partial.as_ref().map(|p| p.packs.len());
    Ok(listing)
}

/// One snapshot's blocks, counted against its neighbours.
#[derive(Default)]
struct Counts {
    mapped: u64,
    /// Versions neither neighbour holds.
    unique: u64,
    /// Versions the previous snapshot does not hold.
    not_in_previous: u64,
    damaged: Option<String>,
}

/// Counts `root`'s versions against its neighbours `[previous, next]`, a
/// segment at a time. A page the previous snapshot shares holds nothing
/// new and nothing of its own, and is not read again (its mapped blocks
/// are remembered in `mapped`).
fn compare(
    archive: &Archive,
    (reader, mapped): (&PackReader, &mut Lru<PageRef, u64>),
    root: &SnapshotRoot,
    [previous, next]: [Option<&SnapshotRoot>; 2],
) -> Result<Counts> {
    let mut counts = Counts::default();
    for segment in 0..root.segments() {
        let Some(page) = root.page(segment) else {
            continue;
        };
        let runs = match mapped.get(&page) {
            Some(&blocks) if previous.is_some_and(|p| p.page(segment) == Some(page)) => {
                counts.mapped += blocks;
                continue;
            }
            _ => match reader.runs(archive, root, segment) {
                Ok(runs) => runs,
                Err(ArchiveError::Damaged(why)) => {
                    counts.damaged.get_or_insert(why);
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        let blocks = mapped_blocks(&runs);
        counts.mapped += blocks;
        mapped.put(page, blocks, 48);
        let [previous, next] =
            [previous, next].map(|n| n.map(|n| neighbour(archive, reader, n, segment, page)));
        let held_by = |n: &Option<Neighbour>, block: u64, mine| match n {
            Some(Neighbour::Shares) => true,
            Some(Neighbour::Runs(runs)) => lookup(runs, block) == Some(mine),
            None => false,
        };
        for run in runs.iter() {
            for i in 0..run.blocks {
                let block = run.first_block + u64::from(i);
                let mine = (run.pack, run.first_slot + i);
                let in_previous = held_by(&previous, block, mine);
                counts.not_in_previous += u64::from(!in_previous);
                counts.unique += u64::from(!in_previous && !held_by(&next, block, mine));
            }
        }
    }
    Ok(counts)
}

/// What a neighbour holds of a segment: the same page, or its own runs.
enum Neighbour {
    Shares,
    Runs(Arc<Vec<Run>>),
}

fn neighbour(
    archive: &Archive,
    reader: &PackReader,
    n: &SnapshotRoot,
    segment: u64,
    page: PageRef,
) -> Neighbour {
    if n.page(segment) == Some(page) {
        return Neighbour::Shares;
    }
    Neighbour::Runs(neighbour_runs(archive, reader, n, segment).unwrap_or_default())
}

/// A neighbour's runs of `segment`; a damaged page counts as holding nothing.
fn neighbour_runs(
    archive: &Archive,
    reader: &PackReader,
    root: &SnapshotRoot,
    segment: u64,
) -> Option<Arc<Vec<Run>>> {
    if segment >= root.segments() {
        return Some(Arc::default());
    }
    reader.runs(archive, root, segment).ok()
}

/// Snapshot `i`'s root; a damaged one is None, with why.
fn load_root(
    archive: &Archive,
    catalog: &Catalog,
    i: usize,
) -> Result<(Option<SnapshotRoot>, Option<String>)> {
    let s = &catalog.snapshots[i];
    match archive.root(&s.index, s.seq, catalog.block_bytes) {
        Ok(root) => Ok((Some(root), None)),
        Err(ArchiveError::Damaged(why)) => Ok((None, Some(why))),
        Err(e) => Err(e),
    }
}
