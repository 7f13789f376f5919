//! `grove archive push`: copies one snapshot from the pool into the
//! archive as the blocks that differ from the newest one archived. New
//! versions go into packs owned by the pushed snapshot (the one snapshot
//! known to hold them; expiry moves what later ones still need). After
//! every pack a commit records it, so that a push that stops goes on
//! after the packs it stored. The index is written a segment at a time
//! (push_writer.rs): a segment nothing changed in keeps its page, unread.

use crate::archive::{index_object, Archive};
use crate::error::{ArchiveError, Result};
use crate::format::catalog::{ArchivedSnapshot, Catalog, PartialPush};
use crate::format::index::SnapshotRoot;
use crate::ledger;
use crate::lock::WriterLock;
use crate::push_plan::{plan, ranges_blocks};
use crate::push_writer::PushWriter;
use grove_store::{Pool, VolumeKind};

/// Pack objects are at most this big by default.
/// 16 MiB: a full push holds one pack, so this is most of its memory.
pub const DEFAULT_PACK_BYTES: u64 = 16 << 20;

/// What to push.
#[derive(Debug, Clone)]
pub struct PushRequest {
    /// The snapshot, in the pool.
    pub snapshot: String,
    /// Its `grove hash`, recorded for restore to check against.
    pub hash: String,
    /// The largest pack.
    pub pack_bytes: u64,
    pub now_unix_secs: u64,
    /// Test hook: after committing this many packs the push stops for good
    /// (sleeps), having said so on stderr, so that a test can kill it there.
    #[doc(hidden)]
    pub stall_after_packs: Option<u64>,
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PushReport {
    pub snapshot: String,
    pub seq: u64,
    /// The snapshot it was pushed as a change against.
    pub base: Option<String>,
    /// Bytes that differ from the base.
    pub changed_bytes: u64,
    /// Bytes of new versions stored (zeros are stored as holes).
    pub stored_bytes: u64,
    pub packs_written: u64,
    /// Packs an earlier, interrupted push of this snapshot had stored.
    pub packs_resumed: u64,
    /// What a stopped writer had left, removed before this push: objects
    /// no commit references, and the temporary files or multipart uploads
    /// of a pack it was streaming.
    #[serde(default)]
    pub swept: u64,
    pub index_bytes: u64,
}

/// Pushes `request.snapshot` of the archive's volume. `progress` hears
/// (bytes done, bytes to do) of the changed data.
pub fn push(
    archive: &Archive,
    claim: &WriterLock<'_>,
    pool: &Pool,
    request: &PushRequest,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PushReport> {
    let identity = pool.identity(&request.snapshot)?;
    check_pushable(archive, pool, request, &identity)?;
    let mut catalog = load_for_push(archive, pool)?;
    let swept = crate::sweep::sweep(archive, claim, &catalog)? as u64;
    check_order(archive, &catalog, request, &identity)?;
    let plan = plan(archive, pool, &catalog, &request.snapshot)?;
    let guid = hex::encode(identity.guid);
    let seq = start_partial(archive, &mut catalog, &guid)?;
    let mut writer = PushWriter::new(
        archive,
        &catalog,
        seq,
        request.pack_bytes,
        identity.size_bytes,
        plan.base_root.as_ref(),
    );
    writer.stall_after_packs = request.stall_after_packs;
    let resumed = writer.resume(&catalog)?;
    let volume = pool.volume(&request.snapshot)?;
    writer.store(&mut catalog, &volume, &plan, progress)?;
    let written = writer.finish(&mut catalog, &plan)?;
    let block_bytes = u64::from(catalog.block_bytes);
    let record = ArchivedSnapshot {
        seq,
        name: request.snapshot.clone(),
        guid,
        created_unix_secs: identity.created_unix_secs,
        created_generation: identity.created_generation,
        rank: pool.volume_summary(&request.snapshot)?.rank,
        size_bytes: identity.size_bytes,
        hash: request.hash.clone(),
        index: index_object(seq),
        index_bytes: 0,
        pushed_unix_secs: request.now_unix_secs,
        stored_bytes: written.stored_blocks * block_bytes,
        released: false,
    };
    let index_bytes = publish(archive, &mut catalog, record, &written.root)?;
    Ok(PushReport {
        snapshot: request.snapshot.clone(),
        seq,
        base: plan.base.map(|b| b.name),
        changed_bytes: ranges_blocks(&plan.changed) * block_bytes,
        stored_bytes: written.stored_blocks * block_bytes,
        packs_written: written.packs_written,
        packs_resumed: resumed,
        swept,
        index_bytes: index_bytes + written.page_bytes,
    })
}

/// The archive's catalog, or a new one with the pool's block size.
fn load_for_push(archive: &Archive, pool: &Pool) -> Result<Catalog> {
    let block_bytes = pool.block_size_bytes();
    let catalog = archive
        .load()?
        .unwrap_or_else(|| ledger::empty(archive.volume(), block_bytes));
    if catalog.block_bytes != block_bytes {
        return Err(ArchiveError::Invalid(format!(
            "{} has {}-byte blocks, the pool {block_bytes}-byte ones",
            archive.describe(),
            catalog.block_bytes
        )));
    }
    Ok(catalog)
}

/// Stores the pushed snapshot's index root and commits it: from here the
/// snapshot is archived. Returns the root's bytes.
fn publish(
    archive: &Archive,
    catalog: &mut Catalog,
    mut record: ArchivedSnapshot,
    root: &SnapshotRoot,
) -> Result<u64> {
    let page_objects = root.pages.iter().flatten().map(|p| p.object).collect();
    let index_bytes = archive.put_root(&record.index, root)?;
    record.index_bytes = index_bytes;
    ledger::note_references(catalog, record.seq, &root.pack_ids(), &page_objects);
    catalog.partial = None;
    catalog.totals.index_bytes += index_bytes;
    ledger::add_snapshot(catalog, record);
    archive.commit(catalog)?;
    Ok(index_bytes)
}

fn check_pushable(
    archive: &Archive,
    pool: &Pool,
    request: &PushRequest,
    identity: &grove_store::SnapshotIdentity,
) -> Result<()> {
    let summary = pool.volume_summary(&request.snapshot)?;
    if identity.kind != VolumeKind::Snapshot || summary.parent.as_deref() != Some(archive.volume())
    {
        return Err(ArchiveError::Invalid(format!(
            "{:?} is not a snapshot of volume {:?}; an archive holds one volume's snapshots",
            request.snapshot,
            archive.volume()
        )));
    }
    Ok(())
}

fn check_order(
    archive: &Archive,
    catalog: &Catalog,
    request: &PushRequest,
    identity: &grove_store::SnapshotIdentity,
) -> Result<()> {
    if ledger::snapshot(catalog, &request.snapshot).is_some() {
        return Err(ArchiveError::Invalid(format!(
            "{:?} is already in {}",
            request.snapshot,
            archive.describe()
        )));
    }
    if let Some(newest) = ledger::newest(catalog) {
        if !is_newer(identity, newest) {
            return Err(ArchiveError::Invalid(format!(
                "{:?} is older than {:?}, the newest snapshot in {}: snapshots are archived oldest first",
                request.snapshot,
                newest.name,
                archive.describe()
            )));
        }
    }
    Ok(())
}

/// Whether the pool's snapshot was taken after the archived one: by time,
/// and within one second by the pool's birth generation. Time first: a
/// pool rebuilt after a loss (restored from this archive) starts its
/// generations again, and its snapshots must still follow the archived.
pub fn is_newer(snapshot: &grove_store::SnapshotIdentity, archived: &ArchivedSnapshot) -> bool {
    (snapshot.created_unix_secs, snapshot.created_generation)
        > (archived.created_unix_secs, archived.created_generation)
}

/// The seq this push stores under: the partial push of this snapshot if one
/// stopped, or a new one (dropping another snapshot's partial push).
fn start_partial(archive: &Archive, catalog: &mut Catalog, guid: &str) -> Result<u64> {
    if let Some(partial) = &catalog.partial {
        if partial.guid == guid {
            return Ok(partial.seq);
        }
        let abandoned = catalog.partial.take().expect("checked");
        ledger::remove_packs(catalog, &abandoned.packs);
        ledger::remove_pages(catalog, &abandoned.pages);
        archive.commit(catalog)?;
        let names: Vec<String> = abandoned
            .packs
            .iter()
            .map(|&id| crate::archive::pack_object(id))
            .chain(
                abandoned
                    .pages
                    .iter()
                    .map(|&id| crate::archive::pages_object(id)),
            )
            .collect();
        archive.delete_objects(&names)?;
    }
    let seq = catalog.next_seq;
    catalog.next_seq += 1;
    catalog.partial = Some(PartialPush {
        seq,
        guid: guid.to_string(),
        packs: Vec::new(),
        next_block: 0,
        pages: Vec::new(),
        pages_done: Vec::new(),
        pack_counts: Vec::new(),
    });
    Ok(seq)
}
