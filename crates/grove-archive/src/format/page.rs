//! An index page: the runs of one segment of a volume's blocks (a fixed
//! number of blocks, the root says how many). Pages are written by pushes,
//! packed back to back in page objects (`pages-<id>`), and shared: a
//! snapshot whose segment did not change since the one before names the
//! same page. A page never changes; its object is deleted whole once no
//! kept snapshot lies in its reference range.
//!
//! ```text
//! offset  size       field
//! 0       8          magic "GRVAPAGE"
//! 8       4          format version (1)
//! 12      4          runs
//! 16      8          the segment
//! 24      4          crc32c of the runs
//! 28      4          crc32c of bytes 0..28
//! 32      24 x runs  first block u64, pack u64, first slot u32, blocks u32
//! ```

use super::runs::Run;
use super::{le_u32, le_u64};

pub const MAGIC: &[u8; 8] = b"GRVAPAGE";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 32;
pub const RUN_BYTES: usize = 24;

/// Encodes the runs of segment `segment`.
pub fn encode(segment: u64, runs: &[Run]) -> Vec<u8> {
    let mut body = Vec::with_capacity(runs.len() * RUN_BYTES);
    for run in runs {
        body.extend_from_slice(&run.first_block.to_le_bytes());
        body.extend_from_slice(&run.pack.to_le_bytes());
        body.extend_from_slice(&run.first_slot.to_le_bytes());
        body.extend_from_slice(&run.blocks.to_le_bytes());
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(runs.len())
            .expect("a segment's runs fit a u32")
            .to_le_bytes(),
    );
    out.extend_from_slice(&segment.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes the page of segment `segment`, whose runs must lie within
/// `blocks` (the segment's blocks that are inside the volume).
pub fn decode(
    bytes: &[u8],
    segment: u64,
    blocks: std::ops::Range<u64>,
) -> Result<Vec<Run>, String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!("{} bytes, shorter than a page header", bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a grove archive index page (bad magic)".into());
    }
    if le_u32(bytes, 28) != crc32c::crc32c(&bytes[..28]) {
        return Err("the page header's checksum does not match".into());
    }
    let version = le_u32(bytes, 8);
    if version != VERSION {
        return Err(format!(
            "page format version {version}, this grove reads {VERSION}"
        ));
    }
    if le_u64(bytes, 16) != segment {
        return Err(format!(
            "the page of segment {}, expected segment {segment}",
            le_u64(bytes, 16)
        ));
    }
    let body = &bytes[HEADER_BYTES..];
    let runs = le_u32(bytes, 12) as usize;
    if runs.checked_mul(RUN_BYTES) != Some(body.len()) {
        return Err(format!(
            "{runs} runs in {} bytes (a truncated page)",
            body.len()
        ));
    }
    if le_u32(bytes, 24) != crc32c::crc32c(body) {
        return Err("the page's runs fail their checksum".into());
    }
    decode_runs(body, blocks)
}

fn decode_runs(body: &[u8], blocks: std::ops::Range<u64>) -> Result<Vec<Run>, String> {
    let mut out = Vec::with_capacity(body.len() / RUN_BYTES);
    let mut end = blocks.start;
    for at in (0..body.len()).step_by(RUN_BYTES) {
        let run = Run {
            first_block: le_u64(body, at),
            pack: le_u64(body, at + 8),
            first_slot: le_u32(body, at + 16),
            blocks: le_u32(body, at + 20),
        };
        let run_end = run.first_block.checked_add(u64::from(run.blocks));
        if run.blocks == 0 || run.first_block < end || run_end.is_none_or(|e| e > blocks.end) {
            return Err(format!(
                "run at block {} is empty, out of order or outside its segment",
                run.first_block
            ));
        }
        if u64::from(run.first_slot) + u64::from(run.blocks) > u64::from(u32::MAX) {
            return Err(format!(
                "run at block {} has slots past any pack",
                run.first_block
            ));
        }
        end = run.end_block();
        out.push(run);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let runs = vec![
            Run {
                first_block: 100,
                pack: 1,
                first_slot: 0,
                blocks: 10,
            },
            Run {
                first_block: 120,
                pack: 2,
                first_slot: 5,
                blocks: 3,
            },
        ];
        let bytes = encode(1, &runs);
        assert_eq!(decode(&bytes, 1, 100..200).unwrap(), runs);
        assert!(
            decode(&bytes, 2, 100..200).is_err(),
            "another segment's page"
        );
        assert!(
            decode(&bytes, 1, 110..200).is_err(),
            "a run outside its segment"
        );
        assert!(
            decode(&bytes, 1, 100..122).is_err(),
            "a run past the volume"
        );
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len], 1, 100..200).is_err(),
                "truncated at {len}"
            );
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, 1, 100..200).is_err(), "flip at {at}");
        }
    }
}
