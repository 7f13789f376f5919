//! The replication stream's bytes. A stream is a sequence of frames:
//!
//!   stream  := Header Section+ End
//!   section := Begin (Data | Zero | Hole)* Finish
//!
//! Every frame is `[type u8][body length u32][body][crc32c u32]`, the
//! checksum covering type, length and body, so a damaged frame is caught
//! where it is and never applied. Integers are little-endian. Records
//! (Data, Zero, Hole) lie in strictly increasing, non-overlapping offset
//! order, aligned to `UNIT_BYTES` (the last may end at the volume's end),
//! so that a reordered stream is refused and a resumed one can start at
//! any record boundary. Finish carries a digest of the target's whole
//! content (`digest.rs`), which catches a dropped record too.
//!
//! Frame bodies (offsets within the body):
//!
//!   Header (type 1)
//!     0   16  magic "grove-stream\0\0\0\0"
//!     16  4   version (2: the content digest of `digest.rs` v2)
//!     20  4   flags: bit 0 = range (every snapshot between base and target),
//!             bit 1 = resumed (the first section continues a partial receive)
//!     24  4   section count
//!     28  8   resumed offset: bytes of the first section's target the
//!             receiver already holds (records start there)
//!     36  16  final target GUID: the stream's last snapshot
//!     52  2   base hints: count, then per hint 16 GUID, 1 name length, name
//!             (earlier snapshots of the target's line, newest first: what
//!             a receiver missing the base could be sent from instead)
//!   Begin (type 2)
//!     0   4   section index
//!     4   16  base GUID (zero for a full stream)
//!     20  8   base generation
//!     28  16  target GUID
//!     44  8   target generation
//!     52  8   target created, unix seconds
//!     60  8   volume size in bytes (a multiple of 512)
//!     68  4   sender's block size
//!     72  16  resume tag (authenticates resume tokens; `token.rs`)
//!     88  1+n target name; then 1+n base name
//!   Data (type 3): 0 offset u64, 8.. the bytes (at most DATA_BYTES_MAX)
//!   Zero (type 4): 0 offset u64, 8 length u64 (data that is all zeros)
//!   Hole (type 5): 0 offset u64, 8 length u64 (nothing mapped)
//!   Finish (type 6): 0 content digest (32), 32 data bytes u64, 40 zero
//!     bytes u64, 48 hole bytes u64 (what this section carried)
//!   End (type 7): 0 section count u32, 4 magic "grove-end"

use std::io::{self, Read, Write};

/// First bytes of every stream.
pub const STREAM_MAGIC: [u8; 16] = *b"grove-stream\0\0\0\0";
/// Last bytes of every stream's End frame.
pub const END_MAGIC: [u8; 9] = *b"grove-end";
/// Version of the stream format this build writes and reads.
pub const STREAM_VERSION: u32 = 2;
/// Records are aligned to this, the content digest's unit.
pub const UNIT_BYTES: u64 = 4096;
/// Most bytes one Data frame carries.
pub const DATA_BYTES_MAX: usize = 1 << 20;
/// Longest frame body: a Data frame's offset and bytes.
pub const FRAME_BODY_MAX: usize = DATA_BYTES_MAX + 8;
/// Most base hints in a header.
pub const BASE_HINTS_MAX: usize = 16;
/// Bytes a frame adds around its body.
pub const FRAME_OVERHEAD_BYTES: u64 = 9;

const TYPE_HEADER: u8 = 1;
const TYPE_BEGIN: u8 = 2;
const TYPE_DATA: u8 = 3;
const TYPE_ZERO: u8 = 4;
const TYPE_HOLE: u8 = 5;
const TYPE_FINISH: u8 = 6;
const TYPE_END: u8 = 7;

/// The stream's first frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub range: bool,
    pub resumed: bool,
    pub sections: u32,
    pub resumed_offset: u64,
    pub final_target: [u8; 16],
    pub base_hints: Vec<([u8; 16], String)>,
}

