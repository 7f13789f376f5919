//! Pool builder for the retention workload of `bench/run`
//! (bench/harness/workloads/retention.py): thousands of snapshots of one
//! volume, each ranked and dated as the scheduler would have taken them,
//! made in-process in seconds. A `grove snapshot` process per snapshot, or
//! a commit's fsync per snapshot, would take minutes for 100,000. What is
//! timed (prune, reclaim, list) runs later through the real `grove`
//! processes against `grove serve`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grove_store::config::PoolConfig;
use grove_store::{BlockDevice, FileDevice, Pool};
use serde_json::json;

use crate::{Rng, BLOCK_BYTES};

const CHUNK_BYTES: u64 = 4 << 20;

/// The pool's store file with its flushes skipped while the pool is built:
/// fsync per snapshot is what makes building slow, and nothing here needs
/// to survive a crash mid-build. `finish` flushes once at the end.
struct BuildDevice {
    file: FileDevice,
}

impl BlockDevice for BuildDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len_bytes(&self) -> io::Result<u64> {
        self.file.len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.file.set_len_bytes(len_bytes)
    }
    fn describe(&self) -> String {
        self.file.describe()
    }
}

// The arguments of `bench ranked-snapshots` (its help is the variant's).
#[derive(clap::Args, Debug)]
pub struct RankedArgs {
    #[arg(long)]
    pub pool: PathBuf,
    #[arg(long)]
    pub volume: String,
    /// Create the volume first, of this many bytes.
    #[arg(long)]
    pub create_size: Option<u64>,
    /// With --create-size: bytes of data written at its start.
    #[arg(long, default_value_t = 0)]
    pub prefill_bytes: u64,
    #[arg(long)]
    pub count: u64,
    /// Retention rank (0: none, 1: frequent, 2: hourly, ... 6: yearly).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=6))]
    pub rank: u8,
    #[arg(long, default_value_t = 1_700_000_000)]
    pub first_unix_secs: u64,
    #[arg(long, default_value_t = 3600)]
    pub step_secs: u64,
    #[arg(long, default_value_t = 0)]
    pub writes_between: u64,
}

impl RankedArgs {
    pub fn run(&self) -> Result<()> {
        let plan = Plan {
            volume: &self.volume,
            create_bytes: self.create_size,
            prefill_bytes: self.prefill_bytes,
            count: self.count,
            rank: self.rank,
            first_unix_secs: self.first_unix_secs,
            step_secs: self.step_secs,
            writes_between: self.writes_between,
        };
        ranked_snapshots(&self.pool, &plan)
    }
}

/// What `ranked_snapshots` makes.
pub struct Plan<'a> {
    pub volume: &'a str,
    /// Create the volume first, of this many bytes, and write its first
    /// `prefill_bytes` (pseudo-random data).
    pub create_bytes: Option<u64>,
    pub prefill_bytes: u64,
    pub count: u64,
    /// Retention rank of every snapshot (0: none).
    pub rank: u8,
    pub first_unix_secs: u64,
    pub step_secs: u64,
    /// 4 KiB writes into the prefilled part between two snapshots, each to
    /// the next block in turn, so each removed snapshot leaves blocks to
    /// reclaim.
    pub writes_between: u64,
}

