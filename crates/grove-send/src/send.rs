//! `grove send`: a snapshot, or what changed between two, as a stream.
//!
//! What a section carries comes from the engine's diff (or, for a full
//! stream, the target's mapped extents), widened to whole digest units:
//! the cost follows what changed, never the volume's size. Within a
//! changed range the target's own mapping decides the records: unmapped
//! units become Hole records, mapped units that read as zeros Zero
//! records, the rest Data records, so sparse data is never expanded.
//! Records are a pure function of the two snapshots, so a resumed stream
//! sends exactly the records a whole one would have from that offset on.

use std::io::Write;

use anyhow::{bail, Context, Result};
use grove_store::{guid_hex, DiffFrom, Pool, SnapshotIdentity, Volume, VolumeKind};

use crate::digest::{is_zero, ContentDigest, DigestCache};
use crate::format::{
    Begin, Finish, Frame, FrameWriter, Header, Position, Positions, DATA_BYTES_MAX, UNIT_BYTES,
};
use crate::token::{ResumeToken, SendKey};

/// What to send.
#[derive(Clone, Debug, Default)]
pub struct SendRequest {
    /// The snapshot to send (ignored when resuming: the token names it).
    pub target: String,
    /// The base: without one the stream is full.
    pub from: Option<DiffFrom>,
    /// Every snapshot between the base and the target, each its own
    /// section (`-I`).
    pub range: bool,
    /// Continue a partial receive from where its token says.
    pub resume: Option<ResumeToken>,
    /// Write only the stream's bytes after this position (an interrupted
    /// upload of the same stream stored those before it).
    pub continue_at: Option<Position>,
}

