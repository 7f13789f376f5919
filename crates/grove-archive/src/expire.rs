//! `grove archive expire`: drops the archived snapshots the archive's
//! policy no longer keeps, then deletes every pack, page object and forward
//! table no kept snapshot references. A pack whose owner expired while kept
//! snapshots still need some of its versions (a lazy rank, a longer policy,
//! a version that outlived the snapshot that wrote it) has those versions
//! copied into packs owned by the kept snapshot expected to live longest:
//! the only data expiry copies, counted in the report. Copies keep their
//! addresses, so no index is rewritten: the deleted pack's forward table
//! says where they went (relocate.rs).

use crate::archive::{pack_object, pages_object, Archive};
use crate::error::Result;
use crate::format::catalog::{ArchivedSnapshot, Catalog, PackRecord};
use crate::ledger;
use crate::lock::WriterLock;
use crate::relocate::{relocate, Relocation};
use crate::verdicts;
use grove_retention::Policy;
use std::collections::BTreeSet;

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
    /// Forward tables written for the copied versions.
    pub forward_tables_written: u64,
    /// Index bytes deleted: expired roots and page objects no kept
    /// snapshot shares, and forward tables no longer used.
    pub index_bytes_deleted: u64,
    pub dry_run: bool,
}

/// What goes: packs, page objects and forward tables nothing kept uses.
#[derive(Default)]
struct Doomed {
    dead_packs: Vec<PackRecord>,
    /// Referenced, but their owner expired: copy out what is used.
    orphaned: Vec<PackRecord>,
    pages: Vec<u64>,
    forwards: Vec<u64>,
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
    let doomed = doomed(&catalog, &expired);
    let mut report = ExpireReport {
        expired: expired.iter().map(|s| s.name.clone()).collect(),
        kept: catalog.snapshots.len(),
        packs_deleted: (doomed.dead_packs.len() + doomed.orphaned.len()) as u64,
        bytes_deleted: doomed
            .dead_packs
            .iter()
            .chain(&doomed.orphaned)
            .map(|p| p.object_bytes)
            .sum(),
        dry_run: dry_run || claim.is_none(),
        ..ExpireReport::default()
    };
    if report.dry_run {
        report.packs_copied = doomed.orphaned.len() as u64;
        return Ok(report);
    }
    let going: BTreeSet<u64> = doomed
        .dead_packs
        .iter()
        .chain(&doomed.orphaned)
        .map(|p| p.id)
        .collect();
    let relocation = relocate(archive, &mut catalog, &doomed.orphaned, &going, &verdicts)?;
    report.packs_copied = relocation.packs_copied;
    report.bytes_copied = relocation.bytes_copied;
    report.forward_tables_written = relocation.tables_written;
    let names = forget(&mut catalog, &doomed, &expired, &relocation, &mut report);
    crate::hooks::stall_if_set("expire-before-commit");
    archive.commit(&mut catalog)?;
    crate::hooks::stall_if_set("expire-before-delete");
    // Only now does nothing reference them.
    archive.delete_objects(&names)?;
    Ok(report)
}

/// Sorts what the kept snapshots no longer reference from what they do.
fn doomed(catalog: &Catalog, expired: &[ArchivedSnapshot]) -> Doomed {
    let expired_seqs: BTreeSet<u64> = expired.iter().map(|s| s.seq).collect();
    let mut doomed = Doomed::default();
    for p in &catalog.packs {
        if !ledger::is_referenced(catalog, p) {
            doomed.dead_packs.push(p.clone());
        } else if expired_seqs.contains(&p.owner_seq) {
            doomed.orphaned.push(p.clone());
        }
    }
    doomed.pages = catalog
        .pages
        .iter()
        .filter(|p| !ledger::is_pages_referenced(catalog, p))
        .map(|p| p.id)
        .collect();
    doomed.forwards = catalog
        .forwards
        .iter()
        .filter(|f| !ledger::kept_in(catalog, f.first_seq, f.last_seq))
        .map(|f| f.origin)
        .collect();
    doomed
}

/// Drops the doomed objects from the catalog; returns their names (and the
/// expired roots' and replaced forward tables'), to delete after the commit.
fn forget(
    catalog: &mut Catalog,
    doomed: &Doomed,
    expired: &[ArchivedSnapshot],
    relocation: &Relocation,
    report: &mut ExpireReport,
) -> Vec<String> {
    let packs: Vec<u64> = doomed
        .dead_packs
        .iter()
        .chain(&doomed.orphaned)
        .map(|p| p.id)
        .collect();
    let mut names: Vec<String> = packs.iter().map(|&id| pack_object(id)).collect();
    report.index_bytes_deleted += expired.iter().map(|s| s.index_bytes).sum::<u64>();
    report.index_bytes_deleted += catalog
        .pages
        .iter()
        .filter(|p| doomed.pages.contains(&p.id))
        .map(|p| p.object_bytes)
        .sum::<u64>();
    for f in catalog
        .forwards
        .iter()
        .filter(|f| doomed.forwards.contains(&f.origin))
    {
        report.index_bytes_deleted += f.object_bytes;
        names.push(f.object.clone());
    }
    ledger::remove_packs(catalog, &packs);
    ledger::remove_pages(catalog, &doomed.pages);
    ledger::remove_forwards(catalog, &doomed.forwards);
    names.extend(doomed.pages.iter().map(|&id| pages_object(id)));
    names.extend(expired.iter().map(|s| s.index.clone()));
    names.extend(relocation.replaced_tables.iter().cloned());
    catalog.totals.deleted_bytes += report.bytes_deleted;
    catalog.totals.copied_bytes += report.bytes_copied;
    names
}
