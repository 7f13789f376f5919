//! Reads what an archive holds for one command or one open snapshot: index
//! pages and forward tables through bounded caches, and block versions by
//! address (a version whose pack was deleted is found through the pack's
//! forward table). Each pack's header is read once and kept, so a run of
//! slots costs one ranged read. Restores, checks, expiry and back-in-time
//! reads all go through it, so its memory is bounded whatever the archive's
//! size.

use crate::archive::Archive;
use crate::error::{ArchiveError, Result};
use crate::format::catalog::Catalog;
use crate::format::forward::ForwardTable;
use crate::format::index::{PageRef, SnapshotRoot};
use crate::format::pack::{Address, PackHeader};
use crate::format::runs::Run;
use crate::ledger;
use crate::lru::Lru;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Decoded index pages kept: a page holds at most 384 KiB of runs.
const PAGE_CACHE_BYTES: u64 = 8 << 20;
/// Decoded forward tables kept (about 40 bytes a moved version).
const FORWARD_CACHE_BYTES: u64 = 8 << 20;

#[derive(Debug)]
pub struct PackReader {
    /// The headers of the packs read so far (a few dozen bytes each).
    headers: Mutex<BTreeMap<u64, PackHeader>>,
    pages: Mutex<Lru<PageRef, Arc<Vec<Run>>>>,
    forwards: Mutex<Lru<u64, Arc<ForwardTable>>>,
}

impl Default for PackReader {
    fn default() -> Self {
        PackReader {
            headers: Mutex::default(),
            pages: Mutex::new(Lru::new(PAGE_CACHE_BYTES)),
            forwards: Mutex::new(Lru::new(FORWARD_CACHE_BYTES)),
        }
    }
}

impl PackReader {
    /// The runs of `root`'s segment `segment` (none for a segment of holes).
    pub fn runs(
        &self,
        archive: &Archive,
        root: &SnapshotRoot,
        segment: u64,
    ) -> Result<Arc<Vec<Run>>> {
        match root.page(segment) {
            None => Ok(Arc::new(Vec::new())),
            Some(at) => self.runs_at(archive, at, segment, root.segment_range(segment)),
        }
    }

    /// The runs of the page at `at`, of segment `segment` (blocks `blocks`).
    pub fn runs_at(
        &self,
        archive: &Archive,
        at: PageRef,
        segment: u64,
        blocks: std::ops::Range<u64>,
    ) -> Result<Arc<Vec<Run>>> {
        if let Some(runs) = self.pages.lock().expect("pages lock").get(&at) {
            return Ok(runs.clone());
        }
        let runs = Arc::new(archive.page(at, segment, blocks)?);
        let weight = (runs.len() * std::mem::size_of::<Run>()) as u64 + 64;
        self.pages
            .lock()
            .expect("pages lock")
            .put(at, runs.clone(), weight);
        Ok(runs)
    }

    /// Pack `pack`'s header, read once.
    pub fn header(&self, archive: &Archive, catalog: &Catalog, pack: u64) -> Result<PackHeader> {
        if let Some(h) = self.headers.lock().expect("headers lock").get(&pack) {
            return Ok(*h);
        }
        let record = ledger::pack(catalog, pack)
            .filter(|record| record.slots > 0)
            .ok_or_else(|| unknown_pack(archive, pack))?;
        let (header, _) = archive.pack_table(pack, catalog.block_bytes, record.slots)?;
        self.headers
            .lock()
            .expect("headers lock")
            .insert(pack, header);
        Ok(header)
    }

    /// Where the version at `address` is now: the address itself while its
    /// pack lives, else where its pack's forward table says it went.
    pub fn resolve(
        &self,
        archive: &Archive,
        catalog: &Catalog,
        address: Address,
    ) -> Result<Address> {
        if ledger::pack(catalog, address.0).is_some() {
            return Ok(address);
        }
        let Some(record) = ledger::forward(catalog, address.0) else {
            return Err(unknown_pack(archive, address.0));
        };
        let cached = self
            .forwards
            .lock()
            .expect("forwards lock")
            .get(&address.0)
            .cloned();
        let table = match cached {
            Some(table) => table,
            None => {
                let table = Arc::new(archive.forward(record)?);
                let weight = table.moved.len() as u64 * 40 + 64;
                self.forwards
                    .lock()
                    .expect("forwards lock")
                    .put(address.0, table.clone(), weight);
                table
            }
        };
        table.moved.get(&address.1).copied().ok_or_else(|| {
            ArchiveError::Damaged(format!(
                "{} says nothing of slot {} of deleted pack {:016x}, which an index names",
                record.object, address.1, address.0
            ))
        })
    }

    /// The data of slots `first..first + count` of live pack `pack`, checked.
    pub fn read_slots(
        &self,
        archive: &Archive,
        catalog: &Catalog,
        pack: u64,
        first: u32,
        count: u32,
    ) -> Result<Vec<u8>> {
        let header = self.header(archive, catalog, pack)?;
        if u64::from(first) + u64::from(count) > u64::from(header.slots) {
            return Err(ArchiveError::Damaged(format!(
                "an index of {} names slots past the end of pack {pack:016x}",
                archive.describe()
            )));
        }
        archive.read_slots(&header, first, count)
    }

    /// The versions at addresses `(pack, first)..(pack, first + count)`,
    /// back to back: one ranged read while the pack lives, else one for
    /// each stretch that was copied to consecutive slots.
    pub fn read_versions(
        &self,
        archive: &Archive,
        catalog: &Catalog,
        pack: u64,
        first: u32,
        count: u32,
    ) -> Result<Vec<u8>> {
        if ledger::pack(catalog, pack).is_some() {
            return self.read_slots(archive, catalog, pack, first, count);
        }
        let mut out = Vec::with_capacity(count as usize * catalog.block_bytes as usize);
        let mut i = 0;
        while i < count {
            let start = self.resolve(archive, catalog, (pack, first + i))?;
            let mut len = 1;
            while i + len < count
                && self.resolve(archive, catalog, (pack, first + i + len))?
                    == (start.0, start.1 + len)
            {
                len += 1;
            }
            out.extend(self.read_slots(archive, catalog, start.0, start.1, len)?);
            i += len;
        }
        Ok(out)
    }
}

fn unknown_pack(archive: &Archive, pack: u64) -> ArchiveError {
    ArchiveError::Damaged(format!(
        "an index of {} names pack {pack:016x}, which the catalog does not list",
        archive.describe()
    ))
}
