//! Pool builders and timers for the `bench/run` suite (bench/harness/):
//! things that are much faster through the engine's API than through
//! thousands of `grove` processes. Each prints one JSON object on stdout
//! for the harness to read; the harness measures everything a user sees
//! (NBD I/O, `grove list`) with the real binaries.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grove_store::{Pool, PoolOptions};
use serde_json::json;

use crate::{Rng, BLOCK_BYTES};

fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// A block's worth of bytes that differs from one write to the next, so that
/// no layer of any peer could tell two writes apart by content.
fn block_pattern(seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut block = vec![0u8; BLOCK_BYTES as usize];
    for word in block.chunks_exact_mut(8) {
        word.copy_from_slice(&rng.next().to_le_bytes());
    }
    block
}

/// A chain of clones `BASE-1` ... `BASE-DEPTH` on top of volume BASE of an
/// existing pool: each clone is taken from the previous one, then gets
/// `writes_per_level` random 4 KiB writes, so data is spread along the
/// chain. Writes the offsets of every level to `offsets_out` as JSON (a list
/// per level, level 1 first), so that a qcow2 chain can get the same writes.
pub fn chain(
    pool_dir: &Path,
    base: &str,
    depth: u64,
    writes_per_level: u64,
    offsets_out: &Path,
) -> Result<()> {
    let started = Instant::now();
    let pool = Pool::open(pool_dir).with_context(|| format!("open {}", pool_dir.display()))?;
    let size_bytes = pool.volume_info(base)?.summary.size_bytes;
    let blocks = size_bytes / BLOCK_BYTES;
    if blocks == 0 {
        bail!("volume {base} is smaller than a block");
    }
    let mut rng = Rng(0x5eed_c4a1_0000_0001);
    let mut levels: Vec<Vec<u64>> = Vec::new();
    let mut previous = base.to_string();
    for level in 1..=depth {
        let name = format!("{base}-{level}");
        pool.clone_volume(&previous, &name)?;
        let volume = pool.volume(&name)?;
        let mut offsets = Vec::new();
        for i in 0..writes_per_level {
            let offset = (rng.next() % blocks) * BLOCK_BYTES;
            volume.write_at(&block_pattern(level << 20 | i), offset)?;
            offsets.push(offset);
        }
        volume.flush()?;
        levels.push(offsets);
        previous = name;
    }
    std::fs::write(offsets_out, serde_json::to_vec(&levels)?)
        .with_context(|| format!("write {}", offsets_out.display()))?;
    pool.close()?;
    println!(
        "{}",
        json!({ "depth": depth, "writes_per_level": writes_per_level, "build_ms": elapsed_ms(started) })
    );
    Ok(())
}

// The arguments of `bench snapshots` (its help is the variant's).
#[derive(clap::Args, Debug)]
pub struct SnapshotsArgs {
    #[arg(long)]
    pub pool: PathBuf,
    #[arg(long)]
    pub volume: String,
    #[arg(long)]
    pub to: u64,
    #[arg(long, default_value_t = 1)]
    pub report_from: u64,
    /// How many of the last snapshots' times to print.
    #[arg(long, default_value_t = 5)]
    pub window: usize,
    /// Stop making snapshots after this long, whatever the count.
    #[arg(long, default_value_t = f64::INFINITY)]
    pub max_seconds: f64,
}

impl SnapshotsArgs {
    pub fn run(&self) -> Result<()> {
        snapshots(
            &self.pool,
            &self.volume,
            self.to,
            self.report_from,
            self.window,
            self.max_seconds,
        )
    }
}

/// Snapshots `VOLUME@1`, `VOLUME@2`, ... of one volume until there are
/// `to` of them (continuing from those already there), with one 4 KiB write
/// into the volume between two snapshots, or until `max_seconds` have gone
/// by. Prints the time each snapshot numbered `report_from` or more took,
/// the times of the last `window` snapshots made, and the time to open the
/// pool.
pub fn snapshots(
    pool_dir: &Path,
    volume_name: &str,
    to: u64,
    report_from: u64,
    window: usize,
    max_seconds: f64,
) -> Result<()> {
    let opening = Instant::now();
    let pool = Pool::open(pool_dir).with_context(|| format!("open {}", pool_dir.display()))?;
    let open_ms = elapsed_ms(opening);
    let prefix = format!("{volume_name}@");
    let mut count = pool
        .volume_names()
        .iter()
        .filter(|name| name.starts_with(&prefix))
        .count() as u64;
    let volume = pool.volume(volume_name)?;
    let blocks = volume.size_bytes()? / BLOCK_BYTES;
    let mut rng = Rng(0x5eed_5a95_0000_0001 ^ count);
    let building = Instant::now();
    let mut reported: BTreeMap<String, f64> = BTreeMap::new();
    let mut last_ms: VecDeque<f64> = VecDeque::with_capacity(window + 1);
    let mut stopped = false;
    while count < to {
        if building.elapsed().as_secs_f64() > max_seconds {
            stopped = true;
            break;
        }
        count += 1;
        let started = Instant::now();
        pool.snapshot(volume_name, &format!("{prefix}{count}"))?;
        let ms = elapsed_ms(started);
        if count >= report_from {
            reported.insert(count.to_string(), ms);
        }
        last_ms.push_back(ms);
        if last_ms.len() > window {
            last_ms.pop_front();
        }
        volume.write_at(&block_pattern(count), (rng.next() % blocks) * BLOCK_BYTES)?;
    }
    volume.flush()?;
    pool.close()?;
    println!(
        "{}",
        json!({
            "count": count,
            "stopped": stopped,
            "open_ms": open_ms,
            "build_ms": elapsed_ms(building),
            "snapshot_ms": reported,
            "last_ms": last_ms,
        })
    );
    Ok(())
}

/// A fresh pool for the memory workload: one volume of `size_gib` with a
/// 4 KiB block written every `stride_kib` (so every radix leaf exists),
/// then `snapshot_count` snapshots with `writes_between` random 4 KiB writes
/// into the volume after each, so the snapshots' trees differ.
pub fn memory_pool(
    pool_dir: &Path,
    size_gib: u64,
    stride_kib: u64,
    snapshot_count: u64,
    writes_between: u64,
) -> Result<()> {
    let started = Instant::now();
    if pool_dir.exists() {
        bail!(
            "{} exists; the memory pool is built fresh",
            pool_dir.display()
        );
    }
    let pool = Pool::create(pool_dir, &PoolOptions::default())?;
    let size_bytes = size_gib << 30;
    pool.create_volume("disk", size_bytes)?;
    let volume = pool.volume("disk")?;
    let stride_bytes = (stride_kib << 10).max(BLOCK_BYTES);
    let mut offset = 0;
    let mut written = 0u64;
    while offset < size_bytes {
        volume.write_at(&block_pattern(written), offset)?;
        written += 1;
        offset += stride_bytes;
    }
    volume.flush()?;
    let blocks = size_bytes / BLOCK_BYTES;
    let mut rng = Rng(0x5eed_3e30_0000_0001);
    for i in 1..=snapshot_count {
        pool.snapshot("disk", &format!("disk@{i}"))?;
        for _ in 0..writes_between {
            volume.write_at(&block_pattern(written), (rng.next() % blocks) * BLOCK_BYTES)?;
            written += 1;
        }
    }
    volume.flush()?;
    pool.close()?;
    println!(
        "{}",
        json!({
            "size_gib": size_gib,
            "snapshots": snapshot_count,
            "blocks_written": written,
            "build_ms": elapsed_ms(started),
        })
    );
    Ok(())
}
