//! Back-in-time reads: an archived snapshot read where it lies, block by
//! block, through a bounded cache. Its index root is read when opened and
//! its pages as reads reach them (kept in the reader's bounded page cache);
//! after that a block not cached costs one ranged read of one pack (a read
//! that spans consecutive slots of a pack fetches them in that one read).
//! Damage is an error, never other data: every slot is checked against its
//! checksum, which covers its pack and place.

use crate::archive::Archive;
use crate::block_cache::BlockCache;
use crate::error::{ArchiveError, Result};
use crate::format::catalog::Catalog;
use crate::format::index::SnapshotRoot;
use crate::format::runs::Run;
use crate::ledger;
use crate::reader::PackReader;
use std::sync::Arc;

/// An archived snapshot, open for reading.
#[derive(Debug)]
pub struct ArchivedVolume {
    archive: Archive,
    catalog: Catalog,
    name: String,
    root: SnapshotRoot,
    reader: PackReader,
    /// Versions read, shared with the process's other archived snapshots.
    cache: Arc<BlockCache>,
    /// This archive's number in the cache's keys.
    cache_number: u32,
}

impl ArchivedVolume {
    /// Opens archived snapshot `snapshot` of `volume`'s archive at `url`,
    /// with a cache of its own of `cache_bytes` of blocks.
    pub fn open(
        url: &str,
        volume: &str,
        snapshot: &str,
        cache_bytes: u64,
    ) -> Result<ArchivedVolume> {
        Self::open_shared(url, volume, snapshot, BlockCache::new(cache_bytes))
    }

    /// Opens it reading through `cache`, shared with other snapshots.
    pub fn open_shared(
        url: &str,
        volume: &str,
        snapshot: &str,
        cache: Arc<BlockCache>,
    ) -> Result<ArchivedVolume> {
        let archive = Archive::open(url, volume)?;
        let missing =
            || ArchiveError::Invalid(format!("{snapshot:?} is not in {}", archive.describe()));
        let catalog = archive.load()?.ok_or_else(missing)?;
        let record = ledger::snapshot(&catalog, snapshot)
            .ok_or_else(missing)?
            .clone();
        let root = archive.root(&record.index, record.seq, catalog.block_bytes)?;
        let cache_number =
            cache.archive_number(&format!("{} {}", archive.describe(), catalog.archive_id));
        Ok(ArchivedVolume {
            archive,
            catalog,
            name: snapshot.to_string(),
            root,
            reader: PackReader::default(),
            cache,
            cache_number,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.root.size_bytes
    }

    /// Bytes the block cache holds now (never more than its capacity).
    pub fn cached_bytes(&self) -> u64 {
        self.cache.held_bytes()
    }

    pub fn block_bytes(&self) -> u32 {
        self.catalog.block_bytes
    }

    /// The byte ranges within `offset..offset + len` that hold data; the
    /// rest reads as zeros (holes).
    pub fn mapped_extents_in(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let bs = u64::from(self.catalog.block_bytes);
        let end = offset.saturating_add(len).min(self.size_bytes());
        let mut out: Vec<(u64, u64)> = Vec::new();
        if offset >= end {
            return Ok(out);
        }
        for segment in self.root.segment_of(offset / bs)..=self.root.segment_of((end - 1) / bs) {
            for run in self.reader.runs(&self.archive, &self.root, segment)?.iter() {
                let start = (run.first_block * bs).max(offset);
                let stop = (run.end_block() * bs).min(end);
                if start < stop {
                    match out.last_mut() {
                        Some(last) if last.0 + last.1 == start => last.1 += stop - start,
                        _ => out.push((start, stop - start)),
                    }
                }
            }
        }
        Ok(out)
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
        // The page of the segment being read, fetched once per segment.
        let mut page: Option<(u64, std::sync::Arc<Vec<Run>>)> = None;
        while done < buf.len() {
            let at = offset + done as u64;
            let block = at / bs;
            let within = (at % bs) as usize;
            let take = (bs as usize - within).min(buf.len() - done);
            let out = &mut buf[done..done + take];
            let segment = self.root.segment_of(block);
            if page.as_ref().is_none_or(|(s, _)| *s != segment) {
                page = Some((
                    segment,
                    self.reader.runs(&self.archive, &self.root, segment)?,
                ));
            }
            let runs = &page.as_ref().expect("fetched above").1;
            match run_holding(runs, block) {
                None => out.fill(0),
                Some(run) => self.copy_block(run, block, last_block - block, within, out)?,
            }
            done += take;
        }
        Ok(())
    }

    /// Copies bytes `within..` of `block`'s version (in `run`) into `out`;
    /// on a miss, it and up to `ahead - 1` following versions of the run
    /// (the rest of the read) are fetched together and cached.
    fn copy_block(
        &self,
        run: Run,
        block: u64,
        ahead: u64,
        within: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let address = (run.pack, run.first_slot + (block - run.first_block) as u32);
        if self.cache.copy_out(self.cache_number, address, within, out) {
            return Ok(());
        }
        let count = ahead.clamp(1, run.end_block() - block) as u32;
        let data =
            self.reader
                .read_versions(&self.archive, &self.catalog, address.0, address.1, count)?;
        out.copy_from_slice(&data[within..within + out.len()]);
        let bs = self.catalog.block_bytes as usize;
        for (i, chunk) in data.chunks(bs).enumerate() {
            let at = (address.0, address.1 + i as u32);
            self.cache.put(self.cache_number, at, chunk.to_vec());
        }
        Ok(())
    }
}

/// The run holding `block`, if any (runs sorted by block).
fn run_holding(runs: &[Run], block: u64) -> Option<Run> {
    let i = runs.partition_point(|r| r.end_block() <= block);
    runs.get(i).filter(|r| r.first_block <= block).copied()
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
