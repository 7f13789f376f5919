//! How long foreground reads wait while the pool lists or prunes many
//! snapshots (issue 25, point 5). Not a test: it prints figures.
//!
//! ```text
//! cargo run --release -p grove-store --example lock_stall -- build DIR 100000
//! cargo run --release -p grove-store --example lock_stall -- list DIR
//! cargo run --release -p grove-store --example lock_stall -- resize DIR
//! cargo run --release -p grove-store --example lock_stall -- prune DIR 10000 [one-by-one]
//! ```
//!
//! `build` makes a pool in DIR: volume `v` (1 GiB, 64 MiB written) and N
//! snapshots `v@1..=N`, one random 4 KiB write into `v` between each. The
//! store is a file, but flushes are skipped (fsync would make the build
//! take hours; reads, the thing measured, go through the page cache as
//! they do in production). `list` lists it once while a reader thread reads
//! random 4 KiB blocks of `v`, and prints the listing's time and the
//! reader's worst latency during it and during as long a quiet spell.
//! `prune` removes the oldest N snapshots (in batches through
//! `Pool::remove_snapshots`, or with `one-by-one` through `Pool::remove`),
//! then reclaims, under the same reader, and prints times and the bytes
//! written to the store (all metadata: the reader writes nothing).
//! `resize` grows `v` to twice its size and back under the reader.
//! With LOCK_STALL_FLUSH=1 in the environment, flushes and durable writes
//! reach the file as in production.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use grove_store::{BlockDevice, FileDevice, Pool, PoolOptions};

const VOLUME_BYTES: u64 = 1 << 30;
const WRITTEN_BYTES: u64 = 64 << 20;
const READ_BYTES: usize = 4096;

/// A store file whose flushes are skipped, counting what is written.
struct CountingFile {
    file: FileDevice,
    written_bytes: AtomicU64,
    writes: AtomicU64,
}

impl BlockDevice for CountingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.file.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        if std::env::var_os("LOCK_STALL_FLUSH").is_some() {
            return self.file.flush();
        }
        Ok(())
    }
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if std::env::var_os("LOCK_STALL_FLUSH").is_some() {
            return self.file.write_durable_at(buf, offset);
        }
        self.write_at(buf, offset)
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

fn counting(file: FileDevice) -> Arc<CountingFile> {
    Arc::new(CountingFile {
        file,
        written_bytes: AtomicU64::new(0),
        writes: AtomicU64::new(0),
    })
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn build(dir: &Path, snapshots: u64) -> grove_store::Result<()> {
    std::fs::create_dir_all(dir).unwrap();
    let device = counting(FileDevice::create_new(&dir.join("store")).unwrap());
    let pool = Pool::format(device, &PoolOptions::default(), dir, None)?;
    pool.create_volume("v", VOLUME_BYTES)?;
    let volume = pool.volume("v")?;
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..WRITTEN_BYTES / (1 << 20) {
        volume.write_at(&chunk, i << 20)?;
    }
    let mut rng = Rng(0x5eed);
    let block = vec![0xa5u8; READ_BYTES];
    let started = Instant::now();
    for i in 1..=snapshots {
        pool.snapshot("v", &format!("v@{i}"))?;
        let offset = rng.next() % (WRITTEN_BYTES / READ_BYTES as u64) * READ_BYTES as u64;
        volume.write_at(&block, offset)?;
        if i % 10_000 == 0 {
            eprintln!("{i} snapshots, {:.1} s", started.elapsed().as_secs_f64());
        }
    }
    pool.close()
}

fn open(dir: &Path) -> grove_store::Result<(Pool, Arc<CountingFile>)> {
    let device = counting(FileDevice::open(&dir.join("store")).unwrap());
    let pool = Pool::open_device(device.clone(), dir, None)?;
    Ok((pool, device))
}

/// Reads slower than this are counted apart: the machine's own noise
/// (other processes on 2 shared cores) reaches tens of ms now and then.
const SLOW_READ: Duration = Duration::from_millis(5);

/// Reads random 4 KiB blocks of `v` until told to stop; returns the worst
/// latency and how many reads it made, and how many were slower than
/// SLOW_READ.
fn reader(pool: Pool, stop: Arc<AtomicBool>) -> (Duration, u64, u64) {
    let volume = pool.volume("v").unwrap();
    let mut rng = Rng(0xbeef);
    let mut buf = vec![0u8; READ_BYTES];
    let mut worst = Duration::ZERO;
    let mut reads = 0;
    let mut slow = 0;
    while !stop.load(Ordering::Relaxed) {
        let offset = rng.next() % (WRITTEN_BYTES / READ_BYTES as u64) * READ_BYTES as u64;
        let started = Instant::now();
        volume.read_at(&mut buf, offset).unwrap();
        let took = started.elapsed();
        worst = worst.max(took);
        slow += u64::from(took > SLOW_READ);
        reads += 1;
    }
    (worst, reads, slow)
}

/// What the reader saw: worst latency, reads, reads slower than SLOW_READ.
struct Seen(Duration, u64, u64);

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "worst read {:.2} ms, {} reads, {} over {} ms",
            ms(self.0),
            self.1,
            self.2,
            SLOW_READ.as_millis()
        )
    }
}

