//! Streams in object storage: `grove send --to URL` and `grove receive
//! --from URL`, where URL is `s3://BUCKET/PREFIX/NAME` or
//! `file:///DIR/NAME` (grove-objects stores stream NAME under the rest).
//!
//! An upload is cut into parts at frame boundaries; each part's cursor
//! says where the stream goes on after it (and which stream it is), so an
//! interrupted `grove send --to` run again sends only what is not stored.
//! A receive from stored objects that was interrupted starts again at the
//! part holding its progress, behind a header and Begin frame rebuilt from
//! what the partial receive kept.

use std::io::{self, Read, Write};

use anyhow::{bail, Result};
use grove_objects::{StreamStore, Upload};
use grove_send::format::{FrameReader, FrameWriter, FRAME_BODY_MAX, FRAME_OVERHEAD_BYTES};
use grove_send::{
    Cursor, Position, Positions, ReceiveSummary, RestartPoint, SendSummary, StreamSink,
};
use grove_store::Pool;

use crate::control::ControlClient;
use crate::stream::{self, request_fingerprint, SendArgs};

/// Environment variable: part size in bytes (tests use small parts).
const PART_SIZE_ENV: &str = "GROVE_STREAM_PART_BYTES";
/// Bytes per stored part: two multipart chunks, so that parts go up in
/// parallel chunks, yet an interrupted upload or receive repeats at most
/// one part.
const PART_BYTES_DEFAULT: u64 = 2 * grove_objects::MULTIPART_CHUNK_BYTES as u64;
/// Smallest part: room for two of the largest frames.
const PART_BYTES_MIN: u64 = 2 * (FRAME_BODY_MAX as u64 + FRAME_OVERHEAD_BYTES);

