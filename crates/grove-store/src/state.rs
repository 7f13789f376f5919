//! The engine's in-memory state and the operations on it: radix-tree walks
//! with dedicate-on-write, snapshots, unmapping, deletion, the volume table
//! and commit. Everything here runs under the pool's state lock; `pool.rs`
//! holds the public API and the locking.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::alloc::{Allocator, BlockUse};
use crate::device::BlockDevice;
use crate::error::{Error, ErrorKind, Result};
use crate::format::journal::{AllocChange, AllocExtent, Descriptor, Roots};
use crate::format::node::{Entry, Node, NodeKind, ENTRY_BYTES, NODE_LEVELS_MAX};
use crate::format::record::{VolumeKind, VolumeRecord, RECORD_BYTES};
use crate::format::superblock::{Superblock, SUPERBLOCK_LEN};
use crate::journal::Journal;
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

/// What dropping part of a tree removed, for space accounting.
#[derive(Default)]
struct Dropped {
    /// Data blocks the tree no longer maps.
    referenced_blocks: u64,
    /// Of those, the ones reachable only through this tree (now freed).
    exclusive_blocks: u64,
    /// Blocks to free, data and nodes; collected first and freed after the
    /// walk, so a damaged node found halfway leaves nothing half-freed.
    to_free: Vec<BlockAddr>,
}

