//! Removes the objects no commit references: packs, page objects, roots
//! and forward tables a writer stored before it stopped without committing
//! them. Only a writer holding the claim sweeps, so nothing in flight is
//! taken.

use crate::archive::{pack_object, pages_object, Archive};
use crate::error::Result;
use crate::format::catalog::Catalog;
use crate::lock::WriterLock;
use std::collections::BTreeSet;

/// The names of the objects of the archive's folder that `catalog` does
/// not reference (the writer's claim aside; catalogs live in their own folder).
pub fn unreferenced(archive: &Archive, catalog: &Catalog) -> Result<Vec<String>> {
    let mut known: BTreeSet<String> = catalog.packs.iter().map(|p| pack_object(p.id)).collect();
    known.extend(catalog.pages.iter().map(|p| pages_object(p.id)));
    known.extend(catalog.snapshots.iter().map(|s| s.index.clone()));
    known.extend(catalog.forwards.iter().map(|f| f.object.clone()));
    Ok(archive
        .list_objects()?
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| !known.contains(n) && n != crate::lock::WRITER_OBJECT)
        .collect())
}

/// Deletes what `unreferenced` finds; returns how many.
pub fn sweep(archive: &Archive, _claim: &WriterLock<'_>, catalog: &Catalog) -> Result<usize> {
    let names = unreferenced(archive, catalog)?;
    archive.delete_objects(&names)?;
    Ok(names.len())
}
