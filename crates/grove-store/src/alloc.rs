//! The block allocator: the in-memory copy of every group's nibble map, with
//! next-fit allocation that scans circularly from where the last one ended
//! (RSnap §4.3), so a volume written sequentially gets contiguous blocks.

use crate::error::{Error, ErrorKind, Result};
use crate::format::group::{
    self, DecodedMap, GROUP_HEADER_BLOCKS, NIBBLE_ALLOCATED, NIBBLE_META, NIBBLE_PENDING_FREE,
};
use crate::format::journal::{AllocChange, AllocExtent};
use crate::format::node::ENTRY_ADDR_MASK;
use crate::types::{AddrHasher, BlockAddr};
use std::hash::BuildHasherDefault;

/// What a block is used for; kept in the nibble map for the checker and GC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockUse {
    Data,
    Meta,
}

/// Four bits per block, two blocks a byte: block i is the low nibble of
/// byte i / 2 when i is even, the high nibble when odd (as in the map block).
#[derive(Clone)]
struct Nibbles(Vec<u8>);

impl Nibbles {
    fn from_unpacked(unpacked: &[u8]) -> Nibbles {
        let mut packed = Nibbles(vec![0u8; unpacked.len().div_ceil(2)]);
        for (i, &nibble) in unpacked.iter().enumerate() {
            packed.set(i, nibble);
        }
        packed
    }

    fn get(&self, i: usize) -> u8 {
        (self.0[i / 2] >> (4 * (i % 2))) & 0xf
    }

    fn set(&mut self, i: usize, nibble: u8) {
        debug_assert!(nibble <= 0xf);
        let shift = 4 * (i % 2);
        let byte = &mut self.0[i / 2];
        *byte = (*byte & !(0xf << shift)) | (nibble << shift);
    }

    fn unpacked(&self, count: usize) -> Vec<u8> {
        (0..count).map(|i| self.get(i)).collect()
    }

    /// The first free slot (nibble 0) in `range`.
    fn first_free(&self, range: std::ops::Range<usize>) -> Option<usize> {
        range.into_iter().find(|&i| self.get(i) == 0)
    }
}

struct Group {
    /// The live state of every block, including changes no commit has made
    /// durable yet; packed, half a byte per block.
    nibbles: Nibbles,
    free_blocks: u64,
    data_blocks: u64,
    meta_blocks: u64,
    /// The state as of the last sealed transaction, kept only for a group
    /// changed since the last checkpoint: checkpoints write this copy, never
    /// the live one, so a map on disk never shows an allocation or a free
    /// that no durable commit made. A group without one is on disk as the
    /// live state says, less the changes not sealed yet (`durable_base`).
    durable: Option<Nibbles>,
    /// Slots the capacity lets this group use: all of them, except in the
    /// last group of a pool whose capacity ends inside it.
    usable_slots: usize,
    /// Which share-count blocks hold counts on disk (bit k = block k); part
    /// of the map block's header.
    shares_present: u8,
}

impl Group {
    fn new_empty(group_blocks: u64, usable_slots: usize) -> Group {
        let mut nibbles = vec![0u8; group_blocks as usize];
        nibbles[..GROUP_HEADER_BLOCKS as usize].fill(NIBBLE_ALLOCATED | NIBBLE_META);
        let mut group = Group::from_nibbles(&nibbles, usable_slots, 0);
        // A new group's map must be written: it is dirty from the start.
        group.durable = Some(group.nibbles.clone());
        group
    }

    fn from_nibbles(unpacked: &[u8], usable_slots: usize, shares_present: u8) -> Group {
        let mut group = Group {
            nibbles: Nibbles::from_unpacked(unpacked),
            free_blocks: 0,
            data_blocks: 0,
            meta_blocks: 0,
            durable: None,
            usable_slots,
            shares_present,
        };
        group.recount(unpacked.len());
        group
    }

