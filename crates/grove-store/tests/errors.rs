//! Bad input to the engine: every refusal has the right error kind, names
//! what failed, never panics, and leaves the pool exactly as it was (same
//! volumes, same contents), so that a caller can always try again.

use std::path::{Path, PathBuf};

use grove_store::{ErrorKind, Pool, PoolOptions, VolumeInfo};

/// Not the default block size, so a test that assumes 4 KiB (for example
/// when it looks for superblock slot 1) goes wrong. Small blocks and a small
/// journal keep the store (one allocation group) at a few MiB, since tests
/// here copy it whole.
const BLOCK_SIZE_BYTES: u32 = 2048;
const JOURNAL_BYTES: u64 = 256 * 1024;
const DISK_BYTES: u64 = 4 << 20;
const SUPERBLOCK_VERSION_OFFSET: u64 = 8;

fn options() -> PoolOptions {
    PoolOptions {
        block_size_bytes: BLOCK_SIZE_BYTES,
        capacity_bytes: None,
        journal_bytes: Some(JOURNAL_BYTES),
    }
}

/// A pool with a written volume, a read-only snapshot of it and a clone
/// that differs from both. Closed; returns its directory.
fn build_pool(dir: &Path) -> PathBuf {
    let path = dir.join("pool");
    let pool = Pool::create(&path, &options()).unwrap();
    pool.create_volume("disk", DISK_BYTES).unwrap();
    let disk = pool.volume("disk").unwrap();
    disk.write_at(&[1u8; 20_000], 5000).unwrap();
    disk.write_at(b"the end", DISK_BYTES - 7).unwrap();
    pool.snapshot("disk", "snap").unwrap();
    pool.clone_volume("snap", "clone").unwrap();
    pool.volume("clone")
        .unwrap()
        .write_at(&[2u8; 3000], 100_000)
        .unwrap();
    disk.write_at(&[3u8; 100], 0).unwrap();
    drop(disk);
    pool.close().unwrap();
    path
}

/// Everything a user can observe: the volume list and every volume's bytes.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    volumes: Vec<VolumeInfo>,
    contents: Vec<Vec<u8>>,
}

fn observe(pool: &Pool) -> Observed {
    let volumes = pool.volumes().unwrap();
    let contents = volumes
        .iter()
        .map(|v| {
            let mut buf = vec![0u8; v.summary.size_bytes as usize];
            pool.volume(&v.summary.name)
                .unwrap()
                .read_at(&mut buf, 0)
                .unwrap();
            buf
        })
        .collect();
    Observed { volumes, contents }
}

fn observe_closed(path: &Path) -> Observed {
    let pool = Pool::open(path).unwrap();
    let observed = observe(&pool);
    pool.close().unwrap();
    observed
}

/// `build_pool`'s pool, open, and everything it shows.
fn open_built_pool(dir: &Path) -> (Pool, Observed) {
    let pool = Pool::open(&build_pool(dir)).unwrap();
    let before = observe(&pool);
    (pool, before)
}

/// `build_pool`'s pool, closed, and everything it shows.
fn build_closed_pool(dir: &Path) -> (PathBuf, Observed) {
    let path = build_pool(dir);
    let before = observe_closed(&path);
    (path, before)
}

