//! The layout math, parity and recovery, over branches in memory: every
//! level and width, odd sizes, partial last stripes, every single-branch
//! loss (every pair for RAIF6) read back byte-exact, rebuild, scrub, a
//! crash in the write hole, and a proptest of random writes against a
//! plain byte vector.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use grove_raif::mem::MemBranches;
use grove_raif::{raid, Balancer, BranchIo, Layout, Level, ALL_LEVELS};
use proptest::prelude::*;

/// A small unit so that files of a few KiB span many stripes.
const UNIT_BYTES: u64 = 512;
/// Every level that survives the loss of a branch.
const REDUNDANT_LEVELS: [Level; 5] = [
    Level::Raif1,
    Level::Raif4,
    Level::Raif5,
    Level::Raif6,
    Level::Raif10,
];
/// Sizes around unit and stripe edges, and odd ones.
const SIZES: [u64; 9] = [0, 1, 511, 512, 513, 1537, 4095, 4097, 12_345];

fn pattern(len: u64, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7 + i / 251)) as u8)
        .collect()
}

fn widths(level: Level) -> Vec<usize> {
    (level.min_branches()..=6)
        .filter(|&w| level.check_width(w).is_ok())
        .collect()
}

/// Writes `data` as a whole file and returns the branches.
fn store(layout: &Layout, data: &[u8]) -> MemBranches {
    let branches = MemBranches::new(layout.width);
    raid::write(layout, &branches, 0, data).unwrap();
    branches
}

fn read_all(layout: &Layout, branches: &MemBranches, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    raid::read(layout, branches, 0, &mut out).unwrap();
    out
}

/// Every set of `count` failed branches the layout must survive.
fn loss_sets(layout: &Layout, count: usize) -> Vec<Vec<usize>> {
    let n = layout.width;
    let sets: Vec<Vec<usize>> = match count {
        1 => (0..n).map(|a| vec![a]).collect(),
        2 => (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| vec![a, b]))
            .collect(),
        _ => unreachable!(),
    };
    sets.into_iter()
        .filter(|set| raid::survives(layout, set))
        .collect()
}

#[test]
fn every_unit_of_a_stripe_is_on_its_own_branch() {
    for level in ALL_LEVELS {
        for width in widths(level) {
            for start in 0..width {
                let layout = Layout::new(level, width, UNIT_BYTES, start).unwrap();
                for stripe in 0..(2 * width as u64) {
                    let map = layout.stripe_map(stripe);
                    let mut seen = BTreeSet::new();
                    for b in map.data.iter().flatten().chain(&map.parity) {
                        assert!(*b < width);
                        assert!(
                            seen.insert(*b),
                            "{level} w{width} s{stripe}: branch {b} twice"
                        );
                    }
                    assert_eq!(map.data.len(), level.data_units(width));
                    assert_eq!(map.parity.len(), level.parity_units());
                }
            }
        }
    }
}

#[test]
fn raif5_parity_rotates_over_every_branch() {
    let layout = Layout::new(Level::Raif5, 4, UNIT_BYTES, 0).unwrap();
    let parity: Vec<usize> = (0..4).map(|s| layout.stripe_map(s).parity[0]).collect();
    assert_eq!(parity, vec![3, 2, 1, 0]);
    let raif4 = Layout::new(Level::Raif4, 4, UNIT_BYTES, 1).unwrap();
    assert!((0..8).all(|s| raif4.stripe_map(s).parity == vec![0]));
}

#[test]
fn the_starting_branch_comes_from_the_name() {
    let a = grove_raif::start_branch(b"song.mp3", 5);
    assert_eq!(a, grove_raif::start_branch(b"song.mp3", 5), "stable");
    let starts: BTreeSet<usize> = (0..100)
        .map(|i| grove_raif::start_branch(format!("file{i}").as_bytes(), 5))
        .collect();
    assert_eq!(
        starts.len(),
        5,
        "100 names start on every one of 5 branches"
    );
    let layout = Layout::new(Level::Raif0, 5, UNIT_BYTES, a).unwrap();
    assert_eq!(layout.first_branch(), a);
}

