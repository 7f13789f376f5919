//! A maintenance job as the mount's users see it: the request that starts
//! one (a JSON value set on the root's control attribute) and the progress
//! and outcome the status attribute shows. The core keeps the current one;
//! `maintain.rs` runs it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The virtual attribute (on the root) that starts a job.
pub const XATTR_CONTROL: &str = "user.grove.raif.control";
/// Problem lines a job keeps: the status attribute must stay below the
/// kernel's 64 KiB limit for an extended attribute value.
pub const JOB_LINES_MAX: usize = 200;

/// What `grove raif rebuild|scrub` asks for.
#[derive(Debug, Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Rebuild {
        id: String,
        branch: String,
        to: PathBuf,
        /// Replace a branch that is not failed (it loses its redundancy
        /// until the rebuild ends).
        #[serde(default)]
        force: bool,
    },
    Scrub {
        id: String,
        repair: bool,
    },
}

/// A job's progress and outcome, as the status attribute shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub op: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished: bool,
    pub files: u64,
    /// Problems found: mismatches, stripes or files that could not be read.
    pub problems: u64,
    /// The first [`JOB_LINES_MAX`] problems, one line each.
    pub lines: Vec<String>,
    /// Why the job as a whole failed, if it did.
    pub error: Option<String>,
}
