//! `grove archive expire`: drops the archived snapshots the archive's
//! policy no longer keeps, then deletes every pack no kept snapshot
//! references. A pack whose owner expired while kept snapshots still need
//! some of its versions (a lazy rank, a longer policy, a version that
//! outlived the snapshot that wrote it) has those versions copied into a
//! pack owned by the kept snapshot expected to live longest: the only data
//! expiry copies, counted in the report.

use crate::archive::{index_object, pack_object, Archive};
use crate::error::Result;
use crate::format::catalog::{ArchivedSnapshot, Catalog, PackRecord};
use crate::format::index::{coalesce, Run, SnapshotIndex};
use crate::format::pack;
use crate::ledger;
use crate::lock::WriterLock;
use crate::verdicts::{self, Verdicts};
use grove_retention::Policy;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

/// What expiry did, or with `dry_run` would do.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExpireReport {
    pub expired: Vec<String>,
    pub kept: usize,
    pub packs_deleted: u64,
    pub bytes_deleted: u64,
    /// Packs whose still-needed versions were copied out.
    pub packs_copied: u64,
    pub bytes_copied: u64,
    pub indexes_rewritten: u64,
    pub dry_run: bool,
}

/// Expires what `policy` no longer keeps at `now_unix_secs`.
pub fn expire(
    archive: &Archive,
    claim: Option<&WriterLock<'_>>,
    policy: &Policy,
    now_unix_secs: u64,
    dry_run: bool,
) -> Result<ExpireReport> {
    let Some(mut catalog) = archive.load()? else {
        return Ok(ExpireReport {
            dry_run,
            ..ExpireReport::default()
        });
    };
    if let Some(claim) = claim {
        crate::sweep::sweep(archive, claim, &catalog)?;
    }
    let verdicts = verdicts::judge(&catalog, policy, now_unix_secs);
    let expired: Vec<ArchivedSnapshot> = catalog
        .snapshots
        .iter()
        .filter(|s| !verdicts.keeps(s.seq))
        .cloned()
        .collect();
    catalog.snapshots.retain(|s| verdicts.keeps(s.seq));
    let mut report = ExpireReport {
        expired: expired.iter().map(|s| s.name.clone()).collect(),
        kept: catalog.snapshots.len(),
        dry_run,
        ..ExpireReport::default()
    };
    let (dead, orphaned) = sort_packs(&catalog, &expired);
    report.packs_deleted = (dead.len() + orphaned.len()) as u64;
    report.bytes_deleted = dead.iter().chain(&orphaned).map(|p| p.object_bytes).sum();
    if dry_run || claim.is_none() {
        report.dry_run = true;
        report.packs_copied = orphaned.len() as u64;
        return Ok(report);
    }
    let mut old_indexes: Vec<String> = expired.iter().map(|s| s.index.clone()).collect();
    let relocated = relocate(archive, &mut catalog, &orphaned, &verdicts, &mut report)?;
    old_indexes.extend(rewrite_indexes(
        archive,
        &mut catalog,
        &relocated,
        &mut report,
    )?);
    let gone: Vec<u64> = dead.iter().chain(&orphaned).map(|p| p.id).collect();
    ledger::remove_packs(&mut catalog, &gone);
    catalog.totals.deleted_bytes += report.bytes_deleted;
    catalog.totals.copied_bytes += report.bytes_copied;
    crate::hooks::stall_if_set("expire-before-commit");
    archive.commit(&mut catalog)?;
    crate::hooks::stall_if_set("expire-before-delete");
    // Only now does nothing reference them.
    let mut names: Vec<String> = gone.iter().map(|&id| pack_object(id)).collect();
    names.extend(old_indexes);
    archive.delete_objects(&names)?;
    Ok(report)
}

/// The packs no kept snapshot references (dead), and those still
/// referenced whose owner is among the expired (orphaned: to copy from).
fn sort_packs(
    catalog: &Catalog,
    expired: &[ArchivedSnapshot],
) -> (Vec<PackRecord>, Vec<PackRecord>) {
    let expired_seqs: BTreeSet<u64> = expired.iter().map(|s| s.seq).collect();
    let mut dead = Vec::new();
    let mut orphaned = Vec::new();
    for p in &catalog.packs {
        if !ledger::is_referenced(catalog, p) {
            dead.push(p.clone());
        } else if expired_seqs.contains(&p.owner_seq) {
            orphaned.push(p.clone());
        }
    }
    (dead, orphaned)
}

/// Where copied versions went: (old pack, old slot) to (new pack, new slot).
type Relocations = BTreeMap<(u64, u32), (u64, u32)>;

/// Who still references one slot of an orphaned pack.
#[derive(Clone, Copy)]
struct SlotUse {
    first_seq: u64,
    last_seq: u64,
    /// The referencer expected to live longest: (kept until, seq).
    owner: (u64, u64),
}

