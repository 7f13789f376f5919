//! The node store: where a radix node is read from and kept between its
//! reads. It owns the bounded cache of decoded nodes (`cache.rs`), the
//! images of journaled nodes whose write home has not landed yet, and the
//! metadata epoch. Its fields are private, so its methods alone keep the
//! rules:
//!
//! - a node changed or newly made is dirty, and pinned in the cache, until
//!   the commit that journals it (`mark_clean`);
//! - a node whose image is journaled but not yet written home is read from
//!   that image, never from its older home on disk;
//! - an image is forgotten once its home is written, or once a durable
//!   free lets its block be reused (`forget_images_in`);
//! - the epoch moves whenever a metadata block may change on disk or be
//!   freed, so a node read without the state lock is cached only if the
//!   epoch did not move while it was read (`Pool`'s prefetch).
//!
//! Decoding and verifying a node needs the pool's geometry and space map:
//! that part is `State`'s (`state.rs`), on top of this.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cache::NodeCache;
use crate::format::node::{Entry, Node};
use crate::types::BlockAddr;

pub(crate) struct NodeStore {
    /// Decoded nodes, clean and dirty, bounded (ESnap).
    cache: NodeCache,
    /// Journaled metadata whose write to its home has not landed (or
    /// failed); the checkpoint writes it before it lets the journal forget
    /// the transaction.
    unwritten_homes: BTreeMap<BlockAddr, Vec<u8>>,
    /// Moves whenever a metadata block may change on disk or be freed.
    epoch: AtomicU64,
}

impl NodeStore {
    pub(crate) fn new(cache_nodes: usize) -> NodeStore {
        NodeStore {
            cache: NodeCache::new(cache_nodes),
            unwritten_homes: BTreeMap::new(),
            epoch: AtomicU64::new(0),
        }
    }

