//! The metadata cache (ESnap): decoded radix nodes, bounded by a number of
//! nodes, with CLOCK replacement.
//!
//! - Dirty nodes (changed since the last commit) are pinned until the
//!   commit has written them to the journal and home; then they are clean.
//! - Nodes used by the operation in progress are never evicted, so code
//!   that loaded a node can keep using it until the operation ends: the
//!   pool starts an operation each time it takes its lock.
//! - Walks that only read many nodes (check, accounting, diff) do not fill
//!   the cache: they read what is missing without keeping it.
//!
//! When every cached node is dirty or in use the cache grows past its
//! bound for a while; the write path commits on its own long before that
//! matters (`State::auto_commit_blocks`).

use std::collections::{BTreeSet, VecDeque};

use crate::format::node::{Entry, Node};
use crate::types::{AddrMap, BlockAddr};

/// Default cache size: 64 MiB of nodes (16,384 at 4 KiB), which maps 32 GiB
/// of data at 4 KiB blocks with every node cached.
pub const CACHE_SIZE_DEFAULT_BYTES: u64 = 64 << 20;
/// Smallest cache: a few tree paths (every level of a few volumes).
pub const CACHE_NODES_MIN: usize = 64;

struct Slot {
    node: Node,
    /// The CLOCK bit: used since the hand last passed.
    referenced: bool,
    /// The operation that last used it; never evicted during that one.
    operation: u64,
}

pub(crate) struct NodeCache {
    slots: AddrMap<BlockAddr, Slot>,
    /// The CLOCK: every cached address once, the hand at the front.
    clock: VecDeque<BlockAddr>,
    dirty: BTreeSet<BlockAddr>,
    capacity_nodes: usize,
    operation: u64,
}

impl NodeCache {
    pub fn new(capacity_nodes: usize) -> NodeCache {
        NodeCache {
            slots: AddrMap::default(),
            clock: VecDeque::new(),
            dirty: BTreeSet::new(),
            capacity_nodes: capacity_nodes.max(CACHE_NODES_MIN),
            operation: 0,
        }
    }

    /// Nodes a cache of `size_bytes` holds for blocks of `block_bytes`.
    pub fn nodes_for(size_bytes: u64, block_bytes: u64) -> usize {
        usize::try_from(size_bytes / block_bytes.max(1)).unwrap_or(usize::MAX)
    }

    /// A new operation begins: what the previous one used may go.
    pub fn begin_operation(&mut self) {
        self.operation += 1;
    }

    /// The cached node at `addr`, marked used.
    pub fn get(&mut self, addr: BlockAddr) -> Option<&Node> {
        let operation = self.operation;
        let slot = self.slots.get_mut(&addr)?;
        slot.referenced = true;
        slot.operation = operation;
        Some(&slot.node)
    }

    /// The cached node at `addr`, without marking it used (for walks that
    /// only read).
    pub fn peek(&self, addr: BlockAddr) -> Option<&Node> {
        self.slots.get(&addr).map(|slot| &slot.node)
    }

    pub fn contains(&self, addr: BlockAddr) -> bool {
        self.slots.contains_key(&addr)
    }

    /// Caches a node read from disk (clean) or made anew (dirty), evicting
    /// clean nodes not in use when past the bound.
    pub fn insert(&mut self, addr: BlockAddr, node: Node, dirty: bool) {
        let slot = Slot {
            node,
            referenced: true,
            operation: self.operation,
        };
        if self.slots.insert(addr, slot).is_none() {
            self.clock.push_back(addr);
        }
        if dirty {
            self.dirty.insert(addr);
        }
        self.evict_past_capacity();
    }

    /// An entry of a cached node (loaded in this operation).
    pub fn entry(&self, addr: BlockAddr, slot: usize) -> Entry {
        self.slots[&addr].node.entries[slot]
    }

    /// Changes an entry of a cached node, which becomes dirty (pinned).
    pub fn set_entry(&mut self, addr: BlockAddr, slot: usize, entry: Entry) {
        let cached = self.slots.get_mut(&addr).expect("node is cached");
        cached.node.entries[slot] = entry;
        cached.operation = self.operation;
        self.dirty.insert(addr);
    }