/// The pool's grove.toml: where it is and what it holds.
fn read_config(path: &Path) -> (PathBuf, String) {
    let config_path = path.join("grove.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    (config_path, config)
}

#[track_caller]
fn assert_kind<T: std::fmt::Debug>(result: grove_store::Result<T>, kind: ErrorKind) {
    match result {
        Err(e) => {
            assert_eq!(e.kind(), kind, "wrong kind for error: {e}");
            assert!(!e.message().is_empty() && !e.message().contains('\n'));
        }
        Ok(v) => panic!("expected {kind:?}, got Ok({v:?})"),
    }
}

#[test]
fn unknown_volumes_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, before) = open_built_pool(dir.path());
    assert_kind(pool.volume("nope").map(|_| ()), ErrorKind::NotFound);
    assert_kind(pool.volume_info("nope"), ErrorKind::NotFound);
    assert_kind(pool.remove_volume("nope"), ErrorKind::NotFound);
    assert_kind(pool.snapshot("nope", "new"), ErrorKind::NotFound);
    assert_kind(pool.clone_volume("nope", "new"), ErrorKind::NotFound);
    assert_kind(pool.resize_volume("nope", 1 << 20), ErrorKind::NotFound);
    assert_kind(pool.rename_volume("nope", "new"), ErrorKind::NotFound);
    // Names are exact: no case folding, no prefixes.
    assert_kind(pool.volume("Disk").map(|_| ()), ErrorKind::NotFound);
    assert_kind(pool.volume("dis").map(|_| ()), ErrorKind::NotFound);
    assert_eq!(observe(&pool), before);

    // A handle outlives its volume only to report that it is gone.
    let handle = pool.volume("clone").unwrap();
    // A claim keeps a volume from being removed, unless forced.
    let claim = handle.claim();
    assert_kind(pool.remove_volume("clone"), ErrorKind::Busy);
    pool.remove(
        "clone",
        grove_store::RemoveOptions {
            recursive: false,
            force: true,
        },
    )
    .unwrap();
    drop(claim);
    let mut buf = [0u8; 10];
    assert_kind(handle.read_at(&mut buf, 0), ErrorKind::NotFound);
    assert_kind(handle.write_at(&buf, 0), ErrorKind::NotFound);
    assert_kind(handle.discard(0, 10), ErrorKind::NotFound);
    assert_kind(handle.mapped_extents(), ErrorKind::NotFound);
    assert_kind(handle.info(), ErrorKind::NotFound);
    // Even when a new volume takes the name: handles follow ids.
    pool.create_volume("clone", DISK_BYTES).unwrap();
    assert_kind(handle.read_at(&mut buf, 0), ErrorKind::NotFound);
}

#[test]
fn taken_names_already_exist() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, before) = open_built_pool(dir.path());
    assert_kind(
        pool.create_volume("disk", 1 << 20),
        ErrorKind::AlreadyExists,
    );
    assert_kind(
        pool.create_volume("snap", 1 << 20),
        ErrorKind::AlreadyExists,
    );
    assert_kind(pool.snapshot("disk", "clone"), ErrorKind::AlreadyExists);
    assert_kind(pool.clone_volume("clone", "snap"), ErrorKind::AlreadyExists);
    assert_kind(pool.snapshot("disk", "disk"), ErrorKind::AlreadyExists);
    assert_kind(pool.rename_volume("disk", "snap"), ErrorKind::AlreadyExists);
    assert_kind(pool.rename_volume("disk", "disk"), ErrorKind::AlreadyExists);
    assert_eq!(observe(&pool), before);
    // A pool where there is one already.
    assert_kind(
        Pool::create(pool.dir(), &options()).map(|_| ()),
        ErrorKind::AlreadyExists,
    );
    assert_eq!(observe(&pool), before);
}

#[test]
fn snapshots_are_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, before) = open_built_pool(dir.path());
    let snap = pool.volume("snap").unwrap();
    assert!(snap.is_read_only().unwrap());
    assert_kind(snap.write_at(b"x", 0), ErrorKind::ReadOnly);
    assert_kind(snap.write_at(&[9u8; 100_000], 4096), ErrorKind::ReadOnly);
    assert_kind(snap.discard(0, DISK_BYTES), ErrorKind::ReadOnly);
    assert_kind(
        pool.resize_volume("snap", 2 * DISK_BYTES),
        ErrorKind::ReadOnly,
    );
    assert_kind(
        pool.resize_volume("snap", DISK_BYTES / 2),
        ErrorKind::ReadOnly,
    );
    // A read-only refusal comes before the range check.
    assert_kind(snap.write_at(b"x", DISK_BYTES), ErrorKind::ReadOnly);
    // A snapshot of a snapshot is read-only too; a clone of it is writable.
    pool.snapshot("snap", "snap2").unwrap();
    assert_kind(
        pool.volume("snap2").unwrap().write_at(b"x", 0),
        ErrorKind::ReadOnly,
    );
    pool.remove_volume("snap2").unwrap();
    // Until the reclaimer runs, the removed snapshot still shares blocks,
    // so the accounting is compared once it has.
    pool.reclaim_all(|_| {}).unwrap();
    assert_eq!(observe(&pool), before);
}

/// The bytes of one volume.
fn contents(pool: &Pool, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; pool.volume_info(name).unwrap().summary.size_bytes as usize];
    pool.volume(name).unwrap().read_at(&mut buf, 0).unwrap();
    buf
}

