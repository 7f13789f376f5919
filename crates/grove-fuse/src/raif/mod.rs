//! The RAIF file system (thesis chapters 2 and 3): every regular file
//! striped, mirrored or parity-protected over branch directories by the
//! rule that matches it; directories and symlinks replicated on every
//! branch. `core` holds the state and the operations, `fs` the FUSE glue,
//! `meta` the sidecar format, `report` status and explain, `maintain`
//! the rebuild and scrub jobs.

mod core;
mod fs;
mod maintain;
pub mod meta;
mod report;

use std::path::Path;

use fuser::{Config as FuseConfig, MountOption, SessionACL};
use grove_raif::config::Config;

pub use core::{READ_DELAY_ENV, WRITE_HOLE_ENV};
pub use fs::{XATTR_EXPLAIN, XATTR_STATUS};
pub use maintain::{Job, Request, XATTR_CONTROL};

use crate::mount::{Mount, MountError};

/// The name mount(8) shows: `fuse.grove-raif`.
const FS_NAME: &str = "grove-raif";
/// Threads serving requests at once.
pub const RAIF_SESSION_THREADS: usize = 4;

/// Checks that every branch is a directory: mounting over a missing
/// branch is an error, not a degraded start.
pub fn check_branches(config: &Config) -> Result<(), MountError> {
    for branch in &config.branches {
        if !branch.path.is_dir() {
            return Err(MountError::BranchMissing {
                label: branch.label.clone(),
                path: branch.path.clone(),
            });
        }
    }
    Ok(())
}

/// Mounts the RAIF file system over `config`'s branches on `mountpoint`.
pub fn mount_raif(
    config: Config,
    mountpoint: &Path,
    allow_other: bool,
    on_end: impl FnOnce() + Send + 'static,
) -> Result<Mount, MountError> {
    crate::mount::check_mount_possible(mountpoint)?;
    check_branches(&config)?;
    let mountpoint = std::path::absolute(mountpoint).map_err(|e| MountError::Io {
        context: format!("cannot resolve {}", mountpoint.display()),
        source: e,
    })?;
    let mut fuse = FuseConfig::default();
    fuse.mount_options = vec![
        MountOption::FSName(FS_NAME.into()),
        MountOption::Subtype(FS_NAME.into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    fuse.acl = if allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    fuse.n_threads = Some(RAIF_SESSION_THREADS);
    fuse.clone_fd = true;
    let fs = fs::RaifFs::new(core::Core::new(config), Box::new(on_end));
    let session = fuser::spawn_mount(fs, &mountpoint, &fuse).map_err(|e| MountError::Io {
        context: format!("cannot mount on {}", mountpoint.display()),
        source: e,
    })?;
    tracing::info!(mountpoint = %mountpoint.display(), "RAIF mount ready");
    Ok(Mount::from_session(session, mountpoint))
}
