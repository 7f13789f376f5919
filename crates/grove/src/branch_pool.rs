//! Pools over several branch directories: creating one (`grove init
//! --branch`), its report, and rebuild, scrub, fail, add and restripe, each
//! here or in the daemon holding the pool (through the BranchAdmin trait,
//! as the Admin trait does for the rest; the commands are branches.rs's),
//! and the daemons' watcher that fails a branch whose directory or data
//! file is gone.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use grove_raif::branch_pool::members::{self, DATA_FILE_NAME, IDENTITY_FILE_NAME};
use grove_raif::branch_pool::{BranchPoolConfig, Health, RebuildReport, ScrubReport};
use grove_raif::Level;
use grove_store::config::{PoolConfig, CONFIG_FILE_NAME};
use grove_store::{Error, ErrorKind, Pool, PoolOptions, SpaceSettings};
use serde::{Deserialize, Serialize};

use crate::open::{branch_error, load_branch_config, not_a_branch_pool, Branches, Job};
use crate::output::format_size;
use crate::worker::{is_stopping, sleep_unless_stopping, Worker};

/// How often the daemons' watcher looks at every branch directory.
const WATCH_INTERVAL_MS: u64 = 1000;

/// A branch pool's branches and their health, as `grove info` shows them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BranchReport {
    pub level: String,
    pub stripe_unit_bytes: u64,
    /// True when any branch is not ok.
    pub degraded: bool,
    pub branches: Vec<BranchLine>,
    /// The stretches of the store, each over the first `branches` of them:
    /// more than one after `grove branch add`, until a restripe.
    pub segments: Vec<SegmentLine>,
    /// Bytes of the segment being restriped that are copied, if one is.
    pub restripe_done_bytes: Option<u64>,
    /// The rebuild, scrub or restripe running now.
    pub job: Option<Job>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SegmentLine {
    pub id: u32,
    pub start_bytes: u64,
    pub branches: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BranchLine {
    pub label: String,
    pub dir: String,
    /// ok, failed or rebuilding.
    pub health: String,
}

/// What `grove rebuild` did: grove-raif's report, and the directory the
/// branch was rebuilt into.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RebuildSummary {
    pub dir: String,
    #[serde(flatten)]
    pub report: RebuildReport,
}

/// What `grove scrub` found and did: grove-raif's report, and whether it
/// repaired (the control socket carries it as one JSON object).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScrubSummary {
    pub repair: bool,
    #[serde(flatten)]
    pub report: ScrubReport,
}

impl ScrubSummary {
    /// Stripes still wrong after the scrub.
    pub fn errors_left(&self) -> u64 {
        if self.repair {
            self.report.unrepairable_stripes
        } else {
            self.report.stripes_with_errors
        }
    }
}

/// What the branch commands ask of a pool, here or in its daemon. The
/// daemon's side of each method (its request, its work and the client that
/// sends it) is one entry of control.rs's `control_operations!`.
pub trait BranchAdmin {
    /// None for a pool kept in one file.
    fn branch_report(&self) -> grove_store::Result<Option<BranchReport>>;
    fn rebuild_branch(
        &self,
        label: &str,
        to: &Path,
        force: bool,
    ) -> grove_store::Result<RebuildSummary>;
    fn scrub_branches(&self, repair: bool) -> grove_store::Result<ScrubSummary>;
    /// Takes a branch out of service; returns the branches after.
    fn fail_branch(&self, label: &str) -> grove_store::Result<BranchReport>;
    /// Adds branches; returns the branches after.
    fn add_branches(&self, dirs: &[PathBuf]) -> grove_store::Result<BranchReport>;
    /// Spreads the segments narrower than the pool over every branch.
    fn restripe_branches(&self) -> grove_store::Result<RestripeSummary>;
}

impl BranchAdmin for crate::open::OpenedPool {
    fn branch_report(&self) -> grove_store::Result<Option<BranchReport>> {
        Ok(self.branches.as_deref().map(report))
    }
    fn rebuild_branch(
        &self,
        label: &str,
        to: &Path,
        force: bool,
    ) -> grove_store::Result<RebuildSummary> {
        let branches = self.need_branches()?;
        let bar = crate::progress::Progress::count(&format!("rebuilding {label}"), 0);
        rebuild(
            branches,
            label,
            to,
            force,
            &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            },
            &|| false,
        )
    }
    fn scrub_branches(&self, repair: bool) -> grove_store::Result<ScrubSummary> {
        let branches = self.need_branches()?;
        let bar = crate::progress::Progress::count("scrubbing", 0);
        scrub(
            branches,
            repair,
            &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            },
            &|| false,
        )
    }
    fn fail_branch(&self, label: &str) -> grove_store::Result<BranchReport> {
        fail(self.need_branches()?, label)
    }
    fn add_branches(&self, dirs: &[PathBuf]) -> grove_store::Result<BranchReport> {
        add(self.need_branches()?, dirs)
    }
    fn restripe_branches(&self) -> grove_store::Result<RestripeSummary> {
        let branches = self.need_branches()?;
        let bar = crate::progress::Progress::bytes("restriping", 0);
        restripe(
            branches,
            &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            },
            &|| false,
        )
    }
}

