//! The rules over a catalog: which snapshots and packs it holds, which
//! pack is still referenced, and the changes a command makes to it, each
//! checked before and after.

use crate::format::catalog::{ArchivedSnapshot, Catalog, ForwardRecord, PackRecord, PagesRecord};
use std::collections::BTreeSet;

/// A new, empty catalog for `volume`, with a fresh random id.
pub fn empty(volume: &str, block_bytes: u32) -> Catalog {
    Catalog::empty(
        volume,
        random_id(),
        block_bytes,
        crate::hooks::segment_blocks(),
    )
}

/// 128 random bits as hex, from the kernel; the clock and the process if
/// /dev/urandom cannot be read.
fn random_id() -> String {
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if read.is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes.copy_from_slice(&(nanos ^ (u128::from(std::process::id()) << 96)).to_le_bytes());
    }
    hex::encode(bytes)
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

pub fn pages(catalog: &Catalog, id: u64) -> Option<&PagesRecord> {
    catalog
        .pages
        .binary_search_by_key(&id, |p| p.id)
        .ok()
        .map(|i| &catalog.pages[i])
}

/// The forward table of deleted pack `origin`, if its addresses are used.
pub fn forward(catalog: &Catalog, origin: u64) -> Option<&ForwardRecord> {
    catalog
        .forwards
        .binary_search_by_key(&origin, |f| f.origin)
        .ok()
        .map(|i| &catalog.forwards[i])
}

/// Takes the next object id (packs, page objects and forward tables
/// share one counter, so no two objects ever share an id).
pub fn allocate_pack(catalog: &mut Catalog) -> u64 {
    let id = catalog.next_pack;
    catalog.next_pack += 1;
    assert!(pack(catalog, id).is_none(), "pack {id} allocated twice");
    assert!(
        pages(catalog, id).is_none(),
        "page object {id} allocated twice"
    );
    id
}

/// Records a stored page object.
pub fn add_pages(catalog: &mut Catalog, record: PagesRecord) {
    assert!(
        record.id < catalog.next_pack,
        "page object {} was never allocated",
        record.id
    );
    let at = match catalog.pages.binary_search_by_key(&record.id, |p| p.id) {
        Ok(_) => panic!("page object {} recorded twice", record.id),
        Err(at) => at,
    };
    catalog.pages.insert(at, record);
}

/// Forgets page objects (deleted after the commit).
pub fn remove_pages(catalog: &mut Catalog, ids: &[u64]) {
    let before = catalog.pages.len();
    catalog.pages.retain(|p| !ids.contains(&p.id));
    assert_eq!(
        catalog.pages.len() + ids.len(),
        before,
        "every page object removed was recorded"
    );
}

/// Records or replaces deleted pack `record.origin`'s forward table;
/// returns the object it replaced, to delete after the commit.
pub fn set_forward(catalog: &mut Catalog, record: ForwardRecord) -> Option<String> {
    assert!(
        record.first_seq <= record.last_seq,
        "a forward table's range is in order"
    );
    match catalog
        .forwards
        .binary_search_by_key(&record.origin, |f| f.origin)
    {
        Ok(i) => Some(std::mem::replace(&mut catalog.forwards[i], record).object),
        Err(at) => {
            catalog.forwards.insert(at, record);
            None
        }
    }
}

/// Forgets forward tables (deleted after the commit).
pub fn remove_forwards(catalog: &mut Catalog, origins: &[u64]) {
    let before = catalog.forwards.len();
    catalog.forwards.retain(|f| !origins.contains(&f.origin));
    assert_eq!(
        catalog.forwards.len() + origins.len(),
        before,
        "every forward removed was recorded"
    );
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

/// Whether a snapshot the catalog keeps lies in `first..=last`.
pub fn kept_in(catalog: &Catalog, first: u64, last: u64) -> bool {
    let i = catalog.snapshots.partition_point(|s| s.seq < first);
    catalog.snapshots.get(i).is_some_and(|s| s.seq <= last)
}

/// Whether any kept snapshot lies in a pack's reference range: while one
/// does, the pack may be read; once none does, nothing references it.
pub fn is_referenced(catalog: &Catalog, pack: &PackRecord) -> bool {
    kept_in(catalog, pack.first_seq, pack.last_seq)
        || catalog
            .partial
            .as_ref()
            .is_some_and(|p| p.packs.contains(&pack.id))
}

/// The same for a page object.
pub fn is_pages_referenced(catalog: &Catalog, pages: &PagesRecord) -> bool {
    kept_in(catalog, pages.first_seq, pages.last_seq)
        || catalog
            .partial
            .as_ref()
            .is_some_and(|p| p.pages.contains(&pages.id))
}

/// Notes that snapshot `seq` references the addresses of packs `ids` and
/// the page objects `page_objects`: their ranges reach it. An address
/// whose pack was deleted reaches its forward table and the packs that
/// table points into.
pub fn note_references(
    catalog: &mut Catalog,
    seq: u64,
    ids: &BTreeSet<u64>,
    page_objects: &BTreeSet<u64>,
) {
    let mut targets: BTreeSet<u64> = BTreeSet::new();
    for f in catalog
        .forwards
        .iter_mut()
        .filter(|f| ids.contains(&f.origin))
    {
        f.last_seq = f.last_seq.max(seq);
        targets.extend(f.targets.iter().copied());
    }
    for p in catalog
        .packs
        .iter_mut()
        .filter(|p| ids.contains(&p.id) || targets.contains(&p.id))
    {
        assert!(
            p.first_seq <= seq,
            "pack {} referenced before it was written",
            p.id
        );
        p.last_seq = p.last_seq.max(seq);
    }
    for p in catalog
        .pages
        .iter_mut()
        .filter(|p| page_objects.contains(&p.id))
    {
        assert!(
            p.first_seq <= seq,
            "page object {} referenced before it was written",
            p.id
        );
        p.last_seq = p.last_seq.max(seq);
    }
}

/// Bytes of every pack.
pub fn stored_bytes(catalog: &Catalog) -> u64 {
    catalog.packs.iter().map(|p| p.object_bytes).sum()
}

/// Bytes of the index: roots, page objects and forward tables.
pub fn index_bytes(catalog: &Catalog) -> u64 {
    catalog.snapshots.iter().map(|s| s.index_bytes).sum::<u64>()
        + catalog.pages.iter().map(|p| p.object_bytes).sum::<u64>()
        + catalog.forwards.iter().map(|f| f.object_bytes).sum::<u64>()
}
