//! `grove check`: verifies every piece of metadata and how the pieces agree.
//!
//! Errors are states the consistency contract rules out (a share count
//! lower than the references to a block, which would let one owner write a
//! block others read; a reachable block marked free; a birth newer than the
//! entry above it; wrong space accounting; damaged metadata). Warnings are
//! harmless leftovers that a crash may legitimately leave (a leaked block, a
//! count higher than its references, a torn spare superblock); `--repair`
//! fixes those and the map disagreements, and never changes what a volume
//! reads.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::alloc::BlockUse;
use crate::error::{Error, ErrorKind, Result};
use crate::format::group::{NIBBLE_ALLOCATED, NIBBLE_META};
use crate::format::node::NodeKind;
use crate::format::superblock::{SlotProblem, Superblock, SUPERBLOCK_LEN};
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};

/// What a check found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckReport {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    /// Metadata and data blocks whose references were verified.
    pub blocks_checked: u64,
    pub elapsed_ms: u64,
    /// What --repair changed, if it ran.
    pub repaired: Vec<String>,
    /// Blocks allocated that nothing uses: space lost until --repair,
    /// though no data is at risk. Also among the warnings.
    #[serde(default)]
    pub leaked_blocks: u64,
    /// Blocks whose share count is higher than their references: their
    /// space would never come back. Also among the warnings.
    #[serde(default)]
    pub over_counted_blocks: u64,
}

impl CheckReport {
    /// No damage: every byte of every volume reads as it should.
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }

    /// Whether space is lost: leaked or over-counted blocks, which `grove
    /// check` treats as an alarm (exit 1) even with every byte safe.
    pub fn loses_space(&self) -> bool {
        self.leaked_blocks > 0 || self.over_counted_blocks > 0
    }

    pub fn blocks_per_second(&self) -> u64 {
        self.blocks_checked * 1000 / self.elapsed_ms.max(1)
    }
}

/// Warns that `blocks` blocks `what` (the rest of the sentence), when there
/// are any; returns the count for the report's own field.
fn warn_of_blocks(warnings: &mut Vec<String>, blocks: usize, what: &str) -> u64 {
    if blocks > 0 {
        warnings.push(format!("{blocks} blocks {what}"));
    }
    blocks as u64
}

/// Errors listed one by one before the rest are only counted: a badly
/// damaged pool would otherwise print millions of lines.
const REPORT_LINES_MAX: usize = 100;

/// Blocks of the store whose references one pass of the walk counts: 4
/// bytes each, so at most 64 MiB however large the pool. A larger store
/// is checked in several passes over its metadata, one window each.
pub const CHECK_WINDOW_BLOCKS: u64 = 16 * 1024 * 1024;

/// What the walk found pointing at one block.
#[derive(Default, Clone, Copy)]
struct BlockUseSeen {
    /// Distinct parent entries (or volume records) that point here.
    references: u32,
    is_meta: bool,
}

/// References to the blocks [first, first + slots.len()), and nothing
/// else: the window of the store this pass checks. A slot packs the
/// reference count (low 31 bits) and whether a node points here as at
/// metadata (the top bit); 0 is a block nothing points at.
struct Tally {
    first: u64,
    slots: Vec<u32>,
}

const TALLY_META_BIT: u32 = 1 << 31;

impl Tally {
    fn new(window: std::ops::Range<u64>) -> Tally {
        assert!(window.start < window.end);
        assert!(window.end - window.start <= CHECK_WINDOW_BLOCKS);
        Tally {
            first: window.start,
            slots: vec![0; (window.end - window.start) as usize],
        }
    }

    /// One more reference to `addr`, if it lies in the window.
    fn note(&mut self, addr: u64, is_meta: bool) {
        let Some(offset) = addr.checked_sub(self.first) else {
            return;
        };
        let Some(slot) = self.slots.get_mut(offset as usize) else {
            return;
        };
        let references = (*slot & !TALLY_META_BIT)
            .saturating_add(1)
            .min(!TALLY_META_BIT);
        let meta = (*slot & TALLY_META_BIT) | if is_meta { TALLY_META_BIT } else { 0 };
        *slot = references | meta;
    }

    fn get(&self, addr: u64) -> Option<BlockUseSeen> {
        let slot = *self.slots.get(addr.checked_sub(self.first)? as usize)?;
        (slot != 0).then_some(BlockUseSeen {
            references: slot & !TALLY_META_BIT,
            is_meta: slot & TALLY_META_BIT != 0,
        })
    }

    fn contains(&self, addr: u64) -> bool {
        self.get(addr).is_some()
    }

