//! Lazy ranks (Thresher's lazy discrimination): an archived snapshot's
//! rank changed after it was pushed, and a snapshot pushed by hand
//! released. Nothing is copied here: the next expiry keeps what the new
//! rank keeps, and copies only the versions that must now outlive the
//! packs they are in, counting them.

use crate::archive::Archive;
use crate::error::{ArchiveError, Result};
use crate::lock::WriterLock;

/// Ranks archived snapshot `snapshot` at `rank` (0: unranked, kept until
/// released). Returns the rank it had.
pub fn set_rank(
    archive: &Archive,
    _claim: &WriterLock<'_>,
    snapshot: &str,
    rank: u8,
) -> Result<u8> {
    change(archive, snapshot, |s| {
        let before = s.rank;
        s.rank = rank;
        s.released = false;
        before
    })
}

/// Lets the next expiry drop archived snapshot `snapshot`, pushed by hand
/// and so kept until released. A ranked snapshot is the policy's to keep.
pub fn release(archive: &Archive, _claim: &WriterLock<'_>, snapshot: &str) -> Result<()> {
    let mut ranked = false;
    change(archive, snapshot, |s| {
        ranked = s.rank != 0;
        if !ranked {
            s.released = true;
        }
    })?;
    if ranked {
        return Err(ArchiveError::Invalid(format!(
            "{snapshot:?} is ranked: its archive policy decides when it goes (rank it none first to release it)"
        )));
    }
    Ok(())
}

fn change<T>(
    archive: &Archive,
    snapshot: &str,
    edit: impl FnOnce(&mut crate::format::catalog::ArchivedSnapshot) -> T,
) -> Result<T> {
    let not_there =
        || ArchiveError::Invalid(format!("{snapshot:?} is not in {}", archive.describe()));
    let mut catalog = archive.load()?.ok_or_else(not_there)?;
    let record = catalog
        .snapshots
        .iter_mut()
        .find(|s| s.name == snapshot)
        .ok_or_else(not_there)?;
    let out = edit(record);
    crate::hooks::stall_if_set("rank-before-commit");
    archive.commit(&mut catalog)?;
    crate::hooks::stall_if_set("rank-after-commit");
    Ok(out)
}
