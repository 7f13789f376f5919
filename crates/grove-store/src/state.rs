//! The engine's state, everything the pool's state lock guards: the
//! space map (allocator and share counts, `space.rs`), the node store
//! (`node_store.rs`), the volume records, the journal and the pool's I/O in
//! flight (`io.rs`), with the device access and node decoding the rest
//! builds on. Its fields are private: the rest asks through the methods
//! below. Each other part of the engine is an `impl State` in
//! a file of its own: `tree.rs` (radix trees), `volumes.rs` (volume
//! operations), `volume_table.rs` (records on disk; `records.rs` holds
//! them in memory, the one owner of their rules), `commit.rs`
//! (transactions), `checkpoint.rs` (checkpoint and replay), `reclaim.rs`,
//! `diff.rs` and `accounting.rs`. `pool/` holds the public API and the
//! locking.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::alloc::{Allocator, BlockUse};
use crate::cache::NodeCache;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::journal::Roots;
use crate::format::node::{Entry, Node, NodeKind};
use crate::format::superblock::Superblock;
use crate::io::{flush, write_block, InFlightCheckpoint, InFlightCommit, PoolIo, Puncher};
use crate::journal::Journal;
use crate::node_store::NodeStore;
use crate::records::VolumeTable;
use crate::shares::Shares;
use crate::space::{Release, SpaceMap};
use crate::types::{BlockAddr, VolumeId};

pub use crate::geometry::Geometry;

/// The store's space in blocks (see [`State::space`]).
pub(crate) struct Space {
    /// Blocks of every group the store has (its file's length).
    pub store_blocks: u64,
    pub used_blocks: u64,
    /// Used blocks holding volume data (the rest hold metadata).
    pub data_blocks: u64,
    pub meta_blocks: u64,
    /// Free blocks in the groups the store has.
    pub free_blocks: u64,
    /// The most blocks the store may grow to; None: while the host has room.
    pub capacity_blocks: Option<u64>,
}