/// Where a stream goes: bytes, and a word at every frame boundary.
pub trait StreamSink: Write {
    /// Everything written so far ends at `next`.
    fn boundary(&mut self, next: Position) -> std::io::Result<()>;
    /// The stream's End frame was written.
    fn end(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<S: StreamSink + ?Sized> StreamSink for &mut S {
    fn boundary(&mut self, next: Position) -> std::io::Result<()> {
        (**self).boundary(next)
    }
    fn end(&mut self) -> std::io::Result<()> {
        (**self).end()
    }
}

/// Writes frames into a sink and tells it where the stream stands after
/// each one.
struct TrackedWriter<W: StreamSink> {
    frames: FrameWriter<W>,
    positions: Positions,
}

impl<W: StreamSink> TrackedWriter<W> {
    fn write(&mut self, frame: &Frame) -> std::io::Result<()> {
        self.frames.write(frame)?;
        match self.positions.advance(frame) {
            Some(next) => self.frames.inner().boundary(next),
            None => self.frames.inner().end(),
        }
    }
}

/// A sink that is only bytes.
struct Plain<W: Write>(W);

impl<W: Write> Write for Plain<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write> StreamSink for Plain<W> {
    fn boundary(&mut self, _: Position) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a send carried.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SendSummary {
    pub sections: u32,
    pub stream_bytes: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
    pub hole_bytes: u64,
    /// The last snapshot of the stream.
    pub target: String,
    pub target_guid: String,
    /// The last snapshot's volume size.
    pub target_size_bytes: u64,
    /// Whether the first section is full (no base): its unmapped blocks
    /// are left out, not sent as Hole records.
    pub full: bool,
}

/// One snapshot's part of a stream.
struct Section {
    base: Option<(DiffFrom, SnapshotIdentity)>,
    target: SnapshotIdentity,
    /// Bytes of the target the receiver already holds.
    start_bytes: u64,
}

/// Writes the stream for `request` to `out`; `progress` hears the stream
/// bytes written so far.
pub fn send(
    pool: &Pool,
    request: &SendRequest,
    out: impl Write,
    progress: &mut dyn FnMut(u64),
) -> Result<SendSummary> {
    send_to_sink(pool, request, &mut Plain(out), progress)
}

/// `send` into a sink that hears of every frame boundary.
pub fn send_to_sink(
    pool: &Pool,
    request: &SendRequest,
    out: &mut dyn StreamSink,
    progress: &mut dyn FnMut(u64),
) -> Result<SendSummary> {
    let key = SendKey::load_or_create(pool.dir())?;
    let (mut sections, final_target) = plan(pool, request, &key)?;
    let continue_at = request.continue_at;
    continue_sections_at(&mut sections, continue_at)?;
    let mut writer = TrackedWriter {
        frames: FrameWriter::new(out),
        positions: continue_at.map_or_else(Positions::new, Positions::continuing),
    };
    if continue_at.is_none() {
        let header = stream_header(pool, request, &sections, &final_target)?;
        writer.write(&Frame::Header(header))?;
    }
    let mut summary = SendSummary {
        sections: sections.len() as u32,
        target: final_target.name.clone(),
        target_guid: guid_hex(&final_target.guid),
        target_size_bytes: final_target.size_bytes,
        full: sections[0].base.is_none(),
        ..SendSummary::default()
    };
    let range = request.range || request.resume.as_ref().is_some_and(|t| t.range);
    let cache = DigestCache::new(pool.dir());
    for (index, section) in sections.iter().enumerate() {
        let skip_begin = match continue_at {
            Some(at) if (index as u32) < at.section => continue,
            Some(at) => index as u32 == at.section && at.begun,
            None => false,
        };
        let tag = key.tag(
            range,
            &final_target.guid,
            section.base.as_ref().map(|(_, b)| &b.guid),
            &section.target.guid,
        );
        let mut sender = SectionSender {
            pool,
            cache: &cache,
            section,
            writer: &mut writer,
            summary: &mut summary,
            progress,
            buffer: Vec::new(),
        };
        sender.send(index as u32, tag, skip_begin)?;
    }
    writer.write(&Frame::End {
        sections: sections.len() as u32,
    })?;
    writer.frames.flush()?;
    summary.stream_bytes = writer.frames.bytes_written;
    progress(summary.stream_bytes);
    cache.forget_unknown(|| pool.known_guids());
    Ok(summary)
}

/// Starts `sections` where an upload stored so far goes on: past the
/// records of the section it stopped in.
fn continue_sections_at(sections: &mut [Section], continue_at: Option<Position>) -> Result<()> {
    let Some(at) = continue_at else {
        return Ok(());
    };
    if at.section as usize >= sections.len() {
        bail!("the stored part of the stream ends past its last section: it is not this stream");
    }
    if at.begun {
        sections[at.section as usize].start_bytes = at.offset;
    }
    Ok(())
}

/// The stream's Header frame: its shape, and the snapshots the receiver
/// may already hold, as hints for a base.
fn stream_header(
    pool: &Pool,
    request: &SendRequest,
    sections: &[Section],
    final_target: &SnapshotIdentity,
) -> Result<Header> {
    let base_hints = pool
        .earlier_snapshots(&sections[0].target.name)?
        .into_iter()
        .map(|s| (s.guid, s.name))
        .collect();
    Ok(Header {
        range: request.range || request.resume.as_ref().is_some_and(|t| t.range),
        resumed: request.resume.is_some(),
        sections: sections.len() as u32,
        resumed_offset: sections[0].start_bytes,
        final_target: final_target.guid,
        base_hints,
    })
}

/// The sections to send, and the stream's last snapshot.
fn plan(
    pool: &Pool,
    request: &SendRequest,
    key: &SendKey,
) -> Result<(Vec<Section>, SnapshotIdentity)> {
    if let Some(token) = &request.resume {
        return plan_resume(pool, token, key);
    }
    let target = snapshot_identity(pool, &request.target)?;
    let Some(from) = &request.from else {
        if request.range {
            bail!("a range (-I) needs a base: --from BASE");
        }
        let section = Section {
            base: None,
            target: target.clone(),
            start_bytes: 0,
        };
        return Ok((vec![section], target));
    };
    let base = pool.base_identity(from)?;
    check_order(&base, &target)?;
    let mut points = vec![(from.clone(), base)];
    if request.range {
        for between in pool.snapshots_between(&points[0].1, &target.name)? {
            points.push((DiffFrom::Guid(between.guid), between));
        }
    }
    let mut sections = Vec::new();
    for (i, (from, base)) in points.iter().enumerate() {
        let next = points
            .get(i + 1)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| target.clone());
        sections.push(Section {
            base: Some((from.clone(), base.clone())),
            target: next,
            start_bytes: 0,
        });
    }
    Ok((sections, target))
}

fn plan_resume(
    pool: &Pool,
    token: &ResumeToken,
    key: &SendKey,
) -> Result<(Vec<Section>, SnapshotIdentity)> {
    key.verify(token)?;
    let find = |guid: &[u8; 16], role: &str| {
        pool.snapshot_by_guid(guid).with_context(|| {
            format!(
                "cannot resume: the {role} snapshot (GUID {}) is no longer in this pool",
                guid_hex(guid)
            )
        })
    };
    let final_target = find(&token.final_target, "stream's last")?;
    let section_target = find(&token.section_target, "resumed")?;
    let base = match token.section_base {
        None => None,
        Some(guid) => {
            let from = DiffFrom::Guid(guid);
            let base = pool.base_identity(&from).with_context(|| {
                format!(
                    "cannot resume: the base snapshot (GUID {}) is gone from this pool, and no bookmark of it is left",
                    guid_hex(&guid)
                )
            })?;
            Some((from, base))
        }
    };
    let mut sections = vec![Section {
        base,
        target: section_target.clone(),
        start_bytes: token.progress_bytes.min(section_target.size_bytes),
    }];
    if token.range && section_target.guid != final_target.guid {
        let mut previous = section_target;
        let mut rest = pool.snapshots_between(&previous, &final_target.name)?;
        rest.push(final_target.clone());
        for next in rest {
            sections.push(Section {
                base: Some((DiffFrom::Guid(previous.guid), previous)),
                target: next.clone(),
                start_bytes: 0,
            });
            previous = next;
        }
    }
    Ok((sections, final_target))
}

fn snapshot_identity(pool: &Pool, name: &str) -> Result<SnapshotIdentity> {
    let identity = pool.identity(name)?;
    if identity.kind != VolumeKind::Snapshot {
        bail!(
            "{name:?} is a writable {}: send sends read-only snapshots, whose contents cannot change while they go; take one with `grove snapshot {name} {name}@NOW` and send that",
            identity.kind.as_str()
        );
    }
    Ok(identity)
}

fn check_order(base: &SnapshotIdentity, target: &SnapshotIdentity) -> Result<()> {
    if base.guid == target.guid {
        bail!(
            "the base and the snapshot to send are the same snapshot ({:?})",
            target.name
        );
    }
    if base.created_generation > target.created_generation {
        bail!(
            "base {:?} is newer than {:?}: send the older one --from the newer one's base, or swap them",
            base.name,
            target.name
        );
    }
    Ok(())
}

/// Sends one section: Begin, records, Finish.
struct SectionSender<'a, W: StreamSink> {
    pool: &'a Pool,
    cache: &'a DigestCache,
    section: &'a Section,
    writer: &'a mut TrackedWriter<W>,
    summary: &'a mut SendSummary,
    progress: &'a mut dyn FnMut(u64),
    /// Read buffer for data, kept across ranges: an incremental stream
    /// has thousands of small ones.
    buffer: Vec<u8>,
}

/// What a section's records add up to as they are sent: the target's
/// digest and the bytes of each record kind. Every record changes both.
struct Tally {
    digest: DigestPlan,
    counts: Finish,
}

/// How the target's digest is found while its section is sent.
enum DigestPlan {
    /// In the pool's digest cache already.
    Cached(ContentDigest),
    /// Computed before sending, by reading the whole target.
    Computed(ContentDigest),
    /// Tracked from the records: a full stream's units added to nothing,
    /// or an incremental's changed units swapped in the base's digest,
    /// reading the old ones from the base.
    Tracked {
        running: ContentDigest,
        base: Option<Volume>,
    },
}

impl<W: StreamSink> SectionSender<'_, W> {
    fn send(&mut self, index: u32, resume_tag: [u8; 16], skip_begin: bool) -> Result<()> {
        let target = &self.section.target;
        let (base_guid, base_generation, base_name) = match &self.section.base {
            Some((_, base)) => (Some(base.guid), base.created_generation, base.name.clone()),
            None => (None, 0, String::new()),
        };
        if !skip_begin {
            self.writer.write(&Frame::Begin(Begin {
                section: index,
                base_guid,
                base_generation,
                target_guid: target.guid,
                target_generation: target.created_generation,
                target_created_unix_secs: target.created_unix_secs,
                size_bytes: target.size_bytes,
                block_size_bytes: self.pool.block_size_bytes(),
                resume_tag,
                target_name: target.name.clone(),
                base_name,
            }))?;
        }
        let volume = self.pool.volume(&target.name)?;
        let mut tally = Tally {
            digest: self.digest_plan(&volume)?,
            counts: Finish {
                content_digest: [0; 32],
                data_bytes: 0,
                zero_bytes: 0,
                hole_bytes: 0,
            },
        };
        for (start, end) in self.changed_ranges()? {
            for (window, window_end) in mapped_windows(start, end) {
                self.send_window(&volume, window, window_end, &mut tally)?;
            }
        }
        let Tally { digest, mut counts } = tally;
        let running = match digest {
            DigestPlan::Cached(d) => d,
            DigestPlan::Computed(d) | DigestPlan::Tracked { running: d, .. } => {
                self.cache.put(&target.guid, target.size_bytes, &d);
                d
            }
        };
        counts.content_digest = running.finish(target.size_bytes);
        self.summary.data_bytes += counts.data_bytes;
        self.summary.zero_bytes += counts.zero_bytes;
        self.summary.hole_bytes += counts.hole_bytes;
        self.writer.write(&Frame::Finish(counts))?;
        Ok(())
    }

