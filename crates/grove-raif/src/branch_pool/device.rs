//! `BranchDevice`: the one `BlockDevice` the engine sits on, over all the
//! branches of a pool. Its bytes are cut into segments (`shape.rs`), each
//! a `Segment` (`segment.rs`) laid over the first branches of the pool
//! with the pool's level. A pool starts as one segment; `add_branch`
//! opens a wider one where the last ends, so the store grows onto the
//! new branch; `restripe` copies a narrow segment into one over every
//! branch, online, below a watermark kept in the shape.
//!
//! Requests hold `spread` shared while they route to segments; adding a
//! branch and each batch of a restripe hold it alone, so that no request
//! sees a segment half added or a watermark half raised. Long jobs
//! (rebuild, scrub) take the segments out under a brief shared hold and
//! work on those.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use grove_store::BlockDevice;

use super::repair::{RebuildReport, ScrubReport};
use super::segment::{read_lock, write_lock, Branch, Segment, STAGING_LIMIT_BYTES};
pub use super::segment::{Health, MemberDevices, MemberSpec, MemberStatus, MembershipRecorder};
use super::shape::{self, RestripeShape, SegmentShape, Shape};
use crate::level::Level;

/// Bytes of a narrow segment one restripe batch copies with the device
/// held alone: client requests wait for one such batch at most.
pub const RESTRIPE_BATCH_BYTES: u64 = 4 * 1024 * 1024;

/// Opens and makes the files of a branch, by its place (a directory, or a
/// name in memory): what the device needs to add segments, replace a
/// branch and keep its shape.
pub trait BranchFiles: Send + Sync {
    /// The branch's shape file, made empty if missing.
    fn shape(&self, place: &str) -> io::Result<Arc<dyn BlockDevice>>;
    /// Segment `id`'s files on the branch; `create` makes them empty
    /// (truncating what an unfinished attempt left).
    fn segment(&self, place: &str, id: u32, create: bool) -> io::Result<MemberDevices>;
    /// Removes segment `id`'s files from the branch (best effort).
    fn remove_segment(&self, place: &str, id: u32);
    /// The file system under the branch, if known.
    fn space(&self, place: &str) -> Option<BranchSpace> {
        let _ = place;
        None
    }
}

/// The file system a branch lies on, as statvfs says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchSpace {
    /// Tells file systems apart: branches on one share its room.
    pub file_system: u64,
    pub available_bytes: u64,
    pub total_bytes: u64,
}

/// A branch as `open` is given it: None for files that could not be used.
pub struct BranchSpec {
    pub label: String,
    pub place: String,
    pub usable: bool,
}

/// What a restripe did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RestripeReport {
    /// Segments copied onto every branch.
    pub segments: u64,
    pub bytes_copied: u64,
}

/// The segments and branches now: what requests route by.
struct Spread {
    branches: Vec<Arc<Branch>>,
    shape: Shape,
    shape_sequence: u64,
    /// In step with `shape.segments`.
    segments: Vec<Arc<Segment>>,
    /// The restripe's target, while `shape.restripe` is some.
    target: Option<Arc<Segment>>,
}

impl Spread {
    /// Every segment, the restripe's target included.
    fn all_segments(&self) -> Vec<Arc<Segment>> {
        self.segments
            .iter()
            .chain(self.target.iter())
            .cloned()
            .collect()
    }