    /// Recomputes the counters from the nibbles (at open and after replay).
    fn recount(&mut self, group_blocks: usize) {
        self.free_blocks = 0;
        self.data_blocks = 0;
        self.meta_blocks = 0;
        for slot in 0..group_blocks {
            match self.nibbles.get(slot) {
                0 if slot < self.usable_slots => self.free_blocks += 1,
                NIBBLE_ALLOCATED => self.data_blocks += 1,
                n if n & NIBBLE_META != 0 => self.meta_blocks += 1,
                _ => {}
            }
        }
        debug_assert!(self.free_blocks <= self.usable_slots as u64);
    }

    /// Sets a live nibble, keeping the counters. The counters follow the
    /// nibbles (recounted at open, never read from disk), so one that
    /// would wrap is a bug in the engine, not damage: it panics.
    fn set(&mut self, slot: usize, nibble: u8) {
        let old = self.nibbles.get(slot);
        let usable = slot < self.usable_slots;
        let less = |counter: u64| counter.checked_sub(1).expect("group counter wraps");
        match old {
            0 if usable => self.free_blocks = less(self.free_blocks),
            NIBBLE_ALLOCATED => self.data_blocks = less(self.data_blocks),
            n if n & NIBBLE_META != 0 => self.meta_blocks = less(self.meta_blocks),
            _ => {}
        }
        match nibble {
            0 if usable => self.free_blocks += 1,
            NIBBLE_ALLOCATED => self.data_blocks += 1,
            n if n & NIBBLE_META != 0 => self.meta_blocks += 1,
            _ => {}
        }
        self.nibbles.set(slot, nibble);
        debug_assert_eq!(self.nibbles.get(slot), nibble);
        debug_assert!(self.free_blocks <= self.usable_slots as u64);
    }

    fn is_durable_dirty(&self) -> bool {
        self.durable.is_some()
    }
}

pub struct Allocator {
    data_start: u64,
    group_blocks: u64,
    /// Most blocks the data area may span (map blocks included); 0 means the
    /// store may grow while the host file system has room. The last group
    /// may be usable only in part.
    capacity_blocks: u64,
    groups: Vec<Group>,
    /// Groups that exist as of the last sealed transaction.
    durable_group_count: u64,
    /// Next-fit position: the block after the last one handed out.
    cursor: u64,
    /// Every allocation and free since the last seal, in order, with the
    /// block's nibble before it (to know the durable state).
    changes: Vec<(BlockAddr, AllocChange, u8)>,
    /// Blocks freed since the last seal. They stay unusable until the
    /// transaction that frees them is durable (consistency contract, point 5).
    open_frees: Vec<BlockAddr>,
    inconsistent_frees: u64,
    /// Data blocks handed to writes whose data is on its way and that are
    /// not mapped yet (`write.rs`): taken in memory, but in no transaction
    /// until the write maps them, so a crash meanwhile leaks nothing.
    reserved: std::collections::HashSet<BlockAddr, BuildHasherDefault<AddrHasher>>,
}

/// What one transaction changed in the allocation maps.
pub struct SealedChanges {
    pub extents: Vec<AllocExtent>,
    /// Blocks to make reusable once the transaction is durable.
    pub frees: Vec<BlockAddr>,
}

impl Allocator {
    /// An allocator over groups whose maps were already decoded.
    pub fn new(
        data_start: BlockAddr,
        group_blocks: u64,
        capacity_blocks: u64,
        maps: Vec<DecodedMap>,
    ) -> Allocator {
        let groups: Vec<Group> = maps
            .into_iter()
            .enumerate()
            .map(|(index, map)| {
                let usable = usable_slots(group_blocks, capacity_blocks, index as u64);
                Group::from_nibbles(&map.nibbles, usable, map.shares_present)
            })
            .collect();
        Allocator {
            data_start: data_start.0,
            group_blocks,
            capacity_blocks,
            durable_group_count: groups.len() as u64,
            groups,
            cursor: data_start.0,
            changes: Vec::new(),
            open_frees: Vec::new(),
            inconsistent_frees: 0,
            reserved: std::collections::HashSet::default(),
        }
    }

