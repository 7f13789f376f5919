//! The volume table on disk: record blocks of fixed-size volume records,
//! found through a small radix tree keyed by record block index (volume id
//! / records per block). Opening reads every record into memory (the
//! `VolumeTable` of `records.rs`, which owns them); a commit writes back
//! only the record blocks whose records changed, and gives back a block
//! once no record in it is in use.

use std::collections::BTreeMap;

use crate::alloc::BlockUse;
use crate::error::{Error, Result};
use crate::format::node::{Entry, Node, NodeKind};
use crate::format::record::{VolumeRecord, RECORD_BYTES};
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};

impl State {
    /// Checks that a root pointer read from disk names a usable block: in
    /// the data area and not an allocation map.
    fn check_root(&self, addr: BlockAddr, what: &str) -> Result<()> {
        let data_start = self.superblock().data_start.0;
        if addr.0 < data_start
            || addr.0 >= self.space_map().alloc().store_end()
            || self.space_map().alloc().is_group_header(addr)
        {
            return Err(Error::corrupt(format!(
                "{what} points at {addr}, which cannot hold a node"
            )));
        }
        Ok(())
    }

    /// Reads every record of the volume table into memory.
    pub fn load_volume_table(&mut self) -> Result<()> {
        let height = self.superblock().volume_table_height;
        if height == 0 {
            return Ok(());
        }
        if height >= crate::format::node::NODE_LEVELS_MAX {
            return Err(Error::corrupt(format!(
                "the volume table claims {height} levels"
            )));
        }
        self.check_root(self.superblock().volume_table_root, "the volume table root")?;
        let mut leaves = Vec::new();
        self.collect_table_leaves(
            self.superblock().volume_table_root,
            height - 1,
            0,
            &mut leaves,
        )?;
        for (block_index, addr) in leaves {
            self.load_record_block(block_index, addr)?;
        }
        for record in self.volume_table().all_records() {
            self.check_record(record)?;
        }
        Ok(())
    }

    /// Reads record block `block_index` and keeps its records, live ones
    /// and removed ones (bookmarks, trees being reclaimed), in the table.
    fn load_record_block(&mut self, block_index: u64, addr: BlockAddr) -> Result<()> {
        let per_block = self.geometry().records_per_block;
        let mut block = vec![0u8; self.geometry().block_size_bytes as usize];
        self.read_block(addr, &mut block, "volume table block")?;
        let mut records = Vec::new();
        for slot in 0..per_block {
            let id = VolumeId(block_index * per_block + slot);
            let start = slot as usize * RECORD_BYTES;
            if let Some(record) = VolumeRecord::decode(&block[start..start + RECORD_BYTES], id)? {
                records.push(record);
            }
        }
        self.volume_table_mut()
            .load_block(block_index, block, records)
    }

    /// Checks what a record read from disk claims against the rest of the
    /// pool: generations, its root and tree height, its id, its parent.
    fn check_record(&self, record: &VolumeRecord) -> Result<()> {
        let generation = self.superblock().birth_generation;
        let newest = record
            .created_generation
            .max(record.share_floor_generation)
            .max(record.written_base_generation);
        if newest > generation {
            return Err(Error::corrupt(format!(
                "volume {:?} names generation {newest}, after the pool's birth_generation {generation}",
                record.name
            )));
        }
        // Ids, parents and roots are checked for every record, with a tree
        // or without one (a record without data still names its lineage).
        if record.id.0 >= self.superblock().next_volume_id.0 {
            return Err(Error::corrupt(format!(
                "volume {:?} has id {}, not below next_volume_id {}",
                record.name,
                record.id.0,
                self.superblock().next_volume_id.0
            )));
        }
        // A parent is always made before its children: ids only grow.
        if record.parent != VolumeId::NONE && record.parent.0 >= record.id.0 {
            return Err(Error::corrupt(format!(
                "volume {:?} (id {}) names parent id {}, not below its own",
                record.name, record.id.0, record.parent.0
            )));
        }
        if record.parent != VolumeId::NONE && self.volume_table().any(record.parent).is_none() {
            return Err(Error::corrupt(format!(
                "volume {:?} names parent #{}, which does not exist",
                record.name, record.parent.0
            )));
        }
        if record.root.is_none() {
            return Ok(());
        }
        self.check_root(
            record.root,
            &format!("the root of volume {:?}", record.name),
        )?;
        let height_needed = self
            .geometry()
            .height_for(self.geometry().blocks_for(record.size_bytes));
        if record.height < height_needed {
            return Err(Error::corrupt(format!(
                "volume {:?} has a tree of {} levels, too few for its {} bytes (at least {height_needed})",
                record.name, record.height, record.size_bytes
            )));
        }
        Ok(())
    }

