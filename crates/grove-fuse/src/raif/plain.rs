//! Directories, symlinks and special files (FIFOs, sockets, device nodes):
//! the entries replicated as they are on every branch, with their modes,
//! owners and times. Regular files are the layouts of `core`.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{AtFlags, FileType as LowerType, Mode, Timespec, Timestamps, UTIME_OMIT};

use super::lower;
use super::meta::{self, LINKS_DIR, META_DIR, WORK_DIR};

/// st_mode's file type bits.
const S_IFMT: u32 = 0o170_000;
/// st_mode's permission bits, with set-id and sticky.
pub const PERMISSION_BITS: u32 = 0o7777;

/// What mknod may make on a branch: a FIFO, socket or device node (a
/// regular file is a layout, made by `Core::create`).
pub fn special_type(mode: u32) -> Option<LowerType> {
    match LowerType::from_raw_mode(mode & S_IFMT) {
        t @ (LowerType::Fifo
        | LowerType::Socket
        | LowerType::CharacterDevice
        | LowerType::BlockDevice) => Some(t),
        _ => None,
    }
}

/// Makes a special file at `path` with exactly the permission bits `perm`
/// (mknod applies the process umask, so they are set again after).
pub fn make_special(path: &Path, kind: LowerType, perm: u32, rdev: u64) -> io::Result<()> {
    let mode = Mode::from_raw_mode(perm & PERMISSION_BITS);
    let at = lower::at(path)?;
    rustix::fs::mknodat(at.fd(), at.name(), kind, mode, rdev)?;
    lower::chmod(path, mode.bits())?;
    Ok(())
}

/// Sets the permission bits of an entry that is not a symlink (a symlink's
/// own mode cannot change on Linux, and chmod would follow it).
pub fn set_mode(path: &Path, perm: u32) -> io::Result<()> {
    lower::chmod(path, perm & PERMISSION_BITS)
}

/// Sets the access and modification times of the entry itself, never of
/// what a symlink points to (utimensat's AT_SYMLINK_NOFOLLOW); a time not
/// given is left as it is.
pub fn set_times(
    path: &Path,
    accessed: Option<SystemTime>,
    modified: Option<SystemTime>,
) -> io::Result<()> {
    let spec = |t: Option<SystemTime>| match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        Some(t) => {
            let ns = meta::to_ns(t);
            Timespec {
                tv_sec: (ns / 1_000_000_000) as i64,
                tv_nsec: (ns % 1_000_000_000) as _,
            }
        }
    };
    let times = Timestamps {
        last_access: spec(accessed),
        last_modification: spec(modified),
    };
    let at = lower::at(path)?;
    rustix::fs::utimensat(at.fd(), at.name(), &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// A directory's link count as the user sees it: the lower one (2 plus
/// its subdirectories, on file systems that count so) less grove's own
/// directories in it.
pub fn dir_nlink(path: &Path, lower: &std::fs::Metadata) -> u32 {
    let ours = [META_DIR, WORK_DIR, LINKS_DIR]
        .iter()
        .filter(|name| lower::is_dir(path.join(name)))
        .count() as u64;
    lower.nlink().saturating_sub(ours).max(2) as u32
}

/// Copies one replicated entry to `to` (a rebuild): a directory is made
/// (or kept), a symlink points where `target` says, a special file gets
/// its type and device number; then the mode, owner and times follow.
/// The directory's times are set again once its children are made.
pub fn copy_entry(m: &std::fs::Metadata, target: Option<&Path>, to: &Path) -> io::Result<()> {
    let file_type = m.file_type();
    if file_type.is_dir() {
        match lower::create_dir(to) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    } else if file_type.is_symlink() {
        let target = target.ok_or_else(|| io::Error::from_raw_os_error(2))?;
        lower::symlink(target, to)?;
    } else {
        let kind = special_type(m.mode())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a special file"))?;
        make_special(to, kind, m.mode(), m.rdev())?;
    }
    if !file_type.is_symlink() {
        set_mode(to, m.mode())?;
    }
    lower::lchown(to, Some(m.uid()), Some(m.gid()))?;
    set_times(to, m.accessed().ok(), m.modified().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// utimensat on a symlink sets the link's own times and leaves its
    /// target's alone; a time not given stays.
    #[test]
    fn times_of_a_symlink_are_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("t", &link).unwrap();
        let before = std::fs::metadata(&target).unwrap().mtime();
        let when = UNIX_EPOCH + Duration::from_secs(1_000_000);
        set_times(&link, None, Some(when)).unwrap();
        let lm = std::fs::symlink_metadata(&link).unwrap();
        assert_eq!(lm.mtime(), 1_000_000);
        assert_eq!(std::fs::metadata(&target).unwrap().mtime(), before);
        assert_ne!(lm.atime(), 1_000_000, "atime was not given");
    }

    /// A FIFO copied by a rebuild keeps its type, mode and times.
    #[test]
    fn a_fifo_is_copied_with_its_mode_and_times() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("p");
        make_special(&fifo, LowerType::Fifo, 0o640, 0).unwrap();
        let when = UNIX_EPOCH + Duration::from_secs(2_000_000);
        set_times(&fifo, Some(when), Some(when)).unwrap();
        let m = std::fs::symlink_metadata(&fifo).unwrap();
        let copy = dir.path().join("q");
        copy_entry(&m, None, &copy).unwrap();
        let c = std::fs::symlink_metadata(&copy).unwrap();
        assert_eq!(special_type(c.mode()), Some(LowerType::Fifo));
        assert_eq!((c.mode() & PERMISSION_BITS, c.mtime()), (0o640, 2_000_000));
    }

    /// grove's own directories are not counted in a directory's links.
    #[test]
    fn a_directory_counts_only_its_users_subdirectories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::create_dir(dir.path().join(META_DIR)).unwrap();
        let m = std::fs::metadata(dir.path()).unwrap();
        assert_eq!(m.nlink(), 4);
        assert_eq!(dir_nlink(dir.path(), &m), 3);
    }
}
