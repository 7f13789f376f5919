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
//! catalog-<generation>   the archive's state (snapshots, packs, page objects, forward
//!                        tables), one create-only object per commit
//! pack-<id>              block versions that share an owner: the snapshot expected to
//!                        need them longest
//! index-<seq>            one archived snapshot's index root: a page per segment of blocks
//! pages-<id>             index pages (runs of blocks → version addresses), shared by the
//!                        snapshots whose segment did not change
//! forward-<pack>-<id>    where the used versions of deleted pack <pack> were copied
//! writer                 the claim of the one writer at work
//! ```
//!
//! Every snapshot is whole on its own: its index maps each block to the
//! address of a version (the pack a push first stored it in, and the slot).
//! A pack records the range of snapshots that reference it; once no kept
//! snapshot lies in that range the pack is deleted whole. Versions go into
//! packs owned by the snapshot that first held them; when a pack's owner
//! expires while kept snapshots still need versions in it, expiry copies
//! those versions (only those) into packs owned by the kept snapshot
//! expected to live longest, and the deleted pack's forward table says
//! where they went, so no index is rewritten. Index pages and forward
//! tables are read a page at a time through bounded caches: memory does not
//! grow with the number of snapshots or the volume's size. Objects are
//! referenced only once whole and deleted only once no commit references
//! them.
//!
//! Modules, top-down: the commands (`push` with `push_plan` and
//! `push_writer`, `expire` with `relocate`, `restore`, `check`, `listing`,
//! `rank`), then `view` (back-in-time reads), `verdicts` (the policy's
//! word), `reader` (pages, forwards and versions through `lru` caches),
//! `block_cache` (the blocks every open snapshot reads through),
//! `ledger` (rules over a catalog), `sweep`, `lock`, `archive` (objects by
//! name), `format`.

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
mod lru;
mod pack_writer;
mod push;
mod push_plan;
mod push_writer;
mod rank;
mod reader;
mod relocate;
mod restore;
mod slot_reads;
mod sweep;
mod verdicts;
mod view;

pub use archive::Archive;
pub use block_cache::BlockCache;
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
