//! Soak: ten thousand rolling-snapshot cycles, the lifecycle a backup or
//! VM host runs all day (take a snapshot, drop the one taken
//! `SNAPSHOTS_KEPT` cycles earlier, overwrite a little at an unaligned
//! offset), with the reclaimer run only a few small batches between
//! cycles, so removed trees are usually half given back, and the pool
//! closed and opened again every `REOPEN_EVERY_CYCLES` cycles (as every
//! CLI call does). At the end, once reclaim finishes, not one block may be
//! leaked or counted with more references than it has, and every kept
//! snapshot must read back exactly what its volume held when it was taken.

mod common;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use common::Rng;
use grove_store::{CheckReport, MemDevice, Pool, PoolOptions};

const BLOCK_BYTES: u64 = 1024;
/// 2,048 blocks: a two-level tree, and with its snapshots the pool spans
/// several allocation groups (1,984 blocks each at 1 KiB), so the share
/// counts of group boundaries are exercised.
const VOLUME_BYTES: u64 = 2 * 1024 * 1024;
const CYCLES: u64 = 10_000;
const SNAPSHOTS_KEPT: usize = 5;
/// Bytes overwritten per cycle: a few blocks, starting mid-block.
const WRITE_BYTES_MAX: u64 = 12 * BLOCK_BYTES;
/// Entries one reclaim batch may handle: half a node, so a removed tree is
/// given back over several batches.
const RECLAIM_BATCH_ENTRIES: usize = 64;
/// Reclaim batches run between two cycles at most (a random number of
/// them, at least one): on average more than a cycle leaves behind, so the
/// backlog stays bounded, but often not all of it.
const RECLAIM_BATCHES_PER_CYCLE_MAX: u64 = 10;
const REOPEN_EVERY_CYCLES: u64 = 7;
const CHECK_EVERY_CYCLES: u64 = 1_000;

fn open(device: &Arc<MemDevice>) -> Pool {
    Pool::open_device(device.clone(), Path::new("soak"), None).unwrap()
}

/// The number at the start of the check warning that contains `what`.
fn blocks_warned(report: &CheckReport, what: &str) -> u64 {
    report
        .warnings
        .iter()
        .find(|w| w.contains(what))
        .map_or(0, |w| {
            w.split_whitespace()
                .next()
                .and_then(|n| n.replace(',', "").parse().ok())
                .unwrap_or(u64::MAX)
        })
}

/// Leaked and over-counted blocks, after every check error fails the test.
fn space_lost(pool: &Pool, context: &str) -> (u64, u64) {
    let report = pool.check(false).unwrap();
    assert!(report.errors.is_empty(), "{context}: {:?}", report.errors);
    (
        blocks_warned(&report, "leaked"),
        blocks_warned(&report, "more references"),
    )
}

fn read_all(pool: &Pool, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; VOLUME_BYTES as usize];
    pool.volume(name).unwrap().read_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn ten_thousand_rolling_snapshot_cycles_leak_nothing() {
    let device = Arc::new(MemDevice::new());
    let options = PoolOptions {
        block_size_bytes: BLOCK_BYTES as u32,
        capacity_bytes: None,
        journal_bytes: Some(256 * 1024),
    };
    let mut pool = Pool::format(device.clone(), &options, Path::new("soak"), None).unwrap();
    pool.create_volume("v", VOLUME_BYTES).unwrap();
    let mut contents = vec![0u8; VOLUME_BYTES as usize];
    let mut rng = Rng(0x50a6);
    for (i, byte) in contents
        .iter_mut()
        .enumerate()
        .take(VOLUME_BYTES as usize / 2)
    {
        *byte = (i / 7) as u8;
    }
    pool.volume("v").unwrap().write_at(&contents, 0).unwrap();
    // Kept snapshots, oldest first, with what each must read back.
    let mut kept: VecDeque<(String, Vec<u8>)> = VecDeque::new();
    let mut interrupted_reclaims = 0u64;
    for cycle in 1..=CYCLES {
        let name = format!("v@{cycle}");
        pool.snapshot("v", &name).unwrap();
        kept.push_back((name, contents.clone()));
        if kept.len() > SNAPSHOTS_KEPT {
            let (oldest, _) = kept.pop_front().unwrap();
            pool.remove_volume(&oldest).unwrap();
        }
        let len = 1 + rng.below(WRITE_BYTES_MAX);
        let offset = rng.below(VOLUME_BYTES - len);
        let fill = vec![cycle as u8 ^ 0x5a; len as usize];
        pool.volume("v").unwrap().write_at(&fill, offset).unwrap();
        contents[offset as usize..(offset + len) as usize].copy_from_slice(&fill);
        let mut done = false;
        for _ in 0..=rng.below(RECLAIM_BATCHES_PER_CYCLE_MAX) {
            done = pool
                .reclaim_batch_for_tests(RECLAIM_BATCH_ENTRIES)
                .unwrap()
                .1;
            if done {
                break;
            }
        }
        interrupted_reclaims += u64::from(!done);
        if cycle % REOPEN_EVERY_CYCLES == 0 {
            // Every other time without a checkpoint: the journal replays.
            if cycle % (2 * REOPEN_EVERY_CYCLES) == 0 {
                pool.close().unwrap();
            } else {
                pool.flush().unwrap();
                drop(pool);
            }
            pool = open(&device);
        }
        if cycle % CHECK_EVERY_CYCLES == 0 {
            // Mid-run, removed trees may still hold blocks; none may be
            // lost or over-counted beyond what they hold.
            assert_eq!(read_all(&pool, "v"), contents, "v after cycle {cycle}");
            let (oldest, expected) = kept.front().unwrap();
            assert_eq!(&read_all(&pool, oldest), expected, "{oldest}");
        }
    }
    pool.reclaim_all(|_| {}).unwrap();
    pool.close().unwrap();
    let pool = open(&device);
    assert_eq!(
        space_lost(&pool, "after the last cycle"),
        (0, 0),
        "(leaked, over-counted) blocks"
    );
    for (name, expected) in &kept {
        assert_eq!(&read_all(&pool, name), expected, "{name}");
    }
    assert_eq!(read_all(&pool, "v"), contents);
    // The reclaimer really was left unfinished, in many cycles.
    assert!(
        interrupted_reclaims > CYCLES / 10,
        "only {interrupted_reclaims} of {CYCLES} reclaims were left unfinished"
    );
    // Steady state: data in use is what the kept snapshots and v hold.
    let info = pool.info().unwrap();
    assert_eq!(info.pending_free_bytes, 0);
    assert_eq!(
        info.used_bytes - info.metadata_bytes,
        info.referenced_bytes,
        "data blocks in use are exactly the referenced ones"
    );
    eprintln!(
        "{CYCLES} cycles, {interrupted_reclaims} reclaims left unfinished: 0 leaked, 0 over-counted"
    );
}
