//! A volume's data path: reads, writes, unmaps and flushes through a
//! [`Volume`] handle. Each request looks its blocks up under the state
//! lock, after reading the radix nodes it would miss with the lock let go
//! (`prefetch_paths`); data I/O runs under the I/O gate only.

use std::sync::MutexGuard;

use super::locking::{commit, commit_if_large, commit_locked};
use super::state_lock::lock_state;
use super::{
    check_range, ensure_changes_allowed, read_only_error, volume_info_off_lock, volume_summary,
    Inner, Volume, VolumeInfo, VolumeSummary,
};
use crate::diff::DiffExtent;
use crate::error::{Error, ErrorKind, Result};
use crate::format::node::{Entry, NodeKind};
use crate::format::record::VolumeRecord;
use crate::state::State;
use crate::write;

impl Volume {
    fn record(&self, state: &State) -> Result<VolumeRecord> {
        state.volume_by_id(self.id).cloned()
    }

    pub fn info(&self) -> Result<VolumeInfo> {
        volume_info_off_lock(&self.inner, lock_state(&self.inner), self.id)
    }

    /// What the volume is, without the accounting (cheap).
    pub fn summary(&self) -> Result<VolumeSummary> {
        let state = lock_state(&self.inner);
        Ok(volume_summary(&state, state.volume_by_id(self.id)?))
    }

    pub fn size_bytes(&self) -> Result<u64> {
        Ok(self.record(&lock_state(&self.inner))?.size_bytes)
    }

    pub fn is_read_only(&self) -> Result<bool> {
        Ok(!self.record(&lock_state(&self.inner))?.kind.is_writable())
    }

