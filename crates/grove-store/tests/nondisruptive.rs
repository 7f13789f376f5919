//! Issue 25, point 5: listing and pruning do not stall foreground I/O.
//! A listing of a big pool lets readers in while it runs, and gives the
//! same figures under a stream of commits as in a quiet pool; removing
//! thousands of snapshots goes in a few batches that write little
//! metadata, refuses bad requests whole, and leaves a clean pool once
//! reclaimed. No timing bound here: the reader's latency is compared with
//! the listing's own duration.

mod common;

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::assert_clean;
use grove_store::format::superblock::SUPERBLOCK_SLOTS;
use grove_store::{
    BlockDevice, ErrorKind, MemDevice, Pool, PoolOptions, RemoveOptions, BOOKMARKS_PER_PARENT_MAX,
    REMOVE_BATCH_SNAPSHOTS, SUMMARY_SLICE_VOLUMES,
};

const BLOCK: u64 = 1024;
const VOLUME_BYTES: u64 = 1024 * BLOCK;
/// A volume record's size on disk.
const RECORD_BYTES: u64 = 256;

/// A memory device counting the bytes written to it.
struct CountingDevice {
    inner: MemDevice,
    written_bytes: AtomicU64,
    flushes: AtomicU64,
    /// Writes made durable by themselves (`write_durable_at`).
    durable_writes: AtomicU64,
}

