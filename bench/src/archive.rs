//! The archive workload's day of writes (bench/harness/workloads/archive.py):
//! random 4 KiB blocks rewritten with random data in a pool's volume and,
//! identically, in a raw image file that restic backs up, so that both
//! peers keep the same bytes. In-process: 1% of a 1 GiB volume is 2,621
//! writes, which one `grove write` process each would take minutes.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use grove_store::Pool;
use serde_json::json;

use crate::{Rng, BLOCK_BYTES};

#[derive(clap::Args)]
pub struct ScribbleArgs {
    #[arg(long)]
    pool: PathBuf,
    #[arg(long)]
    volume: String,
    /// The raw image that gets the same writes (created with the volume)
    #[arg(long)]
    image: PathBuf,
    /// Create the volume and the image this big, filled with random data
    #[arg(long)]
    create_bytes: Option<u64>,
    /// The share of the volume's 4 KiB blocks rewritten (0.01 = 1%)
    #[arg(long, default_value_t = 0.01)]
    fraction: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl ScribbleArgs {
    pub fn run(self) -> Result<()> {
        let pool =
            Pool::open(&self.pool).with_context(|| format!("open {}", self.pool.display()))?;
        let image = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.image)
            .with_context(|| format!("open {}", self.image.display()))?;
        let mut rng = Rng(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut block = vec![0u8; BLOCK_BYTES as usize];
        let fill = |rng: &mut Rng, block: &mut [u8]| {
            for chunk in block.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next().to_le_bytes());
            }
        };
        let (offsets, size): (Vec<u64>, u64) = match self.create_bytes {
            Some(size) => {
                pool.create_volume(&self.volume, size)?;
                image.set_len(size)?;
                (
                    (0..size / BLOCK_BYTES).map(|b| b * BLOCK_BYTES).collect(),
                    size,
                )
            }
            None => {
                let size = pool.volume(&self.volume)?.size_bytes()?;
                let blocks = size / BLOCK_BYTES;
                let count = ((blocks as f64) * self.fraction).round() as u64;
                (
                    (0..count)
                        .map(|_| rng.next() % blocks * BLOCK_BYTES)
                        .collect(),
                    size,
                )
            }
        };
        let volume = pool.volume(&self.volume)?;
        for &offset in &offsets {
            fill(&mut rng, &mut block);
            volume.write_at(&block, offset)?;
            image.write_all_at(&block, offset)?;
        }
        volume.flush()?;
        image.sync_all()?;
        drop(volume);
        pool.close()?;
        println!(
            "{}",
            json!({"written_blocks": offsets.len(), "size_bytes": size})
        );
        Ok(())
    }
}
