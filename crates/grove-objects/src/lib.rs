//! grove's replication streams stored as objects, behind a synchronous API.
//!
//! A store is `s3://BUCKET/PREFIX` (any S3 service: radosgw, AWS, ...) or
//! `file:///DIR` (a local directory, no server). A stream is a sequence of
//! parts, each an object written whole, plus a create-only marker once it is
//! finished. The objects of stream NAME, under PREFIX/NAME/ (or DIR/NAME/):
//!
//! ```text
//! part-<index:08>-<cursor hex>   one part: its bytes; the caller's cursor (where the
//!                                stream goes on after this part) is in the name, so one
//!                                listing gives every part's index, size and cursor
//! multipart-<index:08>           while part <index> is stored by a multipart upload:
//!                                "<part object name>\n<upload id>\n", written before
//!                                the first chunk, removed once the upload is completed
//!                                or aborted; a writer killed meanwhile leaves it, and
//!                                the next upload() or remove() aborts that upload
//! complete                       written create-only by Upload::finish:
//!                                "grove-objects stream\nparts <n>\nbytes <total>\n"
//! ```
//!
//! A part of at most [`MULTIPART_CHUNK_BYTES`] is one PUT; a bigger one is a
//! multipart upload of chunks of that size, aborted on every error path.
//! Parts are numbered from 0 without gaps; a listing with a gap, or a
//! complete marker that disagrees with the parts, is [`ErrorKind::Corrupt`].
//! One writer per stream at a time: two concurrent uploads of the same stream
//! are not detected. A writer killed in the one request between starting a
//! multipart upload and recording its id leaves an upload nothing records;
//! on S3 a bucket lifecycle rule (AbortIncompleteMultipartUpload) reaps those.
//!
//! tokio and object_store stay inside: an S3 store owns a private runtime.

mod backend;
mod error;
mod file;
mod folders;
mod location;
mod names;
mod s3;
mod s3_client;
mod s3_put;

pub use error::{Error, ErrorKind, Result};
pub use folders::{FolderStore, ObjectEntry, ObjectWriter};
pub use names::STREAM_NAME_MAX_BYTES;

use names::check_name;

use backend::{Backend, Entry};
use location::Location;
use std::io::{self, Read};
use std::sync::mpsc;
use std::sync::Arc;

/// The largest part by default.
pub const DEFAULT_PART_SIZE_BYTES: u64 = 64 << 20;
/// A part bigger than this is stored by a multipart upload of chunks of
/// this size (S3 wants at least 5 MiB per chunk but the last).
pub const MULTIPART_CHUNK_BYTES: usize = 8 << 20;
/// Chunks of one multipart upload sent at the same time.
const MULTIPART_CHUNKS_IN_FLIGHT: usize = 4;
/// The reader fetches parts in ranges of this size, one ahead of the caller.
const READ_CHUNK_BYTES: u64 = 8 << 20;
/// The longest cursor a part may carry (it is in the object's name, in hex).
pub const CURSOR_MAX_BYTES: usize = 128;
/// The complete marker's name within a stream.
const COMPLETE_NAME: &str = "complete";
const PART_PREFIX: &str = "part-";
const MULTIPART_PREFIX: &str = "multipart-";
/// The complete marker's first line.
const COMPLETE_MAGIC: &str = "grove-objects stream";

/// One stored part of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    pub index: u64,
    pub size_bytes: u64,
    /// The caller's cursor, as given to [`Upload::put_part`].
    pub cursor: Vec<u8>,
}

/// A stream's parts, in order, and whether it was finished.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamListing {
    pub parts: Vec<PartInfo>,
    pub complete: bool,
}

impl StreamListing {
    /// The bytes of all parts.
    pub fn size_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.size_bytes).sum()
    }
}

fn part_name(index: u64, cursor: &[u8]) -> String {
    format!("{PART_PREFIX}{index:08}-{}", hex::encode(cursor))
}

/// What one listing of a stream found.
struct Scan {
    /// Parts by index, unchecked.
    parts: Vec<(PartInfo, String)>,
    /// Recorded multipart uploads: marker names.
    multiparts: Vec<String>,
    complete: bool,
    /// Every object's name.
    all: Vec<String>,
}

