//! Writes one push into the archive, a segment of the volume's blocks at a
//! time, so that its memory is the slot table of the pack being filled
//! (the pack itself streams to its object), one segment's runs and a few
//! MiB of pages, whatever the volume's size:
//!
//! - a segment nothing changed in keeps the base's page, unread;
//! - a changed segment's new versions go into packs owned by the pushed
//!   snapshot, and its page is the base's page with the changes put in.
//!
//! After each pack a commit records the packs, the page objects and the
//! segments done so far, so a push that stops goes on from there, sending
//! again at most the pack it was filling.

use crate::archive::Archive;
use crate::error::Result;
use crate::format::catalog::{Catalog, PackRecord, PagesRecord, PartialPush};
use crate::format::index::{PageRef, SnapshotRoot};
use crate::format::pack::{self, SlotEntry};
use crate::format::page;
use crate::format::runs::{apply_changes, coalesce, Run};
use crate::ledger;
use crate::pack_writer::PackWriter;
use crate::push_plan::{ranges_blocks, Plan};
use grove_store::Volume;
use std::collections::BTreeMap;

/// A page object is stored once it holds this many bytes of pages.
const PAGES_OBJECT_BYTES: usize = 4 << 20;

/// What a finished push wrote.
pub(crate) struct Written {
    pub root: SnapshotRoot,
    pub stored_blocks: u64,
    pub packs_written: u64,
    pub page_bytes: u64,
}

pub(crate) struct PushWriter<'a> {
    archive: &'a Archive,
    seq: u64,
    block_bytes: u32,
    segment_blocks: u32,
    size_bytes: u64,
    slots_per_pack: usize,
    /// The pack being filled (streamed to its object), once it has a
    /// slot, and its last block.
    pack: Option<(PackWriter<'a>, u64)>,
    pages: PageFiller,
    /// The pages of the segments done, in order.
    done: Vec<Option<PageRef>>,
    /// How many pages of the snapshot (those done, and the base's for the
    /// segments to come) address each pack.
    pack_counts: BTreeMap<u64, u32>,
    /// Where the current segment's stored versions are.
    current: Vec<Run>,
    stored_blocks: u64,
    packs_written: u64,
    /// Changed blocks below this one are already stored (a resumed push).
    resume_at: u64,
    pub stall_after_packs: Option<u64>,
}

impl<'a> PushWriter<'a> {
    pub fn new(
        archive: &'a Archive,
        catalog: &Catalog,
        seq: u64,
        pack_bytes: u64,
        size_bytes: u64,
        base: Option<&SnapshotRoot>,
    ) -> Self {
        let slot =
            pack::SLOT_CHECKSUM_BYTES + pack::TABLE_ENTRY_BYTES + u64::from(catalog.block_bytes);
        PushWriter {
            archive,
            seq,
            block_bytes: catalog.block_bytes,
            segment_blocks: catalog.segment_blocks,
            size_bytes,
            slots_per_pack: (pack_bytes.saturating_sub(pack::HEADER_BYTES + pack::FOOTER_BYTES)
                / slot)
                .max(1) as usize,
            pack: None,
            pages: PageFiller::default(),
            done: Vec::new(),
            pack_counts: base
                .map(|b| b.packs.iter().copied().collect())
                .unwrap_or_default(),
            current: Vec::new(),
            stored_blocks: 0,
            packs_written: 0,
            resume_at: 0,
            stall_after_packs: None,
        }
    }

    /// Takes up where an interrupted push of this snapshot stopped: its
    /// segments done, and the versions it stored of the segment it was in
    /// (from the slot tables of its last packs). Returns its packs.
    pub fn resume(&mut self, catalog: &Catalog) -> Result<u64> {
        let partial = catalog
            .partial
            .as_ref()
            .expect("a push has its partial record");
        if !partial.packs.is_empty() {
            self.done = partial.pages_done.iter().map(|p| p.map(page_ref)).collect();
            self.pack_counts = partial.pack_counts.iter().copied().collect();
        }
        self.resume_at = partial.next_block;
        let segment_start = self.done.len() as u64 * u64::from(self.segment_blocks);
        // Packs are filled in block order: only the last few hold blocks of
        // the segment the push was in; the rest are in pages already.
        let mut older_are_done = false;
        for &id in partial.packs.iter().rev() {
            let record = ledger::pack(catalog, id).expect("a partial push's packs are recorded");
            self.stored_blocks += u64::from(record.slots);
            if older_are_done {
                continue;
            }
            let (_, table) = self
                .archive
                .pack_table(id, self.block_bytes, record.slots)?;
            for (slot, entry) in table.iter().enumerate().rev() {
                if entry.block >= segment_start {
                    self.current.push(Run {
                        first_block: entry.block,
                        pack: id,
                        first_slot: slot as u32,
                        blocks: 1,
                    });
                }
            }
            older_are_done = table.first().is_some_and(|e| e.block < segment_start);
        }
        self.current.reverse();
        Ok(partial.packs.len() as u64)
    }