    // ----- the epoch -----

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// A metadata block may change on disk or be freed from now on.
    pub(crate) fn changed(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    // ----- cached nodes -----

    /// A cached node, without touching its place in the replacement order.
    pub(crate) fn peek(&self, addr: BlockAddr) -> Option<&Node> {
        self.cache.peek(addr)
    }

    pub(crate) fn contains(&self, addr: BlockAddr) -> bool {
        self.cache.contains(addr)
    }

    /// A cached node, used now (it gets its second chance).
    pub(crate) fn get(&mut self, addr: BlockAddr) -> Option<&Node> {
        let cached = self.cache.contains(addr);
        let node = self.cache.get(addr);
        debug_assert_eq!(node.is_some(), cached, "{addr}: use moved it in or out");
        node
    }

    /// Keeps a node read from its block, clean.
    pub(crate) fn insert_read(&mut self, addr: BlockAddr, node: Node) {
        // What the block holds is older than a dirty node: never replace one.
        // (Checked in debug builds, which the engine's tests use: this runs
        // on every cache miss.)
        debug_assert!(
            !self.cache.dirty().contains(&addr),
            "{addr}: a read would replace a dirty node"
        );
        self.cache.insert(addr, node, false);
        debug_assert!(self.cache.contains(addr));
    }

    /// Keeps a node made in memory for a newly allocated block: dirty.
    pub(crate) fn insert_new(&mut self, addr: BlockAddr, node: Node) {
        self.cache.insert(addr, node, true);
        debug_assert!(self.cache.contains(addr) && self.cache.dirty().contains(&addr));
    }

    /// An entry of a node this operation loaded.
    pub(crate) fn entry(&self, addr: BlockAddr, slot: usize) -> Entry {
        self.cache.entry(addr, slot)
    }

    /// Changes an entry of a node this operation loaded: dirty from now.
    pub(crate) fn set_entry(&mut self, addr: BlockAddr, slot: usize, entry: Entry) {
        debug_assert!(
            self.cache.contains(addr),
            "{addr}: changed before it was loaded"
        );
        self.cache.set_entry(addr, slot, entry);
        debug_assert!(self.cache.dirty().contains(&addr) && self.cache.entry(addr, slot) == entry);
    }

    /// The block of a node was freed: the epoch moves and the node goes.
    pub(crate) fn forget(&mut self, addr: BlockAddr) {
        self.changed();
        self.cache.remove(addr);
        debug_assert!(!self.cache.contains(addr) && !self.cache.dirty().contains(&addr));
    }

    /// A new operation holds the pool lock: nodes the last one used may be
    /// evicted from now on.
    pub(crate) fn begin_operation(&mut self) {
        let dirty = self.cache.dirty().len();
        self.cache.begin_operation();
        debug_assert_eq!(self.cache.dirty().len(), dirty, "dirty nodes stay pinned");
    }

    /// Keeps at most `cache_nodes` decoded nodes from now on. Dirty nodes
    /// move over pinned; clean ones are read again if needed.
    pub(crate) fn resize(&mut self, cache_nodes: usize) {
        let old = std::mem::replace(&mut self.cache, NodeCache::new(cache_nodes));
        for &addr in old.dirty() {
            if let Some(node) = old.peek(addr) {
                self.cache.insert(addr, node.clone(), true);
            }
        }
        debug_assert_eq!(self.cache.dirty(), old.dirty(), "dirty nodes move over");
    }

    // ----- dirty nodes, for the commit -----

    pub(crate) fn dirty_count(&self) -> usize {
        self.cache.dirty().len()
    }

    /// Every dirty node, encoded into `block_size` bytes, with its address.
    pub(crate) fn dirty_images(&self, block_size: usize) -> Vec<(BlockAddr, Vec<u8>)> {
        let mut images = Vec::with_capacity(self.cache.dirty().len());
        for &addr in self.cache.dirty() {
            let mut block = vec![0u8; block_size];
            self.cache
                .peek(addr)
                .expect("dirty nodes are pinned")
                .encode(&mut block);
            images.push((addr, block));
        }
        images
    }

    /// The dirty nodes are in a transaction now: clean, evictable again.
    pub(crate) fn mark_clean(&mut self) {
        self.cache.mark_all_clean();
        debug_assert!(self.cache.dirty().is_empty());
    }

    // ----- journaled images not yet home -----

    /// The journaled image of `addr` not yet written home, if any: newer
    /// than what its block holds.
    pub(crate) fn unwritten_image(&self, addr: BlockAddr) -> Option<&[u8]> {
        self.unwritten_homes.get(&addr).map(Vec::as_slice)
    }

    /// A transaction journals `image` for `home`: read from it until its
    /// write home lands.
    pub(crate) fn keep_unwritten(&mut self, home: BlockAddr, image: Vec<u8>) {
        assert!(!image.is_empty(), "{home}: an empty image");
        self.unwritten_homes.insert(home, image);
        debug_assert!(self.unwritten_homes.contains_key(&home));
    }

    /// The image of `home` landed at home.
    pub(crate) fn written_home(&mut self, home: BlockAddr) {
        self.unwritten_homes.remove(&home);
        debug_assert!(!self.unwritten_homes.contains_key(&home));
    }

    /// Blocks [first, end) were freed by a durable transaction and may be
    /// reused for data: an older image must never be written over them.
    pub(crate) fn forget_images_in(&mut self, first: u64, end: u64) {
        assert!(first <= end, "blocks {first}..{end}");
        self.unwritten_homes
            .retain(|addr, _| addr.0 < first || addr.0 >= end);
        debug_assert!(self
            .unwritten_homes
            .range(BlockAddr(first)..BlockAddr(end))
            .next()
            .is_none());
    }

    pub(crate) fn has_unwritten(&self) -> bool {
        !self.unwritten_homes.is_empty()
    }

    /// The images still to write home, in address order.
    pub(crate) fn unwritten(&self) -> impl Iterator<Item = (BlockAddr, &[u8])> {
        self.unwritten_homes
            .iter()
            .map(|(&home, image)| (home, image.as_slice()))
    }

    /// Every image is home (the checkpoint wrote them).
    pub(crate) fn all_written_home(&mut self) {
        self.unwritten_homes.clear();
        debug_assert!(!self.has_unwritten());
    }
}
