//! The volume table in memory: every live and removed volume record, the
//! indexes over them (names of live volumes, children by parent) and the
//! record blocks as stored. Its fields are private, so that its methods
//! alone keep the rules: a record that changes is marked dirty (the next
//! commit writes it), the names index follows adds, renames and removals,
//! and the children index follows adds and drops. `volume_table.rs` reads
//! and writes it on disk.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::{Error, Result};
use crate::format::record::{VolumeRecord, RECORD_BYTES};
use crate::types::VolumeId;

#[derive(Default)]
pub(crate) struct VolumeTable {
    /// Live volumes.
    live: BTreeMap<VolumeId, VolumeRecord>,
    /// Removed volumes whose record is still needed: a tree the reclaimer
    /// has not given back yet, children's lineage, or a bookmark.
    removed: BTreeMap<VolumeId, VolumeRecord>,
    /// Children of every record, live or removed, by parent id.
    children: HashMap<VolumeId, BTreeSet<VolumeId>>,
    /// Live volumes by name.
    names: HashMap<String, VolumeId>,
    /// Record blocks of the volume table by block index, as stored.
    record_blocks: HashMap<u64, Vec<u8>>,
    /// Records changed (or dropped) since the last commit.
    dirty: BTreeSet<VolumeId>,
}

impl VolumeTable {
    // ----- reading -----

    /// A live record.
    pub(crate) fn live(&self, id: VolumeId) -> Option<&VolumeRecord> {
        self.live.get(&id)
    }

    /// A removed record still kept.
    pub(crate) fn removed(&self, id: VolumeId) -> Option<&VolumeRecord> {
        self.removed.get(&id)
    }

    /// A live or removed record.
    pub(crate) fn any(&self, id: VolumeId) -> Option<&VolumeRecord> {
        self.live.get(&id).or_else(|| self.removed.get(&id))
    }

