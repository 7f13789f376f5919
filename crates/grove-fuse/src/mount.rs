//! Mounting and unmounting: the checks that turn the usual failures into
//! one clear error before anything is mounted, and the session that serves
//! the kernel until the mount goes away.

use std::io;
use std::path::{Path, PathBuf};

use fuser::{BackgroundSession, Config, MountOption};
use grove_store::Pool;

use crate::fs::VolumeFs;
use crate::kernel::session_config;

/// The FUSE device the kernel talks through.
pub const FUSE_DEVICE_PATH: &str = "/dev/fuse";
/// The name and subtype that mount(8) and /proc/mounts show: `fuse.grove`.
const FS_NAME: &str = "grove";
/// The helper non-root users mount through.
const FUSERMOUNT: &str = "fusermount3";

#[derive(Debug, Clone, Default)]
pub struct MountOptions {
    /// Every file read-only (mode 0444), and the mount itself `ro`.
    pub read_only: bool,
    /// Let other users than the one mounting reach the files (their mode
    /// bits are still checked by the kernel).
    pub allow_other: bool,
    /// Read-only files beside the volumes, under `archive/` (archived
    /// snapshots).
    pub archived: Option<std::sync::Arc<dyn crate::ReadOnlyFiles>>,
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount point {0} does not exist")]
    MountpointMissing(PathBuf),
    #[error("mount point {0} is not a directory")]
    MountpointNotDirectory(PathBuf),
    #[error("mount point {0} is not empty (grove mounts only on an empty directory)")]
    MountpointNotEmpty(PathBuf),
    #[error(
        "{FUSE_DEVICE_PATH} is missing: load the fuse module (modprobe fuse), or give the container the device (--device /dev/fuse)"
    )]
    NoFuseDevice,
    #[error("no permission to mount on {path}: {reason}")]
    PermissionDenied { path: PathBuf, reason: String },
    #[error("branch {label} ({}) is missing or not a directory", path.display())]
    BranchMissing { label: String, path: PathBuf },
    /// `grove raif mount --degraded` with more branches missing than the
    /// layout survives: why, in one line.
    #[error("cannot mount degraded: {0}")]
    DegradedUnsafe(String),
    #[error("cannot unmount {0}: it is busy (a loop device or an open file still uses it)")]
    Busy(PathBuf),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl MountError {
    fn io(context: impl Into<String>, source: io::Error) -> MountError {
        MountError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Checks what can be checked before the pool is opened: the mount point
/// is an empty directory, /dev/fuse exists and this user may use it.
pub fn check_mount_possible(mountpoint: &Path) -> Result<(), MountError> {
    let metadata = match std::fs::metadata(mountpoint) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(MountError::MountpointMissing(mountpoint.into()))
        }
        Err(e) => {
            return Err(MountError::io(
                format!("cannot stat mount point {}", mountpoint.display()),
                e,
            ))
        }
        Ok(metadata) => metadata,
    };
    if !metadata.is_dir() {
        return Err(MountError::MountpointNotDirectory(mountpoint.into()));
    }
    let mut entries = std::fs::read_dir(mountpoint).map_err(|e| {
        MountError::io(
            format!("cannot read mount point {}", mountpoint.display()),
            e,
        )
    })?;
    if entries.next().is_some() {
        return Err(MountError::MountpointNotEmpty(mountpoint.into()));
    }
    if !Path::new(FUSE_DEVICE_PATH).exists() {
        return Err(MountError::NoFuseDevice);
    }
    // fuser opens the device itself, as root and as anyone else: a device
    // this user cannot open fails the mount, with or without fusermount3.
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(FUSE_DEVICE_PATH)
    {
        return Err(match e.kind() {
            io::ErrorKind::NotFound => MountError::NoFuseDevice,
            io::ErrorKind::PermissionDenied => MountError::PermissionDenied {
                path: mountpoint.into(),
                reason: format!(
                    "cannot open {FUSE_DEVICE_PATH}: {e} (run as root, or make the device readable and writable for this user)"
                ),
            },
            _ => MountError::io(format!("cannot open {FUSE_DEVICE_PATH}"), e),
        });
    }
    // A user other than root mounts through fusermount3, which wants write
    // access to the mount point.
    if !rustix::process::geteuid().is_root()
        && rustix::fs::access(mountpoint, rustix::fs::Access::WRITE_OK).is_err()
    {
        return Err(MountError::PermissionDenied {
            path: mountpoint.into(),
            reason: "the mount point is not writable by this user".into(),
        });
    }
    Ok(())
}

