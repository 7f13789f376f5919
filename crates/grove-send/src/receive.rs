//! `grove receive`: a stream into snapshots.
//!
//! Each section is written into a partial receive (`grove_store`'s hidden
//! record), checked frame by frame, and becomes a visible snapshot only
//! when its Finish frame's content digest matches what was received. Every
//! `PROGRESS_BYTES` (or `PROGRESS_INTERVAL`) the data and the progress
//! commit together, in the background; the receive never runs more than
//! `UNDURABLE_BYTES_MAX` of stream ahead of its last durable commit. An
//! interrupted receive keeps what it committed and hands back a resume
//! token. What the token needs besides the progress
//! (the stream's snapshots, the tag, the running digest) is kept in
//! `POOL/grove.receiving/NAME`, written before the partial receive exists.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use grove_store::{guid_hex, Pool, Volume};
use serde::{Deserialize, Serialize};

use crate::digest::{decode_state, encode_state, ContentDigest, DigestCache};
use crate::format::{
    Begin, Frame, FrameReader, Header, StreamError, FRAME_OVERHEAD_BYTES, UNIT_BYTES,
};
use crate::send::{remove_volume_units, volume_digest};
use crate::token::ResumeToken;

/// Stream bytes applied before a commit of data and progress is asked for
/// (in the background, while the receive goes on). Each commit costs two
/// device flushes: 1 MiB intervals made a 1 GiB receive through a pipe
/// half again as slow as 4 MiB ones did, 1.5 MiB ones about a fifth.
pub const PROGRESS_BYTES: u64 = 3 << 19;
/// Most stream bytes applied and not yet durable: when a commit in flight
/// and what came after it would pass this, the receive waits for the
/// commit (and so stops reading its input). A receive killed at any point
/// loses at most this much, so a resume sends again at most this and what
/// sat in the buffers between sender and receiver (a pipe, the reader's
/// buffer, one frame). Room for about two progress intervals, so that one
/// commit runs while the next interval arrives.
pub const UNDURABLE_BYTES_MAX: u64 = 5 << 20;
/// The stream bytes of the largest record.
const RECORD_BYTES_MAX: u64 = crate::format::DATA_BYTES_MAX as u64 + FRAME_OVERHEAD_BYTES;
// An interval ends with the record that reaches `PROGRESS_BYTES`; alone
// (no commit in flight) it must fit the bound, or the bound could not hold.
const _: () = assert!(PROGRESS_BYTES + RECORD_BYTES_MAX <= UNDURABLE_BYTES_MAX);
/// Longest time between two commits while data arrives.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// Debug builds only: a pause in milliseconds before each progress commit
/// (a slow disk), so tests can kill a receive while its commits lag.
const COMMIT_DELAY_FOR_TESTS_ENV: &str = "GROVE_TEST_RECEIVE_COMMIT_DELAY_MS";
/// Directory of the partial receives' stream state, in the pool directory.
pub const RECEIVING_DIR: &str = "grove.receiving";

/// What a finished receive made.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReceiveSummary {
    /// The snapshots made, oldest first.
    pub snapshots: Vec<String>,
    pub stream_bytes: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
    pub hole_bytes: u64,
}

/// Why a receive stopped.
#[derive(Debug)]
pub struct ReceiveError {
    pub cause: anyhow::Error,
    /// Set when a partial receive was kept: its name and the token that
    /// resumes it.
    pub resumable: Option<Box<(String, ResumeToken)>>,
    /// Snapshots finished before it stopped.
    pub finished: Vec<String>,
}