    fn seen(&self) -> impl Iterator<Item = (u64, BlockUseSeen)> + '_ {
        (0..self.slots.len() as u64)
            .filter_map(|i| Some((self.first + i, self.get(self.first + i)?)))
    }

    fn window(&self) -> std::ops::Range<u64> {
        self.first..self.first + self.slots.len() as u64
    }
}

struct Walk<'c> {
    /// Set from another thread to stop the check (a daemon shutting
    /// down): the walk then skips the rest, and the check returns an
    /// error before it repairs anything.
    cancel: &'c AtomicBool,
    tally: Tally,
    /// Later passes walk again only to count: their errors were reported.
    quiet: bool,
    /// Table nodes already walked.
    walked: HashSet<u64>,
    /// Data mapped below a node, and its newest birth, once walked.
    counts: HashMap<u64, Counts>,
    errors: Vec<String>,
    suppressed_errors: u64,
}

impl Walk<'_> {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// An error the walk found: later passes walk again and would repeat
    /// it, so only the first reports it.
    fn error(&mut self, message: String) {
        if !self.quiet {
            self.record(message);
        }
    }

    /// An error reported whatever the pass: one found in this window's
    /// own blocks, which no other pass sees.
    fn record(&mut self, message: String) {
        if self.errors.len() < REPORT_LINES_MAX {
            self.errors.push(message);
        } else {
            self.suppressed_errors += 1;
        }
    }

    /// Notes a parent entry (or volume record) pointing at `addr`.
    fn reference(&mut self, addr: BlockAddr, is_meta: bool) {
        self.tally.note(addr.0, is_meta);
    }
}

/// Data blocks a subtree maps, and the newest birth in it.
#[derive(Default, Clone, Copy)]
struct Counts {
    referenced: u64,
    newest_birth: u64,
}

/// What a check found that `--repair` can fix.
#[derive(Default)]
struct Findings {
    superblock_damage: bool,
    /// Blocks counted with fewer references than they have: (block,
    /// references, counted). An error: one owner could write in place.
    low_counts: Vec<(u64, u32, u32)>,
    /// Blocks counted with more: (block, references). Space held back.
    high_counts: Vec<(u64, u32)>,
    leaks: Vec<u64>,
    /// Reachable blocks the map says are free, or of the wrong kind:
    /// (block, is metadata).
    unmarked: Vec<(u64, bool)>,
    wrong_kind: Vec<(u64, bool)>,
    accounting_fixes: Vec<(VolumeId, Counts)>,
}

impl State {
    /// Verifies all metadata; with `repair`, fixes leaks, map disagreements,
    /// share counts and space accounting, committing as it goes.
    pub fn check(&mut self, repair: bool, cancel: &AtomicBool) -> Result<CheckReport> {
        self.check_in_windows(repair, CHECK_WINDOW_BLOCKS, cancel)
    }

    /// `check`, counting references for `window_blocks` blocks of the
    /// store at a time (tests use small windows to cover several passes).
    pub(crate) fn check_in_windows(
        &mut self,
        repair: bool,
        window_blocks: u64,
        cancel: &AtomicBool,
    ) -> Result<CheckReport> {
        let started = Instant::now();
        let mut report = CheckReport::default();
        let mut findings = Findings::default();
        report.warnings.extend(self.open_warnings().iter().cloned());
        let warnings_before = report.warnings.len();
        self.check_superblocks(&mut report);
        // Any superblock problem (found at open or now) is mended by writing
        // both slots again, which the caller does after a repair.
        findings.superblock_damage =
            !self.open_warnings().is_empty() || report.warnings.len() > warnings_before;
        let data_start = self.superblock().data_start.0;
        let store_end = self.space_map().alloc().store_end().max(data_start + 1);
        let window_blocks = window_blocks.clamp(1, CHECK_WINDOW_BLOCKS);
        let mut walk = Walk {
            cancel,
            tally: Tally::new(data_start..(data_start + window_blocks).min(store_end)),
            quiet: false,
            walked: HashSet::new(),
            counts: HashMap::new(),
            errors: Vec::new(),
            suppressed_errors: 0,
        };
        // The journal holds exactly what was committed since the checkpoint.
        if let Err(e) = self.verify_journal() {
            walk.error(e.to_string());
        }
        let counts = self.walk_everything(&mut walk);
        self.walk_remaining_windows(
            &mut walk,
            &mut report,
            &mut findings,
            window_blocks,
            store_end,
        )?;
        walk.quiet = false;
        self.report_share_counts(&mut walk, &mut report, &mut findings);
        self.report_maps(&mut walk, &mut report, &findings);
        self.compare_accounting(&counts, &mut walk, &mut findings);
        report.errors = self.walk_errors(walk);
        if repair {
            self.repair(&findings, &mut report)?;
        }
        report.elapsed_ms = started.elapsed().as_millis() as u64;
        Ok(report)
    }

