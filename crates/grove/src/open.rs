//! The one place a pool is opened from its directory, whatever its store:
//! one file (grove.toml without `[branches]`), a store laid out over
//! branch directories (grove-raif's `BranchDevice`), assembled here from
//! grove.toml's `[branches]` table, or a store in RADOS objects
//! (grove.toml's `rados`, rados_pool.rs). Every command, `grove serve` and
//! `grove mount` open pools through [`open_pool`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use grove_raif::branch_pool::{members, BranchDevice, BranchPoolConfig, BranchPoolError};
use grove_store::config::PoolConfig;
use grove_store::{Error, ErrorKind, Pool};

/// An open pool, and its branches if its store is laid out over some.
#[derive(Clone)]
pub struct OpenedPool {
    pub pool: Pool,
    pub branches: Option<Arc<Branches>>,
}

/// The branches of an open pool: the device the engine sits on (kept here
/// to reach its status, rebuild and scrub), and what commands running on
/// it share.
pub struct Branches {
    pub device: Arc<BranchDevice>,
    /// The pool directory (its grove.toml names the branches).
    pub dir: PathBuf,
    /// The locks of replacement branches put in service since the open:
    /// held for as long as the device may use them.
    held: Mutex<Vec<File>>,
    /// The rebuild or scrub running now, and how far it is: one at a time.
    job: Mutex<Option<Job>>,
}

/// A rebuild or scrub in progress, as `grove info` shows it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Job {
    /// "rebuild of b1 into DIR", "scrub" / "scrub --repair", "restripe".
    pub what: String,
    pub done: u64,
    pub total: u64,
    /// What `done` and `total` count: "stripes" or "bytes".
    pub unit: String,
}

impl Branches {
    /// Keeps a replacement branch's lock for as long as the pool is open.
    pub fn hold(&self, lock: File) {
        lock_ignoring_poison(&self.held).push(lock);
    }

    /// The job running now, if any.
    pub fn job(&self) -> Option<Job> {
        lock_ignoring_poison(&self.job).clone()
    }

    /// Claims the one job slot for `what`, or says which job holds it.
    pub fn start_job(&self, what: String, unit: &str) -> grove_store::Result<JobGuard<'_>> {
        let mut job = lock_ignoring_poison(&self.job);
        if let Some(running) = &*job {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "a {} is running on pool {} ({} of {} {}): wait for it to finish",
                    running.what,
                    self.dir.display(),
                    running.done,
                    running.total,
                    running.unit
                ),
            ));
        }
        *job = Some(Job {
            what,
            done: 0,
            total: 0,
            unit: unit.to_string(),
        });
        Ok(JobGuard { branches: self })
    }
}

/// The running job's slot; emptied when dropped.
pub struct JobGuard<'a> {
    branches: &'a Branches,
}

impl JobGuard<'_> {
    pub fn progress(&self, done: u64, total: u64) {
        if let Some(job) = &mut *lock_ignoring_poison(&self.branches.job) {
            job.done = done;
            job.total = total;
        }
    }
}

impl Drop for JobGuard<'_> {
    fn drop(&mut self) {
        *lock_ignoring_poison(&self.branches.job) = None;
    }
}

fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens the pool in `dir`. A pool over branches is assembled from its
/// branch directories; `degraded` lets it open with branches missing or
/// stale, within what its level survives (without, such a pool is refused
/// in one line that says so). A branch another process holds is reported
/// as the engine reports a busy pool (`ErrorKind::Busy`), so that commands
/// turn to the daemon's control socket.
pub fn open_pool(dir: &Path, degraded: bool) -> grove_store::Result<OpenedPool> {
    let config = PoolConfig::load(dir)?;
    if let Some(location) = &config.rados {
        return Ok(OpenedPool {
            pool: crate::rados_pool::open(dir, location, &config)?,
            branches: None,
        });
    }
    let Some(table) = &config.branches else {
        return Ok(OpenedPool {
            pool: Pool::open(dir)?,
            branches: None,
        });
    };
    let branch_config = BranchPoolConfig::from_table(table).map_err(branch_error)?;
    let device = Arc::new(members::open(&branch_config, degraded).map_err(branch_error)?);
    let pool = Pool::open_on_device(dir, device.clone(), &config)?;
    Ok(OpenedPool {
        pool,
        branches: Some(Arc::new(Branches {
            device,
            dir: dir.to_path_buf(),
            held: Mutex::new(Vec::new()),
            job: Mutex::new(None),
        })),
    })
}

/// The engine's error for a branch pool's: Busy stays Busy.
pub fn branch_error(error: BranchPoolError) -> Error {
    let kind = match &error {
        BranchPoolError::Busy { .. } => ErrorKind::Busy,
        BranchPoolError::Io { .. } => ErrorKind::Io,
        BranchPoolError::Config(_) => ErrorKind::InvalidArgument,
        BranchPoolError::Foreign { .. }
        | BranchPoolError::NeedsDegraded(_)
        | BranchPoolError::TooManyLost(_) => ErrorKind::InvalidState,
    };
    Error::new(kind, error.to_string())
}

/// The branch pool's table in `dir`'s grove.toml, with the config itself.
pub fn load_branch_config(dir: &Path) -> grove_store::Result<(PoolConfig, BranchPoolConfig)> {
    let config = PoolConfig::load(dir)?;
    let Some(table) = &config.branches else {
        return Err(not_a_branch_pool(dir));
    };
    let branches = BranchPoolConfig::from_table(table).map_err(branch_error)?;
    Ok((config, branches))
}

/// The refusal of a branch command on a pool kept in one file.
pub fn not_a_branch_pool(dir: &Path) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "pool {} keeps its store in one file, not over branch directories (`grove init --branch DIR --branch DIR ...` makes one)",
            dir.display()
        ),
    )
}
