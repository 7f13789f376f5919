//! A pool's store laid out over branch directories (RAIF under the
//! engine): one `BlockDevice` the engine uses as it would one file.
//!
//! - [`device`]: `BranchDevice`, the whole device: its segments, growth by
//!   a branch and restripe, and the repairs over every segment.
//! - [`segment`]: one stretch of the device over some branches: the
//!   layout's reads and writes, staging and commits, degraded mode (a
//!   branch that fails an I/O is marked failed).
//! - [`shape`]: the segments and the restripe watermark, as each branch
//!   keeps them.
//! - [`journal`]: the stripe journal that closes the write hole.
//! - [`repair`]: rebuild of a replacement branch and scrub, per segment.
//! - [`members`]: the files in each branch directory, their identity
//!   (pool id, label, sequence) and grove.toml's `[branches]` table.

pub mod device;
pub mod journal;
pub mod members;
pub mod repair;
pub mod segment;
pub mod shape;

pub use device::{
    BranchDevice, BranchFiles, BranchSpace, BranchSpec, Health, MemberDevices, MemberSpec,
    MemberStatus, RestripeReport,
};
pub use members::{BranchPoolConfig, BranchPoolError, MemberConfig};
pub use repair::{RebuildReport, ScrubReport};
