//! Test hooks: a command stops for good at a named point, having said so on
//! stderr, so that a test can kill it there with SIGKILL (off unless a
//! point is set: the binary sets it from GROVE_TEST_ARCHIVE_STALL_AT); the
//! object store's connection lost after some requests; small index segments.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

static STALL_AT: Mutex<Option<String>> = Mutex::new(None);

/// The points: "expire-before-commit" (copies stored, nothing committed),
/// "expire-before-delete" (committed, dead objects not yet deleted),
/// "restore-midway" (half of the data written into the pool),
/// "rank-before-commit" and "rank-after-commit" (a lazy rank or a release
/// about to commit its new catalog, and committed with the claim still
/// held).
#[doc(hidden)]
pub fn set_stall_point(point: Option<String>) {
    *STALL_AT.lock().expect("hook lock") = point;
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
