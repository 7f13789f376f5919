//! grove-raif: RAIF's layout math over branch directories, with no FUSE
//! and no file system in it, so that the same code can later stripe a
//! pool's block device over branches.
//!
//! - [`level`]: RAIF0, 1, 4, 5, 6 and 10: data and parity units per stripe.
//! - [`layout`]: which branch and offset hold each unit of a file; the
//!   starting branch from the file name's hash.
//! - [`codec`]: XOR parity and Reed-Solomon (RAIF6), and recovery of lost units.
//! - [`raid`]: reads, writes, rebuilds and scrubs through a [`BranchIo`];
//!   degraded reads rebuild what a failed branch held.
//! - [`balance`]: per-branch EWMA latency, to spread replicated reads.
//! - [`config`]: the TOML configuration: branches, ordered rules, default rule.
//! - [`mem`]: branches in memory with failure injection, for tests.
//! - [`branch_pool`]: a pool's store over branch directories, as one
//!   `BlockDevice` for the engine: staging, the stripe journal, degraded
//!   mode, rebuild and scrub.

pub mod balance;
pub mod branch_pool;
pub mod codec;
pub mod config;
pub mod layout;
pub mod level;
pub mod mem;
pub mod raid;

pub use balance::Balancer;
pub use layout::{name_hash, start_branch, Layout, LayoutError, StripeMap};
pub use level::{Level, ALL_LEVELS};
pub use raid::{BranchIo, Mismatch, RaidError};