    /// Calls `each(segment, offset in it, length, offset from `offset`)`
    /// for the pieces of `offset..offset + len`, in order: no allocation,
    /// as every request routes through here.
    fn route(
        &self,
        offset: u64,
        len: u64,
        mut each: impl FnMut(&Segment, u64, u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let end = offset + len;
        let mut at = offset;
        while at < end {
            // The last segment starting at or before `at` holds it.
            let i = self
                .shape
                .segments
                .iter()
                .rposition(|s| s.start <= at)
                .expect("the first segment starts at 0");
            let start = self.shape.segments[i].start;
            let mut stop = self
                .shape
                .segments
                .get(i + 1)
                .map_or(end, |s| s.start.min(end));
            let mut segment = &self.segments[i];
            if let Some(restripe) = self.restripe_of(i) {
                let watermark = start + restripe.done_bytes;
                if at < watermark {
                    segment = self.target.as_ref().expect("a restripe has a target");
                    stop = stop.min(watermark);
                }
            }
            each(segment, at - start, stop - at, at - offset)?;
            at = stop;
        }
        Ok(())
    }

    fn restripe_of(&self, i: usize) -> Option<RestripeShape> {
        self.shape
            .restripe
            .filter(|r| r.source == self.shape.segments[i].id)
    }

    /// Fails unless every branch is healthy: growth and restripe lay new
    /// segments over all of them.
    fn require_healthy(&self, before: &str) -> io::Result<()> {
        match self.branches.iter().find(|b| b.health() != Health::Healthy) {
            Some(b) => Err(io::Error::other(format!(
                "branch {} is {}: rebuild it before {before}",
                b.label,
                b.health()
            ))),
            None => Ok(()),
        }
    }

    /// Bytes of segment `i`, which is not the last: up to the next start.
    fn length_of(&self, i: usize) -> u64 {
        self.shape.segments[i + 1].start - self.shape.segments[i].start
    }

    /// The restripe in progress, its source's index and length.
    fn restripe_in_progress(&self) -> (RestripeShape, usize, u64) {
        let restripe = self.shape.restripe.expect("a restripe is in progress");
        let i = self
            .shape
            .index_of(restripe.source)
            .expect("a checked shape's restripe has a source");
        (restripe, i, self.length_of(i))
    }

    fn last(&self) -> (&SegmentShape, &Arc<Segment>) {
        let i = self.segments.len() - 1;
        (&self.shape.segments[i], &self.segments[i])
    }
}

/// The pool's device over its branches.
pub struct BranchDevice {
    level: Level,
    stripe_unit_bytes: u64,
    staging_limit_bytes: usize,
    restripe_batch_bytes: u64,
    spread: RwLock<Spread>,
    /// Set by any segment when a branch changes health; the next flush
    /// records it (the branches' identity files) and clears it.
    membership_dirty: Arc<AtomicBool>,
    recorder: Option<MembershipRecorder>,
    /// None for a device assembled from files given whole (tests): it
    /// cannot grow, restripe or keep a shape.
    files: Option<Arc<dyn BranchFiles>>,
    /// Branches found usable whose files could not be opened, with why
    /// (the first file's error): they run failed. The caller decides
    /// whether that is allowed and says so (one line, not a log line here).
    unopened: Vec<(String, String)>,
}

/// What `BranchDevice::open` assembles each segment from.
struct SegmentOpener<'a> {
    level: Level,
    stripe_unit_bytes: u64,
    branches: &'a [Arc<Branch>],
    files: &'a dyn BranchFiles,
    dirty: &'a Arc<AtomicBool>,
    unopened: &'a Unopened,
}

impl SegmentOpener<'_> {
    /// Segment `id` over the first `width` branches; a branch whose files
    /// cannot be opened is noted and runs failed in it.
    fn open(&self, id: u32, width: u32) -> io::Result<Arc<Segment>> {
        let members = self.branches[..width as usize]
            .iter()
            .map(|branch| {
                let devices = (branch.health() != Health::Failed)
                    .then(|| self.files.segment(&read_lock(&branch.place), id, false))
                    .and_then(|opened| {
                        opened
                            .map_err(|e| self.unopened.note(&branch.label, format!("{e}")))
                            .ok()
                    });
                (branch.clone(), devices)
            })
            .collect();
        Segment::assemble(
            self.level,
            self.stripe_unit_bytes,
            members,
            self.dirty.clone(),
            STAGING_LIMIT_BYTES,
        )
        .map(Arc::new)
    }
}

/// The branches whose files an open could not use, in the order found;
/// one entry (the first error) per branch.
#[derive(Default)]
struct Unopened(std::sync::Mutex<Vec<(String, String)>>);

impl Unopened {
    fn note(&self, label: &str, why: String) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !list.iter().any(|(l, _)| l == label) {
            list.push((label.to_string(), why));
        }
    }
}

impl BranchDevice {
    /// One segment over the branches given with their files: a device
    /// that keeps no shape file and cannot grow (tests, and the crash
    /// simulator's images). Replays the stripe journal.
    pub fn assemble(
        level: Level,
        stripe_unit_bytes: u64,
        members: Vec<MemberSpec>,
        recorder: Option<MembershipRecorder>,
    ) -> io::Result<BranchDevice> {
        let dirty = Arc::new(AtomicBool::new(false));
        let branches: Vec<Arc<Branch>> = members
            .iter()
            .map(|m| Arc::new(Branch::new(m.label.clone(), m.place.clone(), m.health)))
            .collect();
        let segment = Segment::assemble(
            level,
            stripe_unit_bytes,
            branches
                .iter()
                .cloned()
                .zip(members.into_iter().map(|m| m.devices))
                .collect(),
            dirty.clone(),
            STAGING_LIMIT_BYTES,
        )?;
        let width = branches.len();
        Ok(BranchDevice {
            level,
            stripe_unit_bytes,
            staging_limit_bytes: STAGING_LIMIT_BYTES,
            restripe_batch_bytes: RESTRIPE_BATCH_BYTES,
            spread: RwLock::new(Spread {
                branches,
                shape: Shape::single(width),
                shape_sequence: 0,
                segments: vec![Arc::new(segment)],
                target: None,
            }),
            membership_dirty: dirty,
            recorder,
            files: None,
            unopened: Vec::new(),
        })
    }

