//! Exact sharing at scale: random family trees of hundreds of volumes with
//! removals anywhere in them, verified byte for byte; `diff` from a removed
//! snapshot (a bookmark); rolling snapshots reaching a steady state; a pool
//! whose origin has tens of thousands of snapshots; and a repair larger
//! than one journal transaction.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::{assert_clean, Rng};
use grove_store::{MemDevice, Pool, PoolOptions, RemoveOptions};

const BLOCK: u64 = 1024;
/// 256 blocks: a two-level tree at 1 KiB blocks (128 entries per node).
const VOLUME_BYTES: u64 = 256 * BLOCK;

fn memory_pool(journal_bytes: u64) -> Pool {
    let options = PoolOptions {
        block_size_bytes: BLOCK as u32,
        capacity_bytes: None,
        journal_bytes: Some(journal_bytes),
    };
    Pool::format(
        Arc::new(MemDevice::new()),
        &options,
        Path::new("families"),
        None,
    )
    .unwrap()
}

#[test]
fn random_family_trees_keep_every_byte_through_interior_removals() {
    let pool = memory_pool(256 * 1024);
    let mut rng = Rng(0x5eed);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut next = 0u64;
    let mut removed_with_children = 0;
    pool.create_volume("root", VOLUME_BYTES).unwrap();
    model.insert("root".into(), vec![0; VOLUME_BYTES as usize]);
    // Grow a family of 240 volumes: snapshots and clones of random members,
    // with writes scattered so that most trees diverge a little.
    while model.len() < 240 {
        let names: Vec<String> = model.keys().cloned().collect();
        let source = names[rng.below(names.len() as u64) as usize].clone();
        let name = format!("v{next}");
        next += 1;
        if rng.below(3) == 0 {
            pool.snapshot(&source, &name).unwrap();
        } else {
            pool.clone_volume(&source, &name).unwrap();
        }
        let data = model[&source].clone();
        model.insert(name.clone(), data);
        let writable: Vec<String> = names
            .into_iter()
            .chain([name])
            .filter(|n| !pool.volume_info(n).unwrap().summary.read_only)
            .collect();
        let target = &writable[rng.below(writable.len() as u64) as usize];
        let offset = rng.below(VOLUME_BYTES - 4096);
        let stamp = (next % 251) as u8 + 1;
        let bytes = vec![stamp; 1 + rng.below(4096) as usize];
        pool.volume(target)
            .unwrap()
            .write_at(&bytes, offset)
            .unwrap();
        model.get_mut(target).unwrap()[offset as usize..offset as usize + bytes.len()]
            .copy_from_slice(&bytes);
    }
    assert_clean(&pool, "after growing the family");
    // Remove two thirds of them, interior members included, reclaiming
    // now and then; every survivor keeps every byte.
    for round in 0..160 {
        let names: Vec<String> = model.keys().cloned().collect();
        let name = names[rng.below(names.len() as u64) as usize].clone();
        let info = pool.volume_info(&name).unwrap();
        let has_children = pool
            .volumes()
            .unwrap()
            .iter()
            .any(|v| v.summary.parent.as_deref() == Some(name.as_str()));
        removed_with_children += u64::from(has_children);
        if round % 10 == 0 {
            assert_families_match_the_pool_list(&pool, &format!("round {round}"));
        }
        let freed = pool.remove_volume(&name).unwrap();
        assert!(freed <= info.summary.referenced_bytes);
        model.remove(&name);
        if round % 7 == 0 {
            pool.reclaim_all(|_| {}).unwrap();
            assert_clean(&pool, &format!("round {round}"));
        }
    }
    pool.reclaim_all(|_| {}).unwrap();
    assert_clean(&pool, "after the removals");
    let report = pool.check(false).unwrap();
    assert_same_in_windows(&pool, &report, "after the removals");
    assert!(removed_with_children > 20, "only {removed_with_children}");
    assert_eq!(common::contents(&pool), model);
    // Removing everything gives every data block back.
    for name in model.keys() {
        pool.remove_volume(name).unwrap();
    }
    pool.reclaim_all(|_| {}).unwrap();
    let info = pool.info().unwrap();
    assert_eq!(info.referenced_bytes, 0);
    assert_eq!(info.pending_free_bytes, 0);
    assert_clean(&pool, "after removing everything");
}

/// Each volume's family summaries are its own summary, then every volume
/// the whole pool's summaries show under it (through removed members), in
/// creation order; an unknown name is an error.
fn assert_families_match_the_pool_list(pool: &Pool, context: &str) {
    let all = pool.volume_summaries();
    for volume in &all {
        let family = pool.family_summaries(&volume.name).unwrap();
        let under: Vec<_> = all
            .iter()
            .filter(|s| s.parent.as_deref() == Some(volume.name.as_str()))
            .cloned()
            .collect();
        assert_eq!(family[0], *volume, "{context}");
        assert_eq!(family[1..], under[..], "{context}: {}", volume.name);
    }
    let e = pool.family_summaries("nope").unwrap_err();
    assert_eq!(e.kind(), grove_store::ErrorKind::NotFound, "{context}: {e}");
}

