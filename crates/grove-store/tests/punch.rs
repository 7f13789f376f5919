//! Space back to the host: blocks whose free is durable are punched out of
//! the store file, so its allocated size (st_blocks) follows `used`. On a
//! real file in a temporary directory; and on devices that cannot punch,
//! or whose punches fail, where everything must still work.

mod common;
use common::contents;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use grove_store::testing::{Fault, FaultyDevice};
use grove_store::{FileDevice, MemDevice, Pool, PoolOptions};

const MIB: u64 = 1024 * 1024;
/// Unique data a snapshot holds alone, then gives back.
const UNIQUE_BYTES: u64 = 64 * MIB;
const VOLUME_BYTES: u64 = 96 * MIB;
/// What the store may take on the host beyond `used`: the journal region
/// (written in full once it wraps), the superblocks, and file system
/// rounding.
const HOST_SLACK_BYTES: u64 = grove_store::pool::JOURNAL_REGION_BYTES + 2 * MIB;
/// Bytes written per call, so that no test holds 64 MiB twice.
const CHUNK_BYTES: usize = 4 * MIB as usize;

/// Bytes no other call of this returns (for a different seed).
fn unique(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn write_unique(pool: &Pool, name: &str, seed: u64, offset: u64, len: u64) {
    let volume = pool.volume(name).unwrap();
    let mut done = 0;
    while done < len {
        let n = CHUNK_BYTES.min((len - done) as usize);
        volume
            .write_at(&unique(seed + done, n), offset + done)
            .unwrap();
        done += n as u64;
    }
}

fn store_allocated(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("grove.store")).unwrap().blocks() * 512
}

/// Writes UNIQUE_BYTES, snapshots, overwrites them: the snapshot alone
/// holds the first data.
fn pool_with_unique_snapshot(pool: &Pool) {
    pool.create_volume("disk", VOLUME_BYTES).unwrap();
    write_unique(pool, "disk", 1, 0, UNIQUE_BYTES);
    pool.snapshot("disk", "disk@1").unwrap();
    write_unique(pool, "disk", 1 << 40, 0, UNIQUE_BYTES);
    pool.flush().unwrap();
}

#[test]
fn removing_a_snapshot_gives_its_unique_data_back_to_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), &PoolOptions::default()).unwrap();
    pool_with_unique_snapshot(&pool);
    let expected = contents(&pool).remove("disk").unwrap();
    let before = pool.info().unwrap();
    let allocated_before = store_allocated(dir.path());
    assert_eq!(before.store_allocated_bytes, Some(allocated_before));
    assert!(allocated_before >= 2 * UNIQUE_BYTES, "{allocated_before}");

    pool.remove_volume("disk@1").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    pool.flush().unwrap();

    let after = pool.info().unwrap();
    let allocated_after = store_allocated(dir.path());
    assert_eq!(after.store_allocated_bytes, Some(allocated_after));
    // The snapshot's data and the nodes that mapped it went back.
    assert!(
        allocated_before - allocated_after >= UNIQUE_BYTES,
        "the store took {allocated_before} bytes on the host before, {allocated_after} after"
    );
    assert!(before.used_bytes - after.used_bytes >= UNIQUE_BYTES);
    // What the store takes on the host follows what the pool uses.
    assert!(
        allocated_after <= after.used_bytes + HOST_SLACK_BYTES,
        "{allocated_after} allocated on the host for {} used",
        after.used_bytes
    );
    let stats = pool.punch_stats();
    assert!(!stats.unsupported && stats.errors == 0, "{stats:?}");
    assert!(stats.blocks * 4096 >= UNIQUE_BYTES, "{stats:?}");
    // Neighbouring blocks went in one call each: far fewer calls than blocks.
    assert!(stats.extents * 64 <= stats.blocks, "{stats:?}");

    // The live volume is intact, now and after a reopen.
    assert!(contents(&pool)["disk"] == expected);
    pool.close().unwrap();
    let pool = Pool::open(dir.path()).unwrap();
    assert!(contents(&pool)["disk"] == expected);
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

