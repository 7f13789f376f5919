//! A branch pool on disk: the `[branches]` table of the pool's grove.toml,
//! and in each branch directory the files of its share of the store and an
//! identity file that ties it to its pool.
//!
//! ```text
//! BRANCH_DIR/grove-branch.toml   identity: pool id, label, index, shape,
//!                                sequence, state (ok | rebuilding), failed,
//!                                settled
//! BRANCH_DIR/grove.branch-shape  the pool's segments (shape.rs)
//! BRANCH_DIR/grove.branch        segment 0's stripe units (data file)
//! BRANCH_DIR/grove.branch-journal  segment 0's stripe journal
//! BRANCH_DIR/grove.branch-sums   a crc32c per stripe unit of segment 0
//! BRANCH_DIR/grove.branch.N, grove.branch-journal.N, grove.branch-sums.N
//!                                the same for segment N (after growth)
//! ```
//!
//! The directory itself is locked (flock) while a process uses it.
//!
//! Every open raises the sequence in the identity file of every healthy
//! branch, and so does every change of health (in two rounds: the
//! sequence, then `settled`); each such identity lists the branches failed
//! at the time. A branch so listed is failed: the pool opens without it,
//! as it ran. Any other branch whose sequence is lower than the highest
//! `settled` missed writes (a stale copy): it is refused, or with
//! `degraded` run without. A branch whose pool id differs belongs to
//! another pool and is refused outright.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use grove_store::{BlockDevice, FileDevice};

use super::device::{
    BranchDevice, BranchFiles, BranchSpace, BranchSpec, Health, MemberDevices, MemberStatus,
    MembershipRecorder,
};
use crate::layout::Layout;
use crate::level::Level;

pub const IDENTITY_FILE_NAME: &str = "grove-branch.toml";
pub const DATA_FILE_NAME: &str = "grove.branch";
pub const JOURNAL_FILE_NAME: &str = "grove.branch-journal";
pub const SUMS_FILE_NAME: &str = "grove.branch-sums";
pub const SHAPE_FILE_NAME: &str = "grove.branch-shape";
/// Every file of a branch's store starts so (the identity does not).
pub const STORE_FILE_PREFIX: &str = "grove.branch";
/// Longest branch label: short names for commands and log lines.
pub const LABEL_MAX_BYTES: usize = 32;

/// The `[branches]` table of grove.toml.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchPoolConfig {
    /// 32 hex digits shared by the pool's branches and nobody else's.
    pub pool_id: String,
    pub level: Level,
    pub stripe_unit_bytes: u64,
    /// In label order; a branch's index is its place here.
    pub member: Vec<MemberConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub label: String,
    pub dir: PathBuf,
}

/// A branch directory's identity file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchIdentity {
    pub pool_id: String,
    pub label: String,
    pub index: usize,
    pub width: usize,
    pub level: Level,
    pub stripe_unit_bytes: u64,
    pub sequence: u64,
    pub state: IdentityState,
    /// The branches the pool ran without when this identity was written
    /// (failed by `grove branch fail`, an I/O error or the daemons'
    /// watcher, and not replaced since): the next open knows them as
    /// failed, not as old copies or surprises, and runs without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
    /// The newest sequence every branch in service had taken when this
    /// identity was written: a record writes the new sequence to every
    /// branch, then this to every branch. A branch behind the highest
    /// `settled` missed a whole record (an old copy); one behind only the
    /// highest sequence saw a record cut short, with nothing written
    /// after it. None in identities from before: their own sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityState {
    Ok,
    Rebuilding,
}

