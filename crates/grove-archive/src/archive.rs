//! One volume's archive in a store: its folder of objects, and the catalog
//! loaded and committed. Everything that names or fetches an object lives
//! here, so the commands above speak of packs, indexes and catalogs.

use crate::error::{ArchiveError, Result};
use crate::format::catalog::ForwardRecord;
use crate::format::catalog::{self, Catalog};
use crate::format::forward::ForwardTable;
use crate::format::index::{PageRef, SnapshotRoot};
use crate::format::pack::{self, PackEncoder, PackHeader, SlotEntry};
use crate::format::page;
use crate::format::runs::Run;
use crate::pack_writer::PackWriter;
use grove_objects::{ErrorKind, FolderStore};
use std::ops::Range;

/// The folder of volume `volume`'s archive ('=' is in no volume name, so
/// no stream's folder looks like one).
fn folder_of(volume: &str) -> String {
    format!("archive={volume}")
}

/// The folder of its catalogs, apart from the packs and indexes: finding
/// the newest catalog lists a few objects, not every pack.
fn catalog_folder_of(volume: &str) -> String {
    format!("archive-catalog={volume}")
}

pub fn pack_object(id: u64) -> String {
    format!("pack-{id:016x}")
}

pub fn index_object(seq: u64) -> String {
    format!("index-{seq:016x}")
}

pub fn pages_object(id: u64) -> String {
    format!("pages-{id:016x}")
}

/// Deleted pack `origin`'s forward table, the `id`th object written.
pub fn forward_object(origin: u64, id: u64) -> String {
    format!("forward-{origin:016x}-{id:016x}")
}

/// Object names listed at a time.
const OBJECTS_PER_PAGE: usize = 1000;

/// Catalogs older than this many generations back are deleted.
const CATALOGS_KEPT: u64 = 2;

/// A volume's archive at a store location.
#[derive(Debug)]
pub struct Archive {
    store: FolderStore,
    folder: String,
    catalog_folder: String,
    volume: String,
}

impl Archive {
    /// The archive of `volume` at `url` (`file:///DIR` or `s3://BUCKET/PREFIX`).
    pub fn open(url: &str, volume: &str) -> Result<Archive> {
        grove_store::validate_volume_name(volume)?;
        Ok(Archive {
            store: FolderStore::open(url)?,
            folder: folder_of(volume),
            catalog_folder: catalog_folder_of(volume),
            volume: volume.to_string(),
        })
    }

    /// The volumes that have an archive at `url`.
    pub fn volumes_at(url: &str) -> Result<Vec<String>> {
        let mut volumes: Vec<String> = FolderStore::open(url)?
            .folders()?
            .into_iter()
            .filter_map(|f| f.strip_prefix("archive=").map(str::to_string))
            .collect();
        volumes.sort();
        Ok(volumes)
    }

    /// The store, for one request: a test can make requests fail from
    /// some point on, as a lost connection would (hooks.rs).
    fn store(&self) -> Result<&FolderStore> {
        crate::hooks::before_request()?;
        Ok(&self.store)
    }

    pub fn volume(&self) -> &str {
        &self.volume
    }

    /// For messages: the store and the volume.
    pub fn describe(&self) -> String {
        format!("{} (volume {})", self.store.describe(), self.volume)
    }

    /// Hands the names of the folder's objects to `visit` a page at a
    /// time (at most `OBJECTS_PER_PAGE`), so that listing holds one page
    /// whatever the archive's size. `visit` may delete what it is handed.
    pub(crate) fn visit_objects(
        &self,
        visit: &mut dyn FnMut(&[String]) -> Result<()>,
    ) -> Result<()> {
        let mut names = Vec::with_capacity(OBJECTS_PER_PAGE);
        self.store()?
            .list_pages(&self.folder, OBJECTS_PER_PAGE, &mut |page| {
                names.clear();
                names.extend(page.iter().map(|e| e.name.clone()));
                visit(&names)
            })
    }

    pub(crate) fn create_object(&self, name: &str, data: &[u8]) -> Result<()> {
        Ok(self.store()?.create(&self.folder, name, data)?)
    }

    pub(crate) fn get_object(&self, name: &str) -> Result<Vec<u8>> {
        Ok(self.store()?.get(&self.folder, name)?)
    }

