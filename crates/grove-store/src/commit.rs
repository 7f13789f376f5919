//! Commit: the changes made under the state lock become one journal
//! transaction (images of dirty nodes and record blocks, allocation
//! extents, share-count runs, the roots). `prepare_commit` builds it under
//! the lock and does the bookkeeping as if it were durable; `CommitIo::run`
//! writes it with the lock let go (data flush, transaction, its flush,
//! images to their homes); `finish_commit` takes the outcome back under the
//! lock. The journal's format is in `format/journal.rs`, its space in
//! `journal.rs`; checkpoint and replay are in `checkpoint.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::device::BlockDevice;
use crate::error::{Error, ErrorKind, Result};
use crate::format::journal::{AllocChange, AllocExtent, Descriptor, Roots, ShareRun};
use crate::io::{flush, InFlightCommit};
use crate::state::State;
use crate::types::BlockAddr;

/// Which data a commit flushes before its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DataFlush {
    /// Every write landed so far: what a client's flush, a snapshot and
    /// everything a caller waits on to be durable need.
    All,
    /// Only if the transaction maps blocks whose data is not flushed yet
    /// (ordered mode); writes in place are left to the next flush. For
    /// background commits (removals, reclaim) beside clients that write:
    /// their commit needs no client data, and a data flush would carry
    /// every write the clients have not flushed.
    IfMapped,
}

/// What [`State::prepare_commit`] leaves for the pool to do.
pub(crate) enum PreparedCommit {
    /// Nothing to write, or written already: the blocks freed.
    Done(Vec<BlockAddr>),
    /// I/O to run (without the state lock if the caller likes), then
    /// [`State::finish_commit`].
    Io(CommitIo),
}

/// The I/O of a prepared commit, which needs no state: the data flush
/// (ordered mode: data before the transaction that maps it), the
/// transaction and its flush, then the images written to their homes.
pub(crate) struct CommitIo {
    device: Arc<dyn BlockDevice>,
    block_bytes: usize,
    flush_data: bool,
    /// The reserved transaction: byte offset, then descriptor and images.
    transaction: Option<(u64, Vec<u8>)>,
    homes: Vec<BlockAddr>,
}

/// How a commit's I/O went.
pub(crate) struct CommitIoOutcome {
    result: Result<()>,
    /// The journal write was tried (its sequence is then used up).
    journal_attempted: bool,
    homes_written: Vec<BlockAddr>,
}

impl CommitIo {
    pub(crate) fn run(self) -> CommitIoOutcome {
        let mut outcome = CommitIoOutcome {
            result: Ok(()),
            journal_attempted: false,
            homes_written: Vec::new(),
        };
        if self.flush_data {
            outcome.result = flush(self.device.as_ref(), "data");
            if outcome.result.is_err() {
                return outcome;
            }
        }
        let Some((offset, bytes)) = &self.transaction else {
            return outcome;
        };
        outcome.journal_attempted = true;
        outcome.result = crate::journal::write_transaction(self.device.as_ref(), *offset, bytes);
        if outcome.result.is_err() {
            return outcome;
        }
        // The images follow the descriptor blocks at the end of the bytes.
        let images_at = bytes.len() - self.homes.len() * self.block_bytes;
        let writes: Vec<(u64, &[u8])> = self
            .homes
            .iter()
            .enumerate()
            .map(|(i, home)| {
                let image = &bytes[images_at + i * self.block_bytes..][..self.block_bytes];
                (home.0 * self.block_bytes as u64, image)
            })
            .collect();
        // The transaction is durable: the homes may land in any order.
        let results = self.device.write_each_at(&writes);
        for (home, result) in self.homes.iter().zip(results) {
            if result.is_ok() {
                outcome.homes_written.push(*home);
            }
        }
        outcome
    }

    /// The data of a commit that failed before its I/O ran.
    pub(crate) fn failed(error: Error) -> CommitIoOutcome {
        CommitIoOutcome {
            result: Err(error),
            journal_attempted: false,
            homes_written: Vec::new(),
        }
    }
}

