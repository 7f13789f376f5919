//! grove-store: grove's storage engine.
//!
//! Layers, bottom up: a [`BlockDevice`] (one file, or later a RAID layout
//! over branches); the on-disk [`format`] (superblocks, radix nodes, volume
//! records, allocation-group nibble maps); the allocator; and radix-tree
//! volumes with recursive snapshots, dedicate-on-write (RSnap) and exact
//! sharing through reference counts (dm-thin).
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

mod accounting;
pub mod alloc;
mod cache;
mod capacity;
pub mod check;
mod checkpoint;
mod commit;
pub mod config;
pub mod device;
mod diff;
pub mod error;
pub mod format;
mod geometry;
mod holds;
mod io;
mod journal;
mod lost_data;
mod map_rebuild;
mod node_reads;
mod node_store;
pub mod pool;
mod punch;
mod reclaim;
mod records;
mod replication;
mod shares;
mod space;
pub mod space_levels;
pub mod space_settings;
mod state;
pub mod testing;
mod tree;
pub mod types;
pub mod units;
mod volume_table;
mod volumes;
mod write;

pub use cache::{CACHE_NODES_MIN, CACHE_SIZE_DEFAULT_BYTES};
pub use check::CheckReport;
pub use device::{BlockDevice, FileDevice, MemDevice};
pub use diff::DiffExtent;
pub use error::{Error, ErrorKind, Result};
pub use format::record::VolumeKind;
pub use pool::{
    guid_hex, validate_volume_name, validate_volume_size, CursorInfo, DiffFrom, DiffReport,
    ForegroundLoad, ForegroundRequest, HoldInfo, PartialReceive, Pool, PoolInfo, PoolOptions,
    RemovalSummary, RemoveOptions, Shrink, SnapshotIdentity, SnapshotRemoval, Volume, VolumeClaim,
    VolumeInfo, VolumeSummary, LIST_SLICE_VOLUMES, REMOVE_BATCH_SNAPSHOTS, SUMMARY_SLICE_VOLUMES,
    WALK_ROUNDS_MAX,
};
pub use punch::PunchStats;
pub use reclaim::RECLAIM_BATCH_ENTRIES;
pub use space_levels::{HostSpace, SpaceLevel, SpaceStatus};
pub use space_settings::{Amount, SpaceSettings};
pub use types::{BlockAddr, VolumeId};
pub use volumes::BOOKMARKS_PER_PARENT_MAX;