pub struct State {
    pub device: Arc<dyn BlockDevice>,
    pub geometry: Geometry,
    pub superblock: Superblock,
    pub alloc: Allocator,
    /// Decoded nodes, clean and dirty. (Issue: bounded metadata cache.)
    nodes: HashMap<BlockAddr, Node>,
    dirty_nodes: BTreeSet<BlockAddr>,
    pub volumes: BTreeMap<VolumeId, VolumeRecord>,
    pub names: HashMap<String, VolumeId>,
    /// Record blocks of the volume table by block index, as stored.
    record_blocks: HashMap<u64, Vec<u8>>,
    dirty_records: BTreeSet<VolumeId>,
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
        };
        State {
            journal,
            committed_roots,
            unwritten_homes: BTreeMap::new(),
            open_warnings: Vec::new(),
            device,
            geometry: Geometry::new(superblock.block_size_bytes),
            superblock,
            alloc,
            nodes: HashMap::new(),
            dirty_nodes: BTreeSet::new(),
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

    pub fn read_block(&self, addr: BlockAddr, buf: &mut [u8], what: &str) -> Result<()> {
        self.device
            .read_at(buf, self.block_offset(addr))
            .map_err(|e| {
                Error::io(
                    format!("cannot read {what} at {addr} of {}", self.device.describe()),
                    e,
                )
            })
    }

    fn write_device_block(&self, addr: BlockAddr, buf: &[u8], what: &str) -> Result<()> {
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

    /// Loads (and verifies) a node into the cache.
    fn load_node(&mut self, addr: BlockAddr, kind: NodeKind, level: u8) -> Result<&Node> {
        if !self.nodes.contains_key(&addr) {
            let mut block = vec![0u8; self.geometry.block_size_bytes as usize];
            self.read_block(addr, &mut block, "radix node")?;
            let data_start = self.superblock.data_start.0;
            let valid = data_start..self.alloc.store_end();
            let node = Node::decode(&block, addr, kind, level, valid).map_err(|e| match kind {
                NodeKind::VolumeTable => Error::corrupt(format!("volume table: {e}")),
                NodeKind::VolumeData => e,
            })?;
            let group_blocks = self.superblock.group_blocks;
            if let Some((slot, _)) = node.entries.iter().enumerate().find(|(_, e)| {
                !e.is_empty() && (e.addr().0 - data_start).is_multiple_of(group_blocks)
            }) {
                return Err(Error::corrupt(format!(
                    "radix node at {addr} is damaged: entry {slot} points at an allocation map block"
                )));
            }
            self.nodes.insert(addr, node);
        }
        let node = &self.nodes[&addr];
        if node.kind != kind || node.level != level {
            return Err(Error::corrupt(format!(
                "radix node at {addr} is damaged: a {:?} level-{} node reached as a {kind:?} level-{level} node",
                node.kind, node.level
            )));
        }
        Ok(node)
    }

    /// A node's entries for the checker: the cached copy if there is one
    /// (it may be newer than the disk), else verified from the device.
    pub(crate) fn load_node_for_check(
        &mut self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
    ) -> Result<Box<[Entry]>> {
        Ok(self.load_node(addr, kind, level)?.entries.clone())
    }

    /// Sets a volume's space accounting (check --repair).
    pub(crate) fn set_accounting(
        &mut self,
        id: VolumeId,
        referenced_blocks: u64,
        exclusive_blocks: u64,
    ) {
        let record = self.volumes.get_mut(&id).expect("volume exists");
        record.referenced_blocks = referenced_blocks;
        record.exclusive_blocks = exclusive_blocks;
        self.dirty_records.insert(id);
    }

    fn entry(&self, addr: BlockAddr, slot: usize) -> Entry {
        self.nodes[&addr].entries[slot]
    }

    fn set_entry(&mut self, addr: BlockAddr, slot: usize, entry: Entry) {
        let node = self.nodes.get_mut(&addr).expect("node is cached");
        node.entries[slot] = entry;
        self.dirty_nodes.insert(addr);
    }

    fn insert_new_node(&mut self, node: Node) -> Result<BlockAddr> {
        let addr = self.alloc.allocate(BlockUse::Meta)?;
        self.nodes.insert(addr, node);
        self.dirty_nodes.insert(addr);
        Ok(addr)
    }

    /// Frees a block and forgets any cached node in it.
    fn free_block(&mut self, addr: BlockAddr) {
        self.nodes.remove(&addr);
        self.dirty_nodes.remove(&addr);
        self.alloc.free(addr);
    }

    // ----- radix trees -----

    /// The level-0 entry for logical block `index`, or EMPTY for a hole.
    /// Read-only: it copies nothing. Visits exactly one node per level down
    /// to the first hole, whatever the volume's ancestry.
    pub fn lookup(
        &mut self,
        root: BlockAddr,
        height: u8,
        kind: NodeKind,
        index: u64,
    ) -> Result<Entry> {
        let mut addr = root;
        for level in (0..height).rev() {
            self.node_visits += 1;
            let slot = self.geometry.slot(index, level);
            let entry = self.load_node(addr, kind, level)?.entries[slot];
            if level == 0 || entry.is_empty() {
                return Ok(entry);
            }
            addr = entry.addr();
        }
        unreachable!("height is at least 1")
    }

    /// The block holding logical block `index` if this tree may write it in
    /// place: mapped, and exclusive on every level of the path. An entry
    /// under a shared node may still say "exclusive" (it did before the
    /// node was shared), so the whole path is what counts.
    pub fn lookup_writable_in_place(
        &mut self,
        root: BlockAddr,
        height: u8,
        index: u64,
    ) -> Result<Option<BlockAddr>> {
        let mut addr = root;
        for level in (0..height).rev() {
            self.node_visits += 1;
            let slot = self.geometry.slot(index, level);
            let entry = self.load_node(addr, NodeKind::VolumeData, level)?.entries[slot];
            if entry.is_empty() || entry.is_shared() {
                return Ok(None);
            }
            if level == 0 {
                return Ok(Some(entry.addr()));
            }
            addr = entry.addr();
        }
        unreachable!("height is at least 1")
    }

    /// Makes `parent`'s child at `slot` (a level-`child_level` node) writable
    /// by this tree: creates it if missing, copies it if shared
    /// (dedicate-on-write). Returns the child's address.
    fn dedicate_child(
        &mut self,
        parent: BlockAddr,
        slot: usize,
        kind: NodeKind,
        child_level: u8,
    ) -> Result<BlockAddr> {
        let entry = self.entry(parent, slot);
        let child = if entry.is_empty() {
            self.insert_new_node(Node::empty(
                kind,
                child_level,
                self.geometry.entries_per_node,
            ))?
        } else if entry.is_shared() {
            // The copy's children are now reachable from two trees, so all of
            // them become shared; the original is left untouched for the
            // other trees that still use it.
            let original = self.load_node(entry.addr(), kind, child_level)?;
            let copy = Node {
                kind,
                level: child_level,
                entries: original.entries.iter().map(|e| e.as_shared()).collect(),
            };
            self.insert_new_node(copy)?
        } else {
            self.load_node(entry.addr(), kind, child_level)?;
            return Ok(entry.addr());
        };
        self.set_entry(parent, slot, Entry::new(child, false));
        Ok(child)
    }

    /// Makes the whole path from `root` to the level-0 node covering `index`
    /// writable by this tree and returns that node. The root itself always
    /// belongs to its tree alone.
    fn leaf_for_write(
        &mut self,
        root: BlockAddr,
        height: u8,
        kind: NodeKind,
        index: u64,
    ) -> Result<BlockAddr> {
        let mut addr = root;
        self.load_node(addr, kind, height - 1)?;
        for level in (1..height).rev() {
            let slot = self.geometry.slot(index, level);
            addr = self.dedicate_child(addr, slot, kind, level - 1)?;
        }
        Ok(addr)
    }

    /// Collects what dropping the subtree behind `entry` (a child of a
    /// level-`level + 1` node; `level` is the child's level, or None for a
    /// data block) would remove. Shared parts are counted but not freed.
    fn collect_subtree(
        &mut self,
        entry: Entry,
        level: Option<u8>,
        path_exclusive: bool,
        dropped: &mut Dropped,
    ) -> Result<()> {
        if entry.is_empty() {
            return Ok(());
        }
        let exclusive = path_exclusive && !entry.is_shared();
        match level {
            None => {
                dropped.referenced_blocks += 1;
                if exclusive {
                    dropped.exclusive_blocks += 1;
                    dropped.to_free.push(entry.addr());
                }
            }
            Some(level) => {
                let children = self
                    .load_node(entry.addr(), NodeKind::VolumeData, level)?
                    .entries
                    .clone();
                for child in children.iter() {
                    let child_level = level.checked_sub(1);
                    self.collect_subtree(*child, child_level, exclusive, dropped)?;
                }
                if exclusive {
                    dropped.to_free.push(entry.addr());
                }
            }
        }
        Ok(())
    }

    /// Unmaps logical blocks [first, end) below the level-`level` node at
    /// `addr` (which this tree may write), whose first block is `base`.
    fn unmap_below(
        &mut self,
        addr: BlockAddr,
        level: u8,
        base: u64,
        first: u64,
        end: u64,
        dropped: &mut Dropped,
    ) -> Result<()> {
        let span = self.geometry.span_blocks(level);
        let first_slot = ((first.max(base) - base) / span) as usize;
        let last_slot = (((end - 1).min(base + span * self.geometry.entries_per_node as u64 - 1)
            - base)
            / span) as usize;
        for slot in first_slot..=last_slot {
            let entry = self.entry(addr, slot);
            if entry.is_empty() {
                continue;
            }
            let child_first = base + slot as u64 * span;
            let child_end = child_first + span;
            if first <= child_first && child_end <= end {
                self.collect_subtree(entry, level.checked_sub(1), true, dropped)?;
                self.set_entry(addr, slot, Entry::EMPTY);
            } else {
                // Only part of this child goes: it is a node (level > 0,
                // since a data entry covers one block and is either in the
                // range or not).
                let child = self.dedicate_child(addr, slot, NodeKind::VolumeData, level - 1)?;
                self.unmap_below(child, level - 1, child_first, first, end, dropped)?;
            }
        }
        Ok(())
    }

    /// Unmaps blocks [first, end) of a volume and frees what only it used.
    pub fn unmap(&mut self, id: VolumeId, first: u64, end: u64) -> Result<()> {
        let record = self.volumes[&id].clone();
        let end = end.min(self.geometry.capacity_blocks(record.height));
        if first >= end {
            return Ok(());
        }
        let mut dropped = Dropped::default();
        self.load_node(record.root, NodeKind::VolumeData, record.height - 1)?;
        self.unmap_below(record.root, record.height - 1, 0, first, end, &mut dropped)?;
        for addr in std::mem::take(&mut dropped.to_free) {
            self.free_block(addr);
        }
        let record = self.volumes.get_mut(&id).expect("volume exists");
        // Saturating: a damaged (but checksummed) record must not panic.
        record.referenced_blocks = record
            .referenced_blocks
            .saturating_sub(dropped.referenced_blocks);
        record.exclusive_blocks = record
            .exclusive_blocks
            .saturating_sub(dropped.exclusive_blocks);
        self.dirty_records.insert(id);
        Ok(())
    }

    /// Writes `data` into logical block `index` of a volume at `offset`
    /// inside the block: in place when the volume owns the block, else into
    /// a fresh block (read-modify-write for a partial block).
    pub fn write_block(
        &mut self,
        id: VolumeId,
        index: u64,
        offset_in_block: usize,
        data: &[u8],
    ) -> Result<()> {
        let block_bytes = self.geometry.block_size_bytes as usize;
        assert!(offset_in_block + data.len() <= block_bytes);
        let (root, height) = {
            let record = &self.volumes[&id];
            (record.root, record.height)
        };
        let leaf = self.leaf_for_write(root, height, NodeKind::VolumeData, index)?;
        let slot = self.geometry.slot(index, 0);
        let entry = self.entry(leaf, slot);
        // Set before the write: this path holds the state lock, which a
        // commit needs, so the commit that clears it comes after the write.
        self.data_dirty.store(true, Ordering::Release);
        if !entry.is_empty() && !entry.is_shared() {
            let offset = self.block_offset(entry.addr()) + offset_in_block as u64;
            return self.device.write_at(data, offset).map_err(|e| {
                Error::io(
                    format!(
                        "cannot write data at {} of {}",
                        entry.addr(),
                        self.device.describe()
                    ),
                    e,
                )
            });
        }
        // Read the old contents before allocating, so a failed read leaves
        // nothing behind.
        let merged = if data.len() == block_bytes {
            None
        } else {
            let mut merged = vec![0u8; block_bytes];
            if !entry.is_empty() {
                self.read_block(entry.addr(), &mut merged, "data")?;
            }
            merged[offset_in_block..offset_in_block + data.len()].copy_from_slice(data);
            Some(merged)
        };
        let new_block = self.alloc.allocate(BlockUse::Data)?;
        let result = self.write_device_block(new_block, merged.as_deref().unwrap_or(data), "data");
        if let Err(e) = result {
            self.alloc.free(new_block);
            return Err(e);
        }
        self.set_entry(leaf, slot, Entry::new(new_block, false));
        let record = self.volumes.get_mut(&id).expect("volume exists");
        record.exclusive_blocks += 1;
        if entry.is_empty() {
            record.referenced_blocks += 1;
        }
        self.dirty_records.insert(id);
        Ok(())
    }

    /// Appends the mapped extents of blocks [first, end) below a node as
    /// (first block, block count), merging neighbours.
    pub fn mapped_blocks(
        &mut self,
        root: BlockAddr,
        height: u8,
        first: u64,
        end: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        self.mapped_below(root, height - 1, 0, first, end, out)
    }

    fn mapped_below(
        &mut self,
        addr: BlockAddr,
        level: u8,
        base: u64,
        first: u64,
        end: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let entries = self
            .load_node(addr, NodeKind::VolumeData, level)?
            .entries
            .clone();
        let span = self.geometry.span_blocks(level);
        for (slot, entry) in entries.iter().enumerate() {
            let child_first = base + slot as u64 * span;
            let child_end = child_first + span;
            if entry.is_empty() || child_end <= first || child_first >= end {
                continue;
            }
            if level == 0 {
                match out.last_mut() {
                    Some((start, count)) if *start + *count == child_first => *count += 1,
                    _ => out.push((child_first, 1)),
                }
            } else {
                self.mapped_below(entry.addr(), level - 1, child_first, first, end, out)?;
            }
        }
        Ok(())
    }

    // ----- volumes -----

    pub fn volume_by_name(&self, name: &str) -> Result<&VolumeRecord> {
        self.names
            .get(name)
            .map(|id| &self.volumes[id])
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("no volume named {name:?} in this pool"),
                )
            })
    }

    pub fn volume_by_id(&self, id: VolumeId) -> Result<&VolumeRecord> {
        self.volumes.get(&id).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("{id} no longer exists (it was removed)"),
            )
        })
    }

    fn next_volume_id(&mut self) -> VolumeId {
        let id = self.superblock.next_volume_id;
        self.superblock.next_volume_id = VolumeId(id.0 + 1);
        id
    }

    fn add_record(&mut self, record: VolumeRecord) {
        self.names.insert(record.name.clone(), record.id);
        self.dirty_records.insert(record.id);
        self.volumes.insert(record.id, record);
    }

    /// A new empty volume: just an empty root node.
    pub fn create_volume(
        &mut self,
        name: &str,
        size_bytes: u64,
        now_unix_secs: u64,
    ) -> Result<VolumeId> {
        let height = self
            .geometry
            .height_for(self.geometry.blocks_for(size_bytes));
        let root = self.insert_new_node(Node::empty(
            NodeKind::VolumeData,
            height - 1,
            self.geometry.entries_per_node,
        ))?;
        let id = self.next_volume_id();
        self.add_record(VolumeRecord {
            id,
            parent: VolumeId::NONE,
            size_bytes,
            root,
            height,
            kind: VolumeKind::Volume,
            name: name.to_string(),
            created_unix_secs: now_unix_secs,
            referenced_blocks: 0,
            exclusive_blocks: 0,
        });
        Ok(id)
    }

    /// A snapshot or clone of `source`: a copy of its root with every entry
    /// marked shared in both roots. O(1) whatever the volume's size.
    pub fn snapshot(
        &mut self,
        source: VolumeId,
        name: &str,
        kind: VolumeKind,
        now_unix_secs: u64,
    ) -> Result<VolumeId> {
        assert_ne!(kind, VolumeKind::Volume);
        let source_record = self.volumes[&source].clone();
        let level = source_record.height - 1;
        let original = self.load_node(source_record.root, NodeKind::VolumeData, level)?;
        let shared_root = Node {
            kind: NodeKind::VolumeData,
            level,
            entries: original.entries.iter().map(|e| e.as_shared()).collect(),
        };
        let new_root = self.insert_new_node(shared_root.clone())?;
        self.nodes.insert(source_record.root, shared_root);
        self.dirty_nodes.insert(source_record.root);
        let source_mut = self.volumes.get_mut(&source).expect("source exists");
        source_mut.exclusive_blocks = 0;
        self.dirty_records.insert(source);
        let id = self.next_volume_id();
        self.add_record(VolumeRecord {
            id,
            parent: source,
            size_bytes: source_record.size_bytes,
            root: new_root,
            height: source_record.height,
            kind,
            name: name.to_string(),
            created_unix_secs: now_unix_secs,
            referenced_blocks: source_record.referenced_blocks,
            exclusive_blocks: 0,
        });
        Ok(id)
    }

    /// Removes a volume: frees what only it used; its children move up to
    /// its parent. Shared blocks that nobody uses any more are left for the
    /// garbage collector. Returns the bytes freed.
    pub fn remove_volume(&mut self, id: VolumeId) -> Result<u64> {
        let record = self.volumes[&id].clone();
        let mut dropped = Dropped::default();
        self.collect_subtree(
            Entry::new(record.root, false),
            Some(record.height - 1),
            true,
            &mut dropped,
        )?;
        for addr in std::mem::take(&mut dropped.to_free) {
            self.free_block(addr);
        }
        let children: Vec<VolumeId> = self
            .volumes
            .values()
            .filter(|v| v.parent == id)
            .map(|v| v.id)
            .collect();
        for child in children {
            self.volumes.get_mut(&child).expect("child exists").parent = record.parent;
            self.dirty_records.insert(child);
        }
        self.volumes.remove(&id);
        self.names.remove(&record.name);
        self.dirty_records.insert(id);
        Ok(dropped.exclusive_blocks * self.geometry.block_bytes())
    }

    pub fn rename_volume(&mut self, id: VolumeId, new_name: &str) {
        let record = self.volumes.get_mut(&id).expect("volume exists");
        let old = std::mem::replace(&mut record.name, new_name.to_string());
        self.names.remove(&old);
        self.names.insert(new_name.to_string(), id);
        self.dirty_records.insert(id);
    }

    /// Grows or shrinks a volume. Shrinking unmaps the blocks past the new
    /// end. Growing first zeroes the bytes past the old end in its last
    /// block (a shrink leaves them as they were: until a grow they are past
    /// the end, where nothing can read them, so a crash during the shrink
    /// cannot show them zeroed), then adds levels above the root when the
    /// tree cannot address the new size.
    pub fn resize_volume(&mut self, id: VolumeId, new_size_bytes: u64) -> Result<()> {
        let record = self.volumes[&id].clone();
        let block_bytes = self.geometry.block_bytes();
        if new_size_bytes < record.size_bytes {
            let keep_blocks = self.geometry.blocks_for(new_size_bytes);
            self.unmap(id, keep_blocks, self.geometry.blocks_for(record.size_bytes))?;
        } else {
            let tail = record.size_bytes % block_bytes;
            if tail != 0 {
                let last = record.size_bytes / block_bytes;
                let entry = self.lookup(record.root, record.height, NodeKind::VolumeData, last)?;
                if !entry.is_empty() {
                    let zeros = vec![0u8; (block_bytes - tail) as usize];
                    self.write_block(id, last, tail as usize, &zeros)?;
                }
            }
            let wanted = self
                .geometry
                .height_for(self.geometry.blocks_for(new_size_bytes));
            let mut root = record.root;
            for level in record.height..wanted {
                let mut node =
                    Node::empty(NodeKind::VolumeData, level, self.geometry.entries_per_node);
                node.entries[0] = Entry::new(root, false);
                root = self.insert_new_node(node)?;
            }
            let record = self.volumes.get_mut(&id).expect("volume exists");
            record.root = root;
            record.height = record.height.max(wanted);
        }
        self.volumes.get_mut(&id).expect("volume exists").size_bytes = new_size_bytes;
        self.dirty_records.insert(id);
        Ok(())
    }

    // ----- the volume table -----

    /// Checks that a root pointer read from disk names a usable block: in
    /// the data area and not an allocation map.
    fn check_root(&self, addr: BlockAddr, what: &str) -> Result<()> {
        let data_start = self.superblock.data_start.0;
        if addr.0 < data_start
            || addr.0 >= self.alloc.store_end()
            || (addr.0 - data_start).is_multiple_of(self.superblock.group_blocks)
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
        for record in self.volumes.values() {
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
            if record.parent != VolumeId::NONE && !self.volumes.contains_key(&record.parent) {
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
        let entries = self
            .load_node(addr, NodeKind::VolumeTable, level)?
            .entries
            .clone();
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
            match self.volumes.get(&id) {
                Some(record) => record.encode(&mut block[start..start + RECORD_BYTES]),
                None => block[start..start + RECORD_BYTES].fill(0),
            }
        }
        Ok(touched
            .into_iter()
            .map(|(index, addr)| (addr, self.record_blocks[&index].clone()))
            .collect())
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
            node.entries[0] = Entry::new(self.superblock.volume_table_root, false);
            self.superblock.volume_table_root = self.insert_new_node(node)?;
            self.superblock.volume_table_height += 1;
        }
        let height = self.superblock.volume_table_height;
        let leaf = self.leaf_for_write(
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
        self.set_entry(leaf, slot, Entry::new(addr, false));
        Ok(addr)
    }

    // ----- commit -----

    pub fn has_changes(&self) -> bool {
        !self.dirty_nodes.is_empty() || !self.dirty_records.is_empty() || self.alloc.has_changes()
    }

    /// Dirty metadata that the next commit must write; the write path
    /// commits on its own once this passes `auto_commit_blocks`, so that
    /// a transaction always fits in the journal.
    pub fn pending_commit_blocks(&self) -> u64 {
        (self.dirty_nodes.len() + self.dirty_records.len() + self.alloc.change_count()) as u64
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

    /// Makes every change so far durable through the journal. Returns the
    /// blocks this commit freed; the caller makes them reusable once no
    /// reader can still be using them.
    ///
    /// Order (ordered mode): data first, then the transaction that maps it,
    /// then the metadata blocks at home. Replay redoes the last step.
    pub fn commit(&mut self) -> Result<Vec<BlockAddr>> {
        if self.data_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.flush_device("data") {
                self.data_dirty.store(true, Ordering::Release);
                return Err(e);
            }
        }
        if !self.has_changes() {
            return Ok(Vec::new());
        }
        let dirty_ids = self.dirty_records.clone();
        match self.write_transactions() {
            Ok(frees) => Ok(frees),
            Err(e) => {
                // Nothing was sealed: what was dirty stays dirty, so a retry
                // after the fault clears writes all of it again.
                self.dirty_records.extend(dirty_ids);
                Err(e)
            }
        }
    }

    fn write_transactions(&mut self) -> Result<Vec<BlockAddr>> {
        let block_size = self.geometry.block_size_bytes as usize;
        // The table first: it may allocate nodes and blocks, which must ride
        // in this same transaction.
        let mut writes = self.persist_volume_table()?;
        for &addr in &self.dirty_nodes {
            let mut block = vec![0u8; block_size];
            self.nodes[&addr].encode(&mut block);
            writes.push((addr, block));
        }
        self.grow_device_to_store()?;
        let roots = Roots {
            volume_table_root: self.superblock.volume_table_root,
            volume_table_height: self.superblock.volume_table_height,
            next_volume_id: self.superblock.next_volume_id,
            group_count: self.alloc.group_count(),
        };
        // Allocations must be durable with the tree that uses them; frees
        // may trail in later transactions (a crash between leaks blocks,
        // which check --repair and the GC reclaim, and never frees a block
        // still in use).
        let mut extents = self.alloc.pending_extents();
        extents.sort_by_key(|e| e.change == AllocChange::Freed);
        let (homes, images): (Vec<BlockAddr>, Vec<Vec<u8>>) = writes.into_iter().unzip();
        if cfg!(feature = "unsafe-no-journal") {
            return self.commit_in_place_unsafely(roots, homes, images);
        }
        let first_extents = self.extents_that_fit(images.len(), &extents);
        if extents[..first_extents]
            .iter()
            .filter(|e| e.change != AllocChange::Freed)
            .count()
            != extents
                .iter()
                .filter(|e| e.change != AllocChange::Freed)
                .count()
        {
            return Err(Error::new(
                ErrorKind::NoSpace,
                "the transaction is larger than the journal can hold; commit more often",
            ));
        }
        self.append_transaction(
            roots,
            homes.clone(),
            &images,
            extents[..first_extents].to_vec(),
        )?;
        // Durable: the rest is bookkeeping and write-back.
        self.dirty_nodes.clear();
        let sealed = self.alloc.seal();
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
        for (home, image) in homes.into_iter().zip(images) {
            // A failed write-back is kept and retried by the checkpoint,
            // which must not move the journal past it; until then replay
            // would redo it.
            match self.write_device_block(home, &image, "metadata") {
                Ok(()) => {
                    self.unwritten_homes.remove(&home);
                }
                Err(_) => {
                    self.unwritten_homes.insert(home, image);
                }
            }
        }
        // Frees that did not fit trail in free-only transactions. If one
        // cannot be written the commit still stands: the durable maps already
        // hold the frees and the next checkpoint writes them; a crash before
        // that only leaks the blocks, which check --repair reclaims.
        let mut frees_durable = true;
        let mut rest = &extents[first_extents..];
        while !rest.is_empty() {
            let count = self.extents_that_fit(0, rest).max(1);
            if self
                .append_transaction(roots, Vec::new(), &[], rest[..count].to_vec())
                .is_err()
            {
                // These frees are not in the journal: a block among them
                // that held a journaled node must not be reused before a
                // checkpoint, or replay could write the node over new data.
                // Keeping them all pending (until the pool is reopened) is
                // safe; it only holds the space back.
                frees_durable = false;
                break;
            }
            rest = &rest[count..];
        }
        if self.journal.wants_checkpoint() {
            // Opportunistic: if it fails, the next commit tries again.
            let _ = self.checkpoint();
        }
        Ok(if frees_durable {
            sealed.frees
        } else {
            Vec::new()
        })
    }

    /// For benchmarks only (feature `unsafe-no-journal`): the commit with
    /// no journal, metadata written in place and one flush. A crash can
    /// leave it inconsistent; it exists to measure what the journal costs.
    fn commit_in_place_unsafely(
        &mut self,
        roots: Roots,
        homes: Vec<BlockAddr>,
        images: Vec<Vec<u8>>,
    ) -> Result<Vec<BlockAddr>> {
        for (home, image) in homes.iter().zip(&images) {
            self.write_device_block(*home, image, "metadata")?;
        }
        self.dirty_nodes.clear();
        let sealed = self.alloc.seal();
        for (addr, block) in self.alloc.dirty_maps(self.geometry.block_size_bytes) {
            self.write_device_block(addr, &block, "allocation map")?;
        }
        self.alloc.mark_maps_clean();
        self.flush_device("metadata")?;
        self.committed_roots = roots;
        Ok(sealed.frees)
    }

    /// How many of `extents` fit in one transaction beside `images` images.
    fn extents_that_fit(&self, images: usize, extents: &[AllocExtent]) -> usize {
        let block = self.geometry.block_size_bytes as usize;
        let max_blocks = self.journal.max_transaction_blocks() as usize;
        let descriptor_blocks_max = max_blocks.saturating_sub(images);
        let budget_bytes = descriptor_blocks_max * block;
        let fixed = Descriptor::encoded_len(images, 0);
        let per_extent = Descriptor::encoded_len(0, 1) - Descriptor::encoded_len(0, 0);
        (budget_bytes.saturating_sub(fixed) / per_extent).min(extents.len())
    }

    fn append_transaction(
        &mut self,
        roots: Roots,
        homes: Vec<BlockAddr>,
        images: &[Vec<u8>],
        extents: Vec<AllocExtent>,
    ) -> Result<()> {
        let block = self.geometry.block_size_bytes as usize;
        let mut images_crc = 0u32;
        for image in images {
            images_crc = crc32c::crc32c_append(images_crc, image);
        }
        let descriptor = Descriptor {
            sequence: self.journal.sequence(),
            pool_uuid: self.superblock.pool_uuid,
            descriptor_blocks: Descriptor::encoded_len(homes.len(), extents.len()).div_ceil(block)
                as u32,
            images_crc,
            roots,
            homes,
            extents,
        };
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
        !self.journal.is_empty() || self.alloc.has_dirty_maps() || !self.unwritten_homes.is_empty()
    }

    /// Makes the metadata written home durable, writes the allocation maps,
    /// and moves the journal's replay start up in a new superblock. After a
    /// checkpoint, replay has nothing to do.
    pub fn checkpoint(&mut self) -> Result<()> {
        for (home, image) in &self.unwritten_homes {
            self.write_device_block(*home, image, "metadata")?;
        }
        self.unwritten_homes.clear();
        self.flush_device("metadata")?;
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

    /// Redoes every complete transaction after the last checkpoint, then
    /// checkpoints, so the next open finds an empty journal. Replaying twice
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
            for (home, image) in transaction.descriptor.homes.iter().zip(&transaction.images) {
                let data_start = self.superblock.data_start.0;
                if home.0 < data_start
                    || home.0 >= store_end
                    || (home.0 - data_start).is_multiple_of(self.superblock.group_blocks)
                {
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
            self.committed_roots = roots;
        }
        self.alloc.finish_replay();
        self.grow_device_to_store()?;
        self.checkpoint()?;
        Ok(transactions.len())
    }
}
