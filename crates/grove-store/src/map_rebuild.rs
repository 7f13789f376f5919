//! Rebuilding an allocation map that could not be decoded at open.
//!
//! Maps are rewritten in place at checkpoint, so a crash can tear one. The
//! trees say what a map must hold: a block is in use exactly when the
//! volume table or a tree (of a live volume, or of a removed one the
//! reclaimer has not given back yet) reaches it, or when it is one of its
//! group's own blocks. Nothing else can hold a block at open: writes in
//! flight and frees waiting for their commit exist only in memory.

use std::collections::{BTreeMap, HashMap};

use crate::checkpoint::TreeReferences;
use crate::error::Result;
use crate::format::group::{GROUP_HEADER_BLOCKS, NIBBLE_ALLOCATED, NIBBLE_META};
use crate::format::node::NodeKind;
use crate::state::State;
use crate::types::BlockAddr;

/// What the walk found in the damaged groups: block -> holds metadata.
type InUse = HashMap<u64, bool>;

impl State {
    /// Rebuilds the maps of the groups whose map block was unusable at
    /// open, from what the trees reach as replay left them (`references`,
    /// see `State::rebuild_from_trees_if_damaged`), plus the volume
    /// table's own blocks. A lost map also lost the bits saying which of
    /// its group's count blocks hold counts, so it marks the share counts
    /// for rebuilding too.
    pub(crate) fn rebuild_maps(&mut self, references: &TreeReferences) -> Result<()> {
        if self.maps_damaged().is_empty() {
            return Ok(());
        }
        let damaged: BTreeMap<u64, String> = self.take_maps_damaged().into_iter().collect();
        let mut in_use = InUse::new();
        let table_height = self.superblock().volume_table_height;
        if table_height > 0 {
            let root = self.superblock().volume_table_root;
            self.note_in_use(root, true, &damaged, &mut in_use);
            self.walk_table_for_map(root, table_height - 1, &damaged, &mut in_use)?;
        }
        for (&addr, seen) in references {
            self.note_in_use(addr, seen.is_node, &damaged, &mut in_use);
        }
        let group_blocks = self.superblock().group_blocks;
        for &group in damaged.keys() {
            let start = self.space_map().alloc().group_start(group).0;
            let mut nibbles = vec![0u8; group_blocks as usize];
            nibbles[..GROUP_HEADER_BLOCKS as usize].fill(NIBBLE_ALLOCATED | NIBBLE_META);
            for (slot, nibble) in nibbles
                .iter_mut()
                .enumerate()
                .skip(GROUP_HEADER_BLOCKS as usize)
            {
                if let Some(&is_meta) = in_use.get(&(start + slot as u64)) {
                    *nibble = NIBBLE_ALLOCATED | if is_meta { NIBBLE_META } else { 0 };
                }
            }
            self.space_map_mut().rebuild_group(group, &nibbles);
            // Which count blocks hold counts went with the map: every count
            // is rebuilt, and the group's first count block rewritten.
            let first = self.space_map().shares().count_block_first_of(group, 0);
            self.note_share_counts_damaged(first, format!("the map of group {group} was unusable"));
        }
        let why = damaged.values().next().expect("not empty");
        let groups: Vec<String> = damaged.keys().map(u64::to_string).collect();
        self.warn_at_open(format!(
            "the allocation maps of groups {} were unusable ({why}); they were rebuilt from the trees",
            groups.join(", ")
        ));
        Ok(())
    }

    /// Notes that `addr` is in use, if it lies in a damaged group. A block
    /// outside the store is left to the tree checks (`check` reports it).
    fn note_in_use(
        &self,
        addr: BlockAddr,
        is_meta: bool,
        damaged: &BTreeMap<u64, String>,
        in_use: &mut InUse,
    ) {
        let data_start = self.superblock().data_start.0;
        if addr.0 < data_start || addr.0 >= self.space_map().alloc().store_end() {
            return;
        }
        let group = (addr.0 - data_start) / self.superblock().group_blocks;
        if damaged.contains_key(&group) {
            // A block reached as a node is metadata even if some (damaged)
            // entry also names it as data: the node must never be reused.
            *in_use.entry(addr.0).or_insert(is_meta) |= is_meta;
        }
    }

    /// The volume table's nodes below `addr`, and its record blocks.
    fn walk_table_for_map(
        &mut self,
        addr: BlockAddr,
        level: u8,
        damaged: &BTreeMap<u64, String>,
        in_use: &mut InUse,
    ) -> Result<()> {
        let entries = self.node_entries(addr, NodeKind::VolumeTable, level)?;
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            self.note_in_use(entry.addr(), true, damaged, in_use);
            if level > 0 {
                self.walk_table_for_map(entry.addr(), level - 1, damaged, in_use)?;
            }
        }
        Ok(())
    }
}
