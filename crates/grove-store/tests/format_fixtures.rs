//! Golden-byte tests of every on-disk encoding: the superblock, a radix
//! node, a volume record, an allocation-group map and a journal descriptor.
//!
//! Each test builds a fixed value, encodes it and compares the bytes with a
//! fixture committed under tests/fixtures/, so any change to the format,
//! deliberate or not, shows up as a failing test (a deliberate one also
//! needs a FORMAT_VERSION bump once pools of the old format may exist, and
//! then a new fixture name, e.g. superblock-v2.bin).
//! Then the fixture is decoded and must give the value back, and every
//! single-bit flip of the fixture must be rejected with the decoder's error,
//! never accepted and never a panic.
//!
//! To regenerate the fixtures after a deliberate format change, run
//!
//!     GROVE_BLESS_FIXTURES=1 cargo test -p grove-store --test format_fixtures
//!
//! and commit the changed files under tests/fixtures/ together with the
//! format change.

use std::path::PathBuf;

use grove_store::format::group::{self, NIBBLE_ALLOCATED, NIBBLE_META};
use grove_store::format::journal::{AllocChange, AllocExtent, Descriptor, Roots};
use grove_store::format::node::{Entry, Node, NodeKind};
use grove_store::format::record::{VolumeKind, VolumeRecord, RECORD_BYTES};
use grove_store::format::superblock::{
    choose_slot, SlotProblem, Superblock, SUPERBLOCK_LEN, SUPERBLOCK_MAGIC,
};
use grove_store::format::FORMAT_VERSION;
use grove_store::{BlockAddr, ErrorKind, VolumeId};

