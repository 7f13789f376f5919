//! Removes the objects no commit references: packs, page objects, roots
//! and forward tables a writer stored before it stopped without committing
//! them, and what it left of a pack it was storing. Only a writer holding the claim sweeps, so nothing in flight is
//! taken. The folder is listed a page at a time and each name looked up in
//! the catalog, so memory is one page and what is found unreferenced.

use crate::archive::{pack_object, pages_object, Archive};
use crate::error::Result;
use crate::format::catalog::Catalog;
use crate::ledger;
use crate::lock::WriterLock;

/// Whether the catalog references object `name` (the writer's claim
/// counts as referenced; catalogs live in their own folder).
fn is_referenced(catalog: &Catalog, name: &str) -> bool {
    if name == crate::lock::WRITER_OBJECT {
        return true;
    }
    let id = |prefix: &str| {
        let hex = name.strip_prefix(prefix)?;
        (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
    };
    if let Some(id) = id("pack-") {
        return ledger::pack(catalog, id).is_some() && name == pack_object(id);
    }
    if let Some(id) = id("pages-") {
        return ledger::pages(catalog, id).is_some() && name == pages_object(id);
    }
    if let Some(seq) = id("index-") {
        let i = catalog.snapshots.partition_point(|s| s.seq < seq);
        return catalog.snapshots.get(i).is_some_and(|s| s.index == name);
    }
    let forward = name
        .strip_prefix("forward-")
        .and_then(|rest| rest.split_once('-'));
    if let Some(origin) = forward.and_then(|(origin, _)| u64::from_str_radix(origin, 16).ok()) {
        return ledger::forward(catalog, origin).is_some_and(|f| f.object == name);
    }
    false
}

/// The names of the objects of the archive's folder that `catalog` does
/// not reference.
pub fn unreferenced(archive: &Archive, catalog: &Catalog) -> Result<Vec<String>> {
    let mut found = Vec::new();
    archive.visit_objects(&mut |names| {
        found.extend(names.iter().filter(|n| !is_referenced(catalog, n)).cloned());
        Ok(())
    })?;
    Ok(found)
}

/// Deletes what `unreferenced` finds, a page at a time; returns how many.
pub fn sweep(archive: &Archive, _claim: &WriterLock<'_>, catalog: &Catalog) -> Result<usize> {
    // What a killed writer left of a pack it was storing (temporary
    // files, incomplete uploads) is no object: the store removes it.
    let mut swept = archive.clean_interrupted()?;
    archive.visit_objects(&mut |names| {
        let gone: Vec<String> = names
            .iter()
            .filter(|n| !is_referenced(catalog, n))
            .cloned()
            .collect();
        if !gone.is_empty() {
            archive.delete_objects(&gone)?;
        }
        swept += gone.len();
        Ok(())
    })?;
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::catalog::{ForwardRecord, PackRecord};

    #[test]
    fn only_what_the_catalog_names_is_referenced() {
        let mut catalog = ledger::empty("vm", 4096);
        catalog.next_pack = 10;
        let pack = PackRecord {
            id: 3,
            owner_seq: 1,
            first_seq: 1,
            last_seq: 1,
            slots: 1,
            object_bytes: 1,
        };
        ledger::add_pack(&mut catalog, pack);
        let forward = ForwardRecord {
            origin: 2,
            first_seq: 1,
            last_seq: 1,
            object: crate::archive::forward_object(2, 7),
            object_bytes: 1,
            targets: vec![3],
        };
        ledger::set_forward(&mut catalog, forward);
        for name in [
            pack_object(3),
            crate::archive::forward_object(2, 7),
            "writer".to_string(),
        ] {
            assert!(is_referenced(&catalog, &name), "{name}");
        }
        let strangers = [
            pack_object(4),
            "pack-3".to_string(),
            "pack-000000000000000X".to_string(),
            pages_object(3),
            crate::archive::index_object(1),
            crate::archive::forward_object(2, 8),
            "forward-zz".to_string(),
            "notes.txt".to_string(),
        ];
        for name in strangers {
            assert!(!is_referenced(&catalog, &name), "{name}");
        }
    }
}
