//! The archive's objects, byte by byte: encoders, and decoders that refuse
//! anything malformed with a reason and never panic.
//!
//! - `pack`: block versions with the same owner, each checksummed.
//! - `index`: one archived snapshot's root: a page per segment of blocks.
//! - `page`: the runs of one segment, shared by the snapshots it maps.
//! - `runs`: runs of blocks and the addresses of their versions.
//! - `forward`: where the versions of a deleted pack were copied.
//! - `catalog`: the archive's state, one create-only object per commit.

pub mod catalog;
pub mod forward;
pub mod index;
pub mod pack;
pub mod page;
pub mod runs;

/// Reads a little-endian integer at `at`; the caller checked the length.
fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Gives `data` to every decoder, as a read of a damaged or foreign object
/// would (a page as one of the blocks `page_blocks`). Asserts that what
/// decodes encodes back to the same bytes; a panic anywhere is the bug.
/// The proptest below and fuzz/fuzz_targets/archive_objects.rs run it.
#[doc(hidden)]
pub fn decode_every_kind(data: &[u8], page_blocks: std::ops::Range<u64>) {
    let _ = pack::decode_header(data, 1, 4096);
    let header = pack::PackHeader {
        id: 1,
        block_bytes: 4096,
        slots: ((data.len() as u64).saturating_sub(pack::FOOTER_BYTES) / pack::TABLE_ENTRY_BYTES)
            as u32,
    };
    let _ = pack::decode_table(data, &header);
    if let Ok(runs) = page::decode(data, 0, page_blocks) {
        assert_eq!(page::encode(0, &runs), data);
    }
    if let Ok(root) = index::SnapshotRoot::decode(data, 1, 4096) {
        assert_eq!(root.encode(), data);
    }
    if let Ok(table) = forward::ForwardTable::decode(data, 1) {
        assert_eq!(table.encode(), data);
    }
    let _ = catalog::decode(data, 1);
}

#[cfg(test)]
mod tests {
    //! What fuzz/fuzz_targets/archive_objects.rs asks (decode_every_kind),
    //! run by proptest in every test run: arbitrary bytes, and valid objects with bytes
    //! changed, given to every decoder never panic, and what decodes
    //! encodes back to the same bytes.

    use super::forward::ForwardTable;
    use super::index::{PageRef, SnapshotRoot};
    use super::runs::Run;
    use super::{decode_every_kind, pack, page};
    use proptest::prelude::*;

    fn decode_all(data: &[u8]) {
        decode_every_kind(data, 0..64);
    }

    fn valid_objects() -> Vec<Vec<u8>> {
        let entry = pack::SlotEntry {
            block: 3,
            origin: (1, 0),
        };
        let runs = [Run {
            first_block: 2,
            pack: 1,
            first_slot: 0,
            blocks: 5,
        }];
        let root = SnapshotRoot {
            seq: 1,
            block_bytes: 4096,
            size_bytes: 64 * 4096,
            segment_blocks: 16,
            pages: vec![
                Some(PageRef {
                    object: 2,
                    offset: 0,
                    len: 56,
                }),
                None,
                None,
                None,
            ],
            packs: vec![(1, 1)],
        };
        let table = ForwardTable {
            origin: 1,
            moved: [(0, (5, 1))].into_iter().collect(),
        };
        vec![
            pack::encode(1, 4096, &[entry], &[7u8; 4096]),
            page::encode(0, &runs),
            root.encode(),
            table.encode(),
        ]
    }

    #[test]
    fn the_valid_objects_decode() {
        let objects = valid_objects();
        assert!(pack::decode_header(&objects[0], 1, 4096).is_ok());
        assert!(page::decode(&objects[1], 0, 0..64).is_ok());
        assert!(SnapshotRoot::decode(&objects[2], 1, 4096).is_ok());
        assert!(ForwardTable::decode(&objects[3], 1).is_ok());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_a_decoder(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            decode_all(&data);
        }

        #[test]
        fn changed_objects_never_panic_a_decoder(
            which in 0usize..4,
            changes in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let mut data = valid_objects().swap_remove(which);
            for (at, byte) in changes {
                let at = at % data.len();
                data[at] = byte;
            }
            decode_all(&data);
            decode_all(&data[..cut % (data.len() + 1)]);
        }
    }
}
