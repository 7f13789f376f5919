//! Pool builders for the replication workload of `bench/run`
//! (bench/harness/workloads/replication.py): writes at given extents and
//! snapshots with no writes between them, through the engine's API (a
//! `grove` process per write or per snapshot would take minutes). The
//! transfers themselves are timed with the real `grove send` and
//! `grove receive` processes.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grove_store::{Pool, PoolOptions};
use serde_json::json;

use crate::{Rng, BLOCK_BYTES};

const CHUNK_BYTES: u64 = 4 << 20;

fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// Writes every `[offset, length]` extent of the JSON file `extents` into
/// VOLUME (made first, of `create_bytes`, when that is given; the pool
/// too, if it does not exist). The bytes come from `data` read straight
/// through (it must hold the extents' total), or without it from a
/// pseudo-random generator, different for every chunk, so no two blocks
/// are alike.
pub fn write_extents(
    pool_dir: &Path,
    volume_name: &str,
    create_bytes: Option<u64>,
    extents_path: &Path,
    data: Option<&Path>,
) -> Result<()> {
    let started = Instant::now();
    let extents: Vec<(u64, u64)> = serde_json::from_slice(
        &std::fs::read(extents_path).with_context(|| format!("read {}", extents_path.display()))?,
    )?;
    let pool = if pool_dir.exists() {
        Pool::open(pool_dir)
    } else {
        Pool::create(pool_dir, &PoolOptions::default())
    }
    .with_context(|| format!("open {}", pool_dir.display()))?;
    if let Some(size) = create_bytes {
        pool.create_volume(volume_name, size)?;
    }
    let volume = pool.volume(volume_name)?;
    let mut source = data
        .map(|p| File::open(p).with_context(|| format!("open {}", p.display())))
        .transpose()?;
    let mut rng = Rng(0x5eed_7e91_0000_0001);
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    let mut written = 0u64;
    for &(offset, length) in &extents {
        if offset % BLOCK_BYTES != 0 || length % BLOCK_BYTES != 0 {
            bail!("extent {offset}+{length} is not in whole {BLOCK_BYTES}-byte blocks");
        }
        let mut done = 0;
        while done < length {
            let n = (length - done).min(CHUNK_BYTES) as usize;
            match source.as_mut() {
                Some(file) => file
                    .read_exact(&mut buf[..n])
                    .context("data file too short")?,
                None => {
                    for word in buf[..n].chunks_exact_mut(8) {
                        word.copy_from_slice(&rng.next().to_le_bytes());
                    }
                }
            }
            volume.write_at(&buf[..n], offset + done)?;
            done += n as u64;
        }
        written += length;
    }
    volume.flush()?;
    pool.close()?;
    println!(
        "{}",
        json!({ "extents": extents.len(), "bytes_written": written, "build_ms": elapsed_ms(started) })
    );
    Ok(())
}

/// Snapshots `VOLUME@FIRST` ... `VOLUME@LAST` of VOLUME with nothing
/// written between them.
pub fn empty_snapshots(pool_dir: &Path, volume_name: &str, first: u64, last: u64) -> Result<()> {
    let started = Instant::now();
    let pool = Pool::open(pool_dir).with_context(|| format!("open {}", pool_dir.display()))?;
    for i in first..=last {
        pool.snapshot(volume_name, &format!("{volume_name}@{i}"))?;
    }
    pool.close()?;
    println!(
        "{}",
        json!({ "snapshots": (last + 1).saturating_sub(first), "build_ms": elapsed_ms(started) })
    );
    Ok(())
}
