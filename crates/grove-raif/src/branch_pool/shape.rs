//! The shape of a branch pool: which segments its bytes are cut into,
//! where each starts and how many branches it spans, and the restripe in
//! progress. Every branch keeps a copy in its `grove.branch-shape` file;
//! the valid copy with the highest sequence on any branch is the shape.
//!
//! A pool starts as one segment over all its branches. `grove branch add`
//! freezes the last segment where it ends and opens a wider one after it,
//! so new allocation groups (the engine grows its store at the end) land
//! on the new branch too. A restripe copies a narrow segment into a new
//! one over every branch, below a watermark (`done_bytes`) that each batch
//! raises once the copy is durable; at the end the wide copy takes the
//! narrow one's place.
//!
//! The file holds two slots; a save writes the slot its sequence picks,
//! so a torn save leaves the other intact.
//!
//! ```text
//! slot at 0 and at SLOT_BYTES:
//!   0   8  magic "GROVESH1"
//!   8   8  sequence, little-endian
//!  16   4  body bytes
//!  20   4  crc32c of bytes 0..20 and the body
//!  24   .. body:
//!          4  segment count (at most SEGMENTS_MAX)
//!          per segment: 4 id, 4 width, 8 start
//!          1  1 if a restripe is in progress, else 0
//!          then if 1: 4 source segment id, 4 target segment id,
//!                     8 bytes of the source copied (the watermark)
//! ```

use std::io;
use std::sync::Arc;

use grove_store::BlockDevice;

pub const MAGIC: &[u8; 8] = b"GROVESH1";
pub const SLOT_BYTES: usize = 4096;
pub const HEADER_BYTES: usize = 24;
/// Most segments a pool is cut into: each `branch add` makes one, and a
/// restripe folds them back into one.
pub const SEGMENTS_MAX: usize = 64;
const SEGMENT_BYTES: usize = 16;
const RESTRIPE_BYTES: usize = 16;

/// One segment: bytes `start..` (up to the next segment's start) of the
/// device, laid over the first `width` branches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentShape {
    /// Names its files on each branch (`grove.branch` for 0, then
    /// `grove.branch.ID`).
    pub id: u32,
    pub width: u32,
    pub start: u64,
}

/// A restripe in progress: segment `source` copied into `target` (over
/// every branch) up to `done_bytes` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestripeShape {
    pub source: u32,
    pub target: u32,
    pub done_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// In order of `start`, the first at 0.
    pub segments: Vec<SegmentShape>,
    pub restripe: Option<RestripeShape>,
}

impl Shape {
    /// A new pool's: one segment over all `width` branches.
    pub fn single(width: usize) -> Shape {
        Shape {
            segments: vec![SegmentShape {
                id: 0,
                width: width as u32,
                start: 0,
            }],
            restripe: None,
        }
    }

    /// Why this shape cannot be a pool's over `branches` branches, if so.
    pub fn check(&self, branches: usize) -> Result<(), String> {
        if self.segments.is_empty() || self.segments.len() > SEGMENTS_MAX {
            return Err(format!(
                "{} segments (1 to {SEGMENTS_MAX} allowed)",
                self.segments.len()
            ));
        }
        if self.segments[0].start != 0 {
            return Err("the first segment does not start at 0".into());
        }
        for (i, segment) in self.segments.iter().enumerate() {
            if segment.width == 0 || segment.width as usize > branches {
                return Err(format!(
                    "segment {} spans {} branches of {branches}",
                    segment.id, segment.width
                ));
            }
            if i > 0 && segment.start < self.segments[i - 1].start {
                return Err(format!(
                    "segment {} starts before the one ahead",
                    segment.id
                ));
            }
            if self.segments[..i].iter().any(|s| s.id == segment.id) {
                return Err(format!("segment id {} is used twice", segment.id));
            }
        }
        if let Some(restripe) = &self.restripe {
            let Some(i) = self.index_of(restripe.source) else {
                return Err(format!(
                    "the restripe's source {} is no segment",
                    restripe.source
                ));
            };
            if i + 1 == self.segments.len() {
                return Err("the last segment cannot be restriped".into());
            }
            if self.index_of(restripe.target).is_some() {
                return Err(format!(
                    "the restripe's target {} is a segment already",
                    restripe.target
                ));
            }
            let length = self.segments[i + 1].start - self.segments[i].start;
            if restripe.done_bytes > length {
                return Err(format!(
                    "the restripe has copied {} bytes of a {length}-byte segment",
                    restripe.done_bytes
                ));
            }
        }
        Ok(())
    }

    pub fn index_of(&self, id: u32) -> Option<usize> {
        self.segments.iter().position(|s| s.id == id)
    }

    /// An id no segment (or restripe target) uses.
    pub fn next_id(&self) -> u32 {
        let highest = self.segments.iter().map(|s| s.id).max().unwrap_or(0);
        let target = self.restripe.map_or(0, |r| r.target);
        highest.max(target) + 1
    }
}

