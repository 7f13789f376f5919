//! The FUSE file system: a root directory holding one regular file per
//! volume. Inode numbers are handed out per mount, one per volume id, and
//! never reused while mounted, so a removed volume's inode cannot come back
//! as another volume.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};
use grove_store::types::VOLUME_NAME_MAX_BYTES;
use grove_store::{Pool, Volume, VolumeSummary};

use crate::answer;
use crate::archived::{ArchivedFiles, ARCHIVE_DIR_INO, ARCHIVE_DIR_NAME};
use crate::errno::{data_errno, errno_for};
use crate::kernel::{
    open_flags, OnEnd, MAX_BACKGROUND_REQUESTS, MAX_WRITE_BYTES, STAT_BLOCK_BYTES, TTL,
};
use crate::seek::{fallocate_action, seek_data_hole, Fallocate, SeekError};

/// The first inode number given to a volume (1 is the root directory).
const FIRST_VOLUME_INO: u64 = 2;
/// Mode bits of a writable volume, of a snapshot (or anything on a
/// read-only mount), and of the root directory.
const MODE_WRITABLE: u16 = 0o644;
const MODE_READ_ONLY: u16 = 0o444;
const MODE_ROOT: u16 = 0o755;

/// Claims of the open files, by file handle.
#[derive(Default)]
struct OpenFiles {
    claims: HashMap<u64, grove_store::VolumeClaim>,
    next_fh: u64,
}

/// Volumes seen during this mount, by inode and by volume id.
#[derive(Default)]
struct Inodes {
    by_ino: HashMap<u64, Volume>,
    by_id: HashMap<u64, u64>,
    next_ino: u64,
}

pub(crate) struct VolumeFs {
    pool: Pool,
    read_only: bool,
    uid: u32,
    gid: u32,
    block_size_bytes: u32,
    mounted_at: SystemTime,
    inodes: Mutex<Inodes>,
    /// Open files, by file handle: each claims its volume, so that removing
    /// a volume with an open file is refused unless forced.
    open_files: Mutex<OpenFiles>,
    /// How files open: direct I/O, unless the kernel cannot map such files
    /// shared (see [`open_flags`]).
    open_flags: FopenFlags,
    /// Called once, when the session ends (unmounted, or the connection
    /// aborted), after the pool is flushed.
    on_end: OnEnd,
    /// Read-only files under `archive/` (archived snapshots), if any.
    archived: Option<ArchivedFiles>,
}

impl VolumeFs {
    pub(crate) fn new(pool: Pool, read_only: bool, on_end: Box<dyn FnOnce() + Send>) -> VolumeFs {
        VolumeFs {
            block_size_bytes: pool.block_size_bytes(),
            pool,
            read_only,
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            mounted_at: SystemTime::now(),
            open_files: Mutex::new(OpenFiles::default()),
            open_flags: FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            inodes: Mutex::new(Inodes {
                next_ino: FIRST_VOLUME_INO,
                ..Inodes::default()
            }),
            on_end: OnEnd::new(on_end),
            archived: None,
        }
    }

    /// Adds the read-only files of `archive/`.
    pub(crate) fn with_archived(
        mut self,
        files: Option<std::sync::Arc<dyn crate::ReadOnlyFiles>>,
    ) -> VolumeFs {
        self.archived = files.map(ArchivedFiles::new);
        self
    }

    /// The files of `archive/`, or ENOENT when the mount has none.
    fn archived(&self) -> Result<&ArchivedFiles, Errno> {
        self.archived.as_ref().ok_or(Errno::ENOENT)
    }

    /// Whether the root shows `archive/`: a pool volume of that name wins.
    fn shows_archive_dir(&self) -> bool {
        self.archived.is_some() && self.pool.volume_summary(ARCHIVE_DIR_NAME).is_err()
    }

