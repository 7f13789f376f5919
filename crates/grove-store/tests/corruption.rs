//! Bit flips in every kind of metadata block are found: opening fails with
//! an error naming the damaged object, or the pool opens and both `check`
//! and the reads that reach the damage report it. Never garbage, never a
//! panic. Also: opening arbitrary bytes, or a valid store with random damage,
//! gives an error or a pool, never a panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use grove_store::format::node::{Node, NodeKind};
use grove_store::format::record::{VolumeRecord, RECORD_BYTES};
use grove_store::format::superblock::{Superblock, SUPERBLOCK_LEN};
use grove_store::{ErrorKind, MemDevice, Pool, PoolOptions, VolumeId};

const BLOCK_SIZE_BYTES: u32 = 4096;
const BLOCK: u64 = BLOCK_SIZE_BYTES as u64;

/// A closed pool with a volume big enough for a two-level tree, a snapshot
/// and a clone.
fn build_pool(dir: &Path) -> PathBuf {
    let path = dir.join("pool");
    let pool = Pool::create(&path, &PoolOptions::default()).unwrap();
    pool.create_volume("disk", 4 << 30).unwrap();
    let disk = pool.volume("disk").unwrap();
    for i in 0..8u64 {
        disk.write_at(&[i as u8 + 1; 8192], i * (3 << 20)).unwrap();
    }
    pool.snapshot("disk", "snap").unwrap();
    pool.clone_volume("snap", "clone").unwrap();
    pool.volume("clone")
        .unwrap()
        .write_at(b"clone data", 5 << 20)
        .unwrap();
    drop(disk);
    pool.close().unwrap();
    path
}

/// Where each kind of metadata lives in a store, found by decoding it.
struct Layout {
    superblock: Superblock,
    volume_table_root: u64,
    record_block: u64,
    volume_root: u64,
    leaf_node: u64,
}

fn read_block(image: &[u8], addr: u64) -> &[u8] {
    &image[(addr * BLOCK) as usize..((addr + 1) * BLOCK) as usize]
}

fn layout(image: &[u8]) -> Layout {
    let a = Superblock::decode(&image[..SUPERBLOCK_LEN]).unwrap();
    let b = Superblock::decode(&image[BLOCK as usize..BLOCK as usize + SUPERBLOCK_LEN]).unwrap();
    let superblock = if a.generation > b.generation { a } else { b };
    let valid = superblock.data_start.0..superblock.store_blocks();
    assert_eq!(
        superblock.volume_table_height, 1,
        "one record block holds a few volumes"
    );
    let table_root = superblock.volume_table_root;
    let table = Node::decode(
        read_block(image, table_root.0),
        table_root,
        NodeKind::VolumeTable,
        0,
        valid.clone(),
        superblock.birth_generation,
    )
    .unwrap();
    let record_block = table.entries[0].addr().0;
    let records = read_block(image, record_block);
    // Volume 1 is "disk": its record is slot 1.
    let disk = VolumeRecord::decode(&records[RECORD_BYTES..2 * RECORD_BYTES], VolumeId(1))
        .unwrap()
        .unwrap();
    assert_eq!(disk.name, "disk");
    let root = Node::decode(
        read_block(image, disk.root.0),
        disk.root,
        NodeKind::VolumeData,
        disk.height - 1,
        valid,
        superblock.birth_generation,
    )
    .unwrap();
    let leaf = root
        .entries
        .iter()
        .find(|e| !e.is_empty())
        .unwrap()
        .addr()
        .0;
    Layout {
        volume_table_root: table_root.0,
        record_block,
        volume_root: disk.root.0,
        leaf_node: leaf,
        superblock,
    }
}

fn read_all(pool: &Pool) -> Result<(), grove_store::Error> {
    for info in pool.volumes()? {
        let volume = pool.volume(&info.summary.name)?;
        for (offset, len) in volume.mapped_extents()? {
            let mut buf = vec![0u8; len as usize];
            volume.read_at(&mut buf, offset)?;
        }
    }
    Ok(())
}