fn scan(entries: Vec<Entry>) -> Scan {
    let mut scan = Scan {
        parts: Vec::new(),
        multiparts: Vec::new(),
        complete: false,
        all: Vec::new(),
    };
    for entry in entries {
        if entry.name == COMPLETE_NAME {
            scan.complete = true;
        } else if entry.name.starts_with(MULTIPART_PREFIX) {
            scan.multiparts.push(entry.name.clone());
        } else if let Some(rest) = entry.name.strip_prefix(PART_PREFIX) {
            let parsed = rest.split_once('-').and_then(|(index, cursor)| {
                Some((index.parse::<u64>().ok()?, hex::decode(cursor).ok()?))
            });
            if let Some((index, cursor)) = parsed {
                scan.parts.push((
                    PartInfo {
                        index,
                        size_bytes: entry.size_bytes,
                        cursor,
                    },
                    entry.name.clone(),
                ));
            }
        }
        scan.all.push(entry.name);
    }
    scan.parts.sort_by_key(|(p, _)| p.index);
    scan
}

/// Where streams are stored: `s3://BUCKET/PREFIX` or `file:///DIR`.
///
/// S3's endpoint and credentials come from AWS_ENDPOINT_URL (or
/// AWS_ENDPOINT; AWS itself when unset), AWS_ACCESS_KEY_ID,
/// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (optional) and AWS_REGION (or
/// AWS_DEFAULT_REGION; us-east-1 by default). Requests are path-style; plain
/// http is allowed when the endpoint's host is on the loopback (or with
/// AWS_ALLOW_HTTP=true). A directory is created if missing.
///
/// Methods may be called from several threads at once.
pub struct StreamStore {
    backend: Arc<dyn Backend>,
    part_size_bytes: u64,
    /// Test hook: a multipart upload stops for good after this many chunks.
    stall_after_chunks: Option<usize>,
}

impl std::fmt::Debug for StreamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamStore")
            .field("store", &self.describe())
            .finish()
    }
}

impl StreamStore {
    /// Opens the store at `url`. Refuses malformed URLs
    /// ([`ErrorKind::InvalidUrl`]) and missing credentials
    /// ([`ErrorKind::Config`]) in one line; makes no request to S3.
    pub fn open(url: &str) -> Result<StreamStore> {
        let backend: Arc<dyn Backend> = match location::parse(url)? {
            Location::S3 { bucket, prefix } => {
                Arc::new(s3_client::S3Backend::from_env(url, bucket, prefix)?)
            }
            Location::File { dir } => Arc::new(file::FileBackend::open(dir)?),
        };
        Ok(StreamStore {
            backend,
            part_size_bytes: DEFAULT_PART_SIZE_BYTES,
            stall_after_chunks: None,
        })
    }

    /// The largest part [`Upload::put_part`] takes (default
    /// [`DEFAULT_PART_SIZE_BYTES`]; tests use smaller ones).
    pub fn with_part_size(mut self, part_size_bytes: u64) -> StreamStore {
        assert!(part_size_bytes > 0, "a part size of zero");
        self.part_size_bytes = part_size_bytes;
        self
    }

    /// The largest part.
    pub fn part_size_bytes(&self) -> u64 {
        self.part_size_bytes
    }

    /// Test hook: every multipart upload stops for good (sleeps) after
    /// storing this many chunks, having printed a line on stderr, so that a
    /// test can kill the process there.
    #[doc(hidden)]
    pub fn stall_multipart_after_chunks(&mut self, chunks: usize) {
        self.stall_after_chunks = Some(chunks);
    }

