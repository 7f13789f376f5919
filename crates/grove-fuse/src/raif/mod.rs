//! The RAIF file system (thesis chapters 2 and 3): every regular file
//! striped, mirrored or parity-protected over branch directories by the
//! rule that matches it; directories and symlinks replicated on every
//! branch. `core` holds the state and the operations, `fs` the FUSE glue,
//! `meta` the sidecar format, `links` hard links, `report` status and
//! explain, `maintain` the rebuild and scrub jobs, `tidy` what a crash
//! left half done, which scrub finds and `--repair` removes.

mod core;
mod fs;
mod job;
mod links;
mod lower;
mod maintain;
pub mod meta;
mod plain;
mod report;
mod tidy;
mod walk;

use std::path::Path;

use fuser::MountOption;
use grove_raif::config::Config;
use grove_raif::{raid, Layout};

pub use core::{READ_DELAY_ENV, WRITE_HOLE_ENV};
pub use fs::{XATTR_EXPLAIN, XATTR_STATUS};
pub use job::{Job, Request, XATTR_CONTROL};

use crate::kernel::session_config;
use crate::mount::{checked_mount_point, spawn, Mount, MountError};

/// The name mount(8) shows: `fuse.grove-raif`.
const FS_NAME: &str = "grove-raif";

/// Checks that every branch is a directory: a missing one is an error,
/// unless `degraded`. Then the missing branches are returned (they start
/// failed) if every rule's level survives their loss and no file loses
/// both copies of its metadata.
pub fn check_branches(config: &Config, degraded: bool) -> Result<Vec<usize>, MountError> {
    let missing: Vec<usize> = (0..config.branches.len())
        .filter(|&i| !config.branches[i].path.is_dir())
        .collect();
    match missing.first() {
        None => Ok(missing),
        Some(&first) if !degraded => Err(MountError::BranchMissing {
            label: config.branches[first].label.clone(),
            path: config.branches[first].path.clone(),
        }),
        Some(_) => check_degraded(config, &missing).map(|()| missing),
    }
}

/// Whether the mount can run with the `missing` branches failed. Only the
/// rules are checked: a file laid out by a rule since removed from the
/// configuration may still have lost more.
fn check_degraded(config: &Config, missing: &[usize]) -> Result<(), MountError> {
    let labels = |set: &mut dyn Iterator<Item = usize>| {
        set.map(|i| config.branches[i].label.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for rule in &config.rules {
        let lost: Vec<usize> = (0..rule.branches.len())
            .filter(|&p| missing.contains(&rule.branches[p]))
            .collect();
        let layout = Layout::new(rule.level, rule.branches.len(), rule.stripe_unit_bytes, 0)
            .map_err(|e| MountError::DegradedUnsafe(format!("rule {:?}: {e}", rule.name)))?;
        if !raid::survives(&layout, &lost) {
            let names = labels(&mut lost.iter().map(|&p| rule.branches[p]));
            return Err(MountError::DegradedUnsafe(format!(
                "rule {:?} ({}) does not survive the loss of {names}",
                rule.name, rule.level
            )));
        }
    }
    // A file's metadata lives on its authoritative branch and the next one.
    let n = config.branches.len();
    let pair = missing
        .iter()
        .find(|&&a| n > 1 && missing.contains(&((a + 1) % n)));
    if let Some(&a) = pair {
        let names = labels(&mut [a, (a + 1) % n].into_iter());
        return Err(MountError::DegradedUnsafe(format!(
            "branches {names} hold both copies of some files' metadata"
        )));
    }
    Ok(())
}

/// Mounts the RAIF file system over `config`'s branches on `mountpoint`.
/// With `degraded`, missing branches start failed (see [`check_branches`]).
pub fn mount_raif(
    config: Config,
    mountpoint: &Path,
    allow_other: bool,
    degraded: bool,
    on_end: impl FnOnce() + Send + 'static,
) -> Result<Mount, MountError> {
    let mountpoint = checked_mount_point(mountpoint)?;
    let missing = check_branches(&config, degraded)?;
    // As on any file system root mounts: device nodes open and set-ID
    // bits count (fusermount3 refuses both to other users).
    let mut options = vec![MountOption::RW];
    if rustix::process::geteuid().is_root() {
        options.extend([MountOption::Dev, MountOption::Suid]);
    }
    let fuse = session_config(FS_NAME, options, allow_other);
    for (branch, b) in config.branches.iter().enumerate() {
        if !missing.contains(&branch) {
            meta::clean_work_dir(&b.path).map_err(|e| MountError::Io {
                context: format!("cannot clean {}", b.path.join(meta::WORK_DIR).display()),
                source: e,
            })?;
        }
    }
    let core = core::Core::new(config);
    for branch in missing {
        let why = std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "missing at mount (--degraded)",
        );
        core.branches.fail(branch, &why);
    }
    let fs = fs::RaifFs::new(core, Box::new(on_end));
    let mount = spawn(fs, mountpoint, &fuse)?;
    tracing::info!(mountpoint = %mount.mountpoint().display(), "RAIF mount ready");
    Ok(mount)
}
