//! Test hooks: a command stops for good at a named point, having said so on
//! stderr, so that a test can kill it there with SIGKILL (off unless a
//! point is set: the binary sets it from GROVE_TEST_ARCHIVE_STALL_AT); the
//! object store's connection lost after some requests; small index segments.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

static STALL_AT: Mutex<Option<String>> = Mutex::new(None);

/// The point "pack-midway:PACK:BYTES", parsed once: the pack (counted from
/// 0 in the order this process starts them) and its bytes written at which
/// to stall; u64::MAX when unset, so a slot costs two loads.
static STALL_PACK: AtomicU64 = AtomicU64::new(u64::MAX);
static STALL_PACK_BYTES: AtomicU64 = AtomicU64::new(u64::MAX);
/// Packs this process started.
static PACKS_STARTED: AtomicU64 = AtomicU64::new(0);

/// The points: "expire-before-commit" (copies stored, nothing committed),
/// "expire-before-delete" (committed, dead objects not yet deleted),
/// "restore-midway" (half of the data written into the pool),
/// "rank-before-commit" and "rank-after-commit" (a lazy rank or a release
/// about to commit its new catalog, and committed with the claim still
/// held), and "pack-midway:PACK:BYTES" (a pack being streamed to its
/// object, the PACK-th this process starts from 0, once BYTES of it are
/// written: on S3, parts of it are uploaded and the rest buffered).
#[doc(hidden)]
pub fn set_stall_point(point: Option<String>) {
    let in_pack = point
        .as_deref()
        .and_then(|p| p.strip_prefix("pack-midway:"))
        .and_then(|rest| rest.split_once(':'))
        .and_then(|(pack, bytes)| Some((pack.parse().ok()?, bytes.parse().ok()?)));
    let (pack, bytes) = in_pack.unwrap_or((u64::MAX, u64::MAX));
    STALL_PACK.store(pack, Ordering::Relaxed);
    STALL_PACK_BYTES.store(bytes, Ordering::Relaxed);
    *STALL_AT.lock().expect("hook lock") = point;
}

/// Numbers a pack this process starts, for "pack-midway".
pub(crate) fn pack_started() -> u64 {
    PACKS_STARTED.fetch_add(1, Ordering::Relaxed)
}

/// Stalls if pack `pack` (its number from `pack_started`) with `bytes`
/// written is where "pack-midway" points.
pub(crate) fn stall_in_pack(pack: u64, bytes: u64) {
    if STALL_PACK.load(Ordering::Relaxed) == pack
        && bytes >= STALL_PACK_BYTES.load(Ordering::Relaxed)
    {
        let point = STALL_AT.lock().expect("hook lock").clone();
        stall_if_set(point.as_deref().unwrap_or_default());
    }
}

pub(crate) fn stall_if_set(point: &str) {
    let set = STALL_AT.lock().expect("hook lock").as_deref() == Some(point);
    if set {
        eprintln!("grove-archive: stalled at {point} (test hook)");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

static SEGMENT_BLOCKS: AtomicU32 = AtomicU32::new(crate::format::index::SEGMENT_BLOCKS);

/// Test hook: the blocks per index segment of archives created from now on
/// in this process (each archive keeps the size it was made with), so that
/// tests of small volumes have many segments, some shared and some not.
#[doc(hidden)]
pub fn set_segment_blocks(blocks: u32) {
    assert!(blocks > 0, "a segment has blocks");
    SEGMENT_BLOCKS.store(blocks, Ordering::Relaxed);
}

pub(crate) fn segment_blocks() -> u32 {
    SEGMENT_BLOCKS.load(Ordering::Relaxed)
}

thread_local! {
    /// Requests this thread may still make before the connection "drops".
    static REQUESTS_LEFT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Test hook: on this thread, object-store requests after the next
/// `requests` fail, as if the connection were lost (None: never).
#[doc(hidden)]
pub fn fail_after_requests(requests: Option<u64>) {
    REQUESTS_LEFT.with(|left| left.set(requests));
}

/// Called before each object-store request.
pub(crate) fn before_request() -> crate::error::Result<()> {
    REQUESTS_LEFT.with(|left| match left.get() {
        None => Ok(()),
        Some(0) => Err(crate::error::ArchiveError::Invalid(
            "the connection to the object store was lost (test hook)".into(),
        )),
        Some(n) => {
            left.set(Some(n - 1));
            Ok(())
        }
    })
}
