//! Reads block versions out of packs, with each pack's header read once
//! and kept: after that a run of slots costs one ranged read. Restores and
//! back-in-time reads (view.rs) both go through it.

use crate::archive::Archive;
use crate::error::{ArchiveError, Result};
use crate::format::catalog::Catalog;
use crate::format::pack::PackHeader;
use crate::ledger;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The headers of the packs read so far (a few dozen bytes each).
#[derive(Debug, Default)]
pub struct PackReader {
    headers: Mutex<BTreeMap<u64, PackHeader>>,
}

impl PackReader {
    /// Pack `pack`'s header, read once.
    pub fn header(&self, archive: &Archive, catalog: &Catalog, pack: u64) -> Result<PackHeader> {
        if let Some(h) = self.headers.lock().expect("headers lock").get(&pack) {
            return Ok(*h);
        }
        let record = ledger::pack(catalog, pack)
            .filter(|record| record.slots > 0)
            .ok_or_else(|| {
                ArchiveError::Damaged(format!(
                    "an index of {} names pack {pack:016x}, which the catalog does not list",
                    archive.describe()
                ))
            })?;
        let (header, _) = archive.pack_blocks(pack, catalog.block_bytes, record.slots)?;
        self.headers
            .lock()
            .expect("headers lock")
            .insert(pack, header);
        Ok(header)
    }

    /// The data of slots `first..first + count` of `pack`, checked.
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
}
