//! Space accounting as ZFS users know it, computed from the trees when
//! asked, so it is exact at all times:
//!
//! - referenced: data blocks a volume maps (kept in its record as it changes);
//! - unique: blocks only this volume reaches, which is what removing it
//!   alone would free. Found by walking the volume's unshared nodes only,
//!   so it costs what the volume owns alone, not what it maps;
//! - written: data blocks born after the volume's written base (its latest
//!   snapshot, or its own creation for a clone), found by skipping every
//!   subtree born earlier.

use crate::error::Result;
use crate::format::node::NodeKind;
use crate::format::record::VolumeRecord;
use crate::node_reads::NodeReads;
use crate::state::State;
use crate::types::BlockAddr;

/// A volume's space, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub referenced_blocks: u64,
    pub unique_blocks: u64,
    pub written_blocks: u64,
}

impl State {
    /// A volume's usage from the nodes at hand (`node_reads.rs`); None if
    /// some must be read first (`reads` then names them).
    pub(crate) fn usage_via(
        &mut self,
        record: &VolumeRecord,
        reads: &mut NodeReads,
    ) -> Result<Option<Usage>> {
        let unique = self.unique_blocks_below(record.root, record.height, false, reads)?;
        let written = self.written_blocks_below(
            record.root,
            record.height - 1,
            record.written_base_generation,
            reads,
        )?;
        Ok(unique
            .zip(written)
            .map(|(unique_blocks, written_blocks)| Usage {
                referenced_blocks: record.referenced_blocks,
                unique_blocks,
                written_blocks,
            }))
    }

    /// Blocks reachable from `root` through unshared blocks only, data only
    /// or (with `with_nodes`) nodes too.
    pub(crate) fn unique_blocks_below(
        &mut self,
        root: BlockAddr,
        height: u8,
        with_nodes: bool,
        reads: &mut NodeReads,
    ) -> Result<Option<u64>> {
        if self.space_map().is_shared(root) {
            return Ok(Some(0));
        }
        Ok(self
            .unique_in_node(root, height - 1, with_nodes, reads)?
            .map(|n| n + u64::from(with_nodes)))
    }

    /// Goes on past a node it must read first, so that one round names
    /// every node of the next level it needs.
    fn unique_in_node(
        &mut self,
        addr: BlockAddr,
        level: u8,
        with_nodes: bool,
        reads: &mut NodeReads,
    ) -> Result<Option<u64>> {
        let Some(entries) = self.entries_via(addr, NodeKind::VolumeData, level, reads)? else {
            return Ok(None);
        };
        let mut count = Some(0);
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            if self.space_map().is_shared(entry.addr()) {
                continue;
            }
            let below = if level == 0 {
                Some(1)
            } else {
                self.unique_in_node(entry.addr(), level - 1, with_nodes, reads)?
                    .map(|n| n + u64::from(with_nodes))
            };
            count = count.zip(below).map(|(a, b)| a + b);
        }
        Ok(count)
    }

    fn written_blocks_below(
        &mut self,
        addr: BlockAddr,
        level: u8,
        base: u64,
        reads: &mut NodeReads,
    ) -> Result<Option<u64>> {
        let Some(entries) = self.entries_via(addr, NodeKind::VolumeData, level, reads)? else {
            return Ok(None);
        };
        let mut count = Some(0);
        for entry in entries.iter().filter(|e| !e.is_empty() && e.birth() > base) {
            let below = if level == 0 {
                Some(1)
            } else {
                self.written_blocks_below(entry.addr(), level - 1, base, reads)?
            };
            count = count.zip(below).map(|(a, b)| a + b);
        }
        Ok(count)
    }
}