    /// Data blocks of this window whose place on the device is lost (a
    /// RADOS object missing or cut short): lost_data.rs.
    fn report_lost_data(&self, walk: &mut Walk) {
        let data = walk
            .tally
            .seen()
            .filter(|(_, seen)| !seen.is_meta)
            .map(|(addr, _)| addr);
        let device = self.device();
        let lines =
            crate::lost_data::lost_pieces_under(&**device, data, self.geometry().block_bytes())
                .unwrap_or_else(|e| {
                    vec![format!(
                        "cannot check where the data lies on {}: {e}",
                        device.describe()
                    )]
                });
        for line in lines {
            walk.record(line);
        }
    }

    /// Tallies the window the first walk counted, then walks everything
    /// again for each next window up to `store_end`, counting only there:
    /// one window's counts at a time keep a check of a large store in
    /// bounded memory.
    fn walk_remaining_windows(
        &mut self,
        walk: &mut Walk,
        report: &mut CheckReport,
        findings: &mut Findings,
        window_blocks: u64,
        store_end: u64,
    ) -> Result<()> {
        loop {
            // A safe point: nothing is repaired before the walks are done.
            if walk.cancelled() {
                return Err(Error::new(
                    ErrorKind::Busy,
                    "the check was cancelled before it finished; nothing was repaired",
                ));
            }
            self.tally_share_counts(walk, findings);
            self.tally_maps(walk, findings);
            self.report_lost_data(walk);
            report.blocks_checked += walk.tally.seen().count() as u64;
            let next = walk.tally.window().end;
            if next >= store_end {
                return Ok(());
            }
            // The next window: the same walk again, counting only there.
            walk.tally = Tally::new(next..(next + window_blocks).min(store_end));
            walk.quiet = true;
            walk.walked.clear();
            walk.counts.clear();
            self.walk_everything(walk);
        }
    }

    /// The walk's errors for the report, with the frees this session found
    /// already free and how many errors were left out.
    fn walk_errors(&self, mut walk: Walk) -> Vec<String> {
        if self.space_map().alloc().inconsistent_frees() > 0 {
            walk.error(format!(
                "{} frees this session found their block already free (a damaged tree)",
                self.space_map().alloc().inconsistent_frees()
            ));
        }
        if walk.suppressed_errors > 0 {
            walk.errors
                .push(format!("... and {} more errors", walk.suppressed_errors));
        }
        walk.errors
    }

    /// Walks the volume table and every tree, live or being reclaimed,
    /// counting references; returns each volume's data and newest birth.
    fn walk_everything(&mut self, walk: &mut Walk) -> HashMap<VolumeId, Counts> {
        if self.superblock().volume_table_height > 0 {
            let root = self.superblock().volume_table_root;
            walk.reference(root, true);
            self.walk_table(root, self.superblock().volume_table_height - 1, walk);
        }
        let trees: Vec<(VolumeId, BlockAddr, u8, String)> = self
            .volume_table()
            .live_records()
            .chain(
                self.volume_table()
                    .removed_records()
                    .filter(|r| !r.root.is_none()),
            )
            .map(|r| (r.id, r.root, r.height, r.name.clone()))
            .collect();
        let mut counts = HashMap::new();
        for (id, root, height, name) in trees {
            walk.reference(root, true);
            counts.insert(id, self.walk_volume(root, height - 1, walk, &name));
        }
        counts
    }

    /// Exact sharing: every block's count is its references, less one.
    /// Collects the disagreements in this pass's window.
    fn tally_share_counts(&self, walk: &Walk, findings: &mut Findings) {
        for (addr, seen) in walk.tally.seen() {
            let counted = self
                .space_map()
                .shares()
                .extra(BlockAddr(addr))
                .saturating_add(1);
            if counted < seen.references {
                findings.low_counts.push((addr, seen.references, counted));
            } else if counted > seen.references {
                findings.high_counts.push((addr, seen.references));
            }
        }
        let window = walk.tally.window();
        for addr in self.space_map().shares().shared_blocks() {
            if window.contains(&addr) && !walk.tally.contains(addr) {
                findings.high_counts.push((addr, 0));
            }
        }
    }

