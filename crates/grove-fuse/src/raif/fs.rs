//! The FUSE glue of the RAIF file system: each request turned into an
//! operation of [`Core`], errors into errnos. Two virtual extended
//! attributes answer `grove raif status` (on the root) and `grove raif
//! explain` (on a file); they are computed, never stored.

use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLockReadGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use super::core::{is_reserved, lower_mode, Core, Node, OpenFile};
use super::lower;
use super::meta::{self, Meta};
use super::{plain, report};
use crate::answer;
use crate::kernel::{open_flags, OnEnd, MAX_WRITE_BYTES, STAT_BLOCK_BYTES, TTL};

/// The virtual attribute that holds the mount's status (on the root).
pub const XATTR_STATUS: &str = "user.grove.raif.status";
/// The virtual attribute that explains a file's layout.
pub const XATTR_EXPLAIN: &str = "user.grove.raif.explain";
/// statfs's block size, whatever the branches use.
const STATFS_BLOCK_BYTES: u64 = 4096;
/// Longest name the mount takes: what ext4, xfs, btrfs and tmpfs take (a
/// sidecar's name is the file's, see `meta`). A branch that takes less
/// answers ENAMETOOLONG itself.
const NAME_MAX_BYTES: u32 = 255;

pub struct RaifFs {
    pub core: Arc<Core>,
    /// How files open: see [`crate::kernel::open_flags`].
    open_flags: FopenFlags,
    on_end: OnEnd,
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn file_attr(ino: u64, m: &Meta, nlink: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: m.size_bytes,
        blocks: m.size_bytes.div_ceil(STAT_BLOCK_BYTES),
        atime: meta::from_ns(m.atime_ns),
        mtime: meta::from_ns(m.mtime_ns),
        ctime: meta::from_ns(m.ctime_ns),
        crtime: meta::from_ns(m.ctime_ns),
        kind: FileType::RegularFile,
        perm: (m.mode & 0o7777) as u16,
        nlink,
        uid: m.uid,
        gid: m.gid,
        rdev: 0,
        blksize: m.stripe_unit_bytes.min(u64::from(u32::MAX)) as u32,
        flags: 0,
    }
}

/// The attributes of a replicated entry; `nlink` is a directory's count as
/// the user sees it (see [`plain::dir_nlink`]).
fn lower_attr(ino: u64, m: &std::fs::Metadata, nlink: u32) -> FileAttr {
    let time = |s: i64, ns: i64| {
        SystemTime::UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
    };
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: time(m.ctime(), m.ctime_nsec()),
        kind: FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile),
        perm: (lower_mode(m) & 0o7777) as u16,
        nlink,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

fn to_ns(t: TimeOrNow) -> u64 {
    match t {
        TimeOrNow::Now => meta::now_ns(),
        TimeOrNow::SpecificTime(t) => meta::to_ns(t),
    }
}

impl RaifFs {
    pub fn new(core: Core, on_end: Box<dyn FnOnce() + Send>) -> RaifFs {
        RaifFs {
            core: Arc::new(core),
            open_flags: FopenFlags::FOPEN_DIRECT_IO,
            on_end: OnEnd::new(on_end),
        }
    }

    /// mkdir, symlink and mknod: `make` creates the entry at each branch's
    /// path (replicated on every branch), which then gets its owner (see
    /// [`RaifFs::owner`]).
    fn make_plain(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEntry,
        make: impl Fn(&Path, bool) -> io::Result<()>,
    ) {
        let _gate = self.gate();
        let made = self.child(parent, name).and_then(|rel| {
            if self.core.node(&rel).is_ok() {
                return Err(Errno::EEXIST);
            }
            let (uid, gid, setgid) = self.owner(req, &rel);
            self.core
                .on_all(|root| {
                    let path = root.join(&rel);
                    make(&path, setgid)?;
                    lower::lchown(&path, Some(uid), Some(gid))
                })
                .map_err(errno)?;
            Ok(rel)
        });
        match made {
            Ok(rel) => self.entry(&rel, reply),
            Err(e) => reply.error(e),
        }
    }