    fn digest_plan(&self, volume: &Volume) -> Result<DigestPlan> {
        let target = &self.section.target;
        if let Some(known) = self.cache.get(&target.guid, target.size_bytes) {
            return Ok(DigestPlan::Cached(known));
        }
        if self.section.start_bytes == 0 {
            match &self.section.base {
                None => {
                    return Ok(DigestPlan::Tracked {
                        running: ContentDigest::empty(),
                        base: None,
                    })
                }
                Some((_, base)) if base.live && base.size_bytes == target.size_bytes => {
                    if let Some(known) = self.cache.get(&base.guid, base.size_bytes) {
                        return Ok(DigestPlan::Tracked {
                            running: known,
                            base: Some(self.pool.volume(&base.name)?),
                        });
                    }
                }
                Some(_) => {}
            }
        }
        // Resumed, or from a base whose digest is unknown or whose data is
        // gone: read the whole target once (and never again: it is cached).
        Ok(DigestPlan::Computed(volume_digest(volume)?))
    }

    /// Unit-aligned, sorted, disjoint byte ranges [start, end) of the
    /// target to send, from the section's start on.
    fn changed_ranges(&self) -> Result<Vec<(u64, u64)>> {
        let target = &self.section.target;
        let extents: Vec<(u64, u64)> = match &self.section.base {
            // All of it: send lists what is mapped a window at a
            // time, so a fragmented volume's extents are never all held.
            None => vec![(0, target.size_bytes)],
            Some((from, _)) => self
                .pool
                .diff_from(from, &target.name)?
                .extents
                .into_iter()
                .map(|e| (e.offset_bytes, e.length_bytes))
                .collect(),
        };
        Ok(unit_ranges(
            extents,
            target.size_bytes,
            self.section.start_bytes,
        ))
    }

