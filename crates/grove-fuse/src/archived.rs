//! Read-only files beside the pool's volumes, in the directory
//! `MOUNTPOINT/archive/`: sources the binary provides that are not volumes
//! (archived snapshots, read from object storage). This crate knows them
//! only by the traits here. Their inodes lie in a range of their own, far
//! above any volume's; a file holds its source open only while it is open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use fuser::{Errno, FileAttr, FileType, INodeNo, ReplyDirectory};

use crate::errno::data_errno;
use crate::seek::{seek_data_hole, SeekError};

/// The directory's name at the mount's root. A pool volume of this name
/// wins, and the directory is then not shown.
pub const ARCHIVE_DIR_NAME: &str = "archive";
/// The directory's inode; its files count up from the next one.
pub(crate) const ARCHIVE_DIR_INO: u64 = 1 << 62;
const MODE_READ_ONLY: u16 = 0o444;
const MODE_DIR: u16 = 0o555;

/// A read-only file's data.
pub trait ReadOnlyFile: Send + Sync {
    fn size_bytes(&self) -> u64;
    /// Fills `buf` from byte `offset`. Damage must be an error (EIO),
    /// never other data.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> grove_store::Result<()>;
    /// The byte ranges within `offset..offset + len` that hold data (for
    /// SEEK_DATA and SEEK_HOLE); the rest reads as zeros.
    fn mapped_extents_in(&self, offset: u64, len: u64) -> grove_store::Result<Vec<(u64, u64)>>;
}

/// The files of `archive/`.
pub trait ReadOnlyFiles: Send + Sync + std::fmt::Debug {
    fn list(&self) -> Vec<String>;
    /// Opens `name`; None if there is no such file.
    fn open(&self, name: &str) -> Option<grove_store::Result<Arc<dyn ReadOnlyFile>>>;
}

#[derive(Default)]
struct State {
    /// Names seen, by inode, with the size they had, and inodes by name.
    names: HashMap<u64, (String, u64)>,
    inos: HashMap<String, u64>,
    /// Open files, by file handle.
    open: HashMap<u64, Arc<dyn ReadOnlyFile>>,
    next_fh: u64,
}

pub(crate) struct ArchivedFiles {
    files: Arc<dyn ReadOnlyFiles>,
    state: Mutex<State>,
}

impl ArchivedFiles {
    pub fn new(files: Arc<dyn ReadOnlyFiles>) -> ArchivedFiles {
        ArchivedFiles {
            files,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `ino` is the directory or one of its files.
    pub fn owns(ino: INodeNo) -> bool {
        ino.0 >= ARCHIVE_DIR_INO
    }

    /// The attributes of the directory or a file, from `like` (the root's).
    pub fn attr(&self, ino: INodeNo, like: &FileAttr) -> Result<FileAttr, Errno> {
        if ino.0 == ARCHIVE_DIR_INO {
            return Ok(FileAttr {
                ino,
                perm: MODE_DIR,
                ..*like
            });
        }
        let size = self.state().names.get(&ino.0).ok_or(Errno::ENOENT)?.1;
        Ok(file_attr(ino, size, like))
    }

    /// A file of the directory by name.
    pub fn lookup(&self, name: &str, like: &FileAttr) -> Result<FileAttr, Errno> {
        let file = self.open_named(name)?;
        let mut state = self.state();
        let ino = match state.inos.get(name) {
            Some(ino) => *ino,
            None => {
                let ino = ARCHIVE_DIR_INO + 1 + state.inos.len() as u64;
                state.inos.insert(name.to_string(), ino);
                ino
            }
        };
        state
            .names
            .insert(ino, (name.to_string(), file.size_bytes()));
        Ok(file_attr(INodeNo(ino), file.size_bytes(), like))
    }

    fn open_named(&self, name: &str) -> Result<Arc<dyn ReadOnlyFile>, Errno> {
        match self.files.open(name) {
            None => Err(Errno::ENOENT),
            Some(Err(e)) => {
                tracing::warn!(file = name, error = %e, "cannot open an archived file");
                Err(data_errno(e.kind()))
            }
            Some(Ok(file)) => Ok(file),
        }
    }

    /// Opens a file for reading; writing is refused (EROFS).
    pub fn open(&self, ino: INodeNo, read_only: bool) -> Result<u64, Errno> {
        if !read_only {
            return Err(Errno::EROFS);
        }
        let name = self
            .state()
            .names
            .get(&ino.0)
            .ok_or(Errno::ENOENT)?
            .0
            .clone();
        let file = self.open_named(&name)?;
        let mut state = self.state();
        state.next_fh += 1;
        let fh = state.next_fh;
        state.open.insert(fh, file);
        Ok(fh)
    }

    pub fn release(&self, fh: u64) {
        self.state().open.remove(&fh);
    }

    fn file(&self, fh: u64) -> Result<Arc<dyn ReadOnlyFile>, Errno> {
        self.state().open.get(&fh).cloned().ok_or(Errno::EBADF)
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let file = self.file(fh)?;
        let size_bytes = file.size_bytes();
        if offset >= size_bytes {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; u64::from(size).min(size_bytes - offset) as usize];
        file.read_at(&mut buf, offset).map_err(|e| {
            tracing::warn!(error = %e, "FUSE read of an archived file failed");
            data_errno(e.kind())
        })?;
        Ok(buf)
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<u64, Errno> {
        let file = self.file(fh)?;
        let size_bytes = file.size_bytes();
        let start = u64::try_from(offset).unwrap_or(0).min(size_bytes);
        let extents = file
            .mapped_extents_in(start, size_bytes - start)
            .map_err(|e| data_errno(e.kind()))?;
        seek_data_hole(whence, offset, size_bytes, &extents).map_err(|e| match e {
            SeekError::NoSuchOffset => Errno::ENXIO,
            SeekError::InvalidWhence => Errno::EINVAL,
        })
    }

    /// Lists the directory from entry `offset`.
    pub fn readdir(&self, offset: u64, reply: &mut ReplyDirectory) {
        let dir = INodeNo(ARCHIVE_DIR_INO);
        let mut entries = vec![
            (dir, FileType::Directory, ".".to_string()),
            (INodeNo::ROOT, FileType::Directory, "..".to_string()),
        ];
        let mut names = self.files.list();
        names.sort();
        for name in names {
            let ino = {
                let mut state = self.state();
                let next = ARCHIVE_DIR_INO + 1 + state.inos.len() as u64;
                *state.inos.entry(name.clone()).or_insert(next)
            };
            entries.push((INodeNo(ino), FileType::RegularFile, name));
        }
        for (index, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, index as u64 + 1, kind, name) {
                break;
            }
        }
    }
}

fn file_attr(ino: INodeNo, size: u64, like: &FileAttr) -> FileAttr {
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        kind: FileType::RegularFile,
        perm: MODE_READ_ONLY,
        nlink: 1,
        ..*like
    }
}