    /// The owner of a new entry `rel`: the caller, with the group of the
    /// parent directory when that has the set-group-ID bit (as POSIX and
    /// every Linux file system do), and whether a new directory inherits
    /// that bit.
    fn owner(&self, req: &Request, rel: &Path) -> (u32, u32, bool) {
        let parent = rel.parent().unwrap_or(Path::new(""));
        match self.core.lower_metadata(parent) {
            Ok(p) if p.mode() & 0o2000 != 0 => (req.uid(), p.gid(), true),
            _ => (req.uid(), req.gid(), false),
        }
    }

    /// Held by every request that changes something: see [`Core::gate`].
    fn gate(&self) -> RwLockReadGuard<'_, ()> {
        self.core.gate.read().unwrap_or_else(|e| e.into_inner())
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        if is_reserved(name) {
            return Err(Errno::EPERM);
        }
        if name.len() > NAME_MAX_BYTES as usize {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(self.core.path_of(parent.0).map_err(errno)?.join(name))
    }

    fn attr_of(&self, rel: &Path) -> Result<FileAttr, Errno> {
        let node = self.core.node(rel).map_err(errno)?;
        let ino = self.core.ino_of(rel, &node);
        match node {
            Node::File(m) => Ok(file_attr(ino, &m, m.nlink)),
            Node::Plain(m) if m.is_dir() => Ok(lower_attr(ino, &m, self.core.dir_nlink(rel, &m))),
            Node::Plain(m) => Ok(lower_attr(ino, &m, m.nlink() as u32)),
        }
    }

    /// The attributes of an inode: of an open file from memory (its link
    /// count 0 once its names are all gone; a linked file's names this
    /// mount knows may all be gone while another is left), else of its
    /// path.
    fn attr_of_ino(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        if let Some(file) = self.core.open_file(ino.0) {
            let m = file.meta.read().unwrap_or_else(|e| e.into_inner());
            let unlinked = file.unlinked.load(std::sync::atomic::Ordering::Relaxed);
            return Ok(file_attr(ino.0, &m, if unlinked { 0 } else { m.nlink }));
        }
        self.attr_of(&self.core.path_of(ino.0).map_err(errno)?)
    }

