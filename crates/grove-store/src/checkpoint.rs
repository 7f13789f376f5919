//! Checkpoint and replay. A checkpoint makes the metadata written home
//! durable, writes the allocation maps and the share-count blocks that
//! changed, and moves the journal's replay start up in a new superblock.
//! Opening a pool replays the transactions after the last checkpoint, and
//! rebuilds the share counts from the trees if a crash tore a count block.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::journal::AllocChange;
use crate::format::node::NodeKind;
use crate::format::shares::SHARE_BLOCKS_PER_GROUP;
use crate::format::superblock::SUPERBLOCK_LEN;
use crate::io::{flush, InFlightCheckpoint};
use crate::journal::ReplayedTransaction;
use crate::state::State;
use crate::types::BlockAddr;

/// How the trees reach a block: by how many entries or records, and
/// whether as a node (else as data).
#[derive(Clone, Copy, Default)]
pub(crate) struct TreeReference {
    pub count: u32,
    pub is_node: bool,
}

/// Every block the trees reach (see `State::references_from_trees`).
pub(crate) type TreeReferences = HashMap<BlockAddr, TreeReference>;

/// A prepared checkpoint's writes, in four steps that become durable in
/// order, each flushed before the next: the journaled images not home yet
/// (the flush also makes durable the images commits wrote home), the
/// share-count blocks, the allocation maps, and the superblock that moves
/// the journal's replay start up. It needs no state, so it may run
/// without the state lock.
pub(crate) struct CheckpointIo {
    device: Arc<dyn BlockDevice>,
    block_bytes: u64,
    steps: [(&'static str, BlockWrites); 4],
}

/// Whole blocks to write: (where, what).
type BlockWrites = Vec<(BlockAddr, Vec<u8>)>;

impl CheckpointIo {
    pub(crate) fn run(&self) -> Result<()> {
        let device = self.device.as_ref();
        for (what, writes) in &self.steps {
            // Within a step the blocks need no order: the flush after it
            // is what the next step waits for.
            let at: Vec<(u64, &[u8])> = writes
                .iter()
                .map(|(addr, block)| (addr.0 * self.block_bytes, block.as_slice()))
                .collect();
            let results = device.write_each_at(&at);
            if let Some((i, Err(e))) = results.into_iter().enumerate().find(|(_, r)| r.is_err()) {
                let addr = writes[i].0;
                return Err(Error::io(
                    format!("cannot write {what} at {addr} of {}", device.describe()),
                    e,
                ));
            }
            flush(device, what)?;
        }
        Ok(())
    }
}

impl State {
    /// Something a checkpoint would write: journaled transactions, changed
    /// maps or failed write-backs. A pool that only read needs none, so
    /// opening and closing it writes nothing.
    pub fn needs_checkpoint(&self) -> bool {
        !self.journal().is_empty()
            || self.space_map().alloc().has_dirty_maps()
            || self.space_map().shares().has_dirty_count_blocks()
            || self.nodes().has_unwritten()
    }

    /// Writes the share-count blocks whose durable counts changed, and
    /// notes in their groups' maps that they hold counts.
    pub(crate) fn write_count_blocks(&mut self) -> Result<()> {
        let dirty = self
            .space_map()
            .shares()
            .dirty_count_blocks(self.geometry().block_size_bytes);
        for count_block in &dirty {
            self.write_device_block(count_block.home, &count_block.block, "share counts")?;
        }
        let written: Vec<(u64, u32)> = dirty.iter().map(|c| (c.group, c.index)).collect();
        self.space_map_mut().mark_count_blocks_present(&written);
        self.space_map_mut().mark_count_blocks_clean();
        Ok(())
    }

    /// Reads the share-count blocks every group's map says it has.
    pub fn load_share_counts(&mut self) -> Result<()> {
        let block_bytes = self.geometry().block_size_bytes as usize;
        let mut span = Vec::new();
        for group in 0..self.space_map().alloc().group_count() {
            let present = self.space_map().alloc().shares_present(group);
            if present == 0 {
                continue;
            }
            // The count blocks follow the group's map block: those up to the
            // last present one are read in one request (one round trip on
            // RADOS rather than one per block).
            let span_blocks = (u8::BITS - present.leading_zeros()) as usize;
            debug_assert!(span_blocks as u64 <= SHARE_BLOCKS_PER_GROUP);
            span.resize(span_blocks * block_bytes, 0);
            let first_home = BlockAddr(self.space_map().alloc().group_start(group).0 + 1);
            self.read_block(first_home, &mut span, "share-count blocks")?;
            for k in 0..span_blocks as u64 {
                if present & (1 << k) == 0 {
                    continue;
                }
                let first = self.space_map().shares().count_block_first_of(group, k);
                let block = &span[k as usize * block_bytes..][..block_bytes];
                match crate::format::shares::decode(BlockAddr(first), block) {
                    Ok(counts) => self.space_map_mut().load_share_counts(first, &counts),
                    // Count blocks are rewritten in place at checkpoint, so
                    // a crash can tear one. The trees say what the counts
                    // must be: they are rebuilt once the table is loaded.
                    Err(e) => self.note_share_counts_damaged(first, e.to_string()),
                }
            }
        }
        Ok(())
    }

    /// Rebuilds from the trees what opening found unusable: the maps of
    /// groups whose map block did not decode (`map_rebuild.rs`), then the
    /// share counts (a lost map also lost the bits saying which count
    /// blocks hold counts). Both come from one walk of every tree. Returns
    /// whether it rebuilt anything (a checkpoint must then follow).
    pub(crate) fn rebuild_from_trees_if_damaged(&mut self) -> Result<bool> {
        if self.maps_damaged().is_empty() && self.share_counts_damaged().is_empty() {
            return Ok(false);
        }
        let references = self.references_from_trees()?;
        self.rebuild_maps(&references)?;
        self.rebuild_share_counts(&references);
        Ok(true)
    }

    /// Every block the trees reach (live volumes', and removed ones' not
    /// given back yet), with how many entries or records point at it and
    /// whether it was reached as a node. A node is walked once, however
    /// many trees share it.
    fn references_from_trees(&mut self) -> Result<TreeReferences> {
        let mut references = TreeReferences::new();
        for (root, height) in self.tree_roots() {
            self.count_references(root, Some(height - 1), &mut references)?;
        }
        Ok(references)
    }

    fn count_references(
        &mut self,
        addr: BlockAddr,
        level: Option<u8>,
        references: &mut TreeReferences,
    ) -> Result<()> {
        let seen = references.entry(addr).or_default();
        seen.count += 1;
        // A block reached as a node is metadata even if a damaged entry
        // also names it as data: the node must never be reused.
        seen.is_node |= level.is_some();
        let (Some(level), 1) = (level, seen.count) else {
            return Ok(());
        };
        let entries = self.node_entries(addr, NodeKind::VolumeData, level)?;
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            self.count_references(entry.addr(), level.checked_sub(1), references)?;
        }
        Ok(())
    }

    /// Recomputes every share count from what the trees reach, if opening
    /// found a count block it could not use (or a map, see above).
    fn rebuild_share_counts(&mut self, references: &TreeReferences) {
        if self.share_counts_damaged().is_empty() {
            return;
        }
        let extra: HashMap<u64, u32> = references
            .iter()
            .filter(|(_, seen)| seen.count > 1)
            .map(|(addr, seen)| (addr.0, seen.count - 1))
            .collect();
        self.space_map_mut().rebuild_shares(extra);
        let damaged = self.take_share_counts_damaged();
        for (first, _) in &damaged {
            self.space_map_mut().mark_count_block_dirty(*first);
        }
        self.warn_at_open(format!(
            "{} share-count blocks were unusable ({}); all share counts were rebuilt from the trees",
            damaged.len(),
            damaged[0].1
        ));
    }

    /// Makes the metadata written home durable, writes the allocation maps,
    /// and moves the journal's replay start up in a new superblock, all
    /// under the state lock. After a checkpoint, replay has nothing to do.
    pub fn checkpoint(&mut self) -> Result<()> {
        let io = self.prepare_checkpoint();
        let result = io.run();
        self.finish_checkpoint(result)
    }

    /// The first step of a checkpoint: what it writes, encoded now from
    /// the durable state (the maps' and counts' durable copies, the
    /// committed roots), which only a commit changes. Its I/O
    /// ([`CheckpointIo::run`]) may then run without the state lock while
    /// clients read and write; nothing commits or checkpoints until
    /// [`State::finish_checkpoint`] ends it.
    pub(crate) fn prepare_checkpoint(&mut self) -> CheckpointIo {
        assert!(
            !self.has_io_in_flight(),
            "a checkpoint waits for the commit or checkpoint in flight"
        );
        let block_bytes = self.geometry().block_size_bytes;
        // The journaled images not home yet stay in the node store until
        // the checkpoint ends, so that reads use them, never their homes
        // being written.
        let nodes: BlockWrites = self
            .nodes()
            .unwritten()
            .map(|(home, image)| (home, image.to_vec()))
            .collect();
        // Count blocks before the maps that say they hold counts: a crash
        // between leaves a map that does not know a written count block,
        // whose counts the journal still replays.
        let counts = self.space_map().shares().dirty_count_blocks(block_bytes);
        let present: Vec<(u64, u32)> = counts.iter().map(|c| (c.group, c.index)).collect();
        self.space_map_mut().mark_count_blocks_present(&present);
        let counts = counts.into_iter().map(|c| (c.home, c.block)).collect();
        let maps = self.space_map().alloc().dirty_maps(block_bytes);

        let mut superblock = self.superblock().clone();
        superblock.volume_table_root = self.committed_roots().volume_table_root;
        superblock.volume_table_height = self.committed_roots().volume_table_height;
        superblock.next_volume_id = self.committed_roots().next_volume_id;
        superblock.group_count = self.committed_roots().group_count;
        superblock.birth_generation = self.committed_roots().birth_generation;
        superblock.journal_head = self.journal().write_position();
        superblock.journal_sequence = self.journal().sequence();
        // The next generation goes to the other slot; a failed write does
        // not use it up, so a retry writes the same (possibly torn) slot
        // and never the last good one.
        superblock.generation += 1;
        let mut superblock_block = vec![0u8; block_bytes as usize];
        superblock_block[..SUPERBLOCK_LEN].copy_from_slice(&superblock.encode());
        let superblock_write = vec![(BlockAddr(superblock.slot()), superblock_block)];

        self.metadata_changed();
        self.start_checkpoint_io(InFlightCheckpoint { superblock });
        CheckpointIo {
            device: self.device().clone(),
            block_bytes: u64::from(block_bytes),
            steps: [
                ("metadata", nodes),
                ("share counts", counts),
                ("allocation maps", maps),
                ("the superblock", superblock_write),
            ],
        }
    }

    /// The last step of a checkpoint, under the state lock, after its I/O:
    /// on success the images are home, the counts and maps clean and the
    /// journal's replay start moved up; on failure all stays to write, and
    /// the next checkpoint writes it again.
    pub(crate) fn finish_checkpoint(&mut self, result: Result<()>) -> Result<()> {
        let in_flight = self
            .take_checkpoint_in_flight()
            .expect("a checkpoint is in flight");
        result?;
        assert_eq!(
            in_flight.superblock.journal_head,
            self.journal().write_position(),
            "nothing was journaled during a checkpoint"
        );
        self.nodes_mut().all_written_home();
        self.space_map_mut().mark_count_blocks_clean();
        self.space_map_mut().mark_maps_clean();
        self.note_superblock_written(&in_flight.superblock);
        self.journal_mut().checkpointed();
        Ok(())
    }

    /// Checks the roots a replayed transaction leaves against the ones
    /// before it: a store never shrinks, ids and generations only grow, and
    /// the volume table's root is a block of the data area. A transaction
    /// that breaks one passed its checksum, so it was written that way:
    /// replay refuses it rather than apply it or skip it.
    fn check_replayed_roots(
        &self,
        sequence: u64,
        roots: &crate::format::journal::Roots,
        store_end: u64,
    ) -> Result<()> {
        let before = &self.committed_roots();
        let refuse = |why: String| {
            Err(Error::corrupt(format!(
                "journal transaction {sequence} passes its checksum but {why}; replay refuses it"
            )))
        };
        if roots.group_count < before.group_count {
            return refuse(format!(
                "group_count {} is below {}, the groups before it",
                roots.group_count, before.group_count
            ));
        }
        if roots.next_volume_id.0 < before.next_volume_id.0 {
            return refuse(format!(
                "next_volume_id {} is below {}, the next id before it",
                roots.next_volume_id.0, before.next_volume_id.0
            ));
        }
        if roots.birth_generation < before.birth_generation {
            return refuse(format!(
                "birth_generation {} is below {}, the generation before it",
                roots.birth_generation, before.birth_generation
            ));
        }
        let root = roots.volume_table_root;
        if !root.is_none()
            && (root.0 < self.superblock().data_start.0
                || root.0 >= store_end
                || self.space_map().alloc().is_group_header(root))
        {
            return refuse(format!(
                "volume_table_root {} is not a block of the data area {}..{store_end} outside the groups' own blocks",
                root.0, self.superblock().data_start.0
            ));
        }
        Ok(())
    }

    /// Redoes every complete transaction after the last checkpoint; the
    /// caller then checkpoints (after the share counts are known good), so
    /// the next open finds an empty journal. Replaying twice
    /// gives the same result: images are whole blocks and extents set
    /// states, so applying them again changes nothing.
    pub fn replay_journal(&mut self) -> Result<usize> {
        let device = std::sync::Arc::clone(self.device());
        let pool_uuid = self.superblock().pool_uuid;
        let transactions = self.journal_mut().scan(device.as_ref(), &pool_uuid)?;
        if transactions.is_empty() {
            return Ok(0);
        }
        let last_freed = last_freed_homes(&transactions);
        // Every transaction is checked (and its extents and counts applied
        // in memory) before any image is written home: a transaction replay
        // cannot apply refuses the open with the store as it was.
        for transaction in &transactions {
            self.apply_replayed(transaction)?;
        }
        self.write_replayed_images(&transactions, &last_freed)?;
        self.space_map_mut().finish_replay();
        self.grow_device_to_store()?;
        Ok(transactions.len())
    }

    /// Writes home the last image of each block the transactions journaled,
    /// leaving out stale ones (`last_freed_homes`). One image per block
    /// needs no order among them, so they go to the device in one batch:
    /// on RADOS, where each write waits for a round trip, replaying
    /// thousands of images one after the other kept a takeover waiting
    /// for seconds. The checkpoint that follows replay flushes them.
    fn write_replayed_images(
        &self,
        transactions: &[ReplayedTransaction],
        last_freed: &HashMap<u64, usize>,
    ) -> Result<()> {
        let mut latest: BTreeMap<u64, &[u8]> = BTreeMap::new();
        for (index, transaction) in transactions.iter().enumerate() {
            for (home, image) in transaction.descriptor.homes.iter().zip(&transaction.images) {
                if last_freed.get(&home.0).is_some_and(|&freed| freed > index) {
                    continue;
                }
                latest.insert(home.0, image);
            }
        }
        if latest.is_empty() {
            return Ok(());
        }
        self.metadata_changed();
        let device = self.device();
        let block_bytes = self.geometry().block_bytes();
        let writes: Vec<(u64, &[u8])> = latest
            .iter()
            .map(|(&home, &image)| (home * block_bytes, image))
            .collect();
        let results = device.write_each_at(&writes);
        debug_assert_eq!(results.len(), writes.len());
        for ((&home, _), result) in latest.iter().zip(results) {
            result.map_err(|e| {
                Error::io(
                    format!(
                        "cannot write replayed metadata at {} of {}",
                        BlockAddr(home),
                        device.describe()
                    ),
                    e,
                )
            })?;
        }
        Ok(())
    }

    /// Applies one replayed transaction in memory (its extents and counts,
    /// its roots) after checking that what it claims fits the store.
    fn apply_replayed(&mut self, transaction: &ReplayedTransaction) -> Result<()> {
        let roots = transaction.descriptor.roots;
        self.space_map_mut().replay(
            &transaction.descriptor.extents,
            &transaction.descriptor.share_runs,
            roots.group_count,
        )?;
        let store_end = self.space_map().alloc().store_end();
        if roots.birth_generation > crate::format::node::BIRTH_GENERATION_MAX {
            return Err(Error::corrupt(format!(
                "journal transaction {} claims birth generation {}",
                transaction.descriptor.sequence, roots.birth_generation
            )));
        }
        self.check_replayed_roots(transaction.descriptor.sequence, &roots, store_end)?;
        for home in &transaction.descriptor.homes {
            let data_start = self.superblock().data_start.0;
            if home.0 < data_start
                || home.0 >= store_end
                || self.space_map().alloc().is_group_header(*home)
            {
                return Err(Error::corrupt(format!(
                    "journal transaction {} writes {home}, which cannot hold journaled metadata",
                    transaction.descriptor.sequence
                )));
            }
        }
        self.adopt_replayed_roots(roots);
        Ok(())
    }
}

/// For each block a transaction writes an image home to, the last
/// transaction that frees it. An image is stale if a later transaction
/// frees its block: the block may since hold data that the journal never
/// saw (a revoke). Only blocks that have an image can need a revoke, so only
/// those are looked up: a large removal frees millions of blocks.
fn last_freed_homes(transactions: &[ReplayedTransaction]) -> HashMap<u64, usize> {
    let homes: BTreeSet<u64> = transactions
        .iter()
        .flat_map(|t| t.descriptor.homes.iter().map(|home| home.0))
        .collect();
    let mut last_freed: HashMap<u64, usize> = HashMap::new();
    for (index, transaction) in transactions.iter().enumerate() {
        for extent in &transaction.descriptor.extents {
            if extent.change == AllocChange::Freed {
                let end = extent.first.0.saturating_add(u64::from(extent.count));
                for &addr in homes.range(extent.first.0..end) {
                    last_freed.insert(addr, index);
                }
            }
        }
    }
    last_freed
}
