//! Crafted stores: every block here passes its checksum, so only the checks
//! of each field against the pool's own geometry can catch what is wrong.
//! Opening such a store fails with one line that names the field, its
//! value and the bound, and writes nothing to it. Replay refuses what it
//! cannot apply instead of dropping an acknowledged write in silence, while
//! a torn last transaction (what a crash leaves) still ends the journal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use grove_store::format::journal::Descriptor;
use grove_store::format::node::{Node, NodeKind};
use grove_store::format::record::{VolumeRecord, RECORD_BYTES};
use grove_store::format::superblock::{Superblock, JOURNAL_SEQUENCE_MAX, SUPERBLOCK_LEN};
use grove_store::{ErrorKind, MemDevice, Pool, PoolOptions, VolumeId};

const BLOCK: u64 = 4096;
const STORE: &str = "grove.store";

/// Superblock field offsets (format/superblock.rs).
mod sb {
    pub const CRC: usize = 12;
    pub const GROUP_COUNT: usize = 64;
    pub const CAPACITY: usize = 72;
    pub const VT_ROOT: usize = 80;
    pub const NEXT_VOLUME_ID: usize = 96;
    pub const JOURNAL_SEQUENCE: usize = 104;
    pub const JOURNAL_HEAD: usize = 112;
    pub const BIRTH_GENERATION: usize = 144;
}
/// Descriptor offsets (format/journal.rs).
const DESCRIPTOR_CRC: usize = 4;
const DESCRIPTOR_RESERVED: usize = 57;

fn reseal(bytes: &mut [u8], crc_offset: usize) {
    bytes[crc_offset..crc_offset + 4].fill(0);
    let crc = crc32c::crc32c(bytes);
    bytes[crc_offset..crc_offset + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A closed pool: a volume with data, a snapshot of it, and a clone of
/// the snapshot (ids 1, 2 and 3), all in group 0.
fn build_pool(dir: &Path) -> PathBuf {
    let path = dir.join("pool");
    let pool = Pool::create(&path, &PoolOptions::default()).unwrap();
    pool.create_volume("disk", 64 << 20).unwrap();
    let disk = pool.volume("disk").unwrap();
    for i in 0..8u64 {
        disk.write_at(&[i as u8 + 1; 8192], i * (3 << 20)).unwrap();
    }
    pool.snapshot("disk", "snap").unwrap();
    pool.clone_volume("snap", "clone").unwrap();
    drop(disk);
    pool.close().unwrap();
    path
}

/// The slot open would pick, and its superblock.
fn current_superblock(image: &[u8]) -> (usize, Superblock) {
    let slots: Vec<Superblock> = (0..2)
        .map(|slot| {
            let at = slot * BLOCK as usize;
            Superblock::decode(&image[at..at + SUPERBLOCK_LEN]).unwrap()
        })
        .collect();
    if slots[0].generation > slots[1].generation {
        (0, slots[0].clone())
    } else {
        (1, slots[1].clone())
    }
}

/// The image with one u64 field of the current superblock set, resealed.
fn with_superblock_field(image: &[u8], offset: usize, value: u64) -> Vec<u8> {
    let (slot, _) = current_superblock(image);
    let mut image = image.to_vec();
    let start = slot * BLOCK as usize;
    let superblock = &mut image[start..start + SUPERBLOCK_LEN];
    superblock[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    reseal(superblock, sb::CRC);
    image
}

/// Writes `image` as the pool's store, opens it, and checks the refusal:
/// one line of kind Corrupt naming every word of `names`, and the store
/// byte for byte as it was.
fn assert_refused(path: &Path, image: &[u8], names: &[&str]) -> String {
    std::fs::write(path.join(STORE), image).unwrap();
    let error = match Pool::open(path) {
        Ok(_) => panic!("{names:?}: the crafted store opened"),
        Err(e) => e,
    };
    let message = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{message}");
    assert!(!message.contains('\n'), "not one line: {message}");
    for name in names {
        assert!(message.contains(name), "{name:?} not named: {message}");
    }
    let after = std::fs::read(path.join(STORE)).unwrap();
    assert!(after == image, "{names:?}: opening wrote to the store");
    message
}

#[test]
fn a_journal_sequence_near_2_64_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    for sequence in [u64::MAX, u64::MAX - 3, JOURNAL_SEQUENCE_MAX + 1] {
        let image = with_superblock_field(&pristine, sb::JOURNAL_SEQUENCE, sequence);
        assert_refused(
            &path,
            &image,
            &["journal_sequence", &sequence.to_string(), "superblock slot"],
        );
    }
}

/// Regression (issue 23): a sequence close to 2^64 used to be accepted, a
/// write then reported success and was gone at the next open. At the
/// largest sequence open accepts, a flushed write survives a power cut.
#[test]
fn at_the_largest_accepted_journal_sequence_flushed_writes_survive() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    let image = with_superblock_field(&pristine, sb::JOURNAL_SEQUENCE, JOURNAL_SEQUENCE_MAX);
    std::fs::write(path.join(STORE), &image).unwrap();
    let pool = Pool::open(&path).unwrap();
    let disk = pool.volume("disk").unwrap();
    disk.write_at(&[0x5a; 4096], 1 << 20).unwrap();
    disk.flush().unwrap();
    // The store as a power cut leaves it: the write only in the journal.
    let crashed = std::fs::read(path.join(STORE)).unwrap();
    drop(disk);
    drop(pool);
    let pool = Pool::open_device(Arc::new(MemDevice::from_bytes(crashed)), &path, None).unwrap();
    let mut buf = vec![0u8; 4096];
    pool.volume("disk")
        .unwrap()
        .read_at(&mut buf, 1 << 20)
        .unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a), "the flushed write is gone");
    assert!(pool.check(false).unwrap().is_clean());
}