#[test]
fn recursive_removal_takes_the_subtree_and_spares_the_rest() {
    let pool = memory_pool(256 * 1024);
    pool.create_volume("base", VOLUME_BYTES).unwrap();
    pool.volume("base")
        .unwrap()
        .write_at(&[1; 8192], 0)
        .unwrap();
    pool.snapshot("base", "s1").unwrap();
    pool.clone_volume("s1", "c1").unwrap();
    pool.snapshot("c1", "c1s").unwrap();
    pool.clone_volume("base", "other").unwrap();
    pool.volume("c1").unwrap().write_at(&[2; 4096], 0).unwrap();
    let open = pool.volume("c1s").unwrap().claim();
    let refused = pool.remove(
        "s1",
        RemoveOptions {
            recursive: true,
            force: false,
        },
    );
    assert_eq!(
        refused.unwrap_err().kind(),
        grove_store::ErrorKind::Busy,
        "a descendant in use stops a recursive removal"
    );
    drop(open);
    pool.remove(
        "s1",
        RemoveOptions {
            recursive: true,
            force: false,
        },
    )
    .unwrap();
    let names: Vec<String> = pool
        .volumes()
        .unwrap()
        .into_iter()
        .map(|v| v.summary.name)
        .collect();
    assert_eq!(names, ["base", "other"]);
    pool.reclaim_all(|_| {}).unwrap();
    assert_clean(&pool, "after rm -r");
    let mut buf = vec![0u8; 8192];
    pool.volume("other").unwrap().read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 1));
}

/// Blocks `[first, first + count)` as byte extents, for comparing diffs.
fn blocks_of(report: &grove_store::DiffReport) -> Vec<(u64, u64, bool)> {
    report
        .extents
        .iter()
        .map(|e| {
            (
                e.offset_bytes / BLOCK,
                e.length_bytes.div_ceil(BLOCK),
                e.data,
            )
        })
        .collect()
}

#[test]
fn diff_from_a_removed_snapshot_matches_the_diff_it_had_alive() {
    let pool = memory_pool(256 * 1024);
    pool.create_volume("v", VOLUME_BYTES).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&[1; 64 * 1024], 0).unwrap();
    pool.snapshot("v", "monday").unwrap();
    // Changes after monday: a rewrite, new data far away, and a discard of
    // data monday had.
    v.write_at(&[2; 3000], 10 * BLOCK).unwrap();
    v.write_at(&[3; 2048], 200 * BLOCK).unwrap();
    v.discard(40 * BLOCK, 8 * BLOCK).unwrap();
    pool.snapshot("v", "tuesday").unwrap();
    let alive = pool.diff("monday", "tuesday").unwrap();
    assert!(!alive.base_removed);
    assert_eq!(
        blocks_of(&alive),
        [(10, 3, true), (40, 8, false), (200, 2, true)]
    );
    // Writes after tuesday do not show in a diff to tuesday.
    v.write_at(&[4; 1024], 100 * BLOCK).unwrap();
    pool.remove_volume("monday").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    let from_bookmark = pool.diff("monday", "tuesday").unwrap();
    assert!(from_bookmark.base_removed);
    assert_eq!(blocks_of(&from_bookmark), blocks_of(&alive));
    // The live volume has moved on: its diff has the later write too.
    let to_now = pool.diff("monday", "v").unwrap();
    assert_eq!(
        blocks_of(&to_now),
        [
            (10, 3, true),
            (40, 8, false),
            (100, 1, true),
            (200, 2, true)
        ]
    );
    // A window of it reads only what it needs, clipped to the window.
    let window = v.diff_in("monday", 41 * BLOCK + 10, 60 * BLOCK).unwrap();
    let window: Vec<(u64, u64, bool)> = window
        .iter()
        .map(|e| (e.offset_bytes / BLOCK, e.length_bytes / BLOCK, e.data))
        .collect();
    assert_eq!(window, [(41, 7, false), (100, 1, true)]);
    assert!(v.diff_in("monday", 0, 0).unwrap().is_empty());
    // A volume of another line cannot be compared with the bookmark, even
    // over an empty window.
    pool.create_volume("stranger", VOLUME_BYTES).unwrap();
    let err = pool.diff("monday", "stranger").unwrap_err();
    assert_eq!(err.kind(), grove_store::ErrorKind::InvalidArgument, "{err}");
    let stranger = pool.volume("stranger").unwrap();
    let err = stranger.diff_in("monday", 0, 0).unwrap_err();
    assert_eq!(err.kind(), grove_store::ErrorKind::InvalidArgument, "{err}");
    // The bookmark survives a reopen.
    assert_clean(&pool, "with a bookmark");
}

