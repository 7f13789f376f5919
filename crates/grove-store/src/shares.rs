//! Exact sharing: the extra reference count of every block (see
//! `format/shares.rs`). Kept like the allocation maps: a live copy with
//! every change, a durable copy with what sealed transactions did, and the
//! changes since the last seal, which ride in the next journal descriptor
//! as runs. Checkpoints write the count blocks from the durable copy.
//!
//! Only blocks with extra references are kept in memory, so a pool whose
//! blocks are mostly unshared costs almost nothing here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::types::AddrMap;

use crate::error::{Error, Result};
use crate::format::group::GROUP_HEADER_BLOCKS;
use crate::format::journal::ShareRun;
use crate::format::shares::{self, SHARE_BLOCKS_PER_GROUP};
use crate::types::BlockAddr;

/// Most extra references one block may have: far beyond any snapshot count
/// the generation counter allows, and checked rather than wrapped.
pub const EXTRA_REFERENCES_MAX: u32 = u32::MAX - 1;

pub struct Shares {
    data_start: u64,
    group_blocks: u64,
    counts_per_block: u64,
    /// Extra references of every block that has some, as of now.
    live: AddrMap<u64, u32>,
    /// The same as of the last sealed transaction.
    durable: AddrMap<u64, u32>,
    /// Blocks whose count changed since the last seal, with the new count.
    changes: BTreeMap<u64, u32>,
    /// Count blocks (by first covered block) whose durable counts changed
    /// since the last checkpoint wrote them.
    dirty_count_blocks: BTreeSet<u64>,
}

impl Shares {
    pub fn new(data_start: BlockAddr, group_blocks: u64, block_size_bytes: u32) -> Shares {
        let counts_per_block = shares::counts_per_block(block_size_bytes);
        assert!(counts_per_block * SHARE_BLOCKS_PER_GROUP >= group_blocks);
        Shares {
            data_start: data_start.0,
            group_blocks,
            counts_per_block,
            live: AddrMap::default(),
            durable: AddrMap::default(),
            changes: BTreeMap::new(),
            dirty_count_blocks: BTreeSet::new(),
        }
    }

    /// Extra references of `addr`: 0 for a block only one entry points at.
    pub fn extra(&self, addr: BlockAddr) -> u32 {
        self.live.get(&addr.0).copied().unwrap_or(0)
    }

    /// True if more than one entry or record points at `addr`.
    pub fn is_shared(&self, addr: BlockAddr) -> bool {
        self.live.contains_key(&addr.0)
    }

    /// One more entry points at `addr`.
    /// Returns the count before and after. One lookup: a snapshot's first
    /// write into a shared leaf counts a reference for each of its
    /// hundreds of children.
    pub fn increment(&mut self, addr: BlockAddr) -> Result<(u32, u32)> {
        let count = self.live.entry(addr.0).or_insert(0);
        let before = *count;
        if before >= EXTRA_REFERENCES_MAX {
            return Err(Error::corrupt(format!(
                "{addr} already has {before} extra references"
            )));
        }
        *count = before + 1;
        self.changes.insert(addr.0, before + 1);
        Ok((before, before + 1))
    }

    /// One entry that pointed at `addr` is gone; `addr` must have been shared.
    pub fn decrement(&mut self, addr: BlockAddr) {
        let extra = self.extra(addr);
        assert!(extra > 0, "{addr} is not shared");
        self.set(addr, extra - 1);
    }

    fn set(&mut self, addr: BlockAddr, extra: u32) {
        if extra == 0 {
            self.live.remove(&addr.0);
        } else {
            self.live.insert(addr.0, extra);
        }
        self.changes.insert(addr.0, extra);
    }

    /// Sets a block's count outright (check --repair).
    pub fn set_exact(&mut self, addr: BlockAddr, extra: u32) {
        self.set(addr, extra);
    }

    /// Replaces every count with `extra` (rebuilt from the trees), live and
    /// durable alike, and marks every count block that held or now holds a
    /// count for the next checkpoint. Counts already on their way to the
    /// journal are overwritten too: the trees are the truth.
    pub fn rebuild(&mut self, extra: HashMap<u64, u32>) {
        let mut touched: BTreeSet<u64> = BTreeSet::new();
        for addr in self.durable.keys().chain(extra.keys()) {
            touched.insert(self.count_block_first(*addr));
        }
        self.live = extra.iter().map(|(&a, &n)| (a, n)).collect();
        self.durable = self.live.clone();
        self.changes.clear();
        self.dirty_count_blocks.extend(touched);
    }