#[test]
fn a_journal_head_past_the_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    let (_, superblock) = current_superblock(&pristine);
    let head = superblock.journal_blocks + 1;
    let image = with_superblock_field(&pristine, sb::JOURNAL_HEAD, head);
    assert_refused(&path, &image, &["journal_head", &head.to_string()]);
}

#[test]
fn a_capacity_below_what_is_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    let (_, superblock) = current_superblock(&pristine);
    assert_eq!(superblock.group_count, 1, "the test pool fits group 0");
    // Too small for the group's own blocks: the superblock alone says so.
    let image = with_superblock_field(&pristine, sb::CAPACITY, 1);
    assert_refused(&path, &image, &["capacity_blocks 1"]);
    // Room for the group's own blocks, but not for the blocks the map
    // says are in use: the map says so.
    let image = with_superblock_field(&pristine, sb::CAPACITY, 20);
    assert_refused(&path, &image, &["capacity_blocks 20", "in use"]);
}

#[test]
fn a_group_count_the_store_cannot_hold_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    let image = with_superblock_field(&pristine, sb::GROUP_COUNT, 0);
    assert_refused(&path, &image, &["group_count 0"]);
    // More groups than the store file holds.
    let image = with_superblock_field(&pristine, sb::GROUP_COUNT, 3);
    assert_refused(&path, &image, &["truncated"]);
}

#[test]
fn a_volume_table_root_outside_the_data_area_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    let (_, superblock) = current_superblock(&pristine);
    for root in [superblock.data_start.0 - 1, superblock.store_blocks()] {
        let image = with_superblock_field(&pristine, sb::VT_ROOT, root);
        assert_refused(&path, &image, &["volume_table_root", &root.to_string()]);
    }
    // Inside the data area, but one of group 0's own blocks.
    let root = superblock.data_start.0 + 1;
    let image = with_superblock_field(&pristine, sb::VT_ROOT, root);
    assert_refused(&path, &image, &["volume table root", &root.to_string()]);
}

#[test]
fn a_next_volume_id_not_above_every_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    // The clone has id 3.
    let image = with_superblock_field(&pristine, sb::NEXT_VOLUME_ID, 3);
    assert_refused(&path, &image, &["next_volume_id 3", "id 3"]);
}

#[test]
fn a_birth_generation_below_what_records_hold_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let pristine = std::fs::read(path.join(STORE)).unwrap();
    let image = with_superblock_field(&pristine, sb::BIRTH_GENERATION, 0);
    assert_refused(&path, &image, &["birth_generation 0"]);
}

/// The block holding the volume table's records (one is enough here).
fn record_block(image: &[u8]) -> u64 {
    let (_, superblock) = current_superblock(image);
    assert_eq!(superblock.volume_table_height, 1);
    let root = superblock.volume_table_root;
    let at = (root.0 * BLOCK) as usize;
    let table = Node::decode(
        &image[at..at + BLOCK as usize],
        root,
        NodeKind::VolumeTable,
        0,
        superblock.data_start.0..superblock.store_blocks(),
        superblock.birth_generation,
    )
    .unwrap();
    table.entries[0].addr().0
}

#[test]
fn a_record_whose_parent_is_not_older_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = build_pool(dir.path());
    let mut image = std::fs::read(path.join(STORE)).unwrap();
    let block = record_block(&image);
    // "disk" (id 1) made to name the clone (id 3) as its parent: each
    // field alone is possible, together they are a cycle.
    let at = (block * BLOCK) as usize + RECORD_BYTES;
    let mut disk = VolumeRecord::decode(&image[at..at + RECORD_BYTES], VolumeId(1))
        .unwrap()
        .unwrap();
    assert_eq!(disk.name, "disk");
    disk.parent = VolumeId(3);
    disk.encode(&mut image[at..at + RECORD_BYTES]);
    assert_refused(&path, &image, &["\"disk\"", "parent id 3"]);
}