/// One slot's bytes for `shape` at `sequence`.
pub fn encode(sequence: u64, shape: &Shape) -> Vec<u8> {
    assert!(shape.segments.len() <= SEGMENTS_MAX, "the shape is bounded");
    let mut body =
        Vec::with_capacity(4 + shape.segments.len() * SEGMENT_BYTES + 1 + RESTRIPE_BYTES);
    body.extend_from_slice(&(shape.segments.len() as u32).to_le_bytes());
    for segment in &shape.segments {
        body.extend_from_slice(&segment.id.to_le_bytes());
        body.extend_from_slice(&segment.width.to_le_bytes());
        body.extend_from_slice(&segment.start.to_le_bytes());
    }
    match &shape.restripe {
        None => body.push(0),
        Some(restripe) => {
            body.push(1);
            body.extend_from_slice(&restripe.source.to_le_bytes());
            body.extend_from_slice(&restripe.target.to_le_bytes());
            body.extend_from_slice(&restripe.done_bytes.to_le_bytes());
        }
    }
    let mut slot = vec![0u8; SLOT_BYTES];
    slot[0..8].copy_from_slice(MAGIC);
    slot[8..16].copy_from_slice(&sequence.to_le_bytes());
    slot[16..20].copy_from_slice(&(body.len() as u32).to_le_bytes());
    let sum = crc32c::crc32c_append(crc32c::crc32c(&slot[0..20]), &body);
    slot[20..24].copy_from_slice(&sum.to_le_bytes());
    slot[HEADER_BYTES..HEADER_BYTES + body.len()].copy_from_slice(&body);
    slot
}

/// A slot's sequence and shape, or why it is not one. Never panics.
pub fn decode(slot: &[u8]) -> Result<(u64, Shape), String> {
    if slot.len() < HEADER_BYTES || &slot[0..8] != MAGIC {
        return Err("no shape here".into());
    }
    let word = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().expect("4 bytes"));
    let sequence = u64::from_le_bytes(slot[8..16].try_into().expect("8 bytes"));
    let body_len = word(16) as usize;
    if body_len > slot.len() - HEADER_BYTES {
        return Err(format!("a body of {body_len} bytes does not fit its slot"));
    }
    let body = &slot[HEADER_BYTES..HEADER_BYTES + body_len];
    if crc32c::crc32c_append(crc32c::crc32c(&slot[0..20]), body) != word(20) {
        return Err("checksum mismatch".into());
    }
    let mut reader = Reader { bytes: body, at: 0 };
    let count = reader.u32()? as usize;
    if count > SEGMENTS_MAX {
        return Err(format!("{count} segments (at most {SEGMENTS_MAX})"));
    }
    let mut segments = Vec::with_capacity(count);
    for _ in 0..count {
        segments.push(SegmentShape {
            id: reader.u32()?,
            width: reader.u32()?,
            start: reader.u64()?,
        });
    }
    let restripe = match reader.u8()? {
        0 => None,
        1 => Some(RestripeShape {
            source: reader.u32()?,
            target: reader.u32()?,
            done_bytes: reader.u64()?,
        }),
        other => return Err(format!("restripe flag {other}")),
    };
    Ok((sequence, Shape { segments, restripe }))
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| "the body ends early".to_string())?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

/// What one branch's shape file holds.
pub enum Found {
    /// Never written (a pool made before shapes, or a new branch).
    Nothing,
    Shape(u64, Shape),
    /// Written, but neither slot checks out.
    Damaged(String),
}

/// Reads a branch's shape file: the valid slot with the higher sequence.
pub fn read(device: &Arc<dyn BlockDevice>) -> io::Result<Found> {
    let len = device.len_bytes()?;
    if len == 0 {
        return Ok(Found::Nothing);
    }
    let mut best: Option<(u64, Shape)> = None;
    let mut why = String::from("the file is shorter than a slot");
    for slot in 0..2u64 {
        if len < (slot + 1) * SLOT_BYTES as u64 {
            continue;
        }
        let mut bytes = vec![0u8; SLOT_BYTES];
        device.read_at(&mut bytes, slot * SLOT_BYTES as u64)?;
        match decode(&bytes) {
            Ok((sequence, shape)) => {
                if best.as_ref().is_none_or(|(s, _)| *s < sequence) {
                    best = Some((sequence, shape));
                }
            }
            Err(e) => why = e,
        }
    }
    Ok(match best {
        Some((sequence, shape)) => Found::Shape(sequence, shape),
        None => Found::Damaged(why),
    })
}

/// Writes `shape` at `sequence` into its slot, and syncs it.
pub fn write(device: &Arc<dyn BlockDevice>, sequence: u64, shape: &Shape) -> io::Result<()> {
    let slot = sequence % 2;
    device.write_at(&encode(sequence, shape), slot * SLOT_BYTES as u64)?;
    device.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Shape {
        Shape {
            segments: vec![
                SegmentShape {
                    id: 0,
                    width: 3,
                    start: 0,
                },
                SegmentShape {
                    id: 1,
                    width: 4,
                    start: 1 << 20,
                },
            ],
            restripe: Some(RestripeShape {
                source: 0,
                target: 2,
                done_bytes: 4096,
            }),
        }
    }

    #[test]
    fn a_shape_round_trips_and_checks() {
        let shape = sample();
        assert_eq!(shape.check(4), Ok(()));
        assert_eq!(decode(&encode(7, &shape)), Ok((7, shape.clone())));
        assert!(shape.check(3).is_err(), "a segment wider than the pool");
        assert_eq!(shape.next_id(), 3);
    }

    #[test]
    fn a_flipped_bit_is_refused() {
        let bytes = encode(7, &sample());
        for at in 0..HEADER_BYTES + 40 {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(decode(&damaged).is_err(), "a flip at byte {at} went unseen");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn forged_bodies_with_matching_checksums_decode_without_a_panic(
            body in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut slot = vec![0u8; SLOT_BYTES];
            slot[0..8].copy_from_slice(MAGIC);
            slot[16..20].copy_from_slice(&(body.len() as u32).to_le_bytes());
            let sum = crc32c::crc32c_append(crc32c::crc32c(&slot[0..20]), &body);
            slot[20..24].copy_from_slice(&sum.to_le_bytes());
            slot[HEADER_BYTES..HEADER_BYTES + body.len()].copy_from_slice(&body);
            if let Ok((_, shape)) = decode(&slot) {
                let _ = shape.check(8);
            }
        }
    }
}