impl BlockDevice for CountingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.written_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.durable_writes.fetch_add(1, Ordering::Relaxed);
        self.write_at(buf, offset)
    }
    fn len_bytes(&self) -> io::Result<u64> {
        self.inner.len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.inner.set_len_bytes(len_bytes)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

fn counting_pool() -> (Pool, Arc<CountingDevice>) {
    let device = Arc::new(CountingDevice {
        inner: MemDevice::new(),
        written_bytes: AtomicU64::new(0),
        flushes: AtomicU64::new(0),
        durable_writes: AtomicU64::new(0),
    });
    let options = PoolOptions {
        block_size_bytes: BLOCK as u32,
        capacity_bytes: None,
        journal_bytes: Some(4 << 20),
    };
    let pool = Pool::format(device.clone(), &options, Path::new("nondisruptive"), None).unwrap();
    (pool, device)
}

/// Volume `v` with data, and `count` snapshots `v@1..` with one block of
/// `v` rewritten after each, so each snapshot owns a block alone.
fn pool_with_snapshots(count: usize) -> (Pool, Arc<CountingDevice>) {
    let (pool, device) = counting_pool();
    pool.create_volume("v", VOLUME_BYTES).unwrap();
    let volume = pool.volume("v").unwrap();
    volume
        .write_at(&vec![7u8; 256 * BLOCK as usize], 0)
        .unwrap();
    for i in 1..=count {
        pool.snapshot("v", &format!("v@{i}")).unwrap();
        let block = (i as u64 * 37) % 256;
        volume
            .write_at(&[i as u8; BLOCK as usize], block * BLOCK)
            .unwrap();
    }
    volume.flush().unwrap();
    (pool, device)
}

/// Reads of `v` made while `work` ran: (start, end) of each, and the work's.
fn reads_during(pool: &Pool, work: impl FnOnce()) -> (Vec<(Instant, Instant)>, Instant, Instant) {
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let volume = pool.volume("v").unwrap();
            let mut buf = vec![0u8; 4096];
            let mut reads = Vec::new();
            let mut rng = common::Rng(0x5eed);
            while !stop.load(Ordering::Relaxed) {
                let offset = rng.below(VOLUME_BYTES / 4096) * 4096;
                let started = Instant::now();
                volume.read_at(&mut buf, offset).unwrap();
                reads.push((started, Instant::now()));
            }
            reads
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    work();
    let ended = Instant::now();
    stop.store(true, Ordering::Relaxed);
    (reader.join().unwrap(), started, ended)
}

/// Held across the whole listing, the lock would let no read start and
/// end inside it, and the worst read would wait about as long as the
/// listing: both are checked against the listing's own duration.
#[test]
fn a_listing_of_many_volumes_lets_readers_in() {
    let (pool, _) = pool_with_snapshots(20_000);
    let quiet = pool.volumes().unwrap();
    let mut listed = Vec::new();
    let (reads, started, ended) = reads_during(&pool, || listed = pool.volumes().unwrap());
    assert_eq!(
        listed, quiet,
        "a listing beside a reader gives the quiet figures"
    );
    let listing = ended - started;
    let inside = reads
        .iter()
        .filter(|(s, e)| *s > started && *e < ended)
        .count();
    let worst = reads
        .iter()
        .filter(|(s, e)| *e > started && *s < ended)
        .map(|(s, e)| *e - *s)
        .max()
        .unwrap_or_default();
    assert!(
        inside >= 10,
        "only {inside} reads ran inside a listing of {listing:?}"
    );
    assert!(
        worst < listing / 2,
        "a read waited {worst:?} during a listing of {listing:?}"
    );
}

/// Summaries (what the reclaimer and the retention scheduler ask for) are
/// taken a slice per lock hold, with a pause between slices
/// while clients wait: were the lock held across a whole listing (100,000
/// volumes held every client for about 20 ms), no read could both start
/// and end inside one.
#[test]
fn a_summary_listing_lets_readers_in() {
    const LISTINGS: usize = 20;
    let (pool, _) = pool_with_snapshots(4 * SUMMARY_SLICE_VOLUMES);
    let quiet = pool.volume_summaries();
    assert_eq!(quiet.len(), 4 * SUMMARY_SLICE_VOLUMES + 1);
    let mut listings = Vec::new();
    let (reads, _, _) = reads_during(&pool, || {
        for _ in 0..LISTINGS {
            let started = Instant::now();
            let listed = pool.volume_summaries();
            listings.push((started, Instant::now()));
            assert_eq!(
                listed, quiet,
                "a listing beside a reader lists every volume"
            );
        }
    });
    let mut inside: Vec<usize> = listings
        .iter()
        .map(|(ls, le)| reads.iter().filter(|(s, e)| s > ls && e < le).count())
        .collect();
    inside.sort_unstable();
    // Unsliced, or sliced without a pause for waiters, the median listing
    // had no read inside; sliced with the pause, hundreds.
    assert!(
        inside[LISTINGS / 2] >= 20,
        "reads inside each of {LISTINGS} summary listings: {inside:?}"
    );
}

/// A writer commits all the time (so reads made without the lock are
/// thrown away again and again, and walks end by reading under the lock):
/// the snapshots' figures are still exactly the quiet ones.
#[test]
fn figures_under_a_stream_of_commits_are_the_quiet_ones() {
    let (pool, _) = pool_with_snapshots(400);
    pool.create_volume("busy", VOLUME_BYTES).unwrap();
    let quiet: Vec<_> = pool
        .volumes()
        .unwrap()
        .into_iter()
        .filter(|v| v.summary.name.starts_with("v@"))
        .collect();
    let quiet_info = pool.info().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let volume = pool.volume("busy").unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                volume
                    .write_at(&[i as u8; BLOCK as usize], (i % 1024) * BLOCK)
                    .unwrap();
                volume.flush().unwrap();
                i += 1;
            }
        })
    };
    for round in 0..3 {
        let busy: Vec<_> = pool
            .volumes()
            .unwrap()
            .into_iter()
            .filter(|v| v.summary.name.starts_with("v@"))
            .collect();
        assert_eq!(busy, quiet, "round {round}");
        assert_eq!(
            pool.volume_info("v@17").unwrap(),
            quiet[16],
            "round {round}"
        );
        let info = pool.info().unwrap();
        assert_eq!(info.pending_free_bytes, quiet_info.pending_free_bytes);
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert_clean(&pool, "after the busy listings");
}

