//! Objects in named folders, for layouts other than streams (the archive
//! tier's packs, indexes and catalogs): whole-object puts, create-only puts
//! (the one atomic write both backends give: the archive's commits are
//! built from them), ranged gets, listing and deletes. A folder is one
//! segment below the store (`DIR/FOLDER/NAME`, `PREFIX/FOLDER/NAME`);
//! folder and object names follow the stream names' rules.

use crate::backend::Backend;
use crate::error::{Error, ErrorKind, Result};
use crate::location::{self, Location};
use crate::names::check_name;
use crate::{file, s3};
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
                Arc::new(s3::S3Backend::from_env(url, bucket, prefix)?)
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

    /// Every object of `folder`, in any order (none if it has none).
    pub fn list(&self, folder: &str) -> Result<Vec<ObjectEntry>> {
        checked_key(folder, "x")?;
        Ok(self
            .backend
            .list(folder)?
            .into_iter()
            .map(|e| ObjectEntry {
                name: e.name,
                size_bytes: e.size_bytes,
            })
            .collect())
    }

    /// Stores `data` whole: readers see all of it or none.
    pub fn put(&self, folder: &str, name: &str, data: &[u8]) -> Result<()> {
        self.backend.put(&checked_key(folder, name)?, data, false)
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

    /// Removes the objects; missing ones are not an error.
    pub fn delete(&self, folder: &str, names: &[String]) -> Result<()> {
        let keys = names
            .iter()
            .map(|name| checked_key(folder, name))
            .collect::<Result<Vec<_>>>()?;
        self.backend.delete(&keys)
    }
}
