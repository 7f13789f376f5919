//! The archive tier's reports as `grove archive` prints them.

use std::io::{self, Write};

use grove_archive::{ArchiveListing, CheckReport, ExpireReport, PushReport, RestoreReport};
use grove_retention::calendar;

use super::format_size;

pub fn write_push(out: &mut impl Write, report: &PushReport) -> io::Result<()> {
    let base = report.base.as_ref().map_or("in full".to_string(), |b| {
        format!("as the change since {b}")
    });
    let resumed = if report.packs_resumed > 0 {
        format!(
            ", going on after {} packs an earlier push stored",
            report.packs_resumed
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "archived {} {base}: {} changed, {} stored in {} packs{resumed}",
        report.snapshot,
        format_size(report.changed_bytes),
        format_size(report.stored_bytes),
        report.packs_written
    )
}

pub fn write_listing(out: &mut impl Write, listing: &ArchiveListing) -> io::Result<()> {
    writeln!(out, "{}", listing.store)?;
    writeln!(
        out,
        "  {:<32} {:<8} {:<20} {:>10} {:>10}",
        "SNAPSHOT", "RANK", "EXPIRES", "SIZE", "ALONE"
    )?;
    for s in &listing.snapshots {
        let expires = match (&s.damaged, s.expires_unix_secs) {
            (Some(_), _) => "DAMAGED (check)".to_string(),
            (None, until) => until.map_or("when released".to_string(), calendar::display),
        };
        writeln!(
            out,
            "  {:<32} {:<8} {:<20} {:>10} {:>10}",
            s.name,
            s.rank,
            expires,
            format_size(s.size_bytes),
            format_size(s.unique_bytes)
        )?;
    }
    writeln!(
        out,
        "  {} snapshots, {} in {} packs; pushes wrote {}, expiry copied {} and deleted {}",
        listing.snapshots.len(),
        format_size(listing.stored_bytes),
        listing.packs,
        format_size(listing.totals.pushed_bytes),
        format_size(listing.totals.copied_bytes),
        format_size(listing.totals.deleted_bytes)
    )?;
    if let Some(packs) = listing.partial_push_packs {
        writeln!(
            out,
            "  a push stopped after {packs} packs: push again to go on"
        )?;
    }
    Ok(())
}

pub fn write_expire(out: &mut impl Write, volume: &str, report: &ExpireReport) -> io::Result<()> {
    let verb = if report.dry_run {
        "would expire"
    } else {
        "expired"
    };
    let names = if report.expired.is_empty() {
        "nothing".to_string()
    } else {
        report.expired.join(", ")
    };
    writeln!(
        out,
        "{volume}: {verb} {names}; {} kept; {} packs ({}) deleted, {} copied ({})",
        report.kept,
        report.packs_deleted,
        format_size(report.bytes_deleted),
        report.packs_copied,
        format_size(report.bytes_copied)
    )
}

pub fn write_restore(out: &mut impl Write, report: &RestoreReport) -> io::Result<()> {
    writeln!(
        out,
        "restored {} as {} ({} of data, hash {})",
        report.snapshot,
        report.name,
        format_size(report.restored_bytes),
        report.recorded_hash
    )
}

pub fn write_check(out: &mut impl Write, volume: &str, report: &CheckReport) -> io::Result<()> {
    let depth = if report.slots_read > 0 {
        format!(", {} blocks read", report.slots_read)
    } else {
        String::new()
    };
    if report.is_clean() {
        writeln!(
            out,
            "{volume}: consistent: {} snapshots, {} packs{depth}",
            report.snapshots, report.packs
        )?;
    } else {
        writeln!(
            out,
            "{volume}: DAMAGED: {}",
            report.damaged_snapshots.join(", ")
        )?;
        for problem in &report.problems {
            writeln!(out, "  {problem}")?;
        }
    }
    if !report.unreferenced_objects.is_empty() {
        writeln!(
            out,
            "  {} objects no commit references (left by a writer that stopped; the next write removes them)",
            report.unreferenced_objects.len()
        )?;
    }
    Ok(())
}