/// Snapshots `VOLUME@1` ... `VOLUME@COUNT` of the pool in `pool_dir`,
/// ranked `rank`, dated `first_unix_secs + (i - 1) * step_secs`. Prints
/// one JSON line: snapshots, build_ms, first and last creation times.
pub fn ranked_snapshots(pool_dir: &Path, plan: &Plan) -> Result<()> {
    if plan.writes_between > 0 && plan.prefill_bytes < BLOCK_BYTES {
        bail!("--writes-between needs --prefill-bytes of at least one 4 KiB block");
    }
    let started = Instant::now();
    let config =
        PoolConfig::load(pool_dir).with_context(|| format!("open {}", pool_dir.display()))?;
    let store = pool_dir.join(&config.store);
    let device = Arc::new(BuildDevice {
        file: FileDevice::open(&store).with_context(|| format!("open {}", store.display()))?,
    });
    // With grove.toml's settings, so that the capacity grows by steps as
    // the build fills it, as in `grove` (without them it does not).
    let pool = Pool::open_on_device(pool_dir, device.clone(), &config)?;
    if let Some(size) = plan.create_bytes {
        pool.create_volume(plan.volume, size)
            .with_context(|| format!("create {}", plan.volume))?;
        prefill(&pool, plan.volume, plan.prefill_bytes)
            .with_context(|| format!("write the first bytes of {}", plan.volume))?;
    }
    let volume = pool.volume(plan.volume)?;
    let prefilled_blocks = (plan.prefill_bytes / BLOCK_BYTES).max(1);
    let block = vec![0xa5u8; BLOCK_BYTES as usize];
    let mut next_block = 0u64;
    for i in 1..=plan.count {
        let created = plan.first_unix_secs + (i - 1) * plan.step_secs;
        let name = format!("{}@{i}", plan.volume);
        pool.snapshot_ranked(plan.volume, &name, plan.rank, created)
            .with_context(|| format!("snapshot {name}"))?;
        for _ in 0..plan.writes_between {
            volume
                .write_at(&block, next_block % prefilled_blocks * BLOCK_BYTES)
                .with_context(|| format!("write into {} after snapshot {i}", plan.volume))?;
            next_block += 1;
        }
    }
    pool.close()?;
    // The one flush the build skipped: the pool is durable before any
    // server opens it.
    device.file.flush().context("flush the store")?;
    let last = plan.first_unix_secs + plan.count.saturating_sub(1) * plan.step_secs;
    println!(
        "{}",
        json!({ "snapshots": plan.count, "build_ms": started.elapsed().as_secs_f64() * 1000.0,
                "first_unix_secs": plan.first_unix_secs, "last_unix_secs": last })
    );
    Ok(())
}

/// Writes the first `bytes` of `volume` with pseudo-random data.
fn prefill(pool: &Pool, volume: &str, bytes: u64) -> Result<()> {
    let volume = pool.volume(volume)?;
    let mut rng = Rng(0x5eed_2500_0000_0007);
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(CHUNK_BYTES) as usize;
        for word in buf[..n].chunks_exact_mut(8) {
            word.copy_from_slice(&rng.next().to_le_bytes());
        }
        volume.write_at(&buf[..n], done)?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_store::PoolOptions;

    fn plan(count: u64, writes_between: u64) -> Plan<'static> {
        Plan {
            volume: "v",
            create_bytes: Some(16 << 20),
            prefill_bytes: 1 << 20,
            count,
            rank: 2,
            first_unix_secs: 1_700_000_000,
            step_secs: 3600,
            writes_between,
        }
    }

    #[test]
    fn snapshots_are_ranked_dated_and_durable() {
        let dir = tempfile::tempdir().unwrap();
        Pool::create(dir.path(), &PoolOptions::default())
            .unwrap()
            .close()
            .unwrap();
        ranked_snapshots(dir.path(), &plan(5, 1)).unwrap();
        let pool = Pool::open(dir.path()).unwrap();
        let snaps: Vec<_> = pool
            .volumes()
            .unwrap()
            .into_iter()
            .filter(|v| v.summary.name.starts_with("v@"))
            .collect();
        assert_eq!(snaps.len(), 5);
        let third = snaps.iter().find(|v| v.summary.name == "v@3").unwrap();
        assert_eq!(third.summary.rank, 2);
        assert_eq!(third.summary.created_unix_secs, 1_700_000_000 + 2 * 3600);
        // A write between snapshots leaves v@1 holding a block no later one has.
        assert!(pool.volume_info("v@1").unwrap().unique_bytes >= BLOCK_BYTES);
        assert!(pool.check(false).unwrap().is_clean());
    }

    #[test]
    fn writes_between_need_prefilled_blocks() {
        let dir = tempfile::tempdir().unwrap();
        Pool::create(dir.path(), &PoolOptions::default())
            .unwrap()
            .close()
            .unwrap();
        let mut bad = plan(1, 1);
        bad.prefill_bytes = 0;
        let err = ranked_snapshots(dir.path(), &bad).unwrap_err();
        assert!(err.to_string().contains("--prefill-bytes"), "{err}");
    }
}