impl std::fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.cause)?;
        if let Some(resumable) = &self.resumable {
            let (name, token) = &**resumable;
            write!(
                f,
                "; the partial receive {name:?} keeps {} bytes: resume with `grove send --resume {}` into `grove receive {name}`, or drop it with `grove receive --abort {name}`",
                token.progress_bytes,
                token.encode()
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ReceiveError {}

impl ReceiveError {
    fn refused(cause: anyhow::Error, finished: Vec<String>) -> ReceiveError {
        ReceiveError {
            cause,
            resumable: None,
            finished,
        }
    }
}

/// What a partial receive needs beside its progress, kept in
/// `RECEIVING_DIR/NAME` as JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StreamState {
    range: bool,
    final_target: String,
    section_base: Option<String>,
    section_target: String,
    tag: String,
    /// This section's index in its stream, and the stream's sections.
    section: u32,
    sections_total: u32,
    /// This section's Begin frame as it arrived (hex): with the stream's
    /// header rebuilt from the fields above, it lets a receive from stored
    /// objects start again in the middle of the section.
    begin_frame: String,
}

fn state_path(pool_dir: &Path, name: &str) -> PathBuf {
    pool_dir.join(RECEIVING_DIR).join(name)
}

/// The running content digest of a partial receive and the progress it
/// belongs to, beside its state. Written after each progress commit and
/// never synced: a crash that loses it leaves it behind the progress, and
/// the section is then verified by reading it whole.
fn digest_path(pool_dir: &Path, name: &str) -> PathBuf {
    pool_dir.join(RECEIVING_DIR).join(format!("{name}.digest"))
}

/// Writes `text` to `path` through a temporary file and a rename, so a
/// reader sees the old or the new text; synced (file and directory) if
/// `durable`.
fn replace_file(path: &Path, text: &str, durable: bool) -> Result<()> {
    let dir = path.parent().expect("a file in a directory");
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temporary = path.with_extension("new");
    let mut file = fs::File::create(&temporary)
        .with_context(|| format!("cannot create {}", temporary.display()))?;
    file.write_all(text.as_bytes())?;
    if durable {
        file.sync_all()?;
    }
    fs::rename(&temporary, path).with_context(|| format!("cannot write {}", path.display()))?;
    if durable {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn write_state(pool_dir: &Path, name: &str, state: &StreamState, durable: bool) -> Result<()> {
    let text = serde_json::to_string(state)?;
    replace_file(&state_path(pool_dir, name), &text, durable)
}

/// The running digest kept for `progress_bytes`, if the file holds it.
fn read_digest(pool_dir: &Path, name: &str, progress_bytes: u64) -> Option<ContentDigest> {
    let text = fs::read_to_string(digest_path(pool_dir, name)).ok()?;
    let (digest, at) = decode_state(text.trim()).ok()?;
    (at == progress_bytes).then_some(digest)
}

fn forget_state(pool_dir: &Path, name: &str) {
    let _ = fs::remove_file(state_path(pool_dir, name));
    let _ = fs::remove_file(digest_path(pool_dir, name));
}

fn read_state(pool_dir: &Path, name: &str) -> Result<StreamState> {
    let path = state_path(pool_dir, name);
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "the stream state of partial receive {name:?} ({}) is missing",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is damaged", path.display()))
}

fn guid_from_hex(text: &str) -> Result<[u8; 16]> {
    crate::digest::unhex(text)?
        .try_into()
        .map_err(|_| anyhow!("a GUID of the wrong length"))
}

/// The token that resumes partial receive `name`.
pub fn resume_token(pool: &Pool, name: &str) -> Result<ResumeToken> {
    let partial = pool
        .partial_receive(name)
        .with_context(|| format!("no partial receive named {name:?} in this pool"))?;
    let state = read_state(pool.dir(), name)?;
    Ok(ResumeToken {
        range: state.range,
        final_target: guid_from_hex(&state.final_target)?,
        section_base: state
            .section_base
            .as_deref()
            .map(guid_from_hex)
            .transpose()?,
        section_target: guid_from_hex(&state.section_target)?,
        progress_bytes: partial.progress_bytes,
        tag: guid_from_hex(&state.tag)?,
    })
}

/// Drops partial receive `name` and its stream state; the bytes the
/// reclaimer gives back.
pub fn abort(pool: &Pool, name: &str) -> Result<u64> {
    let freed = pool.abort_receive(name)?;
    forget_state(pool.dir(), name);
    Ok(freed)
}

/// Receives the stream from `input`; the last section becomes snapshot
/// `name`, earlier ones (a range) snapshots named after the sender's.
/// `progress` hears the stream bytes read so far.
///
/// The last section's snapshot is made visible only once the stream's end
/// frame is read and checked: a stream damaged anywhere, its trailer
/// included, leaves no snapshot of its last section.
pub fn receive(
    pool: &Pool,
    name: &str,
    input: impl Read,
    progress: &mut dyn FnMut(u64),
) -> std::result::Result<ReceiveSummary, ReceiveError> {
    grove_store::validate_volume_name(name)
        .map_err(|e| ReceiveError::refused(e.into(), Vec::new()))?;
    let mut reader = FrameReader::new(input);
    let mut summary = ReceiveSummary::default();
    let header = read_header(&mut reader)?;
    // A resumed stream numbers its sections as the whole stream did.
    let mut first_section = None;
    let mut verified_last = None;
    for index in 0..header.sections {
        let begin = read_begin(&mut reader, index, &mut first_section)
            .map_err(|cause| ReceiveError::refused(cause, summary.snapshots.clone()))?;
        let local = local_name(name, &begin.target_name, index + 1 == header.sections);
        let total = first_section.unwrap_or(0) + header.sections;
        let mut section = SectionReceiver::start(pool, &header, &begin, index, total, &local)
            .map_err(|e| ReceiveError::refused(e, summary.snapshots.clone()))?;
        match section.run(&mut reader, &mut summary, progress) {
            Ok(Finished::Published) => summary.snapshots.push(local),
            Ok(Finished::Verified(digest)) => verified_last = Some((section, digest, local)),
            Err(error) => return Err(section_failed(pool, error, &local, summary.snapshots)),
        }
    }
    let sections = first_section.unwrap_or(0) + header.sections;
    if let Err(cause) = read_end(&mut reader, sections) {
        let cause = match verified_last {
            Some((section, _, _)) => section.drop_for(cause),
            None => cause,
        };
        return Err(ReceiveError::refused(cause, summary.snapshots));
    }
    if let Some((mut section, digest, local)) = verified_last {
        section
            .publish(digest)
            .map_err(|e| ReceiveError::refused(e, summary.snapshots.clone()))?;
        summary.snapshots.push(local);
    }
    summary.stream_bytes = reader.bytes_read;
    progress(summary.stream_bytes);
    Ok(summary)
}

/// The stream's first frame, which must be grove's stream header: input
/// that does not begin with one is refused as "not a grove stream".
fn read_header(reader: &mut FrameReader<impl Read>) -> std::result::Result<Header, ReceiveError> {
    let not_a_stream =
        |why: &str| ReceiveError::refused(anyhow!("not a grove stream: {why}"), Vec::new());
    match reader.next_frame() {
        Ok(Frame::Header(header)) => Ok(header),
        Ok(other) => Err(not_a_stream(&format!(
            "it begins with {} instead of a stream header",
            describe(&other)
        ))),
        Err(StreamError::Damaged { at_byte: 0, why }) => Err(not_a_stream(&format!(
            "its first bytes are no stream header ({why})"
        ))),
        Err(StreamError::Truncated { at_byte: 0 }) => {
            Err(not_a_stream("it is empty or shorter than a stream header"))
        }
        Err(e) => Err(ReceiveError::refused(e.into(), Vec::new())),
    }
}

/// Section `index`'s Begin frame, numbered on from the first section's.
fn read_begin(
    reader: &mut FrameReader<impl Read>,
    index: u32,
    first_section: &mut Option<u32>,
) -> Result<Begin> {
    let at = reader.bytes_read;
    match reader.next_frame()? {
        Frame::Begin(begin) if begin.section == first_section.unwrap_or(begin.section) + index => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs());
            begin.check(now).map_err(|why| {
                anyhow!("the stream is damaged or forged at byte {at}: section {index}'s start is impossible: {why}")
            })?;
            first_section.get_or_insert(begin.section);
            Ok(begin)
        }
        other => bail!(
            "the stream is damaged: expected the start of section {index}, found {}",
            describe(&other)
        ),
    }
}

/// The stream's end frame, which must count the sections the header did.
fn read_end(reader: &mut FrameReader<impl Read>, sections: u32) -> Result<()> {
    let at = reader.bytes_read;
    match reader.next_frame()? {
        Frame::End { sections: counted } if counted == sections => Ok(()),
        Frame::End { sections: counted } => bail!(
            "the stream is damaged at byte {at}: its end counts {counted} sections, but it held {sections}"
        ),
        other => bail!(
            "the stream is damaged at byte {at}: expected the stream's end, found {}",
            describe(&other)
        ),
    }
}

/// The error of a section that stopped: an interrupted one keeps its
/// partial receive and says how to resume it.
fn section_failed(
    pool: &Pool,
    error: SectionError,
    local: &str,
    finished: Vec<String>,
) -> ReceiveError {
    match error {
        SectionError::Interrupted(cause) => {
            let resumable = resume_token(pool, local)
                .ok()
                .map(|t| Box::new((local.to_string(), t)));
            ReceiveError {
                cause,
                resumable,
                finished,
            }
        }
        SectionError::Refused(cause) => ReceiveError::refused(cause, finished),
    }
}

fn describe(frame: &Frame) -> &'static str {
    match frame {
        Frame::Header(_) => "a second header",
        Frame::Begin(_) => "the start of another section",
        Frame::Data { .. } => "a data record",
        Frame::Zero { .. } => "a zero record",
        Frame::Hole { .. } => "a hole record",
        Frame::Finish(_) => "the end of a section",
        Frame::End { .. } => "the stream's end",
    }
}