/// Node, group and journal fixtures use the smallest block size, to keep
/// the files (and the number of bit flips) small.
const SMALL_BLOCK_BYTES: usize = 1024;
const SUPERBLOCK_VERSION_OFFSET: usize = 8;
const SUPERBLOCK_CRC_OFFSET: usize = 12;
const SUPERBLOCK_BLOCK_SIZE_OFFSET: usize = 24;
const RECORD_CRC_OFFSET: usize = 4;
/// The data area the sample node's children must lie in.
const DATA_AREA: std::ops::Range<u64> = 1026..1_000_000;

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Compares `encoded` with the committed fixture (or rewrites the fixture
/// when blessing) and returns the fixture's bytes.
fn golden(name: &str, encoded: &[u8]) -> Vec<u8> {
    let path = fixture_path(name);
    if std::env::var_os("GROVE_BLESS_FIXTURES").is_some() {
        // Tests run in parallel and several read the same fixture: write
        // it whole under another name, then rename it into place.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let temp = path.with_extension(format!("tmp{:?}", std::thread::current().id()));
        std::fs::write(&temp, encoded).unwrap();
        std::fs::rename(&temp, &path).unwrap();
    }
    let fixture = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    assert_eq!(fixture.len(), encoded.len(), "{name}: length");
    if let Some(at) = fixture.iter().zip(encoded).position(|(a, b)| a != b) {
        panic!(
            "{name}: the encoder's output differs from the committed fixture at byte {at} \
             ({:#04x} in the fixture, {:#04x} now); the on-disk format changed",
            fixture[at], encoded[at]
        );
    }
    fixture
}

/// Every single-bit flip of `bytes`, in order.
fn each_bit_flip(bytes: &[u8], mut check: impl FnMut(usize, u8, &[u8])) {
    let mut damaged = bytes.to_vec();
    for byte in 0..bytes.len() {
        for bit in 0..8u8 {
            damaged[byte] ^= 1 << bit;
            check(byte, bit, &damaged);
            damaged[byte] ^= 1 << bit;
        }
    }
}

/// CRC-32C with a 4-byte hole, as the format computes it, for building
/// blocks that are well checksummed but wrong in a field.
fn crc_with_hole(bytes: &[u8], crc_offset: usize) -> u32 {
    let mut copy = bytes.to_vec();
    copy[crc_offset..crc_offset + 4].fill(0);
    crc32c::crc32c(&copy)
}

fn reseal(bytes: &mut [u8], crc_offset: usize) {
    let crc = crc_with_hole(bytes, crc_offset);
    bytes[crc_offset..crc_offset + 4].copy_from_slice(&crc.to_le_bytes());
}

// ---------------------------------------------------------------- superblock

fn sample_superblock() -> Superblock {
    let journal_blocks = 4096;
    Superblock {
        generation: 7,
        block_size_bytes: 4096,
        journal_start: BlockAddr(2),
        journal_blocks,
        data_start: BlockAddr(2 + journal_blocks),
        group_blocks: group::group_blocks(4096),
        group_count: 3,
        capacity_blocks: 100_000,
        volume_table_root: BlockAddr(4099),
        volume_table_height: 1,
        next_volume_id: VolumeId(5),
        journal_sequence: 42,
        journal_head: 17,
        created_unix_secs: 1_700_000_000,
        pool_uuid: *b"grove-fixture-01",
    }
}

fn superblock_fixture() -> Vec<u8> {
    golden("superblock-v1.bin", &sample_superblock().encode())
}

#[test]
fn superblock_matches_its_fixture_and_decodes_back() {
    let superblock = sample_superblock();
    let fixture = superblock_fixture();
    assert_eq!(fixture.len(), SUPERBLOCK_LEN);
    assert_eq!(Superblock::decode(&fixture), Ok(superblock.clone()));
    // A slot is read as a whole block; what follows the 512 bytes is not
    // part of the checksummed slot.
    let mut block = fixture.clone();
    block.resize(4096, 0);
    assert_eq!(Superblock::decode(&block), Ok(superblock));
}

#[test]
fn every_bit_flip_of_the_superblock_is_rejected() {
    let fixture = superblock_fixture();
    let magic_len = SUPERBLOCK_MAGIC.len();
    let mut newer = 0;
    each_bit_flip(&fixture, |byte, bit, damaged| {
        let result = Superblock::decode(damaged);
        let context = format!("bit {bit} of byte {byte}");
        match byte {
            _ if byte < magic_len => assert_eq!(result, Err(SlotProblem::NoMagic), "{context}"),
            SUPERBLOCK_VERSION_OFFSET..=11 => {
                let version =
                    FORMAT_VERSION ^ (1 << ((byte - SUPERBLOCK_VERSION_OFFSET) * 8 + bit as usize));
                if version > FORMAT_VERSION {
                    newer += 1;
                    assert_eq!(result, Err(SlotProblem::NewerVersion(version)), "{context}");
                } else {
                    assert!(
                        matches!(result, Err(SlotProblem::Damaged(_))),
                        "{context}: {result:?}"
                    );
                }
            }
            _ => assert!(
                matches!(result, Err(SlotProblem::Damaged(_))),
                "{context}: {result:?}"
            ),
        }
    });
    assert_eq!(
        newer, 31,
        "every version bit but the lowest makes a newer version"
    );
}

#[test]
fn a_superblock_from_a_newer_grove_is_reported_as_such() {
    let mut bytes = superblock_fixture();
    let newer = FORMAT_VERSION + 1;
    bytes[SUPERBLOCK_VERSION_OFFSET..SUPERBLOCK_VERSION_OFFSET + 4]
        .copy_from_slice(&newer.to_le_bytes());
    // Checked before the checksum: a newer format may checksum differently.
    assert_eq!(
        Superblock::decode(&bytes),
        Err(SlotProblem::NewerVersion(newer))
    );
    reseal(&mut bytes, SUPERBLOCK_CRC_OFFSET);
    assert_eq!(
        Superblock::decode(&bytes),
        Err(SlotProblem::NewerVersion(newer))
    );
    // Both slots newer: the pool is refused with "upgrade grove".
    let slot = || Superblock::decode(&bytes);
    let err = choose_slot([slot(), slot()], "test store").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    assert!(err.message().contains("upgrade"), "{}", err.message());
    // One newer slot and one empty one: still a newer pool, not "no pool".
    let err = choose_slot([slot(), Err(SlotProblem::NoMagic)], "test store").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
}

#[test]
fn a_superblock_without_magic_is_not_a_store() {
    assert_eq!(
        Superblock::decode(&[0u8; SUPERBLOCK_LEN]),
        Err(SlotProblem::NoMagic)
    );
    let text = b"this is some other file format, not a grove store at all..";
    let mut bytes = [b' '; SUPERBLOCK_LEN];
    bytes[..text.len()].copy_from_slice(text);
    assert_eq!(Superblock::decode(&bytes), Err(SlotProblem::NoMagic));
    let err = choose_slot([Err(SlotProblem::NoMagic), Err(SlotProblem::NoMagic)], "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAPool);
}

#[test]
fn a_well_checksummed_superblock_with_an_impossible_field_is_damaged() {
    let fixture = superblock_fixture();
    let mut bytes = fixture.clone();
    bytes[SUPERBLOCK_BLOCK_SIZE_OFFSET..SUPERBLOCK_BLOCK_SIZE_OFFSET + 4]
        .copy_from_slice(&3000u32.to_le_bytes());
    reseal(&mut bytes, SUPERBLOCK_CRC_OFFSET);
    assert!(matches!(
        Superblock::decode(&bytes),
        Err(SlotProblem::Damaged(_))
    ));
    // Version 0 never existed.
    let mut bytes = fixture.clone();
    bytes[SUPERBLOCK_VERSION_OFFSET..SUPERBLOCK_VERSION_OFFSET + 4].fill(0);
    reseal(&mut bytes, SUPERBLOCK_CRC_OFFSET);
    assert!(matches!(
        Superblock::decode(&bytes),
        Err(SlotProblem::Damaged(_))
    ));
    // Reserved bytes at the end of the slot must be zero.
    let mut bytes = fixture;
    bytes[SUPERBLOCK_LEN - 1] = 1;
    reseal(&mut bytes, SUPERBLOCK_CRC_OFFSET);
    assert!(matches!(
        Superblock::decode(&bytes),
        Err(SlotProblem::Damaged(_))
    ));
}

#[test]
fn open_picks_the_newer_valid_slot_and_reports_two_damaged_ones() {
    let older = sample_superblock();
    let newer = Superblock {
        generation: older.generation + 1,
        ..older.clone()
    };
    let damaged = || Err(SlotProblem::Damaged("test".into()));
    assert_eq!(
        choose_slot([Ok(older.clone()), Ok(newer.clone())], "x").unwrap(),
        newer
    );
    assert_eq!(
        choose_slot([Ok(newer.clone()), Ok(older.clone())], "x").unwrap(),
        newer
    );
    assert_eq!(
        choose_slot([damaged(), Ok(older.clone())], "x").unwrap(),
        older
    );
    // A valid slot wins over a newer-version one: that slot is damage.
    assert_eq!(
        choose_slot([Err(SlotProblem::NewerVersion(9)), Ok(older.clone())], "x").unwrap(),
        older
    );
    let err = choose_slot([damaged(), damaged()], "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let err = choose_slot([damaged(), Err(SlotProblem::NoMagic)], "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
}

// ---------------------------------------------------------------------- node

fn sample_node() -> Node {
    let mut node = Node::empty(NodeKind::VolumeData, 1, SMALL_BLOCK_BYTES / 8);
    // Entries in the striped-header range and past it, shared and not, up to
    // the largest address an entry can hold.
    node.entries[0] = Entry::new(BlockAddr(1026), false);
    node.entries[1] = Entry::new(BlockAddr(2048), true);
    node.entries[5] = Entry::new(BlockAddr(999_999), false);
    node.entries[7] = Entry::new(BlockAddr(123_456), true);
    node.entries[8] = Entry::new(BlockAddr(4242), false);
    node.entries[127] = Entry::new(BlockAddr(77_777), true);
    node
}

fn node_fixture() -> Vec<u8> {
    let mut block = vec![0u8; SMALL_BLOCK_BYTES];
    sample_node().encode(&mut block);
    golden("node-v1.bin", &block)
}

#[test]
fn node_matches_its_fixture_and_decodes_back() {
    let node = sample_node();
    let fixture = node_fixture();
    let decoded = Node::decode(
        &fixture,
        BlockAddr(5000),
        NodeKind::VolumeData,
        1,
        DATA_AREA,
    )
    .expect("the fixture decodes");
    assert_eq!(decoded, node);
    assert!(decoded.entries[1].is_shared() && !decoded.entries[0].is_shared());
    assert_eq!(decoded.entries[5].addr(), BlockAddr(999_999));
}

#[test]
fn every_bit_flip_of_a_node_is_rejected() {
    let fixture = node_fixture();
    each_bit_flip(&fixture, |byte, bit, damaged| {
        match Node::decode(damaged, BlockAddr(5000), NodeKind::VolumeData, 1, DATA_AREA) {
            Err(e) => assert_eq!(
                e.kind(),
                ErrorKind::Corrupt,
                "bit {bit} of byte {byte}: {e}"
            ),
            Ok(_) => panic!("bit {bit} of byte {byte}: a damaged node was accepted"),
        }
    });
}

#[test]
fn a_node_in_the_wrong_place_is_rejected() {
    let fixture = node_fixture();
    let corrupt =
        |result: grove_store::Result<Node>| result.unwrap_err().kind() == ErrorKind::Corrupt;
    // A node of another tree, or of another level, is damage even with a
    // good checksum: a pointer that leads there is wrong.
    assert!(corrupt(Node::decode(
        &fixture,
        BlockAddr(5000),
        NodeKind::VolumeTable,
        1,
        DATA_AREA
    )));
    assert!(corrupt(Node::decode(
        &fixture,
        BlockAddr(5000),
        NodeKind::VolumeData,
        0,
        DATA_AREA
    )));
    // A child outside the data area.
    assert!(corrupt(Node::decode(
        &fixture,
        BlockAddr(5000),
        NodeKind::VolumeData,
        1,
        1026..999_999
    )));
    assert!(corrupt(Node::decode(
        &fixture,
        BlockAddr(5000),
        NodeKind::VolumeData,
        1,
        1027..1_000_000
    )));
    // An all-zero block (never written) is not a node.
    let zeros = vec![0u8; SMALL_BLOCK_BYTES];
    assert!(corrupt(Node::decode(
        &zeros,
        BlockAddr(5000),
        NodeKind::VolumeData,
        1,
        DATA_AREA
    )));
}

// -------------------------------------------------------------------- record

fn sample_record() -> VolumeRecord {
    VolumeRecord {
        id: VolumeId(42),
        parent: VolumeId(7),
        size_bytes: (10 << 30) + 512,
        root: BlockAddr(123_456),
        height: 3,
        kind: VolumeKind::Clone,
        name: "disk@2024-01-01+clone:x_y.z".to_string(),
        created_unix_secs: 1_700_000_123,
        referenced_blocks: 5000,
        exclusive_blocks: 1234,
    }
}

fn record_fixture() -> Vec<u8> {
    let mut bytes = [0u8; RECORD_BYTES];
    sample_record().encode(&mut bytes);
    golden("record-v1.bin", &bytes)
}

#[test]
fn record_matches_its_fixture_and_decodes_back() {
    let record = sample_record();
    let fixture = record_fixture();
    assert_eq!(
        VolumeRecord::decode(&fixture, VolumeId(42)).unwrap(),
        Some(record)
    );
    // An all-zero slot is an empty slot, not damage.
    assert_eq!(
        VolumeRecord::decode(&[0u8; RECORD_BYTES], VolumeId(3)).unwrap(),
        None
    );
}

#[test]
fn every_bit_flip_of_a_record_is_rejected() {
    let fixture = record_fixture();
    each_bit_flip(&fixture, |byte, bit, damaged| {
        match VolumeRecord::decode(damaged, VolumeId(42)) {
            Err(e) => assert_eq!(
                e.kind(),
                ErrorKind::Corrupt,
                "bit {bit} of byte {byte}: {e}"
            ),
            Ok(r) => panic!("bit {bit} of byte {byte}: a damaged record was accepted: {r:?}"),
        }
    });
}

#[test]
fn a_well_checksummed_record_with_an_impossible_field_is_rejected() {
    let fixture = record_fixture();
    // In the slot of another id.
    assert_eq!(
        VolumeRecord::decode(&fixture, VolumeId(43))
            .unwrap_err()
            .kind(),
        ErrorKind::Corrupt
    );
    let patched = |offset: usize, value: &[u8]| {
        let mut bytes = fixture.clone();
        bytes[offset..offset + value.len()].copy_from_slice(value);
        reseal(&mut bytes, RECORD_CRC_OFFSET);
        VolumeRecord::decode(&bytes, VolumeId(42))
    };
    // Offsets from the layout in format/record.rs.
    let size_offset = 24;
    let root_offset = 32;
    let height_offset = 40;
    let kind_offset = 41;
    let name_len_offset = 42;
    let exclusive_offset = 64;
    let name_offset = 96;
    let cases: [(&str, grove_store::Result<Option<VolumeRecord>>); 8] = [
        (
            "size not in sectors",
            patched(size_offset, &1000u64.to_le_bytes()),
        ),
        ("no root", patched(root_offset, &0u64.to_le_bytes())),
        ("height 0", patched(height_offset, &[0])),
        ("height too large", patched(height_offset, &[200])),
        ("unknown kind", patched(kind_offset, &[9])),
        ("empty name", patched(name_len_offset, &[0])),
        (
            "exclusive > referenced",
            patched(exclusive_offset, &6000u64.to_le_bytes()),
        ),
        ("name not UTF-8", patched(name_offset, &[0xff])),
    ];
    for (what, result) in cases {
        match result {
            Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}"),
            Ok(r) => panic!("{what}: accepted as {r:?}"),
        }
    }
}

// --------------------------------------------------------------------- group

fn sample_nibbles() -> Vec<u8> {
    let count = group::group_blocks(SMALL_BLOCK_BYTES as u32) as usize;
    (0..count)
        .map(|i| match i {
            0 => NIBBLE_ALLOCATED | NIBBLE_META,
            _ if i % 7 == 0 => NIBBLE_ALLOCATED | NIBBLE_META,
            _ if i % 5 == 0 => NIBBLE_ALLOCATED,
            // Marks and pending frees never reach the disk: only free,
            // data and metadata blocks appear in a map.
            _ if i == count - 1 => NIBBLE_ALLOCATED | NIBBLE_META,
            _ => 0,
        })
        .collect()
}

fn group_fixture() -> Vec<u8> {
    let mut block = vec![0u8; SMALL_BLOCK_BYTES];
    group::encode(3, &sample_nibbles(), &mut block);
    golden("group-v1.bin", &block)
}

#[test]
fn group_map_matches_its_fixture_and_decodes_back() {
    let nibbles = sample_nibbles();
    let fixture = group_fixture();
    assert_eq!(group::decode(3, &fixture).unwrap(), nibbles);
}

#[test]
fn every_bit_flip_of_a_group_map_is_rejected() {
    let fixture = group_fixture();
    each_bit_flip(&fixture, |byte, bit, damaged| {
        match group::decode(3, damaged) {
            Err(e) => assert_eq!(
                e.kind(),
                ErrorKind::Corrupt,
                "bit {bit} of byte {byte}: {e}"
            ),
            Ok(_) => panic!("bit {bit} of byte {byte}: a damaged group map was accepted"),
        }
    });
    // The map of another group, well checksummed, is damage too.
    assert_eq!(
        group::decode(4, &fixture).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
}

// ------------------------------------------------------------------- journal

fn sample_descriptor() -> Descriptor {
    Descriptor {
        sequence: 1234,
        pool_uuid: *b"grove-fixture-01",
        descriptor_blocks: 1,
        images_crc: 0xdead_beef,
        roots: Roots {
            volume_table_root: BlockAddr(4099),
            volume_table_height: 2,
            next_volume_id: VolumeId(17),
            group_count: 3,
        },
        homes: vec![BlockAddr(4099), BlockAddr(5000), BlockAddr(77_777)],
        extents: vec![
            AllocExtent {
                first: BlockAddr(6000),
                count: 12,
                change: AllocChange::AllocatedData,
            },
            AllocExtent {
                first: BlockAddr(5000),
                count: 1,
                change: AllocChange::AllocatedMeta,
            },
            AllocExtent {
                first: BlockAddr(9000),
                count: 3,
                change: AllocChange::Freed,
            },
        ],
    }
}

fn journal_fixture() -> Vec<u8> {
    golden(
        "journal-v1.bin",
        &sample_descriptor().encode(SMALL_BLOCK_BYTES),
    )
}

#[test]
fn journal_descriptor_matches_its_fixture_and_decodes_back() {
    let descriptor = sample_descriptor();
    let fixture = journal_fixture();
    let uuid = descriptor.pool_uuid;
    assert_eq!(
        Descriptor::decode(&fixture, 1234, &uuid, SMALL_BLOCK_BYTES),
        Some(descriptor)
    );
    // Another sequence or another pool's transaction is the end of the
    // journal, not a transaction to replay.
    assert_eq!(
        Descriptor::decode(&fixture, 1235, &uuid, SMALL_BLOCK_BYTES),
        None
    );
    assert_eq!(
        Descriptor::decode(&fixture, 1234, b"another-pool-id!", SMALL_BLOCK_BYTES),
        None
    );
}

#[test]
fn every_bit_flip_of_a_journal_descriptor_ends_replay() {
    let fixture = journal_fixture();
    let uuid = sample_descriptor().pool_uuid;
    each_bit_flip(&fixture, |byte, bit, damaged| {
        let decoded = Descriptor::decode(damaged, 1234, &uuid, SMALL_BLOCK_BYTES);
        assert_eq!(decoded, None, "bit {bit} of byte {byte}");
    });
}
