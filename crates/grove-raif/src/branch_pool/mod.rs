//! A pool's store laid out over branch directories (RAIF under the
//! engine): one `BlockDevice` the engine uses as it would one file.
//!
//! - [`device`]: `BranchDevice`, the layout's reads and writes, staging and
//!   commits, degraded mode (a branch that fails an I/O is marked failed).
//! - [`journal`]: the stripe journal that closes the write hole.
//! - [`repair`]: rebuild of a replacement branch and scrub, online.
//! - [`members`]: the files in each branch directory, their identity
//!   (pool id, label, sequence) and grove.toml's `[branches]` table.

pub mod device;
pub mod journal;
pub mod members;
pub mod repair;

pub use device::{BranchDevice, Health, MemberDevices, MemberSpec, MemberStatus};
pub use members::{BranchPoolConfig, BranchPoolError, MemberConfig};
pub use repair::{RebuildReport, ScrubReport};
