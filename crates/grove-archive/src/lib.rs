//! grove's archive tier, after Thresher's archive: snapshots kept for
//! months and years leave the pool for object storage (`file:///DIR` or
//! `s3://BUCKET/PREFIX`), stored so that expiring them deletes whole
//! objects.
//!
//! Each volume's archive is a folder of objects, `archive=VOLUME`, with its
//! catalogs in a folder of their own, `archive-catalog=VOLUME` (finding the
//! newest lists a few objects, not every pack):
//!
//! ```text
//! catalog-<generation>   the archive's state (snapshots, packs), one create-only object per commit
//! pack-<id>              block versions that share an owner: the snapshot expected to need them longest
//! index-<seq>-<gen>      one archived snapshot's map from blocks to pack slots
//! writer                 the claim of the one writer at work
//! ```
//!
//! Every snapshot is whole on its own: its index maps each block to a
//! version in some pack, whichever push stored it. A pack records the range
//! of snapshots that reference it; once no kept snapshot lies in that range
//! the pack is deleted whole. Versions go into packs owned by the snapshot
//! that first held them; when a pack's owner expires while kept snapshots
//! still need versions in it, expiry copies those versions (only those)
//! into a pack owned by the kept snapshot expected to live longest.
//! Objects are referenced only once whole and deleted only once no commit
//! references them.
//!
//! Modules, top-down: the commands (`push`, `expire`, `restore`, `check`,
//! `listing`), then `verdicts` (the policy's word), `reader`, `ledger`
//! (rules over a catalog), `lock`, `archive` (objects by name), `format`.

mod archive;
mod block_cache;
mod check;
mod error;
mod expire;
pub mod format;
#[doc(hidden)]
pub mod hooks;
mod ledger;
mod listing;
mod lock;
mod push;
mod rank;
mod reader;
mod restore;
mod sweep;
mod verdicts;
mod view;

pub use archive::Archive;
pub use check::{check, check_with_progress, CheckReport};
pub use error::{ArchiveError, Result};
pub use expire::{expire, ExpireReport};
pub use listing::{list, ArchiveListing, ListedSnapshot};
pub use lock::{claim, WriterLock};
pub use push::{is_newer, push, PushReport, PushRequest, DEFAULT_PACK_BYTES};
pub use rank::{release, set_rank};
pub use restore::{restore, RestoreReport};
pub use verdicts::facts as retention_facts;
pub use view::{archived_snapshots, ArchivedVolume};
