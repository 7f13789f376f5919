//! Operations on the branches' paths that work at any length the mount
//! takes. A path inside the mount may be up to PATH_MAX long, so the same
//! path under a branch directory (and a sidecar's, one directory deeper)
//! can pass PATH_MAX, which every call taking a whole path refuses with
//! ENAMETOOLONG. A path that long is walked instead: its directories are
//! opened in chunks shorter than PATH_MAX, each relative to the one
//! before (openat), and the operation is the `*at` call on the last
//! directory and the final name. Shorter paths go to the same `*at` calls
//! relative to the working directory, as one system call, as before.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Gid, Mode, OFlags, Uid, CWD};

/// Paths at least this long are walked in chunks: under PATH_MAX (4096
/// bytes with the terminating NUL), with room for one more name.
const PATH_CHUNK_BYTES: usize = 3800;

/// A path as a directory and a name in it: the working directory and the
/// whole path when it is short, else an opened directory and one name.
pub struct At {
    dir: Option<OwnedFd>,
    name: PathBuf,
}

impl At {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_ref().map_or(CWD, |d| d.as_fd())
    }

    pub fn name(&self) -> &Path {
        &self.name
    }
}

/// `path` as a directory and a name a `*at` call takes.
pub fn at(path: &Path) -> io::Result<At> {
    if path.as_os_str().len() < PATH_CHUNK_BYTES {
        return Ok(At {
            dir: None,
            name: path.to_path_buf(),
        });
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::from_raw_os_error(libc_enametoolong()));
    };
    let start = if path.is_absolute() { "/" } else { "." };
    let open_dir = |dir: BorrowedFd, chunk: &Path| {
        rustix::fs::openat(
            dir,
            chunk,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let mut dir = open_dir(CWD, Path::new(start))?;
    let mut chunk = PathBuf::new();
    for component in parent.components() {
        let part: &OsStr = match component {
            Component::Normal(n) => n,
            Component::ParentDir => OsStr::new(".."),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
        };
        if chunk.as_os_str().len() + part.len() + 1 >= PATH_CHUNK_BYTES {
            dir = open_dir(dir.as_fd(), &chunk)?;
            chunk.clear();
        }
        chunk.push(part);
    }
    if !chunk.as_os_str().is_empty() {
        dir = open_dir(dir.as_fd(), &chunk)?;
    }
    Ok(At {
        dir: Some(dir),
        name: PathBuf::from(name),
    })
}

/// ENAMETOOLONG on Linux.
fn libc_enametoolong() -> i32 {
    rustix::io::Errno::NAMETOOLONG.raw_os_error()
}

/// lstat: a symlink's own metadata.
pub fn symlink_metadata(path: impl AsRef<Path>) -> io::Result<std::fs::Metadata> {
    let path = path.as_ref();
    let a = at(path)?;
    if a.dir.is_none() {
        return std::fs::symlink_metadata(path);
    }
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(a.fd(), a.name(), flags, Mode::empty())?;
    File::from(fd).metadata()
}

/// stat: what a symlink points to.
pub fn metadata(path: impl AsRef<Path>) -> io::Result<std::fs::Metadata> {
    let path = path.as_ref();
    let a = at(path)?;
    if a.dir.is_none() {
        return std::fs::metadata(path);
    }
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(a.fd(), a.name(), flags, Mode::empty())?;
    File::from(fd).metadata()
}

/// Whether `path` is a directory (or a symlink to one), as Path::is_dir.
pub fn is_dir(path: impl AsRef<Path>) -> bool {
    metadata(path).is_ok_and(|m| m.is_dir())
}

/// Whether anything is at `path` (following symlinks), as Path::exists.
pub fn exists(path: impl AsRef<Path>) -> bool {
    metadata(path).is_ok()
}

pub fn open(path: impl AsRef<Path>, flags: OFlags, mode: u32) -> io::Result<File> {
    let path = path.as_ref();
    let a = at(path)?;
    let fd = rustix::fs::openat(
        a.fd(),
        a.name(),
        flags | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    Ok(File::from(fd))
}

pub fn remove_file(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    let a = at(path)?;
    Ok(rustix::fs::unlinkat(a.fd(), a.name(), AtFlags::empty())?)
}

pub fn remove_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    let a = at(path)?;
    Ok(rustix::fs::unlinkat(a.fd(), a.name(), AtFlags::REMOVEDIR)?)
}

/// mkdir with mode 0777 less the umask, as std::fs::create_dir.
pub fn create_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    let a = at(path)?;
    Ok(rustix::fs::mkdirat(
        a.fd(),
        a.name(),
        Mode::from_raw_mode(0o777),
    )?)
}

pub fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    let (a, b) = (at(from.as_ref())?, at(to.as_ref())?);
    Ok(rustix::fs::renameat(a.fd(), a.name(), b.fd(), b.name())?)
}