    /// Stores what `plan` says changed, segment by segment.
    pub fn store(
        &mut self,
        catalog: &mut Catalog,
        volume: &Volume,
        plan: &Plan,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let bs = u64::from(self.block_bytes);
        let blocks = self.size_bytes.div_ceil(bs);
        let total = ranges_blocks(&plan.with_data) * bs;
        let mut done_bytes = ranges_blocks(&clip(&plan.with_data, 0..self.resume_at)) * bs;
        for segment in
            self.done.len() as u64..SnapshotRoot::segments_for(blocks, self.segment_blocks)
        {
            let start = segment * u64::from(self.segment_blocks);
            let range = start..(start + u64::from(self.segment_blocks)).min(blocks);
            let changed = clip(&plan.changed, range.clone());
            if let Some(kept) = unchanged_page(plan, segment, &range, &changed) {
                self.done.push(kept);
                continue;
            }
            for (a, b) in clip(&plan.with_data, range.clone()) {
                self.store_blocks(catalog, volume, a, b)?;
                done_bytes += (b - a) * bs;
                progress(done_bytes.min(total), total);
            }
            let base = self.base_runs(plan, segment)?;
            count_packs(&mut self.pack_counts, &base, false);
            let base = clip_runs(base, &range);
            let runs = apply_changes(
                &base,
                &changed,
                &coalesce(std::mem::take(&mut self.current)),
            );
            count_packs(&mut self.pack_counts, &runs, true);
            let page = self.pages.add(catalog, segment, &runs);
            self.done.push(page);
            if self.pages.bytes.len() >= PAGES_OBJECT_BYTES {
                self.pages.flush(self.archive, catalog, self.seq)?;
            }
        }
        Ok(())
    }

    /// The base's runs of segment `segment` (none without a base).
    fn base_runs(&self, plan: &Plan, segment: u64) -> Result<Vec<Run>> {
        let Some(root) = &plan.base_root else {
            return Ok(Vec::new());
        };
        let Some(at) = root.page(segment) else {
            return Ok(Vec::new());
        };
        self.archive.page(at, segment, root.segment_range(segment))
    }

    fn store_blocks(
        &mut self,
        catalog: &mut Catalog,
        volume: &Volume,
        a: u64,
        b: u64,
    ) -> Result<()> {
        let bs = u64::from(self.block_bytes);
        let mut buf = vec![0u8; self.block_bytes as usize];
        for block in a.max(self.resume_at)..b {
            let len = bs.min(self.size_bytes.saturating_sub(block * bs)) as usize;
            buf.fill(0);
            volume.read_at(&mut buf[..len], block * bs)?;
            if buf.iter().all(|&x| x == 0) {
                continue; // Zeros are stored as a hole.
            }
            if self.pack.is_none() {
                let id = ledger::allocate_pack(catalog);
                let capacity = self.slots_per_pack as u32;
                let writer = self.archive.pack_writer(id, self.block_bytes, capacity)?;
                self.pack = Some((writer, block));
            }
            let (pack, last) = self.pack.as_mut().expect("a pack is being filled");
            let (id, slot) = (pack.id(), pack.slots());
            pack.push(
                SlotEntry {
                    block,
                    origin: (id, slot),
                },
                &buf,
            )?;
            *last = block;
            self.current.push(Run {
                first_block: block,
                pack: id,
                first_slot: slot,
                blocks: 1,
            });
            if pack.is_full() {
                self.flush_pack(catalog, block + 1)?;
            }
        }
        Ok(())
    }

    /// Stores the pack being filled and commits it with the segments done,
    /// so that a push that stops after this goes on from `next_block`.
    fn flush_pack(&mut self, catalog: &mut Catalog, next_block: u64) -> Result<()> {
        let Some((pack, _)) = self.pack.take() else {
            return Ok(());
        };
        let (id, slots) = (pack.id(), pack.slots());
        let object_bytes = pack.finish()?;
        ledger::add_pack(
            catalog,
            PackRecord {
                id,
                owner_seq: self.seq,
                first_seq: self.seq,
                last_seq: self.seq,
                slots,
                object_bytes,
            },
        );
        self.stored_blocks += u64::from(slots);
        self.packs_written += 1;
        catalog.totals.pushed_bytes += object_bytes;
        // The segments recorded below must name stored pages only.
        self.pages.flush(self.archive, catalog, self.seq)?;
        let partial = partial_of(catalog);
        partial.packs.push(id);
        partial.next_block = next_block;
        partial.pages_done = self
            .done
            .iter()
            .map(|p| p.map(|p| (p.object, p.offset, p.len)))
            .collect();
        partial.pack_counts = self.pack_counts.iter().map(|(&id, &n)| (id, n)).collect();
        self.archive.commit(catalog)?;
        self.stall_if_asked();
        Ok(())
    }

