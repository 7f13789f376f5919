//! The `file:///DIR` backend: the same objects as on S3, one file each in
//! DIR/STREAM/. A put writes a temporary file (a name starting with '.'),
//! fsyncs it, renames it into place (or hard-links it, for create-only) and
//! fsyncs the directory. A multipart upload is a temporary file
//! `.multipart-ID` that chunks are written into at their offsets; completing
//! renames it into place, aborting deletes it. A streamed put is a
//! temporary file written as the object comes and hard-linked into place.
//! Listing skips dot files, and `clean_stream` and `clean_interrupted`
//! remove the temporary files an interrupted writer left.

use crate::backend::{Backend, Entry, PageVisitor, Pager, StreamedPut};
use crate::error::{Error, ErrorKind, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) struct FileBackend {
    dir: PathBuf,
    /// Part of every temporary name, with the process id and the time.
    counter: AtomicU64,
}

/// Temporary names start with this; listing skips them.
const TEMP_MARK: char = '.';
const MULTIPART_TEMP_PREFIX: &str = ".multipart-";

fn io_error(what: &str, path: &Path, e: io::Error) -> Error {
    let kind = if e.kind() == io::ErrorKind::NotFound {
        ErrorKind::NotFound
    } else {
        ErrorKind::Io
    };
    Error::new(kind, format!("{what} {}: {e}", path.display()))
}

