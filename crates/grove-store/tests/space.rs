//! Space levels and auto-extension (ESnap): the capacity grows by steps up
//! to max_capacity or the host's room less the reserve; at the hard limit
//! writes and snapshots get NoSpace, nothing acknowledged is lost across a
//! reopen, and the pool takes writes again once space comes back (a
//! removal and reclaim, or a higher limit). The host's space is given to
//! the pool (`set_host_space_for_tests`), so every case is exact.

use std::path::Path;

use grove_store::space_settings::Amount;
use grove_store::{ErrorKind, HostSpace, Pool, PoolOptions, SpaceLevel, SpaceSettings, Volume};

const MIB: u64 = 1 << 20;
const BLOCK_BYTES: u64 = 4096;
/// Each write: 64 KiB of one byte value, so every one can be checked.
const WRITE_BYTES: usize = 64 * 1024;

fn roomy_host() -> Option<HostSpace> {
    Some(HostSpace {
        available_bytes: 100_000 * MIB,
        total_bytes: 200_000 * MIB,
    })
}

fn create(dir: &Path, capacity: u64, settings: &SpaceSettings) -> Pool {
    let options = PoolOptions {
        capacity_bytes: Some(capacity),
        ..PoolOptions::default()
    };
    let pool = Pool::create_with_space(dir, &options, settings).unwrap();
    pool.set_host_space_for_tests(roomy_host());
    pool
}

fn stepping(max: Option<u64>, step: u64) -> SpaceSettings {
    SpaceSettings {
        max_capacity_bytes: max,
        extend_step: Amount::Bytes(step),
        host_reserve: Amount::Bytes(0),
        ..SpaceSettings::default()
    }
}

/// Writes WRITE_BYTES chunks from `start` until one fails; returns how
/// many landed and the error. Chunk i holds the byte value (i % 250) + 1.
fn fill(volume: &Volume, start: u64) -> (u64, grove_store::Error) {
    let mut i = start;
    loop {
        let chunk = vec![(i % 250) as u8 + 1; WRITE_BYTES];
        match volume.write_at(&chunk, i * WRITE_BYTES as u64) {
            Ok(()) => i += 1,
            Err(e) => return (i, e),
        }
        assert!(i < 100_000, "the pool never filled");
    }
}

/// A pool of 4 MiB in `dir` that extends by 2 MiB steps, and its 64 MiB
/// volume `v`.
fn stepping_pool(dir: &Path) -> (Pool, Volume) {
    let pool = create(&dir.join("pool"), 4 * MIB, &stepping(None, 2 * MIB));
    pool.create_volume("v", 64 * MIB).unwrap();
    let volume = pool.volume("v").unwrap();
    (pool, volume)
}

/// Writes 52 chunks of 64 KiB: past 80% (the default extend_at) of a
/// 4 MiB capacity, short of its end.
fn fill_past_extend_at(volume: &Volume) {
    for i in 0..52 {
        volume
            .write_at(&[5u8; WRITE_BYTES], i * WRITE_BYTES as u64)
            .unwrap();
    }
}

/// Every chunk below `written` reads back as written.
fn verify(volume: &Volume, written: u64) {
    let mut buf = vec![0u8; WRITE_BYTES];
    for i in 0..written {
        volume.read_at(&mut buf, i * WRITE_BYTES as u64).unwrap();
        let expected = (i % 250) as u8 + 1;
        assert!(
            buf.iter().all(|&b| b == expected),
            "chunk {i} lost what was acknowledged"
        );
    }
}

#[test]
fn writes_extend_the_capacity_by_steps_up_to_the_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = create(&path, 4 * MIB, &stepping(Some(12 * MIB), 2 * MIB));
    pool.create_volume("v", 64 * MIB).unwrap();
    let volume = pool.volume("v").unwrap();
    let (written, error) = fill(&volume, 0);
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    let written_bytes = written * WRITE_BYTES as u64;
    assert!(
        (9 * MIB..=12 * MIB).contains(&written_bytes),
        "wrote {written_bytes} bytes into a pool that may grow to 12 MiB"
    );
    let status = pool.space_status();
    assert_eq!(status.capacity_bytes, Some(12 * MIB));
    assert_eq!(status.ceiling_bytes, Some(12 * MIB));
    assert_eq!(status.next_capacity_bytes, None);
    // The pool is not failed: reads go on, and it reopens with everything.
    assert_eq!(pool.failure(), None);
    verify(&volume, written);
    pool.flush().unwrap();
    drop(volume);
    pool.close().unwrap();
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.info().unwrap().capacity_bytes, Some(12 * MIB));
    verify(&pool.volume("v").unwrap(), written);
    assert!(pool.check(false).unwrap().is_clean());
}