    fn stall_if_asked(&self) {
        if self.stall_after_packs == Some(self.packs_written) {
            eprintln!(
                "grove-archive: push stalled after {} packs (test hook)",
                self.packs_written
            );
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }

    /// Stores the last, partly filled pack and the last pages.
    pub fn finish(mut self, catalog: &mut Catalog, plan: &Plan) -> Result<Written> {
        let next = self
            .pack
            .as_ref()
            .map_or(self.resume_at, |(_, last)| last + 1);
        self.flush_pack(catalog, next)?;
        self.pages.flush(self.archive, catalog, self.seq)?;
        // The base's segments past a volume that shrank are dropped (here,
        // not in the counts a resumed push starts from).
        let mut counts = self.pack_counts.clone();
        for segment in self.done.len() as u64..plan.base_root.as_ref().map_or(0, |b| b.segments()) {
            count_packs(&mut counts, &self.base_runs(plan, segment)?, false);
        }
        Ok(Written {
            root: SnapshotRoot {
                seq: self.seq,
                block_bytes: self.block_bytes,
                size_bytes: self.size_bytes,
                segment_blocks: self.segment_blocks,
                pages: self.done,
                packs: counts.into_iter().collect(),
            },
            stored_blocks: self.stored_blocks,
            packs_written: self.packs_written,
            page_bytes: self.pages.written_bytes,
        })
    }
}

/// The base's page of `segment`, kept as it is (Some(None): all holes),
/// when nothing in it changed and it covers the same blocks (a volume that
/// grew or shrank changes its last).
fn unchanged_page(
    plan: &Plan,
    segment: u64,
    range: &std::ops::Range<u64>,
    changed: &[(u64, u64)],
) -> Option<Option<PageRef>> {
    if !changed.is_empty() {
        return None;
    }
    let Some(root) = &plan.base_root else {
        return Some(None);
    };
    if segment >= root.segments() {
        return Some(None);
    }
    (root.segment_range(segment) == *range).then(|| root.page(segment))
}

/// Counts each pack `runs` address once more (`add`) or once less.
fn count_packs(counts: &mut BTreeMap<u64, u32>, runs: &[Run], add: bool) {
    let mut packs: Vec<u64> = runs.iter().map(|r| r.pack).collect();
    packs.sort_unstable();
    packs.dedup();
    for pack in packs {
        let count = counts.entry(pack).or_insert(0);
        if add {
            *count += 1;
        } else {
            assert!(
                *count > 0,
                "pack {pack} is counted for the page that addresses it"
            );
            *count -= 1;
            if *count == 0 {
                counts.remove(&pack);
            }
        }
    }
}

/// Pages being gathered into one page object.
#[derive(Default)]
struct PageFiller {
    id: Option<u64>,
    bytes: Vec<u8>,
    written_bytes: u64,
}

impl PageFiller {
    /// The page of `runs`: a new page in the object being filled, or none
    /// for a segment of holes.
    fn add(&mut self, catalog: &mut Catalog, segment: u64, runs: &[Run]) -> Option<PageRef> {
        if runs.is_empty() {
            return None;
        }
        let id = *self
            .id
            .get_or_insert_with(|| ledger::allocate_pack(catalog));
        let encoded = page::encode(segment, runs);
        let page = PageRef {
            object: id,
            offset: self.bytes.len() as u32,
            len: encoded.len() as u32,
        };
        self.bytes.extend_from_slice(&encoded);
        Some(page)
    }

    /// Stores the page object being filled, recorded as the push's.
    fn flush(&mut self, archive: &Archive, catalog: &mut Catalog, seq: u64) -> Result<()> {
        let Some(id) = self.id.take() else {
            return Ok(());
        };
        archive.put_pages(id, &self.bytes)?;
        let object_bytes = self.bytes.len() as u64;
        ledger::add_pages(
            catalog,
            PagesRecord {
                id,
                first_seq: seq,
                last_seq: seq,
                object_bytes,
            },
        );
        partial_of(catalog).pages.push(id);
        catalog.totals.index_bytes += object_bytes;
        self.written_bytes += object_bytes;
        self.bytes.clear();
        Ok(())
    }
}

fn partial_of(catalog: &mut Catalog) -> &mut PartialPush {
    catalog
        .partial
        .as_mut()
        .expect("a push has its partial record")
}

fn page_ref((object, offset, len): (u64, u32, u32)) -> PageRef {
    PageRef {
        object,
        offset,
        len,
    }
}

/// The parts of sorted, disjoint block ranges inside `range`.
fn clip(ranges: &[(u64, u64)], range: std::ops::Range<u64>) -> Vec<(u64, u64)> {
    let first = ranges.partition_point(|&(_, b)| b <= range.start);
    ranges[first..]
        .iter()
        .take_while(|&&(a, _)| a < range.end)
        .map(|&(a, b)| (a.max(range.start), b.min(range.end)))
        .filter(|(a, b)| a < b)
        .collect()
}

/// Runs cut to `range` (a volume that shrank).
fn clip_runs(runs: Vec<Run>, range: &std::ops::Range<u64>) -> Vec<Run> {
    runs.into_iter()
        .filter(|r| r.first_block < range.end)
        .map(|mut r| {
            r.blocks = r.blocks.min((range.end - r.first_block) as u32);
            r
        })
        .collect()
}
