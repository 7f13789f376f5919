//! grove's benchmark workloads, one per subcommand. Each prints what it
//! measured on one line; timings to quote come from running the whole
//! process against its peer in the same run (see bench/README.md).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use grove_store::{Pool, PoolOptions};

mod archive;
mod archive_scale;
mod lifecycle;
mod replication;
mod retention;
mod sparse_device;
mod suite;

pub(crate) const BLOCK_BYTES: u64 = 4096;

#[derive(Parser)]
#[command(about = "grove benchmark workloads")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Random 4 KiB writes with a flush every N writes, on a fresh grove
    /// volume or (with --raw) on a plain sparse file.
    JournalWrites {
        /// Directory to work in; the pool or file is made fresh inside it.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 20_000)]
        writes: u64,
        #[arg(long, default_value_t = 64)]
        flush_every: u64,
        /// Size of the volume (or file) written into, in MiB.
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        /// Write into a plain file with pwrite and fdatasync instead.
        #[arg(long)]
        raw: bool,
    },
    /// Time and space of snapshots of a --size-gib volume holding --data-gib of
    /// data: each snapshot is durable when it returns (it commits).
    SnapshotCost {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 10)]
        size_gib: u64,
        #[arg(long, default_value_t = 1)]
        data_gib: u64,
        #[arg(long, default_value_t = 50)]
        snapshots: u64,
    },
    /// Builds a pool with one volume of --size-gib full of data and --snapshots
    /// snapshots of it (once; kept in --dir), then times `check`.
    CheckSpeed {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 10)]
        size_gib: u64,
        #[arg(long, default_value_t = 100)]
        snapshots: u64,
    },
    /// Rolling snapshots: snapshot, remove the previous one, rewrite
    /// --write-mib at random, --cycles times; prints used against referenced.
    Rolling {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 100)]
        cycles: u64,
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        #[arg(long, default_value_t = 64)]
        write_mib: u64,
    },
    /// Removes a snapshot holding --unique-mib of its own data, then reclaims
    /// it in the background while another volume takes random 4 KiB writes;
    /// prints rm and reclaim times and foreground IOPS during against without.
    Reclaim {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1024)]
        unique_mib: u64,
        /// Seconds of foreground writes measured without reclaim (and at
        /// most that long during it).
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Diff of a --size-gib volume against its snapshot after --changed-mib
    /// were rewritten (on a memory device that stores no zero data).
    Diff {
        #[arg(long, default_value_t = 64)]
        size_gib: u64,
        #[arg(long, default_value_t = 1)]
        changed_mib: u64,
    },
    /// bench/run: a chain of --depth clones of volume --base in an existing
    /// pool, each with --writes-per-level random 4 KiB writes; the offsets
    /// go to --offsets-out as JSON.
    Chain {
        #[arg(long)]
        pool: PathBuf,
        #[arg(long)]
        base: String,
        #[arg(long)]
        depth: u64,
        #[arg(long, default_value_t = 16)]
        writes_per_level: u64,
        #[arg(long)]
        offsets_out: PathBuf,
    },
    /// bench/run: snapshots of --volume in an existing pool until there are
    /// --to of them; prints the time of each numbered --report-from or more.
    Snapshots(suite::SnapshotsArgs),
    /// bench/run: a fresh pool with a --size-gib volume, a 4 KiB block every
    /// --stride-kib, and --snapshots snapshots with --writes-between random
    /// writes after each.
    MemoryPool {
        #[arg(long)]
        pool: PathBuf,
        #[arg(long, default_value_t = 64)]
        size_gib: u64,
        #[arg(long, default_value_t = 1024)]
        stride_kib: u64,
        #[arg(long, default_value_t = 1000)]
        snapshots: u64,
        #[arg(long, default_value_t = 64)]
        writes_between: u64,
    },
    /// bench/run: writes the `[offset, length]` extents of the JSON file
    /// --extents into --volume (made first with --create-size), with bytes
    /// from --data read straight through, or pseudo-random ones without it.
    WriteExtents {
        #[arg(long)]
        pool: PathBuf,
        #[arg(long)]
        volume: String,
        /// Create the volume first, of this many bytes (and the pool, if
        /// it does not exist).
        #[arg(long)]
        create_size: Option<u64>,
        #[arg(long)]
        extents: PathBuf,
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// bench/run: snapshots VOLUME@FIRST ... VOLUME@LAST with no writes
    /// between them.
    EmptySnapshots {
        #[arg(long)]
        pool: PathBuf,
        #[arg(long)]
        volume: String,
        #[arg(long)]
        first: u64,
        #[arg(long)]
        last: u64,
    },
    /// bench/run: snapshots VOLUME@1 ... VOLUME@COUNT ranked --rank, dated
    /// --step-secs apart from --first-unix-secs, with --writes-between 4 KiB
    /// writes after each; the store's flushes skipped until the end.
    RankedSnapshots(retention::RankedArgs),
    /// The archive workload's day: random 4 KiB blocks rewritten in a
    /// pool's volume and identically in a raw image (restic's input)
    Scribble(archive::ScribbleArgs),
    /// bench/run: an archive of --snapshots snapshots of a --volume-bytes
    /// volume made directly in a store, laid out as pushes lay it out
    ArchiveScale(archive_scale::ArchiveScaleArgs),
}

