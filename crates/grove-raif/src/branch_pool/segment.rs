//! `Segment`: one `BlockDevice` laid out over the branches of a pool,
//! with RAIF 0, 1, 5, 6 or 10. The engine above sees a single device.
//!
//! The device's bytes are cut into stripes (`Layout` with start 0): stripe
//! `s` holds `k` data units and the level's parity, one unit per branch at
//! offset `s * unit` of each branch's data file.
//!
//! Writes with redundancy (every level but RAIF0) are staged: a write lays
//! its bytes over an in-memory copy of each stripe it touches, reads see the
//! staged copies, and `flush` commits them: the stripe journal first
//! (`journal.rs`, synced on every healthy branch), then the stripes home,
//! then a sync of the branches. A stripe on a branch is therefore only ever
//! rewritten while the journal holds its new contents, which closes the
//! write hole. RAIF0 has no redundancy to keep in step and writes through.
//!
//! Locks, always taken in this order: `commits` (one commit at a time),
//! `gate` (readers of the branches share it; writes home, punches and
//! repairs hold it alone, so nobody reads a stripe half rewritten), then
//! `staging` (held briefly, never across branch I/O).

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use grove_store::BlockDevice;

use super::journal;
use crate::balance::Balancer;
use crate::codec;
use crate::layout::Layout;
use crate::level::Level;
use crate::raid::{self, BranchIo, RaidError};

/// Staged stripe bytes past which a write commits on its own, so that a
/// client that never flushes cannot make the device hold unbounded memory.
pub const STAGING_LIMIT_BYTES: usize = 32 * 1024 * 1024;
/// Most consecutive stripes written home in one write per branch, which
/// bounds the buffers a commit holds (width x this x unit).
pub const HOME_RUN_STRIPES_MAX: u64 = 256;
/// Bytes of one stripe unit's checksum in a branch's sums file.
pub const SUM_BYTES: u64 = 4;
/// The checksum value that means "not known" (a punched or never-written
/// unit): scrub then falls back to comparing copies and parity.
pub const SUM_UNKNOWN: u32 = 0;

/// The files (or memory devices) of one branch.
#[derive(Clone)]
pub struct MemberDevices {
    /// Stripe units at `stripe * unit`.
    pub data: Arc<dyn BlockDevice>,
    /// The stripe journal (see `journal.rs`).
    pub journal: Arc<dyn BlockDevice>,
    /// A crc32c per stripe unit at `stripe * SUM_BYTES`, kept by commits.
    pub sums: Arc<dyn BlockDevice>,
}

/// Where a branch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Read and written.
    Healthy,
    /// Neither read nor written: lost, missing or stale.
    Failed,
    /// A replacement being refilled: written, not read until whole.
    Rebuilding,
}

impl Health {
    fn code(self) -> u8 {
        match self {
            Health::Healthy => 0,
            Health::Failed => 1,
            Health::Rebuilding => 2,
        }
    }

    fn from_code(code: u8) -> Health {
        match code {
            0 => Health::Healthy,
            2 => Health::Rebuilding,
            _ => Health::Failed,
        }
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Health::Healthy => "ok",
            Health::Failed => "failed",
            Health::Rebuilding => "rebuilding",
        })
    }
}

/// One branch as the device sees it.
pub struct MemberSpec {
    pub label: String,
    /// Where it is, for messages (a directory, or "memory").
    pub place: String,
    /// None for a branch that could not be opened at all.
    pub devices: Option<MemberDevices>,
    pub health: Health,
}

/// A branch's label, place and health, as `status` reports them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberStatus {
    pub label: String,
    pub place: String,
    pub health: Health,
}

/// Called after a branch changes health, with every branch's status, so
/// that the pool's own records (the branches' identity files) follow.
pub type MembershipRecorder = Box<dyn Fn(&[MemberStatus]) -> io::Result<()> + Send + Sync>;

/// One branch as every segment sees it: its label, where it is and its
/// health are the branch's, shared by the segments laid over it, so that a
/// branch one segment finds failed is failed for all of them.
pub(super) struct Branch {
    pub(super) label: String,
    pub(super) place: RwLock<String>,
    health: AtomicU8,
}

impl Branch {
    pub(super) fn new(label: String, place: String, health: Health) -> Branch {
        Branch {
            label,
            place: RwLock::new(place),
            health: AtomicU8::new(health.code()),
        }
    }