/// Flips one bit and checks that the damage is found. `names` is what the
/// error or report must mention.
fn flip_and_expect_detection(path: &Path, pristine: &[u8], byte: u64, bit: u8, names: &str) {
    let mut image = pristine.to_vec();
    image[byte as usize] ^= 1 << bit;
    std::fs::write(path.join("grove.store"), &image).unwrap();
    let context = format!("bit {bit} of byte {byte} ({names})");
    match Pool::open(path) {
        Err(e) => {
            assert!(
                matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotAPool),
                "{context}: open failed with {:?}: {e}",
                e.kind()
            );
            assert!(
                e.to_string().contains(names),
                "{context}: error does not name the object: {e}"
            );
        }
        Ok(pool) => {
            let report = pool.check(false).unwrap();
            let all: Vec<&String> = report.errors.iter().chain(&report.warnings).collect();
            assert!(
                all.iter().any(|line| line.contains(names)),
                "{context}: check did not report it: {report:?}"
            );
            if !report.errors.is_empty() {
                let error = read_all(&pool).unwrap_err();
                assert_eq!(error.kind(), ErrorKind::Corrupt, "{context}: {error}");
            }
        }
    }
}

#[test]
fn a_flipped_bit_in_any_metadata_block_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join("grove.store")).unwrap();
    let layout = layout(&pristine);
    let group_map = layout.superblock.data_start.0;
    let current_slot = layout.superblock.generation % 2;
    let targets = [
        (current_slot, "superblock"),
        (group_map, "allocation map of group 0"),
        (layout.volume_table_root, "volume table"),
        (layout.record_block, "volume table record"),
        (
            layout.volume_root,
            &*format!("radix node at block {}", layout.volume_root),
        ),
        (
            layout.leaf_node,
            &*format!("radix node at block {}", layout.leaf_node),
        ),
    ];
    for (block, names) in targets {
        // The header, the first entries, the middle and the last byte.
        for offset in [0, 5, 13, 100, 2047, 4095] {
            for bit in [0, 3, 7] {
                flip_and_expect_detection(&path, &pristine, block * BLOCK + offset, bit, names);
            }
        }
    }
}

#[test]
fn arbitrary_bytes_and_random_damage_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join("grove.store")).unwrap();
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let open = |image: Vec<u8>| {
        if let Ok(pool) = Pool::open_device(
            Arc::new(MemDevice::from_bytes(image)),
            Path::new("fuzz"),
            None,
        ) {
            let _ = pool.check(false);
            let _ = read_all(&pool);
            let _ = pool.info();
            let _ = pool.create_volume("new", 1 << 20);
            // Everything that walks, counts or gives back trees, on
            // whatever the damaged store holds.
            let names = pool.volume_names();
            if let [a, b, ..] = names.as_slice() {
                let _ = pool.diff(a, b);
                let _ = pool.rollback(a, Some(b), true);
            }
            for name in &names {
                let _ = pool.snapshot(name, &format!("{name}-snap"));
                let _ = pool.remove_volume(name);
            }
            let _ = pool.reclaim_all(|_| {});
            let _ = pool.check(true);
            let _ = pool.flush();
        }
    };
    // Random bytes, short and long.
    for _ in 0..200 {
        let len = (next() % 40_000) as usize;
        open((0..len).map(|_| next() as u8).collect());
    }
    // A valid store with a handful of random bytes overwritten in the
    // metadata area (superblocks, journal, first group's map and nodes).
    let metadata_bytes = ((layout(&pristine).superblock.data_start.0 + 64) * BLOCK) as usize;
    for _ in 0..300 {
        let mut image = pristine.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % metadata_bytes.min(image.len());
            image[at] = next() as u8;
        }
        open(image);
    }
}

#[test]
fn repair_rewrites_a_damaged_superblock_slot() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let mut image = std::fs::read(path.join("grove.store")).unwrap();
    let spare_slot = (layout(&image).superblock.generation + 1) % 2;
    image[(spare_slot * BLOCK + 40) as usize] ^= 0x10;
    std::fs::write(path.join("grove.store"), &image).unwrap();
    let pool = Pool::open(&path).unwrap();
    let report = pool.check(true).unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("superblock slot")),
        "{report:?}"
    );
    assert!(
        report.repaired.iter().any(|r| r.contains("superblock")),
        "{report:?}"
    );
    let after = pool.check(false).unwrap();
    assert!(after.is_clean() && after.warnings.is_empty(), "{after:?}");
    drop(pool);
    let reopened = Pool::open(&path).unwrap();
    let again = reopened.check(false).unwrap();
    assert!(
        again.is_clean() && again.warnings.is_empty(),
        "after reopen: {again:?}"
    );
}