#[test]
fn the_host_less_its_reserve_bounds_extension() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SpaceSettings {
        host_reserve: Amount::Bytes(4 * MIB),
        ..stepping(None, MIB)
    };
    let pool = create(&dir.path().join("pool"), 2 * MIB, &settings);
    let used = pool.space_status().used_bytes;
    // 10 MiB free on the host, 4 MiB of it reserved: 6 MiB more at most.
    pool.set_host_space_for_tests(Some(HostSpace {
        available_bytes: 10 * MIB,
        total_bytes: 100 * MIB,
    }));
    let ceiling = used + 6 * MIB;
    assert_eq!(
        pool.space_status().ceiling_bytes,
        Some(ceiling - ceiling % BLOCK_BYTES)
    );
    pool.create_volume("v", 64 * MIB).unwrap();
    let volume = pool.volume("v").unwrap();
    // The host loses what the pool takes, as a real one does.
    let mut written = 0u64;
    let error = loop {
        let taken = pool.space_status().used_bytes - used;
        pool.set_host_space_for_tests(Some(HostSpace {
            available_bytes: (10 * MIB).saturating_sub(taken),
            total_bytes: 100 * MIB,
        }));
        let chunk = vec![(written % 250) as u8 + 1; WRITE_BYTES];
        match volume.write_at(&chunk, written * WRITE_BYTES as u64) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    let capacity = pool.space_status().capacity_bytes.unwrap();
    assert!(
        capacity <= ceiling && capacity > 4 * MIB,
        "capacity {capacity}: past the host's room {ceiling}, or never extended"
    );
    verify(&volume, written);
    // An unknown host (and no maximum) gives no room to grow into.
    pool.set_host_space_for_tests(None);
    assert_eq!(pool.space_status().next_capacity_bytes, None);
}

#[test]
fn without_auto_extension_the_capacity_is_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SpaceSettings {
        auto_extend: false,
        ..stepping(Some(64 * MIB), MIB)
    };
    let pool = create(&dir.path().join("pool"), 3 * MIB, &settings);
    pool.create_volume("v", 64 * MIB).unwrap();
    let (written, error) = fill(&pool.volume("v").unwrap(), 0);
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    assert!(written * (WRITE_BYTES as u64) <= 3 * MIB);
    assert_eq!(pool.space_status().capacity_bytes, Some(3 * MIB));
    assert_eq!(pool.space_status().level, SpaceLevel::Full);
}

#[test]
fn at_the_hard_limit_snapshots_are_refused_and_service_resumes_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = create(&path, 4 * MIB, &stepping(Some(6 * MIB), MIB));
    pool.create_volume("keep", 64 * MIB).unwrap();
    pool.create_volume("scratch", 64 * MIB).unwrap();
    let keep = pool.volume("keep").unwrap();
    let (kept, _) = {
        let chunk = vec![1u8; WRITE_BYTES];
        for i in 0..16 {
            keep.write_at(&chunk, i * WRITE_BYTES as u64).unwrap();
        }
        (16u64, ())
    };
    let scratch = pool.volume("scratch").unwrap();
    let (_, error) = fill(&scratch, 0);
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    // Then block by block, to the last one.
    let mut block = 0;
    while scratch
        .write_at(&[7u8; 4096], 50 * MIB + block * 4096)
        .is_ok()
    {
        block += 1;
        assert!(block < 1000, "single blocks never filled the pool");
    }
    // Writing a single 4K block fails too, cleanly.
    let error = keep.write_at(&[9u8; 4096], 40 * MIB).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    assert_eq!(pool.space_status().level, SpaceLevel::Full);
    let refused = pool.snapshot("keep", "keep@full").unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NoSpace, "{refused}");
    assert!(
        refused.to_string().contains("hard limit"),
        "the refusal says why: {refused}"
    );
    assert!(
        pool.volume("keep@full").is_err(),
        "a refused snapshot left a volume"
    );
    assert_eq!(pool.failure(), None, "a full pool is not a failed one");

    // A higher limit: writes go on at once.
    pool.set_space_settings(&stepping(Some(8 * MIB), MIB))
        .unwrap();
    keep.write_at(&[2u8; WRITE_BYTES], 20 * WRITE_BYTES as u64)
        .unwrap();
    pool.snapshot("keep", "keep@roomy").unwrap();
    let (_, error) = fill(&scratch, 200);
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");

    // Space given back: removal and reclaim.
    drop(scratch);
    pool.remove_volume("scratch").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    assert!(pool.space_status().level < SpaceLevel::Full);
    keep.write_at(&[3u8; WRITE_BYTES], 30 * WRITE_BYTES as u64)
        .unwrap();
    pool.snapshot("keep", "keep@after").unwrap();
    pool.flush().unwrap();
    drop(keep);
    pool.close().unwrap();

    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.space_settings().max_capacity_bytes, Some(8 * MIB));
    let keep = pool.volume("keep").unwrap();
    let mut buf = vec![0u8; WRITE_BYTES];
    for (chunk, expected) in (0..kept).map(|i| (i, 1u8)).chain([(20, 2u8), (30, 3u8)]) {
        keep.read_at(&mut buf, chunk * WRITE_BYTES as u64).unwrap();
        assert!(buf.iter().all(|&b| b == expected), "chunk {chunk} lost");
    }
    assert!(pool.check(false).unwrap().is_clean());
}

