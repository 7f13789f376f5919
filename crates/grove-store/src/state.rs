//! The engine's in-memory state: the node cache, the volume table, commit,
//! checkpoint and replay. The operations on trees and volumes live beside
//! it (`tree.rs`, `volumes.rs`, `reclaim.rs`, `diff.rs`, `accounting.rs`).
//! Everything here runs under the pool's state lock; `pool.rs` holds the
//! public API and the locking.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::alloc::{Allocator, BlockUse};
use crate::cache::NodeCache;
use crate::device::BlockDevice;
use crate::error::{Error, ErrorKind, Result};
use crate::format::journal::{AllocChange, AllocExtent, Descriptor, Roots, ShareRun};
use crate::format::node::{Entry, Node, NodeKind, ENTRY_BYTES, NODE_LEVELS_MAX};
use crate::format::record::{VolumeRecord, RECORD_BYTES};
use crate::format::shares::SHARE_BLOCKS_PER_GROUP;
use crate::format::superblock::{Superblock, SUPERBLOCK_LEN};
use crate::journal::Journal;
use crate::shares::Shares;
use crate::types::{BlockAddr, VolumeId};

/// Shape of the radix trees for one block size.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub block_size_bytes: u32,
    /// Entries per node: block size / 8 (512 at 4 KiB).
    pub entries_per_node: usize,
    /// log2(entries_per_node): bits of a block index consumed per level.
    pub bits_per_level: u32,
    /// Volume records per record block.
    pub records_per_block: u64,
}

impl Geometry {
    pub fn new(block_size_bytes: u32) -> Geometry {
        let entries_per_node = block_size_bytes as usize / ENTRY_BYTES;
        Geometry {
            block_size_bytes,
            entries_per_node,
            bits_per_level: entries_per_node.trailing_zeros(),
            records_per_block: (block_size_bytes as usize / RECORD_BYTES) as u64,
        }
    }

    pub fn block_bytes(&self) -> u64 {
        u64::from(self.block_size_bytes)
    }

    /// Blocks needed to hold `size_bytes` (the last one may be partial).
    pub fn blocks_for(&self, size_bytes: u64) -> u64 {
        size_bytes.div_ceil(self.block_bytes())
    }

    /// Fewest levels whose leaves can address `blocks` blocks (at least 1).
    pub fn height_for(&self, blocks: u64) -> u8 {
        let mut height = 1u8;
        while self.capacity_blocks(height) < blocks {
            height += 1;
        }
        assert!(height < NODE_LEVELS_MAX);
        height
    }

    /// Blocks addressable by a tree of `height` levels (saturating).
    pub fn capacity_blocks(&self, height: u8) -> u64 {
        let bits = self.bits_per_level * u32::from(height);
        if bits >= 64 {
            u64::MAX
        } else {
            1u64 << bits
        }
    }

    /// Blocks covered by one entry of a node at `level`.
    pub fn span_blocks(&self, level: u8) -> u64 {
        self.capacity_blocks(level)
    }

    /// Which entry of a level-`level` node leads toward `index`.
    pub fn slot(&self, index: u64, level: u8) -> usize {
        let shift = self.bits_per_level * u32::from(level);
        if shift >= 64 {
            return 0;
        }
        ((index >> shift) as usize) & (self.entries_per_node - 1)
    }
}

pub struct State {
    pub device: Arc<dyn BlockDevice>,
    pub geometry: Geometry,
    pub superblock: Superblock,
    pub alloc: Allocator,
    /// Extra reference counts: exact sharing.
    pub shares: Shares,
    /// Decoded nodes, clean and dirty, bounded (ESnap).
    cache: NodeCache,
    /// Live volumes.
    pub volumes: BTreeMap<VolumeId, VolumeRecord>,
    /// Removed volumes whose record is still needed: a tree the reclaimer
    /// has not given back yet, children's lineage, or a bookmark.
    pub removed: BTreeMap<VolumeId, VolumeRecord>,
    /// Children of every record, live or removed, by parent id.
    pub children: HashMap<VolumeId, BTreeSet<VolumeId>>,
    pub names: HashMap<String, VolumeId>,
    /// Record blocks of the volume table by block index, as stored.
    record_blocks: HashMap<u64, Vec<u8>>,
    pub(crate) dirty_records: BTreeSet<VolumeId>,
    /// Why the pool stopped taking changes: a commit failed, so what is
    /// in memory may no longer match anything durable. Reads go on.
    pub failed: Option<String>,
    /// Count blocks that could not be decoded at open (torn by a crash
    /// during a checkpoint); the counts are rebuilt from the trees.
    share_counts_damaged: Vec<(u64, String)>,
    /// Blocks freed by commits made in the middle of a repair.
    deferred_frees: Vec<BlockAddr>,
    /// Data was written since the last device flush.
    /// Data was written since the last device flush. Shared with writers
    /// that write in place outside the state lock: they set it after their
    /// write lands, and a commit clears it before it flushes, so a write that
    /// lands during a commit is flushed by the next one.
    pub data_dirty: Arc<AtomicBool>,
    /// Radix nodes visited by lookups, for the depth-independence test.
    pub node_visits: u64,
    journal: Journal,
    /// The roots as of the last durable transaction: what a checkpoint
    /// writes into the superblock.
    committed_roots: Roots,
    /// What opening the pool found wrong but could work around (a damaged
    /// superblock slot); `check` reports it.
    pub open_warnings: Vec<String>,
    /// Journaled metadata whose write to its home failed; the checkpoint
    /// writes it before it lets the journal forget the transaction.
    unwritten_homes: BTreeMap<BlockAddr, Vec<u8>>,
    /// A prepared commit whose I/O may be running without the state lock.
    commit_in_flight: Option<InFlightCommit>,
    /// Moves whenever a metadata block may change on disk or be freed: a
    /// node read without the state lock is cached only if it has not
    /// moved since the read began (see `Pool`'s prefetch).
    metadata_epoch: std::sync::atomic::AtomicU64,
}

/// What [`State::prepare_commit`] leaves for the pool to do.
pub(crate) enum PreparedCommit {
    /// Nothing to write, or written already: the blocks freed.
    Done(Vec<BlockAddr>),
    /// I/O to run (without the state lock if the caller likes), then
    /// [`State::finish_commit`].
    Io(CommitIo),
}

