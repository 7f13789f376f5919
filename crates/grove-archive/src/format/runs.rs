//! Runs: the map from a range of a volume's blocks to the addresses of
//! their versions, as runs of consecutive blocks whose versions have
//! consecutive addresses (slots of one pack). A block no run covers reads
//! as zeros (a hole). Index pages hold them (page.rs).

/// Blocks `first_block..first_block + blocks` have the versions at
/// addresses `(pack, first_slot)..(pack, first_slot + blocks)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first_block: u64,
    pub pack: u64,
    pub first_slot: u32,
    pub blocks: u32,
}

impl Run {
    pub fn end_block(&self) -> u64 {
        self.first_block + u64::from(self.blocks)
    }

    /// Whether `next` continues this run (the next block, the next slot).
    pub fn is_continued_by(&self, next: &Run) -> bool {
        next.first_block == self.end_block()
            && next.pack == self.pack
            && u64::from(next.first_slot) == u64::from(self.first_slot) + u64::from(self.blocks)
            && u64::from(self.blocks) + u64::from(next.blocks) <= u64::from(u32::MAX)
    }
}

/// The address of `block`'s version in `runs` (sorted by block), or None
/// for a hole.
pub fn lookup(runs: &[Run], block: u64) -> Option<(u64, u32)> {
    let i = runs.partition_point(|r| r.end_block() <= block);
    let run = runs.get(i)?;
    (run.first_block <= block)
        .then(|| (run.pack, run.first_slot + (block - run.first_block) as u32))
}

/// Blocks the runs map.
pub fn mapped_blocks(runs: &[Run]) -> u64 {
    runs.iter().map(|r| u64::from(r.blocks)).sum()
}

/// Runs sorted by block with neighbours that continue each other merged.
pub fn coalesce(runs: impl IntoIterator<Item = Run>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for run in runs {
        match out.last_mut() {
            Some(last) if last.is_continued_by(&run) => last.blocks += run.blocks,
            _ => out.push(run),
        }
    }
    out
}

/// `base` with every block in `changed` (sorted, disjoint block ranges)
/// dropped, and `written` (sorted runs, inside `changed`) put in: the index
/// of a snapshot from its predecessor's and what differs.
pub fn apply_changes(base: &[Run], changed: &[(u64, u64)], written: &[Run]) -> Vec<Run> {
    let mut kept = Vec::with_capacity(base.len() + written.len());
    let mut c = 0;
    for run in base {
        let mut start = run.first_block;
        let end = run.end_block();
        while c < changed.len() && changed[c].1 <= start {
            c += 1;
        }
        let mut k = c;
        while start < end {
            let next_change = changed.get(k).copied().filter(|&(a, _)| a < end);
            let piece_end = next_change.map_or(end, |(a, _)| a.max(start));
            if piece_end > start {
                kept.push(slice(run, start, piece_end));
            }
            match next_change {
                Some((_, b)) => {
                    start = b.max(start).min(end);
                    k += 1;
                }
                None => start = end,
            }
        }
    }
    kept.extend_from_slice(written);
    kept.sort_by_key(|r| r.first_block);
    coalesce(kept)
}

/// Blocks `from..to` of `run`.
fn slice(run: &Run, from: u64, to: u64) -> Run {
    Run {
        first_block: from,
        pack: run.pack,
        first_slot: run.first_slot + (from - run.first_block) as u32,
        blocks: (to - from) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(first_block: u64, pack: u64, first_slot: u32, blocks: u32) -> Run {
        Run {
            first_block,
            pack,
            first_slot,
            blocks,
        }
    }

    fn lookup_all(runs: &[Run], blocks: u64) -> Vec<Option<(u64, u32)>> {
        (0..blocks).map(|b| lookup(runs, b)).collect()
    }
    proptest! {
        #[test]
        fn apply_changes_matches_a_block_map(
            base_map in proptest::collection::vec(proptest::option::of(0u64..3), 64),
            changes in proptest::collection::vec((any::<bool>(), proptest::option::of(Just(9u64))), 64),
        ) {
            // The base: block b in pack base_map[b] at slot b.
            let base = coalesce(base_map.iter().enumerate().filter_map(|(b, p)| {
                p.map(|p| run(b as u64, p, b as u32, 1))
            }));
            let mut changed = Vec::new();
            let mut written = Vec::new();
            let mut expected = lookup_all(&base, 64);
            for (b, (is_changed, new)) in changes.iter().enumerate() {
                if *is_changed {
                    changed.push((b as u64, b as u64 + 1));
                    expected[b] = new.map(|p| (p, 100 + b as u32));
                    if let Some(p) = new {
                        written.push(run(b as u64, *p, 100 + b as u32, 1));
                    }
                }
            }
            let changed = coalesce_ranges(&changed);
            let result = apply_changes(&base, &changed, &coalesce(written));
            prop_assert_eq!(lookup_all(&result, 64), expected);
            prop_assert!(result.windows(2).all(|w| w[0].end_block() <= w[1].first_block));
        }
    }

    fn coalesce_ranges(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(a, b) in ranges {
            match out.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => out.push((a, b)),
            }
        }
        out
    }
}