/// Opens one snapshot's section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Begin {
    pub section: u32,
    /// None for a full stream.
    pub base_guid: Option<[u8; 16]>,
    pub base_generation: u64,
    pub target_guid: [u8; 16],
    pub target_generation: u64,
    pub target_created_unix_secs: u64,
    pub size_bytes: u64,
    pub block_size_bytes: u32,
    pub resume_tag: [u8; 16],
    pub target_name: String,
    pub base_name: String,
}

/// How far past the receiver's clock a snapshot's creation time may lie:
/// clocks of two hosts disagree, but not by a day.
pub const CREATED_AHEAD_SECS_MAX: u64 = 24 * 3600;

impl Begin {
    /// Checks the fields a decoder cannot judge alone against what a pool
    /// can take and the receiver's clock (`now_unix_secs`); the error names
    /// the field. A forged creation time would sort the snapshot wrongly
    /// for retention, and a forged block size is no pool's.
    pub fn check(&self, now_unix_secs: u64) -> Result<(), String> {
        use grove_store::types::{
            is_valid_block_size, BLOCK_SIZE_MAX_BYTES, BLOCK_SIZE_MIN_BYTES, VOLUME_SIZE_MAX_BYTES,
        };
        if !is_valid_block_size(self.block_size_bytes) {
            return Err(format!(
                "its block size is {} bytes, not a power of two from {BLOCK_SIZE_MIN_BYTES} to {BLOCK_SIZE_MAX_BYTES}",
                self.block_size_bytes
            ));
        }
        if self.size_bytes > VOLUME_SIZE_MAX_BYTES {
            return Err(format!(
                "its volume size is {} bytes, past the largest volume ({VOLUME_SIZE_MAX_BYTES})",
                self.size_bytes
            ));
        }
        let latest = now_unix_secs.saturating_add(CREATED_AHEAD_SECS_MAX);
        if self.target_created_unix_secs > latest {
            return Err(format!(
                "its creation time is {} (Unix seconds), more than a day past this host's clock ({now_unix_secs})",
                self.target_created_unix_secs
            ));
        }
        if self.target_guid == [0; 16] {
            return Err("its snapshot GUID is all zeros".into());
        }
        Ok(())
    }
}

/// Closes a section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    pub content_digest: [u8; 32],
    pub data_bytes: u64,
    pub zero_bytes: u64,
    pub hole_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Header(Header),
    Begin(Begin),
    Data { offset: u64, bytes: Vec<u8> },
    Zero { offset: u64, length: u64 },
    Hole { offset: u64, length: u64 },
    Finish(Finish),
    End { sections: u32 },
}

impl Frame {
    /// The byte range a record covers.
    pub fn extent(&self) -> Option<(u64, u64)> {
        match self {
            Frame::Data { offset, bytes } => Some((*offset, bytes.len() as u64)),
            Frame::Zero { offset, length } | Frame::Hole { offset, length } => {
                Some((*offset, *length))
            }
            _ => None,
        }
    }
}

/// A place between two frames of a stream, as an upload's parts record
/// where they end: `begun` is false before section `section`'s Begin
/// frame, true after the records of that section that end at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub section: u32,
    pub begun: bool,
    pub offset: u64,
}

/// Follows a stream frame by frame and says where it stands after each:
/// the one place that knows how frames move a stream's position.
#[derive(Clone, Debug)]
pub struct Positions {
    at: Position,
    /// Where the first section's records start in a resumed stream.
    resumed_offset: Option<u64>,
}

impl Positions {
    /// A stream from its start.
    pub fn new() -> Positions {
        Positions::continuing(Position {
            section: 0,
            begun: false,
            offset: 0,
        })
    }

    /// A stream's bytes from `at` on.
    pub fn continuing(at: Position) -> Positions {
        Positions {
            at,
            resumed_offset: None,
        }
    }