    fn report_share_counts(
        &self,
        walk: &mut Walk,
        report: &mut CheckReport,
        findings: &mut Findings,
    ) {
        findings.low_counts.sort_unstable();
        for &(addr, references, counted) in &findings.low_counts {
            walk.error(format!(
                "block {addr} is referenced {references} times but counted {counted}: one owner could change what others read"
            ));
        }
        report.over_counted_blocks = warn_of_blocks(
            &mut report.warnings,
            findings.high_counts.len(),
            "are counted with more references than they have (space held back; --repair corrects the counts)",
        );
    }

    /// The allocation map against reachability, in this pass's window.
    fn tally_maps(&self, walk: &Walk, findings: &mut Findings) {
        let store_end = self.space_map().alloc().store_end();
        let window = walk.tally.window();
        for group in 0..self.space_map().alloc().group_count() {
            let start = self.space_map().alloc().group_start(group).0;
            let end = (start + self.superblock().group_blocks).min(store_end);
            let first = (start + crate::format::group::GROUP_HEADER_BLOCKS).max(window.start);
            for addr in first..end.min(window.end) {
                let nibble = self
                    .space_map()
                    .alloc()
                    .nibble(BlockAddr(addr))
                    .unwrap_or(0);
                let allocated = nibble & NIBBLE_ALLOCATED != 0;
                match (walk.tally.get(addr), allocated) {
                    // A write in flight holds it, and maps it shortly.
                    (None, true) if self.space_map().alloc().is_reserved(BlockAddr(addr)) => {}
                    (None, true) => findings.leaks.push(addr),
                    (Some(seen), false) => findings.unmarked.push((addr, seen.is_meta)),
                    (Some(seen), true) if seen.is_meta != (nibble & NIBBLE_META != 0) => {
                        findings.wrong_kind.push((addr, seen.is_meta))
                    }
                    _ => {}
                }
            }
        }
    }

    fn report_maps(&self, walk: &mut Walk, report: &mut CheckReport, findings: &Findings) {
        for &(addr, _) in &findings.unmarked {
            walk.error(format!(
                "block {addr} is in use but the allocation map says it is free"
            ));
        }
        report.leaked_blocks = warn_of_blocks(
            &mut report.warnings,
            findings.leaks.len(),
            "are allocated but used by nothing (leaked; --repair frees them)",
        );
        warn_of_blocks(
            &mut report.warnings,
            findings.wrong_kind.len(),
            "are marked in the allocation map as the wrong kind (data/metadata)",
        );
    }

    /// Space accounting in the volume table, and births against the pool's.
    fn compare_accounting(
        &self,
        counts: &HashMap<VolumeId, Counts>,
        walk: &mut Walk,
        findings: &mut Findings,
    ) {
        let block_bytes = self.geometry().block_bytes();
        let generation = self.superblock().birth_generation;
        for record in self.volume_table().live_records() {
            let actual = counts[&record.id];
            if actual.referenced != record.referenced_blocks {
                walk.error(format!(
                    "volume {:?} records {} referenced bytes, but its tree has {}",
                    record.name,
                    record.referenced_blocks * block_bytes,
                    actual.referenced * block_bytes,
                ));
                findings.accounting_fixes.push((record.id, actual));
            }
            if actual.newest_birth > generation {
                walk.error(format!(
                    "volume {:?} holds a mapping born in generation {}, after the pool's {generation}",
                    record.name, actual.newest_birth
                ));
            }
        }
    }

    /// Fixes what the check found, never changing what a volume reads. Each
    /// fix may add to the next commit; one that grows past what a
    /// transaction may hold is committed on the way, so a repair of any
    /// size fits the journal.
    fn repair(&mut self, findings: &Findings, report: &mut CheckReport) -> Result<()> {
        for &addr in &findings.leaks {
            self.space_map_mut().free_unreferenced(BlockAddr(addr));
            self.commit_if_large_during_repair()?;
        }
        if !findings.leaks.is_empty() {
            report
                .repaired
                .push(format!("freed {} leaked blocks", findings.leaks.len()));
        }
        let remarked = findings.unmarked.iter().chain(&findings.wrong_kind);
        for &(addr, is_meta) in remarked {
            let usage = if is_meta {
                BlockUse::Meta
            } else {
                BlockUse::Data
            };
            self.space_map_mut().mark_in_use(BlockAddr(addr), usage);
            self.commit_if_large_during_repair()?;
        }
        let remarked_count = findings.unmarked.len() + findings.wrong_kind.len();
        if remarked_count > 0 {
            report.repaired.push(format!(
                "marked {remarked_count} blocks in use as allocated with the right kind"
            ));
        }
        for (id, actual) in &findings.accounting_fixes {
            self.set_accounting(*id, actual.referenced);
            self.commit_if_large_during_repair()?;
        }
        let count_fixes = findings
            .low_counts
            .iter()
            .map(|&(addr, references, _)| (addr, references))
            .chain(findings.high_counts.iter().copied());
        for (addr, references) in count_fixes {
            self.space_map_mut()
                .set_share_count(BlockAddr(addr), references.saturating_sub(1));
            self.commit_if_large_during_repair()?;
        }
        let count_fix_count = findings.low_counts.len() + findings.high_counts.len();
        if count_fix_count > 0 {
            report.repaired.push(format!(
                "corrected the share counts of {count_fix_count} blocks"
            ));
        }
        if findings.superblock_damage {
            report
                .repaired
                .push("rewrote both superblock slots".to_string());
        }
        if !findings.accounting_fixes.is_empty() {
            report.repaired.push(format!(
                "corrected the space accounting of {} volumes",
                findings.accounting_fixes.len()
            ));
        }
        Ok(())
    }