    /// Marks the count block covering blocks from `first` for rewriting.
    pub fn mark_count_block_dirty(&mut self, first: u64) {
        self.dirty_count_blocks.insert(first);
    }

    /// Blocks with extra references, and how many (for `check`).
    pub fn all(&self) -> &AddrMap<u64, u32> {
        &self.live
    }

    pub fn change_count(&self) -> usize {
        self.changes.len()
    }

    /// The changes since the last seal as runs of neighbours with the same count.
    pub fn pending_runs(&self) -> Vec<ShareRun> {
        let mut runs: Vec<ShareRun> = Vec::new();
        for (&addr, &extra) in &self.changes {
            match runs.last_mut() {
                Some(run) if run.extra == extra && run.first.0 + u64::from(run.count) == addr => {
                    run.count += 1
                }
                _ => runs.push(ShareRun {
                    first: BlockAddr(addr),
                    count: 1,
                    extra,
                }),
            }
        }
        runs
    }

    /// The changes since the last seal are durable: fold them into the
    /// durable copy.
    pub fn seal(&mut self) {
        let changes = std::mem::take(&mut self.changes);
        // Changes come in address order, so neighbours share a count
        // block: mark each one dirty once.
        let mut last_dirty = None;
        for (addr, extra) in changes {
            self.set_durable_count(addr, extra);
            let first = self.count_block_first(addr);
            if last_dirty != Some(first) {
                self.dirty_count_blocks.insert(first);
                last_dirty = Some(first);
            }
        }
    }

    fn set_durable(&mut self, addr: u64, extra: u32) {
        self.set_durable_count(addr, extra);
        let first = self.count_block_first(addr);
        self.dirty_count_blocks.insert(first);
    }

    fn set_durable_count(&mut self, addr: u64, extra: u32) {
        if extra == 0 {
            self.durable.remove(&addr);
        } else {
            self.durable.insert(addr, extra);
        }
    }

    /// Applies a replayed transaction's runs to the durable copy. A run
    /// outside the store or on a group's own blocks is damage.
    pub fn replay(&mut self, runs: &[ShareRun], store_end: u64) -> Result<()> {
        for run in runs {
            let end = run.first.0.saturating_add(u64::from(run.count));
            if run.first.0 < self.data_start || end > store_end {
                return Err(Error::corrupt(format!(
                    "a journal share-count run covers blocks {}..{end}, outside the store",
                    run.first.0
                )));
            }
            for addr in run.first.0..end {
                if self.is_group_header(addr) {
                    return Err(Error::corrupt(format!(
                        "a journal share-count run counts block {addr}, a group's own block"
                    )));
                }
                self.set_durable(addr, run.extra);
            }
        }
        Ok(())
    }

    /// After replay, the live counts start from the durable ones.
    pub fn finish_replay(&mut self) {
        self.live = self.durable.clone();
    }

    fn is_group_header(&self, addr: u64) -> bool {
        (addr - self.data_start) % self.group_blocks < GROUP_HEADER_BLOCKS
    }

    /// First block covered by the count block that holds `addr`'s count.
    fn count_block_first(&self, addr: u64) -> u64 {
        let group_start = addr - (addr - self.data_start) % self.group_blocks;
        let slot = addr - group_start;
        group_start + slot / self.counts_per_block * self.counts_per_block
    }

    /// Where the count block covering blocks from `first` lives, and which
    /// of its group's count blocks it is.
    pub fn count_block_home(&self, first: u64) -> (u64, BlockAddr, u32) {
        let group = (first - self.data_start) / self.group_blocks;
        let group_start = self.data_start + group * self.group_blocks;
        let k = (first - group_start) / self.counts_per_block;
        assert!(k < SHARE_BLOCKS_PER_GROUP);
        (group, BlockAddr(group_start + 1 + k), k as u32)
    }

    /// One past the last block of the group that holds `addr`.
    fn group_end(&self, addr: u64) -> u64 {
        addr - (addr - self.data_start) % self.group_blocks + self.group_blocks
    }

    /// How many of the counts in the count block covering blocks from
    /// `first` belong to its group. The last count block of a group covers
    /// slots past the group's end; those blocks are counted by the next
    /// group's first count block, so here they are written as zeros and
    /// ignored when read (older pools may hold stale counts there).
    fn counts_in_group(&self, first: u64) -> usize {
        (self.group_end(first) - first).min(self.counts_per_block) as usize
    }