    pub(super) fn health(&self) -> Health {
        Health::from_code(self.health.load(Ordering::Acquire))
    }

    pub(super) fn set_health(&self, health: Health) -> Health {
        Health::from_code(self.health.swap(health.code(), Ordering::AcqRel))
    }

    pub(super) fn status(&self) -> MemberStatus {
        MemberStatus {
            label: self.label.clone(),
            place: read_lock(&self.place).clone(),
            health: self.health(),
        }
    }
}

/// A branch's share of one segment: the branch, and its files for it.
pub(super) struct Member {
    pub(super) label: String,
    pub(super) branch: Arc<Branch>,
    pub(super) devices: RwLock<Option<MemberDevices>>,
}

impl Member {
    pub(super) fn health(&self) -> Health {
        self.branch.health()
    }

    pub(super) fn set_health(&self, health: Health) -> Health {
        self.branch.set_health(health)
    }

    pub(super) fn devices(&self) -> io::Result<MemberDevices> {
        read_lock(&self.devices).clone().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("branch {} is not open", self.label),
            )
        })
    }
}

/// Stripes written but not yet committed, and those being committed.
#[derive(Default)]
struct Staging {
    pending: BTreeMap<u64, Vec<u8>>,
    /// The commit in progress: readers see these until they are home.
    committing: Arc<BTreeMap<u64, Vec<u8>>>,
    /// Counts commits whose stripes went home, so that a writer who loaded
    /// a stripe from the branches knows whether a commit overtook it.
    epoch: u64,
}

struct CommitState {
    next_sequence: u64,
    /// The branches the last journal went to. Every other healthy branch
    /// holds an empty journal, so that replay never finds an old one
    /// there: when the set changes, every healthy branch is emptied first.
    journal_set: Vec<usize>,
}

/// A stretch of the pool's bytes laid over its first `width` branches
/// with the pool's level (see the module's comment).
pub(super) struct Segment {
    pub(super) layout: Layout,
    pub(super) members: Vec<Member>,
    staging: Mutex<Staging>,
    staging_limit_bytes: AtomicUsize,
    pub(super) gate: RwLock<()>,
    commits: Mutex<CommitState>,
    balancer: Balancer,
    /// Shared by every segment of the device: set when a branch changes
    /// health, cleared when the device has recorded it.
    membership_dirty: Arc<AtomicBool>,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn read_lock<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write_lock<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn raid_error(error: RaidError) -> io::Error {
    io::Error::other(format!("branch pool: {error}"))
}

/// A unit's checksum as the sums file keeps it: never SUM_UNKNOWN.
pub fn unit_sum(unit: &[u8]) -> u32 {
    crc32c::crc32c(unit).max(1)
}

/// The raid functions' view of the branches.
pub(super) struct Io<'a>(pub(super) &'a Segment);

impl BranchIo for Io<'_> {
    fn read_at(&self, branch: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let started = Instant::now();
        self.0.members[branch]
            .devices()?
            .data
            .read_at(buf, offset)?;
        self.0.balancer.record(branch, started.elapsed());
        Ok(())
    }

    fn write_at(&self, branch: usize, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.members[branch]
            .devices()?
            .data
            .write_at(data, offset)
    }

    fn is_failed(&self, branch: usize) -> bool {
        self.0.members[branch].health() != Health::Healthy
    }

    fn fail(&self, branch: usize, error: &io::Error) {
        self.0.mark_failed(branch, error);
    }

    fn choose(&self, copies: &[usize]) -> usize {
        self.0.balancer.choose(copies)
    }
}