/// A new name for `from` (a symlink itself, not what it points to).
pub fn hard_link(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    let (a, b) = (at(from.as_ref())?, at(to.as_ref())?);
    Ok(rustix::fs::linkat(
        a.fd(),
        a.name(),
        b.fd(),
        b.name(),
        AtFlags::empty(),
    )?)
}

pub fn read_link(path: impl AsRef<Path>) -> io::Result<PathBuf> {
    let path = path.as_ref();
    let a = at(path)?;
    let target = rustix::fs::readlinkat(a.fd(), a.name(), Vec::new())?;
    Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
}

pub fn symlink(target: impl AsRef<Path>, path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    let a = at(path)?;
    Ok(rustix::fs::symlinkat(target.as_ref(), a.fd(), a.name())?)
}

/// chown of the entry itself (a symlink's own owner).
pub fn lchown(path: impl AsRef<Path>, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let path = path.as_ref();
    let a = at(path)?;
    let (uid, gid) = (uid.map(Uid::from_raw), gid.map(Gid::from_raw));
    Ok(rustix::fs::chownat(
        a.fd(),
        a.name(),
        uid,
        gid,
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// chmod (following symlinks: callers never give one).
pub fn chmod(path: impl AsRef<Path>, mode: u32) -> io::Result<()> {
    let path = path.as_ref();
    let a = at(path)?;
    Ok(rustix::fs::chmodat(
        a.fd(),
        a.name(),
        Mode::from_raw_mode(mode),
        AtFlags::empty(),
    )?)
}

/// One directory entry: its name and type (lstat's when the directory
/// does not say).
pub struct Entry {
    pub name: OsString,
    pub kind: FileType,
}

/// The entries of directory `path`, without `.` and `..`.
pub fn read_dir(path: impl AsRef<Path>) -> io::Result<Vec<Entry>> {
    let path = path.as_ref();
    let a = at(path)?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(a.fd(), a.name(), flags, Mode::empty())?;
    let mut dir = Dir::read_from(&fd)?;
    let mut entries = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let name = OsStr::from_bytes(bytes).to_os_string();
        let kind = match entry.file_type() {
            FileType::Unknown => {
                let st = rustix::fs::statat(&fd, &name, AtFlags::SYMLINK_NOFOLLOW)?;
                FileType::from_raw_mode(st.st_mode)
            }
            kind => kind,
        };
        entries.push(Entry { name, kind });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory chain whose path is about `depth` * 255 bytes long.
    fn deep(root: &Path, depth: usize) -> PathBuf {
        let name = "d".repeat(250);
        let mut path = root.to_path_buf();
        for _ in 0..depth {
            path.push(&name);
            create_dir(&path).unwrap();
        }
        path
    }

    /// Past PATH_MAX every operation still works: the whole path is
    /// refused by the kernel, the walked one is not.
    #[test]
    fn paths_past_path_max_work() {
        let dir = tempfile::tempdir().unwrap();
        let d = deep(dir.path(), 20);
        assert!(d.as_os_str().len() > 5000);
        let f = d.join("f");
        let err = std::fs::write(&f, b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc_enametoolong()));
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
        std::io::Write::write_all(&mut open(&f, flags, 0o640).unwrap(), b"hello").unwrap();
        assert_eq!(symlink_metadata(&f).unwrap().len(), 5);
        chmod(&f, 0o600).unwrap();
        assert_eq!(metadata(&f).unwrap().mode_bits(), 0o600);
        hard_link(&f, d.join("g")).unwrap();
        rename(d.join("g"), d.join("h")).unwrap();
        symlink(Path::new("f"), d.join("l")).unwrap();
        assert_eq!(read_link(d.join("l")).unwrap(), Path::new("f"));
        assert!(symlink_metadata(d.join("l")).unwrap().is_symlink());
        let me = rustix::process::getuid().as_raw();
        lchown(d.join("l"), Some(me), None).unwrap();
        let mut names: Vec<_> = read_dir(&d).unwrap().into_iter().map(|e| e.name).collect();
        names.sort();
        assert_eq!(names, ["f", "h", "l"]);
        create_dir(d.join("sub")).unwrap();
        assert!(is_dir(d.join("sub")) && exists(d.join("h")));
        remove_dir(d.join("sub")).unwrap();
        for name in ["f", "h", "l"] {
            remove_file(d.join(name)).unwrap();
        }
        assert!(read_dir(&d).unwrap().is_empty());
    }

    trait ModeBits {
        fn mode_bits(&self) -> u32;
    }

    impl ModeBits for std::fs::Metadata {
        fn mode_bits(&self) -> u32 {
            std::os::unix::fs::PermissionsExt::mode(&self.permissions()) & 0o7777
        }
    }
}