#[test]
fn rolling_snapshots_reach_a_steady_state() {
    let pool = memory_pool(1024 * 1024);
    let size = 4 * 1024 * 1024;
    pool.create_volume("v", size).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&vec![9; size as usize / 2], 0).unwrap();
    for cycle in 0..20u8 {
        pool.snapshot("v", "rolling").unwrap();
        v.write_at(&vec![cycle; size as usize / 2], 0).unwrap();
        drop(pool.volume("rolling"));
        pool.remove_volume("rolling").unwrap();
        pool.reclaim_all(|_| {}).unwrap();
    }
    let info = pool.info().unwrap();
    let referenced = pool.volume_info("v").unwrap().summary.referenced_bytes;
    assert_eq!(info.referenced_bytes, referenced);
    let data_and_metadata = info.used_bytes - info.metadata_bytes;
    assert_eq!(data_and_metadata, referenced, "data blocks in use");
    assert!(
        info.used_bytes <= referenced + referenced / 50 + 64 * BLOCK,
        "used {} for {} referenced",
        info.used_bytes,
        referenced
    );
    assert_clean(&pool, "after rolling");
}

#[test]
fn removing_the_origin_of_forty_thousand_snapshots_fits_the_journal() {
    let pool = memory_pool(1024 * 1024);
    pool.create_volume("origin", VOLUME_BYTES).unwrap();
    pool.volume("origin")
        .unwrap()
        .write_at(&[5; 64 * 1024], 0)
        .unwrap();
    for i in 0..40_000 {
        pool.snapshot("origin", &format!("s{i}")).unwrap();
    }
    pool.remove_volume("origin").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    pool.volume("s39999").unwrap().read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 5));
    assert_eq!(pool.volumes().unwrap().len(), 40_000);
    assert_clean(&pool, "after removing the origin");
}

/// Recursive removal of a family of 100,000 volumes (snapshots of
/// snapshots, and clones with snapshots of their own), then reclaim: every
/// part commits within one journal transaction, and afterwards the pool
/// holds nothing but the volume outside the family.
#[test]
fn removing_a_family_of_a_hundred_thousand_volumes_commits_in_bounded_parts() {
    const FAMILY: usize = 100_000;
    let pool = memory_pool(1024 * 1024);
    pool.create_volume("root", VOLUME_BYTES).unwrap();
    pool.create_volume("bystander", VOLUME_BYTES).unwrap();
    pool.volume("root")
        .unwrap()
        .write_at(&[3; 16 * 1024], 0)
        .unwrap();
    pool.volume("bystander")
        .unwrap()
        .write_at(&[4; 4 * 1024], 0)
        .unwrap();
    // Each new volume is taken from one of the last few, so the family is
    // both wide and deep.
    let mut names = vec!["root".to_string()];
    let mut rng = Rng(0xfa111);
    while names.len() < FAMILY {
        let back = 1 + rng.below(names.len().min(8) as u64) as usize;
        let source = names[names.len() - back].clone();
        let name = format!("f{}", names.len());
        if rng.below(4) == 0 {
            pool.clone_volume(&source, &name).unwrap();
            pool.volume(&name).unwrap().write_at(&[9; 1024], 0).unwrap();
        } else {
            pool.snapshot(&source, &name).unwrap();
        }
        names.push(name);
    }
    assert_eq!(pool.volume_names().len(), FAMILY + 1);
    pool.remove(
        "root",
        RemoveOptions {
            recursive: true,
            force: false,
        },
    )
    .unwrap();
    assert_eq!(pool.volume_names(), vec!["bystander".to_string()]);
    pool.reclaim_all(|_| {}).unwrap();
    let info = pool.info().unwrap();
    assert_eq!(info.pending_free_bytes, 0);
    assert_eq!(info.referenced_bytes, 4 * 1024);
    let mut buf = vec![0u8; 4 * 1024];
    pool.volume("bystander")
        .unwrap()
        .read_at(&mut buf, 0)
        .unwrap();
    assert!(buf.iter().all(|&b| b == 4));
    assert_clean(&pool, "after removing the family");
}