impl Segment {
    /// Puts a segment together from its branches' files and replays its
    /// stripe journal, so that every stripe agrees with its parity before
    /// the first read. A branch without files here is failed. Fails if
    /// more branches are unusable than the level survives.
    pub(super) fn assemble(
        level: Level,
        stripe_unit_bytes: u64,
        members: Vec<(Arc<Branch>, Option<MemberDevices>)>,
        membership_dirty: Arc<AtomicBool>,
        staging_limit_bytes: usize,
    ) -> io::Result<Segment> {
        let layout = Layout::new(level, members.len(), stripe_unit_bytes, 0)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let members: Vec<Member> = members
            .into_iter()
            .map(|(branch, devices)| {
                if devices.is_none() && branch.set_health(Health::Failed) != Health::Failed {
                    membership_dirty.store(true, Ordering::Release);
                }
                Member {
                    label: branch.label.clone(),
                    branch,
                    devices: RwLock::new(devices),
                }
            })
            .collect();
        let device = Segment {
            balancer: Balancer::new(members.len()),
            layout,
            members,
            staging: Mutex::new(Staging::default()),
            staging_limit_bytes: AtomicUsize::new(staging_limit_bytes.max(1)),
            gate: RwLock::new(()),
            commits: Mutex::new(CommitState {
                next_sequence: 1,
                journal_set: Vec::new(),
            }),
            membership_dirty,
        };
        device.check_survives()?;
        if device.is_staged() {
            device.replay_journal()?;
        }
        Ok(device)
    }

    /// A smaller staging limit, so tests reach the self-commit path.
    pub(super) fn set_staging_limit(&self, bytes: usize) {
        self.staging_limit_bytes
            .store(bytes.max(1), Ordering::Relaxed);
    }

    pub(super) fn width(&self) -> usize {
        self.members.len()
    }

    /// Reads served by each branch so far, and its average read latency
    /// (the balancer's figures), in label order.
    pub(super) fn read_balance(&self) -> Vec<(u64, u64)> {
        (0..self.members.len())
            .map(|b| (self.balancer.reads(b), self.balancer.latency_ns(b)))
            .collect()
    }

    fn is_staged(&self) -> bool {
        self.layout.level != Level::Raif0
    }

    fn stripe_bytes(&self) -> u64 {
        self.layout.stripe_data_bytes()
    }

    /// Fails unless every stripe keeps a way to every unit with the
    /// branches that are not healthy gone.
    pub(super) fn check_survives(&self) -> io::Result<()> {
        let lost: Vec<usize> = (0..self.members.len())
            .filter(|&b| self.members[b].health() != Health::Healthy)
            .collect();
        if raid::survives(&self.layout, &lost) {
            return Ok(());
        }
        let names: Vec<String> = lost
            .iter()
            .map(|&b| self.members[b].label.clone())
            .collect();
        Err(io::Error::other(format!(
            "{} over {} branches cannot do without {} ({} branch(es) unusable; it survives {})",
            self.layout.level,
            self.members.len(),
            names.join(", "),
            lost.len(),
            self.layout.level.tolerated_losses(self.members.len())
        )))
    }

    /// Marks a branch failed after an I/O error: it is no longer read or
    /// written, the pool runs degraded, and the next commit records it.
    pub(super) fn mark_failed(&self, branch: usize, error: &io::Error) {
        let member = &self.members[branch];
        if member.set_health(Health::Failed) != Health::Failed {
            tracing::error!(
                "branch {} ({}) failed: {error}; the pool is degraded",
                member.label,
                read_lock(&member.branch.place)
            );
            self.membership_dirty.store(true, Ordering::Release);
        }
    }

    /// Reads a stripe's data from the branches (rebuilt where lost).
    fn load_stripe(&self, stripe: u64) -> io::Result<Vec<u8>> {
        let mut data = vec![0u8; self.stripe_bytes() as usize];
        let _gate = read_lock(&self.gate);
        raid::read(
            &self.layout,
            &Io(self),
            stripe * self.stripe_bytes(),
            &mut data,
        )
        .map_err(raid_error)?;
        Ok(data)
    }

    fn read_home(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let _gate = read_lock(&self.gate);
        raid::read(&self.layout, &Io(self), offset, buf).map_err(raid_error)
    }

