//! Expiry's one copy: the versions of orphaned packs (their owner expired)
//! that kept snapshots still use move into new packs, each grouped with the
//! versions whose longest-lived user is the same snapshot, which owns the
//! new pack. A copy keeps its address (the pack a push first stored it in,
//! and the slot), and the address's pack's forward table is rewritten to
//! say where it is now, so no index changes.
//!
//! Orphans are handled in batches of at most `BATCH_SLOTS` slots: a batch
//! costs one pass over the kept snapshots' pages that address its packs,
//! and memory for its slots only, whatever the archive's size.

use crate::archive::{forward_object, Archive};
use crate::error::Result;
use crate::format::catalog::{Catalog, ForwardRecord, PackRecord};
use crate::format::forward::ForwardTable;
use crate::format::index::PageRef;
use crate::format::pack::{Address, PackHeader, SlotEntry};
use crate::ledger;
use crate::pack_writer::PackWriter;
use crate::reader::PackReader;
use crate::slot_reads;
use crate::verdicts::Verdicts;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The most orphaned slots one batch handles (about 48 bytes each).
const BATCH_SLOTS: u64 = 1 << 18;

/// What relocation did.
#[derive(Debug, Default)]
pub struct Relocation {
    pub packs_copied: u64,
    pub bytes_copied: u64,
    pub tables_written: u64,
    /// Forward tables replaced by new ones, to delete after the commit.
    pub replaced_tables: Vec<String>,
}

/// Who uses one orphaned slot.
#[derive(Clone, Copy)]
struct SlotUse {
    first_seq: u64,
    last_seq: u64,
    /// The user expected to live longest: (kept until, seq).
    owner: (u64, u64),
}

/// One orphaned pack's header, slot table and who uses each slot.
struct Orphan {
    record: PackRecord,
    header: PackHeader,
    table: Vec<SlotEntry>,
    uses: BTreeMap<u32, SlotUse>,
}

/// Copies out the used versions of `orphaned`; the packs themselves, and
/// the others in `going` (which forward tables stop pointing into), are
/// left for the caller to forget.
pub fn relocate(
    archive: &Archive,
    catalog: &mut Catalog,
    orphaned: &[PackRecord],
    going: &BTreeSet<u64>,
    verdicts: &Verdicts,
) -> Result<Relocation> {
    let mut done = Relocation::default();
    let doomed = going;
    let mut start = 0;
    while start < orphaned.len() {
        let mut end = start;
        let mut slots = 0;
        while end < orphaned.len()
            && (end == start || slots + u64::from(orphaned[end].slots) <= BATCH_SLOTS)
        {
            slots += u64::from(orphaned[end].slots);
            end += 1;
        }
        relocate_batch(
            archive,
            catalog,
            &orphaned[start..end],
            verdicts,
            doomed,
            &mut done,
        )?;
        start = end;
    }
    Ok(done)
}

fn relocate_batch(
    archive: &Archive,
    catalog: &mut Catalog,
    batch: &[PackRecord],
    verdicts: &Verdicts,
    doomed: &BTreeSet<u64>,
    done: &mut Relocation,
) -> Result<()> {
    let mut orphans = Vec::with_capacity(batch.len());
    for record in batch {
        let (header, table) = archive.pack_table(record.id, catalog.block_bytes, record.slots)?;
        orphans.push(Orphan {
            record: record.clone(),
            header,
            table,
            uses: BTreeMap::new(),
        });
    }
    find_uses(archive, catalog, &mut orphans, verdicts)?;
    // origin pack → origin slot → where the version is now.
    let mut moves: BTreeMap<u64, Vec<(u32, Address)>> = BTreeMap::new();
    let mut ranges: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for orphan in &orphans {
        // A new forward table covers its pack's reference range.
        for entry in &orphan.table {
            ranges
                .entry(entry.origin.0)
                .or_insert((orphan.record.first_seq, orphan.record.last_seq));
        }
        copy_used(archive, catalog, orphan, &mut moves, done)?;
    }
    for (origin, moved) in moves {
        let range = ranges[&origin];
        rewrite_forward(archive, catalog, origin, range, moved, doomed, done)?;
    }
    Ok(())
}