    fn entry(&self, rel: &Path, reply: ReplyEntry) {
        match self.attr_of(rel) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn file(&self, ino: INodeNo) -> Result<std::sync::Arc<OpenFile>, Errno> {
        self.core.open_file(ino.0).ok_or(Errno::EBADF)
    }

    /// `op` on the open file of `ino`: EBADF if it is not open, and `op`'s
    /// error as an errno.
    fn on_file<T>(
        &self,
        ino: INodeNo,
        op: impl FnOnce(&OpenFile) -> io::Result<T>,
    ) -> Result<T, Errno> {
        self.file(ino).and_then(|f| op(&f).map_err(errno))
    }

    fn do_setattr(
        &self,
        caller_uid: u32,
        ino: INodeNo,
        size: Option<u64>,
        attrs: Attrs,
    ) -> Result<FileAttr, Errno> {
        let Attrs {
            mode,
            uid,
            gid,
            atime,
            mtime,
        } = attrs;
        if let Some(file) = self.core.unlinked_open(ino.0) {
            // ftruncate, fchmod, futimens of a file with no name left.
            if let Some(size) = size {
                kill_set_id_bits(&file, caller_uid);
                self.core.truncate(&file, size).map_err(errno)?;
            }
            set_file_attrs(&file, &attrs);
            return self.attr_of_ino(ino);
        }
        let rel = self.core.path_of(ino.0).map_err(errno)?;
        match self.core.node(&rel).map_err(errno)? {
            Node::File(_) => {
                let file = self.core.open(ino.0, &rel).map_err(errno)?;
                let result = (|| {
                    if let Some(size) = size {
                        kill_set_id_bits(&file, caller_uid);
                        self.core.truncate(&file, size)?;
                    }
                    set_file_attrs(&file, &attrs);
                    self.core.persist(ino.0, &file, false)
                })();
                let _ = self.core.release(ino.0);
                result.map_err(errno)?;
            }
            Node::Plain(lower) => {
                let is_symlink = lower.file_type().is_symlink();
                // One time for every branch, so that they agree.
                let (atime, mtime) = (atime.map(to_ns), mtime.map(to_ns));
                self.core
                    .on_all(|root| {
                        let path = root.join(&rel);
                        // Owner first: a chown clears set-ID bits a chmod sets.
                        if uid.is_some() || gid.is_some() {
                            lower::lchown(&path, uid, gid)?;
                        }
                        if let (Some(mode), false) = (mode, is_symlink) {
                            plain::set_mode(&path, mode)?;
                        }
                        if atime.is_some() || mtime.is_some() {
                            plain::set_times(
                                &path,
                                atime.map(meta::from_ns),
                                mtime.map(meta::from_ns),
                            )?;
                        }
                        Ok(())
                    })
                    .map_err(errno)?;
            }
        }
        self.attr_of(&rel)
    }

    fn do_rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Errno::EINVAL);
        }
        let source = self.core.node(from).map_err(errno)?;
        let target = self.core.node(to).ok();
        if target.is_some() && flags.contains(RenameFlags::RENAME_NOREPLACE) {
            return Err(Errno::EEXIST);
        }
        match (&source, &target) {
            (Node::File(_), Some(Node::Plain(t))) if t.is_dir() => return Err(Errno::EISDIR),
            (Node::Plain(s), Some(Node::File(_))) if s.is_dir() => return Err(Errno::ENOTDIR),
            (Node::Plain(s), Some(Node::Plain(t))) if s.is_dir() && !t.is_dir() => {
                return Err(Errno::ENOTDIR)
            }
            (Node::Plain(s), Some(Node::Plain(t))) if !s.is_dir() && t.is_dir() => {
                return Err(Errno::EISDIR)
            }
            (Node::Plain(s), _) if s.is_dir() && to.starts_with(from) && to != from => {
                return Err(Errno::EINVAL)
            }
            _ => {}
        }
        if from == to {
            return Ok(());
        }
        if self.core.same_file(&source, target.as_ref()) {
            // Two names of one file: POSIX says rename does nothing.
            return Ok(());
        }
        if let Some(Node::File(t)) = &target {
            self.core.unlink_file(to, t).map_err(errno)?;
        }
        let ino = self.core.ino_of(from, &source);
        match source {
            Node::File(m) => {
                let current = self
                    .core
                    .open_file(ino)
                    .map(|f| f.meta.read().unwrap_or_else(|e| e.into_inner()).clone());
                self.core
                    .rename_file(from, to, &current.unwrap_or(m))
                    .map_err(errno)
            }
            Node::Plain(s) => {
                if let (true, Some(Node::Plain(t))) = (s.is_dir(), &target) {
                    // Replacing a directory: only an empty one, as POSIX says.
                    if t.is_dir() {
                        self.core.check_empty_dir(to).map_err(errno)?;
                    }
                }
                self.core
                    .on_all(|root| lower::rename(root.join(from), root.join(to)))
                    .map_err(errno)?;
                self.core
                    .inodes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .rename(from, to);
                Ok(())
            }
        }
    }

    fn xattr(&self, ino: INodeNo, name: &OsStr) -> Result<Vec<u8>, Errno> {
        let rel = self.core.path_of(ino.0).map_err(errno)?;
        match name.to_str() {
            Some(XATTR_STATUS) if ino.0 == super::core::ROOT_INO => {
                Ok(report::status(&self.core).into_bytes())
            }
            Some(XATTR_EXPLAIN) => report::explain(&self.core, &rel)
                .map(String::into_bytes)
                .map_err(errno),
            _ => Err(Errno::NO_XATTR),
        }
    }
}