    /// The stripes a byte range touches: (stripe, offset in it, length,
    /// offset in the caller's buffer).
    fn pieces(&self, offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
        let stripe_bytes = self.stripe_bytes();
        let end = offset + len as u64;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let stripe = at / stripe_bytes;
            let within = at % stripe_bytes;
            let n = (stripe_bytes - within).min(end - at);
            let piece = (stripe, within as usize, n as usize, (at - offset) as usize);
            at += n;
            Some(piece)
        })
    }

    fn staged_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // Staged stripes are copied under the staging lock; the runs in
        // between are read from the branches after it is let go.
        let mut from_home: Vec<(u64, usize, usize)> = Vec::new();
        {
            let staging = lock(&self.staging);
            for (stripe, within, n, at) in self.pieces(offset, buf.len()) {
                let staged = staging
                    .pending
                    .get(&stripe)
                    .or_else(|| staging.committing.get(&stripe));
                match staged {
                    Some(data) => buf[at..at + n].copy_from_slice(&data[within..within + n]),
                    None => match from_home.last_mut() {
                        Some((_, run_at, run_len)) if *run_at + *run_len == at => *run_len += n,
                        _ => from_home.push((offset + at as u64, at, n)),
                    },
                }
            }
        }
        for (device_offset, at, n) in from_home {
            self.read_home(&mut buf[at..at + n], device_offset)?;
        }
        Ok(())
    }

    fn staged_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let stripe_bytes = self.stripe_bytes() as usize;
        for (stripe, within, n, at) in self.pieces(offset, buf.len()) {
            let piece = &buf[at..at + n];
            loop {
                let mut staging = lock(&self.staging);
                if let Some(data) = staging.pending.get_mut(&stripe) {
                    data[within..within + n].copy_from_slice(piece);
                    break;
                }
                let mut data = if let Some(committing) = staging.committing.get(&stripe) {
                    committing.clone()
                } else if n == stripe_bytes {
                    vec![0u8; stripe_bytes]
                } else {
                    let epoch = staging.epoch;
                    drop(staging);
                    let loaded = self.load_stripe(stripe)?;
                    staging = lock(&self.staging);
                    let overtaken = staging.epoch != epoch
                        || staging.pending.contains_key(&stripe)
                        || staging.committing.contains_key(&stripe);
                    if overtaken {
                        continue;
                    }
                    loaded
                };
                data[within..within + n].copy_from_slice(piece);
                staging.pending.insert(stripe, data);
                break;
            }
        }
        let over_limit = lock(&self.staging).pending.len() * stripe_bytes
            >= self.staging_limit_bytes.load(Ordering::Relaxed);
        if over_limit {
            self.commit()?;
        }
        Ok(())
    }

    /// Makes every staged stripe durable: journal, home, sync.
    fn commit(&self) -> io::Result<()> {
        let mut commits = lock(&self.commits);
        let staged = {
            let mut staging = lock(&self.staging);
            assert!(
                staging.committing.is_empty(),
                "one commit at a time: the last one cleared its stripes"
            );
            let taken = std::mem::take(&mut staging.pending);
            staging.committing = Arc::new(taken);
            staging.committing.clone()
        };
        let result = self.commit_staged(&mut commits, &staged);
        let mut staging = lock(&self.staging);
        if result.is_err() {
            // Keep what was written visible: back into pending, under any
            // newer writes to the same stripes.
            for (stripe, data) in staged.iter() {
                staging
                    .pending
                    .entry(*stripe)
                    .or_insert_with(|| data.clone());
            }
        }
        staging.committing = Arc::new(BTreeMap::new());
        staging.epoch += 1;
        drop(staging);
        result
    }

    fn commit_staged(
        &self,
        commits: &mut CommitState,
        staged: &BTreeMap<u64, Vec<u8>>,
    ) -> io::Result<()> {
        if !staged.is_empty() {
            let set = self.journal_set();
            if set != commits.journal_set {
                self.empty_journals(commits)?;
                commits.journal_set = set.clone();
            }
            let sequence = commits.next_sequence;
            commits.next_sequence += 1;
            let bytes = journal::encode(
                sequence,
                self.layout.stripe_unit_bytes as usize,
                self.layout.data_units(),
                staged,
            );
            self.write_journals(&bytes, &set)?;
            let _gate = write_lock(&self.gate);
            self.write_home(staged)?;
        }
        self.sync_members()
    }

    /// Where journals go: the first healthy branches, one more than the
    /// level survives losing, so that a copy outlives any loss the level
    /// can take.
    fn journal_set(&self) -> Vec<usize> {
        let copies = self.layout.level.tolerated_losses(self.members.len()) + 1;
        (0..self.members.len())
            .filter(|&b| self.members[b].health() == Health::Healthy)
            .take(copies)
            .collect()
    }

    /// An empty journal with the next sequence on every healthy branch.
    fn empty_journals(&self, commits: &mut CommitState) -> io::Result<()> {
        let empty = journal::encode(
            commits.next_sequence,
            self.layout.stripe_unit_bytes as usize,
            self.layout.data_units(),
            &BTreeMap::new(),
        );
        commits.next_sequence += 1;
        let healthy: Vec<usize> = (0..self.members.len())
            .filter(|&b| self.members[b].health() == Health::Healthy)
            .collect();
        self.write_journals(&empty, &healthy)
    }

    /// The journal on the branches `set`, synced, each branch on its own
    /// thread (branches are separate disks). One copy is enough to replay,
    /// so only a journal no branch took fails the commit.
    fn write_journals(&self, bytes: &[u8], set: &[usize]) -> io::Result<()> {
        let results = self.on_each(set, |_, devices| {
            devices.journal.write_at(bytes, 0)?;
            devices.journal.flush()
        });
        let mut written = 0;
        let mut last_error = None;
        for (b, result) in results {
            match result {
                Ok(()) => written += 1,
                Err(e) => {
                    self.mark_failed(b, &e);
                    last_error = Some(e);
                }
            }
        }
        if written == 0 {
            return Err(last_error.unwrap_or_else(|| io::Error::other("no healthy branch")));
        }
        self.check_survives()
    }

    /// Runs `work` for each branch of `set` at once, one thread each, and
    /// gives back each branch's result.
    fn on_each<F>(&self, set: &[usize], work: F) -> Vec<(usize, io::Result<()>)>
    where
        F: Fn(usize, &MemberDevices) -> io::Result<()> + Sync,
    {
        if set.len() <= 1 {
            return set
                .iter()
                .map(|&b| (b, self.members[b].devices().and_then(|d| work(b, &d))))
                .collect();
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = set
                .iter()
                .map(|&b| {
                    let work = &work;
                    let member = &self.members[b];
                    (
                        b,
                        scope.spawn(move || member.devices().and_then(|d| work(b, &d))),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(b, handle)| {
                    let result = handle
                        .join()
                        .unwrap_or_else(|_| Err(io::Error::other("branch I/O thread panicked")));
                    (b, result)
                })
                .collect()
        })
    }

    /// Writes whole stripes home with their parity, mirrors and sums: one
    /// write per branch for each run of consecutive stripes. The caller
    /// holds the gate alone.
    pub(super) fn write_home(&self, stripes: &BTreeMap<u64, Vec<u8>>) -> io::Result<()> {
        let mut run: Vec<(u64, &[u8])> = Vec::new();
        for (&stripe, data) in stripes {
            let joins = run.last().is_some_and(|&(last, _)| {
                last + 1 == stripe && (run.len() as u64) < HOME_RUN_STRIPES_MAX
            });
            if !joins && !run.is_empty() {
                self.write_home_run(&run)?;
                run.clear();
            }
            run.push((stripe, data));
        }
        if !run.is_empty() {
            self.write_home_run(&run)?;
        }
        self.check_survives()
    }

    /// Every branch's units of consecutive stripes `run`, and their sums.
    fn write_home_run(&self, run: &[(u64, &[u8])]) -> io::Result<()> {
        let unit = self.layout.stripe_unit_bytes as usize;
        let width = self.members.len();
        let first = run[0].0;
        let mut units = vec![vec![0u8; unit * run.len()]; width];
        let mut sums = vec![vec![0u8; SUM_BYTES as usize * run.len()]; width];
        for (i, &(stripe, data)) in run.iter().enumerate() {
            assert_eq!(stripe, first + i as u64, "a run is consecutive");
            for (branch, bytes) in self.stripe_units(stripe, data)? {
                units[branch][i * unit..(i + 1) * unit].copy_from_slice(&bytes);
                let sum = unit_sum(&bytes).to_le_bytes();
                sums[branch][i * SUM_BYTES as usize..(i + 1) * SUM_BYTES as usize]
                    .copy_from_slice(&sum);
            }
        }
        let written: Vec<usize> = (0..width)
            .filter(|&b| self.members[b].health() != Health::Failed)
            .collect();
        for (b, result) in self.on_each(&written, |b, d| {
            d.data.write_at(&units[b], first * unit as u64)?;
            d.sums.write_at(&sums[b], first * SUM_BYTES)
        }) {
            if let Err(e) = result {
                self.mark_failed(b, &e);
            }
        }
        Ok(())
    }

    /// The unit each branch holds of a stripe with these data bytes.
    pub(super) fn stripe_units(
        &self,
        stripe: u64,
        data: &[u8],
    ) -> io::Result<Vec<(usize, Vec<u8>)>> {
        let unit = self.layout.stripe_unit_bytes as usize;
        let map = self.layout.stripe_map(stripe);
        let data_units: Vec<&[u8]> = data.chunks_exact(unit).collect();
        assert_eq!(data_units.len(), map.data.len(), "a stripe's data is whole");
        let parity = codec::parity(self.layout.level, &data_units)
            .map_err(|e| io::Error::other(format!("stripe {stripe}: {e}")))?;
        let mut out = Vec::with_capacity(self.members.len());
        for (j, copies) in map.data.iter().enumerate() {
            out.extend(copies.iter().map(|&b| (b, data_units[j].to_vec())));
        }
        out.extend(map.parity.iter().copied().zip(parity));
        Ok(out)
    }

    /// Syncs every branch that is written (data and sums).
    fn sync_members(&self) -> io::Result<()> {
        let written: Vec<usize> = (0..self.members.len())
            .filter(|&b| self.members[b].health() != Health::Failed)
            .collect();
        for (b, result) in self.on_each(&written, |_, d| {
            d.data.flush()?;
            d.sums.flush()
        }) {
            if let Err(e) = result {
                self.mark_failed(b, &e);
            }
        }
        self.check_survives()
    }

    /// After a crash: the newest journal that checks out on any healthy
    /// branch goes home again, then an empty journal marks it replayed.
    fn replay_journal(&self) -> io::Result<()> {
        let unit = self.layout.stripe_unit_bytes as usize;
        let k = self.layout.data_units();
        let mut newest: Option<journal::Journal> = None;
        let mut highest_sequence = 0;
        for (b, member) in self.members.iter().enumerate() {
            if member.health() != Health::Healthy {
                continue;
            }
            let device = match member.devices() {
                Ok(d) => d.journal,
                Err(e) => {
                    self.mark_failed(b, &e);
                    continue;
                }
            };
            let mut header = vec![0u8; journal::HEADER_BYTES];
            if let Err(e) = device.read_at(&mut header, 0) {
                self.mark_failed(b, &e);
                continue;
            }
            let Ok((sequence, total)) = journal::decode_header(&header, unit, k) else {
                continue;
            };
            highest_sequence = highest_sequence.max(sequence);
            // A header that claims more than the file holds is torn or
            // damaged: nothing to replay, and nothing that size to allocate.
            if device.len_bytes().map_or(true, |len| (total as u64) > len) {
                continue;
            }
            let mut bytes = vec![0u8; total];
            if let Err(e) = device.read_at(&mut bytes, 0) {
                self.mark_failed(b, &e);
                continue;
            }
            if let Ok(found) = journal::decode(&bytes, unit, k) {
                if newest.as_ref().is_none_or(|n| n.sequence < found.sequence) {
                    newest = Some(found);
                }
            }
        }
        self.check_survives()?;
        let mut commits = lock(&self.commits);
        if let Some(found) = newest.filter(|j| !j.stripes.is_empty()) {
            tracing::info!(
                "branch pool: replaying {} stripe(s) of journal {} after an unclean shutdown",
                found.stripes.len(),
                found.sequence
            );
            {
                let _gate = write_lock(&self.gate);
                self.write_home(&found.stripes)?;
            }
            self.sync_members()?;
        }
        // The first commit empties every healthy branch's journal before it
        // writes its own (its set differs from this empty one), so the
        // journal just replayed is never replayed again over newer data.
        commits.next_sequence = highest_sequence + 1;
        commits.journal_set = Vec::new();
        Ok(())
    }

    /// Logical bytes a branch data file of `component_bytes` holds.
    fn logical_bytes(&self, component_bytes: u64) -> u64 {
        component_bytes / self.layout.stripe_unit_bytes * self.stripe_bytes()
    }
}

