//! `diff`: the extents where one volume differs from another.
//!
//! Between two live volumes the trees are walked side by side, and a pair
//! of entries that point at the same block is skipped unread: a shared
//! block is never changed in place, so the same address means the same
//! contents all the way down. The cost follows the metadata that differs,
//! not the volume size.
//!
//! From a removed snapshot (a bookmark, which keeps only its birth
//! generation G), the newer volume's entries born after G are exactly what
//! changed since: a block is only written in place if it was born after
//! its volume's last snapshot point, and unmapping leaves holes born then.

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::format::node::{Entry, NodeKind};
use crate::format::record::VolumeRecord;
use crate::state::State;
use crate::types::BlockAddr;

/// Runs of blocks where two volumes differ, as sorted (first block, count,
/// data) triples.
pub(crate) type Runs = Vec<(u64, u64, bool)>;

/// One run of blocks where the newer volume differs from the base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffExtent {
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// True if the newer volume maps data here; false if it reads as zeros
    /// (a hole) where the base may have had data.
    pub data: bool,
}

/// A position in one of the two trees being compared.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Nothing mapped below.
    Hole,
    /// A real node of the tree.
    Node(BlockAddr),
    /// A level above a shorter tree's root: entry 0 leads down to it.
    Above { root: BlockAddr, root_level: u8 },
}

impl State {
    /// Blocks [from, end) where `newer` differs from `base`, both live, as
    /// sorted (first block, count, data) runs; `end` is clipped to the
    /// larger volume. Subtrees outside the window are not read.
    pub(crate) fn diff_live(
        &mut self,
        base: &VolumeRecord,
        newer: &VolumeRecord,
        from: u64,
        end: u64,
    ) -> Result<Vec<(u64, u64, bool)>> {
        let height = base.height.max(newer.height);
        let side = |r: &VolumeRecord| {
            if r.height == height {
                Side::Node(r.root)
            } else {
                Side::Above {
                    root: r.root,
                    root_level: r.height - 1,
                }
            }
        };
        let end = self
            .geometry()
            .blocks_for(base.size_bytes.max(newer.size_bytes))
            .min(end);
        let mut out = Vec::new();
        let window = Window { from, end };
        self.diff_sides(side(base), side(newer), height - 1, 0, window, &mut out)?;
        Ok(out)
    }