/// A refused rollback: the kind, one line that names `named` and none of
/// `not_named` (volumes the caller did not name are never blamed).
#[track_caller]
fn assert_rollback_refused(
    pool: &Pool,
    source: &str,
    target: Option<&str>,
    kind: ErrorKind,
    says: &[&str],
    not_named: &[&str],
) {
    let e = pool.rollback(source, target, false).unwrap_err();
    assert_eq!(e.kind(), kind, "{e}");
    let message = e.message();
    assert!(!message.contains('\n'), "{message}");
    assert!(message.contains(&format!("{source:?}")), "{message}");
    for text in says {
        assert!(message.contains(text), "{text:?} not in: {message}");
    }
    for name in not_named {
        assert!(!message.contains(&format!("{name:?}")), "{message}");
    }
}

#[test]
fn rollback_named_alone_takes_only_a_snapshot_and_resets_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::open(&build_pool(dir.path())).unwrap();
    pool.snapshot("snap", "snap2").unwrap();
    pool.snapshot("clone", "clone@1").unwrap();
    let before = observe(&pool);
    // A writable clone or volume named alone is refused: resetting a
    // volume to a writable one's contents takes both names.
    assert_rollback_refused(
        &pool,
        "clone",
        None,
        ErrorKind::InvalidArgument,
        &[
            "writable clone, not a snapshot",
            "grove rollback clone VOLUME",
        ],
        &["snap", "disk"],
    );
    assert_rollback_refused(
        &pool,
        "disk",
        None,
        ErrorKind::InvalidArgument,
        &["writable volume, not a snapshot"],
        &["snap", "clone"],
    );
    // A snapshot of a snapshot: its parent cannot be reset.
    assert_rollback_refused(
        &pool,
        "snap2",
        None,
        ErrorKind::InvalidArgument,
        &["taken from \"snap\", a read-only snapshot"],
        &["disk"],
    );
    // A read-only target named outright is named back.
    assert_rollback_refused(
        &pool,
        "clone",
        Some("snap"),
        ErrorKind::ReadOnly,
        &["\"snap\"", "read-only"],
        &["disk"],
    );
    assert_rollback_refused(
        &pool,
        "disk",
        Some("disk"),
        ErrorKind::InvalidArgument,
        &["itself"],
        &["snap"],
    );
    assert_eq!(observe(&pool), before);

    // A snapshot named alone resets the volume it was taken from, and
    // nothing else.
    let snap = contents(&pool, "snap");
    let clone = contents(&pool, "clone");
    assert_ne!(contents(&pool, "disk"), snap);
    let info = pool.rollback("clone@1", None, false).unwrap();
    assert_eq!(info.summary.name, "clone");
    assert_eq!(contents(&pool, "clone"), clone);
    pool.volume("clone")
        .unwrap()
        .write_at(&[7u8; 10], 0)
        .unwrap();
    let info = pool.rollback("snap", None, false).unwrap();
    assert_eq!(info.summary.name, "disk");
    assert_eq!(contents(&pool, "disk"), snap);
    assert_eq!(contents(&pool, "snap"), snap);
    assert_ne!(contents(&pool, "clone"), clone);
    // Both names written out: a volume reset to a clone's contents.
    let clone = contents(&pool, "clone");
    pool.rollback("clone", Some("disk"), false).unwrap();
    assert_eq!(contents(&pool, "disk"), clone);
    assert_eq!(contents(&pool, "clone"), clone);
    assert_eq!(contents(&pool, "snap"), snap);
    pool.reclaim_all(|_| {}).unwrap();
    assert!(pool.check(false).unwrap().is_clean());
}

#[test]
fn rollback_with_a_removed_origin_changes_nothing() {
    // Regression: `rollback clone` with the clone's origin snapshot removed
    // reset the snapshot's parent ("disk", never named) to the clone's
    // contents, and its newer writes were gone.
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::open(&build_pool(dir.path())).unwrap();
    pool.remove_volume("snap").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    let before = observe(&pool);
    assert_rollback_refused(
        &pool,
        "clone",
        None,
        ErrorKind::InvalidArgument,
        &["writable clone, not a snapshot"],
        &["snap", "disk"],
    );
    assert_eq!(observe(&pool), before);
    // A snapshot whose volume was removed names it, and asks for a target.
    pool.snapshot("clone", "clone@1").unwrap();
    pool.remove_volume("clone").unwrap();
    pool.reclaim_all(|_| {}).unwrap();
    let before = observe(&pool);
    assert_rollback_refused(
        &pool,
        "clone@1",
        None,
        ErrorKind::InvalidArgument,
        &[
            "taken from \"clone\", which was removed",
            "grove rollback clone@1 VOLUME",
        ],
        &["disk"],
    );
    assert_eq!(observe(&pool), before);
    // Named outright, the target is reset.
    let snapshot = contents(&pool, "clone@1");
    pool.rollback("clone@1", Some("disk"), false).unwrap();
    assert_eq!(contents(&pool, "disk"), snapshot);
}