    /// Sends [start, end), a window whose mapped extents are listed at
    /// once: Hole records where the target maps nothing, Zero and Data
    /// records where it does.
    fn send_window(
        &mut self,
        volume: &Volume,
        start: u64,
        end: u64,
        tally: &mut Tally,
    ) -> Result<()> {
        let mapped = mapped_units_in(volume, self.section.target.size_bytes, start, end)?;
        let mut at = start;
        let incremental = self.section.base.is_some();
        for (map_start, map_end) in mapped {
            if map_start > at && incremental {
                self.hole(at, map_start, tally)?;
            }
            self.data(volume, map_start, map_end, tally)?;
            at = map_end;
        }
        if at < end && incremental {
            self.hole(at, end, tally)?;
        }
        Ok(())
    }

    fn hole(&mut self, start: u64, end: u64, tally: &mut Tally) -> Result<()> {
        forget_old(&mut tally.digest, start, end)?;
        tally.counts.hole_bytes += end - start;
        self.write(&Frame::Hole {
            offset: start,
            length: end - start,
        })
    }

    /// Mapped units [start, end), read in chunks: runs of zero units go as
    /// Zero records, the rest as Data.
    fn data(&mut self, volume: &Volume, start: u64, end: u64, tally: &mut Tally) -> Result<()> {
        let mut buf = std::mem::take(&mut self.buffer);
        buf.resize(DATA_BYTES_MAX, 0);
        let mut at = start;
        let mut pending_zero: Option<(u64, u64)> = None;
        while at < end {
            let len = (end - at).min(DATA_BYTES_MAX as u64) as usize;
            let chunk = &mut buf[..len];
            volume
                .read_at(chunk, at)
                .with_context(|| format!("cannot read {:?} at {at}", self.section.target.name))?;
            forget_old(&mut tally.digest, at, at + len as u64)?;
            if let DigestPlan::Tracked { running, .. } = &mut tally.digest {
                running.add(at, chunk);
            }
            for (run_start, run_end, zero) in zero_runs(chunk) {
                let offset = at + run_start as u64;
                let length = (run_end - run_start) as u64;
                if zero {
                    pending_zero = match pending_zero {
                        Some((o, l)) if o + l == offset => Some((o, l + length)),
                        Some((o, l)) => {
                            self.zero(o, l, &mut tally.counts)?;
                            Some((offset, length))
                        }
                        None => Some((offset, length)),
                    };
                } else {
                    if let Some((o, l)) = pending_zero.take() {
                        self.zero(o, l, &mut tally.counts)?;
                    }
                    tally.counts.data_bytes += length;
                    let frame = Frame::Data {
                        offset,
                        bytes: chunk[run_start..run_end].to_vec(),
                    };
                    self.write(&frame)?;
                }
            }
            at += len as u64;
        }
        if let Some((o, l)) = pending_zero {
            self.zero(o, l, &mut tally.counts)?;
        }
        self.buffer = buf;
        Ok(())
    }