    /// The entries of a side at `level`, as child sides (or data blocks at
    /// level 0, as Node of the data block).
    fn side_children(&mut self, side: Side, level: u8) -> Result<Vec<Side>> {
        let n = self.geometry().entries_per_node;
        Ok(match side {
            Side::Hole => vec![Side::Hole; n],
            Side::Above { root, root_level } => {
                let mut children = vec![Side::Hole; n];
                children[0] = if level - 1 == root_level {
                    Side::Node(root)
                } else {
                    Side::Above { root, root_level }
                };
                children
            }
            Side::Node(addr) => self
                .node_entries(addr, NodeKind::VolumeData, level)?
                .iter()
                .map(|e| match e.is_empty() {
                    true => Side::Hole,
                    false => Side::Node(e.addr()),
                })
                .collect(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn diff_sides(
        &mut self,
        base: Side,
        newer: Side,
        level: u8,
        first: u64,
        window: Window,
        out: &mut Vec<(u64, u64, bool)>,
    ) -> Result<()> {
        if base == newer || first >= window.end {
            return Ok(());
        }
        let span = self.geometry().span_blocks(level);
        let base_children = self.side_children(base, level)?;
        let newer_children = self.side_children(newer, level)?;
        for (slot, (b, n)) in base_children.into_iter().zip(newer_children).enumerate() {
            let child_first = first + slot as u64 * span;
            if b == n || !window.overlaps(child_first, span) {
                continue;
            }
            if level == 0 {
                push_run(out, child_first, 1, n != Side::Hole);
                continue;
            }
            match (b, n) {
                // Whatever the newer side maps here is new.
                (Side::Hole, Side::Node(addr)) => {
                    self.push_mapped(addr, level - 1, child_first, window, true, out)?
                }
                // Whatever the base mapped here is gone.
                (Side::Node(addr), Side::Hole) => {
                    self.push_mapped(addr, level - 1, child_first, window, false, out)?
                }
                _ => self.diff_sides(b, n, level - 1, child_first, window, out)?,
            }
        }
        Ok(())
    }

    fn push_mapped(
        &mut self,
        addr: BlockAddr,
        level: u8,
        base: u64,
        window: Window,
        data: bool,
        out: &mut Vec<(u64, u64, bool)>,
    ) -> Result<()> {
        let mut mapped = Vec::new();
        let first = base.max(window.from);
        self.mapped_below(addr, level, base, first, window.end, &mut mapped)?;
        for (first, count) in mapped {
            push_run(out, first, count.min(window.end - first), data);
        }
        Ok(())
    }

    /// Blocks [from, end) of `newer` changed since generation `since` (a
    /// bookmark's birth generation), as sorted runs; `end` is clipped to
    /// the volume. Subtrees outside the window are not read.
    pub(crate) fn diff_since(
        &mut self,
        since: u64,
        newer: &VolumeRecord,
        from: u64,
        end: u64,
    ) -> Result<Vec<(u64, u64, bool)>> {
        let end = self.geometry().blocks_for(newer.size_bytes).min(end);
        let window = Window { from, end };
        let mut out = Vec::new();
        self.changed_since(newer.root, newer.height - 1, 0, window, since, &mut out)?;
        Ok(out)
    }

    fn changed_since(
        &mut self,
        addr: BlockAddr,
        level: u8,
        first: u64,
        window: Window,
        since: u64,
        out: &mut Vec<(u64, u64, bool)>,
    ) -> Result<()> {
        let entries: Vec<Entry> = self
            .node_entries(addr, NodeKind::VolumeData, level)?
            .to_vec();
        let span = self.geometry().span_blocks(level);
        for (slot, entry) in entries.into_iter().enumerate() {
            let child_first = first + slot as u64 * span;
            if !window.overlaps(child_first, span) || entry.birth() <= since {
                continue;
            }
            if entry.is_empty() {
                let start = child_first.max(window.from);
                let end = child_first.saturating_add(span).min(window.end);
                push_run(out, start, end - start, false);
            } else if level == 0 {
                push_run(out, child_first, 1, true);
            } else {
                self.changed_since(entry.addr(), level - 1, child_first, window, since, out)?;
            }
        }
        Ok(())
    }

    /// Blocks [from, end) where `newer` differs from the volume or
    /// bookmark named `base`, as sorted (first block, count, data) runs,
    /// with the base's record and whether it is live. Checks that the two
    /// are comparable even when the window is empty.
    pub(crate) fn diff_runs(
        &mut self,
        base: &str,
        newer: &VolumeRecord,
        from: u64,
        end: u64,
    ) -> Result<(VolumeRecord, bool, Runs)> {
        let (base_record, base_live) = self.diff_base(base)?;
        let runs = self.diff_runs_from(&base_record, base_live, newer, from, end)?;
        Ok((base_record, base_live, runs))
    }

    /// The same from a base record already found: live, or a bookmark (or
    /// cursor) compared through birth generations.
    pub(crate) fn diff_runs_from(
        &mut self,
        base: &VolumeRecord,
        base_live: bool,
        newer: &VolumeRecord,
        from: u64,
        end: u64,
    ) -> Result<Runs> {
        if base_live {
            self.diff_live(base, newer, from, end)
        } else {
            self.check_bookmark_line(base, newer)?;
            self.diff_since(base.created_generation, newer, from, end)
        }
    }

    /// Checks that bookmark `base` (a removed snapshot) is in `newer`'s
    /// line: `newer` is the bookmark's source, or descends from it through
    /// a volume made after the bookmark. Births are only comparable there.
    pub(crate) fn check_bookmark_line(
        &self,
        base: &VolumeRecord,
        newer: &VolumeRecord,
    ) -> Result<()> {
        let source = base.parent;
        let mut current = newer;
        for _ in 0..=self.volume_table().record_count() {
            if current.id == source {
                return Ok(());
            }
            if current.parent == source {
                if current.created_generation > base.created_generation {
                    return Ok(());
                }
                break;
            }
            match self.any_record(current.parent) {
                Some(parent) => current = parent,
                None => break,
            }
        }
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "removed snapshot {:?} is not an earlier point of {:?}'s line, so they cannot be compared",
                base.name, newer.name
            ),
        ))
    }

    /// The record to diff from: a live volume, or else the newest removed
    /// snapshot of that name.
    pub(crate) fn diff_base(&self, name: &str) -> Result<(VolumeRecord, bool)> {
        if let Ok(record) = self.volume_by_name(name) {
            return Ok((record.clone(), true));
        }
        match self.bookmark_by_name(name) {
            Some(record) => Ok((record.clone(), false)),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("no volume or removed snapshot named {name:?} in this pool"),
            )),
        }
    }
}

/// The blocks [from, end) a diff looks at.
#[derive(Clone, Copy)]
struct Window {
    from: u64,
    end: u64,
}

impl Window {
    /// Whether blocks [first, first + span) reach into the window.
    fn overlaps(&self, first: u64, span: u64) -> bool {
        first < self.end && first.saturating_add(span) > self.from
    }
}

fn push_run(out: &mut Vec<(u64, u64, bool)>, first: u64, count: u64, data: bool) {
    match out.last_mut() {
        Some((start, length, d)) if *d == data && *start + *length == first => *length += count,
        _ => out.push((first, count, data)),
    }
}
