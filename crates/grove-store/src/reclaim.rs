//! The reclaimer: gives back the trees of removed volumes (and of volumes
//! rolled back) in bounded batches. It takes a removed tree apart from the
//! left, in place: each entry it handles either drops a reference on a
//! shared child or frees an unshared one, and is then cleared. The nodes it
//! clears belong to the removed tree alone, so changing them affects no
//! live volume, and they record its progress: each batch commits as one
//! journal transaction, so after a crash the next batch resumes exactly
//! where the last durable one ended.

use std::collections::HashMap;

use crate::error::Result;
use crate::format::node::{Entry, NodeKind};
use crate::node_reads::NodeReads;
use crate::space::Release;
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};

/// Most entries one reclaim batch handles: bounds the transaction (one free
/// or count change each, plus the nodes it clears) and the time the state
/// lock is held. A small journal lowers it further (`reclaim_budget`).
pub const RECLAIM_BATCH_ENTRIES: usize = 2048;

/// What one batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimBatch {
    /// Blocks this batch freed.
    pub freed_blocks: u64,
    /// Nothing is left to reclaim.
    pub done: bool,
}

/// Blocks only removed trees reach: (data, nodes).
type DyingBlocks = (u64, u64);

/// One walk of the removed trees (and of trees about to be removed).
#[derive(Default)]
struct DyingTally {
    /// References seen so far to each block, from any walked tree.
    seen: HashMap<BlockAddr, u32>,
    /// Of those, references from trees removed already (or from nodes only
    /// they reach), until the block's last reference is seen.
    seen_without_doomed: HashMap<BlockAddr, u32>,
    /// Blocks only walked trees reach: (data, nodes); None if incomplete.
    all: Option<(u64, u64)>,
    /// Blocks only trees removed already reach.
    without_doomed: Option<(u64, u64)>,
    /// Some node must be read first.
    incomplete: bool,
}

impl State {
    /// The first removed record whose tree is not given back yet.
    fn next_dying(&self) -> Option<VolumeId> {
        self.volume_table()
            .removed_records()
            .find(|r| !r.root.is_none())
            .map(|r| r.id)
    }

    /// Entries a batch may handle so that its transaction fits the journal
    /// with room to spare: every entry may become a free extent or a share
    /// run (16 bytes each) and may clear one node image, so a quarter of a
    /// transaction goes to each kind.
    pub fn reclaim_budget(&self) -> usize {
        let transaction_bytes =
            self.max_transaction_blocks() as usize * self.geometry().block_size_bytes as usize;
        let by_records = transaction_bytes / 4 / crate::format::journal::SHARE_RUN_BYTES;
        let by_images = self.max_transaction_blocks() as usize / 4;
        RECLAIM_BATCH_ENTRIES
            .min(by_records)
            .min(by_images * self.geometry().entries_per_node)
            .max(1)
    }

    pub fn has_pending_reclaim(&self) -> bool {
        self.next_dying().is_some()
    }

    /// Reclaims up to `budget_entries` entries of removed trees.
    pub fn reclaim_batch(&mut self, budget_entries: usize) -> Result<ReclaimBatch> {
        let mut budget = budget_entries.max(1);
        let mut freed_blocks = 0;
        let mut emptied_ids = Vec::new();
        // Each removed record given back costs a unit of the budget too,
        // and the batch ends once its changes near what one transaction
        // holds: 100,000 removed snapshots whose roots are shared would
        // otherwise all be given back (and their records rewritten) in
        // one batch.
        while budget > 0 && self.pending_commit_blocks() <= self.auto_commit_blocks() {
            let Some(id) = self.next_dying() else { break };
            let record = self
                .volume_table()
                .removed(id)
                .expect("removed record")
                .clone();
            let root = record.root;
            // A root others share only loses a count; the last reference
            // is released once everything below it has been given back.
            let emptied = !self.space_map().is_last_reference(root)
                || self.reclaim_node(root, record.height - 1, &mut budget, &mut freed_blocks)?;
            if emptied && self.release_reference(root) == Release::Freed {
                freed_blocks += 1;
            }
            if emptied {
                self.volume_table_mut()
                    .update(id, |record| record.root = BlockAddr::NONE);
                emptied_ids.push(id);
                budget = budget.saturating_sub(1);
            }
        }
        // Once per batch: what the emptied records let go of is decided
        // with one look at each family (`prune_removed_all`).
        self.prune_removed_all(&emptied_ids);
        Ok(ReclaimBatch {
            freed_blocks,
            done: !self.has_pending_reclaim(),
        })
    }

