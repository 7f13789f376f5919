//! Writers and snapshots at the same time: in-place writes run outside the
//! engine's state lock, and a snapshot taken while they run must still be a
//! frozen image. Every block it holds is one whole write, and it never
//! changes afterwards, whatever the writers do next.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::AtomicU64;

use grove_store::{Pool, PoolOptions};

mod common;
use common::HookedDevice;

/// A device whose writes from the writer threads take a while before they
/// land, so that a snapshot that did not wait for in-flight writes would
/// finish, and be read, while one is still on its way.
fn slow_device() -> HookedDevice {
    HookedDevice::new().before_write(|_| {
        let writer = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("writer"));
        if writer {
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

const BLOCK_BYTES: usize = 4096;
const WRITERS: usize = 4;
const REGION_BYTES: usize = 64 * 1024;
const SNAPSHOTS: usize = 10;

fn read_all(pool: &Pool, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; WRITERS * REGION_BYTES];
    pool.volume(name).unwrap().read_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn snapshots_taken_during_in_place_writes_are_frozen_and_whole() {
    let device = Arc::new(slow_device());
    let pool = Pool::format(device, &PoolOptions::default(), Path::new("slow"), None).unwrap();
    pool.create_volume("v", (WRITERS * REGION_BYTES) as u64)
        .unwrap();
    let volume = pool.volume("v").unwrap();
    // Fill first, so that later writes are in place (the fast path).
    volume
        .write_at(&vec![1u8; WRITERS * REGION_BYTES], 0)
        .unwrap();
    pool.flush().unwrap();

    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut snapshots = Vec::new();
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            let volume = volume.clone();
            let stop = &stop;
            std::thread::Builder::new()
                .name(format!("writer-{writer}"))
                .spawn_scoped(scope, move || {
                    let mut value = 2u8;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        for block in 0..REGION_BYTES / BLOCK_BYTES {
                            let offset = writer * REGION_BYTES + block * BLOCK_BYTES;
                            volume
                                .write_at(&[value; BLOCK_BYTES], offset as u64)
                                .unwrap();
                        }
                        value = value.wrapping_add(1).max(2);
                    }
                })
                .unwrap();
        }
        for i in 0..SNAPSHOTS {
            let name = format!("v@{i}");
            pool.snapshot("v", &name).unwrap();
            snapshots.push((name.clone(), read_all(&pool, &name)));
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    volume
        .write_at(&vec![0xffu8; WRITERS * REGION_BYTES], 0)
        .unwrap();
    for (name, first_read) in &snapshots {
        for (block, data) in first_read.chunks(BLOCK_BYTES).enumerate() {
            assert!(
                data.iter().all(|&b| b == data[0]),
                "{name}: block {block} holds parts of two writes"
            );
        }
        assert!(
            read_all(&pool, name) == *first_read,
            "{name} changed after it was taken"
        );
    }
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

/// Group commit: writers that flush at the same time share the commit's
/// device flushes instead of paying for one commit each.
#[test]
fn concurrent_flushes_share_one_commit() {
    const THREADS: usize = 8;
    let flush_count = Arc::new(AtomicU64::new(0));
    let device = Arc::new(HookedDevice::new().before_flush({
        let flush_count = flush_count.clone();
        move |_| {
            flush_count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }));
    let pool = Pool::format(
        device.clone(),
        &PoolOptions::default(),
        Path::new("group"),
        None,
    )
    .unwrap();
    pool.create_volume("v", 64 << 20).unwrap();
    let volume = pool.volume("v").unwrap();
    let barrier = std::sync::Barrier::new(THREADS);
    let before = std::sync::Mutex::new(0u64);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (volume, barrier, before, flush_count) =
                (volume.clone(), &barrier, &before, &flush_count);
            scope.spawn(move || {
                // Each writer allocates (new blocks, so metadata to commit).
                volume
                    .write_at(&[thread as u8 + 1; 64 * 1024], thread as u64 * (1 << 20))
                    .unwrap();
                if barrier.wait().is_leader() {
                    *before.lock().unwrap() = flush_count.load(std::sync::atomic::Ordering::SeqCst);
                }
                barrier.wait();
                volume.flush().unwrap();
            });
        }
    });
    let flushes = flush_count.load(std::sync::atomic::Ordering::SeqCst) - *before.lock().unwrap();
    // One commit: a data flush and a journal flush. Writers that find their
    // writes already committed return without touching the device.
    assert!(
        flushes <= 2,
        "{THREADS} concurrent flushes cost {flushes} device flushes"
    );
    for thread in 0..THREADS {
        let mut buf = vec![0u8; 64 * 1024];
        volume.read_at(&mut buf, thread as u64 * (1 << 20)).unwrap();
        assert!(buf.iter().all(|&b| b == thread as u8 + 1));
    }
}

/// How long an operation may take while a flush is held up before the test
/// calls it stalled (it takes microseconds when it does not wait).
const STALL_LIMIT: Duration = Duration::from_secs(20);

/// Device operations (the hook they run in) from the thread named
/// `thread`, held up until `release`; the first one says it has started.
struct Hold {
    thread: &'static str,
    held: std::sync::Mutex<bool>,
    changed: std::sync::Condvar,
    started_tx: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    started: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Hold {
    fn new(thread: &'static str) -> Arc<Hold> {
        let (started_tx, started) = std::sync::mpsc::channel();
        Arc::new(Hold {
            thread,
            held: std::sync::Mutex::new(true),
            changed: std::sync::Condvar::new(),
            started_tx: std::sync::Mutex::new(Some(started_tx)),
            started: std::sync::Mutex::new(started),
        })
    }

    /// The device hook: blocks the held thread's operations.
    fn wait(&self) {
        if std::thread::current().name() != Some(self.thread) {
            return;
        }
        if let Some(started) = self.started_tx.lock().unwrap().take() {
            let _ = started.send(());
        }
        let mut held = self.held.lock().unwrap();
        while *held {
            held = self.changed.wait(held).unwrap();
        }
    }

    /// Waits until the held thread has reached the device.
    fn reached(&self, what: &str) {
        self.started
            .lock()
            .unwrap()
            .recv_timeout(STALL_LIMIT)
            .unwrap_or_else(|_| panic!("{what} never reached the device"));
    }

    fn release(&self) {
        *self.held.lock().unwrap() = false;
        self.changed.notify_all();
    }
}

/// Runs `op` on another thread; None if it has not finished within the
/// stall limit (the thread is left to finish once the flush is released).
fn finishes_while_held<T: Send + 'static>(op: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(op());
    });
    result.recv_timeout(STALL_LIMIT).ok()
}

