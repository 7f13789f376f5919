//! Exact sharing: the extra reference count of every block (see
//! `format/shares.rs`). Kept like the allocation maps: a live copy with
//! every change, a durable copy with what sealed transactions did, and the
//! changes since the last seal, which ride in the next journal descriptor
//! as runs. Checkpoints write the count blocks from the durable copy.
//!
//! Only chunks of neighbouring blocks with extra references are kept in
//! memory, so a pool whose blocks are mostly unshared costs almost nothing
//! here. A chunk costs about 9 bytes a block when its blocks are all
//! shared (a leaf's children usually are) and 140 bytes when only one is.

use std::collections::{BTreeSet, HashMap};

use crate::types::AddrMap;

use crate::error::{Error, Result};
use crate::format::group::GROUP_HEADER_BLOCKS;
use crate::format::journal::ShareRun;
use crate::format::shares::{self, SHARE_BLOCKS_PER_GROUP};
use crate::types::BlockAddr;

/// Most extra references one block may have: far beyond any snapshot count
/// the generation counter allows, and checked rather than wrapped.
pub const EXTRA_REFERENCES_MAX: u32 = u32::MAX - 1;

/// Neighbouring blocks whose counts are kept together. A snapshot's first
/// write into a shared leaf counts a reference for each of its hundreds of
/// children, which usually sit side by side: one map lookup then serves a
/// run of them instead of one each.
const CHUNK_BLOCKS: u64 = 16;

/// The counts of `CHUNK_BLOCKS` neighbouring blocks, now and as of the last
/// sealed transaction, with the ones that changed in between marked.
#[derive(Clone, Default)]
struct Chunk {
    now: [u32; CHUNK_BLOCKS as usize],
    durable: [u32; CHUNK_BLOCKS as usize],
    /// Bit i: block i's count changed since the last seal.
    changed: u16,
}

impl Chunk {
    /// Block `i`'s live count if it changed since the last seal; None
    /// also for an `i` outside the chunk.
    fn changed_count(&self, i: usize) -> Option<u32> {
        (i < CHUNK_BLOCKS as usize && self.changed & (1 << i) != 0).then(|| self.now[i])
    }

    fn is_empty(&self) -> bool {
        self.now.iter().chain(&self.durable).all(|&n| n == 0)
    }
}

/// 1 if two neighbouring changed blocks fall in one share run.
fn joins(left: Option<u32>, right: Option<u32>) -> usize {
    usize::from(left.is_some() && left == right)
}

fn chunk_of(addr: u64) -> (u64, usize) {
    (addr / CHUNK_BLOCKS, (addr % CHUNK_BLOCKS) as usize)
}