    /// Fills `buf` from byte `offset`. Holes read as zeros.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let _request = self.inner.foreground.begin();
        let state = lock_state(&self.inner);
        let record = self.record(&state)?;
        check_range(&record, "read", offset, buf.len() as u64)?;
        let block_bytes = state.geometry().block_bytes();
        let blocks = offset / block_bytes..(offset + buf.len() as u64).div_ceil(block_bytes);
        let (mut state, let_go) = prefetch_paths(&self.inner, state, &record, blocks);
        // Again if the lock was let go: the volume may have changed meanwhile.
        let record = if let_go {
            let record = self.record(&state)?;
            check_range(&record, "read", offset, buf.len() as u64)?;
            record
        } else {
            record
        };
        // Translate every block under the state lock (one walk per leaf),
        // then read the data with only the I/O gate held, so other volumes
        // keep going. Pieces that follow each other on the device (or are
        // both holes) are merged: a sequential read is one device read per run.
        let (first, entries) = entries_under(&mut state, &record, offset, buf.len())?;
        let mut pieces: Vec<(usize, usize, Option<u64>)> = Vec::new();
        let mut done = 0u64;
        while done < buf.len() as u64 {
            let position = offset + done;
            let index = position / block_bytes;
            let in_block = position % block_bytes;
            let len = (block_bytes - in_block).min(buf.len() as u64 - done);
            let entry = entries[(index - first) as usize];
            let source = (!entry.is_empty()).then(|| entry.addr().0 * block_bytes + in_block);
            let follows = |last_len: usize, last_source: Option<u64>| match (last_source, source) {
                (Some(last), Some(next)) => last + last_len as u64 == next,
                (None, None) => true,
                _ => false,
            };
            match pieces.last_mut() {
                Some((_, last_len, last_source)) if follows(*last_len, *last_source) => {
                    *last_len += len as usize
                }
                _ => pieces.push((done as usize, len as usize, source)),
            }
            done += len;
        }
        let device = state.device().clone();
        let gate = self.inner.io_gate.read().unwrap_or_else(|e| e.into_inner());
        drop(state);
        // The runs are handed over at once: a device whose reads each wait
        // for a round trip (RADOS) runs them side by side.
        let mut reads: Vec<(u64, &mut [u8])> = Vec::with_capacity(pieces.len());
        let mut rest = &mut buf[..];
        let mut at = 0usize;
        for (start, len, source) in pieces {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let (target, tail) = tail.split_at_mut(len);
            rest = tail;
            at = start + len;
            match source {
                None => target.fill(0),
                Some(device_offset) => reads.push((device_offset, target)),
            }
        }
        let read = match reads.as_mut_slice() {
            [] => Ok(()),
            [(device_offset, target)] => device.read_written_at(target, *device_offset),
            _ => device.read_written_each_at(&mut reads),
        };
        drop(gate);
        read.map_err(|e| Error::io(format!("cannot read data of {}", device.describe()), e))
    }

    /// Writes `buf` at byte `offset`. Durable after the next flush.
    ///
    /// The data I/O runs without the state lock, so writers to different
    /// blocks (and readers) go on in parallel, whether a block is written
    /// in place or needs a new one (a hole, or a block a snapshot shares):
    /// see `write.rs`. A long write goes a chunk at a time.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let _request = self.inner.foreground.begin();
        let mut done = 0usize;
        loop {
            done += self.write_chunk(buf, offset, done)?;
            if done == buf.len() {
                return Ok(());
            }
        }
    }

    /// The volume's record if `len` bytes at `offset` may be written now;
    /// refusals in the order a caller expects (failed pool, read-only
    /// volume, range).
    fn check_writable(&self, state: &State, offset: u64, len: usize) -> Result<VolumeRecord> {
        ensure_changes_allowed(state)?;
        let record = self.record(state)?;
        if !record.kind.is_writable() {
            return Err(read_only_error(&record));
        }
        check_range(&record, "write", offset, len as u64)?;
        Ok(record)
    }

    /// One chunk of a write: the chunk of `whole` (written at
    /// `whole_offset`) that starts `done` bytes in, planned under the state
    /// lock, written with only the I/O gate held, its new blocks mapped
    /// under the lock again. Returns its length.
    fn write_chunk(&self, whole: &[u8], whole_offset: u64, done: usize) -> Result<usize> {
        let state = lock_state(&self.inner);
        // The whole range first, so no arithmetic below can overflow.
        let record = self.check_writable(&state, whole_offset, whole.len())?;
        let block_bytes = state.geometry().block_bytes();
        let offset = whole_offset + done as u64;
        let chunk_bytes = write::WRITE_CHUNK_BLOCKS * block_bytes;
        let chunk_end = (offset / chunk_bytes + 1) * chunk_bytes;
        let len = ((chunk_end - offset) as usize).min(whole.len() - done);
        let buf = &whole[done..done + len];
        let blocks = offset / block_bytes..(offset + len as u64).div_ceil(block_bytes);
        let (mut state, let_go) = prefetch_paths(&self.inner, state, &record, blocks);
        // Again if the lock was let go: the volume may have changed meanwhile.
        let record = if let_go {
            self.check_writable(&state, whole_offset, whole.len())?
        } else {
            record
        };
        let mut plan = write::plan(&mut state, &record, offset, buf.len());
        // Blocks freed since the last commit cannot be reused until a
        // commit makes their free durable: commit, then try again, rather
        // than report a full pool that is not full.
        if is_no_space(&plan) && state.has_frees_awaiting_commit() {
            commit_locked(&self.inner, &mut state)?;
            plan = write::plan(&mut state, &record, offset, buf.len());
        }
        // Then grow the capacity a step at a time while the settings allow
        // (each step is bounded by the ceiling, so this ends).
        while is_no_space(&plan) && super::capacity::extend_locked(&self.inner, &mut state)? {
            plan = write::plan(&mut state, &record, offset, buf.len());
        }
        let plan = plan?;
        let device = state.device().clone();
        let data_dirty = state.data_dirty().clone();
        let block_bytes = state.geometry().block_bytes();
        // The gate keeps the blocks read and written from being freed and
        // reused, and keeps a snapshot from sharing them, until the writes
        // have landed. It is let go before the state lock is taken again: a
        // commit holding the state lock may be waiting for it.
        let gate = self.inner.io_gate.read().unwrap_or_else(|e| e.into_inner());
        drop(state);
        let written = write::run(device.as_ref(), block_bytes, buf, &plan);
        if !plan.direct.is_empty() {
            data_dirty.store(true, std::sync::atomic::Ordering::Release);
        }
        drop(gate);
        if plan.allocations.is_empty() {
            return written.map(|()| len);
        }
        let mut state = lock_state(&self.inner);
        if let Err(e) = written.and_then(|()| ensure_changes_allowed(&state)) {
            plan.free_allocations(&mut state);
            return Err(e);
        }
        write::install(&mut state, self.id, buf, &plan.allocations)?;
        // A commit the write path starts runs its I/O without the lock too.
        let large = state.pending_commit_blocks() > state.auto_commit_blocks();
        drop(state);
        if large {
            commit(&self.inner)?;
        }
        Ok(len)
    }

    /// Discards (unmaps) a byte range: whole blocks become holes and give
    /// back the space only this volume used; partial blocks at the ends are
    /// zeroed. Afterwards the range reads as zeros.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _request = self.inner.foreground.begin();
        let mut state = lock_state(&self.inner);
        ensure_changes_allowed(&state)?;
        let record = self.record(&state)?;
        if !record.kind.is_writable() {
            return Err(read_only_error(&record));
        }
        check_range(&record, "discard", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let block_bytes = state.geometry().block_bytes();
        let end = offset + len;
        let first_whole = offset.div_ceil(block_bytes);
        let end_whole = end / block_bytes;
        // A range inside one block has no whole blocks: zero it all.
        if first_whole > end_whole {
            return zero_partial(&mut state, &record, offset, end);
        }
        zero_partial(
            &mut state,
            &record,
            offset,
            (first_whole * block_bytes).min(end),
        )?;
        zero_partial(
            &mut state,
            &record,
            (end_whole * block_bytes).max(offset),
            end,
        )?;
        state.unmap(self.id, first_whole, end_whole)?;
        commit_if_large(&self.inner, &mut state)
    }

    /// Makes this pool's completed writes durable.
    pub fn flush(&self) -> Result<()> {
        let _request = self.inner.foreground.begin();
        commit(&self.inner)
    }

    /// Byte ranges that hold data, as (offset, length), in order. Everything
    /// else is a hole that reads as zeros.
    pub fn mapped_extents(&self) -> Result<Vec<(u64, u64)>> {
        self.mapped_extents_in(0, u64::MAX)
    }

    /// The mapped extents that overlap bytes [offset, offset + len), whole
    /// blocks (so the first and last may reach outside the range). Costs
    /// what the range covers, not the whole volume: an NBD BLOCK_STATUS
    /// query asks about a small window of a large volume.
    pub fn mapped_extents_in(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let mut state = lock_state(&self.inner);
        let record = self.record(&state)?;
        let block_bytes = state.geometry().block_bytes();
        let end_bytes = offset.saturating_add(len).min(record.size_bytes);
        if offset >= end_bytes {
            return Ok(Vec::new());
        }
        let first = offset / block_bytes;
        let end = state.geometry().blocks_for(end_bytes);
        let mut extents = Vec::new();
        state.mapped_blocks(record.root, record.height, first, end, &mut extents)?;
        Ok(extents
            .into_iter()
            .map(|(first, count)| {
                let start = first * block_bytes;
                (start, (count * block_bytes).min(record.size_bytes - start))
            })
            .collect())
    }

    /// The extents in bytes [offset, offset + len) where this volume
    /// differs from `base`, a volume or a removed snapshot (bookmark) of
    /// its line, as [`crate::Pool::diff`] reports them but clipped to the
    /// range and to this volume's size. Costs what differs inside the
    /// range: an NBD `grove:changed:` query asks about a window. With an
    /// empty range, only checks that `base` exists and is comparable.
    pub fn diff_in(&self, base: &str, offset: u64, len: u64) -> Result<Vec<DiffExtent>> {
        let mut state = lock_state(&self.inner);
        let record = self.record(&state)?;
        let block_bytes = state.geometry().block_bytes();
        let end_bytes = offset.saturating_add(len).min(record.size_bytes);
        let (from, end) = if offset < end_bytes {
            (offset / block_bytes, state.geometry().blocks_for(end_bytes))
        } else {
            (0, 0)
        };
        let (_, _, runs) = state.diff_runs(base, &record, from, end)?;
        Ok(runs
            .into_iter()
            .map(|(first, count, data)| {
                let start = first * block_bytes;
                DiffExtent {
                    offset_bytes: start,
                    length_bytes: (count * block_bytes).min(record.size_bytes - start),
                    data,
                }
            })
            .collect())
    }
}

