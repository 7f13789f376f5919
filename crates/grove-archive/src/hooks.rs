//! Test hooks: a command stops for good at a named point, having said so on
//! stderr, so that a test can kill it there with SIGKILL. Off unless a
//! point is set (the binary sets it from GROVE_TEST_ARCHIVE_STALL_AT).

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
