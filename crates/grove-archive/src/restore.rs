//! `grove archive restore`: makes an archived snapshot a snapshot in the
//! pool again, from the archive alone. The data goes into a temporary
//! volume, which becomes the snapshot and is then removed; a restore that
//! stops leaves only that temporary volume, which the next one replaces.

use crate::archive::Archive;
use crate::error::{ArchiveError, Result};
use crate::format::index::SnapshotRoot;
use crate::ledger;
use crate::reader::PackReader;
use grove_store::{Pool, RemoveOptions};

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    pub snapshot: String,
    pub name: String,
    pub size_bytes: u64,
    pub restored_bytes: u64,
    /// The hash recorded at push, for the caller to compare.
    pub recorded_hash: String,
}

/// Slots read in one ranged read at most.
const SLOTS_PER_READ: u32 = 256;

/// Restores archived snapshot `snapshot` as snapshot `name` of the pool.
pub fn restore(
    archive: &Archive,
    pool: &Pool,
    snapshot: &str,
    name: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RestoreReport> {
    grove_store::validate_volume_name(name)?;
    let catalog = archive
        .load()?
        .ok_or_else(|| not_archived(archive, snapshot))?;
    let archived =
        ledger::snapshot(&catalog, snapshot).ok_or_else(|| not_archived(archive, snapshot))?;
    if pool.volume_summary(name).is_ok() {
        return Err(ArchiveError::Invalid(format!(
            "volume {name:?} already exists in the pool"
        )));
    }
    let root = archive.root(&archived.index, archived.seq, catalog.block_bytes)?;
    let temporary = format!("{name}.restoring");
    if pool.volume_summary(&temporary).is_ok() {
        pool.remove(
            &temporary,
            RemoveOptions {
                force: true,
                ..RemoveOptions::default()
            },
        )?;
    }
    pool.create_volume(&temporary, archived.size_bytes)?;
    let restored = match write_runs(archive, pool, &temporary, &catalog, &root, progress) {
        Ok(restored) => restored,
        Err(e) => {
            // Best effort: the error says why; a volume left would be
            // replaced by the next restore anyway.
            let _ = pool.remove(
                &temporary,
                RemoveOptions {
                    force: true,
                    ..RemoveOptions::default()
                },
            );
            return Err(e);
        }
    };
    pool.snapshot(&temporary, name)?;
    pool.remove_volume(&temporary)?;
    Ok(RestoreReport {
        snapshot: snapshot.to_string(),
        name: name.to_string(),
        size_bytes: archived.size_bytes,
        restored_bytes: restored,
        recorded_hash: archived.hash.clone(),
    })
}

fn not_archived(archive: &Archive, snapshot: &str) -> ArchiveError {
    ArchiveError::Invalid(format!("{snapshot:?} is not in {}", archive.describe()))
}

fn write_runs(
    archive: &Archive,
    pool: &Pool,
    volume: &str,
    catalog: &crate::format::catalog::Catalog,
    root: &SnapshotRoot,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    let volume = pool.volume(volume)?;
    let reader = PackReader::default();
    let bs = u64::from(catalog.block_bytes);
    // Progress counts every block of the snapshot: the mapped total would
    // cost a pass over every page first.
    let total = root.blocks() * bs;
    let mut done = 0;
    for segment in 0..root.segments() {
        for run in reader.runs(archive, root, segment)?.iter() {
            let mut at = 0;
            while at < run.blocks {
                let count = SLOTS_PER_READ.min(run.blocks - at);
                let data =
                    reader.read_versions(archive, catalog, run.pack, run.first_slot + at, count)?;
                let offset = (run.first_block + u64::from(at)) * bs;
                let len = (data.len() as u64).min(root.size_bytes - offset) as usize;
                volume.write_at(&data[..len], offset)?;
                at += count;
                done += u64::from(count) * bs;
            }
        }
        let reached = root.segment_range(segment).end * bs;
        progress(reached, total);
        if reached * 2 >= total {
            crate::hooks::stall_if_set("restore-midway");
        }
    }
    volume.flush()?;
    Ok(done)
}