/// A page, and the run of kept snapshots that share it (a page is used
/// by consecutive snapshots only: once its segment changes, it is never
/// named again).
struct SharedPage {
    at: PageRef,
    segment: u64,
    blocks: std::ops::Range<u64>,
    first_seq: u64,
    last_seq: u64,
    /// Its user expected to live longest: (kept until, seq).
    owner: (u64, u64),
}

/// Fills each orphan's `uses`: one pass over the kept snapshots in the
/// batch's reference ranges that address its origin packs, reading each
/// distinct page once with the run of snapshots that share it.
fn find_uses(
    archive: &Archive,
    catalog: &Catalog,
    orphans: &mut [Orphan],
    verdicts: &Verdicts,
) -> Result<()> {
    let mut wanted: HashMap<Address, (usize, u32)> = HashMap::new();
    for (i, orphan) in orphans.iter().enumerate() {
        for (slot, entry) in orphan.table.iter().enumerate() {
            wanted.insert(entry.origin, (i, slot as u32));
        }
    }
    let origins: BTreeSet<u64> = wanted.keys().map(|a| a.0).collect();
    let first = orphans
        .iter()
        .map(|o| o.record.first_seq)
        .min()
        .unwrap_or(0);
    let last = orphans.iter().map(|o| o.record.last_seq).max().unwrap_or(0);
    let reader = PackReader::default();
    let mut open: Vec<Option<SharedPage>> = Vec::new();
    let mut finish = |page: SharedPage| -> Result<()> {
        let runs = reader.runs_at(archive, page.at, page.segment, page.blocks.clone())?;
        for run in runs.iter().filter(|r| origins.contains(&r.pack)) {
            for slot in run.first_slot..run.first_slot + run.blocks {
                if let Some(&(i, at)) = wanted.get(&(run.pack, slot)) {
                    note_use(&mut orphans[i].uses, at, &page);
                }
            }
        }
        Ok(())
    };
    for s in catalog
        .snapshots
        .iter()
        .filter(|s| (first..=last).contains(&s.seq))
    {
        let root = archive.root(&s.index, s.seq, catalog.block_bytes)?;
        if !origins.iter().any(|&p| root.addresses(p)) {
            continue;
        }
        let here = (verdicts.kept_until(s.seq), s.seq);
        open.resize_with(open.len().max(root.pages.len()), || None);
        for segment in 0..root.segments() {
            let slot = &mut open[segment as usize];
            match (slot.as_mut(), root.page(segment)) {
                (Some(shared), Some(at)) if shared.at == at => {
                    shared.last_seq = s.seq;
                    shared.owner = shared.owner.max(here);
                }
                (_, page) => {
                    if let Some(done) = slot.take() {
                        finish(done)?;
                    }
                    *slot = page.map(|at| SharedPage {
                        at,
                        segment,
                        blocks: root.segment_range(segment),
                        first_seq: s.seq,
                        last_seq: s.seq,
                        owner: here,
                    });
                }
            }
        }
    }
    open.into_iter().flatten().try_for_each(finish)
}

fn note_use(uses: &mut BTreeMap<u32, SlotUse>, slot: u32, page: &SharedPage) {
    let used = uses.entry(slot).or_insert(SlotUse {
        first_seq: page.first_seq,
        last_seq: page.last_seq,
        owner: page.owner,
    });
    used.first_seq = used.first_seq.min(page.first_seq);
    used.last_seq = used.last_seq.max(page.last_seq);
    used.owner = used.owner.max(page.owner);
}