#[test]
fn removing_thousands_of_snapshots_goes_in_few_batches_and_little_metadata() {
    const COUNT: usize = 3_000;
    let (pool, device) = pool_with_snapshots(COUNT);
    let names: Vec<String> = (1..=COUNT).map(|i| format!("v@{i}")).collect();
    let unique_bytes: u64 = pool
        .volumes()
        .unwrap()
        .iter()
        .filter(|v| v.summary.name.starts_with("v@"))
        .map(|v| v.unique_bytes)
        .sum();
    assert!(unique_bytes > 0, "each snapshot owns a block alone");
    let mut expected = vec![0u8; VOLUME_BYTES as usize];
    pool.volume("v").unwrap().read_at(&mut expected, 0).unwrap();
    let written_before = device.written_bytes.load(Ordering::Relaxed);
    let flushes_before = device.flushes.load(Ordering::Relaxed);

    let summary = pool
        .remove_snapshots(&names, RemoveOptions::default())
        .unwrap();

    let written = device.written_bytes.load(Ordering::Relaxed) - written_before;
    let flushes = device.flushes.load(Ordering::Relaxed) - flushes_before;
    assert_eq!(summary.removed, names);
    assert!(summary.vanished.is_empty());
    // A batch ends early when it nears what one journal transaction holds
    // (and is committed without the lock): this small journal ends about
    // every other one so.
    let full_batches = COUNT.div_ceil(REMOVE_BATCH_SNAPSHOTS);
    let batches = summary.batches as usize;
    assert!(
        (full_batches..=2 * full_batches).contains(&batches),
        "{batches} batches for {COUNT} snapshots"
    );
    // Batches share commits: one where a batch ended early, and one at
    // the end; each commit's flush carries every client's unflushed
    // writes, so they are few. A commit flushes twice at most (the data,
    // then its journal transaction).
    let commits = summary.commits as usize;
    assert!(
        (1..=batches).contains(&commits),
        "{commits} commits for {batches} batches"
    );
    assert!(flushes <= 2 * summary.commits, "{flushes} flushes");
    // A 256-byte record each, journaled then written home, and a little
    // more: a commit per removal would cost a journal block and a record
    // block at least (2 KiB each here).
    assert!(
        written < COUNT as u64 * RECORD_BYTES * 3,
        "{written} bytes written to remove {COUNT} snapshots"
    );
    assert_eq!(pool.volume_names(), vec!["v".to_string()]);
    let pending = pool.pending_free_bytes().unwrap();
    assert!(pending >= unique_bytes, "{pending} < {unique_bytes}");
    assert_eq!(pool.reclaim_all(|_| {}).unwrap(), pending);
    let info = pool.info().unwrap();
    assert_eq!(info.pending_free_bytes, 0);
    assert_eq!(info.referenced_bytes, 256 * BLOCK);
    let mut after = vec![0u8; VOLUME_BYTES as usize];
    pool.volume("v").unwrap().read_at(&mut after, 0).unwrap();
    assert!(after == expected, "the volume kept every byte");
    // The newest BOOKMARKS_PER_PARENT_MAX removed snapshots stay as
    // bookmarks to diff from; older ones are gone.
    let newest_kept = format!("v@{}", COUNT - BOOKMARKS_PER_PARENT_MAX + 1);
    let report = pool.diff(&newest_kept, "v").unwrap();
    assert!(report.base_removed);
    let dropped = format!("v@{}", COUNT - BOOKMARKS_PER_PARENT_MAX);
    let gone = pool.diff(&dropped, "v").unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    assert_clean(&pool, "after removing and reclaiming");
}

/// The daemons' reclaimer shares commits between batches (each commit
/// flushes every client's unflushed writes): removed snapshots given back
/// a few entries at a time take far fewer commits than batches, every
/// block comes back once the last batch commits, and a pool reopened from
/// what is durable then is clean and holds the same.
#[test]
fn reclaim_batches_sharing_commits_give_everything_back_in_few_commits() {
    const COUNT: usize = 200;
    let (pool, device) = pool_with_snapshots(COUNT);
    let names: Vec<String> = (1..=COUNT).map(|i| format!("v@{i}")).collect();
    pool.remove_snapshots(&names, RemoveOptions::default())
        .unwrap();
    let pending = pool.pending_free_bytes().unwrap();
    assert!(pending > 0);
    let flushes_before = device.flushes.load(Ordering::Relaxed);
    let mut batches = 0u64;
    let mut freed = 0;
    loop {
        let (bytes, done) = pool.reclaim_batch_sharing_commits_for_tests(4).unwrap();
        freed += bytes;
        batches += 1;
        if done {
            break;
        }
    }
    let flushes = device.flushes.load(Ordering::Relaxed) - flushes_before;
    assert_eq!(freed, pending);
    assert_eq!(pool.pending_free_bytes().unwrap(), 0);
    assert!(
        flushes * 4 < batches,
        "{flushes} flushes for {batches} batches"
    );
    let mut expected = vec![0u8; VOLUME_BYTES as usize];
    pool.volume("v").unwrap().read_at(&mut expected, 0).unwrap();
    assert_clean(&pool, "after reclaim sharing commits");
    let info = pool.info().unwrap();
    assert_eq!(info.referenced_bytes, 256 * BLOCK);
    drop(pool);
    let reopened = Pool::open_device(device.clone(), Path::new("nondisruptive"), None).unwrap();
    assert_clean(&reopened, "reopened after reclaim sharing commits");
    assert_eq!(reopened.pending_free_bytes().unwrap(), 0);
    let mut after = vec![0u8; VOLUME_BYTES as usize];
    reopened
        .volume("v")
        .unwrap()
        .read_at(&mut after, 0)
        .unwrap();
    assert!(after == expected, "the volume kept every byte");
}