    fn inodes(&self) -> std::sync::MutexGuard<'_, Inodes> {
        self.inodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inode of a volume, given one the first time it is seen.
    fn ino_for(&self, info: &VolumeSummary) -> Result<u64, Errno> {
        if let Some(ino) = self.inodes().by_id.get(&info.id) {
            return Ok(*ino);
        }
        let volume = self
            .pool
            .volume(&info.name)
            .map_err(|e| errno_for(e.kind()))?;
        // The name may have moved to another volume since `info` was read.
        if volume.summary().map_err(|e| errno_for(e.kind()))?.id != info.id {
            return Err(Errno::ENOENT);
        }
        let mut inodes = self.inodes();
        if let Some(ino) = inodes.by_id.get(&info.id) {
            return Ok(*ino);
        }
        let ino = inodes.next_ino;
        inodes.next_ino += 1;
        inodes.by_ino.insert(ino, volume);
        inodes.by_id.insert(info.id, ino);
        Ok(ino)
    }

    fn volume(&self, ino: INodeNo) -> Result<Volume, Errno> {
        self.inodes().by_ino.get(&ino.0).cloned().ok_or_else(|| {
            if ino == INodeNo::ROOT {
                Errno::EISDIR
            } else {
                Errno::ENOENT
            }
        })
    }

    fn root_attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: 0,
            blocks: 0,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind: FileType::Directory,
            perm: MODE_ROOT,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.block_size_bytes,
            flags: 0,
        }
    }

    fn file_attr(&self, ino: u64, info: &VolumeSummary) -> FileAttr {
        let created = UNIX_EPOCH + Duration::from_secs(info.created_unix_secs);
        let writable = !info.read_only && !self.read_only;
        FileAttr {
            ino: INodeNo(ino),
            size: info.size_bytes,
            blocks: info.referenced_bytes.div_ceil(STAT_BLOCK_BYTES),
            atime: created,
            mtime: created,
            ctime: created,
            crtime: created,
            kind: FileType::RegularFile,
            perm: if writable {
                MODE_WRITABLE
            } else {
                MODE_READ_ONLY
            },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.block_size_bytes,
            flags: 0,
        }
    }

    fn attr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        if ino == INodeNo::ROOT {
            return Ok(self.root_attr());
        }
        if ArchivedFiles::owns(ino) {
            return self.archived()?.attr(ino, &self.root_attr());
        }
        let info = self
            .volume(ino)?
            .summary()
            .map_err(|e| errno_for(e.kind()))?;
        Ok(self.file_attr(ino.0, &info))
    }

    /// The errno for a request that would change the directory.
    fn refuse_change(&self) -> Errno {
        if self.read_only {
            Errno::EROFS
        } else {
            Errno::EPERM
        }
    }

    /// A writable volume, or EROFS.
    fn writable(&self, ino: INodeNo) -> Result<Volume, Errno> {
        let volume = self.volume(ino)?;
        if self.read_only || volume.is_read_only().map_err(|e| data_errno(e.kind()))? {
            return Err(Errno::EROFS);
        }
        Ok(volume)
    }

    fn do_read(&self, ino: INodeNo, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let volume = self.volume(ino)?;
        let size_bytes = volume.size_bytes().map_err(|e| data_errno(e.kind()))?;
        if offset >= size_bytes {
            return Ok(Vec::new());
        }
        let len = u64::from(size).min(size_bytes - offset);
        let mut buf = vec![0u8; len as usize];
        volume
            .read_at(&mut buf, offset)
            .map_err(|e| log_data_error("read", &e))?;
        Ok(buf)
    }

    fn do_write(&self, ino: INodeNo, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let volume = self.writable(ino)?;
        let size_bytes = volume.size_bytes().map_err(|e| data_errno(e.kind()))?;
        // A volume does not grow: like a block device, nothing fits past
        // its end, and a write across the end is cut short.
        if offset >= size_bytes {
            return Err(Errno::ENOSPC);
        }
        let len = (data.len() as u64).min(size_bytes - offset) as usize;
        volume
            .write_at(&data[..len], offset)
            .map_err(|e| log_data_error("write", &e))?;
        Ok(len as u32)
    }

    fn do_flush(&self, ino: INodeNo) -> Result<(), Errno> {
        if self.read_only || ArchivedFiles::owns(ino) {
            return Ok(());
        }
        self.volume(ino)?
            .flush()
            .map_err(|e| log_data_error("flush", &e))
    }

    fn do_fallocate(&self, ino: INodeNo, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        let volume = self.writable(ino)?;
        let size_bytes = volume.size_bytes().map_err(|e| data_errno(e.kind()))?;
        match fallocate_action(mode, offset, len, size_bytes) {
            Fallocate::Nothing => Ok(()),
            Fallocate::Unsupported => Err(Errno::EOPNOTSUPP),
            Fallocate::Discard { offset, len } => volume
                .discard(offset, len)
                .map_err(|e| log_data_error("discard", &e)),
        }
    }

    fn do_lseek(&self, ino: INodeNo, offset: i64, whence: i32) -> Result<u64, Errno> {
        let volume = self.volume(ino)?;
        let size_bytes = volume.size_bytes().map_err(|e| data_errno(e.kind()))?;
        let start = u64::try_from(offset).unwrap_or(0).min(size_bytes);
        let extents = volume
            .mapped_extents_in(start, size_bytes - start)
            .map_err(|e| log_data_error("seek", &e))?;
        seek_data_hole(whence, offset, size_bytes, &extents).map_err(|e| match e {
            SeekError::NoSuchOffset => Errno::ENXIO,
            SeekError::InvalidWhence => Errno::EINVAL,
        })
    }

    fn do_readdir(&self, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        let mut entries = vec![
            (INodeNo::ROOT, FileType::Directory, ".".to_string()),
            (INodeNo::ROOT, FileType::Directory, "..".to_string()),
        ];
        let mut volumes = self.pool.volume_summaries();
        volumes.sort_by(|a, b| a.name.cmp(&b.name));
        for info in volumes {
            // A volume removed since the listing is left out.
            if let Ok(ino) = self.ino_for(&info) {
                entries.push((INodeNo(ino), FileType::RegularFile, info.name));
            }
        }
        if self.shows_archive_dir() {
            let dir = (INodeNo(ARCHIVE_DIR_INO), FileType::Directory);
            entries.push((dir.0, dir.1, ARCHIVE_DIR_NAME.to_string()));
        }
        for (index, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, index as u64 + 1, kind, name) {
                break;
            }
        }
        Ok(())
    }
}

