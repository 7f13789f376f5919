//! The journal brings a pool back after an unclean stop: a copy of the store
//! taken after a flush, with no checkpoint since, opens by replay and shows
//! every flushed write.

use grove_store::{BlockDevice, MemDevice, Pool, PoolOptions};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[test]
fn flushed_state_survives_without_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = Pool::create(
        &path,
        &PoolOptions {
            block_size_bytes: 1024,
            capacity_bytes: None,
            journal_bytes: None,
        },
    )
    .unwrap();
    pool.create_volume("v", 8 << 20).unwrap();
    let v = pool.volume("v").unwrap();
    for i in 0..200u64 {
        v.write_at(&[(i % 251) as u8 + 1; 1500], i * 20_000)
            .unwrap();
    }
    pool.snapshot("v", "s").unwrap();
    v.write_at(&[0xee; 3000], 5_000).unwrap();
    v.discard(1_000_000, 500_000).unwrap();
    v.flush().unwrap();
    // The store as a power cut would leave it right now: journal not checkpointed.
    let image = std::fs::read(path.join("grove.store")).unwrap();
    let expected_v = {
        let mut buf = vec![0u8; 8 << 20];
        v.read_at(&mut buf, 0).unwrap();
        buf
    };
    let expected_s = {
        let mut buf = vec![0u8; 8 << 20];
        pool.volume("s").unwrap().read_at(&mut buf, 0).unwrap();
        buf
    };

    let crashed = Pool::open_device(Arc::new(MemDevice::from_bytes(image)), &path, None).unwrap();
    let report = crashed.check(false).unwrap();
    assert!(report.is_clean(), "check after replay: {report:?}");
    let mut buf = vec![0u8; 8 << 20];
    crashed.volume("v").unwrap().read_at(&mut buf, 0).unwrap();
    assert!(buf == expected_v, "volume v differs after replay");
    crashed.volume("s").unwrap().read_at(&mut buf, 0).unwrap();
    assert!(buf == expected_s, "snapshot s differs after replay");
}

/// A MemDevice that counts the requests made of it: on RADOS each one is a
/// network round trip, which a takeover waits for.
#[derive(Default)]
struct Counting {
    inner: MemDevice,
    reads: AtomicUsize,
    single_writes: AtomicUsize,
    batched_writes: AtomicUsize,
}

impl BlockDevice for Counting {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.single_writes.fetch_add(1, Ordering::Relaxed);
        self.inner.write_at(buf, offset)
    }
    fn write_each_at(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        self.batched_writes
            .fetch_add(writes.len(), Ordering::Relaxed);
        self.inner.write_each_at(writes)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
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

/// Opening replays a journal of many transactions in a few requests: the
/// scan reads ahead rather than three reads per transaction, and the
/// images go home in batches rather than one write each.
#[test]
fn replay_reads_and_writes_the_journal_in_few_requests() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = Pool::create(&path, &PoolOptions::default()).unwrap();
    pool.create_volume("v", 64 << 20).unwrap();
    let v = pool.volume("v").unwrap();
    // Each flushed write after a snapshot commits a transaction of its own.
    const STRIDE: u64 = 256 << 10;
    let transactions = 100u64;
    for i in 0..transactions {
        pool.snapshot("v", &format!("s{i}")).unwrap();
        v.write_at(&[i as u8 + 1; 4096], i * STRIDE).unwrap();
        v.flush().unwrap();
    }
    let image = std::fs::read(path.join("grove.store")).unwrap();
    let device = Arc::new(Counting {
        inner: MemDevice::from_bytes(image),
        ..Counting::default()
    });
    let reopened = Pool::open_device(device.clone(), &path, None).unwrap();
    let reads = device.reads.load(Ordering::Relaxed);
    let single_writes = device.single_writes.load(Ordering::Relaxed);
    let batched_writes = device.batched_writes.load(Ordering::Relaxed);
    assert!(
        batched_writes as u64 >= transactions,
        "replay wrote home an image of each transaction at least: {batched_writes}"
    );
    assert!(
        reads < 40 && single_writes < 10,
        "opening cost {reads} reads and {single_writes} single writes for {transactions} transactions"
    );
    let mut buf = vec![0u8; 4096];
    reopened
        .volume("v")
        .unwrap()
        .read_at(&mut buf, 99 * STRIDE)
        .unwrap();
    assert_eq!(buf, vec![100u8; 4096], "the last flushed write replayed");
}