/// What a prepared commit still needs once its I/O is done.
#[derive(Default)]
struct InFlightCommit {
    /// Homes of the transaction's images, in order.
    homes: Vec<BlockAddr>,
    roots: Roots,
    /// Free extents that did not fit in the transaction.
    trailing_frees: Vec<AllocExtent>,
    /// Blocks to make reusable once the transaction is durable.
    frees: Vec<BlockAddr>,
}

/// The I/O of a prepared commit, which needs no state: the data flush
/// (ordered mode: data before the transaction that maps it), the
/// transaction and its flush, then the images written to their homes.
pub(crate) struct CommitIo {
    device: Arc<dyn BlockDevice>,
    block_bytes: usize,
    flush_data: bool,
    /// The reserved transaction: byte offset, then descriptor and images.
    transaction: Option<(u64, Vec<u8>)>,
    homes: Vec<BlockAddr>,
}

/// How a commit's I/O went.
pub(crate) struct CommitIoOutcome {
    result: Result<()>,
    /// The journal write was tried (its sequence is then used up).
    journal_attempted: bool,
    homes_written: Vec<BlockAddr>,
}

impl CommitIo {
    pub(crate) fn run(self) -> CommitIoOutcome {
        let mut outcome = CommitIoOutcome {
            result: Ok(()),
            journal_attempted: false,
            homes_written: Vec::new(),
        };
        if self.flush_data {
            outcome.result = self.device.flush().map_err(|e| {
                Error::io(
                    format!("cannot flush data to {}", self.device.describe()),
                    e,
                )
            });
            if outcome.result.is_err() {
                return outcome;
            }
        }
        let Some((offset, bytes)) = &self.transaction else {
            return outcome;
        };
        outcome.journal_attempted = true;
        outcome.result = crate::journal::write_transaction(self.device.as_ref(), *offset, bytes);
        if outcome.result.is_err() {
            return outcome;
        }
        // The images follow the descriptor blocks at the end of the bytes.
        let images_at = bytes.len() - self.homes.len() * self.block_bytes;
        for (i, home) in self.homes.iter().enumerate() {
            let image = &bytes[images_at + i * self.block_bytes..][..self.block_bytes];
            let at = home.0 * self.block_bytes as u64;
            if self.device.write_at(image, at).is_ok() {
                outcome.homes_written.push(*home);
            }
        }
        outcome
    }

    /// The data of a commit that failed before its I/O ran.
    pub(crate) fn failed(error: Error) -> CommitIoOutcome {
        CommitIoOutcome {
            result: Err(error),
            journal_attempted: false,
            homes_written: Vec::new(),
        }
    }
}

impl State {
    pub fn new(device: Arc<dyn BlockDevice>, superblock: Superblock, alloc: Allocator) -> State {
        let journal = Journal::new(
            superblock.journal_start,
            superblock.journal_blocks,
            superblock.block_size_bytes,
            superblock.journal_head,
            superblock.journal_sequence,
        );
        let committed_roots = Roots {
            volume_table_root: superblock.volume_table_root,
            volume_table_height: superblock.volume_table_height,
            next_volume_id: superblock.next_volume_id,
            group_count: superblock.group_count,
            birth_generation: superblock.birth_generation,
        };
        let geometry = Geometry::new(superblock.block_size_bytes);
        State {
            shares: Shares::new(
                superblock.data_start,
                superblock.group_blocks,
                superblock.block_size_bytes,
            ),
            removed: BTreeMap::new(),
            children: HashMap::new(),
            failed: None,
            share_counts_damaged: Vec::new(),
            deferred_frees: Vec::new(),
            journal,
            committed_roots,
            unwritten_homes: BTreeMap::new(),
            commit_in_flight: None,
            metadata_epoch: std::sync::atomic::AtomicU64::new(0),
            open_warnings: Vec::new(),
            device,
            geometry,
            superblock,
            alloc,
            cache: NodeCache::new(NodeCache::nodes_for(
                crate::cache::CACHE_SIZE_DEFAULT_BYTES,
                geometry.block_bytes(),
            )),
            volumes: BTreeMap::new(),
            names: HashMap::new(),
            record_blocks: HashMap::new(),
            dirty_records: BTreeSet::new(),
            data_dirty: Arc::new(AtomicBool::new(false)),
            node_visits: 0,
        }
    }

    // ----- device access -----

    fn block_offset(&self, addr: BlockAddr) -> u64 {
        addr.0 * self.geometry.block_bytes()
    }

    pub(crate) fn read_block(&self, addr: BlockAddr, buf: &mut [u8], what: &str) -> Result<()> {
        self.device
            .read_at(buf, self.block_offset(addr))
            .map_err(|e| {
                Error::io(
                    format!("cannot read {what} at {addr} of {}", self.device.describe()),
                    e,
                )
            })
    }

    /// Writes `data` into block `addr` at `offset_in_block`.
    pub(crate) fn write_device_block_at(
        &self,
        addr: BlockAddr,
        offset_in_block: usize,
        data: &[u8],
    ) -> Result<()> {
        let offset = self.block_offset(addr) + offset_in_block as u64;
        self.device.write_at(data, offset).map_err(|e| {
            Error::io(
                format!("cannot write data at {addr} of {}", self.device.describe()),
                e,
            )
        })
    }

    fn write_device_block(&self, addr: BlockAddr, buf: &[u8], what: &str) -> Result<()> {
        self.metadata_changed();
        self.device
            .write_at(buf, self.block_offset(addr))
            .map_err(|e| {
                Error::io(
                    format!(
                        "cannot write {what} at {addr} of {}",
                        self.device.describe()
                    ),
                    e,
                )
            })
    }

    // ----- node cache -----

    pub(crate) fn metadata_epoch(&self) -> u64 {
        self.metadata_epoch.load(Ordering::Acquire)
    }