    fn collect_table_leaves(
        &mut self,
        addr: BlockAddr,
        level: u8,
        base: u64,
        out: &mut Vec<(u64, BlockAddr)>,
    ) -> Result<()> {
        let entries = self.node_entries(addr, NodeKind::VolumeTable, level)?;
        let span = self.geometry().span_blocks(level);
        for (slot, entry) in entries.iter().enumerate() {
            if entry.is_empty() {
                continue;
            }
            let index = base + slot as u64 * span;
            if level == 0 {
                out.push((index, entry.addr()));
            } else {
                self.collect_table_leaves(entry.addr(), level - 1, index, out)?;
            }
        }
        Ok(())
    }

    /// Writes changed records into their record blocks, growing the table's
    /// tree as ids grow. Returns the record blocks to write.
    pub(crate) fn persist_volume_table(&mut self) -> Result<Vec<(BlockAddr, Vec<u8>)>> {
        let per_block = self.geometry().records_per_block;
        let dirty = self.volume_table_mut().take_dirty();
        let mut touched: BTreeMap<u64, BlockAddr> = BTreeMap::new();
        for id in dirty {
            let block_index = id.0 / per_block;
            if let std::collections::btree_map::Entry::Vacant(slot) = touched.entry(block_index) {
                slot.insert(self.table_block_for_write(block_index)?);
            }
            let block_size = self.geometry().block_size_bytes as usize;
            let slot = (id.0 % per_block) as usize;
            self.volume_table_mut()
                .encode_into_block(id, block_index, slot, block_size);
        }
        // A record block whose every slot is empty is given back, so that
        // a pool that made and removed many volumes does not keep (or read
        // at open) their empty blocks.
        let mut writes = Vec::with_capacity(touched.len());
        for (index, addr) in touched {
            let block = self.volume_table().record_block(index);
            if block.iter().all(|&b| b == 0) {
                self.release_table_block(index, addr)?;
                self.volume_table_mut().forget_record_block(index);
            } else {
                writes.push((addr, block.to_vec()));
            }
        }
        Ok(writes)
    }

    /// Unlinks record block `block_index` (at `addr`) from the volume
    /// table and frees it.
    fn release_table_block(&mut self, block_index: u64, addr: BlockAddr) -> Result<()> {
        let (leaf, _) = self.leaf_for_write(
            self.superblock().volume_table_root,
            self.superblock().volume_table_height,
            NodeKind::VolumeTable,
            block_index,
        )?;
        let slot = self.geometry().slot(block_index, 0);
        debug_assert_eq!(self.entry(leaf, slot).addr(), addr);
        self.set_entry(leaf, slot, Entry::EMPTY);
        // Record blocks are never shared: this is their last reference.
        debug_assert!(self.space_map().is_last_reference(addr));
        self.release_reference(addr);
        Ok(())
    }

    /// The address of record block `block_index`, allocating it and the
    /// table nodes above it as needed.
    fn table_block_for_write(&mut self, block_index: u64) -> Result<BlockAddr> {
        let entries = self.geometry().entries_per_node;
        if self.superblock().volume_table_height == 0 {
            let root = self.insert_new_node(Node::empty(NodeKind::VolumeTable, 0, entries))?;
            self.set_volume_table_root(root, 1);
        }
        while self
            .geometry()
            .capacity_blocks(self.superblock().volume_table_height)
            <= block_index
        {
            let level = self.superblock().volume_table_height;
            let mut node = Node::empty(NodeKind::VolumeTable, level, entries);
            node.entries[0] = Entry::new(self.superblock().volume_table_root, 0);
            let root = self.insert_new_node(node)?;
            self.set_volume_table_root(root, level + 1);
        }
        let height = self.superblock().volume_table_height;
        let (leaf, _) = self.leaf_for_write(
            self.superblock().volume_table_root,
            height,
            NodeKind::VolumeTable,
            block_index,
        )?;
        let slot = self.geometry().slot(block_index, 0);
        let entry = self.entry(leaf, slot);
        if !entry.is_empty() {
            return Ok(entry.addr());
        }
        let addr = self.space_map_mut().allocate(BlockUse::Meta)?;
        self.set_entry(leaf, slot, Entry::new(addr, 0));
        Ok(addr)
    }
}