impl State {
    pub fn has_changes(&self) -> bool {
        self.nodes().dirty_count() > 0
            || self.volume_table().has_dirty()
            || self.space_map().alloc().has_changes()
            || self.space_map().shares().change_count() > 0
            || self.committed_roots().birth_generation != self.superblock().birth_generation
    }

    /// Dirty metadata that the next commit must write; the write path
    /// commits on its own once this passes `auto_commit_blocks`, so that
    /// a transaction always fits in the journal.
    ///
    /// Images count a block each; allocation changes and share-count changes
    /// count what they take in the descriptor (each change one extent or
    /// run at most), so a burst of allocating writes does not commit long
    /// before the journal needs it.
    pub fn pending_commit_blocks(&self) -> u64 {
        let images = self.nodes().dirty_count() + self.volume_table().dirty_count();
        let descriptor_bytes = Descriptor::encoded_len(
            images,
            self.space_map().alloc().change_count(),
            self.space_map().shares().run_count(),
        );
        (images + descriptor_bytes.div_ceil(self.geometry().block_size_bytes as usize)) as u64
    }

    /// Commits in the middle of a repair once the pending changes near what
    /// one transaction may hold. The blocks it frees are kept for the pool
    /// to make reusable (`take_deferred_frees`); a failed commit stops the
    /// pool taking changes, as any failed commit does.
    pub(crate) fn commit_if_large_during_repair(&mut self) -> Result<()> {
        if self.pending_commit_blocks() <= self.auto_commit_blocks() {
            return Ok(());
        }
        match self.commit() {
            Ok(frees) => {
                self.defer_frees(frees);
                Ok(())
            }
            Err(e) => {
                self.mark_failed(e.to_string());
                Err(e)
            }
        }
    }

    /// Blocks one journal transaction may span.
    pub fn max_transaction_blocks(&self) -> u64 {
        self.journal().max_transaction_blocks()
    }

    /// The pending-commit size past which the write path commits by itself.
    pub fn auto_commit_blocks(&self) -> u64 {
        self.journal().max_transaction_blocks() / 4
    }

    /// Makes every change so far durable through the journal, all under
    /// the state lock. Returns the blocks this commit freed; the caller
    /// makes them reusable once no reader can still be using them.
    pub fn commit(&mut self) -> Result<Vec<BlockAddr>> {
        match self.prepare_commit()? {
            PreparedCommit::Done(frees) => Ok(frees),
            PreparedCommit::Io(io) => {
                let outcome = io.run();
                let frees = self.finish_commit(outcome)?;
                if self.wants_checkpoint() {
                    // Opportunistic: if it fails, the next commit tries again.
                    let _ = self.checkpoint();
                }
                Ok(frees)
            }
        }
    }

    /// True when the journal is half full: a checkpoint is due, so that
    /// replay stays short and the next transactions find room.
    pub(crate) fn wants_checkpoint(&self) -> bool {
        self.journal().wants_checkpoint()
    }

    /// The first step of a commit: builds the transaction and does the
    /// bookkeeping as if it were durable (dirty nodes clean, allocations
    /// and share counts sealed, the new roots), keeping every image in
    /// the node store (`keep_unwritten`) so that a node evicted meanwhile reads back
    /// right. Its I/O ([`CommitIo::run`]) may then run without the state
    /// lock; [`State::finish_commit`] ends it. Nothing else commits or
    /// checkpoints in between.
    ///
    /// Order (ordered mode): data first, then the transaction that maps it,
    /// then the metadata blocks at home. Replay redoes the last step.
    pub(crate) fn prepare_commit(&mut self) -> Result<PreparedCommit> {
        self.prepare_commit_with(DataFlush::All)
    }