/// Zeroes bytes [start, end) that lie in blocks the volume maps. Unmapped
/// blocks already read as zeros and stay unmapped.
fn zero_partial(state: &mut State, record: &VolumeRecord, start: u64, end: u64) -> Result<()> {
    if start >= end {
        return Ok(());
    }
    let block_bytes = state.geometry().block_bytes();
    let index = start / block_bytes;
    debug_assert_eq!(index, (end - 1) / block_bytes);
    let entry = state.lookup(record.root, record.height, NodeKind::VolumeData, index)?;
    if entry.is_empty() {
        return Ok(());
    }
    let zeros = vec![0u8; (end - start) as usize];
    state.write_block(record.id, index, (start % block_bytes) as usize, &zeros)
}

/// Device reads one request's prefetch makes at most; lookups under the
/// lock read whatever else is missing.
const PREFETCH_READS_MAX: usize = 32;

/// The first block of `len` bytes at `offset` and the data entries of
/// their blocks, one walk per leaf.
fn entries_under(
    state: &mut State,
    record: &VolumeRecord,
    offset: u64,
    len: usize,
) -> Result<(u64, Vec<Entry>)> {
    let block_bytes = state.geometry().block_bytes();
    let first = offset / block_bytes;
    let end = (offset + len as u64).div_ceil(block_bytes);
    let count = if len == 0 { 0 } else { end - first };
    let mut entries = Vec::with_capacity(count as usize);
    let kind = NodeKind::VolumeData;
    state.lookup_run(record.root, record.height, kind, first, count, &mut entries)?;
    Ok((first, entries))
}

