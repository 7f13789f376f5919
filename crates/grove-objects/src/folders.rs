//! Objects in named folders, for layouts other than streams (the archive
//! tier's packs, indexes and catalogs): whole-object puts, create-only puts
//! (the one atomic write both backends give: the archive's commits are
//! built from them), ranged gets, listing and deletes. A folder is one
//! segment below the store (`DIR/FOLDER/NAME`, `PREFIX/FOLDER/NAME`);
//! folder and object names follow the stream names' rules.

use crate::backend::{Backend, StreamedPut, LIST_PAGE_ENTRIES};
use crate::error::{Error, ErrorKind, Result};
use crate::location::{self, Location};
use crate::names::check_name;
use crate::{file, s3_client};
use std::ops::Range;
use std::sync::Arc;

/// One object of a folder, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEntry {
    pub name: String,
    pub size_bytes: u64,
}

/// A store of folders of objects: `s3://BUCKET/PREFIX` or `file:///DIR`,
/// configured as [`crate::StreamStore`] is. Methods may be called from
/// several threads at once.
#[derive(Clone)]
pub struct FolderStore {
    backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for FolderStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolderStore")
            .field("store", &self.describe())
            .finish()
    }
}

/// An object being stored a piece at a time
/// ([`FolderStore::put_streamed`]): readers see nothing of it until
/// [`ObjectWriter::finish`] places it whole. Dropped unfinished (or after
/// an error), what it stored is removed; a process killed meanwhile leaves
/// what [`FolderStore::clean_interrupted`] removes, never a whole object.
pub struct ObjectWriter<'a> {
    put: Box<dyn StreamedPut + 'a>,
}

impl std::fmt::Debug for ObjectWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectWriter")
    }
}

impl ObjectWriter<'_> {
    /// Appends `data` to the object.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.put.write(data)
    }

    /// Places the object whole under its name.
    pub fn finish(self) -> Result<()> {
        self.put.finish()
    }
}

fn checked_key(folder: &str, name: &str) -> Result<String> {
    for (what, value) in [("folder", folder), ("object", name)] {
        check_name(value).map_err(|why| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("bad {what} name {value:?}: {why}"),
            )
        })?;
    }
    Ok(format!("{folder}/{name}"))
}

impl FolderStore {
    /// Opens the store at `url`; refuses a malformed URL or missing
    /// credentials in one line and makes no request.
    pub fn open(url: &str) -> Result<FolderStore> {
        let backend: Arc<dyn Backend> = match location::parse(url)? {
            Location::S3 { bucket, prefix } => {
                Arc::new(s3_client::S3Backend::from_env(url, bucket, prefix)?)
            }
            Location::File { dir } => Arc::new(file::FileBackend::open(dir)?),
        };
        Ok(FolderStore { backend })
    }

    /// The store, for messages.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// The folders that hold at least one object, in any order.
    pub fn folders(&self) -> Result<Vec<String>> {
        self.backend.list_streams()
    }

    /// Every object of `folder`, in any order (none if it has none), at
    /// once: for folders known to be small. A folder that may be big is
    /// listed with [`FolderStore::list_pages`].
    pub fn list(&self, folder: &str) -> Result<Vec<ObjectEntry>> {
        let mut entries = Vec::new();
        self.list_pages(folder, LIST_PAGE_ENTRIES, &mut |page| {
            entries.extend_from_slice(page);
            Ok::<(), Error>(())
        })?;
        Ok(entries)
    }