impl crate::open::OpenedPool {
    fn need_branches(&self) -> grove_store::Result<&Branches> {
        self.branches
            .as_deref()
            .ok_or_else(|| not_a_branch_pool(self.pool.dir()))
    }
}

/// The branches as they stand.
pub fn report(branches: &Branches) -> BranchReport {
    let device = &branches.device;
    let shape = device.shape();
    BranchReport {
        level: device.level().to_string(),
        stripe_unit_bytes: device.stripe_unit_bytes(),
        degraded: device.is_degraded(),
        branches: device
            .status()
            .into_iter()
            .map(|m| BranchLine {
                label: m.label,
                dir: m.place,
                health: m.health.to_string(),
            })
            .collect(),
        segments: shape
            .segments
            .iter()
            .map(|s| SegmentLine {
                id: s.id,
                start_bytes: s.start,
                branches: s.width,
            })
            .collect(),
        restripe_done_bytes: shape.restripe.map(|r| r.done_bytes),
        job: branches.job(),
    }
}

fn io_failure(e: io::Error) -> Error {
    let kind = if e.kind() == io::ErrorKind::Interrupted {
        ErrorKind::Busy
    } else {
        ErrorKind::Io
    };
    Error::new(kind, e.to_string())
}

/// Rebuilds branch `label` into `to` (an empty or missing directory):
/// grove.toml names `to` for the branch before the device puts it in
/// service, so that a crash after leaves the pool pointing at the
/// replacement (which then says it is not whole yet), never at a branch
/// the device stopped writing.
pub fn rebuild(
    branches: &Branches,
    label: &str,
    to: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64, u64),
    stop: &dyn Fn() -> bool,
) -> grove_store::Result<RebuildSummary> {
    let dir = &branches.dir;
    let device = &branches.device;
    let (mut config, mut branch_config) = load_branch_config(dir)?;
    let Some(index) = branch_config.index_of(label) else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no branch labelled {label:?} in pool {} (its branches: {})",
                dir.display(),
                members::labels(&branch_config)
            ),
        ));
    };
    let to = std::path::absolute(to).unwrap_or_else(|_| to.to_path_buf());
    let health = device.health_of(label).unwrap_or(Health::Failed);
    if health == Health::Healthy && !force {
        return Err(Error::new(
            ErrorKind::InvalidState,
            format!(
                "branch {label} ({}) is ok: rebuilding a healthy branch takes --force",
                device.place_of(label).unwrap_or_default()
            ),
        ));
    }
    let job = branches.start_job(
        format!("rebuild of {label} into {}", to.display()),
        "stripes",
    )?;
    let lock = members::prepare_replacement(&branch_config, label, &to).map_err(branch_error)?;
    let before = config.clone();
    branch_config.member[index].dir = to.clone();
    config.branches = Some(branch_config.to_table());
    config.save(dir)?;
    if let Err(e) = device.replace_at(label, to.display().to_string()) {
        // The device goes on with the branch where it was: so must grove.toml.
        before.save(dir)?;
        return Err(io_failure(e));
    }
    branches.hold(lock);
    tracing::info!("branch {label}: rebuilding into {}", to.display());
    let report: RebuildReport = device
        .rebuild(
            label,
            &mut |done, total| {
                job.progress(done, total);
                progress(done, total);
            },
            stop,
        )
        .map_err(io_failure)?;
    Ok(RebuildSummary {
        dir: to.display().to_string(),
        report,
    })
}

/// Scrubs every stripe; with `repair`, writes what is wrong again.
pub fn scrub(
    branches: &Branches,
    repair: bool,
    progress: &mut dyn FnMut(u64, u64),
    stop: &dyn Fn() -> bool,
) -> grove_store::Result<ScrubSummary> {
    let what = if repair { "scrub --repair" } else { "scrub" };
    let job = branches.start_job(what.to_string(), "stripes")?;
    let report = branches
        .device
        .scrub(
            repair,
            &mut |done, total| {
                job.progress(done, total);
                progress(done, total);
            },
            stop,
        )
        .map_err(io_failure)?;
    let summary = ScrubSummary { repair, report };
    tracing::info!(
        "{what}: {} stripes, {} with errors, {} units repaired, {} unrepairable",
        summary.report.stripes,
        summary.report.stripes_with_errors,
        summary.report.repaired_units,
        summary.report.unrepairable_stripes
    );
    Ok(summary)
}