/// The name of a section's snapshot: NAME for the last one; for earlier
/// ones (a range), the sender's name, moved under NAME's prefix when both
/// have one (`backup@5` receiving `vm@3` makes `backup@3`).
fn local_name(name: &str, sender_name: &str, last: bool) -> String {
    if last {
        return name.to_string();
    }
    match (name.split_once('@'), sender_name.split_once('@')) {
        (Some((prefix, _)), Some((_, suffix))) => format!("{prefix}@{suffix}"),
        _ => sender_name.to_string(),
    }
}

/// How a section that read its Finish record ended.
enum Finished {
    /// An earlier section of a range, now a snapshot.
    Published,
    /// The last section, its content checked: made a snapshot only once
    /// the stream's end is.
    Verified(ContentDigest),
}

enum SectionError {
    /// The input stopped or broke: what arrived is kept for a resume.
    Interrupted(anyhow::Error),
    /// The stream is wrong, or the pool cannot take it.
    Refused(anyhow::Error),
}

impl From<StreamError> for SectionError {
    fn from(e: StreamError) -> Self {
        SectionError::Interrupted(e.into())
    }
}

/// Progress commits in the background: the receiver goes on writing while
/// the pool flushes what came before, with at most one commit in flight
/// (and at most `UNDURABLE_BYTES_MAX` of stream not yet durable, which
/// `SectionReceiver::make_room` keeps).
struct Committer {
    requests: Option<SyncSender<(u64, Option<ContentDigest>)>>,
    done: Receiver<Result<()>>,
    /// Stream bytes the commit in flight makes durable (0: none in flight).
    in_flight_bytes: u64,
    in_flight: bool,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Committer {
    fn start(pool: &Pool, name: &str) -> Result<Committer> {
        let (requests, work) = sync_channel::<(u64, Option<ContentDigest>)>(1);
        let (report, done) = sync_channel(1);
        let (pool, name) = (pool.clone(), name.to_string());
        let delay = commit_delay_for_tests();
        let worker = std::thread::Builder::new()
            .name("grove-receive-commit".into())
            .spawn(move || {
                for (progress, digest) in work {
                    std::thread::sleep(delay);
                    let result = pool
                        .record_receive_progress(&name, progress)
                        .map_err(anyhow::Error::from)
                        .and_then(|()| match digest {
                            Some(digest) => replace_file(
                                &digest_path(pool.dir(), &name),
                                &encode_state(&digest, progress),
                                false,
                            ),
                            None => Ok(()),
                        });
                    if report.send(result).is_err() {
                        return;
                    }
                }
            })
            .context("cannot start the receive's commit thread")?;
        Ok(Committer {
            requests: Some(requests),
            done,
            in_flight_bytes: 0,
            in_flight: false,
            worker: Some(worker),
        })
    }

    /// Asks for `progress` (and the digest that belongs to it) to be made
    /// durable, once the commit in flight is done; `stream_bytes` are the
    /// stream bytes it covers that are not durable yet.
    fn request(
        &mut self,
        progress: u64,
        digest: Option<ContentDigest>,
        stream_bytes: u64,
    ) -> Result<()> {
        self.wait()?;
        self.requests
            .as_ref()
            .expect("the committer runs")
            .send((progress, digest))
            .map_err(|_| anyhow!("the receive's commit thread stopped"))?;
        self.in_flight = true;
        self.in_flight_bytes = stream_bytes;
        Ok(())
    }

    /// Waits for the commit in flight.
    fn wait(&mut self) -> Result<()> {
        if !self.in_flight {
            return Ok(());
        }
        self.in_flight = false;
        self.in_flight_bytes = 0;
        self.done
            .recv()
            .map_err(|_| anyhow!("the receive's commit thread stopped"))?
    }
}

/// The pause `COMMIT_DELAY_FOR_TESTS_ENV` asks for; none in release builds.
fn commit_delay_for_tests() -> Duration {
    if !cfg!(debug_assertions) {
        return Duration::ZERO;
    }
    std::env::var(COMMIT_DELAY_FOR_TESTS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// What a partial receive holds when a run over it starts.
struct Held {
    state: StreamState,
    /// Whether `state` is synced already (a resumed receive's is).
    state_durable: bool,
    /// The running digest at `bytes`, if known.
    digest: Option<ContentDigest>,
    /// Bytes of the target held and durable.
    bytes: u64,
}

/// Receives one section into its partial receive.
struct SectionReceiver<'a> {
    pool: &'a Pool,
    begin: Begin,
    name: String,
    volume: Volume,
    state: StreamState,
    /// The state file is synced: it must be before the partial receive
    /// is first committed on purpose, so a resumable one always has it.
    state_durable: bool,
    /// The stream's last section: its snapshot commits when it finishes.
    last: bool,
    /// The running digest, while it follows the progress exactly.
    digest: Option<ContentDigest>,
    /// The partial receive held nothing past this when this run started:
    /// a full stream's old contents there are zeros, never read.
    fresh_from: u64,
    /// End of the last record applied (or skipped as already held).
    applied: u64,
    committed: u64,
    committed_at: Instant,
    /// Stream bytes applied since the last commit: what a resume would
    /// send again. (Progress is an offset in the volume, which an
    /// incremental stream crosses far faster than it sends bytes.)
    uncommitted_bytes: u64,
    committer: Committer,
}

impl<'a> SectionReceiver<'a> {
    fn start(
        pool: &'a Pool,
        header: &Header,
        begin: &Begin,
        index: u32,
        sections_total: u32,
        name: &str,
    ) -> Result<SectionReceiver<'a>> {
        let resuming_this = header.resumed && index == 0;
        match pool.partial_receive(name) {
            Some(partial) => {
                if partial.target_guid != begin.target_guid {
                    bail!(
                        "a partial receive named {name:?} is of another snapshot (GUID {}); drop it with `grove receive --abort {name}` or receive under another name",
                        guid_hex(&partial.target_guid)
                    );
                }
                if resuming_this && header.resumed_offset > partial.progress_bytes {
                    bail!(
                        "the stream resumes at byte {}, but partial receive {name:?} holds only {}: ask the sending pool for `grove send --resume` with the token `grove receive --status {name}` prints",
                        header.resumed_offset,
                        partial.progress_bytes
                    );
                }
                if !resuming_this {
                    bail!(
                        "a partial receive named {name:?} is waiting to be resumed: send with `--resume` and the token `grove receive --status {name}` prints, or drop it with `grove receive --abort {name}`"
                    );
                }
                let state = read_state(pool.dir(), name)?;
                let digest = read_digest(pool.dir(), name, partial.progress_bytes);
                let volume = pool.receive_volume(name)?;
                let held = Held {
                    state,
                    state_durable: true,
                    digest,
                    bytes: partial.progress_bytes,
                };
                Self::assemble(pool, begin, sections_total, name, volume, held)
            }
            None if resuming_this => bail!(
                "the stream resumes a receive, but there is no partial receive named {name:?} in this pool (it finished, or was aborted)"
            ),
            None => Self::start_new(pool, header, begin, sections_total, name),
        }
    }

    fn start_new(
        pool: &'a Pool,
        header: &Header,
        begin: &Begin,
        sections_total: u32,
        name: &str,
    ) -> Result<SectionReceiver<'a>> {
        if let Some(existing) = pool.snapshot_by_guid(&begin.target_guid) {
            bail!(
                "this pool already holds snapshot {:?} of the stream as {:?} (same GUID {})",
                begin.target_name,
                existing.name,
                guid_hex(&begin.target_guid)
            );
        }
        let cache = DigestCache::new(pool.dir());
        let digest = match begin.base_guid {
            None => ContentDigest::empty(),
            Some(base_guid) => {
                let base = pool
                    .snapshot_by_guid(&base_guid)
                    .ok_or_else(|| missing_base(pool, header, begin))?;
                match cache.get(&base.guid, base.size_bytes) {
                    Some(known) => known,
                    None => {
                        let computed = volume_digest(&pool.volume(&base.name)?)?;
                        cache.put(&base.guid, base.size_bytes, &computed);
                        computed
                    }
                }
            }
        };
        let state = StreamState {
            range: header.range,
            final_target: guid_hex(&header.final_target),
            section_base: begin.base_guid.map(|g| guid_hex(&g)),
            section_target: guid_hex(&begin.target_guid),
            tag: guid_hex(&begin.resume_tag),
            section: begin.section,
            sections_total,
            begin_frame: {
                let mut writer = crate::format::FrameWriter::new(Vec::new());
                writer.write(&Frame::Begin(begin.clone()))?;
                hex::encode(writer.into_inner())
            },
        };
        // Synced only when the partial receive first commits (`commit`):
        // a short section finishes before that, and costs no sync here.
        write_state(pool.dir(), name, &state, false)?;
        let volume =
            pool.begin_receive(name, begin.base_guid, begin.target_guid, begin.size_bytes)?;
        let held = Held {
            state,
            state_durable: false,
            digest: Some(digest),
            bytes: 0,
        };
        Self::assemble(pool, begin, sections_total, name, volume, held)
    }