    /// The store, for messages: "s3://bucket/prefix at http://127.0.0.1:7480"
    /// or "file:///dir".
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    fn check_stream_name(&self, name: &str) -> Result<()> {
        check_name(name).map_err(|why| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("bad stream name {name:?}: {why}"),
            )
        })
    }

    fn scan(&self, name: &str) -> Result<Scan> {
        self.check_stream_name(name)?;
        Ok(scan(self.backend.list(name)?))
    }

    /// The parts of a listing, checked: numbered 0, 1, ... without gaps;
    /// a complete stream's marker agrees with them.
    fn checked(&self, name: &str, scan: &Scan) -> Result<StreamListing> {
        let corrupt = |why: String| {
            Error::new(
                ErrorKind::Corrupt,
                format!("stream {name} in {}: {why}", self.describe()),
            )
        };
        for (expected, (part, _)) in scan.parts.iter().enumerate() {
            if part.index != expected as u64 {
                return Err(corrupt(if part.index < expected as u64 {
                    format!("two objects for part {}", part.index)
                } else {
                    format!("part {expected} is missing (part {} follows)", part.index)
                }));
            }
        }
        let listing = StreamListing {
            parts: scan.parts.iter().map(|(p, _)| p.clone()).collect(),
            complete: scan.complete,
        };
        if scan.complete {
            let marker = self.backend.get(&format!("{name}/{COMPLETE_NAME}"))?;
            let expected = complete_marker(&listing.parts);
            if marker != expected.as_bytes() {
                return Err(corrupt(format!(
                    "the complete marker says {:?}, the parts make {:?}",
                    String::from_utf8_lossy(&marker).replace('\n', " "),
                    expected.replace('\n', " ")
                )));
            }
        }
        Ok(listing)
    }

    /// Aborts the multipart uploads recorded for stream `name` (left by a
    /// writer that was killed) and removes their markers.
    fn abort_recorded(&self, name: &str, scan: &Scan) -> Result<()> {
        for marker in &scan.multiparts {
            let key = format!("{name}/{marker}");
            let content = match self.backend.get(&key) {
                Ok(content) => content,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let content = String::from_utf8_lossy(&content).into_owned();
            let mut lines = content.lines();
            if let (Some(object), Some(id)) = (lines.next(), lines.next()) {
                if check_name(object).is_ok() {
                    self.backend
                        .multipart_abort(&format!("{name}/{object}"), id)?;
                }
            }
            self.backend.delete(&[key])?;
        }
        Ok(())
    }

    /// Starts or resumes storing stream `name`: parts already stored are
    /// kept ([`Upload::stored_parts`]); a multipart upload left by a writer
    /// that was killed is aborted first.
    pub fn upload(&self, name: &str) -> Result<Upload> {
        let scan = self.scan(name)?;
        self.abort_recorded(name, &scan)?;
        self.backend.clean_stream(name)?;
        let listing = self.checked(name, &scan)?;
        Ok(Upload {
            backend: Arc::clone(&self.backend),
            part_size_bytes: self.part_size_bytes,
            stall_after_chunks: self.stall_after_chunks,
            name: name.to_string(),
            listing,
        })
    }

    /// The parts of stream `name`, in order, and whether it is complete,
    /// from one listing (and, for a complete stream, its small marker). A
    /// stream with no object lists empty.
    pub fn parts(&self, name: &str) -> Result<StreamListing> {
        let scan = self.scan(name)?;
        self.checked(name, &scan)
    }

    /// The object name of part `index` of stream `name`.
    fn part_object(&self, name: &str, index: u64) -> Result<(PartInfo, String)> {
        let scan = self.scan(name)?;
        self.checked(name, &scan)?;
        scan.parts
            .into_iter()
            .find(|(p, _)| p.index == index)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("stream {name} in {} has no part {index}", self.describe()),
                )
            })
    }

    /// The bytes of part `index` of stream `name`.
    pub fn read_part(&self, name: &str, index: u64) -> Result<Vec<u8>> {
        let (part, object) = self.part_object(name, index)?;
        let bytes = self.backend.get(&format!("{name}/{object}"))?;
        if bytes.len() as u64 != part.size_bytes {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "stream {name} part {index}: read {} bytes, listed {}",
                    bytes.len(),
                    part.size_bytes
                ),
            ));
        }
        Ok(bytes)
    }

    /// A reader over the bytes of the parts of stream `name` from
    /// `first_index` on, in order, as they were listed when it was made. A
    /// background thread fetches them in ranges of 8 MiB, one range ahead.
    /// Whether the stream is complete is for the caller to check
    /// ([`StreamStore::parts`]).
    pub fn reader(&self, name: &str, first_index: u64) -> Result<Box<dyn Read + Send>> {
        let scan = self.scan(name)?;
        let listing = self.checked(name, &scan)?;
        if first_index > listing.parts.len() as u64 {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "stream {name} in {} has {} parts, none from {first_index}",
                    self.describe(),
                    listing.parts.len()
                ),
            ));
        }
        let parts: Vec<(PartInfo, String)> =
            scan.parts.into_iter().skip(first_index as usize).collect();
        let (sender, receiver) = mpsc::sync_channel(1);
        let backend = Arc::clone(&self.backend);
        let name = name.to_string();
        std::thread::Builder::new()
            .name("grove-objects-reader".into())
            .spawn(move || fetch_parts(&*backend, &name, parts, sender))
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot start a reader thread: {e}")))?;
        Ok(Box::new(PartsReader {
            receiver,
            buffer: Vec::new(),
            position: 0,
            done: false,
        }))
    }

    /// Removes every object of stream `name`, aborting its recorded
    /// multipart uploads first. The complete marker goes first, so that an
    /// interrupted removal leaves an incomplete stream. A stream that does
    /// not exist is not an error.
    pub fn remove(&self, name: &str) -> Result<()> {
        let scan = self.scan(name)?;
        self.abort_recorded(name, &scan)?;
        if scan.complete {
            self.backend.delete(&[format!("{name}/{COMPLETE_NAME}")])?;
        }
        let rest: Vec<String> = scan
            .all
            .iter()
            .filter(|o| *o != COMPLETE_NAME && !o.starts_with(MULTIPART_PREFIX))
            .map(|o| format!("{name}/{o}"))
            .collect();
        self.backend.delete(&rest)?;
        self.backend.clean_stream(name)
    }

    /// The names of the streams in the store, sorted.
    pub fn list_streams(&self) -> Result<Vec<String>> {
        let mut names = self.backend.list_streams()?;
        names.retain(|n| check_name(n).is_ok());
        names.sort();
        Ok(names)
    }
}