    fn check_superblocks(&self, report: &mut CheckReport) {
        let block = u64::from(self.geometry().block_size_bytes);
        for slot in 0..2u64 {
            let mut buf = vec![0u8; block as usize];
            if let Err(e) = self.device().read_at(&mut buf, slot * block) {
                report
                    .errors
                    .push(format!("cannot read superblock slot {slot}: {e}"));
                continue;
            }
            // The checksum covers the first SUPERBLOCK_LEN bytes; the rest of
            // the block must be zero, so damage there is found too.
            if buf[SUPERBLOCK_LEN..].iter().any(|&b| b != 0) {
                report.warnings.push(format!(
                    "superblock slot {slot} has non-zero bytes after its end (damage); --repair rewrites it"
                ));
            }
            match Superblock::decode(&buf) {
                Ok(sb) if sb.generation == self.superblock().generation || sb.generation.saturating_add(1) == self.superblock().generation => {}
                Ok(sb) => report.warnings.push(format!(
                    "superblock slot {slot} has generation {}, the current one is {}",
                    sb.generation, self.superblock().generation
                )),
                Err(SlotProblem::NewerVersion(v)) => {
                    report.errors.push(format!("superblock slot {slot} claims format version {v}"))
                }
                // A crash while writing the spare slot tears it; the next
                // checkpoint writes that slot again.
                Err(problem) => report.warnings.push(format!(
                    "superblock slot {slot} (the spare) is unusable ({problem:?}); the next checkpoint rewrites it"
                )),
            }
        }
    }

    fn walk_table(&mut self, addr: BlockAddr, level: u8, walk: &mut Walk) {
        if walk.cancelled() || !walk.walked.insert(addr.0) {
            return;
        }
        let entries = match self.load_node_for_check(addr, NodeKind::VolumeTable, level) {
            Ok(entries) => entries,
            Err(e) => return walk.error(format!("volume table: {e}")),
        };
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            walk.reference(entry.addr(), true);
            if level > 0 {
                self.walk_table(entry.addr(), level - 1, walk);
            }
        }
    }

    /// Walks a volume subtree and returns the data it maps and its newest
    /// birth. Results are memoized per node, so 100 snapshots sharing one
    /// tree cost about what one tree costs; a node's entries count as
    /// references once, however often it is reached.
    fn walk_volume(&mut self, addr: BlockAddr, level: u8, walk: &mut Walk, volume: &str) -> Counts {
        if let Some(counts) = walk.counts.get(&addr.0) {
            return *counts;
        }
        if walk.cancelled() {
            return Counts::default();
        }
        let entries = match self.load_node_for_check(addr, NodeKind::VolumeData, level) {
            Ok(entries) => entries,
            Err(e) => {
                walk.error(format!("volume {volume:?}: {e}"));
                walk.counts.insert(addr.0, Counts::default());
                return Counts::default();
            }
        };
        let mut counts = Counts::default();
        for entry in entries.iter() {
            counts.newest_birth = counts.newest_birth.max(entry.birth());
            if entry.is_empty() {
                continue;
            }
            walk.reference(entry.addr(), level > 0);
            if level == 0 {
                counts.referenced += 1;
                continue;
            }
            let child = self.walk_volume(entry.addr(), level - 1, walk, volume);
            counts.referenced += child.referenced;
            if child.newest_birth > entry.birth() {
                walk.error(format!(
                    "volume {volume:?}: radix node at {addr} entry points at {} born in generation {}, but holds a mapping born in {}",
                    entry.addr(),
                    entry.birth(),
                    child.newest_birth
                ));
            }
        }
        walk.counts.insert(addr.0, counts);
        counts
    }
}