    /// The position after `frame`; None after the End frame.
    pub fn advance(&mut self, frame: &Frame) -> Option<Position> {
        match frame {
            Frame::Header(h) => {
                self.resumed_offset = h.resumed.then_some(h.resumed_offset);
            }
            Frame::Begin(b) => {
                self.at = Position {
                    section: b.section,
                    begun: true,
                    offset: self.resumed_offset.take().unwrap_or(0),
                };
            }
            Frame::Data { .. } | Frame::Zero { .. } | Frame::Hole { .. } => {
                let (offset, length) = frame.extent().expect("a record");
                self.at.offset = offset + length;
            }
            Frame::Finish(_) => {
                self.at = Position {
                    section: self.at.section + 1,
                    begun: false,
                    offset: 0,
                };
            }
            Frame::End { .. } => return None,
        }
        Some(self.at)
    }
}

impl Default for Positions {
    fn default() -> Self {
        Positions::new()
    }
}

/// Writes frames, counting the bytes.
pub struct FrameWriter<W: Write> {
    out: W,
    pub bytes_written: u64,
    scratch: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    pub fn new(out: W) -> Self {
        FrameWriter {
            out,
            bytes_written: 0,
            scratch: Vec::new(),
        }
    }

    pub fn write(&mut self, frame: &Frame) -> io::Result<()> {
        self.scratch.clear();
        let kind = encode_body(frame, &mut self.scratch);
        debug_assert!(self.scratch.len() <= FRAME_BODY_MAX);
        let mut head = [0u8; 5];
        head[0] = kind;
        head[1..5].copy_from_slice(&(self.scratch.len() as u32).to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head), &self.scratch);
        self.out.write_all(&head)?;
        self.out.write_all(&self.scratch)?;
        self.out.write_all(&crc.to_le_bytes())?;
        self.bytes_written += FRAME_OVERHEAD_BYTES + self.scratch.len() as u64;
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    pub fn inner(&mut self) -> &mut W {
        &mut self.out
    }
}

fn encode_body(frame: &Frame, out: &mut Vec<u8>) -> u8 {
    match frame {
        Frame::Header(h) => {
            out.extend_from_slice(&STREAM_MAGIC);
            out.extend_from_slice(&STREAM_VERSION.to_le_bytes());
            let flags = u32::from(h.range) | u32::from(h.resumed) << 1;
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&h.sections.to_le_bytes());
            out.extend_from_slice(&h.resumed_offset.to_le_bytes());
            out.extend_from_slice(&h.final_target);
            let hints = &h.base_hints[..h.base_hints.len().min(BASE_HINTS_MAX)];
            out.extend_from_slice(&(hints.len() as u16).to_le_bytes());
            for (guid, name) in hints {
                out.extend_from_slice(guid);
                put_name(out, name);
            }
            TYPE_HEADER
        }
        Frame::Begin(b) => {
            out.extend_from_slice(&b.section.to_le_bytes());
            out.extend_from_slice(&b.base_guid.unwrap_or([0; 16]));
            out.extend_from_slice(&b.base_generation.to_le_bytes());
            out.extend_from_slice(&b.target_guid);
            out.extend_from_slice(&b.target_generation.to_le_bytes());
            out.extend_from_slice(&b.target_created_unix_secs.to_le_bytes());
            out.extend_from_slice(&b.size_bytes.to_le_bytes());
            out.extend_from_slice(&b.block_size_bytes.to_le_bytes());
            out.extend_from_slice(&b.resume_tag);
            put_name(out, &b.target_name);
            put_name(out, &b.base_name);
            TYPE_BEGIN
        }
        Frame::Data { offset, bytes } => {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(bytes);
            TYPE_DATA
        }
        Frame::Zero { offset, length } => {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&length.to_le_bytes());
            TYPE_ZERO
        }
        Frame::Hole { offset, length } => {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&length.to_le_bytes());
            TYPE_HOLE
        }
        Frame::Finish(f) => {
            out.extend_from_slice(&f.content_digest);
            out.extend_from_slice(&f.data_bytes.to_le_bytes());
            out.extend_from_slice(&f.zero_bytes.to_le_bytes());
            out.extend_from_slice(&f.hole_bytes.to_le_bytes());
            TYPE_FINISH
        }
        Frame::End { sections } => {
            out.extend_from_slice(&sections.to_le_bytes());
            out.extend_from_slice(&END_MAGIC);
            TYPE_END
        }
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    let bytes = &name.as_bytes()[..name.len().min(255)];
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