fn complete_marker(parts: &[PartInfo]) -> String {
    let total: u64 = parts.iter().map(|p| p.size_bytes).sum();
    format!("{COMPLETE_MAGIC}\nparts {}\nbytes {total}\n", parts.len())
}

/// The reader thread: every part's ranges in order, each checked against
/// the listed size, into the channel; stops at the first error or when the
/// reader is dropped.
fn fetch_parts(
    backend: &dyn Backend,
    name: &str,
    parts: Vec<(PartInfo, String)>,
    sender: mpsc::SyncSender<Result<Vec<u8>>>,
) {
    for (part, object) in parts {
        let key = format!("{name}/{object}");
        let mut offset = 0;
        while offset < part.size_bytes {
            let end = (offset + READ_CHUNK_BYTES).min(part.size_bytes);
            let result = backend.get_range(&key, offset..end).and_then(|bytes| {
                if bytes.len() as u64 == end - offset {
                    Ok(bytes)
                } else {
                    Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "stream {name} part {}: {} bytes at {offset}, expected {}",
                            part.index,
                            bytes.len(),
                            end - offset
                        ),
                    ))
                }
            });
            let failed = result.is_err();
            if sender.send(result).is_err() || failed {
                return;
            }
            offset = end;
        }
    }
}

struct PartsReader {
    receiver: mpsc::Receiver<Result<Vec<u8>>>,
    buffer: Vec<u8>,
    position: usize,
    done: bool,
}

impl Read for PartsReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.position == self.buffer.len() {
            if self.done {
                return Ok(0);
            }
            match self.receiver.recv() {
                Ok(Ok(bytes)) => {
                    self.buffer = bytes;
                    self.position = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(io::Error::other(e));
                }
                // The thread ends after the last range.
                Err(mpsc::RecvError) => self.done = true,
            }
        }
        let n = out.len().min(self.buffer.len() - self.position);
        out[..n].copy_from_slice(&self.buffer[self.position..self.position + n]);
        self.position += n;
        Ok(n)
    }
}

/// Storing one stream: parts are added at the end, then [`Upload::finish`]
/// marks it complete.
pub struct Upload {
    backend: Arc<dyn Backend>,
    part_size_bytes: u64,
    stall_after_chunks: Option<usize>,
    name: String,
    listing: StreamListing,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("name", &self.name)
            .field("listing", &self.listing)
            .finish()
    }
}

impl Upload {
    /// The parts stored so far: those found when the upload was opened
    /// (for resuming), then those put since.
    pub fn stored_parts(&self) -> &[PartInfo] {
        &self.listing.parts
    }

    /// Whether the stream was already complete when opened.
    pub fn is_complete(&self) -> bool {
        self.listing.complete
    }