#[test]
fn check_reads_back_the_journal_and_finds_a_damaged_transaction() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = Pool::create(&path, &PoolOptions::default()).unwrap();
    pool.create_volume("v", 64 << 20).unwrap();
    let v = pool.volume("v").unwrap();
    for i in 0..4u64 {
        v.write_at(&[i as u8 + 1; 8192], i << 20).unwrap();
        v.flush().unwrap();
    }
    // The transactions since the last checkpoint read back whole.
    assert!(pool.check(false).unwrap().is_clean());
    // Damage the journal's first block behind the pool's back: the
    // committed transactions no longer read back.
    let store = std::fs::OpenOptions::new()
        .write(true)
        .open(path.join("grove.store"))
        .unwrap();
    let journal_start = 2 * BLOCK;
    store.write_all_at(&[0xffu8; 64], journal_start).unwrap();
    let report = pool.check(false).unwrap();
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.contains("journal") && e.contains("read back")),
        "{report:?}"
    );
}

/// A map block damaged anywhere (not only torn) is rebuilt from the trees
/// at open: the pool opens with a warning naming the group, `check` finds
/// the map agreeing with the trees (no leak, no block marked free that is
/// in use), every volume reads as before, and the next open finds a good
/// map again.
#[test]
fn a_damaged_map_is_rebuilt_from_the_trees_and_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let before = {
        let pool = Pool::open(&path).unwrap();
        let contents = mapped_contents(&pool);
        pool.close().unwrap();
        contents
    };
    let mut image = std::fs::read(path.join("grove.store")).unwrap();
    let map = layout(&image).superblock.data_start.0;
    // Nibbles of blocks in use, and the header: both must come back.
    for offset in [8, 64, 100, 2000] {
        image[(map * BLOCK) as usize + offset] ^= 0x11;
    }
    std::fs::write(path.join("grove.store"), &image).unwrap();
    let pool = Pool::open(&path).unwrap();
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("allocation maps of groups 0 were unusable")),
        "{report:?}"
    );
    assert!(
        !report
            .warnings
            .iter()
            .any(|w| w.contains("leaked") || w.contains("wrong kind")),
        "{report:?}"
    );
    assert!(mapped_contents(&pool) == before, "a volume changed");
    pool.create_volume("after", 1 << 20).unwrap();
    pool.close().unwrap();
    let pool = Pool::open(&path).unwrap();
    let report = pool.check(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
}

/// What every volume maps, extent by extent (the volumes are 4 GiB, mostly
/// holes: reading them whole would take 12 GiB).
fn mapped_contents(pool: &Pool) -> Vec<(String, u64, Vec<u8>)> {
    let mut contents = Vec::new();
    for info in pool.volumes().unwrap() {
        let volume = pool.volume(&info.summary.name).unwrap();
        for (offset, len) in volume.mapped_extents().unwrap() {
            let mut buf = vec![0u8; len as usize];
            volume.read_at(&mut buf, offset).unwrap();
            contents.push((info.summary.name.clone(), offset, buf));
        }
    }
    contents
}

/// A memory device that says which 64 KiB "object" keeps each byte, as a
/// pool in RADOS does (grove-rados's `place_of`).
struct PlacedDevice(MemDevice);

impl grove_store::BlockDevice for PlacedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn len_bytes(&self) -> std::io::Result<u64> {
        self.0.len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> std::io::Result<()> {
        self.0.set_len_bytes(len_bytes)
    }
    fn describe(&self) -> String {
        "placed memory device".into()
    }
    fn place_of(&self, offset: u64) -> Option<String> {
        Some(format!("object {}", offset / (64 * 1024)))
    }
}

/// A damaged radix node is named with the place its device keeps it in,
/// by check and by a read that reaches it: on RADOS, the object to restore.
#[test]
fn a_damaged_node_is_named_with_the_place_its_device_keeps_it_in() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let mut image = std::fs::read(path.join("grove.store")).unwrap();
    let leaf = layout(&image).leaf_node;
    image[(leaf * BLOCK + 100) as usize] ^= 1;
    let device = Arc::new(PlacedDevice(MemDevice::from_bytes(image)));
    let pool = Pool::open_device(device, &path, None).unwrap();
    let named = format!("radix node at block {leaf} is damaged: checksum mismatch (stored");
    let place = format!("(kept in object {})", leaf * BLOCK / (64 * 1024));
    let report = pool.check(false).unwrap();
    assert!(
        report
            .errors
            .iter()
            .any(|line| line.contains(&named) && line.ends_with(&place)),
        "{:?}",
        report.errors
    );
    let error = read_all(&pool).unwrap_err();
    assert!(
        error.to_string().contains(&named) && error.to_string().ends_with(&place),
        "{error}"
    );
}
