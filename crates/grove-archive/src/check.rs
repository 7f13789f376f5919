//! `grove archive check`: whether every archived snapshot can be read and
//! restored. The quick check reads the catalog, every index and every pack
//! header and block table; `--deep` also reads every slot of every
//! referenced pack and checks its checksum. Damage is reported by the
//! archived snapshots it affects.

use crate::archive::{pack_object, Archive};
use crate::error::{ArchiveError, Result};
use crate::format::catalog::Catalog;
use crate::format::pack::PackHeader;
use std::collections::{BTreeMap, BTreeSet};

/// What a check found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckReport {
    pub snapshots: usize,
    pub packs: usize,
    pub slots_read: u64,
    /// One line per problem found.
    pub problems: Vec<String>,
    /// The archived snapshots a problem makes unreadable in part or whole.
    pub damaged_snapshots: Vec<String>,
    /// Objects no commit references (left by a writer that stopped).
    pub unreferenced_objects: Vec<String>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the archive; `deep` reads every slot too.
pub fn check(archive: &Archive, deep: bool) -> Result<CheckReport> {
    check_with_progress(archive, deep, &mut |_, _| {})
}

/// `check`, telling `progress` (pack bytes checked, pack bytes in all).
pub fn check_with_progress(
    archive: &Archive,
    deep: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    let catalog = match archive.load() {
        Ok(Some(catalog)) => catalog,
        Ok(None) => return Ok(report),
        Err(ArchiveError::Damaged(why)) => {
            report.problems.push(why);
            report
                .damaged_snapshots
                .push("(all: the catalog is damaged)".into());
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    report.snapshots = catalog.snapshots.len();
    report.packs = catalog.packs.len();
    let bad_packs = check_packs(archive, &catalog, deep, &mut report, progress)?;
    check_indexes(archive, &catalog, &bad_packs, &mut report)?;
    report.unreferenced_objects = crate::sweep::unreferenced(archive, &catalog)?;
    Ok(report)
}

/// Checks each pack; returns the damaged ones with the slots that are bad
/// (None: the whole pack).
fn check_packs(
    archive: &Archive,
    catalog: &Catalog,
    deep: bool,
    report: &mut CheckReport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<BTreeMap<u64, Option<BTreeSet<u32>>>> {
    let mut bad = BTreeMap::new();
    let total = crate::ledger::stored_bytes(catalog);
    let mut done = 0;
    for record in &catalog.packs {
        done += record.object_bytes;
        progress(done, total);
        let header = match archive.pack_blocks(record.id, catalog.block_bytes, record.slots) {
            Ok((header, _)) => header,
            Err(ArchiveError::Damaged(why)) => {
                report.problems.push(why);
                bad.insert(record.id, None);
                continue;
            }
            Err(e) => return Err(e),
        };
        if deep {
            let bad_slots = check_slots(archive, &header, report)?;
            if !bad_slots.is_empty() {
                bad.insert(record.id, Some(bad_slots));
            }
        }
    }
    Ok(bad)
}

fn check_slots(
    archive: &Archive,
    header: &PackHeader,
    report: &mut CheckReport,
) -> Result<BTreeSet<u32>> {
    let mut bad = BTreeSet::new();
    for slot in 0..header.slots {
        report.slots_read += 1;
        match archive.read_slots(header, slot, 1) {
            Ok(_) => {}
            Err(ArchiveError::Damaged(why)) => {
                report.problems.push(why);
                bad.insert(slot);
                if slot == 0
                    && report
                        .problems
                        .last()
                        .is_some_and(|p| p.contains("truncated"))
                {
                    bad.extend(0..header.slots);
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(bad)
}

fn check_indexes(
    archive: &Archive,
    catalog: &Catalog,
    bad_packs: &BTreeMap<u64, Option<BTreeSet<u32>>>,
    report: &mut CheckReport,
) -> Result<()> {
    for s in &catalog.snapshots {
        let index = match archive.index(&s.index, s.seq, catalog.block_bytes) {
            Ok(index) => index,
            Err(ArchiveError::Damaged(why)) => {
                report.problems.push(why);
                report.damaged_snapshots.push(s.name.clone());
                continue;
            }
            Err(e) => return Err(e),
        };
        let touches_damage = index.runs.iter().any(|r| match bad_packs.get(&r.pack) {
            Some(None) => true,
            Some(Some(slots)) => slots
                .range(r.first_slot..r.first_slot + r.blocks)
                .next()
                .is_some(),
            None => false,
        });
        let unknown_pack = index.runs.iter().find(|r| {
            crate::ledger::pack(catalog, r.pack).is_none_or(|p| r.first_slot + r.blocks > p.slots)
        });
        if let Some(run) = unknown_pack {
            report.problems.push(format!(
                "{} names {} slots it does not hold",
                s.index,
                pack_object(run.pack)
            ));
        }
        if touches_damage || unknown_pack.is_some() {
            report.damaged_snapshots.push(s.name.clone());
        }
    }
    Ok(())
}