/// A mounted pool. Dropping it unmounts (if still mounted) without waiting.
pub struct Mount {
    session: BackgroundSession,
    mountpoint: PathBuf,
}

/// Mounts `pool` on `mountpoint` and serves it from background threads.
/// `on_end` is called once when the mount goes away (`umount`,
/// `fusermount3 -u`, or [`Mount::unmount`]), after the pool is flushed.
pub fn mount(
    pool: Pool,
    mountpoint: &Path,
    options: &MountOptions,
    on_end: impl FnOnce() + Send + 'static,
) -> Result<Mount, MountError> {
    let mountpoint = checked_mount_point(mountpoint)?;
    let mut options_of_volumes = vec![
        // Volume files are disks: nothing in them runs or is a device.
        // (The kernel checks mode bits: 0444 snapshots stay read-only for
        // everyone but root, whom `open` refuses with EROFS.)
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
    ];
    options_of_volumes.push(if options.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    let config = session_config(FS_NAME, options_of_volumes, options.allow_other);
    let fs = VolumeFs::new(pool, options.read_only, Box::new(on_end))
        .with_archived(options.archived.clone());
    let mount = spawn(fs, mountpoint, &config)?;
    tracing::info!(mountpoint = %mount.mountpoint.display(), "FUSE mount ready");
    Ok(mount)
}

/// `mountpoint` made absolute, once [`check_mount_possible`] passed.
pub(crate) fn checked_mount_point(mountpoint: &Path) -> Result<PathBuf, MountError> {
    check_mount_possible(mountpoint)?;
    std::path::absolute(mountpoint)
        .map_err(|e| MountError::io(format!("cannot resolve {}", mountpoint.display()), e))
}

/// Serves `fs` on `mountpoint` from background threads.
pub(crate) fn spawn<FS: fuser::Filesystem + Send + 'static>(
    fs: FS,
    mountpoint: PathBuf,
    config: &Config,
) -> Result<Mount, MountError> {
    let session = fuser::spawn_mount(fs, &mountpoint, config).map_err(|e| {
        if e.kind() == io::ErrorKind::PermissionDenied {
            MountError::PermissionDenied {
                path: mountpoint.clone(),
                reason: e.to_string(),
            }
        } else {
            MountError::io(format!("cannot mount on {}", mountpoint.display()), e)
        }
    })?;
    Ok(Mount {
        session,
        mountpoint,
    })
}

impl Mount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Asks the kernel to unmount. The session then ends and `on_end` runs;
    /// [`Mount::join`] waits for that. A busy mount (a loop device on one of
    /// its files) stays mounted and served, and the error says so.
    pub fn unmount(&self) -> Result<(), MountError> {
        let result = if rustix::process::geteuid().is_root() {
            rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::empty())
                .map_err(io::Error::from)
        } else {
            fusermount_unmount(&self.mountpoint)
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                Err(MountError::Busy(self.mountpoint.clone()))
            }
            // Already gone (unmounted by someone else): nothing to do.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => Ok(()),
            Err(e) => Err(MountError::io(
                format!("cannot unmount {}", self.mountpoint.display()),
                e,
            )),
        }
    }

    /// Detaches the mount at once even if it is busy (umount -l): files
    /// still open fail from here on.
    pub fn unmount_lazily(&self) -> Result<(), MountError> {
        rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
            MountError::io(
                format!("cannot detach {}", self.mountpoint.display()),
                e.into(),
            )
        })
    }

    /// Waits until the session has ended (after an unmount).
    pub fn join(self) -> Result<(), MountError> {
        let mountpoint = self.mountpoint.display().to_string();
        self.session
            .join()
            .map_err(|e| MountError::io(format!("FUSE session on {mountpoint} failed"), e))
    }
}

fn fusermount_unmount(mountpoint: &Path) -> io::Result<()> {
    let output = std::process::Command::new(FUSERMOUNT)
        .arg("-u")
        .arg(mountpoint)
        .output()?;
    if output.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&output.stderr);
    if message.contains("busy") {
        return Err(io::Error::from_raw_os_error(
            rustix::io::Errno::BUSY.raw_os_error(),
        ));
    }
    Err(io::Error::other(message.trim().to_string()))
}