    /// The live volume named `name`.
    pub(crate) fn by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.names.get(name).map(|id| &self.live[id])
    }

    /// Live records, in id (creation) order.
    pub(crate) fn live_records(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.live.values()
    }

    /// Live records after `id`, in id order: a listing in slices resumes
    /// there.
    pub(crate) fn live_records_after(&self, id: VolumeId) -> impl Iterator<Item = &VolumeRecord> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.live.range((Excluded(id), Unbounded)).map(|(_, r)| r)
    }

    /// Removed records still kept, in id order.
    pub(crate) fn removed_records(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.removed.values()
    }

    /// Live records, then removed ones.
    pub(crate) fn all_records(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.live.values().chain(self.removed.values())
    }

    /// Live and removed records.
    pub(crate) fn record_count(&self) -> usize {
        self.live.len() + self.removed.len()
    }

    /// Children of `id`, live and removed, in id order.
    pub(crate) fn children_of(&self, id: VolumeId) -> impl Iterator<Item = VolumeId> + '_ {
        self.children.get(&id).into_iter().flatten().copied()
    }

    /// How many children `id` has, live and removed.
    pub(crate) fn child_count(&self, id: VolumeId) -> usize {
        self.children.get(&id).map_or(0, |c| c.len())
    }

    /// How many removed records are kept.
    pub(crate) fn removed_count(&self) -> usize {
        self.removed.len()
    }

    pub(crate) fn has_children(&self, id: VolumeId) -> bool {
        self.children.get(&id).is_some_and(|c| !c.is_empty())
    }

    // ----- changing -----

    /// Changes a live or removed record and marks it dirty: the only way
    /// to change one. `change` must leave what the indexes follow alone
    /// (id, name, parent, removed): `rename` and `mark_removed` change those.
    pub(crate) fn update<R>(
        &mut self,
        id: VolumeId,
        change: impl FnOnce(&mut VolumeRecord) -> R,
    ) -> R {
        let record = match self.live.get_mut(&id) {
            Some(record) => record,
            None => self.removed.get_mut(&id).expect("record exists"),
        };
        #[cfg(debug_assertions)]
        let before = (
            record.id,
            record.parent,
            record.removed,
            record.name.clone(),
        );
        let result = change(record);
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            before,
            (
                record.id,
                record.parent,
                record.removed,
                record.name.clone()
            ),
            "update changed what the volume table's indexes follow"
        );
        self.dirty.insert(id);
        result
    }

    /// Adds a new record, live or removed: indexed by parent (and by name
    /// if live), and dirty.
    pub(crate) fn insert(&mut self, record: VolumeRecord) {
        self.dirty.insert(record.id);
        self.index(record);
    }

    /// Indexes a record by parent and, if live, by name. False if its name
    /// is taken by another live volume.
    fn index(&mut self, record: VolumeRecord) -> bool {
        if record.parent != VolumeId::NONE {
            self.children
                .entry(record.parent)
                .or_default()
                .insert(record.id);
        }
        if record.removed {
            self.removed.insert(record.id, record);
            return true;
        }
        let unique = self.names.insert(record.name.clone(), record.id).is_none();
        self.live.insert(record.id, record);
        unique
    }

    /// Removes live volume `id`: its record is kept as removed (its name
    /// is free again) until `drop_removed`.
    pub(crate) fn mark_removed(&mut self, id: VolumeId) {
        let mut record = self.live.remove(&id).expect("volume exists");
        self.names.remove(&record.name);
        record.removed = true;
        self.removed.insert(id, record);
        self.dirty.insert(id);
    }

    /// Forgets removed record `id` (its slot is cleared at the next
    /// commit), and its place among its parent's children.
    pub(crate) fn drop_removed(&mut self, id: VolumeId) -> VolumeRecord {
        let record = self.removed.remove(&id).expect("removed record");
        self.dirty.insert(id);
        self.children.remove(&id);
        if let Some(siblings) = self.children.get_mut(&record.parent) {
            siblings.remove(&id);
        }
        record
    }

    pub(crate) fn rename(&mut self, id: VolumeId, new_name: &str) {
        let record = self.live.get_mut(&id).expect("volume exists");
        let old = std::mem::replace(&mut record.name, new_name.to_string());
        self.names.remove(&old);
        self.names.insert(new_name.to_string(), id);
        self.dirty.insert(id);
    }

    // ----- what the commit writes -----

    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    pub(crate) fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// The dirty records' ids, left dirty.
    pub(crate) fn dirty_ids(&self) -> BTreeSet<VolumeId> {
        self.dirty.clone()
    }

    /// The dirty records' ids; none is dirty any more.
    pub(crate) fn take_dirty(&mut self) -> BTreeSet<VolumeId> {
        std::mem::take(&mut self.dirty)
    }

    /// Marks records dirty again whose commit was not sealed.
    pub(crate) fn restore_dirty(&mut self, ids: BTreeSet<VolumeId>) {
        self.dirty.extend(ids);
    }

    // ----- record blocks (volume_table.rs) -----

    /// Keeps the records of record block `block_index` read at open, and
    /// the block as stored. Refuses a live name given twice.
    pub(crate) fn load_block(
        &mut self,
        block_index: u64,
        block: Vec<u8>,
        records: Vec<VolumeRecord>,
    ) -> Result<()> {
        for record in records {
            let name = record.name.clone();
            if !self.index(record) {
                return Err(Error::corrupt(format!("volume table names {name:?} twice")));
            }
        }
        self.record_blocks.insert(block_index, block);
        Ok(())
    }

    /// Encodes record `id` (or an empty slot if it is gone) into slot
    /// `slot` of record block `block_index`, a new zeroed block of
    /// `block_size` bytes if the table has none there yet.
    pub(crate) fn encode_into_block(
        &mut self,
        id: VolumeId,
        block_index: u64,
        slot: usize,
        block_size: usize,
    ) {
        let block = self
            .record_blocks
            .entry(block_index)
            .or_insert_with(|| vec![0u8; block_size]);
        let bytes = &mut block[slot * RECORD_BYTES..(slot + 1) * RECORD_BYTES];
        match self.live.get(&id).or_else(|| self.removed.get(&id)) {
            Some(record) => record.encode(bytes),
            None => bytes.fill(0),
        }
    }

    /// Record block `block_index` as it will be stored.
    pub(crate) fn record_block(&self, block_index: u64) -> &[u8] {
        &self.record_blocks[&block_index]
    }

    /// Forgets record block `block_index` (given back: every slot empty).
    pub(crate) fn forget_record_block(&mut self, block_index: u64) {
        self.record_blocks.remove(&block_index);
    }
}