    fn assemble(
        pool: &'a Pool,
        begin: &Begin,
        sections_total: u32,
        name: &str,
        volume: Volume,
        held: Held,
    ) -> Result<SectionReceiver<'a>> {
        Ok(SectionReceiver {
            pool,
            begin: begin.clone(),
            name: name.to_string(),
            volume,
            state: held.state,
            state_durable: held.state_durable,
            last: begin.section + 1 == sections_total,
            digest: held.digest,
            fresh_from: held.bytes,
            applied: 0,
            committed: held.bytes,
            committed_at: Instant::now(),
            uncommitted_bytes: 0,
            committer: Committer::start(pool, name)?,
        })
    }

    fn run(
        &mut self,
        reader: &mut FrameReader<impl Read>,
        summary: &mut ReceiveSummary,
        progress: &mut dyn FnMut(u64),
    ) -> std::result::Result<Finished, SectionError> {
        loop {
            let frame = match reader.next_frame() {
                Ok(frame) => frame,
                Err(e) => return Err(self.interrupted(e.into())),
            };
            progress(reader.bytes_read);
            match frame {
                Frame::Finish(finish) => {
                    summary.data_bytes += finish.data_bytes;
                    summary.zero_bytes += finish.zero_bytes;
                    summary.hole_bytes += finish.hole_bytes;
                    return self.finish(finish.content_digest);
                }
                Frame::Data { .. } | Frame::Zero { .. } | Frame::Hole { .. } => {
                    if let Err(why) = self.check_record(&frame) {
                        let at = reader.bytes_read;
                        return Err(
                            self.interrupted(anyhow!("the stream is damaged at byte {at}: {why}"))
                        );
                    }
                    self.apply(&frame).map_err(|e| self.interrupted(e))?;
                }
                other => {
                    let why = anyhow!(
                        "the stream is damaged: expected a record, found {}",
                        describe(&other)
                    );
                    return Err(self.interrupted(why));
                }
            }
        }
    }

    /// Records are aligned, inside the volume, and in strictly increasing
    /// order: anything else is a damaged or reordered stream.
    fn check_record(&self, frame: &Frame) -> std::result::Result<(), String> {
        let (offset, length) = frame.extent().expect("a record");
        let size = self.begin.size_bytes;
        let end = offset
            .checked_add(length)
            .ok_or("a record past any volume's end")?;
        if offset % UNIT_BYTES != 0 || (end % UNIT_BYTES != 0 && end != size) {
            return Err(format!(
                "a record at {offset}+{length} is not aligned to {UNIT_BYTES}"
            ));
        }
        if end > size {
            return Err(format!(
                "a record at {offset}+{length} runs past the volume's {size} bytes"
            ));
        }
        if offset < self.applied {
            return Err(format!(
                "a record at {offset} comes after one that ended at {} (records out of order)",
                self.applied
            ));
        }
        Ok(())
    }

    fn apply(&mut self, frame: &Frame) -> Result<()> {
        let (offset, length) = frame.extent().expect("a record");
        let end = offset + length;
        if end <= self.committed {
            // Held already (a resumed stream may start a little earlier).
            self.applied = end;
            return Ok(());
        }
        let incoming = match frame {
            Frame::Data { bytes, .. } => bytes.len() as u64,
            _ => 0,
        } + FRAME_OVERHEAD_BYTES;
        self.make_room(incoming)?;
        if let Some(digest) = &mut self.digest {
            // A full stream's units past what this run started with were
            // never written: their old contents are zeros.
            if self.begin.base_guid.is_some() || offset < self.fresh_from {
                remove_volume_units(digest, &self.volume, offset, end)?;
            }
        }
        match frame {
            Frame::Data { bytes, .. } => {
                self.volume.write_at(bytes, offset)?;
                if let Some(digest) = &mut self.digest {
                    digest.add(offset, bytes);
                }
            }
            _ => self.volume.discard(offset, length)?,
        }
        self.applied = end;
        self.uncommitted_bytes += incoming;
        assert!(
            self.undurable_bytes() <= UNDURABLE_BYTES_MAX,
            "a receive ran {} stream bytes ahead of its last durable commit",
            self.undurable_bytes()
        );
        if self.uncommitted_bytes >= PROGRESS_BYTES
            || self.committed_at.elapsed() >= PROGRESS_INTERVAL
        {
            self.commit()?;
        }
        Ok(())
    }

    /// Stream bytes applied and not yet durable: the commit in flight's
    /// and those applied since it was asked for.
    fn undurable_bytes(&self) -> u64 {
        self.committer.in_flight_bytes + self.uncommitted_bytes
    }

    /// Waits for the commit in flight if applying `incoming` more stream
    /// bytes would run past `UNDURABLE_BYTES_MAX`: back-pressure on the
    /// input, so that an interruption anywhere loses a bounded amount.
    fn make_room(&mut self, incoming: u64) -> Result<()> {
        if self.undurable_bytes() + incoming > UNDURABLE_BYTES_MAX {
            self.committer.wait()?;
        }
        // Past the commit, only this interval is undurable, and an
        // interval is committed once it reaches `PROGRESS_BYTES`.
        debug_assert!(self.uncommitted_bytes < PROGRESS_BYTES);
        debug_assert!(incoming <= RECORD_BYTES_MAX);
        Ok(())
    }

    /// Has the data and the progress made durable together, then the
    /// running digest that belongs to that progress, in the background.
    fn commit(&mut self) -> Result<()> {
        if self.applied <= self.committed {
            return Ok(());
        }
        self.make_state_durable()?;
        self.committer
            .request(self.applied, self.digest, self.uncommitted_bytes)?;
        self.committed = self.applied;
        self.committed_at = Instant::now();
        self.uncommitted_bytes = 0;
        Ok(())
    }

    /// Commits what was applied and waits until it is durable.
    fn commit_and_wait(&mut self) -> Result<()> {
        self.commit()?;
        self.committer.wait()
    }

    fn make_state_durable(&mut self) -> Result<()> {
        if !self.state_durable {
            write_state(self.pool.dir(), &self.name, &self.state, true)?;
            self.state_durable = true;
        }
        Ok(())
    }

    /// Keeps what arrived and says why it stopped.
    fn interrupted(&mut self, cause: anyhow::Error) -> SectionError {
        // The partial receive may be committed by whoever commits next
        // (closing the pool does): its state must be there to resume it.
        match self
            .make_state_durable()
            .and_then(|()| self.commit_and_wait())
        {
            Ok(()) => SectionError::Interrupted(cause),
            Err(e) => SectionError::Interrupted(
                cause.context(format!("and keeping what arrived failed too ({e:#})")),
            ),
        }
    }

    /// Checks the received content against the stream's digest. An
    /// earlier section of a range is then published at once; the last
    /// one waits for the stream's end (`publish` or `drop_for`).
    fn finish(&mut self, expected: [u8; 32]) -> std::result::Result<Finished, SectionError> {
        let digest = self.verify(expected)?;
        if self.last {
            return Ok(Finished::Verified(digest));
        }
        self.publish(digest).map_err(SectionError::Refused)?;
        Ok(Finished::Published)
    }

    fn verify(&mut self, expected: [u8; 32]) -> std::result::Result<ContentDigest, SectionError> {
        // A progress commit in flight must not land after the finish.
        self.committer.wait().map_err(SectionError::Refused)?;
        let size = self.begin.size_bytes;
        let digest = match self.digest {
            Some(digest) => digest,
            None => volume_digest(&self.volume).map_err(SectionError::Refused)?,
        };
        if digest.finish(size) != expected {
            let dropped = abort(self.pool, &self.name);
            let what = match dropped {
                Ok(_) => "the partial receive was dropped".to_string(),
                Err(e) => format!("dropping the partial receive failed too ({e:#})"),
            };
            return Err(SectionError::Refused(anyhow!(
                "the received content of {:?} does not match the stream's digest (the stream is damaged); {what}",
                self.begin.target_name
            )));
        }
        Ok(digest)
    }

    /// Makes the verified section a snapshot.
    fn publish(&mut self, digest: ContentDigest) -> Result<()> {
        self.pool
            .finish_receive(&self.name, self.begin.target_created_unix_secs, self.last)?;
        let cache = DigestCache::new(self.pool.dir());
        cache.put(&self.begin.target_guid, self.begin.size_bytes, &digest);
        cache.forget_unknown(|| self.pool.known_guids());
        forget_state(self.pool.dir(), &self.name);
        Ok(())
    }

    /// Drops a verified last section whose stream's end is damaged: the
    /// stream is refused whole, and the same good stream can follow.
    fn drop_for(self, cause: anyhow::Error) -> anyhow::Error {
        match abort(self.pool, &self.name) {
            Ok(_) => anyhow!(
                "{cause:#}; {:?} was not made and nothing of it is kept",
                self.name
            ),
            Err(e) => anyhow!("{cause:#}; dropping the partial receive failed too ({e:#})"),
        }
    }
}

