//! End-to-end checks of the engine's basic promises on a real file.

use grove_store::{ErrorKind, Pool, PoolOptions};

fn options(block_size_bytes: u32) -> PoolOptions {
    PoolOptions {
        block_size_bytes,
        capacity_bytes: None,
        journal_bytes: None,
    }
}

#[test]
fn snapshot_clone_write_and_reopen_keep_contents() {
    for block_size in [1024u32, 2048, 4096, 8192, 65536] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool");
        let pool = Pool::create(&path, &options(block_size)).unwrap();
        pool.create_volume("base", 10 << 20).unwrap();
        let base = pool.volume("base").unwrap();
        base.write_at(&[1u8; 5000], 777).unwrap();
        pool.snapshot("base", "snap").unwrap();
        base.write_at(&[2u8; 100], 1000).unwrap();
        pool.clone_volume("snap", "clone").unwrap();
        let clone = pool.volume("clone").unwrap();
        clone.write_at(&[3u8; 10], 5000).unwrap();
        pool.close().unwrap();
        drop((base, clone));

        let pool = Pool::open(&path).unwrap();
        let read = |name: &str| {
            let mut buf = vec![0u8; 8000];
            pool.volume(name).unwrap().read_at(&mut buf, 0).unwrap();
            buf
        };
        let mut expected_snap = vec![0u8; 8000];
        expected_snap[777..5777].fill(1);
        let mut expected_base = expected_snap.clone();
        expected_base[1000..1100].fill(2);
        let mut expected_clone = expected_snap.clone();
        expected_clone[5000..5010].fill(3);
        assert_eq!(read("snap"), expected_snap, "block size {block_size}");
        assert_eq!(read("base"), expected_base, "block size {block_size}");
        assert_eq!(read("clone"), expected_clone, "block size {block_size}");
        let err = pool.volume("snap").unwrap().write_at(b"x", 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ReadOnly);
    }
}

#[test]
fn opening_reading_and_closing_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = Pool::create(&path, &PoolOptions::default()).unwrap();
    pool.create_volume("v", 1 << 20).unwrap();
    pool.volume("v")
        .unwrap()
        .write_at(&[5u8; 10_000], 0)
        .unwrap();
    pool.close().unwrap();
    let before = std::fs::read(path.join("grove.store")).unwrap();
    let pool = Pool::open(&path).unwrap();
    let mut buf = vec![0u8; 10_000];
    pool.volume("v").unwrap().read_at(&mut buf, 0).unwrap();
    assert!(pool.check(false).unwrap().is_clean());
    let _ = (pool.volumes(), pool.info().unwrap());
    pool.close().unwrap();
    let after = std::fs::read(path.join("grove.store")).unwrap();
    assert!(before == after, "a read-only session changed the store");
}