/// Reads the block at `offset` of `volume` on another thread, as
/// `finishes_while_held` does.
fn block_read_while_held(
    volume: &grove_store::Volume,
    offset: u64,
) -> Option<grove_store::Result<Vec<u8>>> {
    let reader = volume.clone();
    finishes_while_held(move || {
        let mut buf = vec![0u8; BLOCK_BYTES];
        reader.read_at(&mut buf, offset).map(|()| buf)
    })
}

/// While one client's FLUSH waits for the device (its data and journal
/// flushes), other clients' reads, in-place writes, allocating writes and
/// listings go on: the commit's I/O runs without the pool's state lock.
/// The flush then returns, and what it covered is durable.
#[test]
fn a_flush_held_up_by_the_device_stalls_no_other_client() {
    let held = Hold::new("flusher");
    let device = Arc::new(HookedDevice::new().before_flush({
        let held = held.clone();
        move |_| held.wait()
    }));
    let pool = Pool::format(
        device.clone(),
        &PoolOptions::default(),
        Path::new("held"),
        None,
    )
    .unwrap();
    pool.create_volume("a", 1 << 20).unwrap();
    pool.create_volume("b", 1 << 20).unwrap();
    let (a, b) = (pool.volume("a").unwrap(), pool.volume("b").unwrap());
    b.write_at(&[7u8; BLOCK_BYTES], 0).unwrap();
    a.write_at(&[1u8; 3 * BLOCK_BYTES], 0).unwrap();

    let flusher = std::thread::Builder::new()
        .name("flusher".into())
        .spawn({
            let a = a.clone();
            move || a.flush()
        })
        .unwrap();
    held.reached("the flush");

    let read = block_read_while_held(&b, 0);
    let writer = b.clone();
    let overwrite = finishes_while_held(move || writer.write_at(&[8u8; BLOCK_BYTES], 0));
    let writer = b.clone();
    let allocate = finishes_while_held(move || writer.write_at(&[9u8; BLOCK_BYTES], 8 * 4096));
    let lister = pool.clone();
    let listed = finishes_while_held(move || lister.volume_summaries().len());
    held.release();
    let flushed = flusher.join().unwrap();

    let read = read.expect("a read stalled behind another client's flush");
    assert_eq!(read.unwrap(), vec![7u8; BLOCK_BYTES]);
    overwrite
        .expect("an in-place write stalled behind another client's flush")
        .unwrap();
    allocate
        .expect("an allocating write stalled behind another client's flush")
        .unwrap();
    assert_eq!(
        listed.expect("a listing stalled behind another client's flush"),
        2
    );
    flushed.unwrap();
    pool.flush().unwrap();
    // What both flushes covered survives a reopen of the device's bytes.
    drop((a, b));
    let image = device.inner.to_bytes();
    drop(pool);
    let reopened = Pool::open_device(
        Arc::new(grove_store::MemDevice::from_bytes(image)),
        Path::new("held"),
        None,
    )
    .unwrap();
    let mut buf = vec![0u8; 9 * BLOCK_BYTES];
    reopened.volume("b").unwrap().read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..BLOCK_BYTES], &[8u8; BLOCK_BYTES]);
    assert_eq!(&buf[8 * BLOCK_BYTES..], &[9u8; BLOCK_BYTES]);
    let mut buf = vec![0u8; 3 * BLOCK_BYTES];
    reopened.volume("a").unwrap().read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![1u8; 3 * BLOCK_BYTES]);
    let report = reopened.check(false).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

