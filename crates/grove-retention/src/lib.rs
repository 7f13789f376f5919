//! Retention by rank, as Thresher's rank trees do it: what a volume's
//! policy keeps, when a snapshot is due and which rank it gets, and why
//! each snapshot stays or goes. Pure logic over facts the caller reads from
//! a pool; the caller (the `grove` binary, its scheduler) takes and removes
//! snapshots. Time is Unix seconds, always UTC.
//!
//! - `level`: the ranks (frequent < hourly < daily < weekly < monthly < yearly).
//! - `calendar`: the period each level's snapshots fall in.
//! - `policy`: how many of each level a volume keeps; templates; grove.toml.
//! - `plan`: the rank tree: which snapshots a policy keeps and until when,
//!   which level is due, and the order space pressure prunes in.
//! - `oracle`: what a policy keeps read off the calendar, for tests.

pub mod calendar;
pub mod level;
pub mod oracle;
pub mod plan;
pub mod policy;

pub use level::Level;
pub use plan::{
    auto_snapshot_name, due_level, plan, space_order, Reason, SnapshotFacts, SpaceCandidate,
    Verdict,
};
pub use policy::{Policy, PolicyError, RetentionConfig};