/// Pruning and reclaim beside a client that writes in place never flush
/// the whole device: each of their commits makes its journal write durable
/// by itself, so the client's unflushed writes stay in the host's cache
/// (a flush would write them all back, and the client's writes would
/// queue behind it). Its own flush still makes them durable.
#[test]
fn background_commits_leave_a_client_s_unflushed_writes_alone() {
    const COUNT: usize = 100;
    let (pool, device) = pool_with_snapshots(COUNT);
    let volume = pool.volume("v").unwrap();
    // Rewritten whole after the last snapshot: v's blocks are its own, so
    // the writes below go in place and map nothing.
    volume
        .write_at(&vec![9u8; 256 * BLOCK as usize], 0)
        .unwrap();
    volume.flush().unwrap();
    let flushes_before = device.flushes.load(Ordering::Relaxed);
    let durable_before = device.durable_writes.load(Ordering::Relaxed);
    let mut written = 0;
    let write_some = |written: &mut u64| {
        let block = *written % 256;
        volume
            .write_at(&[3u8; BLOCK as usize], block * BLOCK)
            .unwrap();
        *written += 1;
    };
    let names: Vec<String> = (1..=COUNT).map(|i| format!("v@{i}")).collect();
    let mut removal = pool
        .begin_snapshot_removal(&names, RemoveOptions::default())
        .unwrap();
    loop {
        write_some(&mut written);
        if pool.remove_next_batch(&mut removal).unwrap() {
            break;
        }
    }
    loop {
        write_some(&mut written);
        let (_, done) = pool.reclaim_batch_sharing_commits_for_tests(8).unwrap();
        if done {
            break;
        }
    }
    assert_eq!(pool.pending_free_bytes().unwrap(), 0);
    let commits = device.durable_writes.load(Ordering::Relaxed) - durable_before;
    assert!(commits >= 2, "prune and reclaim committed {commits} times");
    assert_eq!(
        device.flushes.load(Ordering::Relaxed),
        flushes_before,
        "{commits} background commits flushed the device whole"
    );
    // The client's flush is still a flush.
    volume.flush().unwrap();
    assert_eq!(device.flushes.load(Ordering::Relaxed), flushes_before + 1);
    assert_clean(&pool, "after pruning beside a writer");
}

