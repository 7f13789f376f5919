//! Radix-tree volumes with exact sharing (RSnap trees, dm-thin counts).
//!
//! Every block that a tree entry points at has a reference count: one per
//! entry (or volume record) that points at it, kept as "extra references"
//! in `Shares`. A block with no extra references belongs to whoever points
//! at it and may be changed in place; a shared one is copied first
//! (dedicate-on-write), and the copy takes a reference on each child.
//! Dropping the last reference frees a block and drops its children in
//! turn, so space comes back exactly, whatever the order of removals.
//!
//! Every entry also carries its birth generation. A change anywhere in a
//! subtree makes every entry on the path to it born now, so the changes
//! since generation G are exactly the entries born after G.

use std::collections::HashMap;

use crate::error::{Error, ErrorKind, Result};
use crate::format::node::{Entry, Node, NodeKind};
use crate::space::Release;
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};
use crate::write;

/// (node, slot) pairs from a root down to the parent of a leaf node: the
/// entries whose birth a change below must renew.
pub(crate) type Path = Vec<(BlockAddr, usize)>;

/// What dropping references found; applied only once the walk succeeded,
/// so a damaged node found halfway leaves the counts untouched.
#[derive(Default)]
pub(crate) struct Dropped {
    /// Data blocks the tree no longer maps.
    pub referenced_blocks: u64,
    /// Blocks whose last reference went: freed, data and nodes.
    pub to_free: Vec<BlockAddr>,
    /// Shared blocks that lose references, and how many.
    pub decrements: HashMap<BlockAddr, u32>,
}

impl State {
    /// The level-0 entry for logical block `index`, or a hole. Read-only:
    /// it copies nothing. Visits exactly one node per level down to the
    /// first hole, whatever the volume's ancestry.
    pub fn lookup(
        &mut self,
        root: BlockAddr,
        height: u8,
        kind: NodeKind,
        index: u64,
    ) -> Result<Entry> {
        let mut addr = root;
        for level in (0..height).rev() {
            self.count_node_visit();
            let slot = self.geometry().slot(index, level);
            let entry = self.load_node(addr, kind, level)?.entries[slot];
            if level == 0 || entry.is_empty() {
                return Ok(entry);
            }
            addr = entry.addr();
        }
        unreachable!("height is at least 1")
    }