/// `grove branch fail LABEL`.
pub fn fail(branches: &Branches, label: &str) -> grove_store::Result<BranchReport> {
    if branches.device.health_of(label).is_none() {
        let (_, config) = load_branch_config(&branches.dir)?;
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no branch labelled {label:?} in pool {} (its branches: {})",
                branches.dir.display(),
                members::labels(&config)
            ),
        ));
    }
    branches
        .device
        .fail_branch(label, "taken out of service by `grove branch fail`")
        .map_err(|e| Error::new(ErrorKind::InvalidState, e.to_string()))?;
    Ok(report(branches))
}

/// `grove branch add DIR...`: the directories (each empty or missing)
/// join the pool as its next branches. grove.toml names them before the
/// device uses them, so a crash between leaves branches no segment uses
/// yet, never a segment over a branch grove.toml does not name.
pub fn add(branches: &Branches, dirs: &[PathBuf]) -> grove_store::Result<BranchReport> {
    let (mut config, mut branch_config) = load_branch_config(&branches.dir)?;
    let before = config.clone();
    let mut added = Vec::new();
    let mut locks = Vec::new();
    for dir in dirs {
        let (member, lock) =
            members::prepare_addition(&branch_config, dir).map_err(branch_error)?;
        added.push((member.label.clone(), member.dir.display().to_string()));
        branch_config.member.push(member);
        locks.push(lock);
    }
    config.branches = Some(branch_config.to_table());
    config.save(&branches.dir)?;
    if let Err(e) = branches.device.add_branches(&added) {
        before.save(&branches.dir)?;
        return Err(Error::new(
            ErrorKind::InvalidState,
            format!("no branch added: {e}"),
        ));
    }
    for lock in locks {
        branches.hold(lock);
    }
    Ok(report(branches))
}

/// What `grove branch restripe` did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestripeSummary {
    pub segments: u64,
    pub bytes_copied: u64,
}

/// `grove branch restripe`: copies every segment narrower than the pool
/// over all its branches, resuming one a crash cut short.
pub fn restripe(
    branches: &Branches,
    progress: &mut dyn FnMut(u64, u64),
    stop: &dyn Fn() -> bool,
) -> grove_store::Result<RestripeSummary> {
    let job = branches.start_job("restripe".to_string(), "bytes")?;
    let report = branches
        .device
        .restripe(
            &mut |done, total| {
                job.progress(done, total);
                progress(done, total);
            },
            stop,
        )
        .map_err(io_failure)?;
    tracing::info!(
        "restripe: {} segment(s), {} copied",
        report.segments,
        format_size(report.bytes_copied)
    );
    Ok(RestripeSummary {
        segments: report.segments,
        bytes_copied: report.bytes_copied,
    })
}

/// `grove init --branch DIR ...`: the level (by default raif0 for one
/// branch, raif1 for two, raif5 for more) and stripe unit (by default the
/// block size) over the given directories, each empty or missing.
pub struct InitBranches<'a> {
    pub dirs: &'a [PathBuf],
    pub level: Option<&'a str>,
    pub stripe_unit: Option<&'a str>,
}

/// Makes the branches, then the pool over them. Returns the pool and a
/// description of the layout for init's line.
pub fn create_pool(
    dir: &Path,
    init: &InitBranches,
    options: &PoolOptions,
    settings: &SpaceSettings,
) -> Result<(Pool, String)> {
    if dir.join(CONFIG_FILE_NAME).exists() {
        bail!("a grove pool already exists in {}", dir.display());
    }
    let level: Level = match init.level {
        Some(text) => text.parse().map_err(|e: String| anyhow::anyhow!(e))?,
        None => match init.dirs.len() {
            1 => Level::Raif0,
            2 => Level::Raif1,
            _ => Level::Raif5,
        },
    };
    let stripe_unit_bytes = match init.stripe_unit {
        Some(text) => crate::size::parse_size(text, "stripe unit")?,
        None => u64::from(options.block_size_bytes),
    };
    let block_bytes = u64::from(options.block_size_bytes);
    if stripe_unit_bytes == 0 || stripe_unit_bytes % block_bytes != 0 {
        bail!(
            "stripe unit {} is not a multiple of the block size {}",
            format_size(stripe_unit_bytes),
            format_size(block_bytes)
        );
    }
    check_new_branch_dirs(init.dirs)?;
    let branch_config =
        BranchPoolConfig::new(level, stripe_unit_bytes, init.dirs).map_err(branch_error)?;
    let device = Arc::new(members::create(&branch_config).map_err(branch_error)?);
    let mut config = PoolConfig::new();
    config.branches = Some(branch_config.to_table());
    match Pool::create_on_device(dir, device, options, settings, config) {
        Ok(pool) => Ok((
            pool,
            format!(
                "{level} over {} branches, stripe unit {}",
                init.dirs.len(),
                format_size(stripe_unit_bytes)
            ),
        )),
        Err(e) => {
            // The branches made for it would only be in the way of a retry.
            remove_branch_files(&branch_config);
            Err(e.into())
        }
    }
}