/// Why a branch pool cannot be made or opened, in one line each.
#[derive(Debug, thiserror::Error)]
pub enum BranchPoolError {
    #[error("{0}")]
    Config(String),
    #[error("branch {label} ({dir}) belongs to {why}")]
    Foreign {
        label: String,
        dir: String,
        why: String,
    },
    #[error("{0}")]
    NeedsDegraded(String),
    /// More branches gone than the level survives.
    #[error("{0}")]
    TooManyLost(String),
    #[error("branch {label} ({dir}) is in use by another grove process")]
    Busy { label: String, dir: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> BranchPoolError {
    let what = what.into();
    move |source| BranchPoolError::Io { what, source }
}

impl BranchPoolConfig {
    /// A new pool's table: labels b0, b1, ... for `dirs` in order.
    pub fn new(
        level: Level,
        stripe_unit_bytes: u64,
        dirs: &[PathBuf],
    ) -> Result<Self, BranchPoolError> {
        let config = BranchPoolConfig {
            pool_id: new_pool_id(),
            level,
            stripe_unit_bytes,
            member: dirs
                .iter()
                .enumerate()
                .map(|(i, dir)| MemberConfig {
                    label: format!("b{i}"),
                    dir: absolute(dir),
                })
                .collect(),
        };
        config.check()?;
        Ok(config)
    }

    /// Reads the table grove.toml keeps for the pool.
    pub fn from_table(table: &toml::Table) -> Result<Self, BranchPoolError> {
        let config: BranchPoolConfig =
            toml::Value::Table(table.clone())
                .try_into()
                .map_err(|e: toml::de::Error| {
                    BranchPoolError::Config(format!("[branches] in grove.toml: {}", e.message()))
                })?;
        config.check()?;
        Ok(config)
    }

    pub fn to_table(&self) -> toml::Table {
        match toml::Value::try_from(self) {
            Ok(toml::Value::Table(table)) => table,
            _ => unreachable!("a branch pool config is a table"),
        }
    }

    fn check(&self) -> Result<(), BranchPoolError> {
        crate::layout::Layout::new(self.level, self.member.len(), self.stripe_unit_bytes, 0)
            .map_err(|e| {
                BranchPoolError::Config(format!(
                    "{} over {} branches: {e}",
                    self.level,
                    self.member.len()
                ))
            })?;
        self.check_members()
    }

    /// The pool id, labels and directories (not the layout: a pool
    /// growing by a pair is checked whole once both are in).
    fn check_members(&self) -> Result<(), BranchPoolError> {
        let bad = |why: String| BranchPoolError::Config(why);
        if self.pool_id.len() != 32 || !self.pool_id.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad(format!(
                "pool_id {:?} is not 32 hex digits",
                self.pool_id
            )));
        }
        for (i, member) in self.member.iter().enumerate() {
            let label = &member.label;
            if label.is_empty()
                || label.len() > LABEL_MAX_BYTES
                || !label
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
            {
                return Err(bad(format!(
                    "branch label {label:?} must be 1 to {LABEL_MAX_BYTES} letters, digits, - or _"
                )));
            }
            if self.member[..i].iter().any(|m| m.label == *label) {
                return Err(bad(format!("branch label {label} is used twice")));
            }
            if self.member[..i].iter().any(|m| m.dir == member.dir) {
                return Err(bad(format!(
                    "directory {} is given for two branches",
                    member.dir.display()
                )));
            }
        }
        Ok(())
    }

    fn identity(&self, index: usize, sequence: u64, state: IdentityState) -> BranchIdentity {
        self.identity_of(
            &self.member[index].label,
            index,
            self.member.len(),
            sequence,
            state,
        )
    }

    fn identity_of(
        &self,
        label: &str,
        index: usize,
        width: usize,
        sequence: u64,
        state: IdentityState,
    ) -> BranchIdentity {
        BranchIdentity {
            pool_id: self.pool_id.clone(),
            label: label.to_string(),
            index,
            width,
            level: self.level,
            stripe_unit_bytes: self.stripe_unit_bytes,
            sequence,
            state,
            failed: Vec::new(),
            settled: None,
        }
    }

    pub fn index_of(&self, label: &str) -> Option<usize> {
        self.member.iter().position(|m| m.label == label)
    }
}

fn absolute(dir: &Path) -> PathBuf {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// 32 hex digits from the standard library's randomly keyed hasher.
fn new_pool_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..2)
        .map(|i| {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(i);
            hasher.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            format!("{:016x}", hasher.finish())
        })
        .collect()
}