/// One line naming the missing base and what to send instead.
fn missing_base(pool: &Pool, header: &Header, begin: &Begin) -> anyhow::Error {
    let base_guid = begin.base_guid.expect("an incremental section");
    let instead = header.base_hints.iter().find_map(|(guid, sender_name)| {
        pool.snapshot_by_guid(guid)
            .map(|here| (sender_name.clone(), here.name))
    });
    let advice = match instead {
        Some((sender_name, here)) => format!(
            "send --from {sender_name} instead (this pool holds it as {here:?}), or a full stream"
        ),
        None => "this pool holds no earlier snapshot of the line either: send a full stream (without --from)".to_string(),
    };
    anyhow!(
        "the stream's base, snapshot {:?} (GUID {}), is not in this pool; {advice}",
        begin.base_name,
        guid_hex(&base_guid)
    )
}

/// Where a partial receive stands in its stream, for reading the rest of
/// it from stored objects: the section it is in, and the frames that
/// restart it (a header, then the section's Begin) before the records
/// from `progress_bytes` on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestartPoint {
    pub section: u32,
    pub progress_bytes: u64,
    /// Bytes to read before the stored frames: a header and, when the
    /// stored part to start from begins inside the section, its Begin.
    pub header: Vec<u8>,
    pub begin: Vec<u8>,
}

/// How partial receive `name` restarts from a stored stream.
pub fn restart_point(pool: &Pool, name: &str) -> Result<RestartPoint> {
    let partial = pool
        .partial_receive(name)
        .with_context(|| format!("no partial receive named {name:?} in this pool"))?;
    let state = read_state(pool.dir(), name)?;
    let mut writer = crate::format::FrameWriter::new(Vec::new());
    writer.write(&Frame::Header(Header {
        range: state.range,
        resumed: true,
        sections: state.sections_total.saturating_sub(state.section).max(1),
        resumed_offset: partial.progress_bytes,
        final_target: guid_from_hex(&state.final_target)?,
        base_hints: Vec::new(),
    }))?;
    Ok(RestartPoint {
        section: state.section,
        progress_bytes: partial.progress_bytes,
        header: writer.into_inner(),
        begin: crate::digest::unhex(&state.begin_frame)?,
    })
}