/// Why a stream cannot be read on.
#[derive(Debug)]
pub enum StreamError {
    /// The input ended before the stream did.
    Truncated {
        at_byte: u64,
    },
    /// A frame is damaged or impossible.
    Damaged {
        at_byte: u64,
        why: String,
    },
    Io(io::Error),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Truncated { at_byte } => {
                write!(f, "the stream ends early, after {at_byte} bytes")
            }
            StreamError::Damaged { at_byte, why } => {
                write!(f, "the stream is damaged at byte {at_byte}: {why}")
            }
            StreamError::Io(e) => write!(f, "cannot read the stream: {e}"),
        }
    }
}

impl std::error::Error for StreamError {}

/// Reads frames, checking each frame's checksum and fields. Never panics
/// on input.
pub struct FrameReader<R: Read> {
    input: R,
    pub bytes_read: u64,
    body: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    pub fn new(input: R) -> Self {
        FrameReader {
            input,
            bytes_read: 0,
            body: Vec::new(),
        }
    }

    /// The next frame, or Truncated at the end of the input.
    pub fn next_frame(&mut self) -> Result<Frame, StreamError> {
        let at_byte = self.bytes_read;
        let mut head = [0u8; 5];
        self.read_exact(&mut head, at_byte)?;
        let kind = head[0];
        let length = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
        let damaged = |why: String| StreamError::Damaged { at_byte, why };
        if length > FRAME_BODY_MAX {
            return Err(damaged(format!("a frame of {length} bytes")));
        }
        self.body.resize(length, 0);
        let mut body = std::mem::take(&mut self.body);
        let read = self.read_exact(&mut body, at_byte);
        let mut crc = [0u8; 4];
        let read = read.and_then(|()| self.read_exact(&mut crc, at_byte));
        self.body = body;
        read?;
        let computed = crc32c::crc32c_append(crc32c::crc32c(&head), &self.body);
        if computed != u32::from_le_bytes(crc) {
            return Err(damaged(format!(
                "frame checksum mismatch (frame type {kind}, {length} bytes)"
            )));
        }
        decode_body(kind, &self.body).map_err(damaged)
    }

    fn read_exact(&mut self, buf: &mut [u8], frame_start: u64) -> Result<(), StreamError> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.input.read(&mut buf[filled..]) {
                Ok(0) => {
                    return Err(StreamError::Truncated {
                        at_byte: frame_start,
                    })
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(StreamError::Io(e)),
            }
        }
        self.bytes_read += buf.len() as u64;
        Ok(())
    }
}

/// A cursor over a frame body that fails instead of panicking.
struct Fields<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.body.len());
        let end = end.ok_or_else(|| "a frame shorter than its fields".to_string())?;
        let out = &self.body[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn guid(&mut self) -> Result<[u8; 16], String> {
        Ok(self.take(16)?.try_into().expect("16"))
    }
    fn name(&mut self) -> Result<String, String> {
        let len = usize::from(self.take(1)?[0]);
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| "a name that is not UTF-8".into())
    }
    fn rest(&mut self) -> &'a [u8] {
        let out = &self.body[self.at..];
        self.at = self.body.len();
        out
    }
    fn done(&self) -> Result<(), String> {
        if self.at == self.body.len() {
            Ok(())
        } else {
            Err("a frame longer than its fields".into())
        }
    }
}