    /// Opens a pool's branches through `files`: the newest shape any
    /// usable branch keeps (one segment over all, for a pool that has
    /// none yet), then every segment's files. A branch whose files cannot
    /// be opened runs failed; past what the level survives, the open
    /// fails.
    pub fn open(
        level: Level,
        stripe_unit_bytes: u64,
        branches: Vec<BranchSpec>,
        files: Arc<dyn BranchFiles>,
        recorder: Option<MembershipRecorder>,
    ) -> io::Result<BranchDevice> {
        let dirty = Arc::new(AtomicBool::new(false));
        let shared: Vec<Arc<Branch>> = branches
            .iter()
            .map(|b| {
                let health = if b.usable {
                    Health::Healthy
                } else {
                    Health::Failed
                };
                Arc::new(Branch::new(b.label.clone(), b.place.clone(), health))
            })
            .collect();
        let unopened = Unopened::default();
        let (shape, sequence, in_step) = newest_shape(&shared, files.as_ref(), &dirty, &unopened)?;
        shape.check(shared.len()).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("branch pool shape: {why}"),
            )
        })?;
        let opener = SegmentOpener {
            level,
            stripe_unit_bytes,
            branches: &shared,
            files: files.as_ref(),
            dirty: &dirty,
            unopened: &unopened,
        };
        let segments = (shape.segments.iter())
            .map(|segment| opener.open(segment.id, segment.width))
            .collect::<io::Result<Vec<_>>>()?;
        let target = (shape.restripe)
            .map(|restripe| opener.open(restripe.target, shared.len() as u32))
            .transpose()?;
        let device = BranchDevice {
            level,
            stripe_unit_bytes,
            staging_limit_bytes: STAGING_LIMIT_BYTES,
            restripe_batch_bytes: RESTRIPE_BATCH_BYTES,
            spread: RwLock::new(Spread {
                branches: shared,
                shape,
                shape_sequence: sequence,
                segments,
                target,
            }),
            membership_dirty: dirty,
            recorder,
            files: Some(files),
            unopened: unopened.0.into_inner().unwrap_or_else(|e| e.into_inner()),
        };
        // A pool made before shapes, or a branch that missed the last save
        // (a crash in it), gets the shape now; otherwise opening writes none.
        if !in_step {
            let mut spread = write_lock(&device.spread);
            let shape = spread.shape.clone();
            device.save_shape(&mut spread, shape)?;
        }
        Ok(device)
    }

    /// A smaller staging limit, so tests reach the self-commit path.
    pub fn with_staging_limit(mut self, bytes: usize) -> BranchDevice {
        self.staging_limit_bytes = bytes.max(1);
        for segment in read_lock(&self.spread).all_segments() {
            segment.set_staging_limit(self.staging_limit_bytes);
        }
        self
    }

    /// A smaller restripe batch, so tests see many batches (and crashes
    /// between them) in a small pool.
    pub fn with_restripe_batch(mut self, bytes: u64) -> BranchDevice {
        self.restripe_batch_bytes = bytes.max(1);
        self
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// The branches `open` found usable but whose files it could not
    /// open, each with the error: they run failed.
    pub fn unopened_at_open(&self) -> &[(String, String)] {
        &self.unopened
    }

    pub fn stripe_unit_bytes(&self) -> u64 {
        self.stripe_unit_bytes
    }

    /// Branches in the pool.
    pub fn width(&self) -> usize {
        read_lock(&self.spread).branches.len()
    }

    /// Every branch's label, place and health, in label order.
    pub fn status(&self) -> Vec<MemberStatus> {
        read_lock(&self.spread)
            .branches
            .iter()
            .map(|b| b.status())
            .collect()
    }

    /// The segments (id, width, start) and the restripe in progress.
    pub fn shape(&self) -> Shape {
        read_lock(&self.spread).shape.clone()
    }

    /// True while some branch is failed or being rebuilt.
    pub fn is_degraded(&self) -> bool {
        read_lock(&self.spread)
            .branches
            .iter()
            .any(|b| b.health() != Health::Healthy)
    }

    /// True while some segment spans fewer branches than the pool has:
    /// a restripe would spread it.
    pub fn needs_restripe(&self) -> bool {
        let spread = read_lock(&self.spread);
        let width = spread.branches.len() as u32;
        spread.shape.restripe.is_some()
            || spread.shape.segments[..spread.segments.len() - 1]
                .iter()
                .any(|s| s.width < width)
    }

    /// Reads served by each branch so far, and its average read latency
    /// (the balancers' figures, over every segment), in label order.
    pub fn read_balance(&self) -> Vec<(u64, u64)> {
        let spread = read_lock(&self.spread);
        let mut totals = vec![(0u64, 0u128); spread.branches.len()];
        for segment in spread.all_segments() {
            for (b, (reads, latency)) in segment.read_balance().into_iter().enumerate() {
                totals[b].0 += reads;
                totals[b].1 += u128::from(reads) * u128::from(latency);
            }
        }
        totals
            .into_iter()
            .map(|(reads, weighted)| (reads, (weighted / u128::from(reads.max(1))) as u64))
            .collect()
    }

    pub fn place_of(&self, label: &str) -> Option<String> {
        self.branch(label).map(|b| read_lock(&b.place).clone())
    }

    pub fn health_of(&self, label: &str) -> Option<Health> {
        self.branch(label).map(|b| b.health())
    }

    fn branch(&self, label: &str) -> Option<Arc<Branch>> {
        read_lock(&self.spread)
            .branches
            .iter()
            .find(|b| b.label == label)
            .cloned()
    }

    fn branch_index(spread: &Spread, label: &str) -> io::Result<usize> {
        spread
            .branches
            .iter()
            .position(|b| b.label == label)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no branch labelled {label:?} in this pool"),
                )
            })
    }

    fn check_survives(spread: &Spread) -> io::Result<()> {
        spread
            .all_segments()
            .iter()
            .try_for_each(|segment| segment.check_survives())
    }

    /// Records the branches' health now (identity files).
    fn record_membership(&self) -> io::Result<()> {
        self.membership_dirty.store(false, Ordering::Release);
        match &self.recorder {
            Some(recorder) => recorder(&self.status()),
            None => Ok(()),
        }
    }

    fn record_if_changed(&self) -> io::Result<()> {
        if self.membership_dirty.load(Ordering::Acquire) {
            self.record_membership()?;
        }
        Ok(())
    }

    /// Writes `shape` to every branch that is not failed, with the next
    /// sequence, and makes it the device's. One copy is enough to open
    /// by, so only a shape no branch took fails.
    fn save_shape(&self, spread: &mut Spread, shape: Shape) -> io::Result<()> {
        let Some(files) = &self.files else {
            spread.shape = shape;
            return Ok(());
        };
        shape
            .check(spread.branches.len())
            .expect("the device saves only shapes that check out");
        let sequence = spread.shape_sequence + 1;
        let mut saved = 0;
        let mut last_error = None;
        for branch in &spread.branches {
            if branch.health() == Health::Failed {
                continue;
            }
            let result = files
                .shape(&read_lock(&branch.place))
                .and_then(|device| shape::write(&device, sequence, &shape));
            match result {
                Ok(()) => saved += 1,
                Err(e) => {
                    tracing::warn!("branch {}: shape not saved: {e}", branch.label);
                    last_error = Some(e);
                }
            }
        }
        if saved == 0 {
            return Err(last_error.unwrap_or_else(|| io::Error::other("no branch to save on")));
        }
        spread.shape = shape;
        spread.shape_sequence = sequence;
        Ok(())
    }

    fn files(&self) -> io::Result<&Arc<dyn BranchFiles>> {
        self.files.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "this branch device was assembled from given files and cannot make more",
            )
        })
    }

    fn new_segment(&self, id: u32, branches: &[Arc<Branch>]) -> io::Result<Arc<Segment>> {
        let files = self.files()?;
        let members = branches
            .iter()
            .map(|branch| {
                files
                    .segment(&read_lock(&branch.place), id, true)
                    .map(|devices| (branch.clone(), Some(devices)))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let segment = Segment::assemble(
            self.level,
            self.stripe_unit_bytes,
            members,
            self.membership_dirty.clone(),
            self.staging_limit_bytes,
        )?;
        Ok(Arc::new(segment))
    }

    // ----- growth -----

    /// Adds branches, each (label, place: its directory, prepared by the
    /// caller): the last segment ends where it stands, and a new one over
    /// every branch starts there, so the store grows onto the new ones.
    /// Refused while the pool is degraded or a restripe is unfinished.
    pub fn add_branches(&self, added: &[(String, String)]) -> io::Result<()> {
        self.files()?;
        self.flush()?;
        let mut spread = write_lock(&self.spread);
        let width = spread.branches.len() + added.len();
        crate::layout::Layout::new(self.level, width, self.stripe_unit_bytes, 0).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} over {width} branches: {e}", self.level),
            )
        })?;
        for (label, _) in added {
            if spread.branches.iter().any(|b| b.label == *label) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("the pool has a branch labelled {label} already"),
                ));
            }
        }
        spread.require_healthy("adding a branch")?;
        if spread.shape.restripe.is_some() {
            return Err(io::Error::other(
                "a restripe is unfinished: run `grove branch restripe` to finish it first",
            ));
        }
        if spread.shape.segments.len() >= shape::SEGMENTS_MAX {
            return Err(io::Error::other(format!(
                "the pool has {} segments, the most it keeps: restripe it first",
                shape::SEGMENTS_MAX
            )));
        }
        let (last, last_segment) = spread.last();
        let start = last.start + last_segment.len_bytes()?;
        let mut branches = spread.branches.clone();
        for (label, place) in added {
            branches.push(Arc::new(Branch::new(
                label.clone(),
                place.clone(),
                Health::Healthy,
            )));
        }
        let id = spread.shape.next_id();
        let segment = self.new_segment(id, &branches)?;
        let mut shape = spread.shape.clone();
        shape.segments.push(SegmentShape {
            id,
            width: width as u32,
            start,
        });
        // The new branches take the shape too: it is saved on every branch.
        let before = std::mem::replace(&mut spread.branches, branches);
        if let Err(e) = self.save_shape(&mut spread, shape) {
            spread.branches = before;
            return Err(e);
        }
        spread.segments.push(segment);
        drop(spread);
        for (label, place) in added {
            tracing::info!(
                "branch {label} ({place}) added; new space is laid over it from byte {start}"
            );
        }
        self.record_membership()
    }

    /// Copies every segment narrower than the pool onto all its branches,
    /// one batch at a time, online; resumes one a crash or `stop` cut
    /// short. `progress(done, total)` counts bytes of the narrow segments.
    pub fn restripe(
        &self,
        progress: &mut dyn FnMut(u64, u64),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<RestripeReport> {
        self.files()?;
        let mut report = RestripeReport::default();
        let total = self.narrow_bytes();
        let mut done_before = 0;
        progress(0, total);
        while let Some((length, mut done)) = self.start_restripe()? {
            while done < length {
                if stop() {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        format!("restripe stopped at byte {done} of {length}"),
                    ));
                }
                let copied = self.restripe_batch()?;
                report.bytes_copied += copied;
                done += copied;
                progress(done_before + done, total);
            }
            self.finish_restripe()?;
            report.segments += 1;
            done_before += length;
        }
        progress(total, total);
        Ok(report)
    }

    /// Bytes of segments narrower than the pool, left to copy.
    fn narrow_bytes(&self) -> u64 {
        let spread = read_lock(&self.spread);
        let width = spread.branches.len() as u32;
        let shape = &spread.shape;
        (0..shape.segments.len() - 1)
            .filter(|&i| shape.segments[i].width < width || spread.restripe_of(i).is_some())
            .map(|i| {
                let length = spread.length_of(i);
                length - spread.restripe_of(i).map_or(0, |r| r.done_bytes)
            })
            .sum()
    }

    /// The restripe in progress, or a new one of the first narrow
    /// segment: its length and how much is copied. None: nothing is narrow.
    fn start_restripe(&self) -> io::Result<Option<(u64, u64)>> {
        let mut spread = write_lock(&self.spread);
        if spread.shape.restripe.is_some() {
            let (restripe, _, length) = spread.restripe_in_progress();
            return Ok(Some((length, restripe.done_bytes)));
        }
        let width = spread.branches.len() as u32;
        let last = spread.segments.len() - 1;
        let Some(i) = (0..last).find(|&i| spread.shape.segments[i].width < width) else {
            return Ok(None);
        };
        spread.require_healthy("a restripe")?;
        let length = spread.length_of(i);
        let id = spread.shape.next_id();
        let branches = spread.branches.clone();
        let target = self.new_segment(id, &branches)?;
        target.set_len_bytes(length)?;
        target.flush()?;
        let mut shape = spread.shape.clone();
        shape.restripe = Some(RestripeShape {
            source: spread.shape.segments[i].id,
            target: id,
            done_bytes: 0,
        });
        self.save_shape(&mut spread, shape)?;
        spread.target = Some(target);
        tracing::info!(
            "restripe: segment {} ({} bytes over {} branches) is being copied over all {width}",
            spread.shape.segments[i].id,
            length,
            spread.shape.segments[i].width
        );
        Ok(Some((length, 0)))
    }

    /// Copies the next batch of the narrow segment into its target, makes
    /// the copy durable, raises the watermark in the shape, and then
    /// punches the source's copied stripes. Returns the bytes copied.
    fn restripe_batch(&self) -> io::Result<u64> {
        let mut spread = write_lock(&self.spread);
        let (restripe, i, length) = spread.restripe_in_progress();
        let source = spread.segments[i].clone();
        let target = spread.target.clone().expect("a restripe has a target");
        let from = restripe.done_bytes;
        let n = self.restripe_batch_bytes.min(length - from);
        let mut bytes = vec![0u8; n as usize];
        source.read_at(&mut bytes, from)?;
        if !is_zero(&bytes) || !target_is_zero(&target, from, n)? {
            target.write_at(&bytes, from)?;
        }
        target.flush()?;
        let mut shape = spread.shape.clone();
        shape.restripe = Some(RestripeShape {
            done_bytes: from + n,
            ..restripe
        });
        self.save_shape(&mut spread, shape)?;
        drop(spread);
        // Below the watermark nothing reads the source any more.
        source.punch(from, n)?;
        Ok(n)
    }

    /// The target takes the source's place, and the source's files go.
    fn finish_restripe(&self) -> io::Result<()> {
        let mut spread = write_lock(&self.spread);
        let (restripe, i, length) = spread.restripe_in_progress();
        assert_eq!(restripe.done_bytes, length, "the whole source is copied");
        let mut shape = spread.shape.clone();
        shape.segments[i] = SegmentShape {
            id: restripe.target,
            width: spread.branches.len() as u32,
            start: shape.segments[i].start,
        };
        shape.restripe = None;
        self.save_shape(&mut spread, shape)?;
        let target = spread.target.take().expect("a restripe has a target");
        let source = std::mem::replace(&mut spread.segments[i], target);
        let places: Vec<String> = spread
            .branches
            .iter()
            .map(|b| read_lock(&b.place).clone())
            .collect();
        drop(spread);
        drop(source);
        let files = self.files()?;
        for place in &places {
            files.remove_segment(place, restripe.source);
        }
        tracing::info!(
            "restripe: segment {} now lies over every branch (as {})",
            restripe.source,
            restripe.target
        );
        Ok(())
    }

    // ----- repairs -----

    /// Puts fresh files in the place of branch `label`, which then shows
    /// as rebuilding (written by commits, never read) until `rebuild` has
    /// refilled it. `devices` are its files for the first segment; those
    /// of any other are made through the device's `BranchFiles`. Refused
    /// if the other branches could not serve every stripe without it.
    pub fn replace(&self, label: &str, place: String, devices: MemberDevices) -> io::Result<()> {
        self.replace_with(label, place, Some(devices))
    }

    /// `replace` with every segment's files made at `place` through the
    /// device's `BranchFiles`.
    pub fn replace_at(&self, label: &str, place: String) -> io::Result<()> {
        self.replace_with(label, place, None)
    }

    fn replace_with(
        &self,
        label: &str,
        place: String,
        first: Option<MemberDevices>,
    ) -> io::Result<()> {
        if self.level == Level::Raif0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} keeps no redundancy: a branch of it cannot be rebuilt",
                    self.level
                ),
            ));
        }
        let mut spread = write_lock(&self.spread);
        let b = Self::branch_index(&spread, label)?;
        let ids: Vec<(u32, usize)> = spread
            .shape
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| b < s.width as usize)
            .map(|(i, s)| (s.id, i))
            .collect();
        let mut devices = Vec::new();
        for &(id, i) in &ids {
            devices.push(match (i, &first) {
                (0, Some(given)) => given.clone(),
                _ => self.files()?.segment(&place, id, true)?,
            });
        }
        // The shape file first: what watchers look for in a branch.
        if let Some(files) = &self.files {
            files.shape(&place)?;
        }
        let target_devices = match spread.shape.restripe {
            Some(r) => Some(self.files()?.segment(&place, r.target, true)?),
            None => None,
        };
        let branch = spread.branches[b].clone();
        let before = branch.set_health(Health::Rebuilding);
        if let Err(e) = Self::check_survives(&spread) {
            branch.set_health(before);
            return Err(e);
        }
        for (&(_, i), devices) in ids.iter().zip(devices) {
            spread.segments[i].replace_devices(b, devices);
        }
        if let (Some(target), Some(devices)) = (&spread.target, target_devices) {
            target.replace_devices(b, devices);
        }
        *write_lock(&branch.place) = place;
        let shape = spread.shape.clone();
        self.save_shape(&mut spread, shape)?;
        drop(spread);
        self.record_membership()
    }

    /// Takes branch `label` out of service, as `mdadm --fail` does: it is
    /// no longer read or written, and the pool runs degraded until the
    /// branch is replaced and rebuilt. Refused if the others could not
    /// serve every stripe without it. `why` goes in the log line.
    pub fn fail_branch(&self, label: &str, why: &str) -> io::Result<()> {
        let spread = read_lock(&self.spread);
        let b = Self::branch_index(&spread, label)?;
        let branch = spread.branches[b].clone();
        if branch.health() == Health::Failed {
            return Ok(());
        }
        let before = branch.set_health(Health::Failed);
        if let Err(e) = Self::check_survives(&spread) {
            branch.set_health(before);
            return Err(e);
        }
        tracing::error!(
            "branch {label} ({}) failed: {why}; the pool is degraded",
            read_lock(&branch.place)
        );
        drop(spread);
        self.record_membership()
    }

    /// Refills the rebuilding branch `label` from the others, segment by
    /// segment, reading back what it wrote; then marks it healthy.
    /// `progress(done, total)` follows the stripes; `stop()` true ends the
    /// rebuild early (the branch stays rebuilding, to be run again).
    pub fn rebuild(
        &self,
        label: &str,
        progress: &mut dyn FnMut(u64, u64),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<RebuildReport> {
        let (b, branch, segments) = {
            let spread = read_lock(&self.spread);
            let b = Self::branch_index(&spread, label)?;
            let segments: Vec<Arc<Segment>> = spread
                .all_segments()
                .into_iter()
                .filter(|s| b < s.width())
                .collect();
            (b, spread.branches[b].clone(), segments)
        };
        if branch.health() != Health::Rebuilding {
            return Err(io::Error::other(format!(
                "branch {label} is {}, not rebuilding: replace it first",
                branch.health()
            )));
        }
        let mut total = 0;
        for segment in &segments {
            total += segment.stripe_count()?;
        }
        let mut done = 0;
        let mut bytes_written = 0;
        progress(done, total);
        for segment in &segments {
            bytes_written += segment.rebuild_member(
                b,
                &mut |stripes| {
                    done += stripes;
                    progress(done, total);
                },
                stop,
            )?;
        }
        branch.set_health(Health::Healthy);
        self.record_membership()?;
        tracing::info!("branch {label} rebuilt: {total} stripes, verified");
        Ok(RebuildReport {
            label: label.to_string(),
            stripes: total,
            bytes_written,
        })
    }

    /// Reads every stripe of every segment from every readable branch and
    /// checks it against its sums, mirrors and parity; with `repair`,
    /// writes what is wrong again from what is right.
    pub fn scrub(
        &self,
        repair: bool,
        progress: &mut dyn FnMut(u64, u64),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<ScrubReport> {
        let segments = read_lock(&self.spread).all_segments();
        let mut total = 0;
        for segment in &segments {
            segment.flush()?;
            total += segment.stripe_count()?;
        }
        let mut report = ScrubReport::default();
        let mut done = 0;
        progress(done, total);
        for segment in &segments {
            segment.scrub(
                repair,
                &mut report,
                &mut |stripes| {
                    done += stripes;
                    progress(done, total);
                },
                stop,
            )?;
        }
        self.record_if_changed()?;
        Ok(report)
    }
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Whether the target holds zeros at `from..from + n` already: a hole of
/// the source is copied by leaving the fresh target's hole alone, so a
/// restripe keeps a sparse store sparse. (A restripe resumed after a
/// crash may find an earlier attempt's bytes there: those are written.)
fn target_is_zero(target: &Segment, from: u64, n: u64) -> io::Result<bool> {
    let mut bytes = vec![0u8; n as usize];
    target.read_at(&mut bytes, from)?;
    Ok(is_zero(&bytes))
}

/// The newest valid shape on any usable branch, its sequence, and whether
/// every usable branch holds it; one segment over every branch if none
/// keeps one (a pool made before shapes). A branch whose shape file
/// cannot be read is failed.
fn newest_shape(
    branches: &[Arc<Branch>],
    files: &dyn BranchFiles,
    dirty: &AtomicBool,
    unopened: &Unopened,
) -> io::Result<(Shape, u64, bool)> {
    let mut newest: Option<(u64, Shape)> = None;
    // The sequence each usable branch holds (None: no valid shape).
    let mut held = Vec::new();
    let mut damaged = Vec::new();
    for branch in branches {
        if branch.health() == Health::Failed {
            continue;
        }
        let found = files
            .shape(&read_lock(&branch.place))
            .and_then(|device| shape::read(&device));
        match found {
            Ok(shape::Found::Shape(sequence, shape)) => {
                held.push(Some(sequence));
                if newest.as_ref().is_none_or(|(s, _)| *s < sequence) {
                    newest = Some((sequence, shape));
                }
            }
            Ok(shape::Found::Nothing) => held.push(None),
            Ok(shape::Found::Damaged(why)) => {
                held.push(None);
                damaged.push(format!("{}: {why}", branch.label));
            }
            Err(e) => {
                unopened.note(&branch.label, format!("its shape file cannot be read: {e}"));
                branch.set_health(Health::Failed);
                dirty.store(true, Ordering::Release);
            }
        }
    }
    match newest {
        Some((sequence, shape)) => {
            let in_step = held.iter().all(|&h| h == Some(sequence));
            Ok((shape, sequence, in_step))
        }
        None if damaged.is_empty() => Ok((Shape::single(branches.len()), 0, false)),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no branch keeps a readable shape ({})", damaged.join("; ")),
        )),
    }
}