    /// Checks the maps against the capacity: no block past it may be in
    /// use (a capacity lowered below what is in use, by damage or by hand,
    /// would hand out nothing there but keep what is there unaccounted).
    /// Says which block, and the bound, if one is.
    pub fn check_capacity(&self) -> std::result::Result<(), String> {
        for (index, group) in self.groups.iter().enumerate() {
            let slots = self.group_blocks as usize;
            if let Some(slot) =
                (group.usable_slots..slots).find(|&slot| group.nibbles.get(slot) != 0)
            {
                return Err(format!(
                    "capacity_blocks {} is below the blocks in use: block {} (slot {slot} of group {index}) is allocated",
                    self.capacity_blocks,
                    self.group_start(index as u64).0 + slot as u64
                ));
            }
        }
        Ok(())
    }

    pub fn group_count(&self) -> u64 {
        self.groups.len() as u64
    }

    /// Moves the capacity to `capacity_blocks` (never 0, never below the
    /// groups' own blocks): the slots it adds to a group become free, and
    /// the ones it takes away must be free already (a raise that could
    /// not be made durable is taken back this way).
    pub fn set_capacity(&mut self, capacity_blocks: u64) {
        let groups = self.groups.len() as u64;
        assert!(
            capacity_blocks > 0 && capacity_blocks.div_ceil(self.group_blocks) >= groups,
            "a capacity of {capacity_blocks} blocks cannot hold {groups} groups"
        );
        for (index, group) in self.groups.iter_mut().enumerate() {
            let usable = usable_slots(self.group_blocks, capacity_blocks, index as u64);
            let old = group.usable_slots;
            let changed = old.min(usable)..old.max(usable);
            let span = changed.len() as u64;
            let free = changed.filter(|&slot| group.nibbles.get(slot) == 0).count() as u64;
            // Slots past the capacity are never in use, and a lowered
            // capacity only takes back slots nothing took meanwhile.
            assert_eq!(free, span, "slots crossing the capacity must be free");
            if usable > old {
                group.free_blocks += free;
            } else {
                group.free_blocks -= free;
            }
            group.usable_slots = usable;
        }
        self.capacity_blocks = capacity_blocks;
        debug_assert!(self.check_capacity().is_ok());
    }

    /// First block of group `index`: its map block.
    pub fn group_start(&self, index: u64) -> BlockAddr {
        BlockAddr(self.data_start + index * self.group_blocks)
    }