/// A clean shutdown leaves empty journals behind, so that the next open
/// replays nothing; after a crash the last journal is still there and is
/// replayed. Best effort: a failure here only costs that replay.
impl Drop for Segment {
    fn drop(&mut self) {
        if !self.is_staged() || !lock(&self.staging).pending.is_empty() {
            return;
        }
        let mut commits = lock(&self.commits);
        if commits.journal_set.is_empty() {
            return;
        }
        if let Err(e) = self.empty_journals(&mut commits) {
            tracing::debug!("branch pool: journals not emptied at close: {e}");
        }
    }
}

impl BlockDevice for Segment {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.is_staged() {
            self.staged_read(buf, offset)
        } else {
            self.read_home(buf, offset)
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.is_staged() {
            return self.staged_write(buf, offset);
        }
        let _gate = read_lock(&self.gate);
        raid::write(&self.layout, &Io(self), offset, buf).map_err(raid_error)?;
        self.check_survives()
    }

    fn flush(&self) -> io::Result<()> {
        if self.is_staged() {
            return self.commit();
        }
        self.sync_members()
    }

    fn len_bytes(&self) -> io::Result<u64> {
        let mut longest = None;
        for member in &self.members {
            if member.health() != Health::Healthy {
                continue;
            }
            let len = member.devices()?.data.len_bytes()?;
            longest = Some(longest.unwrap_or(0).max(self.logical_bytes(len)));
        }
        let staged_end = lock(&self.staging)
            .pending
            .last_key_value()
            .map_or(0, |(&stripe, _)| (stripe + 1) * self.stripe_bytes());
        longest
            .map(|len| len.max(staged_end))
            .ok_or_else(|| io::Error::other("branch pool: no healthy branch"))
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        let stripes = len_bytes.div_ceil(self.stripe_bytes());
        if self.is_staged() {
            lock(&self.staging)
                .pending
                .retain(|&stripe, _| stripe < stripes);
        }
        let _gate = write_lock(&self.gate);
        for (b, member) in self.members.iter().enumerate() {
            if member.health() == Health::Failed {
                continue;
            }
            let result = member.devices().and_then(|d| {
                d.data
                    .set_len_bytes(stripes * self.layout.stripe_unit_bytes)?;
                d.sums.set_len_bytes(stripes * SUM_BYTES)
            });
            if let Err(e) = result {
                self.mark_failed(b, &e);
            }
        }
        self.check_survives()
    }