#[test]
fn discarded_and_overwritten_blocks_are_punched_and_reused_blocks_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), &PoolOptions::default()).unwrap();
    pool.create_volume("disk", VOLUME_BYTES).unwrap();
    write_unique(&pool, "disk", 7, 0, 32 * MIB);
    pool.flush().unwrap();
    let allocated_full = store_allocated(dir.path());
    pool.volume("disk").unwrap().discard(0, 32 * MIB).unwrap();
    pool.flush().unwrap();
    let allocated_discarded = store_allocated(dir.path());
    assert!(
        allocated_full - allocated_discarded >= 32 * MIB,
        "{allocated_full} -> {allocated_discarded}"
    );
    // The punched blocks are handed out again: new data lands in them and
    // reads back, not as the zeros of the hole.
    write_unique(&pool, "disk", 8, 16 * MIB, 32 * MIB);
    pool.flush().unwrap();
    let mut expected = vec![0u8; VOLUME_BYTES as usize];
    expected[16 * MIB as usize..48 * MIB as usize].copy_from_slice(&unique_chunks(8, 32 * MIB));
    assert!(contents(&pool)["disk"] == expected);
    pool.close().unwrap();
    let pool = Pool::open(dir.path()).unwrap();
    assert!(contents(&pool)["disk"] == expected);
    assert!(pool.check(false).unwrap().is_clean());
}

/// What `write_unique` writes, as one buffer.
fn unique_chunks(seed: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        let n = CHUNK_BYTES.min((len - out.len() as u64) as usize);
        out.extend(unique(seed + out.len() as u64, n));
    }
    out
}

/// A small workload that frees data and nodes: write, snapshot, overwrite,
/// remove, reclaim. Returns the expected contents of "disk".
fn freeing_workload(pool: &Pool) -> Vec<u8> {
    pool.create_volume("disk", 4 * MIB).unwrap();
    let volume = pool.volume("disk").unwrap();
    volume.write_at(&unique(1, 2 * MIB as usize), 0).unwrap();
    pool.snapshot("disk", "disk@1").unwrap();
    volume.write_at(&unique(2, MIB as usize), MIB / 2).unwrap();
    volume.discard(3 * MIB, MIB).unwrap();
    pool.flush().unwrap();
    pool.remove_volume("disk@1").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    pool.flush().unwrap();
    let mut expected = unique(1, 2 * MIB as usize);
    expected[MIB as usize / 2..MIB as usize * 3 / 2].copy_from_slice(&unique(2, MIB as usize));
    expected.resize(4 * MIB as usize, 0);
    expected
}

/// A pool in memory whose every punch fails with `fault`.
fn pool_whose_punches_fail(fault: Fault) -> (Arc<FaultyDevice<MemDevice>>, Pool) {
    let device = Arc::new(FaultyDevice::new(MemDevice::new()));
    device.arm(fault, 0, true);
    let pool = Pool::format(
        device.clone(),
        &PoolOptions::default(),
        Path::new("x"),
        None,
    )
    .unwrap();
    (device, pool)
}

#[test]
fn a_device_without_hole_punching_stops_asking_and_works_on() {
    let (device, pool) = pool_whose_punches_fail(Fault::PunchUnsupported);
    let expected = freeing_workload(&pool);
    // A second round frees more: punching stays off, without another try.
    write_unique(&pool, "disk", 3, 0, MIB);
    pool.flush().unwrap();
    let mut expected_now = expected.clone();
    expected_now[..MIB as usize].copy_from_slice(&unique(3, MIB as usize));
    assert!(contents(&pool)["disk"] == expected_now);
    let stats = pool.punch_stats();
    assert!(
        stats.unsupported && stats.extents == 0 && stats.errors == 0,
        "{stats:?}"
    );
    assert_eq!(device.injected(), 1, "punching must stop after EOPNOTSUPP");
    assert!(pool.check(false).unwrap().is_clean());
    assert_eq!(pool.info().unwrap().store_allocated_bytes, None);
}

#[test]
fn a_failed_punch_is_counted_and_nothing_else_fails() {
    let (device, pool) = pool_whose_punches_fail(Fault::PunchEio);
    let expected = freeing_workload(&pool);
    assert!(contents(&pool)["disk"] == expected);
    let stats = pool.punch_stats();
    assert!(!stats.unsupported && stats.extents == 0, "{stats:?}");
    assert!(
        stats.errors > 0 && stats.errors == device.injected(),
        "{stats:?}"
    );
    assert!(pool.check(false).unwrap().is_clean());
    // Once the device recovers, punching goes on.
    device.clear();
    pool.volume("disk").unwrap().discard(0, MIB).unwrap();
    pool.flush().unwrap();
    let stats = pool.punch_stats();
    assert!(stats.extents > 0, "{stats:?}");
    let mut expected = expected;
    expected[..MIB as usize].fill(0);
    assert!(contents(&pool)["disk"] == expected);
}