fn decode_body(kind: u8, body: &[u8]) -> Result<Frame, String> {
    let mut f = Fields { body, at: 0 };
    let frame = match kind {
        TYPE_HEADER => Frame::Header(decode_header(&mut f)?),
        TYPE_BEGIN => Frame::Begin(decode_begin(&mut f)?),
        TYPE_DATA => {
            let offset = f.u64()?;
            let bytes = f.rest().to_vec();
            if bytes.is_empty() {
                return Err("an empty data record".into());
            }
            Frame::Data { offset, bytes }
        }
        TYPE_ZERO | TYPE_HOLE => {
            let offset = f.u64()?;
            let length = f.u64()?;
            if length == 0 {
                return Err("an empty record".into());
            }
            if kind == TYPE_ZERO {
                Frame::Zero { offset, length }
            } else {
                Frame::Hole { offset, length }
            }
        }
        TYPE_FINISH => Frame::Finish(Finish {
            content_digest: f.take(32)?.try_into().expect("32"),
            data_bytes: f.u64()?,
            zero_bytes: f.u64()?,
            hole_bytes: f.u64()?,
        }),
        TYPE_END => {
            let sections = f.u32()?;
            if f.take(END_MAGIC.len())? != END_MAGIC {
                return Err("an end frame without its magic".into());
            }
            Frame::End { sections }
        }
        other => return Err(format!("unknown frame type {other}")),
    };
    f.done()?;
    Ok(frame)
}

fn decode_header(f: &mut Fields) -> Result<Header, String> {
    if f.take(16)? != STREAM_MAGIC {
        return Err("not a grove stream (no magic)".into());
    }
    let version = f.u32()?;
    if version != STREAM_VERSION {
        return Err(format!(
            "stream format version {version}; this grove reads version {STREAM_VERSION}"
        ));
    }
    let flags = f.u32()?;
    if flags & !3 != 0 {
        return Err(format!("unknown header flags {flags:#x}"));
    }
    let sections = f.u32()?;
    if sections == 0 {
        return Err("a stream of no sections".into());
    }
    let resumed_offset = f.u64()?;
    let final_target = f.guid()?;
    let count = usize::from(f.u16()?);
    if count > BASE_HINTS_MAX {
        return Err(format!("{count} base hints"));
    }
    let mut base_hints = Vec::with_capacity(count);
    for _ in 0..count {
        let guid = f.guid()?;
        base_hints.push((guid, f.name()?));
    }
    Ok(Header {
        range: flags & 1 != 0,
        resumed: flags & 2 != 0,
        sections,
        resumed_offset,
        final_target,
        base_hints,
    })
}