    /// Appends an empty group whose only used block is its own map block.
    pub fn add_group(&mut self) -> Result<u64> {
        let index = self.groups.len() as u64;
        if usable_slots(self.group_blocks, self.capacity_blocks, index) as u64
            <= GROUP_HEADER_BLOCKS
        {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "the pool is full: its capacity of {} blocks is all in use",
                    self.capacity_blocks
                ),
            ));
        }
        let end = self.data_start + (index + 1) * self.group_blocks;
        if end > ENTRY_ADDR_MASK {
            return Err(Error::new(
                ErrorKind::NoSpace,
                "the store has reached its largest possible size",
            ));
        }
        let usable = usable_slots(self.group_blocks, self.capacity_blocks, index);
        self.groups
            .push(Group::new_empty(self.group_blocks, usable));
        debug_assert_eq!(self.store_end(), end, "one group more");
        Ok(index)
    }

    /// Hands out a free block, growing the store by a group when all are full.
    pub fn allocate(&mut self, usage: BlockUse) -> Result<BlockAddr> {
        let addr = self.take_free_block(usage)?;
        let change = match usage {
            BlockUse::Meta => AllocChange::AllocatedMeta,
            BlockUse::Data => AllocChange::AllocatedData,
        };
        self.changes.push((addr, change, 0));
        debug_assert!(self.is_allocated(addr) && !self.is_reserved(addr));
        Ok(addr)
    }

    /// Takes a data block for a write that will map it later: in use in
    /// memory, but in no transaction until [`Allocator::confirm`]; given
    /// back at once by [`Allocator::unreserve`].
    pub fn reserve(&mut self) -> Result<BlockAddr> {
        let addr = self.take_free_block(BlockUse::Data)?;
        assert!(self.reserved.insert(addr), "block {addr} reserved twice");
        Ok(addr)
    }

    /// A reserved block is mapped now: its allocation joins the open
    /// transaction.
    pub fn confirm(&mut self, addr: BlockAddr) {
        assert!(self.reserved.remove(&addr), "block {addr} was not reserved");
        assert_eq!(self.nibble(addr), Some(NIBBLE_ALLOCATED));
        self.changes.push((addr, AllocChange::AllocatedData, 0));
    }

    /// A reserved block will not be mapped: free again, reusable at once,
    /// since no transaction ever knew it was taken.
    pub fn unreserve(&mut self, addr: BlockAddr) {
        assert!(self.reserved.remove(&addr), "block {addr} was not reserved");
        let (group, slot) = self.locate(addr);
        assert_eq!(self.groups[group].nibbles.get(slot), NIBBLE_ALLOCATED);
        self.groups[group].set(slot, 0);
    }

    /// Takes the free block `addr` as `reserve` takes the next one: for
    /// work on it outside the state lock that no transaction hears of
    /// (punching its host space); `unreserve` gives it back.
    pub fn reserve_free(&mut self, addr: BlockAddr) {
        let (group, slot) = self.locate(addr);
        assert_eq!(
            self.groups[group].nibbles.get(slot),
            0,
            "{addr} is not free"
        );
        self.groups[group].set(slot, NIBBLE_ALLOCATED);
        assert!(self.reserved.insert(addr), "block {addr} reserved twice");
    }

    /// Taken by a write in flight (see [`Allocator::reserve`]).
    pub fn is_reserved(&self, addr: BlockAddr) -> bool {
        self.reserved.contains(&addr)
    }

    /// Finds a free block and marks it in use in the live map, with no
    /// change recorded.
    fn take_free_block(&mut self, usage: BlockUse) -> Result<BlockAddr> {
        let addr = match self.find_free() {
            Some(addr) => addr,
            None => {
                let index = self.add_group()?;
                self.group_start(index).0 + GROUP_HEADER_BLOCKS
            }
        };
        let (group, slot) = self.locate(BlockAddr(addr));
        let group = &mut self.groups[group];
        assert_eq!(group.nibbles.get(slot), 0, "block {addr} handed out twice");
        let nibble = match usage {
            BlockUse::Meta => NIBBLE_ALLOCATED | NIBBLE_META,
            BlockUse::Data => NIBBLE_ALLOCATED,
        };
        group.set(slot, nibble);
        self.cursor = addr + 1;
        Ok(BlockAddr(addr))
    }
    fn find_free(&self) -> Option<u64> {
        let group_count = self.groups.len() as u64;
        if group_count == 0 {
            return None;
        }
        let store_end = self.data_start + group_count * self.group_blocks;
        let cursor = if self.cursor >= store_end {
            self.data_start
        } else {
            self.cursor
        };
        let (start_group, start_slot) = self.locate(BlockAddr(cursor));
        // Visit the cursor's group from the cursor on, then every other group,
        // then the cursor's group before the cursor.
        for step in 0..=group_count {
            let g = ((start_group as u64 + step) % group_count) as usize;
            let group = &self.groups[g];
            if group.free_blocks == 0 {
                continue;
            }
            let usable = group.usable_slots;
            let range = match step {
                0 => start_slot.min(usable)..usable,
                s if s == group_count => 0..start_slot.min(usable),
                _ => 0..usable,
            };
            if let Some(slot) = group.nibbles.first_free(range) {
                return Some(self.group_start(g as u64).0 + slot as u64);
            }
        }
        None
    }

    /// Frees a block. It becomes reusable only after `release` is given it
    /// back, once the transaction that frees it is durable.
    pub fn free(&mut self, addr: BlockAddr) {
        let (group, slot) = self.locate(addr);
        let group = &mut self.groups[group];
        // A tree that points at a free block, or at a map block, is damage on
        // disk (a crafted store can carry valid checksums): refuse quietly
        // instead of panicking; `check` reports such blocks.
        let old = group.nibbles.get(slot);
        if old & NIBBLE_ALLOCATED == 0 || slot < GROUP_HEADER_BLOCKS as usize {
            self.inconsistent_frees += 1;
            return;
        }
        group.set(slot, NIBBLE_PENDING_FREE);
        assert_eq!(group.nibbles.get(slot), NIBBLE_PENDING_FREE);
        self.changes.push((addr, AllocChange::Freed, old));
        self.open_frees.push(addr);
    }

    /// Blocks freed in the open transaction: a commit would make them usable.
    pub fn has_open_frees(&self) -> bool {
        !self.open_frees.is_empty()
    }

    /// Frees refused because the block was not allocated (damage).
    pub fn inconsistent_frees(&self) -> u64 {
        self.inconsistent_frees
    }

    /// True if anything was allocated or freed since the last seal.
    pub fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }

    pub fn change_count(&self) -> usize {
        self.changes.len()
    }

    /// The changes since the last seal as extents, runs of neighbouring
    /// blocks with the same change merged. Order is kept: a later change to
    /// a block wins when they are applied.
    pub fn pending_extents(&self) -> Vec<AllocExtent> {
        let mut extents: Vec<AllocExtent> = Vec::new();
        for &(addr, change, _) in &self.changes {
            match extents.last_mut() {
                Some(last)
                    if last.change == change
                        && last.first.0 + u64::from(last.count) == addr.0
                        && last.count < u32::MAX =>
                {
                    last.count += 1
                }
                _ => extents.push(AllocExtent {
                    first: addr,
                    count: 1,
                    change,
                }),
            }
        }
        extents
    }

    /// Ends the current transaction's share of the allocator, once it is
    /// durable: applies its changes to the durable copy of the maps.
    pub fn seal(&mut self) -> SealedChanges {
        let extents = self.pending_extents();
        self.changes.clear();
        self.durable_group_count = self.groups.len() as u64;
        for extent in &extents {
            self.apply_durable(extent);
        }
        debug_assert!(!self.has_changes());
        let sealed = SealedChanges {
            extents,
            frees: std::mem::take(&mut self.open_frees),
        };
        debug_assert!(!self.has_open_frees());
        sealed
    }

    fn apply_durable(&mut self, extent: &AllocExtent) {
        let nibble = match extent.change {
            AllocChange::AllocatedData => NIBBLE_ALLOCATED,
            AllocChange::AllocatedMeta => NIBBLE_ALLOCATED | NIBBLE_META,
            AllocChange::Freed => 0,
        };
        for addr in extent.first.0..extent.first.0 + u64::from(extent.count) {
            let (group, slot) = self.locate(BlockAddr(addr));
            debug_assert!(
                slot >= GROUP_HEADER_BLOCKS as usize,
                "{addr}: a group's own block changes"
            );
            self.durable_copy(group).set(slot, nibble);
            debug_assert_eq!(
                self.groups[group].durable.as_ref().map(|d| d.get(slot)),
                Some(nibble)
            );
        }
    }

    /// The durable copy of a group's map, made on first need from the live
    /// state: a pending free is free on disk, and a change not sealed yet
    /// is not on disk (its old nibble is).
    fn durable_copy(&mut self, group: usize) -> &mut Nibbles {
        if self.groups[group].durable.is_none() {
            let base = self.durable_base(group);
            self.groups[group].durable = Some(base);
        }
        debug_assert!(self.groups[group].is_durable_dirty());
        self.groups[group].durable.as_mut().expect("just made")
    }

    fn durable_base(&self, group: usize) -> Nibbles {
        let mut base = self.groups[group].nibbles.clone();
        for slot in 0..self.group_blocks as usize {
            if base.get(slot) == NIBBLE_PENDING_FREE {
                base.set(slot, 0);
            }
        }
        // A reserved block was free, and no transaction has said otherwise.
        for &addr in &self.reserved {
            let (g, slot) = self.locate(addr);
            if g == group {
                base.set(slot, 0);
            }
        }
        // The earliest change to a block holds its durable nibble.
        for &(addr, _, old) in self.changes.iter().rev() {
            let (g, slot) = self.locate(addr);
            if g == group {
                base.set(slot, if old == NIBBLE_PENDING_FREE { 0 } else { old });
            }
        }
        base
    }

    /// Replays a durable transaction's allocation extents into the durable
    /// maps, growing the store to `group_count` groups first; `finish_replay`
    /// then copies them to the live maps. Fails on an extent outside the
    /// store or on a map block: the transaction is damaged.
    pub fn replay(&mut self, extents: &[AllocExtent], group_count: u64) -> Result<()> {
        // A damaged (but checksummed) count must not make us allocate
        // groups past what addresses or the capacity allow.
        let groups_max = match self.capacity_blocks {
            0 => (ENTRY_ADDR_MASK - self.data_start) / self.group_blocks,
            capacity => capacity.div_ceil(self.group_blocks),
        };
        if group_count > groups_max {
            return Err(Error::corrupt(format!(
                "journal transaction claims {group_count} allocation groups; this store can have at most {groups_max}"
            )));
        }
        while (self.groups.len() as u64) < group_count {
            let usable = usable_slots(
                self.group_blocks,
                self.capacity_blocks,
                self.groups.len() as u64,
            );
            self.groups
                .push(Group::new_empty(self.group_blocks, usable));
        }
        self.durable_group_count = self.groups.len() as u64;
        for extent in extents {
            let end = extent.first.0.checked_add(u64::from(extent.count));
            if extent.first.0 < self.data_start || end.is_none_or(|end| end > self.store_end()) {
                return Err(Error::corrupt(format!(
                    "journal transaction names blocks {}+{} outside the store",
                    extent.first.0, extent.count
                )));
            }
            for addr in extent.first.0..extent.first.0 + u64::from(extent.count) {
                let slot = (addr - self.data_start) % self.group_blocks;
                if slot < GROUP_HEADER_BLOCKS {
                    return Err(Error::corrupt(format!(
                        "journal transaction changes block {addr}, a group's own map or share-count block"
                    )));
                }
                let group = ((addr - self.data_start) / self.group_blocks) as usize;
                if extent.change != AllocChange::Freed
                    && slot as usize >= self.groups[group].usable_slots
                {
                    return Err(Error::corrupt(format!(
                        "journal transaction allocates block {addr}, past capacity_blocks {}",
                        self.capacity_blocks
                    )));
                }
            }
            self.apply_durable(extent);
        }
        debug_assert_eq!(self.groups.len() as u64, self.durable_group_count);
        Ok(())
    }

    /// After every replayed transaction: the live maps become the durable
    /// ones (done once, not per transaction: it touches every group).
    pub fn finish_replay(&mut self) {
        let group_blocks = self.group_blocks as usize;
        for group in &mut self.groups {
            if let Some(durable) = &group.durable {
                group.nibbles = durable.clone();
                group.recount(group_blocks);
            }
        }
        debug_assert!(
            self.changes.is_empty() && self.reserved.is_empty(),
            "replay is first"
        );
    }

    /// Replaces group `index`'s map with one rebuilt from the trees (its map
    /// block could not be decoded at open): `nibbles` holds one on-disk
    /// state per block of the group. The share-count blocks it holds are
    /// unknown too, so none is marked present until the next checkpoint
    /// writes them again. The map is dirty: that checkpoint writes it.
    pub fn rebuild_group(&mut self, index: u64, nibbles: &[u8]) {
        assert_eq!(nibbles.len() as u64, self.group_blocks);
        assert!(
            nibbles[..GROUP_HEADER_BLOCKS as usize]
                .iter()
                .all(|&n| n == NIBBLE_ALLOCATED | NIBBLE_META),
            "a group's own blocks are allocated metadata"
        );
        assert!(
            self.changes.is_empty(),
            "a map is rebuilt at open, before any change"
        );
        let usable = usable_slots(self.group_blocks, self.capacity_blocks, index);
        assert!(
            nibbles[usable..].iter().all(|&n| n == 0),
            "blocks past the capacity are never in use"
        );
        let mut group = Group::from_nibbles(nibbles, usable, 0);
        group.durable = Some(group.nibbles.clone());
        self.groups[index as usize] = group;
    }

    /// Marks a block in use as allocated with the given use (check
    /// --repair: a block that a tree reaches must never be handed out).
    pub fn set_allocated(&mut self, addr: BlockAddr, usage: BlockUse) {
        let (group, slot) = self.locate(addr);
        let group = &mut self.groups[group];
        let old = group.nibbles.get(slot);
        let (nibble, change) = match usage {
            BlockUse::Meta => (NIBBLE_ALLOCATED | NIBBLE_META, AllocChange::AllocatedMeta),
            BlockUse::Data => (NIBBLE_ALLOCATED, AllocChange::AllocatedData),
        };
        group.set(slot, nibble);
        self.changes.push((addr, change, old));
        debug_assert_eq!(self.nibble(addr), Some(nibble));
    }

    /// Makes blocks freed by a now-durable transaction reusable.
    pub fn release(&mut self, frees: Vec<BlockAddr>) {
        for addr in frees {
            let (group, slot) = self.locate(addr);
            let group = &mut self.groups[group];
            // Only a block still pending free becomes free: one that a
            // repair marked in use meanwhile stays in use.
            if group.nibbles.get(slot) == NIBBLE_PENDING_FREE {
                group.set(slot, 0);
                debug_assert_eq!(group.nibbles.get(slot), 0);
            }
        }
    }

    pub fn is_allocated(&self, addr: BlockAddr) -> bool {
        self.nibble(addr).is_some_and(|n| n & NIBBLE_ALLOCATED != 0)
    }

    pub fn nibble(&self, addr: BlockAddr) -> Option<u8> {
        if addr.0 < self.data_start || addr.0 >= self.store_end() {
            return None;
        }
        let (group, slot) = self.locate(addr);
        Some(self.groups[group].nibbles.get(slot))
    }

    /// One past the last block of the store.
    pub fn store_end(&self) -> u64 {
        self.data_start + self.groups.len() as u64 * self.group_blocks
    }

    /// Blocks in use, the groups' own map blocks included.
    pub fn used_blocks(&self) -> u64 {
        // Slots past the capacity are neither used nor free.
        self.groups
            .iter()
            .map(|g| g.usable_slots as u64 - g.free_blocks)
            .sum()
    }

    /// Blocks in use that hold data.
    pub fn data_blocks(&self) -> u64 {
        self.groups.iter().map(|g| g.data_blocks).sum()
    }

    /// Blocks in use that hold metadata.
    pub fn meta_blocks(&self) -> u64 {
        self.groups.iter().map(|g| g.meta_blocks).sum()
    }

    /// Blocks free in the groups that exist (the store can also grow).
    pub fn free_blocks(&self) -> u64 {
        self.groups.iter().map(|g| g.free_blocks).sum()
    }

    /// Most blocks the data area may span; 0 = no limit.
    pub fn capacity_blocks(&self) -> u64 {
        self.capacity_blocks
    }

    /// Encoded durable map blocks changed since the last checkpoint, as
    /// (address, block bytes).
    pub fn dirty_maps(&self, block_size_bytes: u32) -> Vec<(BlockAddr, Vec<u8>)> {
        let group_blocks = self.group_blocks as usize;
        (0..self.durable_group_count as usize)
            .filter(|&index| self.groups[index].is_durable_dirty())
            .map(|index| {
                let mut block = vec![0u8; block_size_bytes as usize];
                let group = &self.groups[index];
                let durable = group.durable.as_ref().expect("dirty groups have a copy");
                group::encode(
                    index as u64,
                    &durable.unpacked(group_blocks),
                    group.shares_present,
                    &mut block,
                );
                (self.group_start(index as u64), block)
            })
            .collect()
    }

    /// Some durable map changed since the last checkpoint.
    pub fn has_dirty_maps(&self) -> bool {
        self.groups[..self.durable_group_count as usize]
            .iter()
            .any(|g| g.is_durable_dirty())
    }

    /// The maps from `dirty_maps` are durable.
    pub fn mark_maps_clean(&mut self) {
        for group in &mut self.groups[..self.durable_group_count as usize] {
            group.durable = None;
        }
        debug_assert!(!self.has_dirty_maps());
    }

    /// Which share-count blocks of `group` hold counts on disk.
    pub fn shares_present(&self, group: u64) -> u8 {
        self.groups[group as usize].shares_present
    }

    /// Share-count block `index` of `group` now holds counts on disk: the
    /// group's map (written after it at checkpoint) must say so.
    pub fn mark_shares_present(&mut self, group: u64, index: u32) {
        let group = group as usize;
        if self.groups[group].shares_present & (1 << index) == 0 {
            self.groups[group].shares_present |= 1 << index;
            self.durable_copy(group);
        }
        debug_assert!(self.groups[group].shares_present & (1 << index) != 0);
    }

    /// True if `addr` is one of a group's own blocks (map or share counts).
    pub fn is_group_header(&self, addr: BlockAddr) -> bool {
        addr.0 >= self.data_start
            && (addr.0 - self.data_start) % self.group_blocks < GROUP_HEADER_BLOCKS
    }

    /// Groups as of the last sealed transaction.
    pub fn durable_group_count(&self) -> u64 {
        self.durable_group_count
    }

    /// (group index, slot in the group) of a block in the data area.
    fn locate(&self, addr: BlockAddr) -> (usize, usize) {
        assert!(
            addr.0 >= self.data_start && addr.0 < self.store_end(),
            "{addr} is outside the data area"
        );
        let relative = addr.0 - self.data_start;
        (
            (relative / self.group_blocks) as usize,
            (relative % self.group_blocks) as usize,
        )
    }
}