    /// Stores the next part (index = the number stored so far) whole, with
    /// `cursor`. A failed put leaves nothing (an aborted multipart upload).
    pub fn put_part(&mut self, bytes: &[u8], cursor: &[u8]) -> Result<()> {
        let refuse = |why: String| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("stream {} in {}: {why}", self.name, self.backend.describe()),
            )
        };
        if self.listing.complete {
            return Err(refuse(
                "the stream is complete: no part can be added".into(),
            ));
        }
        if bytes.len() as u64 > self.part_size_bytes {
            return Err(refuse(format!(
                "a part of {} bytes, more than {}",
                bytes.len(),
                self.part_size_bytes
            )));
        }
        if cursor.len() > CURSOR_MAX_BYTES {
            return Err(refuse(format!(
                "a cursor of {} bytes, more than {CURSOR_MAX_BYTES}",
                cursor.len()
            )));
        }
        let index = self.listing.parts.len() as u64;
        let object = part_name(index, cursor);
        let key = format!("{}/{object}", self.name);
        if bytes.len() <= MULTIPART_CHUNK_BYTES {
            self.backend.put(&key, bytes, false)?;
        } else {
            self.put_multipart(index, &object, &key, bytes)?;
        }
        self.listing.parts.push(PartInfo {
            index,
            size_bytes: bytes.len() as u64,
            cursor: cursor.to_vec(),
        });
        Ok(())
    }

    /// A big part: the upload's id is recorded in a marker before its first
    /// chunk, and the marker removed once the upload is completed or
    /// aborted. On an error the upload is aborted; if even that fails the
    /// marker stays, for the next upload() or remove() to abort it.
    fn put_multipart(&self, index: u64, object: &str, key: &str, bytes: &[u8]) -> Result<()> {
        let backend = &*self.backend;
        let id = backend.multipart_begin(key)?;
        let marker = format!("{}/{MULTIPART_PREFIX}{index:08}", self.name);
        if let Err(e) = backend.put(&marker, format!("{object}\n{id}\n").as_bytes(), false) {
            let _ = backend.multipart_abort(key, &id);
            return Err(e);
        }
        let result = (|| {
            let chunks: Vec<&[u8]> = bytes.chunks(MULTIPART_CHUNK_BYTES).collect();
            let mut tags = Vec::with_capacity(chunks.len());
            for (batch, group) in chunks.chunks(MULTIPART_CHUNKS_IN_FLIGHT).enumerate() {
                let first = batch * MULTIPART_CHUNKS_IN_FLIGHT;
                let offset = (first * MULTIPART_CHUNK_BYTES) as u64;
                if let Some(stall) = self.stall_after_chunks {
                    // The test hook: send chunks one by one up to the stall.
                    for (i, chunk) in group.iter().enumerate() {
                        if first + i == stall {
                            eprintln!("grove-objects: test stall: multipart upload {id} of {key} stopped after {stall} chunks");
                            loop {
                                std::thread::sleep(std::time::Duration::from_secs(3600));
                            }
                        }
                        let chunk_offset = offset + (i * MULTIPART_CHUNK_BYTES) as u64;
                        tags.extend(backend.multipart_put(
                            key,
                            &id,
                            first + i,
                            chunk_offset,
                            &[chunk],
                        )?);
                    }
                } else {
                    tags.extend(backend.multipart_put(key, &id, first, offset, group)?);
                }
            }
            backend.multipart_complete(key, &id, tags)
        })();
        match result {
            Ok(()) => backend.delete(&[marker]),
            Err(e) => {
                if backend.multipart_abort(key, &id).is_ok() {
                    let _ = backend.delete(&[marker]);
                }
                Err(e)
            }
        }
    }

    /// Marks the stream complete (a create-only marker). A stream already
    /// complete when opened stays so; one completed meanwhile by another
    /// writer is [`ErrorKind::AlreadyExists`].
    pub fn finish(self) -> Result<()> {
        if self.listing.complete {
            return Ok(());
        }
        let key = format!("{}/{COMPLETE_NAME}", self.name);
        self.backend
            .put(&key, complete_marker(&self.listing.parts).as_bytes(), true)
            .map_err(|e| {
                if e.kind() == ErrorKind::AlreadyExists {
                    Error::new(
                        ErrorKind::AlreadyExists,
                        format!(
                            "stream {} in {} was completed by another writer",
                            self.name,
                            self.backend.describe()
                        ),
                    )
                } else {
                    e
                }
            })
    }
}
