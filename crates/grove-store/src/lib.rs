//! grove-store: grove's storage engine.
//!
//! Layers, bottom up: a [`BlockDevice`] (one file, or later a RAID layout
//! over branches); the on-disk [`format`] (superblocks, radix nodes, volume
//! records, allocation-group nibble maps); the allocator; and radix-tree
//! volumes with recursive snapshots and dedicate-on-write (RSnap).
//!
//! ```no_run
//! use grove_store::{Pool, PoolOptions};
//! let pool = Pool::create("my-pool".as_ref(), &PoolOptions::default())?;
//! pool.create_volume("disk", 1 << 30)?;
//! let disk = pool.volume("disk")?;
//! disk.write_at(b"hello", 0)?;
//! disk.flush()?;
//! pool.snapshot("disk", "disk@monday")?;
//! # Ok::<(), grove_store::Error>(())
//! ```
#![forbid(unsafe_code)]

pub mod alloc;
pub mod check;
pub mod config;
pub mod device;
pub mod error;
pub mod format;
mod journal;
pub mod pool;
mod state;
pub mod testing;
pub mod types;

pub use check::CheckReport;
pub use device::{BlockDevice, FileDevice, MemDevice};
pub use error::{Error, ErrorKind, Result};
pub use format::record::VolumeKind;
pub use pool::{
    validate_volume_name, validate_volume_size, Pool, PoolInfo, PoolOptions, Volume, VolumeInfo,
};
pub use types::{BlockAddr, VolumeId};