/// Logs an engine error on the data path (the caller only sees an errno)
/// and returns the errno.
fn log_data_error(what: &str, error: &grove_store::Error) -> Errno {
    let errno = data_errno(error.kind());
    if error.kind() != grove_store::ErrorKind::NotFound {
        tracing::warn!(%error, "FUSE {what} failed");
    }
    errno
}

impl fuser::Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // What the kernel cannot do is left at its default: each setting
        // only widens how much is in flight.
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        let _ = config.set_max_background(MAX_BACKGROUND_REQUESTS);
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        self.open_flags = open_flags(config);
        Ok(())
    }

    fn destroy(&mut self) {
        if !self.read_only {
            if let Err(error) = self.pool.flush() {
                tracing::error!(%error, "cannot flush the pool after unmount");
            }
        }
        self.on_end.run();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == ARCHIVE_DIR_INO {
            let found = self.archived().and_then(|archived| {
                archived.lookup(name.to_str().ok_or(Errno::ENOENT)?, &self.root_attr())
            });
            return match found {
                Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
                Err(errno) => reply.error(errno),
            };
        }
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        if name == ARCHIVE_DIR_NAME && self.shows_archive_dir() {
            let attr = self.attr(INodeNo(ARCHIVE_DIR_INO));
            return match attr {
                Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
                Err(errno) => reply.error(errno),
            };
        }
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        let found = self
            .pool
            .volume_summary(name)
            .map_err(|e| errno_for(e.kind()))
            .and_then(|info| Ok((self.ino_for(&info)?, info)));
        match found {
            Ok((ino, info)) => reply.entry(&TTL, &self.file_attr(ino, &info), Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        answer::attr(self.attr(ino), reply)
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let attr = match self.attr(ino) {
            Ok(attr) => attr,
            Err(errno) => return reply.error(errno),
        };
        // Sizes change with `grove resize`, never by truncation: an
        // O_TRUNC open must not wipe a disk. Owners and modes are the
        // pool's, not the file's. Times are accepted and not kept.
        if size.is_some_and(|size| size != attr.size)
            || mode.is_some()
            || uid.is_some()
            || gid.is_some()
        {
            return reply.error(if self.read_only {
                Errno::EROFS
            } else {
                Errno::EPERM
            });
        }
        reply.attr(&TTL, &attr)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ArchivedFiles::owns(ino) {
            let read_only = flags.acc_mode() == OpenAccMode::O_RDONLY;
            return match self.archived().and_then(|a| a.open(ino, read_only)) {
                Ok(fh) => reply.opened(FileHandle(fh), self.open_flags),
                Err(errno) => reply.error(errno),
            };
        }
        let opened = if flags.acc_mode() == OpenAccMode::O_RDONLY {
            self.attr(ino).map(|_| ())
        } else {
            self.writable(ino).map(|_| ()).map_err(|errno| {
                // A removed volume is not found, rather than an I/O error.
                if errno == Errno::EIO {
                    Errno::ENOENT
                } else {
                    errno
                }
            })
        };
        let claimed = opened.and_then(|()| self.volume(ino)).map(|volume| {
            let mut open_files = self.open_files.lock().unwrap_or_else(|e| e.into_inner());
            open_files.next_fh += 1;
            let fh = open_files.next_fh;
            open_files.claims.insert(fh, volume.claim());
            fh
        });
        match claimed {
            Ok(fh) => reply.opened(FileHandle(fh), self.open_flags),
            Err(errno) => reply.error(errno),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let (true, Ok(archived)) = (ArchivedFiles::owns(ino), self.archived()) {
            archived.release(fh.0);
            return reply.ok();
        }
        let mut open_files = self.open_files.lock().unwrap_or_else(|e| e.into_inner());
        open_files.claims.remove(&fh.0);
        reply.ok()
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = if ArchivedFiles::owns(ino) {
            self.archived().and_then(|a| a.read(fh.0, offset, size))
        } else {
            self.do_read(ino, offset, size)
        };
        answer::data(data, reply)
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.do_write(ino, offset, data) {
            Ok(written) => reply.written(written),
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Called on every close: a volume removed under an open file has
        // nothing left to flush, and close should not fail for it.
        match self.do_flush(ino) {
            Ok(()) => reply.ok(),
            Err(_) if self.volume(ino).is_ok_and(|v| v.summary().is_err()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer::empty(self.do_flush(ino), reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 == ARCHIVE_DIR_INO {
            return match self.archived() {
                Ok(archived) => {
                    archived.readdir(offset, &mut reply);
                    reply.ok()
                }
                Err(errno) => reply.error(errno),
            };
        }
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        match self.do_readdir(offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let info = match self.pool.info() {
            Ok(info) => info,
            Err(e) => return reply.error(errno_for(e.kind())),
        };
        let block_bytes = u64::from(info.block_size_bytes);
        let free_blocks = info.free_bytes / block_bytes;
        reply.statfs(
            (info.used_bytes + info.free_bytes) / block_bytes,
            free_blocks,
            free_blocks,
            info.volume_count,
            0,
            info.block_size_bytes,
            VOLUME_NAME_MAX_BYTES as u32,
            info.block_size_bytes,
        )
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        answer::empty(self.do_fallocate(ino, offset, length, mode), reply)
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let position = if ArchivedFiles::owns(ino) {
            self.archived().and_then(|a| a.lseek(fh.0, offset, whence))
        } else {
            self.do_lseek(ino, offset, whence)
        };
        match position {
            Ok(position) => reply.offset(position as i64),
            Err(errno) => reply.error(errno),
        }
    }

    // The directory's entries are the pool's volumes: they are made and
    // removed with `grove create`, `snapshot`, `clone` and `rm`.

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse_change())
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse_change())
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refuse_change())
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refuse_change())
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse_change())
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refuse_change())
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse_change())
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(self.refuse_change())
    }
}
