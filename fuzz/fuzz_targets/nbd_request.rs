//! Feeds arbitrary bytes to grove-nbd's decoders: transmission requests
//! (then the checks a server runs before touching data), option headers
//! and the data of NBD_OPT_GO/INFO and the meta context options. Every
//! outcome is an error or a value that encodes back to the same bytes;
//! none is a panic. Run with `cargo +nightly fuzz run nbd_request` from
//! this directory.
#![no_main]

use grove_nbd::block_status::allocation_descriptors;
use grove_nbd::codec::*;
use grove_nbd::validate::{validate_request, Negotiated, PAYLOAD_MAX_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = decode_request(data) {
        assert_eq!(&encode_request(&request)[..], data);
        // The low bits of the length also pick what was negotiated.
        let byte = data[REQUEST_BYTES - 1];
        let structured = byte & 1 != 0;
        let negotiated = Negotiated {
            size_bytes: 1 << 30,
            transmission_flags: u16::from_be_bytes([data[4], data[5]]) | FLAG_HAS_FLAGS,
            structured_replies: structured,
            meta_context: structured && byte & 2 != 0,
            payload_max_bytes: PAYLOAD_MAX_BYTES,
        };
        if validate_request(&request, &negotiated).is_ok()
            && request.command == Command::BlockStatus
        {
            // Whatever the extents, an accepted query gets a nonempty
            // answer that stays inside the request.
            let extents = [(0u64, 4096u64), (1 << 20, 1 << 20)];
            let descriptors =
                allocation_descriptors(&extents, request.offset, request.length, false, 16);
            let total: u64 = descriptors.iter().map(|d| u64::from(d.length)).sum();
            assert!(!descriptors.is_empty() && total <= u64::from(request.length));
        }
    }
    if let Ok(header) = decode_option_header(data) {
        assert_eq!(&encode_option_header(header)[..], data);
    }
    if let Ok(request) = decode_info_request(data) {
        assert_eq!(encode_info_request(&request), data);
    }
    if let Ok(request) = decode_meta_context_request(data) {
        assert_eq!(encode_meta_context_request(&request), data);
    }
    let _ = decode_chunk_header(data);
    let _ = decode_block_status_payload(data);
    let _ = decode_error_payload(data);
});