/// The store at URL's parent and the stream name (its last component).
fn open(url: &str) -> Result<(StreamStore, String)> {
    let trimmed = url.trim_end_matches('/');
    let Some((parent, name)) = trimmed.rsplit_once('/') else {
        bail!("invalid stream URL {url:?}: expected s3://BUCKET/PREFIX/NAME or file:///DIR/NAME");
    };
    if name.is_empty() || parent.ends_with(':') || parent.ends_with(":/") {
        bail!("invalid stream URL {url:?}: it names no stream (expected s3://BUCKET/PREFIX/NAME or file:///DIR/NAME)");
    }
    let part_bytes = std::env::var(PART_SIZE_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(PART_BYTES_DEFAULT)
        .max(PART_BYTES_MIN);
    let store = StreamStore::open(parent)?.with_part_size(part_bytes);
    Ok((store, name.to_string()))
}

/// Cuts the stream into parts at frame boundaries.
struct PartWriter {
    upload: Option<Upload>,
    fingerprint: [u8; 16],
    buffer: Vec<u8>,
    part_bytes: usize,
}

impl Write for PartWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl StreamSink for PartWriter {
    fn boundary(&mut self, next: Position) -> io::Result<()> {
        // Cut while one more frame still fits: a part never exceeds its size.
        let room_for_a_frame = FRAME_BODY_MAX + FRAME_OVERHEAD_BYTES as usize;
        if self.buffer.len() + room_for_a_frame > self.part_bytes {
            let cursor = Cursor {
                fingerprint: self.fingerprint,
                at: next,
            }
            .encode();
            self.put(&cursor)?;
        }
        Ok(())
    }

    fn end(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl PartWriter {
    fn put(&mut self, cursor: &[u8]) -> io::Result<()> {
        let upload = self.upload.as_mut().expect("an upload in progress");
        upload
            .put_part(&self.buffer, cursor)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.buffer.clear();
        Ok(())
    }

    /// Stores the rest (the End frame is in it) and marks the stream
    /// complete.
    fn finish(mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            let end = Position {
                section: u32::MAX,
                begun: false,
                offset: 0,
            };
            let cursor = Cursor {
                fingerprint: self.fingerprint,
                at: end,
            }
            .encode();
            self.put(&cursor)?;
        }
        self.upload
            .take()
            .expect("an upload in progress")
            .finish()?;
        Ok(())
    }
}

/// An upload of stream NAME at a URL, started or resumed.
struct Destination {
    writer: PartWriter,
    continue_at: Option<Position>,
}

/// Opens the upload at `url` for the stream `fingerprint` names: where it
/// continues, if parts of it are stored.
fn destination(url: &str, fingerprint: [u8; 16]) -> Result<Destination> {
    let (store, name) = open(url)?;
    let upload = store.upload(&name)?;
    if upload.is_complete() {
        bail!("{url} already holds a whole stream: receive it, or remove it before storing another there");
    }
    let continue_at = match upload.stored_parts().last() {
        None => None,
        Some(part) => match Cursor::decode(&part.cursor) {
            Some(stored) if stored.fingerprint == fingerprint => Some(stored.at),
            _ => bail!("{url} holds part of another stream (other snapshots): remove it or choose another name"),
        },
    };
    if continue_at.is_some() {
        eprintln!(
            "grove: {url} holds {} part(s) of this stream; sending the rest",
            upload.stored_parts().len()
        );
    }
    Ok(Destination {
        writer: PartWriter {
            upload: Some(upload),
            fingerprint,
            buffer: Vec::new(),
            part_bytes: store.part_size_bytes() as usize,
        },
        continue_at,
    })
}

/// `grove send ... --to URL` on an open pool: stores the stream, or the
/// rest of it after an interrupted run.
pub fn send_to_url(pool: &Pool, args: &SendArgs, url: &str) -> Result<SendSummary> {
    refuse_resume(args)?;
    let mut request = stream::request(pool, args)?;
    let mut destination = destination(url, request_fingerprint(pool, &request)?)?;
    request.continue_at = destination.continue_at;
    let summary = grove_send::send_to_sink(pool, &request, &mut destination.writer, &mut |_| {})?;
    destination.writer.finish()?;
    stream::move_cursor(pool, args, &summary)?;
    Ok(summary)
}

/// The same on a pool a daemon holds: the daemon sends, this process
/// stores, cutting parts where the frames it reads end.
pub fn send_to_url_through(daemon: &ControlClient, args: &SendArgs, url: &str) -> Result<()> {
    refuse_resume(args)?;
    let mut destination = destination(url, daemon.stream_fingerprint(args)?)?;
    let args = SendArgs {
        continue_at: destination.continue_at,
        ..args.clone()
    };
    let mut positions = destination
        .continue_at
        .map_or_else(Positions::new, Positions::continuing);
    let mut frames = Vec::new();
    daemon.send_stream(&args, &mut |reader| {
        let mut reader = FrameReader::new(reader);
        loop {
            let frame = reader.next_frame()?;
            frames.clear();
            let mut encoded = FrameWriter::new(&mut frames);
            encoded.write(&frame)?;
            destination.writer.write_all(&frames)?;
            match positions.advance(&frame) {
                Some(next) => destination.writer.boundary(next)?,
                None => return Ok(()),
            }
        }
    })?;
    destination.writer.finish()
}

fn refuse_resume(args: &SendArgs) -> Result<()> {
    if args.resume.is_some() {
        bail!("--resume sends to a receiver that is waiting; a stored stream resumes by running the same `grove send --to` again");
    }
    Ok(())
}

/// What to read for receiving stream `url`: from its start, or, for a
/// partial receive, from the part that holds where it stopped.
fn stored_input(url: &str, restart: Option<RestartPoint>) -> Result<Box<dyn Read + Send>> {
    let (store, stream) = open(url)?;
    let listing = store.parts(&stream)?;
    if listing.parts.is_empty() {
        bail!("{url} holds no stream");
    }
    if !listing.complete {
        eprintln!("grove: warning: {url} is not complete yet (its upload was interrupted); receiving what is there");
    }
    let Some(restart) = restart else {
        return Ok(store.reader(&stream, 0)?);
    };
    // The last part that starts inside this section at or before the
    // progress, or the part that opens the section.
    let mut first = 0u64;
    let mut inside = false;
    for (i, part) in listing.parts.iter().enumerate() {
        let Some(Cursor { at, .. }) = Cursor::decode(&part.cursor) else {
            continue;
        };
        if at.section < restart.section
            || (at.section == restart.section && (!at.begun || at.offset <= restart.progress_bytes))
        {
            first = i as u64 + 1;
            inside = at.section == restart.section && at.begun;
        }
    }
    if first >= listing.parts.len() as u64 {
        bail!("{url} does not hold the rest of this partial receive yet: finish its upload (run the same `grove send --to` again), then receive again");
    }
    eprintln!(
        "grove: resuming at {} bytes, from part {first} of {url}",
        restart.progress_bytes
    );
    let mut prefix = restart.header;
    if inside {
        prefix.extend_from_slice(&restart.begin);
    }
    Ok(Box::new(
        io::Cursor::new(prefix).chain(store.reader(&stream, first)?),
    ))
}

/// `grove receive NAME --from URL` on an open pool.
pub fn receive_from_url(pool: &Pool, name: &str, url: &str) -> Result<ReceiveSummary> {
    let restart = match pool.partial_receive(name) {
        Some(_) => Some(grove_send::restart_point(pool, name)?),
        None => None,
    };
    stream::receive_into_pool(pool, name, stored_input(url, restart)?)
}

/// The same into a pool a daemon holds.
pub fn receive_from_url_through(
    daemon: &ControlClient,
    name: &str,
    url: &str,
) -> Result<ReceiveSummary> {
    let restart = daemon.restart_point(name)?;
    daemon.receive_stream(name, stored_input(url, restart)?)
}