/// A store whose free blocks were never punched (made by an older grove, or
/// on a device that could not punch then) gets their space back from
/// `check --repair`, and only their space.
#[test]
fn check_repair_punches_the_free_space_an_older_store_kept() {
    let dir = tempfile::tempdir().unwrap();
    Pool::create(dir.path(), &PoolOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let store = dir.path().join("grove.store");
    // As an older grove did: every free keeps its host space.
    let device = Arc::new(FaultyDevice::new(FileDevice::open(&store).unwrap()));
    device.arm(Fault::PunchUnsupported, 0, true);
    let pool = Pool::open_device(device, dir.path(), None).unwrap();
    pool_with_unique_snapshot(&pool);
    pool.remove_volume("disk@1").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    let expected = contents(&pool);
    pool.close().unwrap();
    let allocated_old = store_allocated(dir.path());
    assert!(allocated_old >= 2 * UNIQUE_BYTES, "{allocated_old}");

    let pool = Pool::open(dir.path()).unwrap();
    assert_eq!(
        store_allocated(dir.path()),
        allocated_old,
        "opening alone punches nothing"
    );
    let report = pool.check(true).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
    let allocated_repaired = store_allocated(dir.path());
    assert!(
        allocated_old - allocated_repaired >= UNIQUE_BYTES,
        "{allocated_old} -> {allocated_repaired}"
    );
    let used = pool.info().unwrap().used_bytes;
    assert!(allocated_repaired <= used + HOST_SLACK_BYTES);
    assert!(contents(&pool) == expected);
    pool.close().unwrap();
    let pool = Pool::open(dir.path()).unwrap();
    assert!(contents(&pool) == expected);
    assert!(pool.check(false).unwrap().is_clean());
}

/// Blocks queued for punching may be handed out again before the backlog
/// is punched (a commit releases them, and only a flush punches): the
/// punch must skip them, or the new owner's data would read as zeros.
#[test]
fn blocks_reused_before_their_punch_keep_their_new_data() {
    const BLOCK_BYTES: u32 = 1024;
    let device = Arc::new(MemDevice::new());
    let options = PoolOptions {
        block_size_bytes: BLOCK_BYTES,
        ..PoolOptions::default()
    };
    let pool = Pool::format(device, &options, Path::new("x"), None).unwrap();
    pool.create_volume("a", MIB).unwrap();
    pool.volume("a")
        .unwrap()
        .write_at(&unique(1, MIB as usize), 0)
        .unwrap();
    pool.flush().unwrap();
    pool.volume("a").unwrap().discard(0, MIB).unwrap();
    // Commits without a flush: the discarded blocks become reusable and
    // wait on the backlog.
    pool.create_volume("b", 3 * MIB / 2).unwrap();
    // Next-fit fills the rest of the first group, then wraps round into
    // the blocks "a" gave up.
    let data = unique(2, 3 * MIB as usize / 2);
    pool.volume("b").unwrap().write_at(&data, 0).unwrap();
    pool.flush().unwrap();
    let stats = pool.punch_stats();
    assert!(stats.blocks > 0 && stats.errors == 0, "{stats:?}");
    let all = contents(&pool);
    assert!(all["b"] == data, "a reused block was punched");
    assert!(all["a"].iter().all(|&b| b == 0));
    assert!(pool.check(false).unwrap().is_clean());
}

/// A pool whose daemon paces punching (`defer_punching`) leaves freed
/// blocks on the backlog after its commits: the pool has the space back at
/// once, the host only when the daemon punches (`punch_some`, a step at a
/// time) or the pool closes.
#[test]
fn deferred_punching_waits_for_the_caller_and_close_punches_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), &PoolOptions::default()).unwrap();
    pool.defer_punching();
    pool_with_unique_snapshot(&pool);
    let expected = contents(&pool).remove("disk").unwrap();
    let allocated_before = store_allocated(dir.path());
    let used_before = pool.info().unwrap().used_bytes;

    pool.remove_volume("disk@1").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    pool.flush().unwrap();
    // The pool has its space back; the host has not.
    assert!(used_before - pool.info().unwrap().used_bytes >= UNIQUE_BYTES);
    let backlog = pool.punch_backlog_blocks();
    assert!(backlog as u64 * 4096 >= UNIQUE_BYTES, "{backlog}");
    assert_eq!(pool.punch_stats().blocks, 0);
    assert!(store_allocated(dir.path()) + MIB >= allocated_before);

    // One step takes what it was given off the backlog, and punches it.
    assert_eq!(pool.punch_some(100), 100);
    assert_eq!(pool.punch_backlog_blocks(), backlog - 100);
    assert_eq!(pool.punch_stats().blocks, 100);

    // Close punches what is left.
    pool.close().unwrap();
    let allocated_after = store_allocated(dir.path());
    // Less the journal and superblock blocks the close's checkpoint wrote.
    assert!(
        allocated_before - allocated_after + MIB >= UNIQUE_BYTES,
        "{allocated_before} -> {allocated_after}"
    );
    let pool = Pool::open(dir.path()).unwrap();
    assert!(contents(&pool)["disk"] == expected);
    assert!(pool.check(false).unwrap().is_clean());
}
