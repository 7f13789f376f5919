//! `grove archive push`: copies one snapshot from the pool into the
//! archive as the blocks that differ from the newest one archived. New
//! versions go into packs owned by the pushed snapshot (the one snapshot
//! known to hold them; expiry moves what later ones still need). After
//! every pack a commit records it, so that a push that stops goes on
//! after the packs it stored.

use crate::archive::{index_object, Archive};
use crate::error::{ArchiveError, Result};
use crate::format::catalog::{ArchivedSnapshot, Catalog, PackRecord, PartialPush};
use crate::format::index::{apply_changes, coalesce, Run, SnapshotIndex};
use crate::format::pack;
use crate::ledger;
use crate::lock::WriterLock;
use grove_store::{DiffFrom, Pool, Volume, VolumeKind};
use std::collections::BTreeSet;

/// Pack objects are at most this big by default.
pub const DEFAULT_PACK_BYTES: u64 = 32 << 20;

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
    pub index_bytes: u64,
}

/// Where the push starts from: the base's index and the blocks that differ.
struct Plan {
    base: Option<ArchivedSnapshot>,
    base_runs: Vec<Run>,
    /// Sorted, disjoint block ranges that differ from the base.
    changed: Vec<(u64, u64)>,
    /// Of those, the ranges the snapshot maps data in.
    with_data: Vec<(u64, u64)>,
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
    crate::sweep::sweep(archive, claim, &catalog)?;
    check_order(archive, &catalog, request, &identity)?;
    let plan = plan(archive, pool, &catalog, &request.snapshot)?;
    let guid = hex::encode(identity.guid);
    let seq = start_partial(archive, &mut catalog, &guid)?;
    let mut writer = PackWriter::new(archive, &catalog, seq, request.pack_bytes);
    writer.stall_after_packs = request.stall_after_packs;
    let resumed = writer.resume(&catalog)?;
    let volume = pool.volume(&request.snapshot)?;
    writer.store_changes(&mut catalog, &volume, &plan.with_data, progress)?;
    writer.finish(&mut catalog)?;
    let block_bytes = u64::from(catalog.block_bytes);
    let stored_bytes = writer.stored_blocks * block_bytes;
    let written = coalesce(std::mem::take(&mut writer.runs));
    let runs = apply_changes(&plan.base_runs, &plan.changed, &written);
    let record = ArchivedSnapshot {
        seq,
        name: request.snapshot.clone(),
        guid,
        created_unix_secs: identity.created_unix_secs,
        created_generation: identity.created_generation,
        rank: pool.volume_summary(&request.snapshot)?.rank,
        size_bytes: identity.size_bytes,
        hash: request.hash.clone(),
        index: String::new(),
        pushed_unix_secs: request.now_unix_secs,
        stored_bytes,
        released: false,
    };
    let index_bytes = publish(archive, &mut catalog, record, runs)?;
    Ok(PushReport {
        snapshot: request.snapshot.clone(),
        seq,
        base: plan.base.map(|b| b.name),
        changed_bytes: ranges_blocks(&plan.changed) * block_bytes,
        stored_bytes,
        packs_written: writer.packs_written,
        packs_resumed: resumed,
        index_bytes,
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

/// Stores the pushed snapshot's index and commits it: from here the
/// snapshot is archived. Returns the index's bytes.
fn publish(
    archive: &Archive,
    catalog: &mut Catalog,
    mut record: ArchivedSnapshot,
    runs: Vec<Run>,
) -> Result<u64> {
    let index = SnapshotIndex {
        seq: record.seq,
        block_bytes: catalog.block_bytes,
        size_bytes: record.size_bytes,
        runs: clip(runs, record.size_bytes, catalog.block_bytes),
    };
    let referenced: BTreeSet<u64> = index.runs.iter().map(|r| r.pack).collect();
    record.index = index_object(record.seq, catalog.generation + 1);
    let index_bytes = archive.put_index(&record.index, &index)?;
    ledger::note_references(catalog, record.seq, &referenced);
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

/// What differs from the newest archived snapshot, read from the pool's
/// diff; without a base the pool still knows, everything the snapshot maps.
fn plan(archive: &Archive, pool: &Pool, catalog: &Catalog, snapshot: &str) -> Result<Plan> {
    let block_bytes = u64::from(catalog.block_bytes);
    let base = ledger::newest(catalog).cloned();
    let diff = base.as_ref().and_then(|b| {
        let guid: [u8; 16] = hex::decode(&b.guid).ok()?.try_into().ok()?;
        pool.diff_from(&DiffFrom::Guid(guid), snapshot).ok()
    });
    let Some(diff) = diff else {
        let mapped = pool.volume(snapshot)?.mapped_extents()?;
        let ranges = to_block_ranges(mapped.into_iter(), block_bytes);
        return Ok(Plan {
            base: None,
            base_runs: Vec::new(),
            changed: ranges.clone(),
            with_data: ranges,
        });
    };
    let base = base.expect("a diff has a base");
    let base_runs = archive
        .index(&base.index, base.seq, catalog.block_bytes)?
        .runs;
    let changed = to_block_ranges(
        diff.extents
            .iter()
            .map(|e| (e.offset_bytes, e.length_bytes)),
        block_bytes,
    );
    let with_data = to_block_ranges(
        diff.extents
            .iter()
            .filter(|e| e.data)
            .map(|e| (e.offset_bytes, e.length_bytes)),
        block_bytes,
    );
    Ok(Plan {
        base: Some(base),
        base_runs,
        changed,
        with_data,
    })
}

/// Byte extents as sorted, merged block ranges.
fn to_block_ranges(extents: impl Iterator<Item = (u64, u64)>, block_bytes: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = extents
        .filter(|&(_, len)| len > 0)
        .map(|(off, len)| (off / block_bytes, (off + len).div_ceil(block_bytes)))
        .collect();
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if last.1 >= a => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn ranges_blocks(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|(a, b)| b - a).sum()
}

/// Runs cut to the snapshot's blocks (a volume that shrank).
fn clip(runs: Vec<Run>, size_bytes: u64, block_bytes: u32) -> Vec<Run> {
    let blocks = size_bytes.div_ceil(u64::from(block_bytes));
    runs.into_iter()
        .filter(|r| r.first_block < blocks)
        .map(|mut r| {
            r.blocks = r.blocks.min((blocks - r.first_block) as u32);
            r
        })
        .collect()
}

/// The seq this push stores under: the partial push of this snapshot if one
/// stopped, or a new one (dropping another snapshot's partial push).
fn start_partial(archive: &Archive, catalog: &mut Catalog, guid: &str) -> Result<u64> {
    if let Some(partial) = &catalog.partial {
        if partial.guid == guid {
            return Ok(partial.seq);
        }
        let abandoned = catalog.partial.take().expect("checked").packs;
        ledger::remove_packs(catalog, &abandoned);
        archive.commit(catalog)?;
        let names: Vec<String> = abandoned
            .iter()
            .map(|&id| crate::archive::pack_object(id))
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
    });
    Ok(seq)
}

/// Fills packs with the blocks of one push and stores each when full.
struct PackWriter<'a> {
    archive: &'a Archive,
    seq: u64,
    block_bytes: u32,
    slots_per_pack: usize,
    blocks: Vec<u64>,
    data: Vec<u8>,
    /// Where each stored block went.
    runs: Vec<Run>,
    stored_blocks: u64,
    packs_written: u64,
    /// Changed blocks below this one are already stored (a resumed push).
    resume_at: u64,
    stall_after_packs: Option<u64>,
}

impl<'a> PackWriter<'a> {
    fn new(archive: &'a Archive, catalog: &Catalog, seq: u64, pack_bytes: u64) -> Self {
        let slot = pack::SLOT_CHECKSUM_BYTES + 8 + u64::from(catalog.block_bytes);
        PackWriter {
            archive,
            seq,
            block_bytes: catalog.block_bytes,
            slots_per_pack: (pack_bytes.saturating_sub(pack::HEADER_BYTES) / slot).max(1) as usize,
            blocks: Vec::new(),
            data: Vec::new(),
            runs: Vec::new(),
            stored_blocks: 0,
            packs_written: 0,
            resume_at: 0,
            stall_after_packs: None,
        }
    }

    /// Takes in the packs an interrupted push of this snapshot stored.
    fn resume(&mut self, catalog: &Catalog) -> Result<u64> {
        let partial = catalog
            .partial
            .as_ref()
            .expect("a push has its partial record");
        for &id in &partial.packs {
            let record = ledger::pack(catalog, id).expect("a partial push's packs are recorded");
            let (_, blocks) = self
                .archive
                .pack_blocks(id, self.block_bytes, record.slots)?;
            for (slot, block) in blocks.into_iter().enumerate() {
                self.runs.push(Run {
                    first_block: block,
                    pack: id,
                    first_slot: slot as u32,
                    blocks: 1,
                });
                self.stored_blocks += 1;
            }
        }
        self.resume_at = partial.next_block;
        Ok(partial.packs.len() as u64)
    }

    fn store_changes(
        &mut self,
        catalog: &mut Catalog,
        volume: &Volume,
        ranges: &[(u64, u64)],
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let bs = u64::from(self.block_bytes);
        let total = ranges_blocks(ranges) * bs;
        let size = volume.size_bytes()?;
        let mut done = 0;
        let mut buf = vec![0u8; self.block_bytes as usize];
        for &(a, b) in ranges {
            for block in a.max(self.resume_at)..b {
                let len = bs.min(size.saturating_sub(block * bs)) as usize;
                buf.fill(0);
                volume.read_at(&mut buf[..len], block * bs)?;
                if buf.iter().any(|&x| x != 0) {
                    self.blocks.push(block);
                    self.data.extend_from_slice(&buf);
                }
                if self.blocks.len() == self.slots_per_pack {
                    self.flush(catalog, block + 1)?;
                }
            }
            done += (b - a) * bs;
            progress(done, total);
        }
        Ok(())
    }

    /// Stores the pack being filled and commits it, so that a push that
    /// stops after this goes on from `next_block`.
    fn flush(&mut self, catalog: &mut Catalog, next_block: u64) -> Result<()> {
        if self.blocks.is_empty() {
            return Ok(());
        }
        let id = ledger::allocate_pack(catalog);
        let bytes = pack::encode(id, self.block_bytes, &self.blocks, &self.data);
        self.archive.put_pack(id, &bytes)?;
        ledger::add_pack(
            catalog,
            PackRecord {
                id,
                owner_seq: self.seq,
                first_seq: self.seq,
                last_seq: self.seq,
                slots: self.blocks.len() as u32,
                object_bytes: bytes.len() as u64,
            },
        );
        for (slot, &block) in self.blocks.iter().enumerate() {
            self.runs.push(Run {
                first_block: block,
                pack: id,
                first_slot: slot as u32,
                blocks: 1,
            });
        }
        self.stored_blocks += self.blocks.len() as u64;
        self.packs_written += 1;
        catalog.totals.pushed_bytes += bytes.len() as u64;
        let partial = catalog
            .partial
            .as_mut()
            .expect("a push has its partial record");
        partial.packs.push(id);
        partial.next_block = next_block;
        self.blocks.clear();
        self.data.clear();
        self.archive.commit(catalog)?;
        if self.stall_after_packs == Some(self.packs_written) {
            eprintln!(
                "grove-archive: push stalled after {} packs (test hook)",
                self.packs_written
            );
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        Ok(())
    }

    /// Stores the last, partly filled pack.
    fn finish(&mut self, catalog: &mut Catalog) -> Result<()> {
        let next = self.blocks.last().map_or(0, |b| b + 1);
        self.flush(catalog, next)
    }
}