    pub(crate) fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let len = range.end - range.start;
        let bytes = self
            .store()?
            .get_range(&self.folder, name, range)
            .map_err(|e| self.missing_is_damage(name, e))?;
        if bytes.len() as u64 != len {
            return Err(self.truncated(name));
        }
        Ok(bytes)
    }

    /// A referenced object not found is damage, not a store error.
    fn missing_is_damage(&self, name: &str, e: grove_objects::Error) -> ArchiveError {
        if e.kind() == ErrorKind::NotFound {
            ArchiveError::Damaged(format!("{name} is missing from {}", self.describe()))
        } else {
            ArchiveError::Store(e)
        }
    }

    fn truncated(&self, name: &str) -> ArchiveError {
        ArchiveError::Damaged(format!(
            "{name} in {} is shorter than the catalog says (truncated)",
            self.describe()
        ))
    }

    pub(crate) fn delete_objects(&self, names: &[String]) -> Result<()> {
        Ok(self.store()?.delete(&self.folder, names)?)
    }

    /// The newest catalog, or None for an archive nothing was pushed to.
    /// A newest catalog that does not decode is damage: nothing builds on it.
    pub fn load(&self) -> Result<Option<Catalog>> {
        let newest = self
            .store()?
            .list(&self.catalog_folder)?
            .into_iter()
            .filter_map(|entry| catalog::generation_of(&entry.name))
            .max();
        let Some(generation) = newest else {
            return Ok(None);
        };
        let name = catalog::object_name(generation);
        let bytes = self
            .store()?
            .get(&self.catalog_folder, &name)
            .map_err(|e| {
                if e.kind() == ErrorKind::NotFound {
                    ArchiveError::Damaged(format!("{name} of {} vanished", self.describe()))
                } else {
                    ArchiveError::Store(e)
                }
            })?;
        let catalog = catalog::decode(&bytes, generation).map_err(|why| {
            ArchiveError::Damaged(format!(
                "the catalog of {} ({name}) is damaged: {why}",
                self.describe()
            ))
        })?;
        if catalog.volume != self.volume {
            return Err(ArchiveError::Damaged(format!(
                "the catalog in {} is volume {:?}'s (a foreign catalog)",
                self.describe(),
                catalog.volume
            )));
        }
        Ok(Some(catalog))
    }

    /// Commits `catalog` as the next generation. Fails if another writer
    /// committed that generation first.
    pub(crate) fn commit(&self, catalog: &mut Catalog) -> Result<()> {
        catalog.generation += 1;
        let name = catalog::object_name(catalog.generation);
        let created = self
            .store()?
            .create(&self.catalog_folder, &name, &catalog::encode(catalog));
        match created {
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(ArchiveError::Busy(format!(
                "another writer committed to {} meanwhile; nothing of this command was kept",
                self.describe()
            ))),
            other => Ok(other?),
        }?;
        if catalog.generation > CATALOGS_KEPT {
            let old = catalog::object_name(catalog.generation - CATALOGS_KEPT - 1);
            self.store()?.delete(&self.catalog_folder, &[old])?;
        }
        Ok(())
    }

    /// Starts storing pack `id` of up to `capacity` slots, streamed to its
    /// object as it fills.
    pub(crate) fn pack_writer(
        &self,
        id: u64,
        block_bytes: u32,
        capacity: u32,
    ) -> Result<PackWriter<'_>> {
        let object = self.store()?.put_streamed(&self.folder, &pack_object(id))?;
        PackWriter::start(PackEncoder::new(id, block_bytes, capacity), object)
    }

    /// Removes what pushes or expiries killed while storing a pack left
    /// (temporary files, incomplete uploads); returns how many. Only with
    /// the writer's claim held.
    pub(crate) fn clean_interrupted(&self) -> Result<usize> {
        Ok(self.store()?.clean_interrupted(&self.folder)?)
    }

    /// Pack `id`'s shape and slot table, from the table and footer at its
    /// end (one read: the catalog's `slots` say where they are).
    pub(crate) fn pack_table(
        &self,
        id: u64,
        block_bytes: u32,
        slots: u32,
    ) -> Result<(PackHeader, Vec<SlotEntry>)> {
        let name = pack_object(id);
        let header = PackHeader {
            id,
            block_bytes,
            slots,
        };
        let start = header.table_offset();
        let tail = self.get_range(&name, start..start + pack::tail_bytes(slots))?;
        let damaged =
            |why: String| ArchiveError::Damaged(format!("{name} in {}: {why}", self.describe()));
        match pack::decode_table(&tail, &header) {
            Ok(table) => Ok((header, table)),
            Err(why) => {
                // The header names an older format or another pack better.
                let head = self.get_range(&name, 0..pack::HEADER_BYTES)?;
                pack::decode_header(&head, id, block_bytes).map_err(damaged)?;
                Err(damaged(why))
            }
        }
    }

    /// The data of slots `first..first + count` of a pack, checked.
    pub(crate) fn read_slots(
        &self,
        header: &PackHeader,
        first: u32,
        count: u32,
    ) -> Result<Vec<u8>> {
        let name = pack_object(header.id);
        let start = header.slot_offset(first);
        let bytes = self.get_range(&name, start..start + u64::from(count) * header.slot_bytes())?;
        let mut out = Vec::with_capacity(count as usize * header.block_bytes as usize);
        for (i, record) in bytes.chunks(header.slot_bytes() as usize).enumerate() {
            out.extend_from_slice(self.checked_slot(header, first + i as u32, record)?);
        }
        Ok(out)
    }

    /// The data of slot `slot` of a pack from its stored `record`
    /// (checksum and data), checked.
    pub(crate) fn checked_slot<'r>(
        &self,
        header: &PackHeader,
        slot: u32,
        record: &'r [u8],
    ) -> Result<&'r [u8]> {
        pack::verify_slot(header, slot, record).map_err(|why| {
            ArchiveError::Damaged(format!(
                "{} in {}: {why}",
                pack_object(header.id),
                self.describe()
            ))
        })
    }

    /// The stored records (checksums and data) of each run of slots in
    /// `spans` of a pack, unchecked: one ranged read each, a few in flight
    /// at a time.
    pub(crate) fn read_spans(
        &self,
        header: &PackHeader,
        spans: &[Range<u32>],
    ) -> Result<Vec<Vec<u8>>> {
        let name = pack_object(header.id);
        let ranges: Vec<Range<u64>> = spans
            .iter()
            .map(|span| header.slot_offset(span.start)..header.slot_offset(span.end))
            .collect();
        // The test hook counts each ranged read as the request it is.
        for _ in 1..ranges.len() {
            crate::hooks::before_request()?;
        }
        let read = self.store()?.get_ranges(&self.folder, &name, &ranges);
        let records = read.map_err(|e| self.missing_is_damage(&name, e))?;
        for (range, bytes) in ranges.iter().zip(&records) {
            if bytes.len() as u64 != range.end - range.start {
                return Err(self.truncated(&name));
            }
        }
        Ok(records)
    }

    /// Stores a snapshot's index root; returns its bytes.
    pub(crate) fn put_root(&self, name: &str, root: &SnapshotRoot) -> Result<u64> {
        let bytes = root.encode();
        // A plain put, as for packs: nothing references it before the commit.
        self.store()?.put(&self.folder, name, &bytes)?;
        Ok(bytes.len() as u64)
    }

    /// The whole of an object the catalog references; missing is damage.
    fn get_referenced(&self, name: &str) -> Result<Vec<u8>> {
        self.get_object(name).map_err(|e| match e {
            ArchiveError::Store(s) if s.kind() == ErrorKind::NotFound => {
                ArchiveError::Damaged(format!("{name} is missing from {}", self.describe()))
            }
            other => other,
        })
    }

    pub(crate) fn root(&self, name: &str, seq: u64, block_bytes: u32) -> Result<SnapshotRoot> {
        let bytes = self.get_referenced(name)?;
        SnapshotRoot::decode(&bytes, seq, block_bytes)
            .map_err(|why| ArchiveError::Damaged(format!("{name} in {}: {why}", self.describe())))
    }

    pub(crate) fn put_pages(&self, id: u64, bytes: &[u8]) -> Result<()> {
        Ok(self.store()?.put(&self.folder, &pages_object(id), bytes)?)
    }

    /// The runs of segment `segment` (blocks `blocks` of the snapshots
    /// that share it), from its page at `at`.
    pub(crate) fn page(&self, at: PageRef, segment: u64, blocks: Range<u64>) -> Result<Vec<Run>> {
        let name = pages_object(at.object);
        let start = u64::from(at.offset);
        let bytes = self.get_range(&name, start..start + u64::from(at.len))?;
        page::decode(&bytes, segment, blocks).map_err(|why| {
            ArchiveError::Damaged(format!(
                "{name} in {}, the page of segment {segment} at {}: {why}",
                self.describe(),
                at.offset
            ))
        })
    }

    /// Stores a forward table; returns its bytes.
    pub(crate) fn put_forward(&self, name: &str, table: &ForwardTable) -> Result<u64> {
        let bytes = table.encode();
        self.store()?.put(&self.folder, name, &bytes)?;
        Ok(bytes.len() as u64)
    }

    pub(crate) fn forward(&self, record: &ForwardRecord) -> Result<ForwardTable> {
        let bytes = self.get_referenced(&record.object)?;
        ForwardTable::decode(&bytes, record.origin).map_err(|why| {
            ArchiveError::Damaged(format!("{} in {}: {why}", record.object, self.describe()))
        })
    }
}
