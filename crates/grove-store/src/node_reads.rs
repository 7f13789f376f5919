//! Nodes read with the state lock let go, for walks that only read
//! (accounting, what removed trees will free). Such a walk runs under the
//! lock in rounds (`pool/off_lock.rs`): it takes each node from the cache
//! or a journaled image, as every read does, else from the blocks read
//! for it before this round; a node in none of them is noted as wanted and
//! the walk goes on without it. Between rounds the wanted nodes are read
//! from the device without the lock, so the lock is held for the walk's
//! CPU work only, never for its device reads, and every result still
//! comes from one lock hold: exactly what a walk under the lock finds.
//!
//! A block read without the lock is what the node holds only if no
//! metadata moved on disk meanwhile: the metadata epoch (`node_store.rs`)
//! moves whenever a metadata block is written or freed. The blocks are
//! kept with the epoch at which their reads began and dropped once it
//! moves. A node that changed in memory since is in the cache, which is
//! asked first.

use std::collections::{BTreeSet, HashMap};

use crate::error::Result;
use crate::format::node::{Entry, NodeKind};
use crate::state::State;
use crate::types::BlockAddr;

/// Most bytes of blocks one walk keeps read ahead: a walk wanting more
/// reads the rest under the lock (`NodeReads::read_directly`), so memory
/// stays bounded whatever the walk's size.
pub const NODE_READS_BYTES_MAX: u64 = 32 << 20;

/// A node read without the lock: its block, decoded once it is used.
enum ReadNode {
    Block(Vec<u8>),
    /// Decoded as a node of this level.
    Decoded(u8, Box<[Entry]>),
}

/// The nodes one walk read with the lock let go, and those it still wants.
pub(crate) struct NodeReads {
    nodes: HashMap<BlockAddr, ReadNode>,
    /// The metadata epoch when the reads of `nodes` began.
    epoch: u64,
    /// Nodes a round needed and found nowhere, in address order (so that
    /// the reads between rounds go through the store in order).
    wanted: BTreeSet<BlockAddr>,
    block_bytes: u64,
    /// Read what is missing under the lock, as a plain walk does: the last
    /// resort when reads ahead would pass NODE_READS_BYTES_MAX, or when
    /// the metadata kept moving under them.
    direct: bool,
}

impl NodeReads {
    pub(crate) fn new(epoch: u64, block_bytes: u64) -> NodeReads {
        NodeReads {
            nodes: HashMap::new(),
            epoch,
            wanted: BTreeSet::new(),
            block_bytes,
            direct: false,
        }
    }

    /// From now on, nodes found nowhere are read under the lock.
    pub(crate) fn read_directly(&mut self) {
        self.direct = true;
        self.wanted.clear();
    }

    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Drops every block read before the metadata moved to `epoch`.
    pub(crate) fn revalidate(&mut self, epoch: u64) {
        if epoch != self.epoch {
            self.nodes.clear();
            self.epoch = epoch;
        }
    }

    /// The nodes to read before the next round; none are wanted after.
    pub(crate) fn take_wanted(&mut self) -> Vec<BlockAddr> {
        std::mem::take(&mut self.wanted).into_iter().collect()
    }

    /// True if keeping `more` more blocks would pass NODE_READS_BYTES_MAX.
    pub(crate) fn would_overflow(&self, more: usize) -> bool {
        (self.nodes.len() + more) as u64 * self.block_bytes > NODE_READS_BYTES_MAX
    }

    /// Keeps blocks read without the lock from `epoch` on, if the metadata
    /// is still at `epoch` (checked by the caller under the lock: `now`).
    pub(crate) fn keep(&mut self, blocks: Vec<(BlockAddr, Vec<u8>)>, epoch: u64, now: u64) {
        self.revalidate(now);
        if epoch != now {
            return;
        }
        for (addr, block) in blocks {
            debug_assert_eq!(block.len() as u64, self.block_bytes);
            self.nodes.entry(addr).or_insert(ReadNode::Block(block));
        }
    }
}

impl State {
    /// A node's entries for a walk in rounds: from the cache, a journaled
    /// image, or `reads`; None if it must be read first (it is now wanted).
    /// Read from the device here only once `reads` is direct.
    pub(crate) fn entries_via(
        &mut self,
        addr: BlockAddr,
        kind: NodeKind,
        level: u8,
        reads: &mut NodeReads,
    ) -> Result<Option<Box<[Entry]>>> {
        if reads.direct
            || self.nodes().peek(addr).is_some()
            || self.nodes().unwritten_image(addr).is_some()
        {
            return self.node_entries(addr, kind, level).map(Some);
        }
        debug_assert_eq!(reads.epoch, self.metadata_epoch(), "stale reads used");
        let decoded = match reads.nodes.remove(&addr) {
            None => {
                reads.wanted.insert(addr);
                return Ok(None);
            }
            Some(ReadNode::Decoded(decoded_level, entries)) if decoded_level == level => entries,
            // Reached at another level (damage): read as a plain walk
            // would, which reports it.
            Some(ReadNode::Decoded(..)) => return self.node_entries(addr, kind, level).map(Some),
            Some(ReadNode::Block(block)) => {
                let node = self.decode_node(addr, kind, level, &block)?;
                State::check_shape(&node, addr, kind, level)?;
                node.entries
            }
        };
        reads
            .nodes
            .insert(addr, ReadNode::Decoded(level, decoded.clone()));
        Ok(Some(decoded))
    }
}