/// Each directory given once, and empty or missing.
fn check_new_branch_dirs(dirs: &[PathBuf]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for branch in dirs {
        let absolute = std::path::absolute(branch).unwrap_or_else(|_| branch.clone());
        if !seen.insert(absolute.clone()) {
            bail!("branch directory {} is given twice", branch.display());
        }
        match std::fs::read_dir(branch) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    bail!(
                        "branch directory {} is not empty: give an empty (or missing) directory",
                        branch.display()
                    );
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot read branch directory {}", branch.display()))
            }
        }
    }
    Ok(())
}

/// The files members::create made in each branch directory.
fn remove_branch_files(config: &BranchPoolConfig) {
    for member in &config.member {
        for name in [
            IDENTITY_FILE_NAME,
            DATA_FILE_NAME,
            members::JOURNAL_FILE_NAME,
            members::SUMS_FILE_NAME,
            members::SHAPE_FILE_NAME,
        ] {
            let _ = std::fs::remove_file(member.dir.join(name));
        }
    }
}

/// One line for a pool running degraded: which branches are not ok.
pub fn degraded_line(dir: &Path, report: &BranchReport) -> Option<String> {
    if !report.degraded {
        return None;
    }
    let down: Vec<&BranchLine> = report
        .branches
        .iter()
        .filter(|b| b.health != "ok")
        .collect();
    let named: Vec<String> = down
        .iter()
        .map(|b| format!("{} ({}) {}", b.label, b.dir, b.health))
        .collect();
    // The command as it runs, for the one branch most often down.
    let rebuild = match down.as_slice() {
        [one] => format!("`grove rebuild --branch {} --to DIR`", one.label),
        _ => "`grove rebuild --branch LABEL --to DIR` for each".to_string(),
    };
    Some(format!(
        "pool {} is degraded: branch {}; {rebuild} restores its redundancy",
        dir.display(),
        named.join(", ")
    ))
}

/// The daemons' watcher: every second, each branch in service must still
/// have its directory and its data file; one that lost either is failed
/// (the open file would otherwise go on being written, unseen, after
/// `rm -rf`), and the pool runs degraded.
pub struct BranchWatcher(Worker);

impl BranchWatcher {
    pub fn start(branches: Arc<Branches>) -> io::Result<BranchWatcher> {
        Worker::start("grove-branch-watch", move |stopping| {
            watch(&branches, stopping)
        })
        .map(BranchWatcher)
    }

    pub fn stop(self) {
        self.0.stop();
    }
}

fn watch(branches: &Branches, stopping: &AtomicBool) {
    // What could not be failed (past what the level survives): said once.
    let mut refused = BTreeSet::new();
    while !is_stopping(stopping) {
        for member in branches.device.status() {
            if member.health == Health::Failed {
                continue;
            }
            let dir = Path::new(&member.place);
            let why = if !dir.is_dir() {
                format!("its directory {} is gone", dir.display())
            } else if !dir.join(members::SHAPE_FILE_NAME).is_file() {
                // Every branch keeps the shape file, whatever segments it
                // holds: gone, the branch's files went with it.
                format!(
                    "its file {} is gone",
                    dir.join(members::SHAPE_FILE_NAME).display()
                )
            } else {
                refused.remove(&member.label);
                continue;
            };
            if let Err(e) = branches.device.fail_branch(&member.label, &why) {
                if refused.insert(member.label.clone()) {
                    tracing::error!(
                        "branch {} ({}): {why}, but it cannot be failed: {e}",
                        member.label,
                        member.place
                    );
                }
            }
        }
        sleep_unless_stopping(WATCH_INTERVAL_MS, stopping);
    }
}

/// The watcher, if the pool has branches.
pub fn start_watcher(opened: &crate::open::OpenedPool) -> Result<Option<BranchWatcher>> {
    opened
        .branches
        .clone()
        .map(BranchWatcher::start)
        .transpose()
        .context("cannot start the branch watcher")
}

/// Logs a line when a daemon starts on a degraded pool.
pub fn log_if_degraded(opened: &crate::open::OpenedPool) {
    if let Some(branches) = &opened.branches {
        if let Some(line) = degraded_line(&branches.dir, &report(branches)) {
            tracing::warn!("{line}");
        }
    }
}