/// The first write after a snapshot needs new blocks; while its data is on
/// its way to the device, other clients' reads and allocating writes go
/// on: allocating writes take the same parallel path as overwrites.
#[test]
fn an_allocating_write_held_up_by_the_device_stalls_no_other_client() {
    let held = Hold::new("slow-writer");
    let device = Arc::new(HookedDevice::new().before_write({
        let held = held.clone();
        move |_| held.wait()
    }));
    let pool = Pool::format(device, &PoolOptions::default(), Path::new("aw"), None).unwrap();
    pool.create_volume("a", 1 << 20).unwrap();
    pool.create_volume("b", 1 << 20).unwrap();
    let (a, b) = (pool.volume("a").unwrap(), pool.volume("b").unwrap());
    a.write_at(&[1u8; 4 * BLOCK_BYTES], 0).unwrap();
    b.write_at(&[2u8; BLOCK_BYTES], 0).unwrap();
    pool.snapshot("a", "a@1").unwrap();
    let slow = std::thread::Builder::new()
        .name("slow-writer".into())
        .spawn({
            let a = a.clone();
            // Partial blocks too: merged with the snapshot's data.
            move || a.write_at(&[3u8; 2 * BLOCK_BYTES], 1024)
        })
        .unwrap();
    held.reached("the write");
    let read = block_read_while_held(&a, 3 * BLOCK_BYTES as u64);
    let writer = b.clone();
    let allocate = finishes_while_held(move || writer.write_at(&[4u8; 512], 9 * 4096 + 100));
    held.release();
    slow.join().unwrap().unwrap();
    assert_eq!(
        read.expect("a read stalled behind an allocating write")
            .unwrap(),
        vec![1u8; BLOCK_BYTES]
    );
    allocate
        .expect("an allocating write stalled behind another one")
        .unwrap();
    let mut expected = vec![1u8; 4 * BLOCK_BYTES];
    expected[1024..1024 + 2 * BLOCK_BYTES].fill(3);
    let mut buf = vec![0u8; 4 * BLOCK_BYTES];
    a.read_at(&mut buf, 0).unwrap();
    assert!(buf == expected, "the write after the snapshot");
    pool.volume("a@1").unwrap().read_at(&mut buf, 0).unwrap();
    assert!(
        buf == vec![1u8; 4 * BLOCK_BYTES],
        "the snapshot kept its data"
    );
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

/// Writers to different bytes of the same blocks, while snapshots keep
/// making those blocks shared: each partial write needs a new block merged
/// from the old one, and none may undo another's bytes.
#[test]
fn partial_writes_racing_on_shared_blocks_all_land() {
    const BLOCKS: usize = 32;
    const ROUNDS: usize = 20;
    let quarter = BLOCK_BYTES / WRITERS;
    let pool = Pool::format(
        Arc::new(grove_store::MemDevice::new()),
        &PoolOptions::default(),
        Path::new("race"),
        None,
    )
    .unwrap();
    pool.create_volume("v", (BLOCKS * BLOCK_BYTES) as u64)
        .unwrap();
    let volume = pool.volume("v").unwrap();
    volume
        .write_at(&vec![0xaau8; BLOCKS * BLOCK_BYTES], 0)
        .unwrap();
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            let volume = volume.clone();
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    let value = (writer * ROUNDS + round + 1) as u8;
                    for block in 0..BLOCKS {
                        let offset = block * BLOCK_BYTES + writer * quarter;
                        volume
                            .write_at(&vec![value; quarter], offset as u64)
                            .unwrap();
                    }
                }
            });
        }
        for i in 0..ROUNDS {
            pool.snapshot("v", &format!("v@{i}")).unwrap();
        }
    });
    let mut buf = vec![0u8; BLOCKS * BLOCK_BYTES];
    volume.read_at(&mut buf, 0).unwrap();
    for (block, data) in buf.chunks(BLOCK_BYTES).enumerate() {
        for (writer, part) in data.chunks(quarter).enumerate() {
            let last = (writer * ROUNDS + ROUNDS) as u8;
            assert!(
                part.iter().all(|&b| b == last),
                "block {block}: writer {writer}'s last write was undone"
            );
        }
    }
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

