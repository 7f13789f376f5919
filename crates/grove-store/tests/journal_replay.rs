//! The journal brings a pool back after an unclean stop: a copy of the store
//! taken after a flush, with no checkpoint since, opens by replay and shows
//! every flushed write.

use grove_store::{MemDevice, Pool, PoolOptions};
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