#[test]
fn a_bad_removal_request_removes_nothing() {
    let (pool, _) = pool_with_snapshots(4);
    pool.clone_volume("v@2", "c").unwrap();
    pool.snapshot("c", "c@1").unwrap();
    let before = pool.volume_names();
    let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let missing = pool
        .remove_snapshots(&names(&["v@1", "nope"]), RemoveOptions::default())
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
    assert!(missing.to_string().contains("\"nope\""), "{missing}");

    let writable = pool
        .remove_snapshots(&names(&["v@1", "c"]), RemoveOptions::default())
        .unwrap_err();
    assert_eq!(writable.kind(), ErrorKind::InvalidArgument);
    assert!(
        writable.to_string().contains("not a snapshot"),
        "{writable}"
    );

    let claim = pool.volume("c@1").unwrap().claim();
    let recursive = RemoveOptions {
        recursive: true,
        force: false,
    };
    let busy = pool
        .remove_snapshots(&names(&["v@1", "v@2"]), recursive)
        .unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Busy);
    assert_eq!(
        pool.volume_names(),
        before,
        "refused requests change nothing"
    );

    // Forced, recursive, a name given twice: descendants go first, once.
    let forced = RemoveOptions {
        recursive: true,
        force: true,
    };
    let summary = pool
        .remove_snapshots(&names(&["v@2", "v@1", "v@2"]), forced)
        .unwrap();
    assert_eq!(summary.removed, names(&["c@1", "c", "v@2", "v@1"]));
    assert_eq!(summary.batches, 1);
    drop(claim);
    assert_eq!(pool.volume_names(), names(&["v", "v@3", "v@4"]));
    let by_id = pool.volume_summary("v@3").unwrap().id;
    let summary = pool
        .remove_snapshots_by_id(&[by_id], RemoveOptions::default())
        .unwrap();
    assert_eq!(summary.removed, names(&["v@3"]));
    pool.reclaim_all(|_| {}).unwrap();
    assert_clean(&pool, "after the removals");
}

/// `remove` reports what it gives back from one walk made with its reads
/// outside the lock: the same as the pending bytes it adds.
#[test]
fn remove_reports_what_it_adds_to_pending() {
    let (pool, _) = pool_with_snapshots(50);
    pool.remove_volume("v@10").unwrap();
    for name in ["v@11", "v@12", "v@30"] {
        let before = pool.info().unwrap().pending_free_bytes;
        let unique = pool.volume_info(name).unwrap().unique_bytes;
        let freed = pool.remove_volume(name).unwrap();
        let after = pool.info().unwrap().pending_free_bytes;
        assert!(freed >= unique, "{name}: {freed} < {unique}");
        assert!(after - before >= freed, "{name}: nodes come back too");
    }
    pool.reclaim_all(|_| {}).unwrap();
    assert_clean(&pool, "after the removals");
}

/// What a gated device holds while its gate is closed.
#[derive(Clone, Copy, PartialEq)]
enum Gated {
    /// Flushes: a commit's I/O that takes as long as the test wants.
    Flushes,
    /// Writes to the superblock slots, which only a checkpoint makes: its
    /// last step waits as long as the test wants.
    SuperblockWrites,
}

/// A memory device whose flushes, or superblock writes, wait while its
/// gate is closed.
struct GatedDevice {
    inner: MemDevice,
    gated: Gated,
    closed: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    /// Gated operations begun (waiting or not).
    entered: AtomicU64,
}

impl GatedDevice {
    fn new(gated: Gated) -> Arc<GatedDevice> {
        Arc::new(GatedDevice {
            inner: MemDevice::new(),
            gated,
            closed: std::sync::Mutex::new(false),
            opened: std::sync::Condvar::new(),
            entered: AtomicU64::new(0),
        })
    }

    fn set_closed(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }

    fn pass(&self, operation: Gated) {
        if operation != self.gated {
            return;
        }
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
    }