    fn zero(&mut self, offset: u64, length: u64, counts: &mut Finish) -> Result<()> {
        counts.zero_bytes += length;
        self.write(&Frame::Zero { offset, length })
    }

    fn write(&mut self, frame: &Frame) -> Result<()> {
        self.writer
            .write(frame)
            .context("cannot write the stream")?;
        (self.progress)(self.writer.frames.bytes_written);
        Ok(())
    }
}

/// [start, end) cut into windows of at most [`MAPPED_WINDOW_BYTES`], so
/// that a fragmented volume's mapped extents are never all held at once.
fn mapped_windows(start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut window = start;
    std::iter::from_fn(move || {
        (window < end).then(|| {
            let window_end = window.saturating_add(MAPPED_WINDOW_BYTES).min(end);
            (std::mem::replace(&mut window, window_end), window_end)
        })
    })
}

/// Takes the base's old units [start, end) out of a tracked digest.
fn forget_old(digest: &mut DigestPlan, start: u64, end: u64) -> Result<()> {
    if let DigestPlan::Tracked {
        running,
        base: Some(base),
    } = digest
    {
        remove_volume_units(running, base, start, end).context("cannot read the base snapshot")?;
    }
    Ok(())
}

/// Takes a volume's units [start, end) out of a digest. Only what the
/// volume maps is read (zero units add nothing to a digest), a chunk of
/// `DATA_BYTES_MAX` at a time: a Hole or Zero record may cover terabytes,
/// and memory must not follow its length.
pub(crate) fn remove_volume_units(
    digest: &mut ContentDigest,
    volume: &Volume,
    start: u64,
    end: u64,
) -> Result<()> {
    let mut buf = vec![0u8; DATA_BYTES_MAX];
    for_each_mapped_chunk(volume, start, end, &mut buf, |at, chunk| {
        digest.remove(at, chunk)
    })
}

