//! Regression (found in review): when free-only transactions filled the
//! journal up to its head, the next transaction was placed on top of one
//! that replay still needed, so a committed allocation was lost after a
//! crash (a block in use came back marked free). This drives the journal's
//! head to its middle, commits a write, removes a volume whose frees fill
//! several transactions, and opens the store as every flush left it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use std::sync::atomic::{AtomicBool, Ordering};

use grove_store::{MemDevice, Pool, PoolOptions};

mod common;
use common::HookedDevice;

const BLOCK_BYTES: u64 = 1024;
const JOURNAL_BLOCKS: u64 = 64;

/// The journal head recorded in the newest superblock.
fn journal_head(device: &HookedDevice) -> u64 {
    let bytes = device.inner.to_bytes();
    let field = |slot: usize, offset: usize| {
        let at = slot * BLOCK_BYTES as usize + offset;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    };
    let newest = if field(0, 16) > field(1, 16) { 0 } else { 1 };
    field(newest, 112)
}

#[test]
fn removing_a_large_volume_never_overwrites_live_journal_transactions() {
    let dir = Path::new("journal-full");
    // Once armed, the device keeps a copy of itself at every flush.
    let armed = Arc::new(AtomicBool::new(false));
    let images = Arc::new(Mutex::new(Vec::new()));
    let device = Arc::new(HookedDevice::new().before_flush({
        let (armed, images) = (armed.clone(), images.clone());
        move |inner| {
            if armed.load(Ordering::SeqCst) {
                images.lock().unwrap().push(inner.to_bytes());
            }
        }
    }));
    let options = PoolOptions {
        block_size_bytes: BLOCK_BYTES as u32,
        capacity_bytes: None,
        journal_bytes: Some(JOURNAL_BLOCKS * BLOCK_BYTES),
    };
    let pool = Pool::format(device.clone(), &options, dir, None).unwrap();
    pool.create_volume("keep", 1 << 20).unwrap();
    pool.create_volume("big", 64 << 20).unwrap();
    // Written backwards, so its blocks do not merge into few free extents.
    let big = pool.volume("big").unwrap();
    for i in (0..14_000u64).rev() {
        big.write_at(&[0xab; BLOCK_BYTES as usize], i * BLOCK_BYTES)
            .unwrap();
    }
    drop(big);
    pool.close().unwrap();
    // Small commits, each followed by a checkpoint at close, walk the head
    // to the middle of the journal.
    let mut steps = 0;
    while journal_head(&device) != JOURNAL_BLOCKS / 2 {
        let pool = Pool::open_device(device.clone(), dir, None).unwrap();
        pool.create_volume(&format!("t{steps}"), 1024).unwrap();
        pool.close().unwrap();
        steps += 1;
        assert!(steps < 200, "the journal head never reached its middle");
    }
    let pool = Pool::open_device(device.clone(), dir, None).unwrap();
    armed.store(true, Ordering::SeqCst);
    pool.volume("keep")
        .unwrap()
        .write_at(&[0x22; BLOCK_BYTES as usize], 5 * BLOCK_BYTES)
        .unwrap();
    pool.flush().unwrap();
    pool.remove_volume("big").unwrap();
    // The reclaimer gives the space back in bounded batches, one commit each.
    pool.reclaim_all(|_| {}).unwrap();
    armed.store(false, Ordering::SeqCst);
    std::mem::forget(pool); // a crash: no clean close
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(
        images.len() > 5,
        "too few flushes to test: {}",
        images.len()
    );
    for (i, image) in images.into_iter().enumerate() {
        let crashed = Pool::open_device(Arc::new(MemDevice::from_bytes(image)), dir, None)
            .unwrap_or_else(|e| panic!("image at flush {i}: open failed: {e}"));
        let report = crashed.check(false).unwrap();
        assert!(report.is_clean(), "image at flush {i}: {:?}", report.errors);
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        crashed
            .volume("keep")
            .unwrap()
            .read_at(&mut buf, 5 * BLOCK_BYTES)
            .unwrap();
        // The write was flushed before the removal began: every image after
        // the first flush must hold it.
        if i > 0 {
            assert!(
                buf.iter().all(|&b| b == 0x22),
                "image at flush {i}: the flushed write is lost"
            );
        }
    }
}