impl BlockDevice for BranchDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let spread = read_lock(&self.spread);
        spread.route(offset, buf.len() as u64, |segment, at, n, buf_at| {
            let (buf_at, n) = (buf_at as usize, n as usize);
            segment.read_at(&mut buf[buf_at..buf_at + n], at)
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let spread = read_lock(&self.spread);
        spread.route(offset, buf.len() as u64, |segment, at, n, buf_at| {
            let (buf_at, n) = (buf_at as usize, n as usize);
            segment.write_at(&buf[buf_at..buf_at + n], at)
        })
    }

    fn flush(&self) -> io::Result<()> {
        let segments = read_lock(&self.spread).all_segments();
        for segment in &segments {
            segment.flush()?;
        }
        self.record_if_changed()
    }

    fn len_bytes(&self) -> io::Result<u64> {
        let spread = read_lock(&self.spread);
        let (last, segment) = spread.last();
        Ok(last.start + segment.len_bytes()?)
    }

    /// Only the last segment changes length: the others end where the
    /// next starts.
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        let spread = read_lock(&self.spread);
        let (last, segment) = spread.last();
        let Some(length) = len_bytes.checked_sub(last.start) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a branch pool cannot shrink below {} bytes, where its last segment starts",
                    last.start
                ),
            ));
        };
        segment.set_len_bytes(length)
    }

    fn describe(&self) -> String {
        let spread = read_lock(&self.spread);
        let labels: Vec<String> = spread
            .branches
            .iter()
            .map(|b| format!("{} {}", b.label, read_lock(&b.place)))
            .collect();
        format!("{} pool over {}", self.level, labels.join(", "))
    }

    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        let spread = read_lock(&self.spread);
        spread.route(offset, len_bytes, |segment, at, n, _| segment.punch(at, n))
    }

    /// The data the last segment can still take: each branch's share of
    /// its file system (shared evenly by the branches on one), the
    /// smallest of them, times the data units of a stripe. A branch added
    /// on a disk of its own raises it.
    fn host_space(&self) -> Option<grove_store::HostSpace> {
        let files = self.files.as_ref()?;
        let spread = read_lock(&self.spread);
        let (last, _) = spread.last();
        let width = last.width as usize;
        let mut spaces = Vec::with_capacity(width);
        for branch in &spread.branches[..width] {
            if branch.health() != Health::Failed {
                spaces.push(files.space(&read_lock(&branch.place))?);
            }
        }
        let sharing = |space: &BranchSpace| {
            spaces
                .iter()
                .filter(|s| s.file_system == space.file_system)
                .count() as u64
        };
        let data_units = self.level.data_units(width) as u64;
        let available = spaces
            .iter()
            .map(|s| s.available_bytes / sharing(s))
            .min()?;
        let total = spaces.iter().map(|s| s.total_bytes / sharing(s)).min()?;
        Some(grove_store::HostSpace {
            available_bytes: available.saturating_mul(data_units),
            total_bytes: total.saturating_mul(data_units),
        })
    }

    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        let mut total = 0;
        for segment in read_lock(&self.spread).all_segments() {
            match segment.allocated_bytes()? {
                Some(bytes) => total += bytes,
                None => return Ok(None),
            }
        }
        Ok(Some(total))
    }
}
