//! Workloads for exact sharing and history (issue 14): rolling snapshots,
//! removing a snapshot while foreground writes go on, and `diff` whose cost
//! must follow what changed rather than the volume size.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use grove_store::{Pool, PoolOptions, Volume};

use crate::sparse_device::SparseMemDevice;
use crate::{fresh_dir, Rng, BLOCK_BYTES};

const MIB: u64 = 1 << 20;
/// Foreground writes flush this often, as a file system or VM would.
const FLUSH_EVERY_WRITES: u64 = 64;
/// The reclaimer's pause between batches, as `grove serve` runs it.
const RECLAIM_PAUSE: Duration = Duration::from_millis(2);

/// Snapshot, remove the previous snapshot, rewrite part of the volume:
/// `cycles` times. Prints used against referenced after the last cycle.
pub fn rolling(dir: &Path, cycles: u64, size_mib: u64, write_mib: u64) -> Result<()> {
    let path = fresh_dir(dir, "rolling")?;
    let pool = Pool::create(&path, &PoolOptions::default())?;
    pool.create_volume("v", size_mib * MIB)?;
    let volume = pool.volume("v")?;
    let chunk = vec![0x42u8; MIB as usize];
    for i in 0..size_mib {
        volume.write_at(&chunk, i * MIB)?;
    }
    let mut rng = Rng(7);
    for cycle in 0..cycles {
        pool.snapshot("v", &format!("v@{cycle}"))?;
        if cycle > 0 {
            pool.remove_volume(&format!("v@{}", cycle - 1))?;
            pool.reclaim_all(|_| {})?;
        }
        for _ in 0..write_mib {
            let offset = rng.next() % size_mib * MIB;
            volume.write_at(&chunk, offset)?;
        }
        volume.flush()?;
    }
    let info = pool.info()?;
    println!(
        "rolling snapshots: {cycles} cycles on a {size_mib} MiB volume rewriting {write_mib} MiB each: used {} MiB, referenced {} MiB (volume and its one live snapshot, shared data once), metadata {} MiB, pending {} B; used / referenced = {:.4}",
        info.used_bytes / MIB,
        info.referenced_bytes / MIB,
        info.metadata_bytes / MIB,
        info.pending_free_bytes,
        info.used_bytes as f64 / info.referenced_bytes as f64
    );
    Ok(())
}

/// Random 4 KiB writes into `volume` for at most `seconds` or until
/// `stop` says so, flushing every FLUSH_EVERY_WRITES; returns writes per
/// second and how many.
fn random_writes(
    volume: &Volume,
    size_bytes: u64,
    seconds: f64,
    seed: u64,
    stop: impl Fn() -> bool,
) -> Result<(f64, u64)> {
    let block = vec![0x17u8; BLOCK_BYTES as usize];
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut writes = 0u64;
    while !stop() && started.elapsed().as_secs_f64() < seconds {
        let offset = rng.next() % (size_bytes / BLOCK_BYTES) * BLOCK_BYTES;
        volume.write_at(&block, offset)?;
        writes += 1;
        if writes.is_multiple_of(FLUSH_EVERY_WRITES) {
            volume.flush()?;
        }
    }
    Ok((writes as f64 / started.elapsed().as_secs_f64(), writes))
}

/// A snapshot holding `unique_mib` of data no other volume has is removed;
/// the reclaimer gives it back in the background while another volume
/// takes random 4 KiB writes. Prints the removal time, the reclaim time and
/// foreground IOPS during the reclaim against IOPS without it, same run.
pub fn reclaim(dir: &Path, unique_mib: u64, seconds: f64) -> Result<()> {
    let path = fresh_dir(dir, "reclaim")?;
    let pool = Pool::create(&path, &PoolOptions::default())?;
    let size = unique_mib * MIB;
    let chunk = vec![0x5au8; MIB as usize];
    pool.create_volume("old", size)?;
    let old = pool.volume("old")?;
    for i in 0..unique_mib {
        old.write_at(&chunk, i * MIB)?;
    }
    // The snapshot keeps the first data; rewriting the volume makes all of
    // it the snapshot's alone.
    pool.snapshot("old", "old@1")?;
    for i in 0..unique_mib {
        old.write_at(&chunk, i * MIB)?;
    }
    pool.create_volume("busy", 1 << 30)?;
    let busy = pool.volume("busy")?;
    for i in 0..1024 {
        busy.write_at(&chunk, i * MIB)?;
    }
    pool.flush()?;
    let unique = pool.volume_info("old@1")?.unique_bytes;

    let (baseline, _) = random_writes(&busy, 1 << 30, seconds, 1, || false)?;

    let started = Instant::now();
    pool.remove_volume("old@1")?;
    let remove_ms = started.elapsed().as_secs_f64() * 1000.0;
    let done = Arc::new(AtomicBool::new(false));
    let reclaimer = {
        let pool = pool.clone();
        let done = done.clone();
        std::thread::spawn(move || -> Result<f64> {
            let started = Instant::now();
            while !pool.reclaim_batch()?.1 {
                std::thread::sleep(RECLAIM_PAUSE);
            }
            done.store(true, Ordering::Release);
            Ok(started.elapsed().as_secs_f64())
        })
    };
    // Foreground writes while the reclaimer runs (at most `seconds`).
    let (during, writes) =
        random_writes(&busy, 1 << 30, seconds, 2, || done.load(Ordering::Acquire))?;
    let reclaim_s = reclaimer.join().expect("reclaimer thread")?;
    println!(
        "remove a snapshot holding {} MiB unique: rm {remove_ms:.2} ms, reclaim {reclaim_s:.2} s in the background; foreground random 4K writes: {baseline:.0}/s without, {during:.0}/s during reclaim ({writes} writes), ratio {:.2}",
        unique / MIB,
        during / baseline
    );
    Ok(())
}

/// A `size_gib` volume, filled, snapshotted; then `changed_mib` rewritten
/// and diffed against the snapshot. The pool lives on a memory device that
/// keeps only blocks that are not all zeros (data is written as zeros, and
/// diff never reads data), so 64 GiB volumes fit in memory.
pub fn diff(size_gib: u64, changed_mib: u64) -> Result<()> {
    let device = Arc::new(SparseMemDevice::new());
    let pool = Pool::format(device, &PoolOptions::default(), Path::new("diff"), None)?;
    let size = size_gib << 30;
    pool.create_volume("v", size)?;
    let volume = pool.volume("v")?;
    let chunk = vec![0u8; 4 * MIB as usize];
    let fill = Instant::now();
    for i in 0..size / chunk.len() as u64 {
        volume.write_at(&chunk, i * chunk.len() as u64)?;
    }
    pool.snapshot("v", "v@base")?;
    // The changed MiBs are spread evenly over the volume.
    let stride = size / changed_mib.max(1);
    for i in 0..changed_mib {
        volume.write_at(&chunk[..MIB as usize], i * stride / MIB * MIB)?;
    }
    pool.flush()?;
    let prepared_s = fill.elapsed().as_secs_f64();
    let started = Instant::now();
    let report = pool.diff("v@base", "v")?;
    let diff_ms = started.elapsed().as_secs_f64() * 1000.0;
    let changed: u64 = report.extents.iter().map(|e| e.length_bytes).sum();
    println!(
        "diff of a {size_gib} GiB volume with {changed_mib} MiB changed: {diff_ms:.2} ms, {} extents, {} MiB reported (setup {prepared_s:.0} s)",
        report.extents.len(),
        changed / MIB
    );
    Ok(())
}