    /// The objects of `folder` handed to `visit` in pages of at most
    /// `page_limit` entries, so that a listing holds one page whatever the
    /// folder's size. No order is promised across or within pages (S3
    /// lists in key order, `file://` in the directory's order). Objects
    /// created or removed while the listing runs may or may not be seen;
    /// every other object is seen exactly once. The first error `visit`
    /// returns (the caller's own error type) ends the listing and is
    /// returned. `visit` may use this store.
    pub fn list_pages<E: From<Error>>(
        &self,
        folder: &str,
        page_limit: usize,
        visit: &mut dyn FnMut(&[ObjectEntry]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        checked_key(folder, "x")?;
        if page_limit == 0 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("cannot list folder {folder:?} in pages of 0 objects"),
            )
            .into());
        }
        // The backend's entries become ObjectEntry one page at a time, in
        // one reused buffer. The backend knows only its own error: the
        // visitor's is kept here, and the backend is stopped with a stand-in.
        let mut converted = Vec::new();
        let mut stopped_by = None;
        let listed = self.backend.list_pages(folder, page_limit, &mut |page| {
            converted.clear();
            converted.extend(page.iter().map(|e| ObjectEntry {
                name: e.name.clone(),
                size_bytes: e.size_bytes,
            }));
            visit(&converted).map_err(|e| {
                stopped_by = Some(e);
                Error::new(ErrorKind::Io, "listing stopped by its caller")
            })
        });
        match (stopped_by, listed) {
            (Some(caller), _) => Err(caller),
            (None, listed) => Ok(listed?),
        }
    }

    /// Stores `data` whole: readers see all of it or none.
    pub fn put(&self, folder: &str, name: &str, data: &[u8]) -> Result<()> {
        self.backend.put(&checked_key(folder, name)?, data, false)
    }

    /// `put` of data the caller gives up, so that a big object is held
    /// once on its way to the store.
    pub fn put_owned(&self, folder: &str, name: &str, data: Vec<u8>) -> Result<()> {
        self.backend
            .put_owned(&checked_key(folder, name)?, data, false)
    }

    /// Starts storing an object a piece at a time ([`ObjectWriter`]), in
    /// bounded memory whatever its size: on `file://` a temporary file
    /// hard-linked into place by [`ObjectWriter::finish`] (never replacing
    /// an object: [`ErrorKind::AlreadyExists`]); on S3 one create-only PUT
    /// for an object of at most 5 MiB, otherwise a multipart upload of
    /// 5 MiB parts sent one at a time (its completion replaces an object
    /// of the same name: S3 gateways such as radosgw 16 cannot make it
    /// conditional, so callers give streamed objects fresh names).
    pub fn put_streamed(&self, folder: &str, name: &str) -> Result<ObjectWriter<'_>> {
        Ok(ObjectWriter {
            put: self.backend.put_streamed(&checked_key(folder, name)?)?,
        })
    }

    /// Removes what streamed puts into `folder` left when their process
    /// was killed: temporary files, and the multipart uploads they recorded
    /// (aborted); returns how many. Only while no streamed put into
    /// `folder` is in progress (the caller's own exclusion: the archive's
    /// writer claim).
    pub fn clean_interrupted(&self, folder: &str) -> Result<usize> {
        checked_key(folder, "x")?;
        self.backend.clean_interrupted(folder)
    }

    /// Stores `data` only if nothing is stored under the name, atomically;
    /// otherwise fails with [`ErrorKind::AlreadyExists`].
    pub fn create(&self, folder: &str, name: &str, data: &[u8]) -> Result<()> {
        self.backend.put(&checked_key(folder, name)?, data, true)
    }

    /// The whole object.
    pub fn get(&self, folder: &str, name: &str) -> Result<Vec<u8>> {
        self.backend.get(&checked_key(folder, name)?)
    }

    /// Bytes `range` of the object (shorter if the object is).
    pub fn get_range(&self, folder: &str, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        self.backend.get_range(&checked_key(folder, name)?, range)
    }

    /// Each of `ranges` of the object, as [`FolderStore::get_range`] gives
    /// it, in order: on S3 a few requests in flight at a time. Every result
    /// is held until all are in, so the caller bounds the bytes asked for.
    pub fn get_ranges(
        &self,
        folder: &str,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        self.backend.get_ranges(&checked_key(folder, name)?, ranges)
    }

    /// Removes the objects; missing ones are not an error.
    pub fn delete(&self, folder: &str, names: &[String]) -> Result<()> {
        let keys = names
            .iter()
            .map(|name| checked_key(folder, name))
            .collect::<Result<Vec<_>>>()?;
        self.backend.delete(&keys)
    }
}