#[test]
fn io_outside_a_volume_is_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, before) = open_built_pool(dir.path());
    let disk = pool.volume("disk").unwrap();
    let size = DISK_BYTES;
    // (offset, len): one byte past the end, entirely past the end, empty
    // but starting past the end, at the top of u64, and offset + len
    // overflowing u64.
    let cases = [
        (size - 1, 2),
        (size, 1),
        (size + 4096, 4096),
        (size + 1, 0),
        (u64::MAX, 1),
        (u64::MAX, 0),
        (u64::MAX - 10, 100),
        (1 << 63, 1 << 20),
    ];
    for (offset, len) in cases {
        let mut buf = vec![0u8; len as usize];
        assert_kind(disk.read_at(&mut buf, offset), ErrorKind::OutOfRange);
        assert_kind(disk.write_at(&buf, offset), ErrorKind::OutOfRange);
        assert_kind(disk.discard(offset, len), ErrorKind::OutOfRange);
    }
    // Discard lengths that overflow on their own.
    assert_kind(disk.discard(1, u64::MAX), ErrorKind::OutOfRange);
    assert_kind(disk.discard(0, u64::MAX), ErrorKind::OutOfRange);
    // The edges themselves are fine.
    let mut last = [0u8; 7];
    disk.read_at(&mut last, size - 7).unwrap();
    assert_eq!(&last, b"the end");
    disk.read_at(&mut [], size).unwrap();
    disk.write_at(&[], size).unwrap();
    disk.discard(size, 0).unwrap();
    assert_eq!(observe(&pool), before);
}

#[test]
fn bad_sizes_names_and_block_sizes_are_invalid_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, before) = open_built_pool(dir.path());
    for size in [
        0,
        1,
        511,
        513,
        1000,
        (1 << 20) + 1,
        (1 << 56) + 512,
        u64::MAX,
    ] {
        assert_kind(pool.create_volume("new", size), ErrorKind::InvalidArgument);
        assert_kind(pool.resize_volume("disk", size), ErrorKind::InvalidArgument);
    }
    let long = "x".repeat(129);
    for name in [
        "",
        "a/b",
        ".hidden",
        "-flag",
        "with space",
        "tab\t",
        "é",
        long.as_str(),
    ] {
        assert_kind(
            pool.create_volume(name, 1 << 20),
            ErrorKind::InvalidArgument,
        );
        assert_kind(pool.snapshot("disk", name), ErrorKind::InvalidArgument);
        assert_kind(pool.clone_volume("disk", name), ErrorKind::InvalidArgument);
        assert_kind(pool.rename_volume("disk", name), ErrorKind::InvalidArgument);
    }
    // The longest allowed name and the smallest allowed size are fine.
    let longest = "y".repeat(128);
    pool.create_volume(&longest, 512).unwrap();
    pool.remove_volume(&longest).unwrap();
    assert_eq!(observe(&pool), before);
}

#[test]
fn a_refused_create_leaves_nothing_in_the_way() {
    // Regression: a bad block size used to be refused only after the store
    // file was created, and the corrected retry then failed with
    // AlreadyExists ("grove.store already exists").
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let bad = PoolOptions {
        block_size_bytes: 3000,
        ..PoolOptions::default()
    };
    assert_kind(
        Pool::create(&path, &bad).map(|_| ()),
        ErrorKind::InvalidArgument,
    );
    Pool::create(&path, &options()).unwrap();
}

#[test]
fn bad_pool_options_are_invalid_arguments_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let block_sizes = [0, 512, 1000, 3000, 4095, 128 * 1024];
    let bad_options = block_sizes
        .iter()
        .map(|&block_size_bytes| PoolOptions {
            block_size_bytes,
            ..PoolOptions::default()
        })
        .chain([PoolOptions {
            journal_bytes: Some(4096),
            ..PoolOptions::default()
        }]);
    for bad in bad_options {
        assert_kind(
            Pool::create(&path, &bad).map(|_| ()),
            ErrorKind::InvalidArgument,
        );
        let err = Pool::open(&path).map(|_| ()).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::NotFound | ErrorKind::NotAPool),
            "{err}"
        );
        assert!(!path.join("grove.store").exists(), "{bad:?} left a store");
    }
    let pool = Pool::create(&path, &options()).unwrap();
    assert_eq!(pool.block_size_bytes(), BLOCK_SIZE_BYTES);
}

