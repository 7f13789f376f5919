//! Feeds arbitrary bytes to each decoder of the archive tier's objects (a
//! pack's header and slot table, an index page, an index root, a forward
//! table, a catalog), as reads of a damaged or foreign object would. Every
//! outcome is an error or an object that encodes back to the bytes it was
//! read from; none is a panic. Run with `cargo +nightly fuzz run
//! archive_objects` from this directory.
#![no_main]

use grove_archive::format::{catalog, forward::ForwardTable, index::SnapshotRoot, pack, page};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = pack::decode_header(data, 1, 4096);
    let header = pack::PackHeader {
        id: 1,
        block_bytes: 4096,
        slots: ((data.len() as u64).saturating_sub(pack::FOOTER_BYTES) / pack::TABLE_ENTRY_BYTES) as u32,
    };
    let _ = pack::decode_table(data, &header);
    if let Ok(runs) = page::decode(data, 0, 0..1 << 14) {
        assert_eq!(page::encode(0, &runs), data);
    }
    if let Ok(root) = SnapshotRoot::decode(data, 1, 4096) {
        assert_eq!(root.encode(), data);
    }
    if let Ok(table) = ForwardTable::decode(data, 1) {
        assert_eq!(table.encode(), data);
    }
    let _ = catalog::decode(data, 1);
});
