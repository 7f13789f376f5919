//! Golden-byte tests of every on-disk encoding (format version 2): the
//! superblock, a radix node, a volume record, an allocation-group map, a
//! share-count block and a journal descriptor.
//!
//! Each test builds a fixed value, encodes it and compares the bytes with a
//! fixture committed under tests/fixtures/, so any change to the format,
//! deliberate or not, shows up as a failing test (a deliberate one also
//! needs a FORMAT_VERSION bump once pools of the old format may exist, and
//! then new fixture names, e.g. superblock-v3.bin).
//! Then the fixture is decoded and must give the value back, the decoded
//! value must encode to the same bytes, and every single-bit flip of the
//! fixture must be rejected with the decoder's error, never accepted and
//! never a panic. Further tests patch one field of a fixture, fix up its
//! checksum, and check that an impossible value is refused even so.
//!
//! One fixture of an older format is kept on purpose: superblock-v1.bin, a
//! slot written by format version 1, which this grove must refuse as an
//! older version (not as damage, and not by misreading it). It is never
//! regenerated.
//!
//! To regenerate the fixtures after a deliberate format change, run
//!
//!     GROVE_BLESS_FIXTURES=1 cargo test -p grove-store --test format_fixtures
//!
//! and commit the changed files under tests/fixtures/ together with the
//! format change.

use std::path::PathBuf;

use grove_store::format::group::{
    self, GROUP_HEADER_BLOCKS, GROUP_HEADER_BYTES, NIBBLE_ALLOCATED, NIBBLE_META,
    NIBBLE_PENDING_FREE,
};
use grove_store::format::journal::{AllocChange, AllocExtent, Descriptor, Roots, ShareRun};
use grove_store::format::node::{
    Entry, Node, NodeKind, BIRTH_GENERATION_MAX, ENTRY_ADDR_MASK, NODE_LEVELS_MAX,
};
use grove_store::format::record::{VolumeKind, VolumeRecord, RECORD_BYTES};
use grove_store::format::shares::{self, SHARE_BLOCKS_PER_GROUP};
use grove_store::format::superblock::{
    choose_slot, SlotProblem, Superblock, JOURNAL_BLOCKS_MAX, JOURNAL_SEQUENCE_MAX,
    NEXT_VOLUME_ID_MAX, SUPERBLOCK_LEN, SUPERBLOCK_MAGIC,
};
use grove_store::format::FORMAT_VERSION;
use grove_store::pool::JOURNAL_REGION_BLOCKS_MIN;
use grove_store::{BlockAddr, ErrorKind, VolumeId};