    /// Forgets a node (its block was freed).
    pub fn remove(&mut self, addr: BlockAddr) {
        self.slots.remove(&addr);
        self.dirty.remove(&addr);
        // The clock entry goes when the hand reaches it.
    }

    pub fn dirty(&self) -> &BTreeSet<BlockAddr> {
        &self.dirty
    }

    /// The dirty nodes are durable: they may be evicted from now on.
    pub fn mark_all_clean(&mut self) {
        self.dirty.clear();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// CLOCK: the hand gives a used node a second chance and skips dirty
    /// nodes and those of the operation in progress. One sweep at most
    /// per eviction, so the cost is bounded even when nothing can go.
    fn evict_past_capacity(&mut self) {
        while self.slots.len() > self.capacity_nodes {
            if !self.evict_one() {
                return;
            }
        }
    }

    fn evict_one(&mut self) -> bool {
        // Twice round: once to clear CLOCK bits, once to find them clear.
        let sweep = 2 * self.clock.len();
        for _ in 0..sweep {
            let Some(addr) = self.clock.pop_front() else {
                return false;
            };
            let Some(slot) = self.slots.get_mut(&addr) else {
                continue; // removed since: drop its clock entry
            };
            let pinned = self.dirty.contains(&addr) || slot.operation == self.operation;
            if pinned || slot.referenced {
                slot.referenced = false;
                self.clock.push_back(addr);
                continue;
            }
            self.slots.remove(&addr);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::node::NodeKind;

    fn node() -> Node {
        Node::empty(NodeKind::VolumeData, 0, 128)
    }

    #[test]
    fn clean_nodes_are_evicted_dirty_and_in_use_ones_stay() {
        let mut cache = NodeCache::new(CACHE_NODES_MIN);
        cache.begin_operation();
        cache.insert(BlockAddr(1), node(), true);
        for addr in 2..=CACHE_NODES_MIN as u64 {
            cache.insert(BlockAddr(addr), node(), false);
        }
        // All in use by this operation: the cache grows rather than evict.
        cache.insert(BlockAddr(1000), node(), false);
        assert_eq!(cache.len(), CACHE_NODES_MIN + 1);
        // Later operations: clean nodes not used since may go, dirty ones stay.
        for addr in 2000..2000 + 3 * CACHE_NODES_MIN as u64 {
            cache.begin_operation();
            cache.insert(BlockAddr(addr), node(), false);
            assert!(cache.contains(BlockAddr(1)), "the dirty node was evicted");
        }
        cache.begin_operation();
        cache.insert(BlockAddr(5000), node(), false);
        assert!(cache.len() <= CACHE_NODES_MIN + 1, "{}", cache.len());
        cache.mark_all_clean();
        for addr in 6000..6000 + 2 * CACHE_NODES_MIN as u64 {
            cache.begin_operation();
            cache.insert(BlockAddr(addr), node(), false);
        }
        assert!(
            !cache.contains(BlockAddr(1)),
            "a clean node is never evicted"
        );
        assert!(cache.len() <= CACHE_NODES_MIN);
    }

    #[test]
    fn a_used_node_gets_a_second_chance() {
        let mut cache = NodeCache::new(CACHE_NODES_MIN);
        cache.begin_operation();
        for addr in 0..CACHE_NODES_MIN as u64 {
            cache.insert(BlockAddr(addr), node(), false);
        }
        // The first eviction clears every CLOCK bit, then takes node 0.
        cache.begin_operation();
        cache.insert(BlockAddr(100), node(), false);
        assert!(!cache.contains(BlockAddr(0)));
        // Node 1 is used again: the hand passes it and takes node 2.
        cache.begin_operation();
        assert!(cache.get(BlockAddr(1)).is_some());
        cache.begin_operation();
        cache.insert(BlockAddr(101), node(), false);
        assert!(cache.contains(BlockAddr(1)), "a used node went first");
        assert!(!cache.contains(BlockAddr(2)));
        assert_eq!(cache.len(), CACHE_NODES_MIN);
    }
}