/// Slots of group `index` that a capacity of `capacity_blocks` (0 = none)
/// lets the allocator use.
fn usable_slots(group_blocks: u64, capacity_blocks: u64, index: u64) -> usize {
    if capacity_blocks == 0 {
        return group_blocks as usize;
    }
    capacity_blocks
        .saturating_sub(index * group_blocks)
        .min(group_blocks) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-group counters must always say what the nibbles say: `grove
    /// info` and the allocator's full-group test read only the counters.
    fn assert_counters_match(alloc: &Allocator) {
        for (index, group) in alloc.groups.iter().enumerate() {
            let mut recounted = Group {
                nibbles: group.nibbles.clone(),
                free_blocks: 0,
                data_blocks: 0,
                meta_blocks: 0,
                durable: None,
                usable_slots: group.usable_slots,
                shares_present: 0,
            };
            recounted.recount(alloc.group_blocks as usize);
            assert_eq!(
                (group.free_blocks, group.data_blocks, group.meta_blocks),
                (
                    recounted.free_blocks,
                    recounted.data_blocks,
                    recounted.meta_blocks
                ),
                "group {index}"
            );
        }
    }

    #[test]
    fn group_counters_follow_every_change_of_state() {
        let group_blocks = crate::format::group::group_blocks(4096);
        let mut alloc = Allocator::new(BlockAddr(64), group_blocks, 0, Vec::new());
        let mut data = Vec::new();
        // Past one group, so that the store grows by a second one.
        for i in 0..group_blocks + 10 {
            let usage = if i % 7 == 0 {
                BlockUse::Meta
            } else {
                BlockUse::Data
            };
            data.push(alloc.allocate(usage).unwrap());
        }
        assert_eq!(alloc.group_count(), 2);
        assert_counters_match(&alloc);
        let kept = alloc.reserve().unwrap();
        let dropped = alloc.reserve().unwrap();
        alloc.confirm(kept);
        alloc.unreserve(dropped);
        assert_counters_match(&alloc);
        for addr in data.iter().step_by(3) {
            alloc.free(*addr);
        }
        assert_counters_match(&alloc);
        let sealed = alloc.seal();
        alloc.release(sealed.frees);
        assert_counters_match(&alloc);
        assert_eq!(
            alloc.used_blocks() + alloc.free_blocks(),
            alloc.group_count() * group_blocks
        );
        assert_eq!(
            alloc.used_blocks(),
            alloc.data_blocks() + alloc.meta_blocks()
        );
    }
}