/// Node, group, share-count and journal fixtures use the smallest block
/// size, to keep the files (and the number of bit flips) small.
/// Named byte patches of an encoding: (what, [(offset, new bytes)]).
type Patches = Vec<(&'static str, Vec<(usize, Vec<u8>)>)>;

const SMALL_BLOCK_BYTES: usize = 1024;

/// Every fixture this file uses; the fixture directory holds exactly these.
const FIXTURES: [&str; 7] = [
    "superblock-v1.bin",
    "superblock-v2.bin",
    "node-v2.bin",
    "record-v2.bin",
    "group-v2.bin",
    "shares-v2.bin",
    "journal-v2.bin",
];

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Compares `encoded` with the committed fixture (or rewrites the fixture
/// when blessing) and returns the fixture's bytes.
fn golden(name: &str, encoded: &[u8]) -> Vec<u8> {
    assert!(FIXTURES.contains(&name), "{name} is missing from FIXTURES");
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

/// Every single-bit flip of `fixture` makes `decode` refuse it as corrupt
/// (`what` names the block in the message).
#[track_caller]
fn assert_every_bit_flip_is_corrupt<T: std::fmt::Debug>(
    fixture: &[u8],
    what: &str,
    decode: impl Fn(&[u8]) -> grove_store::Result<T>,
) {
    each_bit_flip(fixture, |byte, bit, damaged| match decode(damaged) {
        Err(e) => assert_eq!(
            e.kind(),
            ErrorKind::Corrupt,
            "bit {bit} of byte {byte}: {e}"
        ),
        Ok(decoded) => {
            panic!("bit {bit} of byte {byte}: a damaged {what} was accepted: {decoded:?}")
        }
    });
}

/// Whether a decode failed as corrupt.
fn is_corrupt<T>(result: grove_store::Result<T>) -> bool {
    result.is_err_and(|e| e.kind() == ErrorKind::Corrupt)
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

fn get_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

fn get_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}

/// One patch: `bytes` written at `offset`.
fn p(offset: usize, bytes: &[u8]) -> (usize, Vec<u8>) {
    (offset, bytes.to_vec())
}

/// A copy of `fixture` with the given (offset, bytes) patches applied and
/// the checksum at `crc_offset` recomputed.
fn patched(fixture: &[u8], crc_offset: usize, patches: &[(usize, Vec<u8>)]) -> Vec<u8> {
    let mut bytes = fixture.to_vec();
    for (offset, value) in patches {
        bytes[*offset..*offset + value.len()].copy_from_slice(value);
    }
    reseal(&mut bytes, crc_offset);
    bytes
}

#[test]
fn the_fixture_directory_holds_exactly_the_fixtures_in_use() {
    let dir = fixture_path("");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        // Blessing writes through temporary files in parallel tests.
        .filter(|name| !name.contains(".tmp"))
        .collect();
    found.sort();
    let mut expected: Vec<String> = FIXTURES.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(
        found,
        expected,
        "stale or missing fixtures in {}",
        dir.display()
    );
}

#[test]
fn format_constants_fit_together() {
    assert_eq!(FORMAT_VERSION, 2);
    assert_eq!(GROUP_HEADER_BLOCKS, 1 + SHARE_BLOCKS_PER_GROUP);
    assert_eq!(BIRTH_GENERATION_MAX, (1 << 26) - 1);
    assert_eq!(ENTRY_ADDR_MASK, (1 << 37) - 1);
    // Every block of a group has a count slot in the group's count blocks,
    // and the group map's one-byte bitmap names every count block.
    const { assert!(SHARE_BLOCKS_PER_GROUP <= 8) };
    let mut block_size = 1024u32;
    while block_size <= 64 * 1024 {
        assert!(
            SHARE_BLOCKS_PER_GROUP * shares::counts_per_block(block_size)
                >= group::group_blocks(block_size),
            "block size {block_size}"
        );
        block_size *= 2;
    }
}

// ---------------------------------------------------------------- superblock

mod sb {
    pub const VERSION: usize = 8;
    pub const CRC: usize = 12;
    pub const GENERATION: usize = 16;
    pub const BLOCK_SIZE: usize = 24;
    pub const JOURNAL_START: usize = 32;
    pub const JOURNAL_BLOCKS: usize = 40;
    pub const DATA_START: usize = 48;
    pub const GROUP_BLOCKS: usize = 56;
    pub const GROUP_COUNT: usize = 64;
    pub const CAPACITY: usize = 72;
    pub const VT_ROOT: usize = 80;
    pub const VT_HEIGHT: usize = 88;
    pub const NEXT_VOLUME_ID: usize = 96;
    pub const JOURNAL_SEQUENCE: usize = 104;
    pub const JOURNAL_HEAD: usize = 112;
    pub const CREATED: usize = 120;
    pub const UUID: usize = 128;
    pub const BIRTH_GENERATION: usize = 144;
    pub const RESERVED: usize = 152;
}

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
        birth_generation: 0x2a_5a5a,
    }
}

fn superblock_fixture() -> Vec<u8> {
    golden("superblock-v2.bin", &sample_superblock().encode())
}

/// A slot written by format version 1 (never regenerated).
fn superblock_v1_fixture() -> Vec<u8> {
    std::fs::read(fixture_path("superblock-v1.bin")).unwrap()
}

#[test]
fn superblock_matches_its_fixture_and_decodes_back() {
    let superblock = sample_superblock();
    let fixture = superblock_fixture();
    assert_eq!(fixture.len(), SUPERBLOCK_LEN);
    // The fields sit where the layout in format/superblock.rs says (the
    // patching tests below rely on these offsets).
    assert_eq!(fixture[..8], SUPERBLOCK_MAGIC);
    assert_eq!(get_u32(&fixture, sb::VERSION), 2);
    assert_eq!(get_u64(&fixture, sb::GENERATION), 7);
    assert_eq!(get_u32(&fixture, sb::BLOCK_SIZE), 4096);
    assert_eq!(get_u64(&fixture, sb::JOURNAL_START), 2);
    assert_eq!(get_u64(&fixture, sb::JOURNAL_BLOCKS), 4096);
    assert_eq!(get_u64(&fixture, sb::DATA_START), 4098);
    assert_eq!(
        get_u64(&fixture, sb::GROUP_BLOCKS),
        group::group_blocks(4096)
    );
    assert_eq!(get_u64(&fixture, sb::GROUP_COUNT), 3);
    assert_eq!(get_u64(&fixture, sb::CAPACITY), 100_000);
    assert_eq!(get_u64(&fixture, sb::VT_ROOT), 4099);
    assert_eq!(fixture[sb::VT_HEIGHT], 1);
    assert_eq!(get_u64(&fixture, sb::NEXT_VOLUME_ID), 5);
    assert_eq!(get_u64(&fixture, sb::JOURNAL_SEQUENCE), 42);
    assert_eq!(get_u64(&fixture, sb::JOURNAL_HEAD), 17);
    assert_eq!(get_u64(&fixture, sb::CREATED), 1_700_000_000);
    assert_eq!(&fixture[sb::UUID..sb::UUID + 16], b"grove-fixture-01");
    assert_eq!(get_u64(&fixture, sb::BIRTH_GENERATION), 0x2a_5a5a);
    assert!(fixture[sb::RESERVED..].iter().all(|&b| b == 0));

    let decoded = Superblock::decode(&fixture).expect("the fixture decodes");
    assert_eq!(decoded, superblock);
    assert_eq!(decoded.encode()[..], fixture[..], "re-encoding");
    // A slot is read as a whole block; what follows the 512 bytes is not
    // part of the checksummed slot.
    let mut block = fixture.clone();
    block.resize(4096, 0xa5);
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
            sb::VERSION..=11 => {
                let version = FORMAT_VERSION ^ (1 << ((byte - sb::VERSION) * 8 + bit as usize));
                if version > FORMAT_VERSION {
                    newer += 1;
                    assert_eq!(result, Err(SlotProblem::NewerVersion(version)), "{context}");
                } else {
                    // Version 2 with bit 1 flipped is 0, which never existed.
                    assert_eq!(version, 0, "{context}");
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
        "every version bit but bit 1 (which gives 0) makes a newer version"
    );
}

#[test]
fn a_version_1_superblock_is_refused_as_an_older_format() {
    let v1 = superblock_v1_fixture();
    assert_eq!(v1.len(), SUPERBLOCK_LEN);
    assert_eq!(v1[..8], SUPERBLOCK_MAGIC);
    assert_eq!(get_u32(&v1, sb::VERSION), 1);
    assert_eq!(Superblock::decode(&v1), Err(SlotProblem::OlderVersion(1)));
    // Refused by its version alone, before the checksum and the fields
    // (version 1 checksums a different layout).
    let mut block = v1.clone();
    block.resize(4096, 0);
    assert_eq!(
        Superblock::decode(&block),
        Err(SlotProblem::OlderVersion(1))
    );
    let mut damaged = v1.clone();
    damaged[sb::GENERATION] ^= 1;
    assert_eq!(
        Superblock::decode(&damaged),
        Err(SlotProblem::OlderVersion(1))
    );
    // A version-2 slot relabelled as version 1 is an older version too,
    // whether or not its checksum was fixed up.
    let mut relabelled = superblock_fixture();
    relabelled[sb::VERSION..sb::VERSION + 4].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        Superblock::decode(&relabelled),
        Err(SlotProblem::OlderVersion(1))
    );
    reseal(&mut relabelled, sb::CRC);
    assert_eq!(
        Superblock::decode(&relabelled),
        Err(SlotProblem::OlderVersion(1))
    );

    // Both slots of version 1: the pool is refused as an older format,
    // with a message that says what to do (not "upgrade grove").
    let slot = || Superblock::decode(&v1);
    let err = choose_slot([slot(), slot()], "test store").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    assert!(err.message().contains("version 1"), "{}", err.message());
    assert!(!err.message().contains("upgrade"), "{}", err.message());
    // One version-1 slot and one empty or damaged one: still an old pool.
    let err = choose_slot([slot(), Err(SlotProblem::NoMagic)], "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    let damaged = Err(SlotProblem::Damaged("test".into()));
    let err = choose_slot([damaged, slot()], "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    // A valid version-2 slot wins over a version-1 one.
    let current = sample_superblock();
    assert_eq!(
        choose_slot([slot(), Ok(current.clone())], "x").unwrap(),
        current
    );
    // An older and a newer slot: the newer one names the way out.
    let err = choose_slot([slot(), Err(SlotProblem::NewerVersion(3))], "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    assert!(err.message().contains("upgrade"), "{}", err.message());
}

#[test]
fn a_superblock_from_a_newer_grove_is_reported_as_such() {
    let mut bytes = superblock_fixture();
    let newer = FORMAT_VERSION + 1;
    bytes[sb::VERSION..sb::VERSION + 4].copy_from_slice(&newer.to_le_bytes());
    // Checked before the checksum: a newer format may checksum differently.
    assert_eq!(
        Superblock::decode(&bytes),
        Err(SlotProblem::NewerVersion(newer))
    );
    reseal(&mut bytes, sb::CRC);
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
fn a_well_checksummed_superblock_with_an_impossible_field_is_refused() {
    let fixture = superblock_fixture();
    let s = sample_superblock();
    let decode =
        |patches: &[(usize, Vec<u8>)]| Superblock::decode(&patched(&fixture, sb::CRC, patches));
    let u64le = |v: u64| v.to_le_bytes();
    let u32le = |v: u32| v.to_le_bytes();
    // The largest group count whose blocks all fit an entry's address.
    let groups_max = (ENTRY_ADDR_MASK - s.data_start.0) / s.group_blocks;
    let groups_in_capacity = s.capacity_blocks.div_ceil(s.group_blocks);
    let journal = |blocks: u64| (u64le(blocks), u64le(2 + blocks));

    // Limits that hold: the same patching, with values just inside.
    let (j_min, d_min) = journal(JOURNAL_REGION_BLOCKS_MIN);
    let (j_max, d_max) = journal(JOURNAL_BLOCKS_MAX);
    let fine: Patches = vec![
        ("unchanged", vec![]),
        (
            "smallest journal",
            vec![p(sb::JOURNAL_BLOCKS, &j_min), p(sb::DATA_START, &d_min)],
        ),
        (
            "largest journal",
            vec![
                p(sb::JOURNAL_BLOCKS, &j_max),
                p(sb::DATA_START, &d_max),
                // The volume table's root moves with the data area.
                p(sb::VT_ROOT, &u64le(2 + JOURNAL_BLOCKS_MAX + 100)),
            ],
        ),
        (
            "largest next volume id",
            vec![p(sb::NEXT_VOLUME_ID, &u64le(NEXT_VOLUME_ID_MAX))],
        ),
        (
            "last journal sequence with headroom",
            vec![p(sb::JOURNAL_SEQUENCE, &u64le(JOURNAL_SEQUENCE_MAX))],
        ),
        (
            "smallest capacity for its groups",
            vec![p(
                sb::CAPACITY,
                &u64le((s.group_count - 1) * s.group_blocks + GROUP_HEADER_BLOCKS + 1),
            )],
        ),
        (
            "volume table root at the last block",
            vec![p(sb::VT_ROOT, &u64le(s.store_blocks() - 1))],
        ),
        (
            "journal head at the last block",
            vec![p(sb::JOURNAL_HEAD, &u64le(s.journal_blocks - 1))],
        ),
        (
            "most groups the capacity allows",
            vec![p(sb::GROUP_COUNT, &u64le(groups_in_capacity))],
        ),
        (
            "most groups an address allows, no capacity",
            vec![
                p(sb::GROUP_COUNT, &u64le(groups_max)),
                p(sb::CAPACITY, &u64le(0)),
            ],
        ),
        (
            "largest capacity",
            vec![p(sb::CAPACITY, &u64le(ENTRY_ADDR_MASK))],
        ),
        (
            "tallest volume table",
            vec![p(sb::VT_HEIGHT, &[NODE_LEVELS_MAX - 1])],
        ),
        (
            "empty volume table",
            vec![p(sb::VT_ROOT, &u64le(0)), p(sb::VT_HEIGHT, &[0])],
        ),
        (
            "last birth generation",
            vec![p(sb::BIRTH_GENERATION, &u64le(BIRTH_GENERATION_MAX))],
        ),
    ];
    for (what, patches) in fine {
        assert!(decode(&patches).is_ok(), "{what}: {:?}", decode(&patches));
    }

    let (j_small, d_small) = journal(JOURNAL_REGION_BLOCKS_MIN - 1);
    let (j_large, d_large) = journal(JOURNAL_BLOCKS_MAX + 1);
    let (j_zero, d_zero) = journal(0);
    let damaged: Patches = vec![
        ("block size 3000", vec![p(sb::BLOCK_SIZE, &u32le(3000))]),
        (
            "block size 128 KiB",
            vec![p(sb::BLOCK_SIZE, &u32le(128 << 10))],
        ),
        (
            "huge group count",
            vec![p(sb::GROUP_COUNT, &u64le(u64::MAX))],
        ),
        (
            "huge group count, no capacity",
            vec![
                p(sb::GROUP_COUNT, &u64le(u64::MAX)),
                p(sb::CAPACITY, &u64le(0)),
            ],
        ),
        (
            "one group past the addressable, no capacity",
            vec![
                p(sb::GROUP_COUNT, &u64le(groups_max + 1)),
                p(sb::CAPACITY, &u64le(0)),
            ],
        ),
        (
            "one group past the capacity",
            vec![p(sb::GROUP_COUNT, &u64le(groups_in_capacity + 1))],
        ),
        (
            "journal of 0 blocks",
            vec![
                p(sb::JOURNAL_BLOCKS, &j_zero),
                p(sb::DATA_START, &d_zero),
                p(sb::JOURNAL_HEAD, &u64le(0)),
            ],
        ),
        (
            "journal below the minimum",
            vec![p(sb::JOURNAL_BLOCKS, &j_small), p(sb::DATA_START, &d_small)],
        ),
        (
            "journal above the maximum",
            vec![p(sb::JOURNAL_BLOCKS, &j_large), p(sb::DATA_START, &d_large)],
        ),
        (
            "journal of 2^64-1 blocks",
            vec![p(sb::JOURNAL_BLOCKS, &u64le(u64::MAX))],
        ),
        (
            // (A head equal to journal_blocks is where a transaction that
            // ends at the region's end leaves the write position.)
            "journal head past the journal",
            vec![p(sb::JOURNAL_HEAD, &u64le(s.journal_blocks + 1))],
        ),
        (
            "journal head 2^64-1",
            vec![p(sb::JOURNAL_HEAD, &u64le(u64::MAX))],
        ),
        (
            "journal not at block 2",
            vec![p(sb::JOURNAL_START, &u64le(3))],
        ),
        (
            "data area not after the journal",
            vec![p(sb::DATA_START, &u64le(s.data_start.0 + 1))],
        ),
        (
            "wrong group size",
            vec![p(sb::GROUP_BLOCKS, &u64le(s.group_blocks + 2))],
        ),
        ("group size 0", vec![p(sb::GROUP_BLOCKS, &u64le(0))]),
        (
            "capacity past the addressable",
            vec![p(sb::CAPACITY, &u64le(ENTRY_ADDR_MASK + 1))],
        ),
        ("volume table height 200", vec![p(sb::VT_HEIGHT, &[200])]),
        (
            "volume table height NODE_LEVELS_MAX",
            vec![p(sb::VT_HEIGHT, &[NODE_LEVELS_MAX])],
        ),
        (
            "volume table root without height",
            vec![p(sb::VT_HEIGHT, &[0])],
        ),
        (
            "volume table height without root",
            vec![p(sb::VT_ROOT, &u64le(0))],
        ),
        ("next volume id 0", vec![p(sb::NEXT_VOLUME_ID, &u64le(0))]),
        (
            "birth generation past BIRTH_GENERATION_MAX",
            vec![p(sb::BIRTH_GENERATION, &u64le(BIRTH_GENERATION_MAX + 1))],
        ),
        (
            "birth generation 2^64-1",
            vec![p(sb::BIRTH_GENERATION, &u64le(u64::MAX))],
        ),
        (
            "journal sequence within the headroom of 2^64",
            vec![p(sb::JOURNAL_SEQUENCE, &u64le(JOURNAL_SEQUENCE_MAX + 1))],
        ),
        (
            "journal sequence 2^64-1",
            vec![p(sb::JOURNAL_SEQUENCE, &u64le(u64::MAX))],
        ),
        ("capacity of 1 block", vec![p(sb::CAPACITY, &u64le(1))]),
        (
            "next volume id past the most the table holds",
            vec![p(sb::NEXT_VOLUME_ID, &u64le(NEXT_VOLUME_ID_MAX + 1))],
        ),
        (
            "capacity that leaves the last group only its own blocks",
            vec![p(
                sb::CAPACITY,
                &u64le((s.group_count - 1) * s.group_blocks + GROUP_HEADER_BLOCKS),
            )],
        ),
        ("no groups", vec![p(sb::GROUP_COUNT, &u64le(0))]),
        (
            "volume table root in the journal",
            vec![p(sb::VT_ROOT, &u64le(s.data_start.0 - 1))],
        ),
        (
            "volume table root past the store",
            vec![p(sb::VT_ROOT, &u64le(s.store_blocks()))],
        ),
        ("version 0", vec![p(sb::VERSION, &u32le(0))]),
        ("first reserved byte", vec![p(sb::RESERVED, &[1])]),
        ("last reserved byte", vec![p(SUPERBLOCK_LEN - 1, &[0x80])]),
    ];
    for (what, patches) in damaged {
        let result = decode(&patches);
        // It passes its checksum: not a torn write, so open refuses the
        // store rather than fall back to the other slot.
        assert!(
            matches!(result, Err(SlotProblem::Invalid(_))),
            "{what}: {result:?}"
        );
        let error = choose_slot([result, Ok(s.clone())], "store").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupt, "{what}: {error}");
        let message = error.to_string();
        assert!(
            !message.contains('\n') && message.contains("superblock slot 0 passes its checksum"),
            "{what}: {message}"
        );
    }
}

#[test]
fn open_picks_the_newer_valid_slot_and_reports_two_damaged_ones() {
    let older = sample_superblock();
    let newer = Superblock {
        generation: older.generation + 1,
        ..older.clone()
    };
    assert_eq!(older.slot(), 1);
    assert_eq!(newer.slot(), 0);
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

/// The data area the sample node's children must lie in: up to the
/// largest address an entry can hold.
const DATA_AREA: std::ops::Range<u64> = 1026..ENTRY_ADDR_MASK + 1;
const NODE_ADDR: BlockAddr = BlockAddr(5000);
/// Entries per node at SMALL_BLOCK_BYTES: exactly the 128 the striped
/// 16-byte header needs.
const SMALL_NODE_ENTRIES: usize = SMALL_BLOCK_BYTES / 8;

fn sample_node() -> Node {
    let mut node = Node::empty(NodeKind::VolumeData, 1, SMALL_NODE_ENTRIES);
    // Entries in the checksum stripes (0..32), the rest of the header
    // stripes and at the end; births from 0 to the largest; holes with and
    // without a birth; the smallest and largest child addresses.
    node.entries[0] = Entry::new(BlockAddr(1026), 0);
    node.entries[1] = Entry::new(BlockAddr(2048), 1);
    node.entries[2] = Entry::hole(3);
    node.entries[5] = Entry::new(BlockAddr(999_999), BIRTH_GENERATION_MAX);
    node.entries[7] = Entry::new(BlockAddr(ENTRY_ADDR_MASK), 0x15_5555);
    node.entries[31] = Entry::new(BlockAddr(123_456), 0x2aa_aaaa);
    node.entries[32] = Entry::new(BlockAddr(4242), 77);
    node.entries[64] = Entry::hole(BIRTH_GENERATION_MAX);
    node.entries[100] = Entry::new(BlockAddr(1 << 36), 1 << 25);
    node.entries[127] = Entry::new(BlockAddr(77_777), 12_345);
    node
}

fn node_fixture() -> Vec<u8> {
    let mut block = vec![0u8; SMALL_BLOCK_BYTES];
    sample_node().encode(&mut block);
    golden("node-v2.bin", &block)
}

fn decode_node(
    block: &[u8],
    kind: NodeKind,
    level: u8,
    birth_max: u64,
) -> grove_store::Result<Node> {
    Node::decode(block, NODE_ADDR, kind, level, DATA_AREA, birth_max)
}

/// Header bit k of a node block: the top bit of entry k.
fn node_header_bit(block: &[u8], k: usize) -> u8 {
    block[k * 8 + 7] >> 7
}

fn set_node_header_bit(block: &mut [u8], k: usize, bit: u8) {
    block[k * 8 + 7] = (block[k * 8 + 7] & 0x7f) | (bit << 7);
}

fn node_header_byte(block: &[u8], offset: usize) -> u8 {
    (0..8).fold(0, |byte, bit| {
        byte | node_header_bit(block, offset * 8 + bit) << bit
    })
}

fn set_node_header_byte(block: &mut [u8], offset: usize, byte: u8) {
    for bit in 0..8 {
        set_node_header_bit(block, offset * 8 + bit, (byte >> bit) & 1);
    }
}

/// Recomputes a node's striped checksum, as format/node.rs defines it: the
/// CRC-32C of the block with the 32 checksum stripe bits taken as zero,
/// stored as header bytes 0..4.
fn reseal_node(block: &mut [u8]) {
    let mut copy = block.to_vec();
    for k in 0..32 {
        set_node_header_bit(&mut copy, k, 0);
    }
    let crc = crc32c::crc32c(&copy);
    for k in 0..32 {
        set_node_header_bit(block, k, ((crc >> k) & 1) as u8);
    }
}

fn entry_raw(block: &[u8], k: usize) -> u64 {
    get_u64(block, k * 8)
}

fn set_entry_raw(block: &mut [u8], k: usize, raw: u64) {
    block[k * 8..k * 8 + 8].copy_from_slice(&raw.to_le_bytes());
}

#[test]
fn node_matches_its_fixture_and_decodes_back() {
    let node = sample_node();
    let fixture = node_fixture();
    // The striped header: magic "GRVN", kind 1, level 1, reserved zero; the
    // checksum is the CRC-32C with its own 32 stripe bits zeroed.
    let header: Vec<u8> = (0..16).map(|i| node_header_byte(&fixture, i)).collect();
    assert_eq!(&header[4..8], b"GRVN");
    assert_eq!(header[8], NodeKind::VolumeData as u8);
    assert_eq!(header[9], 1);
    assert_eq!(&header[10..16], &[0; 6]);
    let mut resealed = fixture.clone();
    reseal_node(&mut resealed);
    assert_eq!(
        resealed, fixture,
        "the test's node checksum matches the encoder's"
    );
    // Entry k is addr | birth << 37 | header bit k << 63.
    for (k, entry) in node.entries.iter().enumerate() {
        let raw = entry_raw(&fixture, k);
        assert_eq!(raw & ENTRY_ADDR_MASK, entry.addr().0, "entry {k}");
        assert_eq!(
            (raw >> 37) & BIRTH_GENERATION_MAX,
            entry.birth(),
            "entry {k}"
        );
        assert_eq!(
            raw >> 63,
            u64::from(node_header_bit(&fixture, k)),
            "entry {k}"
        );
        assert_eq!(raw & !(1 << 63), entry.raw(), "entry {k}");
    }

    let decoded = decode_node(&fixture, NodeKind::VolumeData, 1, BIRTH_GENERATION_MAX)
        .expect("the fixture decodes");
    assert_eq!(decoded, node);
    assert_eq!(decoded.entries[5].addr(), BlockAddr(999_999));
    assert_eq!(decoded.entries[5].birth(), BIRTH_GENERATION_MAX);
    assert_eq!(decoded.entries[7].addr(), BlockAddr(ENTRY_ADDR_MASK));
    assert!(decoded.entries[2].is_empty() && decoded.entries[2].birth() == 3);
    assert!(decoded.entries[64].is_empty());
    let mut reencoded = vec![0u8; SMALL_BLOCK_BYTES];
    decoded.encode(&mut reencoded);
    assert_eq!(reencoded, fixture, "re-encoding");
}

#[test]
fn every_bit_flip_of_a_node_is_rejected() {
    assert_every_bit_flip_is_corrupt(&node_fixture(), "node", |damaged| {
        decode_node(damaged, NodeKind::VolumeData, 1, BIRTH_GENERATION_MAX)
    });
}

#[test]
fn a_node_in_the_wrong_place_is_rejected() {
    let fixture = node_fixture();
    let corrupt = is_corrupt::<Node>;
    let decode = |kind, level, children: std::ops::Range<u64>, birth_max| {
        Node::decode(&fixture, NODE_ADDR, kind, level, children, birth_max)
    };
    let max = BIRTH_GENERATION_MAX;
    assert!(decode(NodeKind::VolumeData, 1, DATA_AREA, max).is_ok());
    // A node of another tree, or of another level, is damage even with a
    // good checksum: a pointer that leads there is wrong.
    assert!(corrupt(decode(NodeKind::VolumeTable, 1, DATA_AREA, max)));
    assert!(corrupt(decode(NodeKind::VolumeData, 0, DATA_AREA, max)));
    assert!(corrupt(decode(NodeKind::VolumeData, 2, DATA_AREA, max)));
    // A child outside the data area, at either end.
    assert!(corrupt(decode(
        NodeKind::VolumeData,
        1,
        1026..ENTRY_ADDR_MASK,
        max
    )));
    assert!(corrupt(decode(
        NodeKind::VolumeData,
        1,
        1027..ENTRY_ADDR_MASK + 1,
        max
    )));
    // An entry born after the pool's generation (entry 5 and the hole at
    // entry 64 are born in BIRTH_GENERATION_MAX).
    assert!(corrupt(decode(NodeKind::VolumeData, 1, DATA_AREA, max - 1)));
    assert!(corrupt(decode(NodeKind::VolumeData, 1, DATA_AREA, 0)));
    // An all-zero block (never written) is not a node; nor is a block too
    // small for the striped header.
    let zeros = vec![0u8; SMALL_BLOCK_BYTES];
    assert!(corrupt(decode_node(&zeros, NodeKind::VolumeData, 1, max)));
    assert!(corrupt(decode_node(
        &fixture[..SMALL_BLOCK_BYTES / 2],
        NodeKind::VolumeData,
        1,
        max
    )));
}

#[test]
fn a_node_entry_born_after_the_pool_generation_is_rejected() {
    // Births up to 40, one of them a hole's: 40 is accepted, 39 is not.
    let mut node = Node::empty(NodeKind::VolumeData, 0, SMALL_NODE_ENTRIES);
    node.entries[3] = Entry::new(BlockAddr(3000), 10);
    node.entries[90] = Entry::new(BlockAddr(3001), 40);
    node.entries[91] = Entry::hole(25);
    let accepted_at_40_only = |node: &Node| {
        let mut block = vec![0u8; SMALL_BLOCK_BYTES];
        node.encode(&mut block);
        assert_eq!(
            decode_node(&block, NodeKind::VolumeData, 0, 40).unwrap(),
            *node
        );
        let err = decode_node(&block, NodeKind::VolumeData, 0, 39).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
    };
    accepted_at_40_only(&node);
    // A hole born late is refused like a mapping.
    node.entries[90] = Entry::EMPTY;
    node.entries[91] = Entry::hole(40);
    accepted_at_40_only(&node);
}

#[test]
fn a_volume_table_entry_with_a_birth_is_rejected() {
    let mut node = Node::empty(NodeKind::VolumeTable, 0, SMALL_NODE_ENTRIES);
    node.entries[0] = Entry::new(BlockAddr(4099), 0);
    node.entries[40] = Entry::new(BlockAddr(4100), 0);
    let mut block = vec![0u8; SMALL_BLOCK_BYTES];
    node.encode(&mut block);
    assert_eq!(node_header_byte(&block, 8), NodeKind::VolumeTable as u8);
    let decoded = decode_node(&block, NodeKind::VolumeTable, 0, 5).unwrap();
    assert_eq!(decoded, node);
    // The same node with a birth in one entry (in the checksum stripes or
    // not; a mapping or a hole), well checksummed, is damage whatever the
    // pool's generation.
    for (k, addr) in [(0usize, 4099u64), (40, 4100), (77, 0)] {
        let mut bad = block.clone();
        let stripe = entry_raw(&bad, k) & (1 << 63);
        set_entry_raw(&mut bad, k, stripe | addr | (1 << 37));
        reseal_node(&mut bad);
        let err = decode_node(&bad, NodeKind::VolumeTable, 0, BIRTH_GENERATION_MAX).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "entry {k}");
        // The patching is right: as a data-tree node the same bytes decode.
        let mut as_data = bad.clone();
        set_node_header_byte(&mut as_data, 8, NodeKind::VolumeData as u8);
        reseal_node(&mut as_data);
        let decoded = decode_node(&as_data, NodeKind::VolumeData, 0, 1).unwrap();
        assert_eq!(decoded.entries[k].birth(), 1, "entry {k}");
    }
}

#[test]
fn a_well_checksummed_node_with_an_impossible_field_is_rejected() {
    let fixture = node_fixture();
    let corrupt = |block: &[u8]| {
        is_corrupt(decode_node(
            block,
            NodeKind::VolumeData,
            1,
            BIRTH_GENERATION_MAX,
        ))
    };
    // Unknown kinds.
    for kind in [0u8, 3, 0xff] {
        let mut bad = fixture.clone();
        set_node_header_byte(&mut bad, 8, kind);
        reseal_node(&mut bad);
        assert!(corrupt(&bad), "kind {kind}");
    }
    // A larger node (512 entries at 4 KiB) has no header past entry 127:
    // a stripe bit set there is damage even with a good checksum.
    let mut node = Node::empty(NodeKind::VolumeData, 1, 512);
    node.entries[200] = Entry::new(BlockAddr(3000), 2);
    let mut block = vec![0u8; 4096];
    node.encode(&mut block);
    assert_eq!(
        decode_node(&block, NodeKind::VolumeData, 1, 2).unwrap(),
        node
    );
    for k in [128usize, 200, 511] {
        let mut bad = block.clone();
        set_node_header_bit(&mut bad, k, 1);
        reseal_node(&mut bad);
        let err = decode_node(&bad, NodeKind::VolumeData, 1, 2).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "stripe bit of entry {k}");
    }
}

// -------------------------------------------------------------------- record

mod rec {
    pub const CRC: usize = 4;
    pub const ID: usize = 8;
    pub const PARENT: usize = 16;
    pub const SIZE: usize = 24;
    pub const ROOT: usize = 32;
    pub const HEIGHT: usize = 40;
    pub const KIND: usize = 41;
    pub const NAME_LEN: usize = 42;
    pub const FLAGS: usize = 43;
    pub const CREATED: usize = 48;
    pub const REFERENCED: usize = 56;
    pub const CREATED_GENERATION: usize = 64;
    pub const SHARE_FLOOR: usize = 72;
    pub const WRITTEN_BASE: usize = 80;
    pub const NAME: usize = 96;
    pub const GUID: usize = 224;
    /// Reserved bytes, all zero in a valid record (the name's padding is
    /// reserved too).
    pub const RESERVED: [std::ops::Range<usize>; 2] = [44..48, 240..256];
    /// Receive progress: zero unless the receiving flag (0x02) is set.
    pub const RECEIVE_PROGRESS: usize = 88;
}

const SAMPLE_NAME: &str = "disk@2024-01-01+clone:x_y.z";

fn sample_record() -> VolumeRecord {
    VolumeRecord {
        id: VolumeId(42),
        parent: VolumeId(7),
        size_bytes: (10 << 30) + 512,
        root: BlockAddr(123_456),
        height: 3,
        kind: VolumeKind::Clone,
        name: SAMPLE_NAME.to_string(),
        removed: false,
        created_unix_secs: 1_700_000_123,
        referenced_blocks: 5000,
        created_generation: 900,
        share_floor_generation: 950,
        written_base_generation: 925,
        guid: *b"guid-of-vol-0042",
        receive_progress: None,
        cursor: false,
        rank: 0,
        hold: false,
        hold_until_unix_secs: 0,
    }
}

fn record_fixture() -> Vec<u8> {
    let mut bytes = [0u8; RECORD_BYTES];
    sample_record().encode(&mut bytes);
    golden("record-v2.bin", &bytes)
}

#[test]
fn record_matches_its_fixture_and_decodes_back() {
    let record = sample_record();
    let fixture = record_fixture();
    assert_eq!(&fixture[..4], b"GRVR");
    assert_eq!(get_u64(&fixture, rec::ID), 42);
    assert_eq!(get_u64(&fixture, rec::PARENT), 7);
    assert_eq!(get_u64(&fixture, rec::SIZE), (10 << 30) + 512);
    assert_eq!(get_u64(&fixture, rec::ROOT), 123_456);
    assert_eq!(fixture[rec::HEIGHT], 3);
    assert_eq!(fixture[rec::KIND], VolumeKind::Clone as u8);
    assert_eq!(usize::from(fixture[rec::NAME_LEN]), SAMPLE_NAME.len());
    assert_eq!(fixture[rec::FLAGS], 0);
    assert_eq!(get_u64(&fixture, rec::CREATED), 1_700_000_123);
    assert_eq!(get_u64(&fixture, rec::REFERENCED), 5000);
    assert_eq!(get_u64(&fixture, rec::CREATED_GENERATION), 900);
    assert_eq!(get_u64(&fixture, rec::SHARE_FLOOR), 950);
    assert_eq!(get_u64(&fixture, rec::WRITTEN_BASE), 925);
    assert_eq!(
        &fixture[rec::NAME..rec::NAME + SAMPLE_NAME.len()],
        SAMPLE_NAME.as_bytes()
    );
    assert!(fixture[rec::NAME + SAMPLE_NAME.len()..rec::GUID]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(&fixture[rec::GUID..rec::GUID + 16], b"guid-of-vol-0042");
    for range in rec::RESERVED {
        assert!(fixture[range.clone()].iter().all(|&b| b == 0), "{range:?}");
    }

    let decoded = VolumeRecord::decode(&fixture, VolumeId(42))
        .unwrap()
        .expect("a live record");
    assert_eq!(decoded, record);
    let mut reencoded = [0u8; RECORD_BYTES];
    decoded.encode(&mut reencoded);
    assert_eq!(reencoded[..], fixture[..], "re-encoding");
    // An all-zero slot is an empty slot, not damage.
    assert_eq!(
        VolumeRecord::decode(&[0u8; RECORD_BYTES], VolumeId(3)).unwrap(),
        None
    );
}

#[test]
fn partial_receives_and_cursors_round_trip() {
    let receiving = VolumeRecord {
        receive_progress: Some(3 << 20),
        ..sample_record()
    };
    let cursor = VolumeRecord {
        removed: true,
        root: BlockAddr::NONE,
        kind: VolumeKind::Snapshot,
        cursor: true,
        ..sample_record()
    };
    for (record, flags) in [(receiving, 2), (cursor, 5)] {
        let mut bytes = [0u8; RECORD_BYTES];
        record.encode(&mut bytes);
        assert_eq!(bytes[rec::FLAGS], flags);
        assert_eq!(
            VolumeRecord::decode(&bytes, VolumeId(42)).unwrap(),
            Some(record)
        );
    }
}

#[test]
fn a_removed_record_round_trips_with_and_without_a_root() {
    for root in [BlockAddr(123_456), BlockAddr::NONE] {
        let record = VolumeRecord {
            removed: true,
            root,
            kind: VolumeKind::Snapshot,
            name: "x".repeat(128),
            created_generation: BIRTH_GENERATION_MAX,
            share_floor_generation: 0,
            written_base_generation: BIRTH_GENERATION_MAX,
            ..sample_record()
        };
        let mut bytes = [0u8; RECORD_BYTES];
        record.encode(&mut bytes);
        assert_eq!(bytes[rec::FLAGS], 1);
        assert_eq!(
            VolumeRecord::decode(&bytes, VolumeId(42)).unwrap(),
            Some(record),
            "root {root}"
        );
    }
}

#[test]
fn every_bit_flip_of_a_record_is_rejected() {
    assert_every_bit_flip_is_corrupt(&record_fixture(), "record", |damaged| {
        VolumeRecord::decode(damaged, VolumeId(42))
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
    let decode = |patches: &[(usize, Vec<u8>)]| {
        VolumeRecord::decode(&patched(&fixture, rec::CRC, patches), VolumeId(42))
    };
    let u64le = |v: u64| v.to_le_bytes();
    let too_new = u64le(BIRTH_GENERATION_MAX + 1);

    // Limits that hold, through the same patching.
    let fine: Patches = vec![
        ("unchanged", vec![]),
        ("removed", vec![p(rec::FLAGS, &[1])]),
        (
            "removed, its tree given back",
            vec![p(rec::FLAGS, &[1]), p(rec::ROOT, &u64le(0))],
        ),
        ("height 1", vec![p(rec::HEIGHT, &[1])]),
        ("tallest tree", vec![p(rec::HEIGHT, &[NODE_LEVELS_MAX - 1])]),
        ("size 0", vec![p(rec::SIZE, &u64le(0))]),
        ("largest size", vec![p(rec::SIZE, &u64le(1 << 56))]),
        ("no parent", vec![p(rec::PARENT, &u64le(0))]),
        (
            "last generation",
            vec![
                p(rec::CREATED_GENERATION, &u64le(BIRTH_GENERATION_MAX)),
                p(rec::SHARE_FLOOR, &u64le(BIRTH_GENERATION_MAX)),
                p(rec::WRITTEN_BASE, &u64le(BIRTH_GENERATION_MAX)),
            ],
        ),
        ("kind volume", vec![p(rec::KIND, &[1])]),
        ("kind snapshot", vec![p(rec::KIND, &[2])]),
    ];
    for (what, patches) in fine {
        assert!(
            matches!(decode(&patches), Ok(Some(_))),
            "{what}: {:?}",
            decode(&patches)
        );
    }

    let name_end = rec::NAME + SAMPLE_NAME.len();
    let mut damaged: Patches = vec![
        ("size not in sectors", vec![p(rec::SIZE, &u64le(1000))]),
        ("size 513", vec![p(rec::SIZE, &u64le(513))]),
        (
            "size past the largest",
            vec![p(rec::SIZE, &u64le((1 << 56) + 512))],
        ),
        ("size 2^64-1", vec![p(rec::SIZE, &u64le(u64::MAX))]),
        ("live without a root", vec![p(rec::ROOT, &u64le(0))]),
        ("height 0", vec![p(rec::HEIGHT, &[0])]),
        (
            "height NODE_LEVELS_MAX",
            vec![p(rec::HEIGHT, &[NODE_LEVELS_MAX])],
        ),
        ("height 200", vec![p(rec::HEIGHT, &[200])]),
        ("kind 0", vec![p(rec::KIND, &[0])]),
        ("kind 4", vec![p(rec::KIND, &[4])]),
        ("kind 255", vec![p(rec::KIND, &[255])]),
        ("empty name", vec![p(rec::NAME_LEN, &[0])]),
        ("name longer than its field", vec![p(rec::NAME_LEN, &[129])]),
        ("name not UTF-8", vec![p(rec::NAME, &[0xff])]),
        ("flag 0x08", vec![p(rec::FLAGS, &[0x08])]),
        (
            "receive progress without the receiving flag",
            vec![p(rec::RECEIVE_PROGRESS, &[1])],
        ),
        ("a cursor that is live", vec![p(rec::FLAGS, &[0x04])]),
        ("flag 0x80", vec![p(rec::FLAGS, &[0x80])]),
        ("removed and receiving", vec![p(rec::FLAGS, &[0x03])]),
        ("all flags", vec![p(rec::FLAGS, &[0xff])]),
        (
            "created generation too large",
            vec![p(rec::CREATED_GENERATION, &too_new)],
        ),
        ("share floor too large", vec![p(rec::SHARE_FLOOR, &too_new)]),
        (
            "written base too large",
            vec![p(rec::WRITTEN_BASE, &too_new)],
        ),
        (
            "generation 2^64-1",
            vec![p(rec::CREATED_GENERATION, &[0xff; 8])],
        ),
        ("its own parent", vec![p(rec::PARENT, &u64le(42))]),
        ("name padding", vec![p(name_end, b"!")]),
        ("last byte of the name field", vec![p(rec::GUID - 1, &[1])]),
    ];
    for range in rec::RESERVED {
        damaged.push(("reserved first byte", vec![p(range.start, &[1])]));
        damaged.push(("reserved last byte", vec![p(range.end - 1, &[0x80])]));
    }
    for (what, patches) in damaged {
        match decode(&patches) {
            Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}"),
            Ok(r) => panic!("{what} {patches:?}: accepted as {r:?}"),
        }
    }
    // Id 0 is never a volume, even in slot 0.
    let bytes = patched(&fixture, rec::CRC, &[p(rec::ID, &u64le(0))]);
    assert_eq!(
        VolumeRecord::decode(&bytes, VolumeId(0))
            .unwrap_err()
            .kind(),
        ErrorKind::Corrupt
    );
}

// --------------------------------------------------------------------- group

const GROUP_INDEX: u64 = 3;
const GROUP_CRC_OFFSET: usize = 4;
const GROUP_SHARES_PRESENT_OFFSET: usize = 16;
const SAMPLE_SHARES_PRESENT: u8 = 0b1010_0101;
const META: u8 = NIBBLE_ALLOCATED | NIBBLE_META;

fn sample_nibbles() -> Vec<u8> {
    let count = group::group_blocks(SMALL_BLOCK_BYTES as u32) as usize;
    (0..count)
        .map(|i| match i {
            // The map block and the share-count blocks.
            _ if (i as u64) < GROUP_HEADER_BLOCKS => META,
            _ if i % 7 == 0 => META,
            _ if i % 5 == 0 => NIBBLE_ALLOCATED,
            // Marks and pending frees never reach the disk: only free,
            // data and metadata blocks appear in a map.
            _ if i == count - 1 => META,
            _ => 0,
        })
        .collect()
}

fn group_fixture() -> Vec<u8> {
    let mut block = vec![0u8; SMALL_BLOCK_BYTES];
    group::encode(
        GROUP_INDEX,
        &sample_nibbles(),
        SAMPLE_SHARES_PRESENT,
        &mut block,
    );
    golden("group-v2.bin", &block)
}

/// Byte offset and shift of block `slot`'s nibble in a map block.
fn nibble_position(slot: usize) -> (usize, u32) {
    (GROUP_HEADER_BYTES + slot / 2, 4 * (slot % 2) as u32)
}

fn with_nibble(block: &[u8], slot: usize, nibble: u8) -> Vec<u8> {
    let (byte, shift) = nibble_position(slot);
    let mut bytes = block.to_vec();
    bytes[byte] = (bytes[byte] & !(0xf << shift)) | (nibble << shift);
    reseal(&mut bytes, GROUP_CRC_OFFSET);
    bytes
}

#[test]
fn group_map_matches_its_fixture_and_decodes_back() {
    let nibbles = sample_nibbles();
    let fixture = group_fixture();
    assert_eq!(&fixture[..4], b"GRVG");
    assert_eq!(get_u64(&fixture, 8), GROUP_INDEX);
    assert_eq!(fixture[GROUP_SHARES_PRESENT_OFFSET], SAMPLE_SHARES_PRESENT);
    assert!(fixture[17..GROUP_HEADER_BYTES].iter().all(|&b| b == 0));
    for (slot, &nibble) in nibbles.iter().enumerate() {
        let (byte, shift) = nibble_position(slot);
        assert_eq!((fixture[byte] >> shift) & 0xf, nibble, "block {slot}");
    }

    let decoded = group::decode(GROUP_INDEX, &fixture).unwrap();
    assert_eq!(decoded.nibbles, nibbles);
    assert_eq!(decoded.shares_present, SAMPLE_SHARES_PRESENT);
    let mut reencoded = vec![0u8; SMALL_BLOCK_BYTES];
    group::encode(
        GROUP_INDEX,
        &decoded.nibbles,
        decoded.shares_present,
        &mut reencoded,
    );
    assert_eq!(reencoded, fixture, "re-encoding");
}

#[test]
fn every_bit_flip_of_a_group_map_is_rejected() {
    // A decoded map does not print: what was accepted shows as ().
    assert_every_bit_flip_is_corrupt(&group_fixture(), "group map", |damaged| {
        group::decode(GROUP_INDEX, damaged).map(drop)
    });
}

#[test]
fn a_well_checksummed_group_map_with_an_impossible_field_is_rejected() {
    let fixture = group_fixture();
    let corrupt = |block: &[u8], what: &str| match group::decode(GROUP_INDEX, block) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    // The map of another group.
    let decoded = group::decode(GROUP_INDEX + 1, &fixture);
    assert_eq!(decoded.err().unwrap().kind(), ErrorKind::Corrupt);
    // An all-zero block (never written) is not a map.
    corrupt(&vec![0u8; SMALL_BLOCK_BYTES], "all zero");

    // Through the same patching, states that may be on disk are accepted:
    // any share-count bitmap, and data or free blocks past the header ones.
    for present in [0u8, 1, 0x80, 0xff] {
        let bytes = patched(
            &fixture,
            GROUP_CRC_OFFSET,
            &[p(GROUP_SHARES_PRESENT_OFFSET, &[present])],
        );
        assert_eq!(
            group::decode(GROUP_INDEX, &bytes).unwrap().shares_present,
            present
        );
    }
    let first_free = GROUP_HEADER_BLOCKS as usize;
    for nibble in [0, NIBBLE_ALLOCATED, META] {
        let bytes = with_nibble(&fixture, first_free, nibble);
        assert_eq!(
            group::decode(GROUP_INDEX, &bytes).unwrap().nibbles[first_free],
            nibble
        );
    }

    // States of memory only, or not states at all, in any block.
    let last = sample_nibbles().len() - 1;
    for slot in [0, first_free, first_free + 1, last] {
        for nibble in [
            NIBBLE_META,
            NIBBLE_PENDING_FREE,
            NIBBLE_PENDING_FREE | 1,
            0x4,
            0xf,
        ] {
            corrupt(
                &with_nibble(&fixture, slot, nibble),
                &format!("block {slot} in state {nibble:#x}"),
            );
        }
    }
    // The map block and the share-count blocks are always metadata.
    for slot in 0..GROUP_HEADER_BLOCKS as usize {
        for nibble in [0, NIBBLE_ALLOCATED] {
            corrupt(
                &with_nibble(&fixture, slot, nibble),
                &format!("header block {slot} in state {nibble:#x}"),
            );
        }
    }
    // Reserved header bytes.
    for offset in [17, 40, GROUP_HEADER_BYTES - 1] {
        corrupt(
            &patched(&fixture, GROUP_CRC_OFFSET, &[p(offset, &[1])]),
            &format!("reserved byte {offset}"),
        );
    }
}

// -------------------------------------------------------------- share counts

/// The first block the sample count block covers: count block 2 of group 3
/// at 1 KiB blocks, were the data area to start at block 34.
fn sample_shares_first() -> BlockAddr {
    let group_blocks = group::group_blocks(SMALL_BLOCK_BYTES as u32);
    let per_block = shares::counts_per_block(SMALL_BLOCK_BYTES as u32);
    BlockAddr(34 + GROUP_INDEX * group_blocks + 2 * per_block)
}

fn sample_counts() -> Vec<u32> {
    let count = shares::counts_per_block(SMALL_BLOCK_BYTES as u32) as usize;
    (0..count)
        .map(|i| match i {
            0 => 1,
            1 => u32::MAX,
            _ if i == count - 1 => 0x0102_0304,
            _ if i % 11 == 0 => i as u32 * 1000,
            _ if i % 3 == 0 => 1,
            _ => 0,
        })
        .collect()
}

fn shares_fixture() -> Vec<u8> {
    let mut block = vec![0u8; SMALL_BLOCK_BYTES];
    shares::encode(sample_shares_first(), &sample_counts(), &mut block);
    golden("shares-v2.bin", &block)
}

#[test]
fn share_count_block_matches_its_fixture_and_decodes_back() {
    let counts = sample_counts();
    let first = sample_shares_first();
    let fixture = shares_fixture();
    assert_eq!(counts.len(), (SMALL_BLOCK_BYTES - 16) / 4);
    assert_eq!(&fixture[..4], b"GRVC");
    assert_eq!(get_u32(&fixture, 4), crc_with_hole(&fixture, 4));
    assert_eq!(get_u64(&fixture, 8), first.0);
    for (i, &count) in counts.iter().enumerate() {
        assert_eq!(get_u32(&fixture, 16 + 4 * i), count, "count {i}");
    }

    let decoded = shares::decode(first, &fixture).unwrap();
    assert_eq!(decoded, counts);
    let mut reencoded = vec![0u8; SMALL_BLOCK_BYTES];
    shares::encode(first, &decoded, &mut reencoded);
    assert_eq!(reencoded, fixture, "re-encoding");
}

#[test]
fn every_bit_flip_of_a_share_count_block_is_rejected() {
    let first = sample_shares_first();
    assert_every_bit_flip_is_corrupt(&shares_fixture(), "share-count block", |damaged| {
        shares::decode(first, damaged)
    });
}

#[test]
fn a_share_count_block_in_the_wrong_place_is_rejected() {
    let fixture = shares_fixture();
    let first = sample_shares_first();
    let corrupt = is_corrupt::<Vec<u32>>;
    // Counts written for other blocks, well checksummed.
    let per_block = shares::counts_per_block(SMALL_BLOCK_BYTES as u32);
    assert!(corrupt(shares::decode(BlockAddr(first.0 + 1), &fixture)));
    assert!(corrupt(shares::decode(
        BlockAddr(first.0 - per_block),
        &fixture
    )));
    assert!(corrupt(shares::decode(
        BlockAddr(first.0 + per_block),
        &fixture
    )));
    // A hole in the store (a count block never written) is not "no counts".
    assert!(corrupt(shares::decode(
        first,
        &vec![0u8; SMALL_BLOCK_BYTES]
    )));
    // Another metadata block where a count block belongs.
    assert!(corrupt(shares::decode(first, &group_fixture())));
    // Any count is possible, so a resealed count is accepted as written.
    let bytes = patched(&fixture, 4, &[p(16, &u32::MAX.to_le_bytes())]);
    assert_eq!(shares::decode(first, &bytes).unwrap()[0], u32::MAX);
}

// ------------------------------------------------------------------- journal

const JOURNAL_SEQUENCE: u64 = 1234;
const JOURNAL_CRC_OFFSET: usize = 4;

fn sample_descriptor() -> Descriptor {
    // Enough homes to spread the descriptor over two blocks, so the
    // checksum and the records cross a block boundary.
    let homes: Vec<BlockAddr> = (0..110).map(|i| BlockAddr(4099 + 3 * i)).collect();
    let extents = vec![
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
    ];
    let share_runs = vec![
        ShareRun {
            first: BlockAddr(6000),
            count: 12,
            extra: 1,
        },
        ShareRun {
            first: BlockAddr(9000),
            count: 3,
            extra: 0,
        },
        ShareRun {
            first: BlockAddr(77_777),
            count: u32::MAX,
            extra: u32::MAX,
        },
    ];
    let len = Descriptor::encoded_len(homes.len(), extents.len(), share_runs.len());
    Descriptor {
        sequence: JOURNAL_SEQUENCE,
        pool_uuid: *b"grove-fixture-01",
        descriptor_blocks: len.div_ceil(SMALL_BLOCK_BYTES) as u32,
        images_crc: 0xdead_beef,
        roots: Roots {
            volume_table_root: BlockAddr(4099),
            volume_table_height: 2,
            next_volume_id: VolumeId(17),
            group_count: 3,
            birth_generation: 321,
        },
        homes,
        extents,
        share_runs,
    }
}

fn journal_fixture() -> Vec<u8> {
    golden(
        "journal-v2.bin",
        &sample_descriptor().encode(SMALL_BLOCK_BYTES),
    )
}

fn decode_journal(bytes: &[u8]) -> Option<Descriptor> {
    let uuid = sample_descriptor().pool_uuid;
    Descriptor::decode(bytes, JOURNAL_SEQUENCE, &uuid, SMALL_BLOCK_BYTES)
}

#[test]
fn journal_descriptor_matches_its_fixture_and_decodes_back() {
    let descriptor = sample_descriptor();
    let fixture = journal_fixture();
    let uuid = descriptor.pool_uuid;
    // Layout: the header, then homes, extents and share runs.
    assert_eq!(Descriptor::encoded_len(0, 0, 0), 96);
    assert_eq!(Descriptor::encoded_len(1, 10, 100), 96 + 8 + 160 + 1600);
    assert_eq!(descriptor.descriptor_blocks, 2);
    assert_eq!(fixture.len(), 2 * SMALL_BLOCK_BYTES);
    assert_eq!(&fixture[..4], b"GRVJ");
    assert_eq!(get_u64(&fixture, 8), JOURNAL_SEQUENCE);
    assert_eq!(get_u32(&fixture, 32), 2);
    assert_eq!(get_u32(&fixture, 36), 110);
    assert_eq!(get_u32(&fixture, 40), 3);
    assert_eq!(get_u32(&fixture, 44), 0xdead_beef);
    assert_eq!(get_u64(&fixture, 48), 4099);
    assert_eq!(fixture[56], 2);
    assert_eq!(get_u64(&fixture, 64), 17);
    assert_eq!(get_u64(&fixture, 72), 3);
    assert_eq!(get_u64(&fixture, 80), 321);
    assert_eq!(get_u32(&fixture, 88), 3);
    let runs = 96 + 110 * 8 + 3 * 16;
    assert_eq!(get_u64(&fixture, runs + 32), 77_777);
    assert_eq!(get_u32(&fixture, runs + 40), u32::MAX);
    assert_eq!(get_u32(&fixture, runs + 44), u32::MAX);
    assert!(fixture[runs + 48..].iter().all(|&b| b == 0), "padding");

    assert_eq!(
        Descriptor::peek_blocks(&fixture[..SMALL_BLOCK_BYTES], JOURNAL_SEQUENCE, &uuid),
        Some(2)
    );
    let decoded = decode_journal(&fixture).expect("the fixture decodes");
    assert_eq!(decoded, descriptor);
    assert_eq!(decoded.encode(SMALL_BLOCK_BYTES), fixture, "re-encoding");
    // Another sequence or another pool's transaction is the end of the
    // journal, not a transaction to replay.
    assert_eq!(
        Descriptor::decode(&fixture, JOURNAL_SEQUENCE + 1, &uuid, SMALL_BLOCK_BYTES),
        None
    );
    assert_eq!(
        Descriptor::decode(
            &fixture,
            JOURNAL_SEQUENCE,
            b"another-pool-id!",
            SMALL_BLOCK_BYTES
        ),
        None
    );
    // Only its first block, or one block too many, is not the descriptor.
    assert_eq!(decode_journal(&fixture[..SMALL_BLOCK_BYTES]), None);
    let mut longer = fixture.clone();
    longer.resize(3 * SMALL_BLOCK_BYTES, 0);
    assert_eq!(decode_journal(&longer), None);
}

#[test]
fn every_bit_flip_of_a_journal_descriptor_ends_replay() {
    let fixture = journal_fixture();
    each_bit_flip(&fixture, |byte, bit, damaged| {
        assert_eq!(decode_journal(damaged), None, "bit {bit} of byte {byte}");
    });
}

/// A descriptor whose checksum matches but whose fields are impossible was
/// written that way (no torn write makes one): replay must refuse it, not
/// take it for the end of the journal and drop it with what follows.
#[test]
fn a_well_checksummed_journal_descriptor_with_an_impossible_field_is_refused() {
    let fixture = journal_fixture();
    let decode = |patches: &[(usize, Vec<u8>)]| {
        decode_journal(&patched(&fixture, JOURNAL_CRC_OFFSET, patches))
    };
    let u32le = |v: u32| v.to_le_bytes();
    assert_eq!(decode(&[]), Some(sample_descriptor()));
    let extents = 96 + 110 * 8;
    let runs = extents + 3 * 16;
    // A share run's extra count is any u32, so patching one is accepted.
    let decoded = decode(&[p(runs + 12, &u32le(7))]).expect("a valid descriptor");
    assert_eq!(decoded.share_runs[0].extra, 7);

    let checked = |patches: &[(usize, Vec<u8>)]| {
        let uuid = sample_descriptor().pool_uuid;
        Descriptor::decode_checked(
            &patched(&fixture, JOURNAL_CRC_OFFSET, patches),
            JOURNAL_SEQUENCE,
            &uuid,
            SMALL_BLOCK_BYTES,
        )
    };
    // A length that disagrees with the blocks read is what the journal sees
    // of a descriptor whose length field was torn: the checksum, taken over
    // the blocks the field names, cannot match there. The end, not damage.
    let not_here: Patches = vec![
        ("descriptor blocks 0", vec![p(32, &u32le(0))]),
        ("descriptor blocks 1", vec![p(32, &u32le(1))]),
        ("descriptor blocks 3", vec![p(32, &u32le(3))]),
    ];
    for (what, patches) in not_here {
        assert_eq!(checked(&patches), Ok(None), "{what}");
    }

    let cases: Patches = vec![
        ("image count too large", vec![p(36, &u32le(300))]),
        ("image count 2^32-1", vec![p(36, &u32le(u32::MAX))]),
        ("image count too small", vec![p(36, &u32le(0))]),
        ("extent count 2^32-1", vec![p(40, &u32le(u32::MAX))]),
        ("share run count 2^32-1", vec![p(88, &u32le(u32::MAX))]),
        ("share run count too large", vec![p(88, &u32le(100))]),
        ("reserved after the height", vec![p(57, &[1])]),
        ("reserved before the homes", vec![p(63, &[1])]),
        ("reserved after the share run count", vec![p(92, &[1])]),
        ("reserved before the homes, last", vec![p(95, &[1])]),
        ("extent change 0", vec![p(extents + 12, &[0])]),
        ("extent change 4", vec![p(extents + 12, &[4])]),
        ("extent count 0", vec![p(extents + 8, &u32le(0))]),
        ("extent reserved byte", vec![p(extents + 13, &[1])]),
        (
            "last extent reserved byte",
            vec![p(extents + 2 * 16 + 15, &[1])],
        ),
        ("share run count 0", vec![p(runs + 8, &u32le(0))]),
        (
            "last share run count 0",
            vec![p(runs + 2 * 16 + 8, &u32le(0))],
        ),
    ];
    for (what, patches) in cases {
        assert_eq!(decode(&patches), None, "{what}");
        let why = checked(&patches).expect_err(what);
        assert!(!why.is_empty() && !why.contains('\n'), "{what}: {why}");
    }
}