impl FileBackend {
    /// Opens (creating if missing) the directory.
    pub(crate) fn open(dir: PathBuf) -> Result<FileBackend> {
        fs::create_dir_all(&dir)
            .map_err(|e| io_error("cannot create the store directory", &dir, e))?;
        Ok(FileBackend {
            dir,
            counter: AtomicU64::new(0),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    fn unique(&self) -> String {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!(
            "{}-{nanos}-{}",
            std::process::id(),
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The stream directory of `key`, created if missing.
    fn stream_dir(&self, key: &str) -> Result<PathBuf> {
        let parent = self
            .path(key)
            .parent()
            .expect("a key has a stream")
            .to_path_buf();
        if !parent.is_dir() {
            fs::create_dir_all(&parent).map_err(|e| io_error("cannot create", &parent, e))?;
            sync_dir(&self.dir)?;
        }
        Ok(parent)
    }

    fn multipart_path(&self, key: &str, id: &str) -> PathBuf {
        let parent = self
            .path(key)
            .parent()
            .expect("a key has a stream")
            .to_path_buf();
        parent.join(format!("{MULTIPART_TEMP_PREFIX}{id}"))
    }
}

/// The objects in `dir` as the directory gives them (readdir(3): one
/// entry at a time, in the directory's order, never the whole directory in
/// memory), skipping temporary files and anything not a regular file. A
/// missing directory has none.
fn objects(dir: &Path) -> Result<impl Iterator<Item = Result<Entry>> + '_> {
    let read = match fs::read_dir(dir) {
        Ok(read) => Some(read),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("cannot list", dir, e)),
    };
    Ok(read.into_iter().flatten().filter_map(move |entry| {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => return Some(Err(io_error("cannot list", dir, e))),
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(TEMP_MARK) {
            return None;
        }
        match entry.metadata() {
            Ok(meta) if meta.is_file() => Some(Ok(Entry {
                name,
                size_bytes: meta.len(),
            })),
            Ok(_) => None,
            // Removed between readdir and stat: not an object any more.
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(io_error("cannot stat", &entry.path(), e))),
        }
    }))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("cannot sync directory", dir, e))
}

impl Backend for FileBackend {
    fn describe(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    fn list_pages(&self, stream: &str, page_limit: usize, visit: &mut PageVisitor) -> Result<()> {
        let mut pager = Pager::new(page_limit, visit);
        for entry in objects(&self.dir.join(stream))? {
            pager.push(entry?)?;
        }
        pager.finish()
    }

    fn list_streams(&self) -> Result<Vec<String>> {
        let read = fs::read_dir(&self.dir).map_err(|e| io_error("cannot list", &self.dir, e))?;
        let mut names = Vec::new();
        for entry in read {
            let entry = entry.map_err(|e| io_error("cannot list", &self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // One object is enough to count: a big stream is not listed whole.
            if !name.starts_with(TEMP_MARK)
                && entry.file_type().is_ok_and(|t| t.is_dir())
                && objects(&entry.path())?.next().transpose()?.is_some()
            {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn put(&self, key: &str, data: &[u8], create_only: bool) -> Result<()> {
        let dir = self.stream_dir(key)?;
        let temp = dir.join(format!(".put-{}", self.unique()));
        let written = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)?;
            file.write_all(data)?;
            file.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(io_error("cannot write", &temp, e));
        }
        place(&temp, &self.path(key), &dir, create_only)
    }

    fn put_streamed(&self, key: &str) -> Result<Box<dyn StreamedPut + '_>> {
        let dir = self.stream_dir(key)?;
        let temp = dir.join(format!(".put-{}", self.unique()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| io_error("cannot create", &temp, e))?;
        Ok(Box::new(FilePut {
            file: Some(BufWriter::with_capacity(STREAMED_BUFFER_BYTES, file)),
            temp,
            target: self.path(key),
            dir,
        }))
    }

    fn clean_interrupted(&self, folder: &str) -> Result<usize> {
        let dir = self.dir.join(folder);
        let Ok(read) = fs::read_dir(&dir) else {
            return Ok(0);
        };
        let mut removed = 0;
        for entry in read.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Multipart files of streams are removed by aborting their
            // recorded upload first; an unrecorded one (killed before its
            // marker was written) and temporary puts are removed here.
            if name.starts_with(TEMP_MARK) {
                fs::remove_file(entry.path())
                    .map_err(|e| io_error("cannot remove", &entry.path(), e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let path = self.path(key);
        let mut file = File::open(&path).map_err(|e| io_error("cannot open", &path, e))?;
        let mut out = Vec::new();
        file.seek(SeekFrom::Start(range.start))
            .and_then(|_| file.take(range.end - range.start).read_to_end(&mut out))
            .map_err(|e| io_error("cannot read", &path, e))?;
        Ok(out)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let path = self.path(key);
        fs::read(&path).map_err(|e| io_error("cannot read", &path, e))
    }

    fn delete(&self, keys: &[String]) -> Result<()> {
        let mut dirs = Vec::new();
        for key in keys {
            let path = self.path(key);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("cannot remove", &path, e)),
            }
            if let Some(parent) = path.parent() {
                if !dirs.contains(&parent.to_path_buf()) {
                    dirs.push(parent.to_path_buf());
                }
            }
        }
        for dir in dirs {
            sync_dir(&dir).or_else(|e| {
                if e.kind() == ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
            // An emptied stream directory goes too (it fails if not empty).
            if fs::remove_dir(&dir).is_ok() {
                sync_dir(&self.dir)?;
            }
        }
        Ok(())
    }

    fn multipart_begin(&self, key: &str) -> Result<String> {
        self.stream_dir(key)?;
        let id = self.unique();
        let path = self.multipart_path(key, &id);
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error("cannot create", &path, e))?;
        Ok(id)
    }

    fn multipart_put(
        &self,
        key: &str,
        id: &str,
        _first: usize,
        offset: u64,
        chunks: &[&[u8]],
    ) -> Result<Vec<String>> {
        let path = self.multipart_path(key, id);
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| io_error("no multipart upload", &path, e))?;
        let mut tags = Vec::new();
        let mut offset = offset;
        for chunk in chunks {
            // The tag is "offset:length".
            file.write_all_at(chunk, offset)
                .map_err(|e| io_error("cannot write", &path, e))?;
            tags.push(format!("{offset}:{}", chunk.len()));
            offset += chunk.len() as u64;
        }
        Ok(tags)
    }

    fn multipart_complete(&self, key: &str, id: &str, tags: Vec<String>) -> Result<()> {
        let path = self.multipart_path(key, id);
        let expected: u64 = tags
            .iter()
            .map(|t| {
                t.split_once(':')
                    .and_then(|(_, len)| len.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum();
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| io_error("no multipart upload", &path, e))?;
        file.set_len(expected)
            .and_then(|_| file.sync_all())
            .map_err(|e| io_error("cannot sync", &path, e))?;
        let target = self.path(key);
        fs::rename(&path, &target).map_err(|e| io_error("cannot place", &target, e))?;
        sync_dir(target.parent().expect("a key has a stream"))
    }

    fn multipart_abort(&self, key: &str, id: &str) -> Result<()> {
        let path = self.multipart_path(key, id);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(path.parent().expect("a key has a stream")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("cannot remove", &path, e)),
        }
    }

    fn clean_stream(&self, stream: &str) -> Result<()> {
        self.clean_interrupted(stream).map(|_| ())
    }
}

/// Moves the written, synced temporary file `temp` to `target` in `dir`:
/// a rename, or for `create_only` a hard link (link(2) fails if the target
/// exists: create-only, atomically); then syncs the directory.
fn place(temp: &Path, target: &Path, dir: &Path, create_only: bool) -> Result<()> {
    let placed = if create_only {
        let linked = fs::hard_link(temp, target);
        let _ = fs::remove_file(temp);
        linked
    } else {
        fs::rename(temp, target)
    };
    match placed {
        Ok(()) => sync_dir(dir),
        Err(e) => {
            let _ = fs::remove_file(temp);
            if e.kind() == io::ErrorKind::AlreadyExists {
                Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{} already exists", target.display()),
                ))
            } else {
                Err(io_error("cannot place", target, e))
            }
        }
    }
}

/// Bytes a streamed put gathers before each write(2): its callers append a
/// few KiB at a time.
const STREAMED_BUFFER_BYTES: usize = 256 << 10;

/// A streamed put: a temporary file written through a small buffer, synced
/// and hard-linked into place by `finish` (never replacing an object);
/// removed if dropped unfinished. A process killed meanwhile leaves the
/// temporary file, which listing skips and `clean_interrupted` removes.
struct FilePut {
    /// None once finished.
    file: Option<BufWriter<File>>,
    temp: PathBuf,
    target: PathBuf,
    dir: PathBuf,
}

impl StreamedPut for FilePut {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        let file = self.file.as_mut().expect("an unfinished put has its file");
        file.write_all(data)
            .map_err(|e| io_error("cannot write", &self.temp, e))
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let file = self.file.take().expect("a put is finished once");
        file.into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .map_err(|e| io_error("cannot write", &self.temp, e))?;
        place(&self.temp, &self.target, &self.dir, true)
    }
}

impl Drop for FilePut {
    fn drop(&mut self) {
        // Unfinished, or finishing failed: nothing of it stays.
        let _ = fs::remove_file(&self.temp);
    }
}