fn decode_begin(f: &mut Fields) -> Result<Begin, String> {
    let section = f.u32()?;
    let base_guid = Some(f.guid()?).filter(|g| g != &[0; 16]);
    let base_generation = f.u64()?;
    let target_guid = f.guid()?;
    let target_generation = f.u64()?;
    let target_created_unix_secs = f.u64()?;
    let size_bytes = f.u64()?;
    let block_size_bytes = f.u32()?;
    let resume_tag = f.guid()?;
    let target_name = f.name()?;
    let base_name = f.name()?;
    if size_bytes == 0 || size_bytes % 512 != 0 {
        return Err(format!("a volume of {size_bytes} bytes"));
    }
    Ok(Begin {
        section,
        base_guid,
        base_generation,
        target_guid,
        target_generation,
        target_created_unix_secs,
        size_bytes,
        block_size_bytes,
        resume_tag,
        target_name,
        base_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_frames() -> Vec<Frame> {
        vec![
            Frame::Header(Header {
                range: true,
                resumed: true,
                sections: 3,
                resumed_offset: 8192,
                final_target: [8; 16],
                base_hints: vec![([7; 16], "vm@1".into())],
            }),
            Frame::Begin(Begin {
                section: 2,
                base_guid: Some([1; 16]),
                base_generation: 5,
                target_guid: [2; 16],
                target_generation: 9,
                target_created_unix_secs: 1_700_000_000,
                size_bytes: 1 << 30,
                block_size_bytes: 4096,
                resume_tag: [3; 16],
                target_name: "vm@2".into(),
                base_name: "vm@1".into(),
            }),
            Frame::Data {
                offset: 4096,
                bytes: vec![0xab; 8192],
            },
            Frame::Zero {
                offset: 16384,
                length: 4096,
            },
            Frame::Hole {
                offset: 1 << 20,
                length: 1 << 20,
            },
            Frame::Finish(Finish {
                content_digest: [9; 32],
                data_bytes: 8192,
                zero_bytes: 4096,
                hole_bytes: 1 << 20,
            }),
            Frame::End { sections: 1 },
        ]
    }

    fn encode(frames: &[Frame]) -> Vec<u8> {
        let mut writer = FrameWriter::new(Vec::new());
        for frame in frames {
            writer.write(frame).unwrap();
        }
        writer.into_inner()
    }

    #[test]
    fn every_frame_round_trips() {
        let frames = sample_frames();
        let bytes = encode(&frames);
        let mut reader = FrameReader::new(&bytes[..]);
        for frame in &frames {
            assert_eq!(&reader.next_frame().unwrap(), frame);
        }
        assert!(matches!(
            reader.next_frame(),
            Err(StreamError::Truncated { .. })
        ));
        assert_eq!(reader.bytes_read, bytes.len() as u64);
    }

    #[test]
    fn every_flipped_bit_and_every_cut_is_caught() {
        let bytes = encode(&sample_frames());
        for bit in (0..bytes.len() * 8).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            let mut reader = FrameReader::new(&damaged[..]);
            let mut decoded = Vec::new();
            let error = loop {
                match reader.next_frame() {
                    Ok(frame) => decoded.push(frame),
                    Err(e) => break e,
                }
            };
            assert!(
                decoded.len() < sample_frames().len(),
                "bit {bit}: every frame decoded"
            );
            assert!(!matches!(error, StreamError::Io(_)));
        }
        for cut in 0..bytes.len() {
            let mut reader = FrameReader::new(&bytes[..cut]);
            let mut frames = 0;
            while reader.next_frame().is_ok() {
                frames += 1;
            }
            assert!(frames < sample_frames().len(), "cut at {cut}");
        }
    }

    proptest::proptest! {
        /// Whatever the bytes, reading them ends in frames and an error,
        /// never a panic.
        #[test]
        fn any_bytes_read_without_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let mut reader = FrameReader::new(&bytes[..]);
            for _ in 0..bytes.len() + 1 {
                if reader.next_frame().is_err() {
                    break;
                }
            }
        }

        /// The same for bytes that start as a real stream and go wrong.
        #[test]
        fn a_stream_with_any_tail_reads_without_a_panic(
            cut in 0usize..2000,
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            let mut bytes = encode(&sample_frames());
            bytes.truncate(cut.min(bytes.len()));
            bytes.extend_from_slice(&tail);
            let mut reader = FrameReader::new(&bytes[..]);
            while reader.next_frame().is_ok() {}
        }
    }

    #[test]
    fn oversized_and_unknown_frames_are_refused() {
        let mut bytes = vec![3u8];
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let error = FrameReader::new(&bytes[..]).next_frame().unwrap_err();
        assert!(error.to_string().contains("a frame of"), "{error}");
        let mut frame = vec![42u8, 0, 0, 0, 0];
        let crc = crc32c::crc32c(&frame);
        frame.extend_from_slice(&crc.to_le_bytes());
        let error = FrameReader::new(&frame[..]).next_frame().unwrap_err();
        assert!(
            error.to_string().contains("unknown frame type 42"),
            "{error}"
        );
    }
}