    fn describe(&self) -> String {
        let labels: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{} {}", m.label, read_lock(&m.branch.place)))
            .collect();
        format!("{} pool over {}", self.layout.level, labels.join(", "))
    }

    /// Punches whole stripes only (a partial one keeps its bytes, which
    /// the contract allows), on every branch at once: units of zeros have
    /// zero parity. Staged stripes are skipped: they are being rewritten.
    /// Their sums become unknown.
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        let stripe_bytes = self.stripe_bytes();
        let first = offset.div_ceil(stripe_bytes);
        let end = (offset + len_bytes) / stripe_bytes;
        if first >= end {
            return Ok(());
        }
        let _gate = write_lock(&self.gate);
        let skip: Vec<u64> = {
            let staging = lock(&self.staging);
            staging
                .pending
                .range(first..end)
                .chain(staging.committing.range(first..end))
                .map(|(&s, _)| s)
                .collect()
        };
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut start = first;
        let mut skips = skip.clone();
        skips.sort_unstable();
        skips.dedup();
        for s in skips.into_iter().chain(std::iter::once(end)) {
            if s > start {
                runs.push((start, s));
            }
            start = s + 1;
        }
        let unit = self.layout.stripe_unit_bytes;
        for (b, member) in self.members.iter().enumerate() {
            if member.health() == Health::Failed {
                continue;
            }
            let devices = member.devices()?;
            for &(from, to) in &runs {
                devices
                    .sums
                    .punch(from * SUM_BYTES, (to - from) * SUM_BYTES)
                    .or_else(|e| {
                        if grove_store::device::is_punch_unsupported(&e) {
                            devices.sums.write_at(
                                &vec![0u8; ((to - from) * SUM_BYTES) as usize],
                                from * SUM_BYTES,
                            )
                        } else {
                            Err(e)
                        }
                    })?;
                if let Err(e) = devices.data.punch(from * unit, (to - from) * unit) {
                    if grove_store::device::is_punch_unsupported(&e) {
                        return Err(e);
                    }
                    self.mark_failed(b, &e);
                }
            }
        }
        self.check_survives()
    }

    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        let mut total = 0;
        for member in &self.members {
            if member.health() == Health::Failed {
                continue;
            }
            let devices = member.devices()?;
            for device in [&devices.data, &devices.journal, &devices.sums] {
                match device.allocated_bytes()? {
                    Some(bytes) => total += bytes,
                    None => return Ok(None),
                }
            }
        }
        Ok(Some(total))
    }
}
