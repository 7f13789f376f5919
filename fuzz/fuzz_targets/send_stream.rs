//! Feeds arbitrary bytes to grove-send's stream decoder, frame after
//! frame, as `grove receive` reads them. Every outcome is an error or a
//! frame that encodes back to the bytes it was read from (and whose Begin
//! checks run); none is a panic, and memory follows the frame limit, not
//! any length a frame claims. Run with `cargo +nightly fuzz run send_stream`
//! from this directory.
#![no_main]

use grove_send::format::{Frame, FrameReader, FrameWriter};
use libfuzzer_sys::fuzz_target;

/// Frames read from one input at most: each needs 9 bytes or more, so a
/// bound keeps a run short without cutting a real input.
const FRAMES_MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let mut reader = FrameReader::new(data);
    let mut consumed = 0usize;
    for _ in 0..FRAMES_MAX {
        let Ok(frame) = reader.next_frame() else {
            return;
        };
        let end = reader.bytes_read as usize;
        let mut encoded = Vec::new();
        FrameWriter::new(&mut encoded).write(&frame).unwrap();
        // A decoded frame is exactly the bytes it came from (base hints
        // past the limit are refused by the decoder, not cut).
        assert_eq!(&encoded[..], &data[consumed..end]);
        if let Frame::Begin(begin) = &frame {
            let _ = begin.check(1_800_000_000);
        }
        consumed = end;
    }
});