pub struct Shares {
    data_start: u64,
    group_blocks: u64,
    counts_per_block: u64,
    /// Every chunk holding a block with extra references now or as of the
    /// last seal, by chunk number (`addr / CHUNK_BLOCKS`).
    chunks: AddrMap<u64, Chunk>,
    /// Chunks with a count changed since the last seal, each once, in the
    /// order they first changed.
    changed_chunks: Vec<u64>,
    /// Blocks whose count changed since the last seal.
    changed_blocks: usize,
    /// Pairs of neighbouring changed blocks with the same live count: the
    /// changes make `changed_blocks - run_links` share runs.
    run_links: usize,
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
            chunks: AddrMap::default(),
            changed_chunks: Vec::new(),
            changed_blocks: 0,
            run_links: 0,
            dirty_count_blocks: BTreeSet::new(),
        }
    }

    /// Extra references of `addr`: 0 for a block only one entry points at.
    pub fn extra(&self, addr: BlockAddr) -> u32 {
        let (chunk, i) = chunk_of(addr.0);
        self.chunks.get(&chunk).map_or(0, |c| c.now[i])
    }

    /// Extra references of `addr` as of the last sealed transaction.
    fn durable_extra(&self, addr: u64) -> u32 {
        let (chunk, i) = chunk_of(addr);
        self.chunks.get(&chunk).map_or(0, |c| c.durable[i])
    }

    /// True if more than one entry or record points at `addr`.
    pub fn is_shared(&self, addr: BlockAddr) -> bool {
        self.extra(addr) > 0
    }

    /// One more entry points at `addr`.
    /// Returns the count before and after.
    pub fn increment(&mut self, addr: BlockAddr) -> Result<(u32, u32)> {
        let before = self.extra(addr);
        if before >= EXTRA_REFERENCES_MAX {
            return Err(Error::corrupt(format!(
                "{addr} already has {before} extra references"
            )));
        }
        self.set(addr, before + 1);
        debug_assert_eq!(self.extra(addr), before + 1, "{addr}: count");
        Ok((before, before + 1))
    }

    /// One entry that pointed at `addr` is gone; `addr` must have been shared.
    pub fn decrement(&mut self, addr: BlockAddr) {
        let extra = self.extra(addr);
        assert!(extra > 0, "{addr} is not shared");
        self.set(addr, extra - 1);
    }

    /// Sets the live count, marking it changed for the next seal. A chunk
    /// whose counts all fall to zero stays until the seal, which still
    /// needs its durable counts.
    fn set(&mut self, addr: BlockAddr, extra: u32) {
        let (chunk_no, i) = chunk_of(addr.0);
        let last = CHUNK_BLOCKS as usize - 1;
        // Neighbours in other chunks are looked up only at a chunk's edges.
        let left_outside =
            (i == 0).then(|| addr.0.checked_sub(1).and_then(|a| self.changed_count(a)));
        let right_outside = (i == last).then(|| self.changed_count(addr.0 + 1));
        let chunk = self.chunks.entry(chunk_no).or_default();
        let left = left_outside.unwrap_or_else(|| chunk.changed_count(i.wrapping_sub(1)));
        let right = right_outside.unwrap_or_else(|| chunk.changed_count(i + 1));
        let was = chunk.changed_count(i);
        if chunk.changed == 0 {
            self.changed_chunks.push(chunk_no);
        }
        let bit = 1u16 << i;
        if chunk.changed & bit == 0 {
            chunk.changed |= bit;
            self.changed_blocks += 1;
        }
        chunk.now[i] = extra;
        let is = Some(extra);
        self.run_links = self.run_links + joins(left, is) + joins(is, right)
            - joins(left, was)
            - joins(was, right);
        debug_assert_eq!(self.changed_count(addr.0), Some(extra), "{addr}: count");
        debug_assert!(self.run_links < self.changed_blocks, "runs counted");
    }

    /// The live count of `addr` if it changed since the last seal.
    fn changed_count(&self, addr: u64) -> Option<u32> {
        let (chunk_no, i) = chunk_of(addr);
        self.chunks.get(&chunk_no)?.changed_count(i)
    }

    /// Runs the changes since the last seal make in a journal descriptor
    /// (neighbours with the same count share one): what a commit's size
    /// is estimated from.
    pub fn run_count(&self) -> usize {
        self.changed_blocks - self.run_links
    }

    /// Sets a block's count outright (check --repair).
    pub fn set_exact(&mut self, addr: BlockAddr, extra: u32) {
        assert!(
            extra <= EXTRA_REFERENCES_MAX,
            "{addr}: {extra} extra references"
        );
        self.set(addr, extra);
        debug_assert_eq!(self.extra(addr), extra);
    }

    /// Replaces every count with `extra` (rebuilt from the trees), live and
    /// durable alike, and marks every count block that held or now holds a
    /// count for the next checkpoint. Counts already on their way to the
    /// journal are overwritten too: the trees are the truth.
    pub fn rebuild(&mut self, extra: HashMap<u64, u32>) {
        let mut touched: BTreeSet<u64> = BTreeSet::new();
        let held = self.blocks_where(|c, i| c.durable[i] > 0 || c.now[i] > 0);
        for addr in held.chain(extra.keys().copied()) {
            touched.insert(self.count_block_first(addr));
        }
        self.chunks.clear();
        self.changed_chunks.clear();
        self.changed_blocks = 0;
        self.run_links = 0;
        for (&addr, &n) in &extra {
            if n > 0 {
                self.set_both(addr, n);
            }
        }
        self.dirty_count_blocks.extend(touched);
        debug_assert_eq!(self.changed_blocks, 0);
        debug_assert!(extra
            .iter()
            .all(|(&addr, &n)| self.extra(BlockAddr(addr)) == n));
    }

    /// Sets a block's live and durable count alike (loading, replay, rebuild).
    fn set_both(&mut self, addr: u64, extra: u32) {
        let (chunk_no, i) = chunk_of(addr);
        debug_assert!(
            self.chunks.get(&chunk_no).is_none_or(|c| c.changed == 0),
            "block {addr}: a count changed since the last seal is overwritten"
        );
        let chunk = self.chunks.entry(chunk_no).or_default();
        chunk.now[i] = extra;
        chunk.durable[i] = extra;
        if extra == 0 && chunk.is_empty() {
            self.chunks.remove(&chunk_no);
        }
    }

    /// Every block in a chunk for which `wanted` holds, in no order.
    fn blocks_where<'a>(
        &'a self,
        wanted: impl Fn(&Chunk, usize) -> bool + Copy + 'a,
    ) -> impl Iterator<Item = u64> + 'a {
        self.chunks.iter().flat_map(move |(&chunk_no, chunk)| {
            (0..CHUNK_BLOCKS as usize)
                .filter(move |&i| wanted(chunk, i))
                .map(move |i| chunk_no * CHUNK_BLOCKS + i as u64)
        })
    }

    /// Marks the count block covering blocks from `first` for rewriting.
    pub fn mark_count_block_dirty(&mut self, first: u64) {
        assert_eq!(
            self.count_block_first(first),
            first,
            "not a count block's first block"
        );
        self.dirty_count_blocks.insert(first);
    }

    /// Blocks with extra references now, in no order (for `check`).
    pub fn shared_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.blocks_where(|c, i| c.now[i] > 0)
    }

    /// Blocks whose count changed since the last seal.
    pub fn change_count(&self) -> usize {
        self.changed_blocks
    }

    /// The changed blocks since the last seal with their counts now, in
    /// address order.
    fn changes(&mut self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.changed_chunks.sort_unstable();
        // `set` lists a chunk once, when its first count changes.
        debug_assert!(self.changed_chunks.windows(2).all(|w| w[0] < w[1]));
        let chunks = &self.chunks;
        self.changed_chunks.iter().flat_map(move |chunk_no| {
            let chunk = &chunks[chunk_no];
            (0..CHUNK_BLOCKS as usize)
                .filter(move |&i| chunk.changed & (1 << i) != 0)
                .map(move |i| (chunk_no * CHUNK_BLOCKS + i as u64, chunk.now[i]))
        })
    }

    /// The changes since the last seal as runs of neighbours with the same count.
    pub fn pending_runs(&mut self) -> Vec<ShareRun> {
        let mut runs: Vec<ShareRun> = Vec::new();
        for (addr, extra) in self.changes() {
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
        debug_assert_eq!(
            runs.len(),
            self.run_count(),
            "share runs counted as they changed"
        );
        runs
    }

    /// The changes since the last seal are durable: fold them into the
    /// durable counts.
    pub fn seal(&mut self) {
        // Changes come in address order, so neighbours share a count
        // block: mark each one dirty once.
        let changed: Vec<u64> = self.changes().map(|(addr, _)| addr).collect();
        let mut last_dirty = None;
        for addr in changed {
            let first = self.count_block_first(addr);
            if last_dirty != Some(first) {
                self.dirty_count_blocks.insert(first);
                last_dirty = Some(first);
            }
        }
        for chunk_no in std::mem::take(&mut self.changed_chunks) {
            let chunk = self.chunks.get_mut(&chunk_no).expect("a changed chunk");
            assert!(chunk.changed != 0, "chunk {chunk_no} listed but unchanged");
            chunk.durable = chunk.now;
            chunk.changed = 0;
            if chunk.is_empty() {
                self.chunks.remove(&chunk_no);
            }
        }
        self.changed_blocks = 0;
        self.run_links = 0;
    }

    /// Applies a replayed transaction's runs to the durable counts (and the
    /// live ones with them: nothing changes a count before replay ends). A
    /// run outside the store or on a group's own blocks is damage.
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
                self.set_both(addr, run.extra);
                let first = self.count_block_first(addr);
                self.dirty_count_blocks.insert(first);
                debug_assert_eq!(self.extra(BlockAddr(addr)), run.extra);
            }
        }
        debug_assert_eq!(self.changed_blocks, 0, "replay changes nothing live");
        Ok(())
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

    /// Loads the counts of one count block read at open, as live and
    /// durable ones.
    pub fn load(&mut self, first: u64, counts: &[u32]) {
        assert_eq!(
            self.count_block_first(first),
            first,
            "not a count block's first block"
        );
        let in_group = self.counts_in_group(first);
        for (i, &extra) in counts.iter().enumerate().take(in_group) {
            if extra != 0 {
                self.set_both(first + i as u64, extra);
                debug_assert_eq!(self.extra(BlockAddr(first + i as u64)), extra);
            }
        }
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
                    *count = self.durable_extra(first + i as u64);
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
        debug_assert!(!self.has_dirty_count_blocks());
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

    /// Changes made in any order come out as runs in address order, across
    /// chunk boundaries; a count that went up and back down in one
    /// transaction is still recorded (its durable count may differ); only
    /// the seal moves counts into what checkpoints write.
    #[test]
    fn changes_seal_in_address_order_and_checkpoints_see_only_sealed_counts() {
        let mut shares = shares();
        let first = DATA_START + 10 * CHUNK_BLOCKS - 3;
        for addr in (first..first + 40).rev() {
            shares.increment(BlockAddr(addr)).unwrap();
        }
        shares.increment(BlockAddr(first + 100)).unwrap();
        shares.decrement(BlockAddr(first + 100));
        assert_eq!(shares.change_count(), 41);
        assert_eq!(shares.run_count(), 2);
        let runs = shares.pending_runs();
        assert_eq!(runs.len(), 2, "{runs:?}");
        assert_eq!(
            (runs[0].first.0, runs[0].count, runs[0].extra),
            (first, 40, 1)
        );
        assert_eq!(
            (runs[1].first.0, runs[1].count, runs[1].extra),
            (first + 100, 1, 0)
        );
        shares.seal();
        assert_eq!(shares.change_count(), 0);
        assert!(shares.pending_runs().is_empty());
        assert!(!shares.is_shared(BlockAddr(first + 100)));

        // Changed again but not sealed: the count block still says 1.
        shares.increment(BlockAddr(first)).unwrap();
        assert_eq!(shares.extra(BlockAddr(first)), 2);
        let count_block_first = shares.count_block_first(first);
        let written = shares.dirty_count_blocks(BLOCK_BYTES);
        let block = written
            .iter()
            .find(|b| shares.count_block_first_of(b.group, u64::from(b.index)) == count_block_first)
            .expect("the sealed change dirtied its count block");
        let counts =
            crate::format::shares::decode(BlockAddr(count_block_first), &block.block).unwrap();
        assert_eq!(counts[(first - count_block_first) as usize], 1);

        // Back to no extra reference: sealed, the chunk is gone.
        shares.decrement(BlockAddr(first));
        shares.seal();
        for addr in first..first + 40 {
            shares.decrement(BlockAddr(addr));
        }
        shares.seal();
        assert_eq!(shares.shared_blocks().count(), 0);
        assert!(
            shares.chunks.is_empty(),
            "empty chunks are dropped at the seal"
        );
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