#[test]
fn the_watcher_extends_past_extend_at_before_anything_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, volume) = stepping_pool(dir.path());
    let status = pool.watch_space().unwrap();
    assert_eq!(
        status.capacity_bytes,
        Some(4 * MIB),
        "nothing to extend yet"
    );
    fill_past_extend_at(&volume);
    assert_eq!(pool.space_status().capacity_bytes, Some(4 * MIB));
    let status = pool.watch_space().unwrap();
    assert_eq!(status.capacity_bytes, Some(6 * MIB));
    assert_eq!(status.extend_at_bytes, Some(6 * MIB * 80 / 100));
}

#[test]
fn explicit_raises_are_checked_and_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = create(&path, 4 * MIB, &stepping(Some(32 * MIB), MIB));
    let lower = pool.raise_capacity(2 * MIB).unwrap_err();
    assert_eq!(lower.kind(), ErrorKind::InvalidArgument);
    assert!(lower.to_string().contains("can only grow"), "{lower}");
    let above = pool.raise_capacity(64 * MIB).unwrap_err();
    assert!(above.to_string().contains("max_capacity"), "{above}");
    pool.set_host_space_for_tests(Some(HostSpace {
        available_bytes: 16 * MIB,
        total_bytes: 100 * MIB,
    }));
    let unbacked = pool.raise_capacity(30 * MIB).unwrap_err();
    assert!(
        unbacked.to_string().contains("cannot be backed"),
        "{unbacked}"
    );
    assert_eq!(pool.raise_capacity(10 * MIB + 100).unwrap(), 10 * MIB);
    drop(pool);
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.space_status().capacity_bytes, Some(10 * MIB));
}

#[test]
fn settings_live_in_grove_toml_and_bad_ones_are_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let settings = SpaceSettings {
        warn_percent: 60,
        hook: Some("logger pool".into()),
        ..stepping(Some(32 * MIB), MIB)
    };
    drop(create(&path, 4 * MIB, &settings));
    let text = std::fs::read_to_string(path.join("grove.toml")).unwrap();
    assert!(
        text.contains("[space]") && text.contains("warn = \"60%\""),
        "{text}"
    );
    assert_eq!(Pool::open(&path).unwrap().space_settings(), settings);
    let bad = text.replace("warn = \"60%\"", "warn = \"95%\"");
    std::fs::write(path.join("grove.toml"), bad).unwrap();
    let error = Pool::open(&path).err().unwrap();
    assert!(
        error
            .to_string()
            .ends_with("space.warn 95% is above space.prune 90%: the warning must come first"),
        "{error}"
    );
    let bad = text.replace("warn = \"60%\"", "warm = \"60%\"");
    std::fs::write(path.join("grove.toml"), bad).unwrap();
    let error = Pool::open(&path).err().unwrap();
    assert!(
        error.to_string().contains("unknown setting \"space.warm\""),
        "{error}"
    );
}

/// A snapshot past extend_at takes the watcher's step itself: without a
/// watcher (the CLI, an in-process pool) snapshots filled the capacity
/// with their records and failed with "the pool is full" while the host
/// had room (found by the retention bench's in-process builder: 6 volumes
/// of 1,000 to 10,000 snapshots each).
#[test]
fn a_snapshot_past_extend_at_extends_without_a_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, volume) = stepping_pool(dir.path());
    fill_past_extend_at(&volume);
    assert_eq!(pool.space_status().capacity_bytes, Some(4 * MIB));
    pool.snapshot("v", "v@1").unwrap();
    assert_eq!(pool.space_status().capacity_bytes, Some(6 * MIB));
    // Thousands more, each a record, and no failure: the capacity keeps
    // a step ahead.
    for i in 2..=3000 {
        pool.snapshot("v", &format!("v@{i}")).unwrap();
    }
    assert!(pool.check(false).unwrap().is_clean());
}