/// Copies an orphan's used slots into one new pack per owner, reading
/// the orphan once for all of them; notes where each version went under
/// its origin pack.
fn copy_used(
    archive: &Archive,
    catalog: &mut Catalog,
    orphan: &Orphan,
    moves: &mut BTreeMap<u64, Vec<(u32, Address)>>,
    done: &mut Relocation,
) -> Result<()> {
    let mut by_owner: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for (&slot, used) in &orphan.uses {
        by_owner.entry(used.owner.1).or_default().push(slot);
    }
    // Ids in owner order. Each copy streams into its object as the orphan
    // is read; together they buffer no more than the orphan's used slots.
    let mut writers: BTreeMap<u64, PackWriter> = BTreeMap::new();
    for (&owner_seq, slots) in &by_owner {
        let id = ledger::allocate_pack(catalog);
        let writer = archive.pack_writer(id, catalog.block_bytes, slots.len() as u32)?;
        writers.insert(owner_seq, writer);
    }
    let used: Vec<u32> = orphan.uses.keys().copied().collect();
    slot_reads::for_each_slot(archive, &orphan.header, &used, &mut |slot, data| {
        let owner_seq = orphan.uses[&slot].owner.1;
        let writer = writers.get_mut(&owner_seq).expect("a writer per owner");
        writer.push(orphan.table[slot as usize], data)
    })?;
    for (owner_seq, slots) in by_owner {
        let writer = writers.remove(&owner_seq).expect("a writer per owner");
        assert_eq!(
            writer.slots() as usize,
            slots.len(),
            "every used slot copied"
        );
        let id = writer.id();
        done.bytes_copied += store_copy(catalog, orphan, owner_seq, &slots, writer)?;
        done.packs_copied += 1;
        for (new_slot, &slot) in slots.iter().enumerate() {
            let origin = orphan.table[slot as usize].origin;
            moves
                .entry(origin.0)
                .or_default()
                .push((origin.1, (id, new_slot as u32)));
        }
    }
    Ok(())
}

/// Finishes the copy of `slots` of the orphan that `writer` streamed and
/// records it in the catalog; returns its bytes.
fn store_copy(
    catalog: &mut Catalog,
    orphan: &Orphan,
    owner_seq: u64,
    slots: &[u32],
    writer: PackWriter,
) -> Result<u64> {
    let id = writer.id();
    let object_bytes = writer.finish()?;
    let uses = slots.iter().map(|s| orphan.uses[s]);
    ledger::add_pack(
        catalog,
        PackRecord {
            id,
            owner_seq,
            first_seq: uses
                .clone()
                .map(|u| u.first_seq)
                .min()
                .expect("a group has slots"),
            last_seq: uses.map(|u| u.last_seq).max().expect("a group has slots"),
            slots: slots.len() as u32,
            object_bytes,
        },
    );
    Ok(object_bytes)
}

/// Writes origin pack `origin`'s forward table anew with `moved` put in,
/// and without entries into packs that are gone or going.
fn rewrite_forward(
    archive: &Archive,
    catalog: &mut Catalog,
    origin: u64,
    range: (u64, u64),
    moved: Vec<(u32, Address)>,
    doomed: &BTreeSet<u64>,
    done: &mut Relocation,
) -> Result<()> {
    let existing = ledger::forward(catalog, origin).cloned();
    let mut table = match &existing {
        Some(record) => archive.forward(record)?,
        None => ForwardTable {
            origin,
            moved: BTreeMap::new(),
        },
    };
    table.moved.extend(moved);
    table
        .moved
        .retain(|_, (pack, _)| !doomed.contains(pack) && ledger::pack(catalog, *pack).is_some());
    let object = forward_object(origin, ledger::allocate_pack(catalog));
    let object_bytes = archive.put_forward(&object, &table)?;
    catalog.totals.index_bytes += object_bytes;
    let (first_seq, last_seq) = existing
        .as_ref()
        .map_or(range, |r| (r.first_seq, r.last_seq));
    let targets: BTreeSet<u64> = table.moved.values().map(|&(pack, _)| pack).collect();
    let record = ForwardRecord {
        origin,
        first_seq,
        last_seq,
        object,
        object_bytes,
        targets: targets.into_iter().collect(),
    };
    done.replaced_tables
        .extend(ledger::set_forward(catalog, record));
    done.tables_written += 1;
    Ok(())
}