/// Reads the radix nodes that lookups of `blocks` of `record` would miss
/// in the cache, each with the state lock let go during the read, so that
/// a cache miss stalls no other client. A node is cached only if no
/// metadata changed during its read (`State::cache_prefetched`). Returns
/// the state lock, and whether it was let go meanwhile (then the caller
/// looks its record up again).
fn prefetch_paths<'a>(
    inner: &'a Inner,
    mut state: MutexGuard<'a, State>,
    record: &VolumeRecord,
    blocks: std::ops::Range<u64>,
) -> (MutexGuard<'a, State>, bool) {
    let per_leaf = state.geometry().entries_per_node as u64;
    let block_bytes = state.geometry().block_bytes();
    let mut index = blocks.start;
    let mut reads = 0;
    while index < blocks.end && reads < PREFETCH_READS_MAX {
        let missing =
            state.first_uncached_node(record.root, record.height, NodeKind::VolumeData, index);
        let Some((addr, level)) = missing else {
            index = (index / per_leaf + 1) * per_leaf; // the next leaf's path
            continue;
        };
        let epoch = state.metadata_epoch();
        let device = state.device().clone();
        drop(state);
        let mut block = vec![0u8; block_bytes as usize];
        let read = device.read_at(&mut block, addr.0 * block_bytes);
        reads += 1;
        state = lock_state(inner);
        let cached = read.is_ok()
            && state.cache_prefetched(addr, NodeKind::VolumeData, level, &block, epoch);
        if !cached {
            // Metadata moved meanwhile: this path's lookup reads under the lock.
            index = (index / per_leaf + 1) * per_leaf;
        }
    }
    (state, reads > 0)
}

fn is_no_space<T>(result: &Result<T>) -> bool {
    matches!(result, Err(e) if e.kind() == ErrorKind::NoSpace)
}
