//! The rules over a catalog: which snapshots and packs it holds, which
//! pack is still referenced, and the changes a command makes to it, each
//! checked before and after.

use crate::format::catalog::{ArchivedSnapshot, Catalog, PackRecord, Totals};

/// A new, empty catalog for `volume` (generation 0: the first commit is 1).
pub fn empty(volume: &str, block_bytes: u32) -> Catalog {
    Catalog {
        volume: volume.to_string(),
        generation: 0,
        block_bytes,
        next_pack: 1,
        next_seq: 1,
        snapshots: Vec::new(),
        packs: Vec::new(),
        partial: None,
        totals: Totals::default(),
    }
}

pub fn snapshot<'a>(catalog: &'a Catalog, name: &str) -> Option<&'a ArchivedSnapshot> {
    catalog.snapshots.iter().find(|s| s.name == name)
}

pub fn newest(catalog: &Catalog) -> Option<&ArchivedSnapshot> {
    catalog.snapshots.last()
}

pub fn pack(catalog: &Catalog, id: u64) -> Option<&PackRecord> {
    catalog
        .packs
        .binary_search_by_key(&id, |p| p.id)
        .ok()
        .map(|i| &catalog.packs[i])
}

/// Takes the next pack id.
pub fn allocate_pack(catalog: &mut Catalog) -> u64 {
    let id = catalog.next_pack;
    catalog.next_pack += 1;
    assert!(pack(catalog, id).is_none(), "pack {id} allocated twice");
    id
}

/// Records a stored pack.
pub fn add_pack(catalog: &mut Catalog, record: PackRecord) {
    assert!(
        record.id < catalog.next_pack,
        "pack {} was never allocated",
        record.id
    );
    assert!(record.first_seq <= record.owner_seq && record.owner_seq <= record.last_seq);
    let at = match catalog.packs.binary_search_by_key(&record.id, |p| p.id) {
        Ok(_) => panic!("pack {} recorded twice", record.id),
        Err(at) => at,
    };
    catalog.packs.insert(at, record);
}

/// Forgets packs (their objects are deleted after the commit).
pub fn remove_packs(catalog: &mut Catalog, ids: &[u64]) -> Vec<PackRecord> {
    let before = catalog.packs.len();
    let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut catalog.packs)
        .into_iter()
        .partition(|p| ids.contains(&p.id));
    catalog.packs = kept;
    assert_eq!(gone.len(), ids.len(), "every pack removed was recorded");
    assert_eq!(catalog.packs.len() + gone.len(), before);
    gone
}

/// Adds a pushed snapshot after the newest.
pub fn add_snapshot(catalog: &mut Catalog, snapshot: ArchivedSnapshot) {
    assert!(
        snapshot.seq < catalog.next_seq,
        "seq {} was never allocated",
        snapshot.seq
    );
    assert!(
        newest(catalog).is_none_or(|n| n.seq < snapshot.seq),
        "snapshots are added in push order"
    );
    assert!(
        self::snapshot(catalog, &snapshot.name).is_none(),
        "{} archived twice",
        snapshot.name
    );
    catalog.snapshots.push(snapshot);
}

/// Whether any kept snapshot lies in a pack's reference range: while one
/// does, the pack may be read; once none does, nothing references it.
pub fn is_referenced(catalog: &Catalog, pack: &PackRecord) -> bool {
    let i = catalog
        .snapshots
        .partition_point(|s| s.seq < pack.first_seq);
    catalog
        .snapshots
        .get(i)
        .is_some_and(|s| s.seq <= pack.last_seq)
        || catalog
            .partial
            .as_ref()
            .is_some_and(|p| p.packs.contains(&pack.id))
}

/// Notes that snapshot `seq` references packs `ids`: their ranges reach it.
pub fn note_references(catalog: &mut Catalog, seq: u64, ids: &std::collections::BTreeSet<u64>) {
    for p in catalog.packs.iter_mut().filter(|p| ids.contains(&p.id)) {
        assert!(
            p.first_seq <= seq,
            "pack {} referenced before it was written",
            p.id
        );
        p.last_seq = p.last_seq.max(seq);
    }
}

/// Bytes of every pack.
pub fn stored_bytes(catalog: &Catalog) -> u64 {
    catalog.packs.iter().map(|p| p.object_bytes).sum()
}
