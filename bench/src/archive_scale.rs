//! `grove-bench archive-scale`: a large archive made directly, object by
//! object, with grove-archive's own encoders, laid out as `grove archive
//! push` lays it out (issue 37 point 6: commands on an archive of 10,000
//! snapshots of a 64 GiB volume run in bounded memory). Pushing 10,000
//! snapshots would take hours; writing their objects takes minutes.
//!
//! Snapshot i changes `--changes` random 4 KiB blocks of the one before
//! with random data: one pack (owned by i) holds their versions, the
//! changed segments get new pages in one page object, every other segment
//! keeps the previous snapshot's page, and the root lists each pack its
//! pages address with how many do. Reference ranges are exact: a pack or
//! page object lasts until the last snapshot that still addresses it. The
//! recorded hash is the snapshot's real `grove hash` (kept as a running
//! sum, the digest being additive), so a restore verifies. One catalog
//! commit at the end. Memory: the newest snapshot's runs and the counts of
//! what it addresses, and the catalog's records.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grove_archive::format::catalog::{self, ArchivedSnapshot, Catalog, PackRecord, PagesRecord};
use grove_archive::format::index::{PageRef, SnapshotRoot, SEGMENT_BLOCKS};
use grove_archive::format::pack::{self, SlotEntry};
use grove_archive::format::page;
use grove_archive::format::runs::{apply_changes, coalesce, lookup, Run};
use grove_objects::FolderStore;
use grove_retention::Level;
use grove_send::digest::ContentDigest;
use serde_json::json;

use crate::{Rng, BLOCK_BYTES};

const DAY_SECS: u64 = 86_400;

#[derive(clap::Args)]
pub struct ArchiveScaleArgs {
    /// The store to make the archive in (file:///DIR); it must hold no
    /// archive of --volume yet
    #[arg(long)]
    to: String,
    #[arg(long, default_value = "vm")]
    volume: String,
    #[arg(long, default_value_t = 64 << 30)]
    volume_bytes: u64,
    #[arg(long, default_value_t = 10_000)]
    snapshots: u64,
    /// Random 4 KiB blocks each snapshot rewrites
    #[arg(long, default_value_t = 16)]
    changes: u64,
    /// When the newest snapshot was taken (the others a day apart before
    /// it) [default: a day ago]
    #[arg(long)]
    newest_unix_secs: Option<u64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl ArchiveScaleArgs {
    pub fn run(self) -> Result<()> {
        let blocks = self.volume_bytes / BLOCK_BYTES;
        if blocks == 0 || !self.volume_bytes.is_multiple_of(BLOCK_BYTES) || self.changes > blocks {
            bail!(
                "--volume-bytes must be a whole number of 4 KiB blocks, at least --changes of them"
            );
        }
        let store = FolderStore::open(&self.to).with_context(|| format!("open {}", self.to))?;
        let catalog_folder = format!("archive-catalog={}", self.volume);
        if !store.list(&catalog_folder)?.is_empty() {
            bail!("{} already holds an archive of {}", self.to, self.volume);
        }
        let newest = self.newest_unix_secs.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                - DAY_SECS
        });
        let started = Instant::now();
        let mut fab = Fabricator::new(store, &self);
        for seq in 1..=self.snapshots {
            let created = newest.saturating_sub((self.snapshots - seq) * DAY_SECS);
            fab.add_snapshot(seq, created)?;
            if seq.is_multiple_of(1000) {
                eprintln!(
                    "archive-scale: {seq}/{} snapshots, {:.0} s",
                    self.snapshots,
                    started.elapsed().as_secs_f64()
                );
            }
        }
        let summary = fab.commit(&catalog_folder)?;
        println!(
            "{}",
            json!({"seconds": started.elapsed().as_secs_f64(), "summary": summary})
        );
        Ok(())
    }
}

/// The archive being made: the catalog's records, and the newest
/// snapshot's index (its runs and pages, and the counts of what they use).
struct Fabricator {
    store: FolderStore,
    folder: String,
    name_prefix: String,
    size_bytes: u64,
    changes: u64,
    seed: u64,
    catalog: Catalog,
    runs: Vec<Vec<Run>>,
    pages: Vec<Option<PageRef>>,
    /// Pack → pages of the newest snapshot that address it.
    pack_counts: BTreeMap<u64, u32>,
    /// Page object → pages of the newest snapshot in it.
    object_counts: BTreeMap<u64, u32>,
    digest: ContentDigest,
    rng: Rng,
}