#[test]
fn what_is_not_a_pool_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    assert_kind(
        Pool::open(&dir.path().join("missing")).map(|_| ()),
        ErrorKind::NotFound,
    );
    // An empty directory, or one with other files.
    assert_kind(Pool::open(dir.path()).map(|_| ()), ErrorKind::NotAPool);
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    assert_kind(Pool::open(dir.path()).map(|_| ()), ErrorKind::NotAPool);
    // A regular file instead of a directory.
    assert_kind(
        Pool::open(&dir.path().join("notes.txt")).map(|_| ()),
        ErrorKind::NotAPool,
    );
    // A grove.toml that is not a pool configuration.
    let odd = dir.path().join("odd");
    std::fs::create_dir(&odd).unwrap();
    std::fs::write(odd.join("grove.toml"), "this is = not [valid toml").unwrap();
    assert_kind(Pool::open(&odd).map(|_| ()), ErrorKind::NotAPool);
    std::fs::write(odd.join("grove.toml"), "store = \"grove.store\"\n").unwrap();
    assert_kind(Pool::open(&odd).map(|_| ()), ErrorKind::NotAPool);
    std::fs::write(
        odd.join("grove.toml"),
        "format_version = 2\nstore = \"../x\"\n",
    )
    .unwrap();
    assert_kind(Pool::open(&odd).map(|_| ()), ErrorKind::NotAPool);
    // A configuration whose store is missing.
    let path = build_pool(dir.path());
    let store = path.join("grove.store");
    let moved = dir.path().join("moved.store");
    std::fs::rename(&store, &moved).unwrap();
    assert_kind(Pool::open(&path).map(|_| ()), ErrorKind::NotAPool);
    std::fs::rename(&moved, &store).unwrap();
    Pool::open(&path).unwrap().close().unwrap();
}

#[test]
fn a_pool_from_a_newer_grove_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = build_closed_pool(dir.path());

    // Newer in grove.toml.
    let (config_path, config) = read_config(&path);
    assert!(config.contains("format_version = 2"), "{config}");
    let newer = config.replace("format_version = 2", "format_version = 3");
    std::fs::write(&config_path, &newer).unwrap();
    assert_kind(Pool::open(&path).map(|_| ()), ErrorKind::UnsupportedVersion);
    // Also when the rest of the configuration is something this grove
    // does not know: the version is what matters.
    std::fs::write(
        &config_path,
        "format_version = 7\nbranches = [\"a\", \"b\"]\n",
    )
    .unwrap();
    assert_kind(Pool::open(&path).map(|_| ()), ErrorKind::UnsupportedVersion);
    std::fs::write(&config_path, &config).unwrap();
    assert_eq!(observe_closed(&path), before);

    // Newer in both superblock slots.
    assert_superblock_version_refused(&path, 3, &before);
}

/// With both superblock slots (slot 1 is one block in) patched from
/// version 2 to `version`, the open is refused as an unsupported version
/// that it names, and writes nothing; with the store put back, the pool is
/// as `before`.
#[track_caller]
fn assert_superblock_version_refused(path: &Path, version: u32, before: &Observed) {
    let store_path = path.join("grove.store");
    let pristine = std::fs::read(&store_path).unwrap();
    let mut patched = pristine.clone();
    for slot in 0..2u64 {
        let at = (slot * u64::from(BLOCK_SIZE_BYTES) + SUPERBLOCK_VERSION_OFFSET) as usize;
        assert_eq!(&patched[at..at + 4], &2u32.to_le_bytes(), "slot {slot}");
        patched[at..at + 4].copy_from_slice(&version.to_le_bytes());
    }
    std::fs::write(&store_path, &patched).unwrap();
    let err = Pool::open(path).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion, "{err}");
    assert!(
        err.message().contains(&format!("version {version}")),
        "{err}"
    );
    // Refusing wrote nothing.
    assert!(std::fs::read(&store_path).unwrap() == patched);
    std::fs::write(&store_path, &pristine).unwrap();
    assert_eq!(&observe_closed(path), before);
}