    /// Waits (10 s at most) until a gated operation begins after `since`.
    fn wait_entered(&self, since: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.entered.load(Ordering::SeqCst) == since {
            assert!(Instant::now() < deadline, "no gated operation began");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl BlockDevice for GatedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if offset < SUPERBLOCK_SLOTS * BLOCK {
            self.pass(Gated::SuperblockWrites);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.pass(Gated::Flushes);
        self.inner.flush()
    }
    fn len_bytes(&self) -> io::Result<u64> {
        self.inner.len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.inner.set_len_bytes(len_bytes)
    }
    fn describe(&self) -> String {
        "gated memory device".into()
    }
}

/// Runs `work` in a thread of its own and gives its outcome, or an error
/// if it has not ended within 10 s (it is then left waiting).
fn within_10_s<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, std::sync::mpsc::RecvTimeoutError> {
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    outcome.recv_timeout(Duration::from_secs(10))
}

/// A pool on `device` with volume `v`, block 0 holding 7s durably.
fn gated_pool(device: &Arc<GatedDevice>, journal_bytes: u64) -> (Pool, grove_store::Volume) {
    let options = PoolOptions {
        block_size_bytes: BLOCK as u32,
        capacity_bytes: None,
        journal_bytes: Some(journal_bytes),
    };
    let pool = Pool::format(device.clone(), &options, Path::new("gated"), None).unwrap();
    pool.create_volume("v", VOLUME_BYTES).unwrap();
    let volume = pool.volume("v").unwrap();
    volume.write_at(&[7u8; BLOCK as usize], 0).unwrap();
    pool.flush().unwrap();
    (pool, volume)
}

/// A second commit (a prune's batch, a reclaim batch, a client's flush)
/// that comes while another's I/O runs waits for it without the state
/// lock: other clients' reads go on meanwhile. Waiting under the lock held
/// every NBD request for the rest of that I/O (hundreds of ms when it
/// flushes many unflushed writes).
#[test]
fn a_commit_waiting_for_another_s_io_lets_readers_in() {
    let device = GatedDevice::new(Gated::Flushes);
    let (pool, volume) = gated_pool(&device, 4 << 20);
    volume.write_at(&[8u8; BLOCK as usize], 0).unwrap();

    device.set_closed(true);
    let entered = device.entered.load(Ordering::SeqCst);
    let first = std::thread::spawn({
        let pool = pool.clone();
        move || pool.flush()
    });
    device.wait_entered(entered);
    // The first commit's I/O now waits at the gate, without the lock.
    let second = std::thread::spawn({
        let pool = pool.clone();
        move || pool.flush()
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !second.is_finished(),
        "the second commit waits for the first"
    );

    let outcome = within_10_s(move || {
        let mut buf = vec![0u8; BLOCK as usize];
        volume.read_at(&mut buf, 0).map(|_| buf[0])
    });
    device.set_closed(false);
    assert_eq!(
        outcome
            .expect("a read waited for another commit's I/O")
            .unwrap(),
        8
    );
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    assert_clean(&pool, "after both commits");
}

/// A checkpoint, due once the journal is half full, runs its I/O (a flush
/// of the whole store per step) with the state lock let go, as a commit
/// does: other clients read and write meanwhile. Under the lock it held
/// every NBD request for half a second beside a client writing at full
/// speed. Its last step, the superblock, waits here at the gate.
#[test]
fn a_checkpoint_lets_readers_and_writers_in() {
    let device = GatedDevice::new(Gated::SuperblockWrites);
    // 64 journal blocks: a checkpoint every dozen small commits.
    let (pool, volume) = gated_pool(&device, 64 * BLOCK);

    device.set_closed(true);
    let entered = device.entered.load(Ordering::SeqCst);
    let committer = std::thread::spawn({
        let pool = pool.clone();
        let volume = pool.volume("v").unwrap();
        move || -> grove_store::Result<()> {
            for i in 1..=200u64 {
                volume.write_at(&[i as u8; BLOCK as usize], i * BLOCK)?;
                pool.flush()?;
            }
            Ok(())
        }
    });
    device.wait_entered(entered);
    // The checkpoint's superblock write now waits at the gate.

    let outcome = within_10_s(move || {
        let mut buf = vec![0u8; BLOCK as usize];
        volume
            .read_at(&mut buf, 0)
            .and_then(|_| volume.write_at(&[9u8; BLOCK as usize], 0))
            .map(|_| buf[0])
    });
    device.set_closed(false);
    assert_eq!(
        outcome
            .expect("a read and a write waited for a checkpoint's I/O")
            .unwrap(),
        7
    );
    committer.join().unwrap().unwrap();
    let volume = pool.volume("v").unwrap();
    let mut buf = vec![0u8; BLOCK as usize];
    volume.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf[0], 9, "the write made during the checkpoint");
    pool.flush().unwrap();
    assert_clean(&pool, "after the checkpoint");
    drop(volume);
    pool.close().unwrap();
    let reopened = Pool::open_device(device.clone(), Path::new("gated"), None).unwrap();
    let volume = reopened.volume("v").unwrap();
    for (block, expected) in [(0u64, 9u8), (1, 1), (200, 200)] {
        volume.read_at(&mut buf, block * BLOCK).unwrap();
        assert_eq!(buf[0], expected, "block {block} after reopening");
    }
}
