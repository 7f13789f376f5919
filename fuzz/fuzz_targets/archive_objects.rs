//! Feeds arbitrary bytes to each decoder of the archive tier's objects (a
//! pack's header and slot table, an index page, an index root, a forward
//! table, a catalog), as reads of a damaged or foreign object would. Every
//! outcome is an error or an object that encodes back to the bytes it was
//! read from; none is a panic. Run with `cargo +nightly fuzz run
//! archive_objects` from this directory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    grove_archive::format::decode_every_kind(data, 0..1 << 14);
});
