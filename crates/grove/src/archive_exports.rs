//! Back-in-time reads: the pool's archived snapshots as read-only exports of
//! `grove serve` (and files of `grove mount`), read from the archive through
//! a bounded cache. A snapshot still in the pool is read from the pool: its
//! name resolves there first, so an archived one is offered only under a
//! name the pool does not have.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use grove_archive::{ArchiveError, ArchivedVolume, BlockCache};
use grove_store::{Error, ErrorKind, Pool};

/// The archived snapshots at one archive location, opened on demand.
#[derive(Debug)]
pub struct ArchivedSnapshots {
    url: String,
    /// The blocks read, shared by every archived snapshot open, so that
    /// `archive.cache_size` bounds them all together and a snapshot
    /// opened again (a new connection) finds what was read before.
    cache: Arc<BlockCache>,
    /// Snapshots open now, shared by every connection or file handle that
    /// reads one (one root and page cache each).
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
                cache: BlockCache::new(cache_bytes),
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
        let opened = ArchivedVolume::open_shared(&self.url, &owner, name, self.cache.clone())
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

/// `options` with the files of `archive/` for `grove mount` of `pool`.
pub fn with_archived_files(
    options: grove_fuse::MountOptions,
    pool: &Pool,
) -> grove_fuse::MountOptions {
    grove_fuse::MountOptions {
        archived: archived_files(pool, ArchivedSnapshots::for_pool(pool.dir())),
        ..options
    }
}

/// The files of a mount's `archive/`: the archived snapshots the pool no
/// longer has. The directory is there for the whole mount when the pool
/// uses an archive: grove.toml has an `[archive]` table or a volume's
/// policy has archive counts, or something is archived at the pool's
/// location when the mount starts (a push by hand). Otherwise a pool shows
/// only its volumes. An archive that cannot be listed shows no directory.
pub fn archived_files(
    pool: &Pool,
    archived: Option<Arc<ArchivedSnapshots>>,
) -> Option<Arc<dyn grove_fuse::ReadOnlyFiles>> {
    let archived = archived?;
    let uses_archive = match crate::archive_location::archive_configured(pool) {
        Ok(configured) => configured || !archived.list().is_empty(),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "archive/ is not shown: cannot read grove.toml");
            false
        }
    };
    uses_archive.then(|| {
        Arc::new(ArchivedOnlyFiles {
            pool: pool.clone(),
            archived,
        }) as Arc<dyn grove_fuse::ReadOnlyFiles>
    })
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
        self.0
            .mapped_extents_in(offset, len)
            .map_err(|e| engine_error(&e))
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
        self.0
            .mapped_extents_in(offset, len)
            .map_err(|e| engine_error(&e))
    }
}

/// `archive/` of a mount: the archived snapshots the pool no longer has,
/// as `grove serve` offers them. One the pool still has is read from the
/// pool, through its own file at the root.
struct ArchivedOnlyFiles {
    pool: Pool,
    archived: Arc<ArchivedSnapshots>,
}

/// grove-fuse asks for Debug; the pool's is its directory.
impl std::fmt::Debug for ArchivedOnlyFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchivedOnlyFiles")
            .field("pool", &self.pool.dir())
            .field("archived", &self.archived)
            .finish()
    }
}

impl grove_fuse::ReadOnlyFiles for ArchivedOnlyFiles {
    fn list(&self) -> Vec<String> {
        let in_pool: std::collections::BTreeSet<String> =
            self.pool.volume_names().into_iter().collect();
        self.archived
            .list()
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !in_pool.contains(name))
            .collect()
    }

    fn open(&self, name: &str) -> Option<grove_store::Result<Arc<dyn grove_fuse::ReadOnlyFile>>> {
        if self.pool.volume_summary(name).is_ok() {
            return None;
        }
        let opened = self.archived.open(name)?;
        Some(
            opened.map(|(volume, _)| Arc::new(Reader(volume)) as Arc<dyn grove_fuse::ReadOnlyFile>),
        )
    }
}
