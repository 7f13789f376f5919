//! Back-in-time reads: an archived snapshot read where it lies, block by
//! block, through a bounded cache. Its index is read once when opened; after
//! that a block not cached costs one ranged read of one pack (a read that
//! spans consecutive slots of a pack fetches them in that one read). Damage
//! is an error, never other data: every slot is checked against its
//! checksum, which covers its pack and place.

use crate::archive::Archive;
use crate::block_cache::BlockCache;
use crate::error::{ArchiveError, Result};
use crate::format::catalog::Catalog;
use crate::format::index::SnapshotIndex;
use crate::ledger;
use crate::reader::PackReader;
use std::sync::Mutex;

/// An archived snapshot, open for reading.
#[derive(Debug)]
pub struct ArchivedVolume {
    archive: Archive,
    catalog: Catalog,
    name: String,
    index: SnapshotIndex,
    packs: PackReader,
    cache: Mutex<BlockCache>,
}

impl ArchivedVolume {
    /// Opens archived snapshot `snapshot` of `volume`'s archive at `url`,
    /// with a cache of `cache_bytes` of blocks.
    pub fn open(
        url: &str,
        volume: &str,
        snapshot: &str,
        cache_bytes: u64,
    ) -> Result<ArchivedVolume> {
        let archive = Archive::open(url, volume)?;
        let missing =
            || ArchiveError::Invalid(format!("{snapshot:?} is not in {}", archive.describe()));
        let catalog = archive.load()?.ok_or_else(missing)?;
        let record = ledger::snapshot(&catalog, snapshot)
            .ok_or_else(missing)?
            .clone();
        let index = archive.index(&record.index, record.seq, catalog.block_bytes)?;
        Ok(ArchivedVolume {
            archive,
            catalog,
            name: snapshot.to_string(),
            index,
            packs: PackReader::default(),
            cache: Mutex::new(BlockCache::new(cache_bytes)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.index.size_bytes
    }

    /// Bytes the block cache holds now (never more than its capacity).
    pub fn cached_bytes(&self) -> u64 {
        self.cache.lock().expect("cache lock").held_bytes()
    }

    pub fn block_bytes(&self) -> u32 {
        self.catalog.block_bytes
    }

    /// The byte ranges within `offset..offset + len` that hold data; the
    /// rest reads as zeros (holes).
    pub fn mapped_extents_in(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let bs = u64::from(self.catalog.block_bytes);
        let end = offset.saturating_add(len).min(self.size_bytes());
        let mut out: Vec<(u64, u64)> = Vec::new();
        let first = self
            .index
            .runs
            .partition_point(|r| r.end_block() * bs <= offset);
        for run in &self.index.runs[first..] {
            let start = (run.first_block * bs).max(offset);
            let stop = (run.end_block() * bs).min(end);
            if start >= end {
                break;
            }
            if start < stop {
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == start => last.1 += stop - start,
                    _ => out.push((start, stop - start)),
                }
            }
        }
        out
    }

    /// Fills `buf` from byte `offset`; past the end is an error.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size_bytes());
        if end.is_none() {
            return Err(ArchiveError::Invalid(format!(
                "a read of {} bytes at {offset} is past the end of {} ({} bytes)",
                buf.len(),
                self.name,
                self.size_bytes()
            )));
        }
        let bs = u64::from(self.catalog.block_bytes);
        let last_block = (offset + buf.len() as u64).div_ceil(bs);
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let block = at / bs;
            let within = (at % bs) as usize;
            let take = (bs as usize - within).min(buf.len() - done);
            let out = &mut buf[done..done + take];
            match self.index.lookup(block) {
                None => out.fill(0),
                Some(place) => self.copy_block(place, block, last_block - block, within, out)?,
            }
            done += take;
        }
        Ok(())
    }

    /// Copies bytes `within..` of the version at `place` into `out`; on a
    /// miss, it and up to `ahead - 1` following slots that the snapshot's
    /// run continues into (the rest of the read) are fetched in one ranged
    /// read and cached.
    fn copy_block(
        &self,
        place: (u64, u32),
        block: u64,
        ahead: u64,
        within: usize,
        out: &mut [u8],
    ) -> Result<()> {
        if let Some(data) = self.cache.lock().expect("cache lock").get(place) {
            out.copy_from_slice(&data[within..within + out.len()]);
            return Ok(());
        }
        let data = self.fetch(place, block, ahead)?;
        out.copy_from_slice(&data[within..within + out.len()]);
        Ok(())
    }

    /// Reads the version at `place` and up to `ahead - 1` after it in its
    /// run from the pack, caches them all, and returns the first.
    fn fetch(&self, place: (u64, u32), block: u64, ahead: u64) -> Result<Vec<u8>> {
        let header = self.packs.header(&self.archive, &self.catalog, place.0)?;
        let at = self.index.runs.partition_point(|r| r.end_block() <= block);
        let run_left = self.index.runs.get(at).map_or(1, |r| r.end_block() - block);
        // An index that names a slot past its pack is damage, not a panic.
        let slots_left = header.slots.saturating_sub(place.1);
        if slots_left == 0 {
            return Err(ArchiveError::Damaged(format!(
                "the index of {} names slots past the end of pack {:016x}",
                self.name, place.0
            )));
        }
        let count = ahead.clamp(1, run_left).min(u64::from(slots_left)) as u32;
        let data = self.archive.read_slots(&header, place.1, count)?;
        let bs = self.catalog.block_bytes as usize;
        let mut cache = self.cache.lock().expect("cache lock");
        for (i, chunk) in data.chunks(bs).enumerate() {
            cache.put((place.0, place.1 + i as u32), chunk.to_vec());
        }
        Ok(data[..bs].to_vec())
    }
}

/// Every archived snapshot at `url`: (volume, snapshot name), oldest first
/// within each volume.
pub fn archived_snapshots(url: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for volume in Archive::volumes_at(url)? {
        if let Some(catalog) = Archive::open(url, &volume)?.load()? {
            out.extend(
                catalog
                    .snapshots
                    .iter()
                    .map(|s| (volume.clone(), s.name.clone())),
            );
        }
    }
    Ok(out)
}