    /// Loads the counts of one count block read at open, as durable ones;
    /// `finish_load` then starts the live counts from them.
    pub fn load(&mut self, first: u64, counts: &[u32]) {
        let in_group = self.counts_in_group(first);
        for (i, &extra) in counts.iter().enumerate().take(in_group) {
            if extra != 0 {
                self.durable.insert(first + i as u64, extra);
            }
        }
    }

    /// After loading, the live counts start from the durable ones: one copy
    /// of the table rather than a second insert per shared block (a pool
    /// whose snapshots share a million blocks opens that much faster).
    pub fn finish_load(&mut self) {
        self.live = self.durable.clone();
    }

    /// First covered block of count block `k` of group `group`.
    pub fn count_block_first_of(&self, group: u64, k: u64) -> u64 {
        self.data_start + group * self.group_blocks + k * self.counts_per_block
    }

    /// Count blocks to write at checkpoint: (first covered block, home,
    /// group, index in group, encoded block), from the durable counts.
    pub fn dirty_count_blocks(&self, block_size_bytes: u32) -> Vec<DirtyCountBlock> {
        self.dirty_count_blocks
            .iter()
            .map(|&first| {
                let mut counts = vec![0u32; self.counts_per_block as usize];
                let in_group = self.counts_in_group(first);
                for (i, count) in counts.iter_mut().enumerate().take(in_group) {
                    *count = self.durable.get(&(first + i as u64)).copied().unwrap_or(0);
                }
                let mut block = vec![0u8; block_size_bytes as usize];
                shares::encode(BlockAddr(first), &counts, &mut block);
                let (group, home, index) = self.count_block_home(first);
                DirtyCountBlock {
                    home,
                    group,
                    index,
                    block,
                }
            })
            .collect()
    }

    pub fn mark_count_blocks_clean(&mut self) {
        self.dirty_count_blocks.clear();
    }

    pub fn has_dirty_count_blocks(&self) -> bool {
        !self.dirty_count_blocks.is_empty()
    }
}

/// A count block a checkpoint must write.
pub struct DirtyCountBlock {
    pub home: BlockAddr,
    pub group: u64,
    /// Which of the group's count blocks (0..SHARE_BLOCKS_PER_GROUP).
    pub index: u32,
    pub block: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::group::group_blocks;
    use crate::format::shares::counts_per_block;

    const BLOCK_BYTES: u32 = 4096;
    const DATA_START: u64 = 100;

    fn shares() -> Shares {
        Shares::new(
            BlockAddr(DATA_START),
            group_blocks(BLOCK_BYTES),
            BLOCK_BYTES,
        )
    }

    /// The last count block of a group covers slots past the group's end,
    /// which the next group's first count block counts. A stale count
    /// there used to be loaded over the right one: rolling snapshots
    /// reopened by every CLI call leaked whole leaves.
    #[test]
    fn the_last_count_block_of_a_group_counts_only_its_own_group() {
        let mut shares = shares();
        let group_end = DATA_START + group_blocks(BLOCK_BYTES);
        let last_first = shares.count_block_first_of(0, SHARE_BLOCKS_PER_GROUP - 1);
        let per_block = counts_per_block(BLOCK_BYTES);
        assert!(
            last_first + per_block > group_end,
            "the overlap this test is about"
        );

        shares.load(last_first, &vec![5; per_block as usize]);
        shares.finish_load();
        for addr in last_first..last_first + per_block {
            let expected = if addr < group_end { 5 } else { 0 };
            assert_eq!(shares.extra(BlockAddr(addr)), expected, "block {addr}");
        }

        // Written back, the slots past the group are zeros, whatever the
        // next group's counts are.
        let past_end = BlockAddr(group_end + crate::format::group::GROUP_HEADER_BLOCKS + 1);
        shares.increment(past_end).unwrap();
        shares.seal();
        shares.mark_count_block_dirty(last_first);
        let written = shares.dirty_count_blocks(BLOCK_BYTES);
        let last = written
            .iter()
            .find(|b| b.group == 0 && u64::from(b.index) == SHARE_BLOCKS_PER_GROUP - 1)
            .expect("the last count block of group 0 is dirty");
        let counts = crate::format::shares::decode(BlockAddr(last_first), &last.block).unwrap();
        let in_group = (group_end - last_first) as usize;
        assert!(counts[..in_group].iter().all(|&c| c == 5));
        assert!(counts[in_group..].iter().all(|&c| c == 0));
        let next = written
            .iter()
            .find(|b| b.group == 1 && b.index == 0)
            .unwrap();
        let counts = crate::format::shares::decode(BlockAddr(group_end), &next.block).unwrap();
        assert_eq!(counts[(past_end.0 - group_end) as usize], 1);
    }
}