/// Copies the still-referenced versions of `orphaned` packs into new packs,
/// each version grouped with those whose longest-lived referencer is the
/// same: that snapshot owns the new pack and references all of it, so no
/// version in it is dead while the pack lives.
fn relocate(
    archive: &Archive,
    catalog: &mut Catalog,
    orphaned: &[PackRecord],
    verdicts: &Verdicts,
    report: &mut ExpireReport,
) -> Result<Relocations> {
    let mut moved = Relocations::new();
    let mut indexes: BTreeMap<u64, SnapshotIndex> = BTreeMap::new();
    for old in orphaned {
        let uses = slot_uses(archive, catalog, old, verdicts, &mut indexes)?;
        let mut by_owner: BTreeMap<u64, Vec<(u32, SlotUse)>> = BTreeMap::new();
        for (slot, used) in uses {
            by_owner.entry(used.owner.1).or_default().push((slot, used));
        }
        let (header, blocks) = archive.pack_blocks(old.id, catalog.block_bytes, old.slots)?;
        let all = archive.read_slots(&header, 0, header.slots)?;
        for (owner_seq, slots) in by_owner {
            let new = copy_slots(catalog, &all, &blocks, owner_seq, &slots);
            archive.put_pack(new.0.id, &new.1)?;
            for (i, (slot, _)) in slots.iter().enumerate() {
                moved.insert((old.id, *slot), (new.0.id, i as u32));
            }
            report.packs_copied += 1;
            report.bytes_copied += new.0.object_bytes;
            ledger::add_pack(catalog, new.0);
        }
    }
    Ok(moved)
}

/// For each slot of `old` a kept snapshot references, who references it.
fn slot_uses(
    archive: &Archive,
    catalog: &Catalog,
    old: &PackRecord,
    verdicts: &Verdicts,
    indexes: &mut BTreeMap<u64, SnapshotIndex>,
) -> Result<BTreeMap<u32, SlotUse>> {
    let mut uses: BTreeMap<u32, SlotUse> = BTreeMap::new();
    let referencers = catalog
        .snapshots
        .iter()
        .filter(|s| (old.first_seq..=old.last_seq).contains(&s.seq));
    for s in referencers {
        let index = match indexes.entry(s.seq) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(archive.index(&s.index, s.seq, catalog.block_bytes)?),
        };
        let here = (verdicts.kept_until(s.seq), s.seq);
        for run in index.runs.iter().filter(|r| r.pack == old.id) {
            for slot in run.first_slot..run.first_slot + run.blocks {
                let used = uses.entry(slot).or_insert(SlotUse {
                    first_seq: s.seq,
                    last_seq: s.seq,
                    owner: here,
                });
                used.first_seq = used.first_seq.min(s.seq);
                used.last_seq = used.last_seq.max(s.seq);
                used.owner = used.owner.max(here);
            }
        }
    }
    assert!(!uses.is_empty(), "an orphaned pack is referenced");
    Ok(uses)
}

/// A new pack of `slots` (taken from `all`, the old pack's slots' data)
/// owned by `owner_seq`: its record and its bytes.
fn copy_slots(
    catalog: &mut Catalog,
    all: &[u8],
    blocks: &[u64],
    owner_seq: u64,
    slots: &[(u32, SlotUse)],
) -> (PackRecord, Vec<u8>) {
    let bs = catalog.block_bytes as usize;
    let mut data = Vec::with_capacity(slots.len() * bs);
    let mut new_blocks = Vec::with_capacity(slots.len());
    for (slot, _) in slots {
        let at = *slot as usize * bs;
        data.extend_from_slice(&all[at..at + bs]);
        new_blocks.push(blocks[*slot as usize]);
    }
    let id = ledger::allocate_pack(catalog);
    let bytes = pack::encode(id, catalog.block_bytes, &new_blocks, &data);
    let record = PackRecord {
        id,
        owner_seq,
        first_seq: slots
            .iter()
            .map(|(_, u)| u.first_seq)
            .min()
            .expect("a group has slots"),
        last_seq: slots
            .iter()
            .map(|(_, u)| u.last_seq)
            .max()
            .expect("a group has slots"),
        slots: new_blocks.len() as u32,
        object_bytes: bytes.len() as u64,
    };
    (record, bytes)
}

/// Points every kept snapshot that referenced a copied version at the
/// copy, in a new index object; returns the replaced indexes' names.
fn rewrite_indexes(
    archive: &Archive,
    catalog: &mut Catalog,
    moved: &Relocations,
    report: &mut ExpireReport,
) -> Result<Vec<String>> {
    let old_packs: BTreeSet<u64> = moved.keys().map(|(p, _)| *p).collect();
    let mut replaced = Vec::new();
    let generation = catalog.generation + 1;
    let block_bytes = catalog.block_bytes;
    for s in catalog.snapshots.iter_mut() {
        let index = archive.index(&s.index, s.seq, block_bytes)?;
        if !index.runs.iter().any(|r| old_packs.contains(&r.pack)) {
            continue;
        }
        let runs = coalesce(index.runs.iter().flat_map(|r| remap(r, moved)));
        let name = index_object(s.seq, generation);
        let bytes = archive.put_index(&name, &SnapshotIndex { runs, ..index })?;
        catalog.totals.index_bytes += bytes;
        replaced.push(std::mem::replace(&mut s.index, name));
        report.indexes_rewritten += 1;
    }
    Ok(replaced)
}

/// A run with each block's slot moved where `moved` says.
fn remap(run: &Run, moved: &Relocations) -> Vec<Run> {
    (0..run.blocks)
        .map(|i| {
            let (pack, slot) = moved
                .get(&(run.pack, run.first_slot + i))
                .copied()
                .unwrap_or((run.pack, run.first_slot + i));
            Run {
                first_block: run.first_block + u64::from(i),
                pack,
                first_slot: slot,
                blocks: 1,
            }
        })
        .collect()
}
