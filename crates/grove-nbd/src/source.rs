//! What an export reads from: a volume of the pool, or a read-only source
//! the binary provides that is not one (an archived snapshot, read from
//! object storage). This crate knows such sources only by the traits here,
//! so it depends on the engine alone.

use std::sync::Arc;

use grove_store::{DiffExtent, Error, ErrorKind, Result, Volume, VolumeClaim};

/// A read-only block device that is not a volume of the pool.
pub trait ReadOnlySource: Send + Sync {
    fn size_bytes(&self) -> u64;
    /// The granularity of its extents, advertised as the preferred block size.
    fn block_bytes(&self) -> u32;
    /// Fills `buf` from byte `offset`. Damage must be an error (NBD_EIO to
    /// the client), never other data.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// The byte ranges within `offset..offset + len` that hold data; the
    /// rest reads as zeros and is reported as holes.
    fn mapped_extents_in(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>>;
}

/// Exports beside the pool's volumes: each read-only, each under a name of
/// its own. A pool volume of the same name wins over one of these.
pub trait ReadOnlySources: Send + Sync + std::fmt::Debug {
    /// Every name this provides, with a description, as NBD_OPT_LIST shows it.
    fn list(&self) -> Vec<(String, String)>;
    /// Opens `name`, with its description; None if this provides no such name.
    fn open(&self, name: &str) -> Option<Result<(Arc<dyn ReadOnlySource>, String)>>;
}

/// An export's data: a pool volume, or a read-only source.
#[derive(Clone)]
pub(crate) enum Source {
    Pool {
        volume: Volume,
        /// The connection's claim on the volume: removing it is refused
        /// while a client is connected, unless forced. Held, never read.
        _claim: Arc<VolumeClaim>,
    },
    ReadOnly(Arc<dyn ReadOnlySource>),
}

fn read_only_error() -> Error {
    Error::new(ErrorKind::ReadOnly, "this export is read-only")
}

impl Source {
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        match self {
            Source::Pool { volume, .. } => volume.read_at(buf, offset),
            Source::ReadOnly(source) => source.read_at(buf, offset),
        }
    }

    pub fn mapped_extents_in(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        match self {
            Source::Pool { volume, .. } => volume.mapped_extents_in(offset, len),
            Source::ReadOnly(source) => source.mapped_extents_in(offset, len),
        }
    }

    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        match self {
            Source::Pool { volume, .. } => volume.write_at(data, offset),
            Source::ReadOnly(_) => Err(read_only_error()),
        }
    }

    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        match self {
            Source::Pool { volume, .. } => volume.discard(offset, len),
            Source::ReadOnly(_) => Err(read_only_error()),
        }
    }

    /// Nothing to make durable in a read-only source.
    pub fn flush(&self) -> Result<()> {
        match self {
            Source::Pool { volume, .. } => volume.flush(),
            Source::ReadOnly(_) => Ok(()),
        }
    }

    /// Where the export differs from `base`; only pool volumes have bases.
    pub fn diff_in(&self, base: &str, offset: u64, len: u64) -> Result<Vec<DiffExtent>> {
        match self {
            Source::Pool { volume, .. } => volume.diff_in(base, offset, len),
            Source::ReadOnly(_) => Err(Error::new(
                ErrorKind::InvalidArgument,
                "this export is not a volume of the pool, so it has no bases",
            )),
        }
    }
}
