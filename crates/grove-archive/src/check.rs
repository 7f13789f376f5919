//! `grove archive check`: whether every archived snapshot can be read and
//! restored. The quick check reads the catalog, every pack's header and
//! slot table, every forward table, and every snapshot's root and pages,
//! following each address to the pack that holds its version now;
//! `--deep` also reads every slot of every pack and checks its checksum.
//! Damage is reported by the archived snapshots it affects. Memory is the
//! bad slots found plus the reader's bounded caches.

use crate::archive::{pack_object, pages_object, Archive};
use crate::error::{ArchiveError, Result};
use crate::format::catalog::{ArchivedSnapshot, Catalog};
use crate::format::index::{PageRef, SnapshotRoot};
use crate::format::pack::PackHeader;
use crate::format::runs::Run;
use crate::lru::Lru;
use crate::reader::PackReader;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Pages already followed to their versions, with the packs they address,
/// kept within this many bytes: a page shared by many snapshots is read
/// and followed once (a page dropped from it is only followed again).
const VERIFIED_PAGES_BYTES: u64 = 16 << 20;

/// Damaged packs, with the slots that are bad (None: the whole pack).
type BadPacks = BTreeMap<u64, Option<BTreeSet<u32>>>;

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
    check_forwards(archive, &catalog, &mut report)?;
    let reader = PackReader::default();
    let mut verified = Lru::new(VERIFIED_PAGES_BYTES);
    for s in &catalog.snapshots {
        let checker = (&reader, &mut verified);
        match check_snapshot(archive, &catalog, checker, s, &bad_packs) {
            Ok(None) => {}
            Ok(Some(why)) | Err(ArchiveError::Damaged(why)) => {
                if !report.problems.contains(&why) {
                    report.problems.push(why);
                }
                report.damaged_snapshots.push(s.name.clone());
            }
            Err(e) => return Err(e),
        }
    }
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
) -> Result<BadPacks> {
    let mut bad = BTreeMap::new();
    let total = crate::ledger::stored_bytes(catalog);
    let mut done = 0;
    for record in &catalog.packs {
        done += record.object_bytes;
        progress(done, total);
        let header = match archive.pack_table(record.id, catalog.block_bytes, record.slots) {
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

/// Every forward table decodes (a damaged one is named by the snapshots
/// whose reads go through it, when their addresses are followed).
fn check_forwards(archive: &Archive, catalog: &Catalog, report: &mut CheckReport) -> Result<()> {
    for record in &catalog.forwards {
        match archive.forward(record) {
            Ok(_) => {}
            Err(ArchiveError::Damaged(why)) => report.problems.push(why),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Why snapshot `s` cannot be read whole, or None if it can: its root and
/// pages decode and every address leads to a sound slot of a listed pack.
fn check_snapshot(
    archive: &Archive,
    catalog: &Catalog,
    (reader, verified): (&PackReader, &mut Lru<PageRef, Arc<Vec<u64>>>),
    s: &ArchivedSnapshot,
    bad_packs: &BadPacks,
) -> Result<Option<String>> {
    let root = archive.root(&s.index, s.seq, catalog.block_bytes)?;
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    for segment in 0..root.segments() {
        let Some(at) = root.page(segment) else {
            continue;
        };
        let packs = match verified.get(&at) {
            Some(packs) => packs.clone(),
            None => {
                let runs = reader.runs(archive, &root, segment)?;
                for run in runs.iter() {
                    if let Some(why) = check_run(archive, catalog, reader, (run, s.seq), bad_packs)?
                    {
                        return Ok(Some(format!("{}: {why}", s.index)));
                    }
                }
                let packs: BTreeSet<u64> = runs.iter().map(|r| r.pack).collect();
                let packs = Arc::new(packs.into_iter().collect::<Vec<u64>>());
                verified.put(at, packs.clone(), packs.len() as u64 * 8 + 64);
                packs
            }
        };
        for &pack in packs.iter() {
            *counts.entry(pack).or_default() += 1;
        }
    }
    if counts.into_iter().collect::<Vec<_>>() != root.packs {
        return Ok(Some(format!(
            "{}: its pack table does not match its pages",
            s.index
        )));
    }
    Ok(out_of_range(catalog, s.seq, &root).map(|why| format!("{}: {why}", s.index)))
}

/// Why the catalog could delete something snapshot `seq` uses, if it
/// could: every pack its pages address (or that pack's forward table) and
/// every page object must have `seq` in its reference range. (The packs a
/// forward table points into are checked per version, for the first
/// snapshot that reads each page.)
fn out_of_range(catalog: &Catalog, seq: u64, root: &SnapshotRoot) -> Option<String> {
    let covers = |first: u64, last: u64| (first..=last).contains(&seq);
    for &(pack, _) in &root.packs {
        let range = match (
            crate::ledger::pack(catalog, pack),
            crate::ledger::forward(catalog, pack),
        ) {
            (Some(p), _) => (p.first_seq, p.last_seq, pack_object(pack)),
            (None, Some(f)) => (f.first_seq, f.last_seq, f.object.clone()),
            (None, None) => {
                return Some(format!(
                    "names {}, which the catalog does not list",
                    pack_object(pack)
                ))
            }
        };
        if !covers(range.0, range.1) {
            return Some(format!("{}'s reference range misses it", range.2));
        }
    }
    root.pages.iter().flatten().find_map(|page| {
        crate::ledger::pages(catalog, page.object)
            .is_none_or(|p| !(p.first_seq..=p.last_seq).contains(&seq))
            .then(|| format!("{} is not listed for it", pages_object(page.object)))
    })
}

/// Why a run of snapshot `seq` cannot be read, if it cannot: each version
/// must be in a sound slot of a listed pack whose reference range holds
/// `seq` (or the pack's forward table's range must, and the copy's), else
/// an expiry could delete what the snapshot uses.
fn check_run(
    archive: &Archive,
    catalog: &Catalog,
    reader: &PackReader,
    (run, seq): (&Run, u64),
    bad_packs: &BadPacks,
) -> Result<Option<String>> {
    let slots = run.first_slot..run.first_slot + run.blocks;
    if crate::ledger::pack(catalog, run.pack).is_some() {
        return Ok(sound(catalog, (run.pack, seq), slots, bad_packs));
    }
    if let Some(f) = crate::ledger::forward(catalog, run.pack) {
        if !(f.first_seq..=f.last_seq).contains(&seq) {
            return Ok(Some(format!("{}'s reference range misses it", f.object)));
        }
    }
    for slot in slots {
        let (pack, to) = reader.resolve(archive, catalog, (run.pack, slot))?;
        if let Some(why) = sound(catalog, (pack, seq), to..to + 1, bad_packs) {
            return Ok(Some(format!(
                "{why} (forwarded from {})",
                pack_object(run.pack)
            )));
        }
    }
    Ok(None)
}

/// Why slots `slots` of live pack `pack` cannot be read by snapshot `seq`,
/// if they cannot.
fn sound(
    catalog: &Catalog,
    (pack, seq): (u64, u64),
    slots: std::ops::Range<u32>,
    bad_packs: &BadPacks,
) -> Option<String> {
    let Some(record) = crate::ledger::pack(catalog, pack) else {
        return Some(format!(
            "leads to {}, which the catalog does not list",
            pack_object(pack)
        ));
    };
    if !(record.first_seq..=record.last_seq).contains(&seq) {
        return Some(format!("{}'s reference range misses it", pack_object(pack)));
    }
    if slots.end > record.slots {
        return Some(format!(
            "names {} slots it does not hold",
            pack_object(pack)
        ));
    }
    match bad_packs.get(&pack) {
        Some(None) => Some(format!("uses {}, which is damaged", pack_object(pack))),
        Some(Some(bad)) if bad.range(slots).next().is_some() => {
            Some(format!("uses damaged slots of {}", pack_object(pack)))
        }
        _ => None,
    }
}