    /// Where the data of `count` logical blocks from `first` is, in order,
    /// appended to `out`: each block's level-0 entry, or [`Entry::EMPTY`]
    /// under a hole higher up (so the births of holes are not kept: this
    /// is for readers, who ask only where data is). One walk per leaf
    /// rather than one per block, so a 1 MiB read of 4 KiB blocks holds
    /// the state lock for one walk, not 256.
    pub fn lookup_run(
        &mut self,
        root: BlockAddr,
        height: u8,
        kind: NodeKind,
        first: u64,
        count: u64,
        out: &mut Vec<Entry>,
    ) -> Result<()> {
        let per_leaf = self.geometry().entries_per_node as u64;
        let end = first.checked_add(count).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("blocks {first} and {count} more run past the largest index"),
            )
        })?;
        let wanted = out.len() + count as usize;
        let mut index = first;
        while index < end {
            let leaf_end = (index / per_leaf)
                .saturating_add(1)
                .saturating_mul(per_leaf);
            let span = (leaf_end.min(end) - index) as usize;
            self.leaf_entries(root, height, kind, index, span, out)?;
            index += span as u64;
        }
        assert_eq!(out.len(), wanted, "one entry per block");
        Ok(())
    }

    /// `span` entries from logical block `index`, all in one leaf's range.
    fn leaf_entries(
        &mut self,
        root: BlockAddr,
        height: u8,
        kind: NodeKind,
        index: u64,
        span: usize,
        out: &mut Vec<Entry>,
    ) -> Result<()> {
        let mut addr = root;
        for level in (0..height).rev() {
            self.count_node_visit();
            let slot = self.geometry().slot(index, level);
            let node = self.load_node(addr, kind, level)?;
            if level == 0 {
                let entries = node.entries.get(slot..slot + span).ok_or_else(|| {
                    Error::corrupt(format!(
                        "radix node at {addr} is damaged: {} entries, {span} wanted from slot {slot}",
                        node.entries.len()
                    ))
                })?;
                out.extend_from_slice(entries);
                return Ok(());
            }
            let entry = node.entries[slot];
            if entry.is_empty() {
                out.extend(std::iter::repeat_n(Entry::EMPTY, span));
                return Ok(());
            }
            addr = entry.addr();
        }
        unreachable!("height is at least 1")
    }

    /// The block holding logical block `index` if its volume may write it
    /// in place: no node on the path and not the block itself is shared,
    /// and the block was born after the volume's last snapshot point (so
    /// that every change since a snapshot, even one since removed, shows
    /// as a newer birth).
    pub fn lookup_writable_in_place(
        &mut self,
        root: BlockAddr,
        height: u8,
        index: u64,
        share_floor_generation: u64,
    ) -> Result<Option<BlockAddr>> {
        let mut addr = root;
        for level in (0..height).rev() {
            self.count_node_visit();
            if self.space_map().is_shared(addr) {
                return Ok(None);
            }
            let slot = self.geometry().slot(index, level);
            let entry = self.load_node(addr, NodeKind::VolumeData, level)?.entries[slot];
            if entry.is_empty() {
                return Ok(None);
            }
            if level == 0 {
                let writable =
                    write::may_write_in_place(entry, share_floor_generation, self.space_map());
                return Ok(writable.then_some(entry.addr()));
            }
            addr = entry.addr();
        }
        unreachable!("height is at least 1")
    }

    /// The generation new entries are born in (0 for the volume table,
    /// whose entries carry no history).
    fn birth_now(&self, kind: NodeKind) -> u64 {
        match kind {
            NodeKind::VolumeData => self.superblock().birth_generation,
            NodeKind::VolumeTable => 0,
        }
    }

    /// Makes `parent`'s child at `slot` (a level-`child_level` node) this
    /// tree's own: creates it if missing, copies it if shared
    /// (dedicate-on-write). Returns the child's address.
    pub(crate) fn dedicate_child(
        &mut self,
        parent: BlockAddr,
        slot: usize,
        kind: NodeKind,
        child_level: u8,
    ) -> Result<BlockAddr> {
        let entry = self.entry(parent, slot);
        let birth = self.birth_now(kind);
        let child = if entry.is_empty() {
            let empty = Node::empty(kind, child_level, self.geometry().entries_per_node);
            self.insert_new_node(empty)?
        } else if self.space_map().is_shared(entry.addr()) {
            // The copy points at every child the original does, so each
            // child gains a reference, and the original loses ours.
            let copy = self.load_node(entry.addr(), kind, child_level)?.clone();
            self.reference_children(&copy)?;
            let released = self.release_reference(entry.addr());
            debug_assert_eq!(released, Release::Shared, "a shared node was freed");
            self.insert_new_node(copy)?
        } else {
            self.load_node(entry.addr(), kind, child_level)?;
            return Ok(entry.addr());
        };
        self.set_entry(parent, slot, Entry::new(child, birth));
        Ok(child)
    }

    /// Takes one more reference on every child of `node` (a copy of it is
    /// about to point at them too).
    pub(crate) fn reference_children(&mut self, node: &Node) -> Result<()> {
        for entry in node.entries.iter().filter(|e| !e.is_empty()) {
            self.space_map_mut().take_reference(entry.addr())?;
        }
        Ok(())
    }

    /// Makes the whole path from `root` to the level-0 node covering `index`
    /// this tree's own and returns that node, with the path above it. The
    /// root itself always belongs to its tree alone.
    pub(crate) fn leaf_for_write(
        &mut self,
        root: BlockAddr,
        height: u8,
        kind: NodeKind,
        index: u64,
    ) -> Result<(BlockAddr, Path)> {
        let mut addr = root;
        let mut path = Vec::with_capacity(usize::from(height));
        self.load_node(addr, kind, height - 1)?;
        for level in (1..height).rev() {
            let slot = self.geometry().slot(index, level);
            path.push((addr, slot));
            addr = self.dedicate_child(addr, slot, kind, level - 1)?;
        }
        Ok((addr, path))
    }

    /// Renews the births on `path`: something below changed now.
    pub(crate) fn touch_path(&mut self, path: &Path) {
        let now = self.superblock().birth_generation;
        for &(node, slot) in path {
            let entry = self.entry(node, slot);
            if entry.birth() < now {
                self.set_entry(node, slot, entry.with_birth(now));
            }
        }
    }

    /// Drops one reference to the block at `addr` (a level-`level` node, or
    /// a data block for None). While others remain only the count goes
    /// down; the last one frees the block and drops its children in turn.
    /// Either way the data blocks below leave this tree's view, and are
    /// counted in `dropped.referenced_blocks`.
    pub(crate) fn drop_reference(
        &mut self,
        addr: BlockAddr,
        level: Option<u8>,
        dropped: &mut Dropped,
    ) -> Result<()> {
        let pending = dropped.decrements.get(&addr).copied().unwrap_or(0);
        // Others than this one point at it, past those this drop released.
        let others = self.space_map().references(addr) - 1;
        if others > pending {
            // Shared: only counted, its subtree stays for the others.
            dropped.referenced_blocks += self.count_mapped(addr, level)?;
            *dropped.decrements.entry(addr).or_default() += 1;
            return Ok(());
        }
        match level {
            None => dropped.referenced_blocks += 1,
            Some(level) => {
                let children = self.node_entries(addr, NodeKind::VolumeData, level)?;
                for child in children.iter().filter(|e| !e.is_empty()) {
                    self.drop_reference(child.addr(), level.checked_sub(1), dropped)?;
                }
            }
        }
        dropped.to_free.push(addr);
        Ok(())
    }

    /// Applies what `drop_reference` found.
    pub(crate) fn apply_dropped(&mut self, dropped: Dropped) {
        // The counts first: each block in `to_free` is then at its last
        // reference, and the space map frees it.
        for (addr, count) in dropped.decrements {
            for _ in 0..count {
                self.release_reference(addr);
            }
        }
        for addr in dropped.to_free {
            self.release_reference(addr);
        }
    }

    /// Data blocks mapped below `addr` (a level-`level` node, or one data
    /// block for None).
    pub(crate) fn count_mapped(&mut self, addr: BlockAddr, level: Option<u8>) -> Result<u64> {
        let Some(level) = level else { return Ok(1) };
        let entries = self.node_entries(addr, NodeKind::VolumeData, level)?;
        let mut count = 0;
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            count += self.count_mapped(entry.addr(), level.checked_sub(1))?;
        }
        Ok(count)
    }

    /// Unmaps logical blocks [first, end) below the level-`level` node at
    /// `addr` (which this tree owns), whose first block is `base`. The
    /// entries it clears become holes born now. Returns whether anything
    /// changed, so the caller renews its own entry's birth.
    fn unmap_below(
        &mut self,
        addr: BlockAddr,
        level: u8,
        base: u64,
        first: u64,
        end: u64,
        dropped: &mut Dropped,
    ) -> Result<bool> {
        let now = self.superblock().birth_generation;
        let span = self.geometry().span_blocks(level);
        let first_slot = ((first.max(base) - base) / span) as usize;
        let last_slot = (((end - 1).min(base + span * self.geometry().entries_per_node as u64 - 1)
            - base)
            / span) as usize;
        let mut changed = false;
        for slot in first_slot..=last_slot {
            let entry = self.entry(addr, slot);
            if entry.is_empty() {
                continue;
            }
            let child_first = base + slot as u64 * span;
            let child_end = child_first + span;
            if first <= child_first && child_end <= end {
                self.drop_reference(entry.addr(), level.checked_sub(1), dropped)?;
                self.set_entry(addr, slot, Entry::hole(now));
                changed = true;
            } else {
                // Only part of this child goes: it is a node (level > 0,
                // since a data entry covers one block and is either in the
                // range or not).
                let child = self.dedicate_child(addr, slot, NodeKind::VolumeData, level - 1)?;
                // A copy made for this tree is born now even if nothing
                // below changes (the range held only holes): the entries
                // above it must not be older than it.
                let copied = child != entry.addr();
                if self.unmap_below(child, level - 1, child_first, first, end, dropped)? || copied {
                    let entry = self.entry(addr, slot);
                    self.set_entry(addr, slot, entry.with_birth(now));
                    changed = true;
                }
            }
        }
        Ok(changed)
    }

    /// Unmaps blocks [first, end) of a volume and frees what only it used.
    pub fn unmap(&mut self, id: VolumeId, first: u64, end: u64) -> Result<()> {
        let record = self.live_record(id).clone();
        let end = end.min(self.geometry().capacity_blocks(record.height));
        if first >= end {
            return Ok(());
        }
        let mut dropped = Dropped::default();
        self.load_node(record.root, NodeKind::VolumeData, record.height - 1)?;
        self.unmap_below(record.root, record.height - 1, 0, first, end, &mut dropped)?;
        let unmapped = dropped.referenced_blocks;
        self.apply_dropped(dropped);
        // Saturating: a damaged (but checksummed) record must not panic.
        self.volume_table_mut().update(id, |record| {
            record.referenced_blocks = record.referenced_blocks.saturating_sub(unmapped);
        });
        Ok(())
    }

    /// Writes `data` into logical block `index` of a volume at `offset`
    /// inside the block, under the state lock (resize, zeroing a partial
    /// block, and `install`'s retry), through the same three steps as
    /// `Volume::write_at` (see `write.rs`): in place when the volume may,
    /// else into a new block (a partial one merged with the old contents)
    /// mapped in place of the old one.
    pub fn write_block(
        &mut self,
        id: VolumeId,
        index: u64,
        offset_in_block: usize,
        data: &[u8],
    ) -> Result<()> {
        let block_bytes = self.geometry().block_bytes();
        assert!(offset_in_block as u64 + data.len() as u64 <= block_bytes);
        let record = self.live_record(id).clone();
        let offset = index * block_bytes + offset_in_block as u64;
        let plan = write::plan(self, &record, offset, data.len())?;
        debug_assert!(
            plan.allocations.len() <= 1 && plan.direct.len() <= 1,
            "one block"
        );
        // Set before the write: this path holds the state lock, which a
        // commit needs, so the commit that clears it comes after the write.
        // It may map a new block (install, below).
        self.note_data_mapped();
        let device = std::sync::Arc::clone(self.device());
        if let Err(e) = write::run(device.as_ref(), block_bytes, data, &plan) {
            plan.free_allocations(self);
            return Err(e);
        }
        write::install(self, id, data, &plan.allocations)
    }

    /// Maps a data block that a write filled outside the state lock (see
    /// `Volume::write_at`) at `index` of volume `id`, if the entry there is
    /// still `old`, the one the block's contents were merged from. Returns
    /// false, changing no entry, if a write in between changed it: the
    /// caller then frees the block and writes again under the lock.
    pub fn install_written_block(
        &mut self,
        id: VolumeId,
        index: u64,
        old: Entry,
        new_block: BlockAddr,
    ) -> Result<bool> {
        // Not cloned: a record carries its name, and this runs per write.
        let record = self.volume_by_id(id)?;
        let (root, height) = (record.root, record.height);
        if !record.kind.is_writable() || index >= self.geometry().blocks_for(record.size_bytes) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "volume {:?} changed during the write (made read-only or shrunk)",
                    record.name
                ),
            ));
        }
        let (leaf, path) = self.leaf_for_write(root, height, NodeKind::VolumeData, index)?;
        let slot = self.geometry().slot(index, 0);
        let entry = self.entry(leaf, slot);
        if entry != old {
            return Ok(false);
        }
        // The data landed before this; the commit that makes the mapping
        // durable must flush it first.
        self.note_data_mapped();
        self.map_new_block(id, leaf, slot, &path, entry, new_block)?;
        Ok(true)
    }

    /// Points entry `slot` of `leaf` (reached by `path`) at `new_block`, born
    /// now, in place of `old`, and gives back the reference `old` held.
    fn map_new_block(
        &mut self,
        id: VolumeId,
        leaf: BlockAddr,
        slot: usize,
        path: &Path,
        old: Entry,
        new_block: BlockAddr,
    ) -> Result<()> {
        let now = self.superblock().birth_generation;
        self.set_entry(leaf, slot, Entry::new(new_block, now));
        self.touch_path(path);
        if old.is_empty() {
            self.volume_table_mut()
                .update(id, |record| record.referenced_blocks += 1);
        } else {
            // A data block has no children to walk (what `drop_reference`
            // does for a node): its count goes down, or it is freed.
            self.release_reference(old.addr());
        }
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

    pub(crate) fn mapped_below(
        &mut self,
        addr: BlockAddr,
        level: u8,
        base: u64,
        first: u64,
        end: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let entries = self.node_entries(addr, NodeKind::VolumeData, level)?;
        let span = self.geometry().span_blocks(level);
        for (slot, entry) in entries.iter().enumerate() {
            let child_first = base + slot as u64 * span;
            let child_end = child_first.saturating_add(span);
            if entry.is_empty() || child_end <= first || child_first >= end {
                continue;
            }
            if level == 0 {
                push_extent(out, child_first, 1);
            } else {
                self.mapped_below(entry.addr(), level - 1, child_first, first, end, out)?;
            }
        }
        Ok(())
    }
}

/// Appends blocks [first, first + count) to a sorted extent list, merging
/// with the last extent when they touch.
pub(crate) fn push_extent(out: &mut Vec<(u64, u64)>, first: u64, count: u64) {
    match out.last_mut() {
        Some((start, length)) if *start + *length == first => *length += count,
        _ => out.push((first, count)),
    }
}