#[test]
fn a_repair_larger_than_one_transaction_is_committed_in_parts() {
    // The smallest journal: a transaction holds 16 blocks, and 600 wrong
    // records span 150 record blocks.
    let pool = memory_pool(32 * 1024);
    for i in 0..600 {
        pool.create_volume(&format!("v{i}"), VOLUME_BYTES).unwrap();
        pool.damage_accounting_for_tests(&format!("v{i}"), 7)
            .unwrap();
    }
    let report = pool.check(false).unwrap();
    assert!(!report.is_clean());
    let repaired = pool.check(true).unwrap();
    assert!(!repaired.repaired.is_empty(), "{repaired:?}");
    assert!(pool.failure().is_none());
    assert_clean(&pool, "after the repair");
    assert!(pool
        .volumes()
        .unwrap()
        .iter()
        .all(|v| v.summary.referenced_bytes == 0));
}

#[test]
fn emptied_volume_table_blocks_are_given_back() {
    let pool = memory_pool(256 * 1024);
    pool.create_volume("keep", VOLUME_BYTES).unwrap();
    let metadata_before = pool.info().unwrap().metadata_bytes;
    // 1 KiB blocks hold 4 records: 400 volumes fill 100 record blocks.
    for i in 0..400 {
        pool.create_volume(&format!("v{i}"), VOLUME_BYTES).unwrap();
    }
    let metadata_full = pool.info().unwrap().metadata_bytes;
    assert!(metadata_full >= metadata_before + 400 * BLOCK);
    for i in 0..400 {
        pool.remove_volume(&format!("v{i}")).unwrap();
    }
    pool.reclaim_all(|_| {}).unwrap();
    let metadata_after = pool.info().unwrap().metadata_bytes;
    // Roots and record blocks are back; a few table nodes may stay.
    assert!(
        metadata_after <= metadata_before + 4 * BLOCK,
        "{metadata_before} before, {metadata_full} full, {metadata_after} after"
    );
    assert_clean(&pool, "after emptying the table");
    pool.create_volume("again", VOLUME_BYTES).unwrap();
    assert_eq!(pool.volumes().unwrap().len(), 2);
}

/// A check in small windows (several passes over the metadata, as a pool
/// larger than `CHECK_WINDOW_BLOCKS` is checked) finds exactly what the
/// one-pass check finds.
fn assert_same_in_windows(pool: &Pool, report: &grove_store::CheckReport, context: &str) {
    // An odd size, so windows cut groups and node runs anywhere.
    let windowed = pool.check_in_windows_for_tests(false, 37).unwrap();
    assert_eq!(windowed.errors, report.errors, "{context}: windowed errors");
    assert_eq!(
        windowed.warnings, report.warnings,
        "{context}: windowed warnings"
    );
    assert_eq!(
        windowed.blocks_checked, report.blocks_checked,
        "{context}: windowed blocks"
    );
}

#[test]
fn a_check_in_windows_finds_what_a_one_pass_check_finds() {
    let pool = memory_pool(256 * 1024);
    pool.create_volume("a", VOLUME_BYTES).unwrap();
    let a = pool.volume("a").unwrap();
    a.write_at(&vec![1u8; VOLUME_BYTES as usize / 2], 0)
        .unwrap();
    pool.snapshot("a", "a@1").unwrap();
    a.write_at(&vec![2u8; 3 * 4096], 8192).unwrap();
    pool.clone_volume("a@1", "b").unwrap();
    let clean = pool.check(false).unwrap();
    assert!(clean.is_clean() && clean.blocks_checked > 37, "{clean:?}");
    assert_same_in_windows(&pool, &clean, "clean");
    // Damage the accounting (an error) and compare again.
    pool.damage_accounting_for_tests("b", 3).unwrap();
    let damaged = pool.check(false).unwrap();
    assert!(!damaged.is_clean());
    assert_same_in_windows(&pool, &damaged, "damaged");
}

#[test]
fn a_cancelled_check_stops_with_an_error_and_repairs_nothing() {
    let pool = memory_pool(256 * 1024);
    pool.create_volume("a", VOLUME_BYTES).unwrap();
    pool.volume("a")
        .unwrap()
        .write_at(&vec![1u8; VOLUME_BYTES as usize / 2], 0)
        .unwrap();
    pool.snapshot("a", "a@1").unwrap();
    pool.damage_accounting_for_tests("a@1", 3).unwrap();
    let cancel = std::sync::atomic::AtomicBool::new(true);
    let cancelled = pool.check_cancellable(true, &cancel).unwrap_err();
    assert_eq!(cancelled.kind(), grove_store::ErrorKind::Busy);
    assert!(
        cancelled.to_string().contains("nothing was repaired"),
        "{cancelled}"
    );
    // The damage is still there for a whole check to find and repair.
    assert!(!pool.check(false).unwrap().is_clean());
    cancel.store(false, std::sync::atomic::Ordering::SeqCst);
    let repaired = pool.check_cancellable(true, &cancel).unwrap();
    assert!(!repaired.repaired.is_empty(), "{repaired:?}");
    assert!(pool.check(false).unwrap().is_clean());
}