pub struct State {
    device: Arc<dyn BlockDevice>,
    geometry: Geometry,
    superblock: Superblock,
    /// Which blocks are in use and how many references each has: the
    /// allocator and the share counts, changed only through its methods.
    space_map: SpaceMap,
    /// Decoded nodes, and journaled images not yet home: where a node is
    /// read from (`node_store.rs`).
    nodes: NodeStore,
    /// Every volume record, live and removed, with its indexes and dirty
    /// marks, changed only through its methods (`records.rs`).
    volume_table: VolumeTable,
    /// Why the pool stopped taking changes: a commit failed, so what is
    /// in memory may no longer match anything durable. Reads go on.
    failed: Option<String>,
    /// Count blocks that could not be decoded at open (torn by a crash
    /// during a checkpoint); the counts are rebuilt from the trees.
    share_counts_damaged: Vec<(u64, String)>,
    /// Groups whose map block could not be decoded at open (torn by a
    /// crash during a checkpoint), and why; rebuilt from the trees.
    maps_damaged: Vec<(u64, String)>,
    /// Blocks freed by commits made in the middle of a repair.
    deferred_frees: Vec<BlockAddr>,
    /// Data was written since the last device flush. Shared with writers
    /// that write in place outside the state lock: they set it after their
    /// write lands, and a commit clears it before it flushes, so a write that
    /// lands during a commit is flushed by the next one.
    data_dirty: Arc<AtomicBool>,
    /// A block whose data is not flushed yet was mapped since the last
    /// data flush (a hole filled, a shared block copied): the transaction
    /// that maps it must follow a data flush (ordered mode). Writes in
    /// place map nothing, so a commit without this needs no data flush for
    /// its own order (`DataFlush::IfMapped`). Set and cleared under the
    /// state lock; set only while `data_dirty` is.
    data_mapped_unflushed: bool,
    /// Radix nodes visited by lookups, for the depth-independence test.
    node_visits: u64,
    journal: Journal,
    /// The roots as of the last durable transaction: what a checkpoint
    /// writes into the superblock.
    committed_roots: Roots,
    /// What opening the pool found wrong but could work around (a damaged
    /// superblock slot); `check` reports it.
    open_warnings: Vec<String>,
    /// The commit or checkpoint in flight, and the puncher (`io.rs`).
    io: PoolIo,
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
            space_map: SpaceMap::new(
                alloc,
                Shares::new(
                    superblock.data_start,
                    superblock.group_blocks,
                    superblock.block_size_bytes,
                ),
            ),
            volume_table: VolumeTable::default(),
            failed: None,
            share_counts_damaged: Vec::new(),
            maps_damaged: Vec::new(),
            deferred_frees: Vec::new(),
            journal,
            committed_roots,
            io: PoolIo::default(),
            open_warnings: Vec::new(),
            device,
            geometry,
            superblock,
            nodes: NodeStore::new(NodeCache::nodes_for(
                crate::cache::CACHE_SIZE_DEFAULT_BYTES,
                geometry.block_bytes(),
            )),
            data_dirty: Arc::new(AtomicBool::new(false)),
            data_mapped_unflushed: false,
            node_visits: 0,
        }
    }

    // ----- the parts, each changed only through its owner's methods -----

    /// The superblock as of open or the last checkpoint.
    pub(crate) fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// The volume table's root moved (it grew a level, or was made).
    pub(crate) fn set_volume_table_root(&mut self, root: BlockAddr, height: u8) {
        assert!(height > 0 && height >= self.superblock.volume_table_height);
        self.superblock.volume_table_root = root;
        self.superblock.volume_table_height = height;
    }

    /// A new volume's id; the next one is one higher.
    pub(crate) fn next_volume_id(&mut self) -> VolumeId {
        let id = self.superblock.next_volume_id;
        self.superblock.next_volume_id = VolumeId(id.0 + 1);
        id
    }

    /// Every later write is born at `generation` or after (see
    /// `take_generation`); generations only move up.
    pub(crate) fn advance_birth_generation(&mut self, generation: u64) {
        assert!(generation > self.superblock.birth_generation);
        self.superblock.birth_generation = generation;
    }

    /// The capacity the next checkpoint records (`capacity.rs`, with the
    /// space map kept in step).
    pub(crate) fn set_superblock_capacity(&mut self, capacity_blocks: u64) {
        self.superblock.capacity_blocks = capacity_blocks;
    }

    /// A checkpoint wrote `written`: its generation and journal head are
    /// the superblock's now.
    pub(crate) fn note_superblock_written(&mut self, written: &Superblock) {
        self.superblock.generation = written.generation;
        self.superblock.journal_head = written.journal_head;
        self.superblock.journal_sequence = written.journal_sequence;
        self.superblock.group_count = written.group_count;
    }

    /// A replayed transaction's roots are the pool's: in the superblock
    /// the next checkpoint writes, and as the last durable roots.
    pub(crate) fn adopt_replayed_roots(&mut self, roots: Roots) {
        self.superblock.volume_table_root = roots.volume_table_root;
        self.superblock.volume_table_height = roots.volume_table_height;
        self.superblock.next_volume_id = roots.next_volume_id;
        self.superblock.birth_generation = roots.birth_generation;
        self.committed_roots = roots;
    }

    /// The allocator and share counts (`space.rs`).
    pub(crate) fn space_map(&self) -> &SpaceMap {
        &self.space_map
    }

    pub(crate) fn space_map_mut(&mut self) -> &mut SpaceMap {
        &mut self.space_map
    }

    /// Where nodes are read from (`node_store.rs`).
    pub(crate) fn nodes(&self) -> &NodeStore {
        &self.nodes
    }

    pub(crate) fn nodes_mut(&mut self) -> &mut NodeStore {
        &mut self.nodes
    }

    /// Every volume record in memory (`records.rs`).
    pub(crate) fn volume_table(&self) -> &VolumeTable {
        &self.volume_table
    }

    pub(crate) fn volume_table_mut(&mut self) -> &mut VolumeTable {
        &mut self.volume_table
    }

    /// Where transactions go in the journal (`journal.rs`).
    pub(crate) fn journal(&self) -> &Journal {
        &self.journal
    }

    pub(crate) fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// The roots as of the last durable transaction.
    pub(crate) fn committed_roots(&self) -> &Roots {
        &self.committed_roots
    }

    /// A transaction with these roots is durable (a commit, or replay).
    pub(crate) fn set_committed_roots(&mut self, roots: Roots) {
        self.committed_roots = roots;
    }

    // ----- failure -----

    /// Why the pool stopped taking changes, if it did.
    pub(crate) fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Stops the pool taking changes: what is in memory may no longer match
    /// anything durable. The first reason stays; reads go on.
    pub(crate) fn mark_failed(&mut self, reason: String) {
        if self.failed.is_none() {
            self.failed = Some(reason);
        }
        debug_assert!(self.failed.is_some());
    }

    // ----- what open found -----

    /// What opening the pool found wrong but could work around.
    pub(crate) fn open_warnings(&self) -> &[String] {
        &self.open_warnings
    }

    pub(crate) fn warn_at_open(&mut self, warning: String) {
        self.open_warnings.push(warning);
    }

    /// A repair fixed what open found: nothing is left to warn of.
    pub(crate) fn clear_open_warnings(&mut self) {
        self.open_warnings.clear();
    }

    /// Records what open found: the superblock's problems and the groups
    /// whose map block did not decode (rebuilt from the trees).
    pub(crate) fn note_open_damage(
        &mut self,
        warnings: Vec<String>,
        maps_damaged: Vec<(u64, String)>,
    ) {
        self.open_warnings = warnings;
        self.maps_damaged = maps_damaged;
    }

    /// Groups whose map block did not decode at open, handed to the rebuild.
    pub(crate) fn take_maps_damaged(&mut self) -> Vec<(u64, String)> {
        std::mem::take(&mut self.maps_damaged)
    }

    pub(crate) fn maps_damaged(&self) -> &[(u64, String)] {
        &self.maps_damaged
    }

    /// A share-count block that did not decode at open, and why.
    pub(crate) fn note_share_counts_damaged(&mut self, first: u64, why: String) {
        self.share_counts_damaged.push((first, why));
    }

    pub(crate) fn share_counts_damaged(&self) -> &[(u64, String)] {
        &self.share_counts_damaged
    }

    /// The damaged share-count blocks, handed to the rebuild.
    pub(crate) fn take_share_counts_damaged(&mut self) -> Vec<(u64, String)> {
        std::mem::take(&mut self.share_counts_damaged)
    }

    // ----- I/O in flight -----

    pub(crate) fn start_commit_io(&mut self, in_flight: InFlightCommit) {
        self.io.start_commit(in_flight);
    }

    pub(crate) fn take_commit_in_flight(&mut self) -> Option<InFlightCommit> {
        self.io.take_commit()
    }

    pub(crate) fn start_checkpoint_io(&mut self, in_flight: InFlightCheckpoint) {
        self.io.start_checkpoint(in_flight);
    }

    pub(crate) fn take_checkpoint_in_flight(&mut self) -> Option<InFlightCheckpoint> {
        self.io.take_checkpoint()
    }

    pub(crate) fn checkpoint_in_flight(&self) -> bool {
        self.io.checkpoint_in_flight()
    }

    /// A commit's or a checkpoint's I/O may be running without the lock.
    pub(crate) fn has_io_in_flight(&self) -> bool {
        self.io.in_flight()
    }

    /// Punching's own state (`punch.rs` alone).
    pub(crate) fn puncher(&self) -> &Puncher {
        self.io.puncher()
    }

    pub(crate) fn puncher_mut(&mut self) -> &mut Puncher {
        self.io.puncher_mut()
    }

    // ----- read-only views -----

    /// The device the store lives on.
    pub(crate) fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// The radix trees' shape for the pool's block size.
    pub(crate) fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Set once data was written since the last device flush; shared with
    /// writers outside the state lock (see the field).
    pub(crate) fn data_dirty(&self) -> &Arc<AtomicBool> {
        &self.data_dirty
    }

    /// Data not flushed yet is about to be mapped (see the field); sets
    /// `data_dirty` too.
    pub(crate) fn note_data_mapped(&mut self) {
        self.data_dirty
            .store(true, std::sync::atomic::Ordering::Release);
        self.data_mapped_unflushed = true;
    }

    /// Whether unflushed data was mapped since the last data flush; a
    /// commit that flushes data clears it.
    pub(crate) fn take_data_mapped(&mut self) -> bool {
        std::mem::take(&mut self.data_mapped_unflushed)
    }

    /// Radix nodes visited by lookups so far.
    pub(crate) fn node_visits(&self) -> u64 {
        self.node_visits
    }

    /// A lookup visited one more radix node.
    pub(crate) fn count_node_visit(&mut self) {
        self.node_visits += 1;
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

    pub(crate) fn write_device_block(&self, addr: BlockAddr, buf: &[u8], what: &str) -> Result<()> {
        self.metadata_changed();
        write_block(
            self.device.as_ref(),
            self.geometry.block_bytes(),
            addr,
            buf,
            what,
        )
    }

    pub(crate) fn flush_device(&self, what: &str) -> Result<()> {
        flush(self.device.as_ref(), what)
    }
    /// Grows the device to span every allocation group, so that the store
    /// never looks truncated to the next open (the groups' blocks may not
    /// all have been written yet).
    pub(crate) fn grow_device_to_store(&self) -> Result<()> {
        let data_start = self.superblock.data_start.0;
        let device_blocks = crate::format::superblock::device_blocks(
            data_start,
            self.space_map.alloc().store_end() - data_start,
            self.space_map.alloc().capacity_blocks(),
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

    // ----- space -----

    /// Makes blocks freed by a durable commit reusable. The pool calls it
    /// once no reader can still be reading them at their old addresses.
    /// They go on the punch backlog too (`punch.rs`): nothing can bring
    /// them back now, so their host space may go.
    pub(crate) fn make_reusable(&mut self, frees: Vec<BlockAddr>) {
        self.queue_durable_frees(&frees);
        self.space_map.release_durable_frees(frees);
    }

    /// Keeps the frees of a commit made in the middle of a repair, for the
    /// pool to make reusable after it (`take_deferred_frees`).
    pub(crate) fn defer_frees(&mut self, frees: Vec<BlockAddr>) {
        self.deferred_frees.extend(frees);
    }

    /// Frees of commits made during a repair, to release after it.
    pub(crate) fn take_deferred_frees(&mut self) -> Vec<BlockAddr> {
        std::mem::take(&mut self.deferred_frees)
    }

    /// True when blocks freed since the last commit wait for it before
    /// they can be reused: a commit may then find room a write needs.
    pub(crate) fn has_frees_awaiting_commit(&self) -> bool {
        self.space_map.alloc().has_open_frees()
    }

    /// The store's space, in blocks, as the allocator counts it.
    pub(crate) fn space(&self) -> Space {
        Space {
            store_blocks: self.space_map.alloc().group_count() * self.superblock.group_blocks,
            used_blocks: self.space_map.alloc().used_blocks(),
            data_blocks: self.space_map.alloc().data_blocks(),
            meta_blocks: self.space_map.alloc().meta_blocks(),
            free_blocks: self.space_map.alloc().free_blocks(),
            capacity_blocks: match self.space_map.alloc().capacity_blocks() {
                0 => None,
                capacity => Some(capacity),
            },
        }
    }

    // ----- node cache -----

    pub(crate) fn metadata_epoch(&self) -> u64 {
        self.nodes.epoch()
    }

    pub(crate) fn metadata_changed(&self) {
        self.nodes.changed();
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
            let Some(node) = self.nodes.peek(addr) else {
                return self
                    .nodes
                    .unwritten_image(addr)
                    .is_none()
                    .then_some((addr, level));
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
        if self.metadata_epoch() != epoch || self.nodes.contains(addr) {
            return false;
        }
        match self.decode_node(addr, kind, level, block) {
            Ok(node) if Self::check_shape(&node, addr, kind, level).is_ok() => {
                self.nodes.insert_read(addr, node);
                true
            }
            _ => false,
        }
    }

    /// Reads and verifies the node at `addr` from the device (or from a
    /// journaled image whose write home failed: the disk is older).
    fn read_node(&self, addr: BlockAddr, kind: NodeKind, level: u8) -> Result<Node> {
        let mut block = vec![0u8; self.geometry.block_size_bytes as usize];
        match self.nodes.unwritten_image(addr) {
            Some(image) => block.copy_from_slice(image),
            None => self.read_block(addr, &mut block, "radix node")?,
        }
        self.decode_node(addr, kind, level, &block)
    }

    /// The error about damage at `addr`, naming where the device keeps
    /// that block when it says (a RADOS object: the one to restore).
    fn placed(&self, error: Error, addr: BlockAddr) -> Error {
        match self.device.place_of(addr.0 * self.geometry.block_bytes()) {
            Some(place) => Error::new(
                error.kind(),
                format!("{} (kept in {place})", error.message()),
            ),
            None => error,
        }
    }

    pub(crate) fn decode_node(
        &self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
        block: &[u8],
    ) -> Result<Node> {
        let data_start = self.superblock.data_start.0;
        let valid = data_start..self.space_map.alloc().store_end();
        let birth_max = self.superblock.birth_generation;
        let node = Node::decode(block, addr, kind, level, valid, birth_max)
            .map_err(|e| match kind {
                NodeKind::VolumeTable => Error::corrupt(format!("volume table: {e}")),
                NodeKind::VolumeData => e,
            })
            .map_err(|e| self.placed(e, addr))?;
        if let Some((slot, _)) = node
            .entries
            .iter()
            .enumerate()
            .find(|(_, e)| !e.is_empty() && self.space_map.alloc().is_group_header(e.addr()))
        {
            return Err(Error::corrupt(format!(
                "radix node at {addr} is damaged: entry {slot} points at a group's map or share-count block"
            )));
        }
        Ok(node)
    }

    pub(crate) fn check_shape(
        node: &Node,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
    ) -> Result<()> {
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
        if !self.nodes.contains(addr) {
            let node = self.read_node(addr, kind, level)?;
            self.nodes.insert_read(addr, node);
        }
        let node = self.nodes.get(addr).expect("just cached");
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
        if let Some(node) = self.nodes.peek(addr) {
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

    /// Sets how many bytes of decoded nodes the cache keeps.
    pub fn set_cache_size(&mut self, size_bytes: u64) {
        let nodes = NodeCache::nodes_for(size_bytes, self.geometry.block_bytes());
        self.nodes.resize(nodes);
    }

    /// Sets a volume's space accounting (check --repair).
    pub(crate) fn set_accounting(&mut self, id: VolumeId, referenced_blocks: u64) {
        self.volume_table
            .update(id, |record| record.referenced_blocks = referenced_blocks);
    }

    /// An entry of a node this operation loaded.
    pub(crate) fn entry(&self, addr: BlockAddr, slot: usize) -> Entry {
        self.nodes.entry(addr, slot)
    }

    /// Changes an entry of a node this operation loaded; it is dirty (and
    /// pinned in the cache) until the next commit.
    pub(crate) fn set_entry(&mut self, addr: BlockAddr, slot: usize, entry: Entry) {
        self.nodes.set_entry(addr, slot, entry);
    }

    pub(crate) fn insert_new_node(&mut self, node: Node) -> Result<BlockAddr> {
        let addr = self.space_map.allocate(BlockUse::Meta)?;
        self.nodes.insert_new(addr, node);
        Ok(addr)
    }

    /// Drops one reference to `addr` through the space map, which decides
    /// whether it was the last; a freed block's cached node is forgotten.
    pub(crate) fn release_reference(&mut self, addr: BlockAddr) -> Release {
        let released = self.space_map.release_reference(addr);
        if released == Release::Freed {
            self.nodes.forget(addr);
        }
        released
    }
}