#[test]
fn every_level_reads_back_every_size() {
    for level in ALL_LEVELS {
        for width in widths(level) {
            for &size in &SIZES {
                let layout = Layout::new(level, width, UNIT_BYTES, size as usize % width).unwrap();
                let data = pattern(size, width as u64);
                let branches = store(&layout, &data);
                assert_eq!(
                    read_all(&layout, &branches, data.len()),
                    data,
                    "{level} w{width} {size}"
                );
                // Every component holds whole units: a partial last stripe is padded.
                let components = branches.components.lock().unwrap();
                assert!(components
                    .iter()
                    .all(|c| c.len() as u64 <= layout.component_bytes(size)));
            }
        }
    }
}

#[test]
fn every_single_branch_loss_reads_back_byte_exact() {
    for level in ALL_LEVELS.into_iter().filter(|l| *l != Level::Raif0) {
        for width in widths(level) {
            for &size in &SIZES {
                let layout = Layout::new(level, width, UNIT_BYTES, 1).unwrap();
                let data = pattern(size, 3);
                let sets = loss_sets(&layout, 1);
                assert_eq!(sets.len(), width, "{level} survives any one loss");
                for lost in sets {
                    let branches = store(&layout, &data);
                    branches.lose(lost[0]);
                    assert_eq!(
                        read_all(&layout, &branches, data.len()),
                        data,
                        "{level} w{width} size {size} without branch {lost:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn raif6_survives_every_two_branch_loss() {
    for width in widths(Level::Raif6) {
        for &size in &SIZES {
            let layout = Layout::new(Level::Raif6, width, UNIT_BYTES, 2 % width).unwrap();
            let data = pattern(size, 5);
            let sets = loss_sets(&layout, 2);
            assert_eq!(sets.len(), width * (width - 1) / 2);
            for lost in sets {
                let branches = store(&layout, &data);
                lost.iter().for_each(|&b| branches.lose(b));
                assert_eq!(
                    read_all(&layout, &branches, data.len()),
                    data,
                    "w{width} {lost:?}"
                );
            }
        }
    }
}

#[test]
fn raif10_survives_two_losses_in_different_pairs_only() {
    let layout = Layout::new(Level::Raif10, 4, UNIT_BYTES, 0).unwrap();
    let sets = loss_sets(&layout, 2);
    assert_eq!(sets, vec![vec![0, 2], vec![0, 3], vec![1, 2], vec![1, 3]]);
    let data = pattern(5000, 1);
    for lost in sets {
        let branches = store(&layout, &data);
        lost.iter().for_each(|&b| branches.lose(b));
        assert_eq!(read_all(&layout, &branches, data.len()), data);
    }
}

#[test]
fn raif0_loss_is_an_error_not_wrong_data() {
    let layout = Layout::new(Level::Raif0, 3, UNIT_BYTES, 0).unwrap();
    let branches = store(&layout, &pattern(4000, 1));
    branches.lose(1);
    let mut out = vec![0u8; 4000];
    assert!(raid::read(&layout, &branches, 0, &mut out).is_err());
}

#[test]
fn writes_in_degraded_mode_read_back_and_rebuild_restores_the_branch() {
    for level in REDUNDANT_LEVELS {
        let width = level.min_branches() + usize::from(level != Level::Raif10);
        let width = if level == Level::Raif10 { 4 } else { width };
        let layout = Layout::new(level, width, UNIT_BYTES, 0).unwrap();
        let mut data = pattern(6000, 9);
        let branches = store(&layout, &data);
        branches.lose(2);
        // Degraded writes: inside a unit, across units, past the end.
        for (offset, len) in [(100u64, 50u64), (1000, 2000), (5900, 700)] {
            let piece = pattern(len, offset);
            raid::write(&layout, &branches, offset, &piece).unwrap();
            let end = (offset + len) as usize;
            if data.len() < end {
                data.resize(end, 0);
            }
            data[offset as usize..end].copy_from_slice(&piece);
        }
        assert_eq!(
            read_all(&layout, &branches, data.len()),
            data,
            "{level} degraded"
        );
        branches.replace(2);
        for stripe in 0..layout.stripe_count(data.len() as u64) {
            raid::rebuild_stripe(&layout, &branches, stripe, 2).unwrap();
        }
        // Full redundancy again: any other single branch may now go.
        let other = if level == Level::Raif10 { 0 } else { 1 };
        branches.lose(other);
        assert_eq!(
            read_all(&layout, &branches, data.len()),
            data,
            "{level} after rebuild"
        );
    }
}

#[test]
fn scrub_finds_and_repairs_a_stale_unit() {
    for level in REDUNDANT_LEVELS {
        let layout = Layout::new(level, 4, UNIT_BYTES, 0).unwrap();
        let data = pattern(4 * 3 * UNIT_BYTES, 2);
        let branches = store(&layout, &data);
        let stripes = layout.stripe_count(data.len() as u64);
        let clean = (0..stripes).all(|s| {
            raid::scrub_stripe(&layout, &branches, s, false)
                .unwrap()
                .is_none()
        });
        assert!(clean, "{level}: a fresh file scrubs clean");
        // A torn write: one unit of stripe 1 changed behind the layout's back.
        let map = layout.stripe_map(1);
        let victim = map
            .parity
            .first()
            .copied()
            .unwrap_or_else(|| map.data[0][1]);
        branches.corrupt(victim, (UNIT_BYTES + 7) as usize);
        let found = raid::scrub_stripe(&layout, &branches, 1, true)
            .unwrap()
            .unwrap();
        assert_eq!(found.branches, vec![victim], "{level}");
        assert!(
            raid::scrub_stripe(&layout, &branches, 1, false)
                .unwrap()
                .is_none(),
            "{level} repaired"
        );
        assert_eq!(read_all(&layout, &branches, data.len()), data);
    }
}

/// Branches that take no write once a write reached the write hole
/// ([`BranchIo::data_written`]): a crash between a stripe's new data and
/// its redundancy.
struct CrashInTheHole<'a> {
    inner: &'a MemBranches,
    crashed: AtomicBool,
}

impl BranchIo for CrashInTheHole<'_> {
    fn read_at(&self, branch: usize, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(branch, offset, buf)
    }

    fn write_at(&self, branch: usize, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if self.crashed.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.inner.write_at(branch, offset, data)
    }

    fn is_failed(&self, branch: usize) -> bool {
        self.inner.is_failed(branch)
    }

    fn fail(&self, branch: usize, error: &std::io::Error) {
        self.inner.fail(branch, error)
    }

    fn data_written(&self, _stripe: u64) {
        self.crashed.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_crash_in_the_write_hole_leaves_new_data_that_scrub_makes_redundant() {
    for level in REDUNDANT_LEVELS {
        let layout = Layout::new(level, 4, UNIT_BYTES, 0).unwrap();
        let mut data = pattern(4 * 3 * UNIT_BYTES, 3);
        let branches = store(&layout, &data);
        let crash = CrashInTheHole {
            inner: &branches,
            crashed: AtomicBool::new(false),
        };
        // 100 bytes of stripe 1's first unit.
        let at = layout.stripe_data_bytes() + 10;
        let piece = pattern(100, 4);
        raid::write(&layout, &crash, at, &piece).unwrap();
        assert!(
            crash.crashed.load(Ordering::Relaxed),
            "{level}: the hook ran"
        );
        data[at as usize..at as usize + 100].copy_from_slice(&piece);
        let map = layout.stripe_map(1);
        let redundancy = if map.parity.is_empty() {
            map.data[0][1..].to_vec()
        } else {
            map.parity.clone()
        };
        let found = raid::scrub_stripe(&layout, &branches, 1, true)
            .unwrap()
            .unwrap();
        assert_eq!(found.branches, redundancy, "{level}: the stale units");
        assert!(
            raid::scrub_stripe(&layout, &branches, 1, false)
                .unwrap()
                .is_none(),
            "{level} repaired"
        );
        // The new data reached its unit, and is redundant again: it
        // survives the loss of the branch that holds it.
        branches.lose(map.data[0][0]);
        assert_eq!(read_all(&layout, &branches, data.len()), data, "{level}");
    }
}

#[test]
fn too_many_losses_fail_the_write() {
    let layout = Layout::new(Level::Raif5, 4, UNIT_BYTES, 0).unwrap();
    let branches = store(&layout, &pattern(3000, 1));
    branches.lose(0);
    branches.lose(1);
    assert!(raid::write(&layout, &branches, 0, &[1; 100]).is_err());
}

#[test]
fn layout_refuses_bad_shapes() {
    assert!(Layout::new(Level::Raif5, 2, UNIT_BYTES, 0).is_err());
    assert!(Layout::new(Level::Raif10, 5, UNIT_BYTES, 0).is_err());
    assert!(Layout::new(Level::Raif0, 2, 3000, 0).is_err());
    assert!(Layout::new(Level::Raif0, 2, 256, 0).is_err());
    assert!(Layout::new(Level::Raif0, 2, UNIT_BYTES, 2).is_err());
}

#[test]
fn a_slow_branch_gets_fewer_reads() {
    let balancer = Balancer::new(3);
    let mut picks = [0u32; 3];
    for _ in 0..3000 {
        let b = balancer.choose(&[0, 1, 2]);
        picks[b] += 1;
        // Branch 1 answers ten times slower than the others.
        let latency_us = if b == 1 { 1000 } else { 100 };
        balancer.record(b, Duration::from_micros(latency_us));
    }
    assert!(picks[1] * 4 < picks[0], "{picks:?}");
    assert!(picks[1] * 4 < picks[2], "{picks:?}");
    assert!(picks[1] > 0, "the slow branch is still measured: {picks:?}");
}

fn any_layout() -> impl Strategy<Value = Layout> {
    (0..ALL_LEVELS.len(), 0usize..4, 0u32..3, any::<usize>()).prop_map(
        |(l, extra, unit_shift, start)| {
            let level = ALL_LEVELS[l];
            let width = level.min_branches()
                + if level == Level::Raif10 {
                    2 * (extra % 2)
                } else {
                    extra
                };
            Layout::new(level, width, UNIT_BYTES << unit_shift, start % width).unwrap()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random writes match a byte vector, before and after losing any one
    /// branch the level survives.
    #[test]
    fn random_writes_match_the_oracle(
        layout in any_layout(),
        writes in prop::collection::vec((0u64..20_000, 1u64..3000, any::<u8>()), 1..12),
        lost in any::<usize>(),
    ) {
        let branches = MemBranches::new(layout.width);
        let mut oracle: Vec<u8> = Vec::new();
        for (offset, len, seed) in writes {
            let piece = pattern(len, u64::from(seed));
            raid::write(&layout, &branches, offset, &piece).unwrap();
            let end = (offset + len) as usize;
            if oracle.len() < end {
                oracle.resize(end, 0);
            }
            oracle[offset as usize..end].copy_from_slice(&piece);
        }
        prop_assert_eq!(read_all(&layout, &branches, oracle.len()), oracle.clone());
        let lost = lost % layout.width;
        if raid::survives(&layout, &[lost]) {
            branches.lose(lost);
            prop_assert_eq!(read_all(&layout, &branches, oracle.len()), oracle);
        }
    }
}
