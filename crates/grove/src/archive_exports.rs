//! Back-in-time reads: the pool's archived snapshots as read-only exports of
//! `grove serve` (and files of `grove mount`), read from the archive through
//! a bounded cache. A snapshot still in the pool is read from the pool: its
//! name resolves there first, so an archived one is offered only under a
//! name the pool does not have.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use grove_archive::{ArchiveError, ArchivedVolume};
use grove_store::{Error, ErrorKind};

/// The archived snapshots at one archive location, opened on demand.
#[derive(Debug)]
pub struct ArchivedSnapshots {
    url: String,
    cache_bytes: u64,
    /// Snapshots open now, shared by every connection or file handle that
    /// reads one, so the cache bound holds per snapshot, not per reader.
    open: Mutex<BTreeMap<String, Weak<ArchivedVolume>>>,
}

impl ArchivedSnapshots {
    /// The archived snapshots of the pool at `dir`, or None (after one
    /// warning) when its archive cannot be listed: the pool is then served
    /// alone.
    pub fn for_pool(dir: &Path) -> Option<Arc<ArchivedSnapshots>> {
        let found = crate::archive_location::location(dir, None).and_then(|url| {
            let cache_bytes = crate::archive_location::read_cache_bytes(dir)?;
            grove_archive::archived_snapshots(&url)?;
            Ok((url, cache_bytes))
        });
        match found {
            Ok((url, cache_bytes)) => Some(Arc::new(ArchivedSnapshots {
                url,
                cache_bytes,
                open: Mutex::new(BTreeMap::new()),
            })),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "archived snapshots are not offered: cannot list the archive");
                None
            }
        }
    }

    /// These snapshots as exports of `grove serve`.
    pub fn as_exports(self: Arc<Self>) -> Arc<dyn grove_nbd::ReadOnlySources> {
        self
    }

    /// These snapshots as the files of a mount's `archive/`.
    pub fn as_files(self: Arc<Self>) -> Arc<dyn grove_fuse::ReadOnlyFiles> {
        self
    }

    /// Every archived snapshot as (name, description); the first of a name
    /// wins, should two volumes' archives share one.
    pub fn list(&self) -> Vec<(String, String)> {
        let snapshots = match grove_archive::archived_snapshots(&self.url) {
            Ok(snapshots) => snapshots,
            Err(e) => {
                tracing::warn!(archive = self.url, error = %e, "cannot list the archive");
                return Vec::new();
            }
        };
        let mut seen = BTreeMap::new();
        for (volume, snapshot) in snapshots {
            seen.entry(snapshot).or_insert(volume);
        }
        seen.into_iter()
            .map(|(snapshot, volume)| (snapshot, describe(&volume)))
            .collect()
    }

    /// Opens archived snapshot `name` (shared with its other readers), with
    /// its description; None if the archive has no such snapshot.
    pub fn open(&self, name: &str) -> Option<grove_store::Result<(Arc<ArchivedVolume>, String)>> {
        let owner = self.volume_of(name)?;
        let description = describe(&owner);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, weak| weak.strong_count() > 0);
        if let Some(shared) = open.get(name).and_then(Weak::upgrade) {
            return Some(Ok((shared, description)));
        }
        let opened = ArchivedVolume::open(&self.url, &owner, name, self.cache_bytes)
            .map(Arc::new)
            .map_err(|e| engine_error(&e));
        if let Ok(shared) = &opened {
            open.insert(name.to_string(), Arc::downgrade(shared));
        }
        Some(opened.map(|shared| (shared, description)))
    }

    /// Whether the archive holds snapshot `name`.
    pub fn holds(&self, name: &str) -> bool {
        self.volume_of(name).is_some()
    }

    /// The volume whose archive holds snapshot `name` (the first, as listed).
    fn volume_of(&self, name: &str) -> Option<String> {
        grove_archive::archived_snapshots(&self.url)
            .ok()?
            .into_iter()
            .find(|(_, snapshot)| snapshot == name)
            .map(|(volume, _)| volume)
    }
}

/// `options` with the pool's archived snapshots as the files of `archive/`,
/// if anything is archived when the pool is mounted: a pool that archives
/// nothing shows no empty directory among its volumes.
pub fn with_archived_files(
    options: grove_fuse::MountOptions,
    dir: &Path,
) -> grove_fuse::MountOptions {
    let archived = ArchivedSnapshots::for_pool(dir).filter(|a| !a.list().is_empty());
    grove_fuse::MountOptions {
        archived: archived.map(ArchivedSnapshots::as_files),
        ..options
    }
}

fn describe(volume: &str) -> String {
    format!("grove archived snapshot of {volume}, read-only")
}

/// An archive error as the engine's, whose kinds the servers map to what
/// clients see: damage and a failing store are I/O errors (EIO), never data.
pub fn engine_error(error: &ArchiveError) -> Error {
    let kind = match error {
        ArchiveError::Damaged(_) => ErrorKind::Corrupt,
        ArchiveError::Store(_) => ErrorKind::Io,
        ArchiveError::Pool(e) => e.kind(),
        ArchiveError::Busy(_) => ErrorKind::Busy,
        ArchiveError::Invalid(_) => ErrorKind::InvalidArgument,
    };
    Error::new(kind, error.to_string())
}

/// An archived snapshot as an NBD export or a mounted file.
struct Reader(Arc<ArchivedVolume>);

impl Reader {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> grove_store::Result<()> {
        self.0.read_at(buf, offset).map_err(|e| engine_error(&e))
    }
}

impl grove_nbd::ReadOnlySource for Reader {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn block_bytes(&self) -> u32 {
        self.0.block_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> grove_store::Result<()> {
        Reader::read_at(self, buf, offset)
    }

    fn mapped_extents_in(&self, offset: u64, len: u64) -> grove_store::Result<Vec<(u64, u64)>> {
        Ok(self.0.mapped_extents_in(offset, len))
    }
}

impl grove_nbd::ReadOnlySources for ArchivedSnapshots {
    fn list(&self) -> Vec<(String, String)> {
        ArchivedSnapshots::list(self)
    }

    fn open(
        &self,
        name: &str,
    ) -> Option<grove_store::Result<(Arc<dyn grove_nbd::ReadOnlySource>, String)>> {
        let opened = ArchivedSnapshots::open(self, name)?;
        Some(opened.map(|(volume, description)| {
            (
                Arc::new(Reader(volume)) as Arc<dyn grove_nbd::ReadOnlySource>,
                description,
            )
        }))
    }
}

impl grove_fuse::ReadOnlyFile for Reader {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> grove_store::Result<()> {
        Reader::read_at(self, buf, offset)
    }

    fn mapped_extents_in(&self, offset: u64, len: u64) -> grove_store::Result<Vec<(u64, u64)>> {
        Ok(self.0.mapped_extents_in(offset, len))
    }
}

/// `archive/` of a mount lists every archived snapshot: the pool's own
/// files sit beside it, so no name needs to give way.
impl grove_fuse::ReadOnlyFiles for ArchivedSnapshots {
    fn list(&self) -> Vec<String> {
        ArchivedSnapshots::list(self)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    fn open(&self, name: &str) -> Option<grove_store::Result<Arc<dyn grove_fuse::ReadOnlyFile>>> {
        let opened = ArchivedSnapshots::open(self, name)?;
        Some(
            opened.map(|(volume, _)| Arc::new(Reader(volume)) as Arc<dyn grove_fuse::ReadOnlyFile>),
        )
    }
}
