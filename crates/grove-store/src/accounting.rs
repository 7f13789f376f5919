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
    pub fn usage(&mut self, record: &VolumeRecord) -> Result<Usage> {
        Ok(Usage {
            referenced_blocks: record.referenced_blocks,
            unique_blocks: self.unique_blocks_below(record.root, record.height, false)?,
            written_blocks: self.written_blocks_below(
                record.root,
                record.height - 1,
                record.written_base_generation,
            )?,
        })
    }

    /// Blocks reachable from `root` through unshared blocks only, data only
    /// or (with `with_nodes`) nodes too.
    pub(crate) fn unique_blocks_below(
        &mut self,
        root: BlockAddr,
        height: u8,
        with_nodes: bool,
    ) -> Result<u64> {
        if self.space_map.shares().is_shared(root) {
            return Ok(0);
        }
        self.unique_in_node(root, height - 1, with_nodes)
            .map(|n| n + u64::from(with_nodes))
    }

    fn unique_in_node(&mut self, addr: BlockAddr, level: u8, with_nodes: bool) -> Result<u64> {
        let entries = self.node_entries(addr, NodeKind::VolumeData, level)?;
        let mut count = 0;
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            if self.space_map.shares().is_shared(entry.addr()) {
                continue;
            }
            count += if level == 0 {
                1
            } else {
                u64::from(with_nodes) + self.unique_in_node(entry.addr(), level - 1, with_nodes)?
            };
        }
        Ok(count)
    }

    fn written_blocks_below(&mut self, addr: BlockAddr, level: u8, base: u64) -> Result<u64> {
        let entries = self.node_entries(addr, NodeKind::VolumeData, level)?;
        let mut count = 0;
        for entry in entries.iter().filter(|e| !e.is_empty() && e.birth() > base) {
            count += if level == 0 {
                1
            } else {
                self.written_blocks_below(entry.addr(), level - 1, base)?
            };
        }
        Ok(count)
    }
}