/// xorshift64*: the same offsets in every run and for every peer.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

pub(crate) fn fresh_dir(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if path.exists() {
        std::fs::remove_dir_all(&path)
            .with_context(|| format!("cannot clear {}", path.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    Ok(path)
}

fn journal_writes(
    dir: &Path,
    writes: u64,
    flush_every: u64,
    size_mib: u64,
    raw: bool,
) -> Result<()> {
    let size_bytes = size_mib << 20;
    let blocks = size_bytes / BLOCK_BYTES;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let buf = vec![0xa5u8; BLOCK_BYTES as usize];
    let started;
    if raw {
        let path = fresh_dir(dir, "raw")?;
        std::fs::create_dir_all(&path)?;
        let file = File::create(path.join("disk.raw"))?;
        file.set_len(size_bytes)?;
        started = Instant::now();
        for i in 1..=writes {
            file.write_all_at(&buf, (rng.next() % blocks) * BLOCK_BYTES)?;
            if i % flush_every == 0 {
                file.sync_data()?;
            }
        }
        file.sync_data()?;
    } else {
        let path = fresh_dir(dir, "pool")?;
        let pool = Pool::create(&path, &PoolOptions::default())?;
        pool.create_volume("disk", size_bytes)?;
        let volume = pool.volume("disk")?;
        started = Instant::now();
        for i in 1..=writes {
            volume.write_at(&buf, (rng.next() % blocks) * BLOCK_BYTES)?;
            if i % flush_every == 0 {
                volume.flush()?;
            }
        }
        volume.flush()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{} random 4K writes, flush every {flush_every}: {:.0} IOPS ({seconds:.2} s)",
        if raw {
            "raw file"
        } else if cfg!(feature = "unsafe-no-journal") {
            "grove without journal"
        } else {
            "grove"
        },
        writes as f64 / seconds
    );
    Ok(())
}

fn check_speed(dir: &Path, size_gib: u64, snapshots: u64) -> Result<()> {
    let path = dir.join(format!("check-{size_gib}g-{snapshots}s"));
    if !path.exists() {
        let pool = Pool::create(&path, &PoolOptions::default())?;
        pool.create_volume("disk", size_gib << 30)?;
        let volume = pool.volume("disk")?;
        let chunk = vec![0x5au8; 4 << 20];
        let mut offset = 0;
        while offset < size_gib << 30 {
            volume.write_at(&chunk, offset)?;
            offset += chunk.len() as u64;
        }
        for i in 0..snapshots {
            pool.snapshot("disk", &format!("disk@{i}"))?;
            // A little divergence between snapshots, so they are not identical.
            volume.write_at(&chunk[..64 * 1024], (i * 97 % (size_gib * 256)) << 22)?;
        }
        pool.close()?;
    }
    let started = Instant::now();
    let pool = Pool::open(&path)?;
    let opened = started.elapsed();
    let report = pool.check(false)?;
    let total = started.elapsed();
    println!(
        "check of {size_gib} GiB with {snapshots} snapshots: {} ({} errors), {} blocks checked, {} blocks/s; open {:.2} s, open+check {:.2} s",
        if report.is_clean() { "clean" } else { "NOT clean" },
        report.errors.len(),
        report.blocks_checked,
        report.blocks_per_second(),
        opened.as_secs_f64(),
        total.as_secs_f64()
    );
    Ok(())
}

fn snapshot_cost(dir: &Path, size_gib: u64, data_gib: u64, snapshots: u64) -> Result<()> {
    let path = fresh_dir(dir, "snapshot-cost")?;
    let pool = Pool::create(&path, &PoolOptions::default())?;
    pool.create_volume("disk", size_gib << 30)?;
    let volume = pool.volume("disk")?;
    let chunk = vec![0x3cu8; 4 << 20];
    // The data is spread over the whole volume: 4 MiB every size/data.
    let stride = (size_gib / data_gib.max(1)) << 22;
    for i in 0..(data_gib << 30) / chunk.len() as u64 {
        volume.write_at(&chunk, i * stride)?;
    }
    volume.flush()?;
    let used_before = pool.info()?.used_bytes;
    let mut times_ms = Vec::new();
    for i in 0..snapshots {
        let started = Instant::now();
        pool.snapshot("disk", &format!("disk@{i}"))?;
        times_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let used_after = pool.info()?.used_bytes;
    times_ms.sort_by(f64::total_cmp);
    println!(
        "snapshot of a {size_gib} GiB volume holding {data_gib} GiB: median {:.2} ms, max {:.2} ms over {snapshots}; space per snapshot {} bytes ({} MiB of data referenced each)",
        times_ms[times_ms.len() / 2],
        times_ms[times_ms.len() - 1],
        (used_after - used_before) / snapshots,
        pool.volume_info("disk@0")?.summary.referenced_bytes >> 20
    );
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::JournalWrites {
            dir,
            writes,
            flush_every,
            size_mib,
            raw,
        } => journal_writes(&dir, writes, flush_every, size_mib, raw),
        Command::CheckSpeed {
            dir,
            size_gib,
            snapshots,
        } => check_speed(&dir, size_gib, snapshots),
        Command::SnapshotCost {
            dir,
            size_gib,
            data_gib,
            snapshots,
        } => snapshot_cost(&dir, size_gib, data_gib, snapshots),
        Command::Rolling {
            dir,
            cycles,
            size_mib,
            write_mib,
        } => lifecycle::rolling(&dir, cycles, size_mib, write_mib),
        Command::Reclaim {
            dir,
            unique_mib,
            seconds,
        } => lifecycle::reclaim(&dir, unique_mib, seconds),
        Command::Diff {
            size_gib,
            changed_mib,
        } => lifecycle::diff(size_gib, changed_mib),
        Command::Chain {
            pool,
            base,
            depth,
            writes_per_level,
            offsets_out,
        } => suite::chain(&pool, &base, depth, writes_per_level, &offsets_out),
        Command::Snapshots(args) => args.run(),
        Command::MemoryPool {
            pool,
            size_gib,
            stride_kib,
            snapshots,
            writes_between,
        } => suite::memory_pool(&pool, size_gib, stride_kib, snapshots, writes_between),
        Command::WriteExtents {
            pool,
            volume,
            create_size,
            extents,
            data,
        } => replication::write_extents(&pool, &volume, create_size, &extents, data.as_deref()),
        Command::EmptySnapshots {
            pool,
            volume,
            first,
            last,
        } => replication::empty_snapshots(&pool, &volume, first, last),
        Command::RankedSnapshots(args) => args.run(),
        Command::Scribble(args) => args.run(),
        Command::ArchiveScale(args) => args.run(),
    }
}