/// Reads the units a volume maps in [start, end), in chunks of at most
/// `buf`'s length, and hands each to `f` with its offset.
fn for_each_mapped_chunk(
    volume: &Volume,
    start: u64,
    end: u64,
    buf: &mut [u8],
    mut f: impl FnMut(u64, &[u8]),
) -> Result<()> {
    let size = volume.size_bytes()?;
    let end = end.min(size);
    for (window, window_end) in mapped_windows(start, end) {
        for (run_start, run_end) in mapped_units_in(volume, size, window, window_end)? {
            let mut at = run_start;
            while at < run_end {
                let len = (run_end - at).min(buf.len() as u64) as usize;
                volume.read_at(&mut buf[..len], at)?;
                f(at, &buf[..len]);
                at += len as u64;
            }
        }
    }
    Ok(())
}

/// The whole digest units a volume of `size` bytes maps in [start, end),
/// clipped to it: one window's worth, listed at once.
fn mapped_units_in(volume: &Volume, size: u64, start: u64, end: u64) -> Result<Vec<(u64, u64)>> {
    let mapped = volume.mapped_extents_in(start, end - start)?;
    Ok(unit_ranges(mapped, size, start)
        .into_iter()
        .map(|(s, e)| (s, e.min(end)))
        .filter(|(s, e)| s < e)
        .collect())
}

/// Bytes of a volume whose mapped extents are listed at once when a long
/// range is read: at most 16,384 extents of 4 KiB blocks, 256 KiB of list.
const MAPPED_WINDOW_BYTES: u64 = 64 << 20;

/// Byte ranges widened to whole digest units (the last may end at the
/// volume's end), clipped to [from, size), merged, sorted.
pub(crate) fn unit_ranges(extents: Vec<(u64, u64)>, size: u64, from: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = extents
        .into_iter()
        .filter(|&(_, len)| len > 0)
        .map(|(offset, len)| {
            let start = offset / UNIT_BYTES * UNIT_BYTES;
            let end = offset.saturating_add(len).div_ceil(UNIT_BYTES) * UNIT_BYTES;
            (start.max(from), end.min(size))
        })
        .filter(|(s, e)| s < e)
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some((_, last_end)) if start <= *last_end => *last_end = (*last_end).max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Runs of whole units in `chunk` that are all zeros or not, as (start,
/// end, zero) byte offsets within the chunk.
fn zero_runs(chunk: &[u8]) -> Vec<(usize, usize, bool)> {
    let mut runs: Vec<(usize, usize, bool)> = Vec::new();
    for (i, unit) in chunk.chunks(UNIT_BYTES as usize).enumerate() {
        let zero = is_zero(unit);
        let start = i * UNIT_BYTES as usize;
        let end = start + unit.len();
        match runs.last_mut() {
            Some((_, last_end, last_zero)) if *last_zero == zero => *last_end = end,
            _ => runs.push((start, end, zero)),
        }
    }
    runs
}

/// The content digest of a whole volume, reading only what it maps.
pub fn volume_digest(volume: &Volume) -> Result<ContentDigest> {
    let mut digest = ContentDigest::empty();
    let mut buf = vec![0u8; DATA_BYTES_MAX];
    for_each_mapped_chunk(volume, 0, u64::MAX, &mut buf, |at, chunk| {
        digest.add(at, chunk)
    })?;
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_widen_to_units_merge_and_clip() {
        assert_eq!(
            unit_ranges(vec![(1024, 1024), (3072, 2048), (20480, 4096)], 1 << 20, 0),
            vec![(0, 8192), (20480, 24576)]
        );
        // Clipped at the volume's end and from the resume point.
        assert_eq!(
            unit_ranges(vec![(0, 16384)], 10240, 4096),
            vec![(4096, 10240)]
        );
        assert_eq!(unit_ranges(vec![(0, 4096)], 8192, 4096), vec![]);
    }

    #[test]
    fn zero_runs_split_by_unit() {
        let mut chunk = vec![0u8; 5 * 4096];
        chunk[4096 + 7] = 1;
        chunk[3 * 4096] = 1;
        assert_eq!(
            zero_runs(&chunk),
            vec![
                (0, 4096, true),
                (4096, 8192, false),
                (8192, 12288, true),
                (12288, 16384, false),
                (16384, 20480, true)
            ]
        );
    }
}