/// Runs `work` while the reader reads; returns its result, its time and
/// what the reader saw.
fn with_reader<T>(pool: &Pool, work: impl FnOnce() -> T) -> (T, Duration, Seen) {
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || reader(pool, stop))
    };
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    let out = work();
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (worst, reads, slow) = thread.join().unwrap();
    (out, took, Seen(worst, reads, slow))
}

/// What the reader sees in a quiet spell as long as `took` (200 ms at
/// least): the figures to compare a measured one with.
fn quiet_spell(pool: &Pool, took: Duration) -> (Duration, Seen) {
    let (_, quiet, seen) = with_reader(pool, || {
        std::thread::sleep(took.max(Duration::from_millis(200)))
    });
    (quiet, seen)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn list(dir: &Path) -> grove_store::Result<()> {
    let (pool, _) = open(dir)?;
    // Warm the page cache and the node cache as a served pool would be.
    let started = Instant::now();
    pool.volumes()?;
    println!(
        "list alone (first, cold node cache): {:.0} ms",
        ms(started.elapsed())
    );
    let started = Instant::now();
    pool.volumes()?;
    println!("list alone (again): {:.0} ms", ms(started.elapsed()));
    let (listed, took, seen) = with_reader(&pool, || pool.volumes());
    let count = listed?.len();
    let (quiet, quiet_seen) = quiet_spell(&pool, took);
    println!(
        "list of {count} volumes beside a reader: {:.0} ms; reader: {seen}; in a quiet {:.0} ms: {quiet_seen}",
        ms(took),
        ms(quiet),
    );
    Ok(())
}

fn prune(dir: &Path, count: u64, one_by_one: bool) -> grove_store::Result<()> {
    let (pool, device) = open(dir)?;
    let names: Vec<String> = (1..=count).map(|i| format!("v@{i}")).collect();
    let before = device.written_bytes.load(Ordering::Relaxed);
    let before_writes = device.writes.load(Ordering::Relaxed);
    let (removed, took, seen) = with_reader(&pool, || -> grove_store::Result<()> {
        if one_by_one {
            for name in &names {
                pool.remove_volume(name)?;
            }
        } else {
            remove_batched(&pool, &names)?;
        }
        Ok(())
    });
    removed?;
    let written = device.written_bytes.load(Ordering::Relaxed) - before;
    let writes = device.writes.load(Ordering::Relaxed) - before_writes;
    println!(
        "remove {count} snapshots ({}): {:.0} ms, {} KiB written in {writes} writes ({:.2} blocks of 4 KiB per snapshot); reader: {seen}",
        if one_by_one { "one by one" } else { "batched" },
        ms(took),
        written / 1024,
        written as f64 / 4096.0 / count as f64,
    );
    let before = device.written_bytes.load(Ordering::Relaxed);
    let (reclaimed, took, seen) = with_reader(&pool, || pool.reclaim_all(|_| {}));
    let freed = reclaimed?;
    println!(
        "reclaim: {:.0} ms, {} MiB freed, {} KiB written; reader: {seen}",
        ms(took),
        freed >> 20,
        (device.written_bytes.load(Ordering::Relaxed) - before) / 1024,
    );
    let (quiet, quiet_seen) = quiet_spell(&pool, took);
    println!("quiet {:.0} ms: {quiet_seen}", ms(quiet));
    pool.close()
}

fn resize(dir: &Path) -> grove_store::Result<()> {
    let (pool, _) = open(dir)?;
    pool.volumes()?;
    let size = pool.volume_info("v")?.summary.size_bytes;
    for (what, to) in [("grow", 2 * size), ("shrink", size)] {
        let (resized, took, seen) = with_reader(&pool, || pool.resize_volume("v", to));
        resized?;
        let (quiet, quiet_seen) = quiet_spell(&pool, took);
        println!(
            "resize ({what}) beside a reader: {:.1} ms; reader: {seen}; in a quiet {:.0} ms: {quiet_seen}",
            ms(took),
            ms(quiet),
        );
    }
    pool.close()
}

fn remove_batched(pool: &Pool, names: &[String]) -> grove_store::Result<()> {
    let summary = pool.remove_snapshots(names, Default::default())?;
    assert_eq!(summary.removed.len(), names.len());
    println!("{} batches", summary.batches);
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = Path::new(args.get(1).expect("usage: build|list|prune DIR [N]"));
    let n = |default: u64| args.get(2).map_or(default, |s| s.parse().expect("a count"));
    let result = match args[0].as_str() {
        "build" => build(dir, n(100_000)),
        "list" => list(dir),
        "resize" => resize(dir),
        "prune" => prune(
            dir,
            n(10_000),
            args.get(3).is_some_and(|a| a == "one-by-one"),
        ),
        other => panic!("unknown command {other}"),
    };
    if let Err(e) = result {
        eprintln!("lock_stall: error: {e}");
        std::process::exit(1);
    }
}
