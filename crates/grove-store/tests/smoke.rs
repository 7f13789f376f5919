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
    let _ = (pool.volumes().unwrap(), pool.info().unwrap());
    pool.close().unwrap();
    let after = std::fs::read(path.join("grove.store")).unwrap();
    assert!(before == after, "a read-only session changed the store");
}

#[test]
fn mapped_extents_in_a_window_agree_with_the_whole_map() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(&dir.path().join("pool"), &options(1024)).unwrap();
    pool.create_volume("v", 64 << 20).unwrap();
    let v = pool.volume("v").unwrap();
    for (i, offset) in [
        0u64,
        5000,
        130_000,
        1 << 20,
        (16 << 20) + 300,
        (64 << 20) - 2048,
    ]
    .iter()
    .enumerate()
    {
        v.write_at(
            &vec![i as u8 + 1; 3000.min(((64 << 20) - offset) as usize)],
            *offset,
        )
        .unwrap();
    }
    let all = v.mapped_extents().unwrap();
    for (offset, len) in [
        (0u64, 1u64),
        (4000, 10_000),
        (129_000, 1 << 20),
        (1 << 20, 16 << 20),
        (60 << 20, 4 << 20),
        (0, 64 << 20),
    ] {
        let window: Vec<(u64, u64)> = v.mapped_extents_in(offset, len).unwrap();
        // Whole blocks of the full map that overlap the window, split where
        // the window's blocks end.
        let block = 1024;
        let (first, end) = (
            offset / block * block,
            (offset + len).div_ceil(block) * block,
        );
        let expected: Vec<(u64, u64)> = all
            .iter()
            .filter_map(|&(start, length)| {
                let (s, e) = (start.max(first), (start + length).min(end));
                (s < e).then(|| (s, e - s))
            })
            .collect();
        assert_eq!(window, expected, "window {offset}+{len}");
    }
}