    fn metadata_changed(&self) {
        self.metadata_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The first node on the path to `index` that a lookup would have to
    /// read from the device (neither cached nor an image in memory), with
    /// its level; None if the lookup needs no device read.
    pub(crate) fn first_uncached_node(
        &self,
        root: BlockAddr,
        height: u8,
        kind: NodeKind,
        index: u64,
    ) -> Option<(BlockAddr, u8)> {
        let mut addr = root;
        for level in (0..height).rev() {
            let Some(node) = self.cache.peek(addr) else {
                return (!self.unwritten_homes.contains_key(&addr)).then_some((addr, level));
            };
            if node.kind != kind || node.level != level {
                return None; // damage: the lookup under the lock reports it
            }
            let entry = node.entries[self.geometry.slot(index, level)];
            if level == 0 || entry.is_empty() {
                return None;
            }
            addr = entry.addr();
        }
        None
    }

    /// Caches a node whose block was read without the state lock, if no
    /// metadata changed since `epoch` (when the read began) and it decodes;
    /// otherwise the lookup reads it again under the lock. True if cached.
    pub(crate) fn cache_prefetched(
        &mut self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
        block: &[u8],
        epoch: u64,
    ) -> bool {
        if self.metadata_epoch() != epoch || self.cache.contains(addr) {
            return false;
        }
        match self.decode_node(addr, kind, level, block) {
            Ok(node) if Self::check_shape(&node, addr, kind, level).is_ok() => {
                self.cache.insert(addr, node, false);
                true
            }
            _ => false,
        }
    }

    /// Reads and verifies the node at `addr` from the device (or from a
    /// journaled image whose write home failed: the disk is older).
    fn read_node(&self, addr: BlockAddr, kind: NodeKind, level: u8) -> Result<Node> {
        let mut block = vec![0u8; self.geometry.block_size_bytes as usize];
        match self.unwritten_homes.get(&addr) {
            Some(image) => block.copy_from_slice(image),
            None => self.read_block(addr, &mut block, "radix node")?,
        }
        self.decode_node(addr, kind, level, &block)
    }

    fn decode_node(
        &self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
        block: &[u8],
    ) -> Result<Node> {
        let data_start = self.superblock.data_start.0;
        let valid = data_start..self.alloc.store_end();
        let birth_max = self.superblock.birth_generation;
        let node =
            Node::decode(block, addr, kind, level, valid, birth_max).map_err(|e| match kind {
                NodeKind::VolumeTable => Error::corrupt(format!("volume table: {e}")),
                NodeKind::VolumeData => e,
            })?;
        if let Some((slot, _)) = node
            .entries
            .iter()
            .enumerate()
            .find(|(_, e)| !e.is_empty() && self.alloc.is_group_header(e.addr()))
        {
            return Err(Error::corrupt(format!(
                "radix node at {addr} is damaged: entry {slot} points at a group's map or share-count block"
            )));
        }
        Ok(node)
    }

    fn check_shape(node: &Node, addr: BlockAddr, kind: NodeKind, level: u8) -> Result<()> {
        if node.kind != kind || node.level != level {
            return Err(Error::corrupt(format!(
                "radix node at {addr} is damaged: a {:?} level-{} node reached as a {kind:?} level-{level} node",
                node.kind, node.level
            )));
        }
        Ok(())
    }

    /// Loads (and verifies) a node into the cache, for an operation that
    /// may change it or will soon read it again. It stays cached at least
    /// until the operation ends.
    pub(crate) fn load_node(
        &mut self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
    ) -> Result<&Node> {
        if !self.cache.contains(addr) {
            let node = self.read_node(addr, kind, level)?;
            self.cache.insert(addr, node, false);
        }
        let node = self.cache.get(addr).expect("just cached");
        Self::check_shape(node, addr, kind, level)?;
        Ok(node)
    }

    /// A node's entries for walks that only read (check, accounting, diff,
    /// extents, dropping references): the cached copy if there is one (it
    /// may be newer than the disk), else read from the device without
    /// filling the cache, so a walk over a whole pool stays in bounded
    /// memory.
    pub(crate) fn node_entries(
        &mut self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
    ) -> Result<Box<[Entry]>> {
        if let Some(node) = self.cache.peek(addr) {
            Self::check_shape(node, addr, kind, level)?;
            return Ok(node.entries.clone());
        }
        Ok(self.read_node(addr, kind, level)?.entries)
    }

    /// A node's entries for the checker (see `node_entries`).
    pub(crate) fn load_node_for_check(
        &mut self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
    ) -> Result<Box<[Entry]>> {
        self.node_entries(addr, kind, level)
    }

    /// A new operation holds the pool lock: nodes the last one used may be
    /// evicted from now on.
    pub(crate) fn begin_operation(&mut self) {
        self.cache.begin_operation();
    }

    /// Sets how many bytes of decoded nodes the cache keeps.
    pub fn set_cache_size(&mut self, size_bytes: u64) {
        let nodes = NodeCache::nodes_for(size_bytes, self.geometry.block_bytes());
        let mut cache = NodeCache::new(nodes);
        std::mem::swap(&mut cache, &mut self.cache);
        // Dirty nodes move over pinned; clean ones are read again if needed.
        for addr in cache.dirty().clone() {
            if let Some(node) = cache.peek(addr) {
                self.cache.insert(addr, node.clone(), true);
            }
        }
    }

    /// Sets a volume's space accounting (check --repair).
    pub(crate) fn set_accounting(&mut self, id: VolumeId, referenced_blocks: u64) {
        let record = self.volumes.get_mut(&id).expect("volume exists");
        record.referenced_blocks = referenced_blocks;
        self.dirty_records.insert(id);
    }

    /// An entry of a node this operation loaded.
    pub(crate) fn entry(&self, addr: BlockAddr, slot: usize) -> Entry {
        self.cache.entry(addr, slot)
    }

    /// Changes an entry of a node this operation loaded; it is dirty (and
    /// pinned in the cache) until the next commit.
    pub(crate) fn set_entry(&mut self, addr: BlockAddr, slot: usize, entry: Entry) {
        self.cache.set_entry(addr, slot, entry);
    }

    pub(crate) fn insert_new_node(&mut self, node: Node) -> Result<BlockAddr> {
        let addr = self.alloc.allocate(BlockUse::Meta)?;
        self.cache.insert(addr, node, true);
        Ok(addr)
    }

    /// Frees a block and forgets any cached node in it. Only the last
    /// reference may free a block.
    pub(crate) fn free_block(&mut self, addr: BlockAddr) {
        self.metadata_changed();
        debug_assert!(!self.shares.is_shared(addr), "{addr} is still shared");
        self.cache.remove(addr);
        self.alloc.free(addr);
    }

    // ----- the volume table -----

    /// Checks that a root pointer read from disk names a usable block: in
    /// the data area and not an allocation map.
    fn check_root(&self, addr: BlockAddr, what: &str) -> Result<()> {
        let data_start = self.superblock.data_start.0;
        if addr.0 < data_start
            || addr.0 >= self.alloc.store_end()
            || self.alloc.is_group_header(addr)
        {
            return Err(Error::corrupt(format!(
                "{what} points at {addr}, which cannot hold a node"
            )));
        }
        Ok(())
    }

    /// Reads every record of the volume table into memory.
    pub fn load_volume_table(&mut self) -> Result<()> {
        let height = self.superblock.volume_table_height;
        if height == 0 {
            return Ok(());
        }
        if height >= crate::format::node::NODE_LEVELS_MAX {
            return Err(Error::corrupt(format!(
                "the volume table claims {height} levels"
            )));
        }
        self.check_root(self.superblock.volume_table_root, "the volume table root")?;
        let mut leaves = Vec::new();
        self.collect_table_leaves(
            self.superblock.volume_table_root,
            height - 1,
            0,
            &mut leaves,
        )?;
        let per_block = self.geometry.records_per_block;
        for (block_index, addr) in leaves {
            let mut block = vec![0u8; self.geometry.block_size_bytes as usize];
            self.read_block(addr, &mut block, "volume table block")?;
            for slot in 0..per_block {
                let id = VolumeId(block_index * per_block + slot);
                let start = slot as usize * RECORD_BYTES;
                let Some(record) = VolumeRecord::decode(&block[start..start + RECORD_BYTES], id)?
                else {
                    continue;
                };
                if record.removed {
                    self.removed.insert(id, record);
                    continue;
                }
                if self.names.insert(record.name.clone(), id).is_some() {
                    return Err(Error::corrupt(format!(
                        "volume table names {:?} twice",
                        record.name
                    )));
                }
                self.volumes.insert(id, record);
            }
            self.record_blocks.insert(block_index, block);
        }
        for record in self.volumes.values().chain(self.removed.values()) {
            if record.parent != VolumeId::NONE {
                self.children
                    .entry(record.parent)
                    .or_default()
                    .insert(record.id);
            }
        }
        let generation = self.superblock.birth_generation;
        for record in self.volumes.values().chain(self.removed.values()) {
            if record.created_generation > generation
                || record.share_floor_generation > generation
                || record.written_base_generation > generation
            {
                return Err(Error::corrupt(format!(
                    "volume {:?} names a generation after the pool's generation {generation}",
                    record.name
                )));
            }
            if record.root.is_none() {
                continue;
            }
            self.check_root(
                record.root,
                &format!("the root of volume {:?}", record.name),
            )?;
            if record.height
                < self
                    .geometry
                    .height_for(self.geometry.blocks_for(record.size_bytes))
            {
                return Err(Error::corrupt(format!(
                    "volume {:?} has a tree of {} levels, too few for its {} bytes",
                    record.name, record.height, record.size_bytes
                )));
            }
            if record.id.0 >= self.superblock.next_volume_id.0 {
                return Err(Error::corrupt(format!(
                    "volume {:?} has id {} beyond the next id",
                    record.name, record.id.0
                )));
            }
            if record.parent != VolumeId::NONE
                && !self.volumes.contains_key(&record.parent)
                && !self.removed.contains_key(&record.parent)
            {
                return Err(Error::corrupt(format!(
                    "volume {:?} names parent #{}, which does not exist",
                    record.name, record.parent.0
                )));
            }
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
        let span = self.geometry.span_blocks(level);
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
    fn persist_volume_table(&mut self) -> Result<Vec<(BlockAddr, Vec<u8>)>> {
        let per_block = self.geometry.records_per_block;
        let dirty: Vec<VolumeId> = std::mem::take(&mut self.dirty_records)
            .into_iter()
            .collect();
        let mut touched: BTreeMap<u64, BlockAddr> = BTreeMap::new();
        for id in dirty {
            let block_index = id.0 / per_block;
            if let std::collections::btree_map::Entry::Vacant(slot) = touched.entry(block_index) {
                slot.insert(self.table_block_for_write(block_index)?);
            }
            let block_size = self.geometry.block_size_bytes as usize;
            let block = self
                .record_blocks
                .entry(block_index)
                .or_insert_with(|| vec![0u8; block_size]);
            let start = (id.0 % per_block) as usize * RECORD_BYTES;
            match self.volumes.get(&id).or_else(|| self.removed.get(&id)) {
                Some(record) => record.encode(&mut block[start..start + RECORD_BYTES]),
                None => block[start..start + RECORD_BYTES].fill(0),
            }
        }
        // A record block whose every slot is empty is given back, so that
        // a pool that made and removed many volumes does not keep (or read
        // at open) their empty blocks.
        let mut writes = Vec::with_capacity(touched.len());
        for (index, addr) in touched {
            if self.record_blocks[&index].iter().all(|&b| b == 0) {
                self.release_table_block(index, addr)?;
                self.record_blocks.remove(&index);
            } else {
                writes.push((addr, self.record_blocks[&index].clone()));
            }
        }
        Ok(writes)
    }

    /// Unlinks record block `block_index` (at `addr`) from the volume
    /// table and frees it.
    fn release_table_block(&mut self, block_index: u64, addr: BlockAddr) -> Result<()> {
        let (leaf, _) = self.leaf_for_write(
            self.superblock.volume_table_root,
            self.superblock.volume_table_height,
            NodeKind::VolumeTable,
            block_index,
        )?;
        let slot = self.geometry.slot(block_index, 0);
        debug_assert_eq!(self.entry(leaf, slot).addr(), addr);
        self.set_entry(leaf, slot, Entry::EMPTY);
        self.free_block(addr);
        Ok(())
    }

    /// The address of record block `block_index`, allocating it and the
    /// table nodes above it as needed.
    fn table_block_for_write(&mut self, block_index: u64) -> Result<BlockAddr> {
        let entries = self.geometry.entries_per_node;
        if self.superblock.volume_table_height == 0 {
            let root = self.insert_new_node(Node::empty(NodeKind::VolumeTable, 0, entries))?;
            self.superblock.volume_table_root = root;
            self.superblock.volume_table_height = 1;
        }
        while self
            .geometry
            .capacity_blocks(self.superblock.volume_table_height)
            <= block_index
        {
            let level = self.superblock.volume_table_height;
            let mut node = Node::empty(NodeKind::VolumeTable, level, entries);
            node.entries[0] = Entry::new(self.superblock.volume_table_root, 0);
            self.superblock.volume_table_root = self.insert_new_node(node)?;
            self.superblock.volume_table_height += 1;
        }
        let height = self.superblock.volume_table_height;
        let (leaf, _) = self.leaf_for_write(
            self.superblock.volume_table_root,
            height,
            NodeKind::VolumeTable,
            block_index,
        )?;
        let slot = self.geometry.slot(block_index, 0);
        let entry = self.entry(leaf, slot);
        if !entry.is_empty() {
            return Ok(entry.addr());
        }
        let addr = self.alloc.allocate(BlockUse::Meta)?;
        self.set_entry(leaf, slot, Entry::new(addr, 0));
        Ok(addr)
    }

    // ----- commit -----

    pub fn has_changes(&self) -> bool {
        !self.cache.dirty().is_empty()
            || !self.dirty_records.is_empty()
            || self.alloc.has_changes()
            || self.shares.change_count() > 0
            || self.committed_roots.birth_generation != self.superblock.birth_generation
    }

    /// Dirty metadata that the next commit must write; the write path
    /// commits on its own once this passes `auto_commit_blocks`, so that
    /// a transaction always fits in the journal.
    ///
    /// Images count a block each; allocation changes and share-count changes
    /// count what they take in the descriptor (each change one extent or
    /// run at most), so a burst of allocating writes does not commit long
    /// before the journal needs it.
    pub fn pending_commit_blocks(&self) -> u64 {
        let images = self.cache.dirty().len() + self.dirty_records.len();
        let descriptor_bytes = Descriptor::encoded_len(
            images,
            self.alloc.change_count(),
            self.shares.change_count(),
        );
        (images + descriptor_bytes.div_ceil(self.geometry.block_size_bytes as usize)) as u64
    }

    /// Commits in the middle of a repair once the pending changes near what
    /// one transaction may hold. The blocks it frees are kept for the pool
    /// to make reusable (`take_deferred_frees`); a failed commit stops the
    /// pool taking changes, as any failed commit does.
    pub(crate) fn commit_if_large_during_repair(&mut self) -> Result<()> {
        if self.pending_commit_blocks() <= self.auto_commit_blocks() {
            return Ok(());
        }
        match self.commit() {
            Ok(frees) => {
                self.deferred_frees.extend(frees);
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Frees of commits made during a repair, to release after it.
    pub(crate) fn take_deferred_frees(&mut self) -> Vec<BlockAddr> {
        std::mem::take(&mut self.deferred_frees)
    }

    /// Blocks one journal transaction may span.
    pub fn max_transaction_blocks(&self) -> u64 {
        self.journal.max_transaction_blocks()
    }

    /// The pending-commit size past which the write path commits by itself.
    pub fn auto_commit_blocks(&self) -> u64 {
        self.journal.max_transaction_blocks() / 4
    }

    fn flush_device(&self, what: &str) -> Result<()> {
        self.device.flush().map_err(|e| {
            Error::io(
                format!("cannot flush {what} to {}", self.device.describe()),
                e,
            )
        })
    }

    /// Grows the device to span every allocation group, so that the store
    /// never looks truncated to the next open (the groups' blocks may not
    /// all have been written yet).
    fn grow_device_to_store(&self) -> Result<()> {
        let data_start = self.superblock.data_start.0;
        let device_blocks = crate::format::superblock::device_blocks(
            data_start,
            self.alloc.store_end() - data_start,
            self.alloc.capacity_blocks(),
        );
        let store_len = device_blocks * self.geometry.block_bytes();
        let device_len = self
            .device
            .len_bytes()
            .map_err(|e| Error::io(format!("cannot stat {}", self.device.describe()), e))?;
        if device_len < store_len {
            self.device
                .set_len_bytes(store_len)
                .map_err(|e| Error::io(format!("cannot grow {}", self.device.describe()), e))?;
        }
        Ok(())
    }

    /// Makes every change so far durable through the journal, all under
    /// the state lock. Returns the blocks this commit freed; the caller
    /// makes them reusable once no reader can still be using them.
    pub fn commit(&mut self) -> Result<Vec<BlockAddr>> {
        match self.prepare_commit()? {
            PreparedCommit::Done(frees) => Ok(frees),
            PreparedCommit::Io(io) => {
                let outcome = io.run();
                self.finish_commit(outcome)
            }
        }
    }

    /// The first step of a commit: builds the transaction and does the
    /// bookkeeping as if it were durable (dirty nodes clean, allocations
    /// and share counts sealed, the new roots), keeping every image in
    /// `unwritten_homes` so that a node evicted meanwhile reads back
    /// right. Its I/O ([`CommitIo::run`]) may then run without the state
    /// lock; [`State::finish_commit`] ends it. Nothing else commits or
    /// checkpoints in between.
    ///
    /// Order (ordered mode): data first, then the transaction that maps it,
    /// then the metadata blocks at home. Replay redoes the last step.
    pub(crate) fn prepare_commit(&mut self) -> Result<PreparedCommit> {
        assert!(self.commit_in_flight.is_none(), "one commit at a time");
        if cfg!(feature = "unsafe-no-journal") {
            self.flush_device("data")?;
            return self.commit_in_place_unsafely().map(PreparedCommit::Done);
        }
        let flush_data = self.data_dirty.swap(false, Ordering::AcqRel);
        if !flush_data && !self.has_changes() {
            return Ok(PreparedCommit::Done(Vec::new()));
        }
        let dirty_ids = self.dirty_records.clone();
        let prepared = if self.has_changes() {
            self.prepare_transaction().map(|(f, t)| (f, Some(t)))
        } else {
            Ok((InFlightCommit::default(), None))
        };
        let (in_flight, transaction) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                // Nothing was sealed: what was dirty stays dirty, so a retry
                // after the fault clears writes all of it again.
                self.dirty_records.extend(dirty_ids);
                if flush_data {
                    self.data_dirty.store(true, Ordering::Release);
                }
                return Err(e);
            }
        };
        // Its I/O rewrites the homes of the images.
        self.metadata_changed();
        let io = CommitIo {
            device: self.device.clone(),
            block_bytes: self.geometry.block_size_bytes as usize,
            flush_data,
            transaction,
            homes: in_flight.homes.clone(),
        };
        self.commit_in_flight = Some(in_flight);
        Ok(PreparedCommit::Io(io))
    }

    /// Builds the transaction of everything dirty and reserves its place
    /// in the journal; the bookkeeping of a durable commit is done here.
    fn prepare_transaction(&mut self) -> Result<(InFlightCommit, (u64, Vec<u8>))> {
        let writes = self.dirty_images()?;
        self.grow_device_to_store()?;
        let roots = self.current_roots();
        let share_runs = self.shares.pending_runs();
        // Allocations and share counts must be durable with the tree that
        // uses them; frees may trail in later transactions (a crash between
        // leaks blocks, which check --repair and the GC reclaim, and never
        // frees a block still in use).
        let mut extents = self.alloc.pending_extents();
        extents.sort_by_key(|e| e.change == AllocChange::Freed);
        let (homes, images): (Vec<BlockAddr>, Vec<Vec<u8>>) = writes.into_iter().unzip();
        let first_extents = self.extents_that_fit(images.len(), share_runs.len(), &extents);
        let allocations = |extents: &[AllocExtent]| {
            extents
                .iter()
                .filter(|e| e.change != AllocChange::Freed)
                .count()
        };
        if allocations(&extents[..first_extents]) != allocations(&extents) {
            return Err(Error::new(
                ErrorKind::NoSpace,
                "the transaction is larger than the journal can hold; commit more often",
            ));
        }
        let trailing_frees = extents.split_off(first_extents);
        let transaction = self.reserve_transaction(roots, &homes, &images, extents, share_runs)?;
        // From here on, the bookkeeping of a durable transaction.
        self.cache.mark_all_clean();
        let sealed = self.alloc.seal();
        self.shares.seal();
        self.committed_roots = roots;
        // A freed block may be reused for data once this transaction is
        // durable: an older image must never be written over it.
        for extent in &sealed.extents {
            if extent.change == AllocChange::Freed {
                let first = extent.first.0;
                let end = first + u64::from(extent.count);
                self.unwritten_homes
                    .retain(|addr, _| addr.0 < first || addr.0 >= end);
            }
        }
        // Until written home, the images are where a node that leaves the
        // cache is read from.
        for (home, image) in homes.iter().zip(images) {
            self.unwritten_homes.insert(*home, image);
        }
        let in_flight = InFlightCommit {
            homes,
            roots,
            trailing_frees,
            frees: sealed.frees,
        };
        Ok((in_flight, transaction))
    }

    /// Every changed metadata block as (home, image): the volume table's
    /// first, since writing its records may allocate nodes and blocks that
    /// must ride in the same transaction, then every dirty node.
    fn dirty_images(&mut self) -> Result<Vec<(BlockAddr, Vec<u8>)>> {
        let block_size = self.geometry.block_size_bytes as usize;
        let mut writes = self.persist_volume_table()?;
        for &addr in self.cache.dirty() {
            let mut block = vec![0u8; block_size];
            self.cache
                .peek(addr)
                .expect("dirty nodes are pinned")
                .encode(&mut block);
            writes.push((addr, block));
        }
        Ok(writes)
    }

    fn current_roots(&self) -> Roots {
        Roots {
            volume_table_root: self.superblock.volume_table_root,
            volume_table_height: self.superblock.volume_table_height,
            next_volume_id: self.superblock.next_volume_id,
            group_count: self.alloc.group_count(),
            birth_generation: self.superblock.birth_generation,
        }
    }

    /// Encodes a transaction and reserves its place in the journal
    /// (checkpointing first if it does not fit).
    fn reserve_transaction(
        &mut self,
        roots: Roots,
        homes: &[BlockAddr],
        images: &[Vec<u8>],
        extents: Vec<AllocExtent>,
        share_runs: Vec<ShareRun>,
    ) -> Result<(u64, Vec<u8>)> {
        let block = self.geometry.block_size_bytes as usize;
        let descriptor = self.descriptor(roots, homes.to_vec(), images, extents, share_runs);
        let len = u64::from(descriptor.descriptor_blocks) + images.len() as u64;
        if !self.journal.fits(len) {
            self.checkpoint()?;
        }
        let bytes = crate::journal::transaction_bytes(block, &descriptor.encode(block), images);
        let offset = self.journal.reserve(len);
        Ok((offset, bytes))
    }

    /// The last step of a commit, under the state lock, after its I/O:
    /// forgets the images written home, writes the frees that did not fit
    /// and checkpoints when the journal is half full. Returns the blocks
    /// the commit freed (none if its frees could not all be journaled).
    pub(crate) fn finish_commit(&mut self, outcome: CommitIoOutcome) -> Result<Vec<BlockAddr>> {
        let in_flight = self.commit_in_flight.take().expect("a commit is in flight");
        if let Err(e) = outcome.result {
            if outcome.journal_attempted {
                self.journal.append_failed();
            }
            return Err(e);
        }
        // A failed write-back stays in `unwritten_homes`: the checkpoint
        // retries it before it lets the journal forget the transaction.
        for home in outcome.homes_written {
            self.unwritten_homes.remove(&home);
        }
        let frees_durable = self.append_trailing_frees(in_flight.roots, &in_flight.trailing_frees);
        if self.journal.wants_checkpoint() {
            // Opportunistic: if it fails, the next commit tries again.
            let _ = self.checkpoint();
        }
        Ok(if frees_durable {
            in_flight.frees
        } else {
            Vec::new()
        })
    }

    /// Frees that did not fit trail in free-only transactions. If one
    /// cannot be written the commit still stands: the durable maps already
    /// hold the frees and the next checkpoint writes them; a crash before
    /// that only leaks the blocks, which check --repair reclaims. Returns
    /// whether all of them were journaled.
    fn append_trailing_frees(&mut self, roots: Roots, mut rest: &[AllocExtent]) -> bool {
        while !rest.is_empty() {
            let count = self.extents_that_fit(0, 0, rest).max(1);
            if self
                .append_transaction(roots, Vec::new(), &[], rest[..count].to_vec(), Vec::new())
                .is_err()
            {
                // These frees are not in the journal: a block among them
                // that held a journaled node must not be reused before a
                // checkpoint, or replay could write the node over new data.
                // Keeping them all pending (until the pool is reopened) is
                // safe; it only holds the space back.
                return false;
            }
            rest = &rest[count..];
        }
        true
    }

    /// Whether a prepared commit waits for [`State::finish_commit`].
    pub(crate) fn has_commit_in_flight(&self) -> bool {
        self.commit_in_flight.is_some()
    }

    /// For benchmarks only (feature `unsafe-no-journal`): the commit with
    /// no journal, metadata written in place and one flush. A crash can
    /// leave it inconsistent; it exists to measure what the journal costs.
    fn commit_in_place_unsafely(&mut self) -> Result<Vec<BlockAddr>> {
        if !self.has_changes() {
            return Ok(Vec::new());
        }
        let writes = self.dirty_images()?;
        self.grow_device_to_store()?;
        let roots = self.current_roots();
        for (home, image) in &writes {
            self.write_device_block(*home, image, "metadata")?;
        }
        self.cache.mark_all_clean();
        let sealed = self.alloc.seal();
        self.shares.seal();
        self.write_count_blocks()?;
        for (addr, block) in self.alloc.dirty_maps(self.geometry.block_size_bytes) {
            self.write_device_block(addr, &block, "allocation map")?;
        }
        self.alloc.mark_maps_clean();
        self.flush_device("metadata")?;
        self.committed_roots = roots;
        Ok(sealed.frees)
    }

    /// How many of `extents` fit in one transaction beside `images` images
    /// and `share_runs` share-count runs.
    fn extents_that_fit(&self, images: usize, share_runs: usize, extents: &[AllocExtent]) -> usize {
        let block = self.geometry.block_size_bytes as usize;
        let max_blocks = self.journal.max_transaction_blocks() as usize;
        let descriptor_blocks_max = max_blocks.saturating_sub(images);
        let budget_bytes = descriptor_blocks_max * block;
        let fixed = Descriptor::encoded_len(images, 0, share_runs);
        let per_extent = Descriptor::encoded_len(0, 1, 0) - Descriptor::encoded_len(0, 0, 0);
        if fixed > budget_bytes {
            return 0;
        }
        ((budget_bytes - fixed) / per_extent).min(extents.len())
    }

    fn descriptor(
        &self,
        roots: Roots,
        homes: Vec<BlockAddr>,
        images: &[Vec<u8>],
        extents: Vec<AllocExtent>,
        share_runs: Vec<ShareRun>,
    ) -> Descriptor {
        let block = self.geometry.block_size_bytes as usize;
        let mut images_crc = 0u32;
        for image in images {
            images_crc = crc32c::crc32c_append(images_crc, image);
        }
        Descriptor {
            sequence: self.journal.sequence(),
            pool_uuid: self.superblock.pool_uuid,
            descriptor_blocks: Descriptor::encoded_len(homes.len(), extents.len(), share_runs.len())
                .div_ceil(block) as u32,
            images_crc,
            roots,
            homes,
            extents,
            share_runs,
        }
    }

    /// Writes a transaction and flushes it, all under the state lock.
    fn append_transaction(
        &mut self,
        roots: Roots,
        homes: Vec<BlockAddr>,
        images: &[Vec<u8>],
        extents: Vec<AllocExtent>,
        share_runs: Vec<ShareRun>,
    ) -> Result<()> {
        let block = self.geometry.block_size_bytes as usize;
        let descriptor = self.descriptor(roots, homes, images, extents, share_runs);
        let len = u64::from(descriptor.descriptor_blocks) + images.len() as u64;
        if !self.journal.fits(len) {
            self.checkpoint()?;
        }
        let bytes = descriptor.encode(block);
        self.journal.append(self.device.as_ref(), &bytes, images)
    }

    /// Checks that the journal reads back exactly the transactions written
    /// since the last checkpoint; returns how many.
    pub(crate) fn verify_journal(&self) -> Result<u64> {
        self.journal
            .verify(self.device.as_ref(), &self.superblock.pool_uuid)
    }

    /// Something a checkpoint would write: journaled transactions, changed
    /// maps or failed write-backs. A pool that only read needs none, so
    /// opening and closing it writes nothing.
    pub fn needs_checkpoint(&self) -> bool {
        !self.journal.is_empty()
            || self.alloc.has_dirty_maps()
            || self.shares.has_dirty_count_blocks()
            || !self.unwritten_homes.is_empty()
    }

    /// Writes the share-count blocks whose durable counts changed, and
    /// notes in their groups' maps that they hold counts.
    fn write_count_blocks(&mut self) -> Result<()> {
        let dirty = self
            .shares
            .dirty_count_blocks(self.geometry.block_size_bytes);
        for count_block in &dirty {
            self.write_device_block(count_block.home, &count_block.block, "share counts")?;
        }
        for count_block in &dirty {
            self.alloc
                .mark_shares_present(count_block.group, count_block.index);
        }
        self.shares.mark_count_blocks_clean();
        Ok(())
    }

    /// Reads the share-count blocks every group's map says it has.
    pub fn load_share_counts(&mut self) -> Result<()> {
        let mut block = vec![0u8; self.geometry.block_size_bytes as usize];
        for group in 0..self.alloc.group_count() {
            let present = self.alloc.shares_present(group);
            for k in 0..SHARE_BLOCKS_PER_GROUP {
                if present & (1 << k) == 0 {
                    continue;
                }
                let first = self.shares.count_block_first_of(group, k);
                let home = BlockAddr(self.alloc.group_start(group).0 + 1 + k);
                self.read_block(home, &mut block, "share-count block")?;
                match crate::format::shares::decode(BlockAddr(first), &block) {
                    Ok(counts) => self.shares.load(first, &counts),
                    // Count blocks are rewritten in place at checkpoint, so
                    // a crash can tear one. The trees say what the counts
                    // must be: they are rebuilt once the table is loaded.
                    Err(e) => self.share_counts_damaged.push((first, e.to_string())),
                }
            }
        }
        Ok(())
    }

    /// Recomputes every share count from the trees, if opening found a
    /// count block it could not use. Every reference is an entry of a node
    /// (each node's entries counted once) or a record's root.
    /// Returns whether it rebuilt them (a checkpoint must then follow).
    pub fn rebuild_share_counts_if_damaged(&mut self) -> Result<bool> {
        if self.share_counts_damaged.is_empty() {
            return Ok(false);
        }
        let mut references: HashMap<BlockAddr, u32> = HashMap::new();
        let roots: Vec<(BlockAddr, u8)> = self
            .volumes
            .values()
            .chain(self.removed.values())
            .filter(|r| !r.root.is_none())
            .map(|r| (r.root, r.height))
            .collect();
        for (root, height) in roots {
            self.count_references(root, Some(height - 1), &mut references)?;
        }
        let extra: HashMap<u64, u32> = references
            .into_iter()
            .filter(|&(_, n)| n > 1)
            .map(|(addr, n)| (addr.0, n - 1))
            .collect();
        self.shares.rebuild(extra);
        let damaged = std::mem::take(&mut self.share_counts_damaged);
        for (first, _) in &damaged {
            self.shares.mark_count_block_dirty(*first);
        }
        self.open_warnings.push(format!(
            "{} share-count blocks were unusable ({}); all share counts were rebuilt from the trees",
            damaged.len(),
            damaged[0].1
        ));
        Ok(true)
    }

    fn count_references(
        &mut self,
        addr: BlockAddr,
        level: Option<u8>,
        references: &mut HashMap<BlockAddr, u32>,
    ) -> Result<()> {
        let seen = references.entry(addr).or_default();
        *seen += 1;
        let (Some(level), 1) = (level, *seen) else {
            return Ok(());
        };
        let entries = self.node_entries(addr, NodeKind::VolumeData, level)?;
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            self.count_references(entry.addr(), level.checked_sub(1), references)?;
        }
        Ok(())
    }

    /// Makes the metadata written home durable, writes the allocation maps,
    /// and moves the journal's replay start up in a new superblock. After a
    /// checkpoint, replay has nothing to do.
    pub fn checkpoint(&mut self) -> Result<()> {
        assert!(
            self.commit_in_flight.is_none(),
            "a checkpoint waits for the commit in flight"
        );
        for (home, image) in &self.unwritten_homes {
            self.write_device_block(*home, image, "metadata")?;
        }
        self.unwritten_homes.clear();
        self.flush_device("metadata")?;
        // Count blocks before the maps that say they hold counts: a crash
        // between leaves a map that does not know a written count block,
        // whose counts the journal still replays.
        self.write_count_blocks()?;
        self.flush_device("share counts")?;
        let maps = self.alloc.dirty_maps(self.geometry.block_size_bytes);
        for (addr, block) in &maps {
            self.write_device_block(*addr, block, "allocation map")?;
        }
        self.flush_device("allocation maps")?;
        self.alloc.mark_maps_clean();
        let mut superblock = self.superblock.clone();
        superblock.volume_table_root = self.committed_roots.volume_table_root;
        superblock.volume_table_height = self.committed_roots.volume_table_height;
        superblock.next_volume_id = self.committed_roots.next_volume_id;
        superblock.group_count = self.committed_roots.group_count;
        superblock.birth_generation = self.committed_roots.birth_generation;
        superblock.journal_head = self.journal.write_position();
        superblock.journal_sequence = self.journal.sequence();
        self.write_superblock(&mut superblock)?;
        self.superblock.generation = superblock.generation;
        self.superblock.journal_head = superblock.journal_head;
        self.superblock.journal_sequence = superblock.journal_sequence;
        self.superblock.group_count = superblock.group_count;
        self.journal.checkpointed();
        Ok(())
    }

    /// Writes `superblock` with the next generation into its slot and
    /// flushes it. On failure the generation is not used up, so a retry
    /// writes the same (possibly torn) slot and never the last good one.
    pub fn write_superblock(&self, superblock: &mut Superblock) -> Result<()> {
        superblock.generation += 1;
        let mut block = vec![0u8; self.geometry.block_size_bytes as usize];
        block[..SUPERBLOCK_LEN].copy_from_slice(&superblock.encode());
        let result = self
            .write_device_block(BlockAddr(superblock.slot()), &block, "superblock")
            .and_then(|()| self.flush_device("the superblock"));
        if result.is_err() {
            superblock.generation -= 1;
        }
        result
    }

    /// Redoes every complete transaction after the last checkpoint; the
    /// caller then checkpoints (after the share counts are known good), so
    /// the next open finds an empty journal. Replaying twice
    /// gives the same result: images are whole blocks and extents set
    /// states, so applying them again changes nothing.
    pub fn replay_journal(&mut self) -> Result<usize> {
        let transactions = self
            .journal
            .scan(self.device.as_ref(), &self.superblock.pool_uuid)?;
        if transactions.is_empty() {
            return Ok(0);
        }
        // An image is stale if a later transaction frees its block: the
        // block may since hold data that the journal never saw (a revoke).
        // Only blocks that have an image can need a revoke, so only those
        // are looked up: a large removal frees millions of blocks.
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
        for (index, transaction) in transactions.iter().enumerate() {
            let roots = transaction.descriptor.roots;
            self.alloc
                .replay(&transaction.descriptor.extents, roots.group_count)?;
            let store_end = self.alloc.store_end();
            self.shares
                .replay(&transaction.descriptor.share_runs, store_end)?;
            if roots.birth_generation > crate::format::node::BIRTH_GENERATION_MAX {
                return Err(Error::corrupt(format!(
                    "journal transaction {} claims birth generation {}",
                    transaction.descriptor.sequence, roots.birth_generation
                )));
            }
            for (home, image) in transaction.descriptor.homes.iter().zip(&transaction.images) {
                let data_start = self.superblock.data_start.0;
                if home.0 < data_start || home.0 >= store_end || self.alloc.is_group_header(*home) {
                    return Err(Error::corrupt(format!(
                        "journal transaction {} writes {home}, which cannot hold journaled metadata",
                        transaction.descriptor.sequence
                    )));
                }
                if last_freed.get(&home.0).is_some_and(|&freed| freed > index) {
                    continue;
                }
                self.write_device_block(*home, image, "replayed metadata")?;
            }
            self.superblock.volume_table_root = roots.volume_table_root;
            self.superblock.volume_table_height = roots.volume_table_height;
            self.superblock.next_volume_id = roots.next_volume_id;
            self.superblock.birth_generation = roots.birth_generation;
            self.committed_roots = roots;
        }
        self.alloc.finish_replay();
        self.shares.finish_replay();
        self.grow_device_to_store()?;
        Ok(transactions.len())
    }
}