#[test]
fn a_version_1_pool_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = build_closed_pool(dir.path());
    let (config_path, config) = read_config(&path);
    std::fs::write(
        &config_path,
        config.replace("format_version = 2", "format_version = 1"),
    )
    .unwrap();
    let err = Pool::open(&path).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion, "{err}");
    assert!(err.message().contains("version 1"), "{err}");
    assert!(err.message().contains("grove export"), "{err}");
    assert!(!err.message().contains('\n'), "{err}");
    std::fs::write(&config_path, &config).unwrap();

    // A version-1 superblock in both slots (grove.toml says 2).
    assert_superblock_version_refused(&path, 1, &before);
}

#[test]
fn a_truncated_store_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = build_closed_pool(dir.path());
    let store_path = path.join("grove.store");
    let pristine = std::fs::read(&store_path).unwrap();
    let block = u64::from(BLOCK_SIZE_BYTES);
    let len = pristine.len() as u64;
    // Both superblocks survive, but the store is shorter than they say.
    for keep in [len - block, len / 2, 3 * block, 2 * block] {
        std::fs::write(&store_path, &pristine[..keep as usize]).unwrap();
        let err = Pool::open(&path).map(|_| ()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "kept {keep} bytes: {err}");
        assert!(err.message().contains("truncated"), "{err}");
    }
    // Cut inside the superblocks: still an error, and not "corrupt" only
    // when nothing of a grove store is left.
    for keep in [block + 100, 100, 0] {
        std::fs::write(&store_path, &pristine[..keep as usize]).unwrap();
        let err = Pool::open(&path).map(|_| ()).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Corrupt | ErrorKind::NotAPool),
            "kept {keep} bytes: {err}"
        );
    }
    std::fs::write(&store_path, &pristine).unwrap();
    assert_eq!(observe_closed(&path), before);
}

#[test]
fn a_store_of_random_bytes_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let store_path = path.join("grove.store");
    let pristine = std::fs::read(&store_path).unwrap();
    let mut state = 0x1234_5678_9abc_def1u64;
    let mut random = |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    };
    for len in [1, 512, 2048, 3 * 2048, 1 << 20] {
        std::fs::write(&store_path, random(len)).unwrap();
        let err = Pool::open(&path).map(|_| ()).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::NotAPool | ErrorKind::Corrupt),
            "{len} random bytes: {err}"
        );
    }
    // Random bytes behind a valid pair of superblocks: open may fail or
    // succeed (if nothing it reads is hit), but must not panic.
    for _ in 0..4 {
        let mut bytes = pristine.clone();
        let superblocks = 2 * BLOCK_SIZE_BYTES as usize;
        let noise = random(bytes.len() - superblocks);
        bytes[superblocks..].copy_from_slice(&noise);
        std::fs::write(&store_path, &bytes).unwrap();
        if let Ok(pool) = Pool::open(&path) {
            for v in pool.volumes().unwrap() {
                let mut buf = vec![0u8; 65536];
                let _ = pool.volume(&v.summary.name).unwrap().read_at(&mut buf, 0);
            }
            let _ = pool.check(false);
        }
    }
    std::fs::write(&store_path, &pristine).unwrap();
    Pool::open(&path).unwrap().close().unwrap();
}

#[test]
fn a_second_open_is_busy_and_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pool = Pool::open(&path).unwrap();
    let before = observe(&pool);
    assert_kind(Pool::open(&path).map(|_| ()), ErrorKind::Busy);
    assert_kind(
        Pool::create(&path, &options()).map(|_| ()),
        ErrorKind::AlreadyExists,
    );
    // The first opener keeps working after the refused second one.
    let disk = pool.volume("disk").unwrap();
    disk.write_at(b"still mine", 0).unwrap();
    disk.flush().unwrap();
    assert_kind(Pool::open(&path).map(|_| ()), ErrorKind::Busy);
    let mut buf = [0u8; 10];
    disk.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"still mine");
    // The pool is free again only when the last handle is gone.
    drop(disk);
    pool.close().unwrap();
    let pool = Pool::open(&path).unwrap();
    let mut after = observe(&pool);
    let disk_index = after
        .volumes
        .iter()
        .position(|v| v.summary.name == "disk")
        .unwrap();
    assert_eq!(&after.contents[disk_index][..10], b"still mine");
    after.contents[disk_index][..10].copy_from_slice(&before.contents[disk_index][..10]);
    assert_eq!(after, before);
}