/// A commit made while an allocating write is still on its way carries no
/// trace of the block that write took: a crash then (the device's bytes as
/// they are) leaks nothing. Found by the crash simulator's concurrent
/// writers, which saw leaked blocks after such a crash.
#[test]
fn a_crash_while_an_allocating_write_is_in_flight_leaks_nothing() {
    let held = Hold::new("slow-writer");
    let device = Arc::new(HookedDevice::new().before_write({
        let held = held.clone();
        move |_| held.wait()
    }));
    let pool = Pool::format(
        device.clone(),
        &PoolOptions::default(),
        Path::new("leak"),
        None,
    )
    .unwrap();
    pool.create_volume("a", 1 << 20).unwrap();
    pool.create_volume("b", 1 << 20).unwrap();
    let a = pool.volume("a").unwrap();
    let slow = std::thread::Builder::new()
        .name("slow-writer".into())
        .spawn(move || a.write_at(&[5u8; 8 * BLOCK_BYTES], 0))
        .unwrap();
    held.reached("the write");
    pool.volume("b")
        .unwrap()
        .write_at(&[6u8; BLOCK_BYTES], 0)
        .unwrap();
    pool.flush().unwrap();
    let crashed = device.inner.to_bytes();
    held.release();
    slow.join().unwrap().unwrap();

    let reopened = Pool::open_device(
        Arc::new(grove_store::MemDevice::from_bytes(crashed)),
        Path::new("leak"),
        None,
    )
    .unwrap();
    let report = reopened.check(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{:?} {:?}",
        report.errors,
        report.warnings
    );
    let mut buf = vec![0u8; BLOCK_BYTES];
    reopened.volume("b").unwrap().read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![6u8; BLOCK_BYTES]);
    // The original pool, whose write did land, maps it and leaks nothing.
    let report = pool.check(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{:?}",
        report.warnings
    );
}

/// A lookup that misses the metadata cache reads its node from the device
/// without the state lock: while that read is held up, another client's
/// read goes on.
#[test]
fn a_metadata_cache_miss_held_up_by_the_device_stalls_no_other_client() {
    const LEAVES: u64 = 300;
    const LEAF_SPAN_BYTES: u64 = 512 * 4096;
    let held = Hold::new("slow-reader");
    let device = Arc::new(HookedDevice::new().before_read({
        let held = held.clone();
        move |_| held.wait()
    }));
    let pool = Pool::format(device, &PoolOptions::default(), Path::new("miss"), None).unwrap();
    pool.create_volume("v", LEAVES * LEAF_SPAN_BYTES).unwrap();
    let volume = pool.volume("v").unwrap();
    for leaf in 0..LEAVES {
        volume
            .write_at(
                &[(leaf % 250) as u8 + 1; BLOCK_BYTES],
                leaf * LEAF_SPAN_BYTES,
            )
            .unwrap();
    }
    pool.flush().unwrap();
    // The smallest cache, then every other leaf read: leaf 0 leaves it.
    pool.set_cache_size(0);
    let mut buf = vec![0u8; BLOCK_BYTES];
    for leaf in 1..LEAVES {
        volume.read_at(&mut buf, leaf * LEAF_SPAN_BYTES).unwrap();
    }
    // A hole next to leaf 0's block: reading it reads only leaf 0's node.
    let slow = std::thread::Builder::new()
        .name("slow-reader".into())
        .spawn({
            let volume = volume.clone();
            move || {
                let mut buf = vec![1u8; BLOCK_BYTES];
                volume.read_at(&mut buf, BLOCK_BYTES as u64).map(|()| buf)
            }
        })
        .unwrap();
    // The lookup missed the cache and reads its node from the device.
    held.reached("the lookup");
    let read = block_read_while_held(&volume, (LEAVES - 1) * LEAF_SPAN_BYTES);
    held.release();
    assert_eq!(slow.join().unwrap().unwrap(), vec![0u8; BLOCK_BYTES]);
    assert_eq!(
        read.expect("a read stalled behind another client's cache miss")
            .unwrap(),
        vec![((LEAVES - 1) % 250) as u8 + 1; BLOCK_BYTES]
    );
}