impl BranchIdentity {
    fn load(dir: &Path) -> io::Result<BranchIdentity> {
        let path = dir.join(IDENTITY_FILE_NAME);
        let text = std::fs::read_to_string(&path)?;
        toml::from_str(&text).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is not a branch identity: {}",
                    path.display(),
                    e.message()
                ),
            )
        })
    }

    /// Written atomically: a temporary file, synced, renamed, the
    /// directory synced.
    fn save(&self, dir: &Path) -> io::Result<()> {
        let path = dir.join(IDENTITY_FILE_NAME);
        let temp = dir.join(format!("{IDENTITY_FILE_NAME}.tmp"));
        let text = format!(
            "# grove branch identity: this directory is branch {} of a grove pool\n{}",
            self.label,
            toml::to_string(self).expect("an identity serializes")
        );
        std::fs::write(&temp, text)?;
        File::open(&temp)?.sync_all()?;
        std::fs::rename(&temp, &path)?;
        File::open(dir)?.sync_all()
    }
}

/// The names of segment `id`'s files: data, journal, sums.
pub fn segment_file_names(id: u32) -> [String; 3] {
    let names = [DATA_FILE_NAME, JOURNAL_FILE_NAME, SUMS_FILE_NAME];
    names.map(|name| match id {
        0 => name.to_string(),
        _ => format!("{name}.{id}"),
    })
}

/// The branches' files in their directories (a place is a directory).
pub struct DirFiles;

impl DirFiles {
    fn open_device(path: &Path, create: bool) -> io::Result<Arc<dyn BlockDevice>> {
        let device = if create {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            FileDevice::create_new(path)
        } else {
            FileDevice::open(path)
        };
        device
            .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }
}

impl BranchFiles for DirFiles {
    fn shape(&self, place: &str) -> io::Result<Arc<dyn BlockDevice>> {
        let path = Path::new(place).join(SHAPE_FILE_NAME);
        match Self::open_device(&path, false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Self::open_device(&path, true),
            opened => opened,
        }
    }

    fn segment(&self, place: &str, id: u32, create: bool) -> io::Result<MemberDevices> {
        let [data, journal, sums] = segment_file_names(id).map(|name| Path::new(place).join(name));
        Ok(MemberDevices {
            data: Self::open_device(&data, create)?,
            journal: Self::open_device(&journal, create)?,
            sums: Self::open_device(&sums, create)?,
        })
    }

    fn remove_segment(&self, place: &str, id: u32) {
        for name in segment_file_names(id) {
            let path = Path::new(place).join(name);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!("{} not removed: {e}", path.display());
            }
        }
    }

    fn space(&self, place: &str) -> Option<BranchSpace> {
        let stat = rustix::fs::statvfs(place).ok()?;
        Some(BranchSpace {
            file_system: stat.f_fsid,
            available_bytes: stat.f_bavail.saturating_mul(stat.f_frsize),
            total_bytes: stat.f_blocks.saturating_mul(stat.f_frsize),
        })
    }
}