/// Clears set-user-ID, and set-group-ID where group execute is set too,
/// when anyone but root writes or truncates a file, as Linux does for
/// ext4 (should_remove_suid): a program changed by another hand must not
/// go on running as its owner. (The kernel leaves it to a FUSE server.)
fn kill_set_id_bits(file: &OpenFile, caller_uid: u32) {
    const SET_UID: u32 = 0o4000;
    const SET_GID_AND_GROUP_EXEC: u32 = 0o2010;
    if caller_uid == 0 {
        return;
    }
    let mut m = file.meta.write().unwrap_or_else(|e| e.into_inner());
    let mut kill = m.mode & SET_UID;
    if m.mode & SET_GID_AND_GROUP_EXEC == SET_GID_AND_GROUP_EXEC {
        kill |= 0o2000;
    }
    if kill == 0 {
        return;
    }
    m.mode &= !kill;
    m.ctime_ns = meta::now_ns();
    file.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// What a setattr changes besides the size.
#[derive(Debug, Clone, Copy)]
struct Attrs {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

/// Applies a setattr's mode, owner and times to an open file's metadata.
fn set_file_attrs(file: &OpenFile, attrs: &Attrs) {
    let mut m = file.meta.write().unwrap_or_else(|e| e.into_inner());
    if let Some(mode) = attrs.mode {
        m.mode = (m.mode & !0o7777) | (mode & 0o7777);
    }
    m.uid = attrs.uid.unwrap_or(m.uid);
    m.gid = attrs.gid.unwrap_or(m.gid);
    if let Some(t) = attrs.atime {
        m.atime_ns = to_ns(t);
    }
    if let Some(t) = attrs.mtime {
        m.mtime_ns = to_ns(t);
    }
    m.ctime_ns = meta::now_ns();
    file.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn reply_xattr(data: Result<Vec<u8>, Errno>, size: u32, reply: ReplyXattr) {
    match data {
        Err(e) => reply.error(e),
        Ok(d) if size == 0 => reply.size(d.len() as u32),
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
    }
}

impl fuser::Filesystem for RaifFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        // Parallel direct writes would let two writes of one stripe race.
        self.open_flags = open_flags(config) & !FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        Ok(())
    }

    fn destroy(&mut self) {
        let open: Vec<(u64, std::sync::Arc<OpenFile>)> = self
            .core
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (ino, file) in open {
            if let Err(e) = self.core.fsync(ino, &file) {
                tracing::error!("cannot write metadata back at unmount: {e}");
            }
        }
        self.on_end.run();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name) {
            Ok(rel) => self.entry(&rel, reply),
            Err(Errno::EPERM) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        answer::attr(self.attr_of_ino(ino), reply)
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _gate = self.gate();
        let attrs = Attrs {
            mode,
            uid,
            gid,
            atime,
            mtime,
        };
        answer::attr(self.do_setattr(req.uid(), ino, size, attrs), reply)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let found = self.core.path_of(ino.0).and_then(|rel| {
            let mut last = io::Error::from_raw_os_error(2);
            for b in self.core.branches.healthy() {
                match lower::read_link(self.core.branches.root(b).join(&rel)) {
                    Ok(target) => return Ok(target),
                    Err(e) => last = e,
                }
            }
            Err(last)
        });
        match found {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.make_plain(req, parent, name, reply, |path, setgid| {
            lower::create_dir(path)?;
            let inherited = if setgid { 0o2000 } else { 0 };
            plain::set_mode(path, (mode & !umask & 0o7777) | inherited)
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.make_plain(req, parent, link_name, reply, |path, _| {
            lower::symlink(target, path)
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let perm = mode & !umask & 0o7777;
        let Some(kind) = plain::special_type(mode) else {
            // A regular file: a layout like any other, made by create.
            let _gate = self.gate();
            let made = self.child(parent, name).and_then(|rel| {
                let (uid, gid, _) = self.owner(req, &rel);
                self.core.create(&rel, perm, uid, gid).map_err(errno)?;
                Ok(rel)
            });
            return match made {
                Ok(rel) => self.entry(&rel, reply),
                Err(e) => reply.error(e),
            };
        };
        self.make_plain(req, parent, name, reply, |path, _| {
            plain::make_special(path, kind, perm, u64::from(rdev))
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _gate = self.gate();
        let done =
            self.child(parent, name)
                .and_then(|rel| match self.core.node(&rel).map_err(errno)? {
                    Node::File(m) => self.core.unlink_file(&rel, &m).map_err(errno),
                    Node::Plain(m) if m.is_dir() => Err(Errno::EISDIR),
                    Node::Plain(_) => self
                        .core
                        .remove_plain(&rel, |p| lower::remove_file(p))
                        .map_err(errno),
                });
        answer::empty(done, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _gate = self.gate();
        let done = self.child(parent, name).and_then(|rel| {
            match self.core.node(&rel).map_err(errno)? {
                Node::Plain(m) if m.is_dir() => {}
                _ => return Err(Errno::ENOTDIR),
            }
            self.core.remove_empty_dir(&rel).map_err(errno)
        });
        answer::empty(done, reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _gate = self.gate();
        let done = self
            .child(parent, name)
            .and_then(|from| Ok((from, self.child(newparent, newname)?)))
            .and_then(|(from, to)| self.do_rename(&from, &to, flags));
        answer::empty(done, reply)
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _gate = self.gate();
        let linked = self.child(newparent, newname).and_then(|to| {
            let from = self.core.path_of(ino.0).map_err(errno)?;
            let node = self.core.node(&from).map_err(errno)?;
            self.core.link(ino.0, &from, &node, &to).map_err(errno)?;
            Ok(to)
        });
        match linked {
            Ok(to) => self.entry(&to, reply),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // Only O_TRUNC changes anything; a rebuild gives files opened
        // meanwhile their new component when it ends.
        let _gate = (flags.0 & 0o1000 != 0).then(|| self.gate());
        let opened = self
            .core
            .path_of(ino.0)
            .and_then(|rel| self.core.open(ino.0, &rel));
        match opened {
            Ok(file) => {
                if flags.0 & 0o1000 != 0 {
                    // O_TRUNC
                    if let Err(e) = self.core.truncate(&file, 0) {
                        let _ = self.core.release(ino.0);
                        return reply.error(errno(e));
                    }
                }
                reply.opened(FileHandle(ino.0), self.open_flags)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _gate = self.gate();
        let made = self.child(parent, name).and_then(|rel| {
            let (uid, gid, _) = self.owner(req, &rel);
            self.core
                .create(&rel, mode & !umask, uid, gid)
                .map_err(errno)?;
            let ino = self.core.ino_for(&rel);
            let file = self.core.open(ino, &rel).map_err(errno)?;
            let m = file.meta.read().unwrap_or_else(|e| e.into_inner()).clone();
            Ok(file_attr(ino, &m, m.nlink))
        });
        match made {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(attr.ino.0),
                self.open_flags,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _gate = self.gate();
        answer::empty(self.core.release(ino.0).map_err(errno), reply)
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = self.on_file(ino, |f| self.core.read(f, offset, u64::from(size)));
        answer::data(data, reply)
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _gate = self.gate();
        let written = self.on_file(ino, |f| {
            kill_set_id_bits(f, req.uid());
            self.core.write(f, offset, data)
        });
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
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
        let _gate = self.gate();
        let done = self.on_file(ino, |f| self.core.persist(ino.0, f, false));
        match done {
            Ok(()) | Err(Errno::EBADF) => reply.ok(),
            Err(e) => reply.error(e),
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
        let _gate = self.gate();
        answer::empty(self.on_file(ino, |f| self.core.fsync(ino.0, f)), reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self
            .core
            .path_of(ino.0)
            .and_then(|rel| Ok((self.core.list(&rel)?, rel)));
        let (names, rel) = match listed {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        let mut entries = vec![
            (ino.0, FileType::Directory, ".".to_string()),
            (ino.0, FileType::Directory, "..".to_string()),
        ];
        for (name, is_file) in names {
            let child = rel.join(&name);
            let kind = if is_file {
                FileType::RegularFile
            } else {
                self.core
                    .lower_metadata(&child)
                    .ok()
                    .and_then(|m| FileType::from_std(m.file_type()))
                    .unwrap_or(FileType::Symlink)
            };
            entries.push((self.core.ino_listed(&child, is_file), kind, name));
        }
        for (index, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), index as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (mut total, mut free, mut files, mut ffree) = (0u64, 0u64, 0u64, 0u64);
        for b in self.core.branches.healthy() {
            if let Ok(s) = rustix::fs::statvfs(self.core.branches.root(b)) {
                total += s.f_blocks * s.f_frsize / STATFS_BLOCK_BYTES;
                free += s.f_bavail * s.f_frsize / STATFS_BLOCK_BYTES;
                files += s.f_files;
                ffree += s.f_ffree;
            }
        }
        let bs = STATFS_BLOCK_BYTES as u32;
        reply.statfs(total, free, free, files, ffree, bs, NAME_MAX_BYTES, bs)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(self.xattr(ino, name), size, reply)
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if ino.0 != super::core::ROOT_INO || name.to_str() != Some(super::job::XATTR_CONTROL) {
            return reply.error(Errno::ENOTSUP);
        }
        answer::empty(
            super::maintain::start(&self.core, value).map_err(errno),
            reply,
        )
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(Ok(Vec::new()), size, reply)
    }
}
