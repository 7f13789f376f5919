//! Reads block versions out of packs, with each pack's header read once
//! and kept: after that a run of slots costs one ranged read.

use crate::archive::Archive;
use crate::error::{ArchiveError, Result};
use crate::format::catalog::Catalog;
use crate::format::pack::PackHeader;
use crate::ledger;
use std::cell::RefCell;
use std::collections::BTreeMap;

pub struct SnapshotReader<'a> {
    archive: &'a Archive,
    catalog: &'a Catalog,
    headers: RefCell<BTreeMap<u64, PackHeader>>,
}

impl<'a> SnapshotReader<'a> {
    pub fn new(archive: &'a Archive, catalog: &'a Catalog) -> Self {
        SnapshotReader {
            archive,
            catalog,
            headers: RefCell::new(BTreeMap::new()),
        }
    }

    fn header(&self, pack: u64) -> Result<PackHeader> {
        if let Some(h) = self.headers.borrow().get(&pack) {
            return Ok(*h);
        }
        let record = ledger::pack(self.catalog, pack).ok_or_else(|| {
            ArchiveError::Damaged(format!(
                "an index of {} names pack {pack:016x}, which the catalog does not list",
                self.archive.describe()
            ))
        })?;
        let (header, _) = self
            .archive
            .pack_blocks(pack, self.catalog.block_bytes, record.slots)?;
        self.headers.borrow_mut().insert(pack, header);
        Ok(header)
    }

    /// The data of slots `first..first + count` of `pack`, checked.
    pub fn read_slots(&self, pack: u64, first: u32, count: u32) -> Result<Vec<u8>> {
        let header = self.header(pack)?;
        if u64::from(first) + u64::from(count) > u64::from(header.slots) {
            return Err(ArchiveError::Damaged(format!(
                "an index of {} names slots past the end of pack {pack:016x}",
                self.archive.describe()
            )));
        }
        self.archive.read_slots(&header, first, count)
    }
}