/// Locks branch directory `dir` for this process: another grove process
/// opening the same branch is refused.
fn lock_dir(dir: &Path, label: &str) -> Result<File, BranchPoolError> {
    let lock = File::open(dir).map_err(io_error(format!(
        "branch {label}: cannot open {}",
        dir.display()
    )))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(BranchPoolError::Busy {
            label: label.to_string(),
            dir: dir.display().to_string(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(io_error(format!(
            "branch {label}: cannot lock {}",
            dir.display()
        ))(e)),
    }
}

/// Keeps the identity files in step with the device's view of health.
/// Holds the branches' locks for as long as the device lives.
struct Recorder {
    config: BranchPoolConfig,
    sequence: AtomicU64,
    /// The newest sequence whose record finished both rounds.
    settled: AtomicU64,
    _locks: Mutex<Vec<File>>,
}

impl Recorder {
    /// Two rounds over the branches in service: the new sequence (with
    /// the last settled one), then the new sequence as settled. A crash in
    /// the first leaves branches one sequence behind that missed nothing,
    /// which `settled` tells from an old copy.
    fn record(&self, members: &[MemberStatus]) -> io::Result<()> {
        let sequence = self.sequence.fetch_add(1, Ordering::AcqRel) + 1;
        let failed: Vec<String> = members
            .iter()
            .filter(|m| m.health == Health::Failed)
            .map(|m| m.label.clone())
            .collect();
        let last_settled = self.settled.load(Ordering::Acquire);
        for settled in [last_settled, sequence] {
            for (index, member) in members.iter().enumerate() {
                let state = match member.health {
                    Health::Healthy => IdentityState::Ok,
                    Health::Rebuilding => IdentityState::Rebuilding,
                    Health::Failed => continue,
                };
                let dir = Path::new(&member.place);
                BranchIdentity {
                    failed: failed.clone(),
                    settled: Some(settled),
                    ..self
                        .config
                        .identity_of(&member.label, index, members.len(), sequence, state)
                }
                .save(dir)?;
            }
        }
        self.settled.fetch_max(sequence, Ordering::AcqRel);
        Ok(())
    }
}

fn recorder(
    config: &BranchPoolConfig,
    (sequence, settled): (u64, u64),
    locks: Vec<File>,
) -> (Arc<Recorder>, MembershipRecorder) {
    let shared = Arc::new(Recorder {
        config: config.clone(),
        sequence: AtomicU64::new(sequence),
        settled: AtomicU64::new(settled),
        _locks: Mutex::new(locks),
    });
    let inner = shared.clone();
    (shared, Box::new(move |members| inner.record(members)))
}

/// The device over `specs`, with its identity recorder (which goes on
/// recording the pool's membership as branches fail and come back), and
/// the recorder's shared half.
fn assemble(
    config: &BranchPoolConfig,
    specs: Vec<BranchSpec>,
    record: (u64, u64),
    locks: Vec<File>,
) -> (Arc<Recorder>, io::Result<BranchDevice>) {
    let (shared, recorder) = recorder(config, record, locks);
    let device = BranchDevice::open(
        config.level,
        config.stripe_unit_bytes,
        specs,
        Arc::new(DirFiles),
        Some(recorder),
    );
    (shared, device)
}

/// Makes the branches of a new pool: each directory (made if missing)
/// must not hold a branch already.
pub fn create(config: &BranchPoolConfig) -> Result<BranchDevice, BranchPoolError> {
    let mut specs = Vec::new();
    let mut locks = Vec::new();
    for member in &config.member {
        let dir = &member.dir;
        if dir.join(IDENTITY_FILE_NAME).exists() {
            return Err(BranchPoolError::Config(format!(
                "{} already holds a grove branch; give an empty directory",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(io_error(format!(
            "cannot create branch directory {}",
            dir.display()
        )))?;
        locks.push(lock_dir(dir, &member.label)?);
        let place = dir.display().to_string();
        DirFiles.segment(&place, 0, true).map_err(io_error(format!(
            "branch {}: cannot create its files",
            member.label
        )))?;
        specs.push(BranchSpec {
            label: member.label.clone(),
            place,
            usable: true,
        });
    }
    let (shared, device) = assemble(config, specs, (0, 0), locks);
    let device = device.map_err(io_error("cannot assemble the branch pool"))?;
    shared
        .record(&device.status())
        .map_err(io_error("cannot write the branch identities"))?;
    Ok(device)
}

/// How one configured branch was found at open.
enum Found {
    /// Its identity, of this pool and whole: locked, with its sequence and
    /// the branches it recorded as failed.
    Ok {
        lock: File,
        sequence: u64,
        settled: u64,
        failed: Vec<String>,
    },
    /// A replacement whose rebuild did not finish: grove left it so, and
    /// running the rebuild again refills it from the start.
    Rebuilding,
    /// Usable only after a rebuild, and not something the pool recorded:
    /// missing, holding no identity, or not lockable.
    Unusable(String),
}

/// A branch the pool must run without: its label, index and one line on
/// why. `known`: the pool recorded it (failed, or a rebuild left
/// unfinished), so the open runs without it unasked; an unknown one only
/// with `degraded`, as it may be a disk not mounted or a wrong path.
struct Missing {
    label: String,
    index: usize,
    line: String,
    known: bool,
}

/// Opens the branches of a pool. A branch the pool recorded as failed, or
/// a replacement whose rebuild did not finish, is run without (the pool
/// is degraded, as it was when it last ran). A branch that is missing,
/// stale (an old copy), holds no identity or whose files cannot be opened
/// is refused unless `degraded`, and then run without. Past what the level
/// survives, and for a branch of another pool, the open is refused.
pub fn open(config: &BranchPoolConfig, degraded: bool) -> Result<BranchDevice, BranchPoolError> {
    let mut found = Vec::new();
    for (index, member) in config.member.iter().enumerate() {
        found.push(find_member(config, index, member)?);
    }
    let (newest, settled, failed) = newest_record(&found);
    let (specs, locks, missing) = classify(config, found, (newest, settled), &failed);
    check_survives(config, &missing)?;
    let unknown: Vec<&Missing> = missing.iter().filter(|m| !m.known).collect();
    if !unknown.is_empty() && !degraded {
        return Err(needs_degraded(&unknown));
    }
    let (shared, device) = assemble(config, specs, (newest, settled), locks);
    let device = device.map_err(|e| BranchPoolError::TooManyLost(format!("{e}")))?;
    let unopened: Vec<Missing> = device
        .unopened_at_open()
        .iter()
        .filter_map(|(label, why)| {
            let index = config.index_of(label)?;
            let place = config.member[index].dir.display();
            let line = format!("branch {label} ({place}) cannot be used: {why}");
            let (label, known) = (label.clone(), false);
            Some(Missing {
                label,
                index,
                line,
                known,
            })
        })
        .collect();
    if !unopened.is_empty() && !degraded {
        return Err(needs_degraded(&unopened.iter().collect::<Vec<_>>()));
    }
    for m in missing.iter().chain(&unopened) {
        if m.known {
            tracing::info!("{}; the pool runs degraded", m.line);
        } else {
            tracing::warn!("{}; the pool runs degraded", m.line);
        }
    }
    shared
        .record(&device.status())
        .map_err(io_error("cannot write the branch identities"))?;
    Ok(device)
}

/// The newest sequence among the whole branches, the newest settled one,
/// and the branches the newest identities recorded as failed.
fn newest_record(found: &[Found]) -> (u64, u64, Vec<String>) {
    let whole = || {
        found.iter().filter_map(|f| match f {
            Found::Ok {
                sequence, settled, ..
            } => Some((*sequence, *settled)),
            _ => None,
        })
    };
    let newest = whole().map(|(sequence, _)| sequence).max().unwrap_or(0);
    let settled = whole().map(|(_, settled)| settled).max().unwrap_or(0);
    let mut failed = Vec::new();
    for f in found {
        if let Found::Ok {
            sequence,
            failed: f,
            ..
        } = f
        {
            if *sequence == newest {
                failed.extend(f.iter().cloned());
            }
        }
    }
    (newest, settled, failed)
}

/// Each branch as the device is given it, the locks of those in service,
/// and the branches the pool must run without.
fn classify(
    config: &BranchPoolConfig,
    found: Vec<Found>,
    (newest, settled): (u64, u64),
    failed: &[String],
) -> (Vec<BranchSpec>, Vec<File>, Vec<Missing>) {
    let mut specs = Vec::new();
    let mut locks = Vec::new();
    let mut missing = Vec::new();
    for (index, (member, found)) in config.member.iter().zip(found).enumerate() {
        let place = member.dir.display().to_string();
        let usable = match found {
            // Failed while the pool ran: its copy is behind, whatever it says.
            _ if failed.contains(&member.label) => Err((
                true,
                "is failed and out of service until it is rebuilt".to_string(),
            )),
            // Behind only a record cut short, it missed no write.
            Found::Ok { lock, sequence, .. } if sequence >= settled.min(newest) => Ok(lock),
            Found::Ok { sequence, .. } => Err((
                false,
                format!("is an old copy (sequence {sequence}, the pool's is {newest})"),
            )),
            Found::Rebuilding => Err((true, "was being rebuilt and is not whole yet".into())),
            Found::Unusable(why) => Err((false, why)),
        };
        specs.push(BranchSpec {
            label: member.label.clone(),
            usable: usable.is_ok(),
            place: place.clone(),
        });
        match usable {
            Ok(lock) => locks.push(lock),
            Err((known, why)) => missing.push(Missing {
                label: member.label.clone(),
                index,
                line: format!("branch {} ({place}) {why}", member.label),
                known,
            }),
        }
    }
    (specs, locks, missing)
}

/// Refuses, in one line naming each, branches past what the level
/// survives (over the pool's full width; a narrower segment of a grown
/// pool is checked by the device).
fn check_survives(config: &BranchPoolConfig, missing: &[Missing]) -> Result<(), BranchPoolError> {
    let width = config.member.len();
    let lost: Vec<usize> = missing.iter().map(|m| m.index).collect();
    let layout = Layout::new(config.level, width, config.stripe_unit_bytes, 0).map_err(|e| {
        BranchPoolError::Config(format!("{} over {width} branches: {e}", config.level))
    })?;
    if lost.is_empty() || crate::raid::survives(&layout, &lost) {
        return Ok(());
    }
    let lines: Vec<&str> = missing.iter().map(|m| m.line.as_str()).collect();
    Err(BranchPoolError::TooManyLost(format!(
        "{} over {width} branches cannot run without {} of them (it survives {}): {}",
        config.level,
        lost.len(),
        config.level.tolerated_losses(width),
        lines.join("; ")
    )))
}

/// The refusal of a pool with branches it cannot use and did not record:
/// every one named, and how to go on.
fn needs_degraded(missing: &[&Missing]) -> BranchPoolError {
    let lines: Vec<&str> = missing.iter().map(|m| m.line.as_str()).collect();
    let then = match missing {
        [one] => format!(
            "open with --degraded to run without it, then `grove rebuild --branch {} --to DIR`",
            one.label
        ),
        _ => "open with --degraded to run without them, then `grove rebuild --branch LABEL --to DIR` for each".to_string(),
    };
    BranchPoolError::NeedsDegraded(format!("{}: {then}", lines.join("; ")))
}

fn find_member(
    config: &BranchPoolConfig,
    index: usize,
    member: &MemberConfig,
) -> Result<Found, BranchPoolError> {
    let dir = &member.dir;
    if !dir.is_dir() {
        return Ok(Found::Unusable("is missing (no such directory)".into()));
    }
    let identity = match BranchIdentity::load(dir) {
        Ok(identity) => identity,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Found::Unusable(format!(
                "holds no branch ({IDENTITY_FILE_NAME} is missing)"
            )))
        }
        Err(e) => return Ok(Found::Unusable(format!("has an unreadable identity: {e}"))),
    };
    let foreign = |why: String| BranchPoolError::Foreign {
        label: member.label.clone(),
        dir: dir.display().to_string(),
        why,
    };
    if identity.pool_id != config.pool_id {
        return Err(foreign(format!(
            "another pool (its id is {}, this pool's {})",
            identity.pool_id, config.pool_id
        )));
    }
    // The width is not compared: a branch added to the pool changes it,
    // and the identities learn it at the next record.
    let expected = BranchIdentity {
        width: identity.width,
        failed: identity.failed.clone(),
        settled: identity.settled,
        ..config.identity(index, identity.sequence, identity.state)
    };
    if identity != expected {
        return Err(foreign(format!(
            "this pool but not as {} of {} {} (it says {} of {} {}, stripe unit {})",
            member.label,
            config.member.len(),
            config.level,
            identity.label,
            identity.width,
            identity.level,
            identity.stripe_unit_bytes
        )));
    }
    if identity.state == IdentityState::Rebuilding {
        return Ok(Found::Rebuilding);
    }
    match lock_dir(dir, &member.label) {
        Ok(lock) => Ok(Found::Ok {
            lock,
            sequence: identity.sequence,
            settled: identity.settled.unwrap_or(identity.sequence),
            failed: identity.failed,
        }),
        Err(e @ BranchPoolError::Busy { .. }) => Err(e),
        Err(e) => Ok(Found::Unusable(format!("cannot be opened: {e}"))),
    }
}

/// Empties a directory of a branch's store files (what an unfinished
/// replacement or addition left), keeping nothing but the identity.
fn remove_store_files(dir: &Path) -> Result<(), BranchPoolError> {
    let entries =
        std::fs::read_dir(dir).map_err(io_error(format!("cannot read {}", dir.display())))?;
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(STORE_FILE_PREFIX)
        {
            std::fs::remove_file(entry.path()).map_err(io_error(format!(
                "cannot remove {}",
                entry.path().display()
            )))?;
        }
    }
    Ok(())
}

/// Whether `dir` is empty, or holds only what an unfinished operation on
/// branch `index` of this pool left (its identity says so and `left`
/// accepts it). Such leftovers are cleared.
fn claim_dir(
    config: &BranchPoolConfig,
    dir: &Path,
    index: usize,
    left: impl Fn(&BranchIdentity) -> bool,
    what: &str,
) -> Result<(), BranchPoolError> {
    std::fs::create_dir_all(dir).map_err(io_error(format!("cannot create {}", dir.display())))?;
    let resumable = match BranchIdentity::load(dir) {
        Ok(identity) => {
            identity.pool_id == config.pool_id && identity.index == index && left(&identity)
        }
        Err(_) => false,
    };
    let entries = std::fs::read_dir(dir)
        .map_err(io_error(format!("cannot read {}", dir.display())))?
        .count();
    if entries > 0 && !resumable {
        return Err(BranchPoolError::Config(format!(
            "{} is not empty: {what} needs an empty directory",
            dir.display()
        )));
    }
    if resumable {
        remove_store_files(dir)?;
    }
    Ok(())
}

/// Prepares `new_dir` to replace branch `label`: an empty (or missing)
/// directory, or one left by an earlier replacement of the same branch
/// that did not finish. Its identity says rebuilding; the device makes
/// its files (`BranchDevice::replace_at`). Returns the directory's lock,
/// to keep while the pool uses it.
pub fn prepare_replacement(
    config: &BranchPoolConfig,
    label: &str,
    new_dir: &Path,
) -> Result<File, BranchPoolError> {
    let index = config.index_of(label).ok_or_else(|| {
        BranchPoolError::Config(format!(
            "no branch labelled {label:?} in this pool (labels: {})",
            labels(config)
        ))
    })?;
    let new_dir = absolute(new_dir);
    if let Some(other) = config
        .member
        .iter()
        .find(|m| m.dir == new_dir && m.label != label)
    {
        return Err(BranchPoolError::Config(format!(
            "{} is already branch {}: give an empty directory",
            new_dir.display(),
            other.label
        )));
    }
    claim_dir(
        config,
        &new_dir,
        index,
        |identity| identity.state == IdentityState::Rebuilding,
        "a replacement branch",
    )?;
    config
        .identity(index, 0, IdentityState::Rebuilding)
        .save(&new_dir)
        .map_err(io_error(format!(
            "cannot write the identity in {}",
            new_dir.display()
        )))?;
    lock_dir(&new_dir, label)
}

/// Prepares `dir` to join the pool as a new branch: an empty (or missing)
/// directory, or one an unfinished `grove branch add` left. Returns the
/// new member (label bN, the first free) and the directory's lock. Its
/// identity carries the highest sequence of the branches, so that it is
/// in step with them whenever the pool next opens.
pub fn prepare_addition(
    config: &BranchPoolConfig,
    dir: &Path,
) -> Result<(MemberConfig, File), BranchPoolError> {
    let dir = absolute(dir);
    if let Some(other) = config.member.iter().find(|m| m.dir == dir) {
        return Err(BranchPoolError::Config(format!(
            "{} is already branch {} of this pool",
            dir.display(),
            other.label
        )));
    }
    let label = (config.member.len()..)
        .map(|i| format!("b{i}"))
        .find(|label| config.index_of(label).is_none())
        .expect("some label is free");
    let index = config.member.len();
    claim_dir(
        config,
        &dir,
        index,
        |identity| identity.label == label,
        "a new branch",
    )?;
    let mut grown = config.clone();
    grown.member.push(MemberConfig {
        label: label.clone(),
        dir: dir.clone(),
    });
    grown.check_members()?;
    let sequence = config
        .member
        .iter()
        .filter_map(|m| BranchIdentity::load(&m.dir).ok())
        .map(|identity| identity.sequence)
        .max()
        .unwrap_or(0);
    grown
        .identity(index, sequence, IdentityState::Ok)
        .save(&dir)
        .map_err(io_error(format!(
            "cannot write the identity in {}",
            dir.display()
        )))?;
    let lock = lock_dir(&dir, &label)?;
    Ok((grown.member[index].clone(), lock))
}

pub fn labels(config: &BranchPoolConfig) -> String {
    config
        .member
        .iter()
        .map(|m| format!("{} = {}", m.label, m.dir.display()))
        .collect::<Vec<_>>()
        .join(", ")
}