/// An open pool's store as a power cut after `flushes` flushed writes
/// leaves it: everything since the last checkpoint only in the journal.
fn crashed_after_flushes(path: &Path, flushes: u64) -> Vec<u8> {
    let pool = Pool::create(path, &PoolOptions::default()).unwrap();
    pool.create_volume("v", 64 << 20).unwrap();
    let v = pool.volume("v").unwrap();
    for i in 0..flushes {
        v.write_at(&[i as u8 + 1; 8192], i << 20).unwrap();
        v.flush().unwrap();
    }
    let image = std::fs::read(path.join(STORE)).unwrap();
    drop(v);
    drop(pool);
    image
}

/// (byte offset, descriptor blocks, total blocks) of each transaction from
/// the journal's head, as replay would find them.
fn transactions(image: &[u8]) -> Vec<(usize, usize, usize)> {
    let (_, superblock) = current_superblock(image);
    let mut found = Vec::new();
    let mut position = superblock.journal_head;
    let mut sequence = superblock.journal_sequence;
    loop {
        let at = ((superblock.journal_start.0 + position) * BLOCK) as usize;
        let Some(blocks) = Descriptor::peek_blocks(
            &image[at..at + BLOCK as usize],
            sequence,
            &superblock.pool_uuid,
        ) else {
            return found;
        };
        let blocks = blocks as usize;
        let descriptor = Descriptor::decode(
            &image[at..at + blocks * BLOCK as usize],
            sequence,
            &superblock.pool_uuid,
            BLOCK as usize,
        )
        .unwrap();
        let len = blocks + descriptor.homes.len();
        found.push((at, blocks, len));
        position += len as u64;
        sequence += 1;
    }
}

#[test]
fn a_well_checksummed_impossible_transaction_is_refused_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pristine = crashed_after_flushes(&path, 2);
    let found = transactions(&pristine);
    assert!(found.len() >= 2, "{found:?}");
    let (at, blocks, _) = found[1];
    let descriptor_bytes = at..at + blocks * BLOCK as usize;

    // A reserved byte set, and the checksum made to match.
    let mut image = pristine.clone();
    image[at + DESCRIPTOR_RESERVED] = 1;
    reseal(&mut image[descriptor_bytes.clone()], DESCRIPTOR_CRC);
    assert_refused(
        &path,
        &image,
        &["journal transaction", "reserved bytes", "refuses"],
    );

    // A store that shrinks: fields each possible, but not after the
    // transaction before.
    let (_, superblock) = current_superblock(&pristine);
    let mut descriptor = Descriptor::decode(
        &pristine[descriptor_bytes.clone()],
        superblock.journal_sequence + 1,
        &superblock.pool_uuid,
        BLOCK as usize,
    )
    .unwrap();
    descriptor.roots.group_count = 0;
    let mut image = pristine.clone();
    image[descriptor_bytes].copy_from_slice(&descriptor.encode(BLOCK as usize));
    assert_refused(&path, &image, &["journal transaction", "group_count 0"]);
}

#[test]
fn a_damaged_transaction_before_an_intact_one_is_refused_but_a_torn_last_one_ends_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pristine = crashed_after_flushes(&path, 3);
    let found = transactions(&pristine);
    assert_eq!(found.len(), 4, "create and three writes: {found:?}");
    let (_, superblock) = current_superblock(&pristine);

    // Damage in the middle: the write of transaction 2 and the one after
    // it were acknowledged; replay must not stop at 2 and lose both.
    let (at, blocks, len) = found[2];
    assert!(len > blocks, "the transaction has images");
    let mut image = pristine.clone();
    image[at + blocks * BLOCK as usize + 100] ^= 0x40;
    let sequence = superblock.journal_sequence + 2;
    assert_refused(
        &path,
        &image,
        &[
            &format!("transaction {sequence} is damaged"),
            &format!("transaction {} after it is intact", sequence + 1),
        ],
    );

    // The same damage to the last transaction is a torn write, what a
    // crash leaves: the journal ends there and the pool opens, with the
    // writes flushed before it.
    let (at, blocks, _) = found[3];
    let mut image = pristine.clone();
    image[at + blocks * BLOCK as usize + 100] ^= 0x40;
    let pool = Pool::open_device(Arc::new(MemDevice::from_bytes(image)), &path, None).unwrap();
    let v = pool.volume("v").unwrap();
    for i in 0..3u64 {
        let mut buf = vec![0u8; 8192];
        v.read_at(&mut buf, i << 20).unwrap();
        let expected = if i < 2 { i as u8 + 1 } else { 0 };
        assert!(buf.iter().all(|&b| b == expected), "write {i}");
    }
    assert!(pool.check(false).unwrap().is_clean());
}