    /// Empties the removed node at `addr` from the left, within `budget`.
    /// Returns true once it is all empty (the caller frees it).
    fn reclaim_node(
        &mut self,
        addr: BlockAddr,
        level: u8,
        budget: &mut usize,
        freed_blocks: &mut u64,
    ) -> Result<bool> {
        self.load_node(addr, NodeKind::VolumeData, level)?;
        for slot in 0..self.geometry().entries_per_node {
            let entry = self.entry(addr, slot);
            if entry.is_empty() {
                continue;
            }
            if *budget == 0 {
                return Ok(false);
            }
            let child = entry.addr();
            // A shared child only loses a count. Ours alone, a data block
            // or a node now emptied is freed; a node not yet emptied waits.
            let last = self.space_map().is_last_reference(child);
            if last && level > 0 && !self.reclaim_node(child, level - 1, budget, freed_blocks)? {
                return Ok(false);
            }
            if self.release_reference(child) == Release::Freed {
                *freed_blocks += 1;
            }
            self.set_entry(addr, slot, Entry::EMPTY);
            // A child node emptied by the last of the budget still has its
            // entry cleared here: at most one entry a level past the budget.
            // (An unchecked subtraction wrapped here, and in a release build
            // the batch then ran without a bound.)
            *budget = budget.saturating_sub(1);
        }
        Ok(true)
    }

    /// Blocks only removed trees still reach, which the reclaimer will
    /// free: (data blocks, nodes). A block counts once every reference to it
    /// comes from a removed tree, so blocks shared between removed trees
    /// are counted too, once. Costs what the removed trees hold.
    pub fn dying_only_blocks(&mut self) -> Result<(u64, u64)> {
        let mut reads = NodeReads::new(self.metadata_epoch(), self.geometry().block_bytes());
        reads.read_directly();
        let tally = self.dying_tally(&[], &mut reads)?;
        Ok(tally.all.expect("a direct walk finds every node"))
    }

    /// `dying_only_blocks` as if the live volumes `doomed` were removed
    /// too, from the nodes at hand (`node_reads.rs`): (with them, without
    /// them), or None if some nodes must be read first. With minus without
    /// is what removing them gives back, found in one walk.
    pub(crate) fn dying_only_blocks_via(
        &mut self,
        doomed: &[VolumeId],
        reads: &mut NodeReads,
    ) -> Result<Option<(DyingBlocks, DyingBlocks)>> {
        let tally = self.dying_tally(doomed, reads)?;
        Ok(tally.all.zip(tally.without_doomed))
    }

    fn dying_tally(&mut self, doomed: &[VolumeId], reads: &mut NodeReads) -> Result<DyingTally> {
        let removed = self
            .volume_table()
            .removed_records()
            .filter(|r| !r.root.is_none())
            .map(|r| (r.root, r.height, true));
        let doomed = doomed
            .iter()
            .map(|&id| self.live_record(id))
            .map(|r| (r.root, r.height, false));
        let trees: Vec<(BlockAddr, u8, bool)> = removed.chain(doomed).collect();
        let mut tally = DyingTally {
            all: Some((0, 0)),
            without_doomed: Some((0, 0)),
            ..DyingTally::default()
        };
        for (root, height, removed) in trees {
            self.tally_reference(root, Some(height - 1), removed, &mut tally, reads);
        }
        if tally.incomplete {
            tally.all = None;
            tally.without_doomed = None;
        }
        Ok(tally)
    }

    /// Notes one reference from a removed (or doomed) tree to `addr` (a
    /// level-`level` node, or data for None); once all of its references
    /// are, it is removed-only and its own children are walked. A reference
    /// counts without the doomed trees too if it comes from a node that
    /// is removed-only without them (`removed`).
    fn tally_reference(
        &mut self,
        addr: BlockAddr,
        level: Option<u8>,
        removed: bool,
        tally: &mut DyingTally,
        reads: &mut NodeReads,
    ) {
        let references = self.space_map().references(addr);
        let seen = tally.seen.entry(addr).or_default();
        *seen += 1;
        if *seen != references {
            if removed {
                *tally.seen_without_doomed.entry(addr).or_default() += 1;
            }
            return;
        }
        // Every reference is seen now: whether they all came from removed
        // trees is final too.
        let seen_removed =
            tally.seen_without_doomed.remove(&addr).unwrap_or(0) + u32::from(removed);
        let without_doomed = seen_removed == references;
        let count = |counts: &mut Option<(u64, u64)>| {
            if let Some((data, nodes)) = counts {
                *(if level.is_some() { nodes } else { data }) += 1;
            }
        };
        count(&mut tally.all);
        if without_doomed {
            count(&mut tally.without_doomed);
        }
        let Some(level) = level else { return };
        // A damaged removed tree must not stop `info` or removals of other
        // volumes: what cannot be read is not counted (`check` reports it,
        // and the reclaimer stops there with an error).
        let entries = match self.entries_via(addr, NodeKind::VolumeData, level, reads) {
            Ok(Some(entries)) => entries,
            Ok(None) => {
                tally.incomplete = true;
                return;
            }
            Err(_) => return,
        };
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            self.tally_reference(
                entry.addr(),
                level.checked_sub(1),
                without_doomed,
                tally,
                reads,
            );
        }
    }

    /// Blocks the reclaimer will still free (data only, or nodes too).
    pub fn pending_free_blocks(&mut self, with_nodes: bool) -> Result<u64> {
        let (data, nodes) = self.dying_only_blocks()?;
        Ok(if with_nodes { data + nodes } else { data })
    }
}