    /// `prepare_commit`, flushing the data `flush` says.
    pub(crate) fn prepare_commit_with(&mut self, flush: DataFlush) -> Result<PreparedCommit> {
        assert!(
            !self.has_io_in_flight(),
            "one commit or checkpoint at a time"
        );
        if cfg!(feature = "unsafe-no-journal") {
            self.flush_device("data")?;
            return self.commit_in_place_unsafely().map(PreparedCommit::Done);
        }
        let mapped = self.take_data_mapped();
        let flush_data = match flush {
            DataFlush::All => self.data_dirty().swap(false, Ordering::AcqRel),
            DataFlush::IfMapped if mapped => self.data_dirty().swap(false, Ordering::AcqRel),
            DataFlush::IfMapped => false,
        };
        // Mapped data is dirty data: the flag is set only with data_dirty,
        // and both are cleared by the same flush.
        assert!(!mapped || flush_data, "mapped data left unflushed");
        if !flush_data && !self.has_changes() {
            return Ok(PreparedCommit::Done(Vec::new()));
        }
        let dirty_ids = self.volume_table().dirty_ids();
        let prepared = if self.has_changes() {
            self.prepare_transaction().map(|(f, t)| (f, Some(t)))
        } else {
            Ok((InFlightCommit::default(), None))
        };
        let (in_flight, transaction) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                // Nothing was sealed: what was dirty stays dirty, so a retry
                // after the fault clears writes all of it again.
                self.volume_table_mut().restore_dirty(dirty_ids);
                if flush_data {
                    self.data_dirty().store(true, Ordering::Release);
                }
                if mapped {
                    self.note_data_mapped();
                }
                return Err(e);
            }
        };
        // Its I/O rewrites the homes of the images.
        self.metadata_changed();
        let io = CommitIo {
            device: self.device().clone(),
            block_bytes: self.geometry().block_size_bytes as usize,
            flush_data,
            transaction,
            homes: in_flight.homes.clone(),
        };
        self.start_commit_io(in_flight);
        Ok(PreparedCommit::Io(io))
    }

    /// Builds the transaction of everything dirty and reserves its place
    /// in the journal; the bookkeeping of a durable commit is done here.
    fn prepare_transaction(&mut self) -> Result<(InFlightCommit, (u64, Vec<u8>))> {
        let writes = self.dirty_images()?;
        self.grow_device_to_store()?;
        let roots = self.current_roots();
        let share_runs = self.space_map_mut().pending_share_runs();
        // Allocations and share counts must be durable with the tree that
        // uses them; frees may trail in later transactions (a crash between
        // leaks blocks, which check --repair and the GC reclaim, and never
        // frees a block still in use).
        let mut extents = self.space_map().alloc().pending_extents();
        extents.sort_by_key(|e| e.change == AllocChange::Freed);
        let (homes, images): (Vec<BlockAddr>, Vec<Vec<u8>>) = writes.into_iter().unzip();
        let first_extents = self.extents_that_fit(images.len(), share_runs.len(), &extents);
        let allocations = |extents: &[AllocExtent]| {
            extents
                .iter()
                .filter(|e| e.change != AllocChange::Freed)
                .count()
        };
        if allocations(&extents[..first_extents]) != allocations(&extents) {
            return Err(Error::new(
                ErrorKind::NoSpace,
                "the transaction is larger than the journal can hold; commit more often",
            ));
        }
        let trailing_frees = extents.split_off(first_extents);
        let transaction = self.reserve_transaction(roots, &homes, &images, extents, share_runs)?;
        // From here on, the bookkeeping of a durable transaction.
        self.nodes_mut().mark_clean();
        let sealed = self.space_map_mut().seal();
        self.set_committed_roots(roots);
        // A freed block may be reused for data once this transaction is
        // durable: an older image must never be written over it.
        for extent in &sealed.extents {
            if extent.change == AllocChange::Freed {
                let first = extent.first.0;
                let end = first + u64::from(extent.count);
                self.nodes_mut().forget_images_in(first, end);
            }
        }
        // Until written home, the images are where a node that leaves the
        // cache is read from.
        for (home, image) in homes.iter().zip(images) {
            self.nodes_mut().keep_unwritten(*home, image);
        }
        let in_flight = InFlightCommit {
            homes,
            roots,
            trailing_frees,
            frees: sealed.frees,
        };
        Ok((in_flight, transaction))
    }

    /// Every changed metadata block as (home, image): the volume table's
    /// first, since writing its records may allocate nodes and blocks that
    /// must ride in the same transaction, then every dirty node.
    fn dirty_images(&mut self) -> Result<Vec<(BlockAddr, Vec<u8>)>> {
        let block_size = self.geometry().block_size_bytes as usize;
        let mut writes = self.persist_volume_table()?;
        writes.extend(self.nodes().dirty_images(block_size));
        Ok(writes)
    }

    fn current_roots(&self) -> Roots {
        Roots {
            volume_table_root: self.superblock().volume_table_root,
            volume_table_height: self.superblock().volume_table_height,
            next_volume_id: self.superblock().next_volume_id,
            group_count: self.space_map().alloc().group_count(),
            birth_generation: self.superblock().birth_generation,
        }
    }

    /// Encodes a transaction and reserves its place in the journal
    /// (checkpointing first if it does not fit).
    fn reserve_transaction(
        &mut self,
        roots: Roots,
        homes: &[BlockAddr],
        images: &[Vec<u8>],
        extents: Vec<AllocExtent>,
        share_runs: Vec<ShareRun>,
    ) -> Result<(u64, Vec<u8>)> {
        let block = self.geometry().block_size_bytes as usize;
        let descriptor = self.descriptor(roots, homes.to_vec(), images, extents, share_runs);
        let len = u64::from(descriptor.descriptor_blocks) + images.len() as u64;
        if !self.journal().fits(len) {
            self.checkpoint()?;
        }
        let bytes = crate::journal::transaction_bytes(block, &descriptor.encode(block), images);
        let offset = self.journal_mut().reserve(len);
        Ok((offset, bytes))
    }

    /// The last step of a commit, under the state lock, after its I/O:
    /// forgets the images written home, writes the frees that did not fit
    /// (the caller checkpoints when the journal is half full, see
    /// [`State::wants_checkpoint`]). Returns the blocks
    /// the commit freed (none if its frees could not all be journaled).
    pub(crate) fn finish_commit(&mut self, outcome: CommitIoOutcome) -> Result<Vec<BlockAddr>> {
        let in_flight = self.take_commit_in_flight().expect("a commit is in flight");
        if let Err(e) = outcome.result {
            if outcome.journal_attempted {
                self.journal_mut().append_failed();
            }
            return Err(e);
        }
        // A failed write-back stays in the node store: the checkpoint
        // retries it before it lets the journal forget the transaction.
        for home in outcome.homes_written {
            self.nodes_mut().written_home(home);
        }
        let frees_durable = self.append_trailing_frees(in_flight.roots, &in_flight.trailing_frees);
        Ok(if frees_durable {
            in_flight.frees
        } else {
            Vec::new()
        })
    }

    /// Frees that did not fit trail in free-only transactions. If one
    /// cannot be written the commit still stands: the durable maps already
    /// hold the frees and the next checkpoint writes them; a crash before
    /// that only leaks the blocks, which check --repair reclaims. Returns
    /// whether all of them were journaled.
    fn append_trailing_frees(&mut self, roots: Roots, mut rest: &[AllocExtent]) -> bool {
        while !rest.is_empty() {
            let count = self.extents_that_fit(0, 0, rest).max(1);
            if self
                .append_transaction(roots, Vec::new(), &[], rest[..count].to_vec(), Vec::new())
                .is_err()
            {
                // These frees are not in the journal: a block among them
                // that held a journaled node must not be reused before a
                // checkpoint, or replay could write the node over new data.
                // Keeping them all pending (until the pool is reopened) is
                // safe; it only holds the space back.
                return false;
            }
            rest = &rest[count..];
        }
        true
    }

    /// For benchmarks only (feature `unsafe-no-journal`): the commit with
    /// no journal, metadata written in place and one flush. A crash can
    /// leave it inconsistent; it exists to measure what the journal costs.
    fn commit_in_place_unsafely(&mut self) -> Result<Vec<BlockAddr>> {
        if !self.has_changes() {
            return Ok(Vec::new());
        }
        let writes = self.dirty_images()?;
        self.grow_device_to_store()?;
        let roots = self.current_roots();
        for (home, image) in &writes {
            self.write_device_block(*home, image, "metadata")?;
        }
        self.nodes_mut().mark_clean();
        let sealed = self.space_map_mut().seal();
        self.write_count_blocks()?;
        for (addr, block) in self
            .space_map()
            .alloc()
            .dirty_maps(self.geometry().block_size_bytes)
        {
            self.write_device_block(addr, &block, "allocation map")?;
        }
        self.space_map_mut().mark_maps_clean();
        self.flush_device("metadata")?;
        self.set_committed_roots(roots);
        Ok(sealed.frees)
    }

    /// How many of `extents` fit in one transaction beside `images` images
    /// and `share_runs` share-count runs.
    fn extents_that_fit(&self, images: usize, share_runs: usize, extents: &[AllocExtent]) -> usize {
        let block = self.geometry().block_size_bytes as usize;
        let max_blocks = self.journal().max_transaction_blocks() as usize;
        let descriptor_blocks_max = max_blocks.saturating_sub(images);
        let budget_bytes = descriptor_blocks_max * block;
        let fixed = Descriptor::encoded_len(images, 0, share_runs);
        let per_extent = Descriptor::encoded_len(0, 1, 0) - Descriptor::encoded_len(0, 0, 0);
        if fixed > budget_bytes {
            return 0;
        }
        ((budget_bytes - fixed) / per_extent).min(extents.len())
    }

    fn descriptor(
        &self,
        roots: Roots,
        homes: Vec<BlockAddr>,
        images: &[Vec<u8>],
        extents: Vec<AllocExtent>,
        share_runs: Vec<ShareRun>,
    ) -> Descriptor {
        let block = self.geometry().block_size_bytes as usize;
        let mut images_crc = 0u32;
        for image in images {
            images_crc = crc32c::crc32c_append(images_crc, image);
        }
        Descriptor {
            sequence: self.journal().sequence(),
            pool_uuid: self.superblock().pool_uuid,
            descriptor_blocks: Descriptor::encoded_len(homes.len(), extents.len(), share_runs.len())
                .div_ceil(block) as u32,
            images_crc,
            roots,
            homes,
            extents,
            share_runs,
        }
    }

    /// Writes a transaction and flushes it, all under the state lock.
    fn append_transaction(
        &mut self,
        roots: Roots,
        homes: Vec<BlockAddr>,
        images: &[Vec<u8>],
        extents: Vec<AllocExtent>,
        share_runs: Vec<ShareRun>,
    ) -> Result<()> {
        let block = self.geometry().block_size_bytes as usize;
        let descriptor = self.descriptor(roots, homes, images, extents, share_runs);
        let len = u64::from(descriptor.descriptor_blocks) + images.len() as u64;
        if !self.journal().fits(len) {
            self.checkpoint()?;
        }
        let bytes = descriptor.encode(block);
        let device = std::sync::Arc::clone(self.device());
        self.journal_mut().append(device.as_ref(), &bytes, images)
    }

    /// Checks that the journal reads back exactly the transactions written
    /// since the last checkpoint; returns how many.
    pub(crate) fn verify_journal(&self) -> Result<u64> {
        self.journal()
            .verify(self.device().as_ref(), &self.superblock().pool_uuid)
    }
}