impl Fabricator {
    fn new(store: FolderStore, args: &ArchiveScaleArgs) -> Fabricator {
        let segments = args
            .volume_bytes
            .div_ceil(BLOCK_BYTES * u64::from(SEGMENT_BLOCKS)) as usize;
        Fabricator {
            store,
            folder: format!("archive={}", args.volume),
            name_prefix: format!("{}@scale-", args.volume),
            size_bytes: args.volume_bytes,
            changes: args.changes,
            seed: args.seed,
            // Any id will do: readers only tell archives apart by it.
            catalog: Catalog::empty(
                &args.volume,
                format!("{:032x}", args.seed),
                BLOCK_BYTES as u32,
                SEGMENT_BLOCKS,
            ),
            runs: vec![Vec::new(); segments],
            pages: vec![None; segments],
            pack_counts: BTreeMap::new(),
            object_counts: BTreeMap::new(),
            digest: ContentDigest::empty(),
            rng: Rng(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        }
    }

    fn allocate(&mut self) -> u64 {
        let id = self.catalog.next_pack;
        self.catalog.next_pack += 1;
        id
    }

    /// Snapshot `seq`: its pack, its new pages, its root, its records.
    fn add_snapshot(&mut self, seq: u64, created_unix_secs: u64) -> Result<()> {
        assert_eq!(seq, self.catalog.next_seq, "snapshots are made in order");
        self.catalog.next_seq += 1;
        let changed = self.pick_blocks();
        let pack = self.store_pack(seq, &changed)?;
        for (slot, &block) in changed.iter().enumerate() {
            self.update_digest(block, pack, slot as u32);
        }
        self.store_pages(seq, &changed, pack)?;
        let root = SnapshotRoot {
            seq,
            block_bytes: BLOCK_BYTES as u32,
            size_bytes: self.size_bytes,
            segment_blocks: SEGMENT_BLOCKS,
            pages: self.pages.clone(),
            packs: self.pack_counts.iter().map(|(&p, &n)| (p, n)).collect(),
        };
        let index = format!("index-{seq:016x}");
        let bytes = root.encode();
        self.store.put(&self.folder, &index, &bytes)?;
        self.catalog.totals.index_bytes += bytes.len() as u64;
        self.settle_ranges(seq);
        self.catalog.snapshots.push(ArchivedSnapshot {
            seq,
            name: format!("{}{seq}", self.name_prefix),
            guid: format!("{:016x}{seq:016x}", self.seed ^ 0x5ca1e),
            created_unix_secs,
            created_generation: seq,
            rank: rank_of(seq).rank(),
            size_bytes: self.size_bytes,
            hash: hex::encode(self.digest.finish(self.size_bytes)),
            index,
            index_bytes: bytes.len() as u64,
            pushed_unix_secs: created_unix_secs + 60,
            stored_bytes: self.changes * BLOCK_BYTES,
            released: false,
        });
        Ok(())
    }

    /// `--changes` distinct random blocks, sorted.
    fn pick_blocks(&mut self) -> Vec<u64> {
        let blocks = self.size_bytes / BLOCK_BYTES;
        let mut picked = std::collections::BTreeSet::new();
        while (picked.len() as u64) < self.changes {
            picked.insert(self.rng.next() % blocks);
        }
        picked.into_iter().collect()
    }

    /// Stores the versions of `changed` (slot i: the i-th block) in a new
    /// pack owned by `seq`; returns its id.
    fn store_pack(&mut self, seq: u64, changed: &[u64]) -> Result<u64> {
        let id = self.allocate();
        let mut data = Vec::with_capacity(changed.len() * BLOCK_BYTES as usize);
        let entries: Vec<SlotEntry> = changed
            .iter()
            .enumerate()
            .map(|(slot, &block)| {
                data.extend_from_slice(&version_data(self.seed, id, slot as u32));
                SlotEntry {
                    block,
                    origin: (id, slot as u32),
                }
            })
            .collect();
        let bytes = pack::encode(id, BLOCK_BYTES as u32, &entries, &data);
        self.store
            .put(&self.folder, &format!("pack-{id:016x}"), &bytes)?;
        self.catalog.packs.push(PackRecord {
            id,
            owner_seq: seq,
            first_seq: seq,
            last_seq: seq,
            slots: entries.len() as u32,
            object_bytes: bytes.len() as u64,
        });
        self.catalog.totals.pushed_bytes += bytes.len() as u64;
        Ok(id)
    }

    /// The running digest with `block`'s old version taken away and its new
    /// one, slot `slot` of `pack`, put in.
    fn update_digest(&mut self, block: u64, pack: u64, slot: u32) {
        let offset = block * BLOCK_BYTES;
        let segment = (block / u64::from(SEGMENT_BLOCKS)) as usize;
        if let Some((old_pack, old_slot)) = lookup(&self.runs[segment], block) {
            self.digest
                .remove(offset, &version_data(self.seed, old_pack, old_slot));
        }
        self.digest
            .add(offset, &version_data(self.seed, pack, slot));
    }

    /// The changed segments' new pages, in one page object of `seq`'s.
    fn store_pages(&mut self, seq: u64, changed: &[u64], pack: u64) -> Result<()> {
        let object = self.allocate();
        let mut bytes = Vec::new();
        let mut first = 0;
        while first < changed.len() {
            let segment = changed[first] / u64::from(SEGMENT_BLOCKS);
            let end = first
                + changed[first..]
                    .iter()
                    .take_while(|&&b| b / u64::from(SEGMENT_BLOCKS) == segment)
                    .count();
            let written = coalesce((first..end).map(|slot| Run {
                first_block: changed[slot],
                pack,
                first_slot: slot as u32,
                blocks: 1,
            }));
            self.rewrite_segment(segment, &written, object, &mut bytes);
            first = end;
        }
        self.store
            .put(&self.folder, &format!("pages-{object:016x}"), &bytes)?;
        self.catalog.pages.push(PagesRecord {
            id: object,
            first_seq: seq,
            last_seq: seq,
            object_bytes: bytes.len() as u64,
        });
        self.catalog.totals.index_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Segment `segment`'s runs with `written` put in, as a new page at the
    /// end of `bytes` (page object `object`).
    fn rewrite_segment(&mut self, segment: u64, written: &[Run], object: u64, bytes: &mut Vec<u8>) {
        let s = segment as usize;
        let old = std::mem::take(&mut self.runs[s]);
        count_packs(&mut self.pack_counts, &old, false);
        if let Some(page) = self.pages[s] {
            let n = self
                .object_counts
                .get_mut(&page.object)
                .expect("a page's object is counted");
            *n -= 1;
        }
        let changed: Vec<(u64, u64)> = written
            .iter()
            .map(|r| (r.first_block, r.end_block()))
            .collect();
        let runs = apply_changes(&old, &changed, written);
        count_packs(&mut self.pack_counts, &runs, true);
        let encoded = page::encode(segment, &runs);
        self.pages[s] = Some(PageRef {
            object,
            offset: bytes.len() as u32,
            len: encoded.len() as u32,
        });
        *self.object_counts.entry(object).or_insert(0) += 1;
        bytes.extend_from_slice(&encoded);
        self.runs[s] = runs;
    }

    /// Packs and page objects snapshot `seq` no longer uses end their
    /// reference ranges at `seq - 1`; the others reach `seq`.
    fn settle_ranges(&mut self, seq: u64) {
        for (&id, &n) in &self.pack_counts {
            let at = self
                .catalog
                .packs
                .binary_search_by_key(&id, |p| p.id)
                .expect("a counted pack is recorded");
            self.catalog.packs[at].last_seq = if n == 0 { seq - 1 } else { seq };
        }
        for (&id, &n) in &self.object_counts {
            let at = self
                .catalog
                .pages
                .binary_search_by_key(&id, |p| p.id)
                .expect("a counted page object is recorded");
            self.catalog.pages[at].last_seq = if n == 0 { seq - 1 } else { seq };
        }
        self.pack_counts.retain(|_, n| *n > 0);
        self.object_counts.retain(|_, n| *n > 0);
    }

    /// Commits the catalog (generation 1); returns what the archive holds.
    fn commit(mut self, catalog_folder: &str) -> Result<serde_json::Value> {
        self.catalog.generation = 1;
        let bytes = catalog::encode(&self.catalog);
        self.store
            .create(catalog_folder, &catalog::object_name(1), &bytes)?;
        let mapped: u64 = self
            .runs
            .iter()
            .flatten()
            .map(|r| u64::from(r.blocks))
            .sum();
        let t = &self.catalog.totals;
        Ok(json!({
            "snapshots": self.catalog.snapshots.len(),
            "packs": self.catalog.packs.len(),
            "page_objects": self.catalog.pages.len(),
            "pack_bytes": t.pushed_bytes,
            "index_bytes": t.index_bytes,
            "catalog_bytes": bytes.len(),
            "newest_mapped_bytes": mapped * BLOCK_BYTES,
            "newest_packs": self.pack_counts.len(),
            "oldest": self.catalog.snapshots.first().map(|s| s.name.clone()),
            "newest": self.catalog.snapshots.last().map(|s| s.name.clone()),
        }))
    }
}

/// Counts each pack `runs` address once more (`add`) or once less; a
/// count may reach zero here, settle_ranges drops it.
fn count_packs(counts: &mut BTreeMap<u64, u32>, runs: &[Run], add: bool) {
    let mut packs: Vec<u64> = runs.iter().map(|r| r.pack).collect();
    packs.sort_unstable();
    packs.dedup();
    for pack in packs {
        let n = counts.entry(pack).or_insert(0);
        if add {
            *n += 1;
        } else {
            assert!(
                *n > 0,
                "pack {pack} is counted for the page that addresses it"
            );
            *n -= 1;
        }
    }
}

/// The rank the rank tree gives day `seq` (counted from the first):
/// yearly every 365th, monthly every 30th, weekly every 7th, else daily.
fn rank_of(seq: u64) -> Level {
    let day = seq - 1;
    if day.is_multiple_of(365) {
        Level::Yearly
    } else if day.is_multiple_of(30) {
        Level::Monthly
    } else if day.is_multiple_of(7) {
        Level::Weekly
    } else {
        Level::Daily
    }
}

/// The random data of the version in slot `slot` of pack `pack`: made
/// again from its place, so the digest can take an old version away.
fn version_data(seed: u64, pack: u64, slot: u32) -> Vec<u8> {
    let mut rng =
        Rng((seed ^ pack.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(slot) << 40)) | 1);
    let mut out = vec![0u8; BLOCK_BYTES as usize];
    for chunk in out.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next().to_le_bytes());
    }
    out
}
