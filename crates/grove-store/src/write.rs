//! The write path behind `Volume::write_at`, in three steps, so that data
//! I/O never holds the pool's state lock:
//!
//! 1. [`plan`], under the state lock: each block of the write either goes
//!    in place (the volume alone holds it and it was born after the last
//!    snapshot point) or gets a new block, reserved now (taken, but in no
//!    transaction: a crash before step 3 leaks nothing) and not yet mapped.
//! 2. [`run`], with only the I/O gate held: the data lands, in place or in
//!    the new blocks (a partial block merged with the contents of the block
//!    it replaces, which the gate keeps from being reused meanwhile).
//! 3. [`install`], under the state lock again: each new block is mapped if
//!    its entry is still the one it was merged from; if a write in between
//!    changed it, the new block is freed and that block written again under
//!    the lock.
//!
//! Nobody can see a new block before step 3, so nobody reads it half
//! written; and the mapping is made only after its data landed, so the
//! commit that makes it durable flushes the data first (ordered mode).

use std::ops::Range;

use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::node::{Entry, NodeKind};
use crate::format::record::VolumeRecord;
use crate::space::SpaceMap;
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};

/// Blocks one plan covers at most: a long write is planned, written and
/// installed a chunk at a time, which bounds the blocks allocated but not
/// yet mapped and lets the write path commit between chunks.
pub(crate) const WRITE_CHUNK_BLOCKS: u64 = 256;

/// A block of the write that gets a new block.
pub(crate) struct Allocation {
    pub index: u64,
    /// The entry the new block replaces: a partial write keeps its data.
    pub old: Entry,
    pub new_block: BlockAddr,
    pub offset_in_block: usize,
    /// The bytes of the caller's buffer that go into this block.
    pub range: Range<usize>,
}

#[derive(Default)]
pub(crate) struct WritePlan {
    /// Writes straight from the caller's buffer, in place or into new
    /// blocks written whole: (device byte offset, range of the buffer).
    pub direct: Vec<(u64, Range<usize>)>,
    /// Every new block, mapped by [`install`] once the data landed.
    pub allocations: Vec<Allocation>,
}

impl WritePlan {
    /// Gives back the new blocks (a failed write, or a failed plan).
    pub fn free_allocations(&self, state: &mut State) {
        for allocation in &self.allocations {
            state.space_map_mut().unreserve(allocation.new_block);
        }
    }
}

/// The rule for writing a block in place: the entry maps a block, that
/// block has no other reference, and it was born after the volume's share
/// floor (so that every change since a snapshot, even one since removed,
/// shows as a newer birth). The caller answers for the path above the
/// entry: no node on it may be shared (`lookup_writable_in_place` checks
/// it on its way down).
pub(crate) fn may_write_in_place(
    entry: Entry,
    share_floor_generation: u64,
    space_map: &SpaceMap,
) -> bool {
    !entry.is_empty()
        && space_map.is_last_reference(entry.addr())
        && entry.birth() > share_floor_generation
}

/// A whole block made of `data` at `offset_in_block` over the contents of
/// the block `old` maps (zeros for a hole), which `read_old` reads.
pub(crate) fn merge_partial_block(
    block_bytes: usize,
    old: Entry,
    offset_in_block: usize,
    data: &[u8],
    read_old: impl FnOnce(BlockAddr, &mut [u8]) -> Result<()>,
) -> Result<Vec<u8>> {
    assert!(offset_in_block + data.len() <= block_bytes);
    let mut merged = vec![0u8; block_bytes];
    if !old.is_empty() {
        read_old(old.addr(), &mut merged)?;
    }
    merged[offset_in_block..offset_in_block + data.len()].copy_from_slice(data);
    Ok(merged)
}

/// Step 1: decides where each block of `len` bytes at `offset` goes. On
/// an error, nothing stays allocated.
pub(crate) fn plan(
    state: &mut State,
    record: &VolumeRecord,
    offset: u64,
    len: usize,
) -> Result<WritePlan> {
    let mut plan = WritePlan::default();
    let result = plan_into(state, record, offset, len, &mut plan);
    if result.is_err() {
        plan.free_allocations(state);
    }
    result.map(|()| plan)
}

fn plan_into(
    state: &mut State,
    record: &VolumeRecord,
    offset: u64,
    len: usize,
    plan: &mut WritePlan,
) -> Result<()> {
    let block_bytes = state.geometry().block_bytes();
    let mut done = 0usize;
    while done < len {
        let position = offset + done as u64;
        let index = position / block_bytes;
        let in_block = position % block_bytes;
        let piece = (block_bytes - in_block).min((len - done) as u64) as usize;
        let range = done..done + piece;
        done += piece;
        let in_place = state.lookup_writable_in_place(
            record.root,
            record.height,
            index,
            record.share_floor_generation,
        )?;
        if let Some(addr) = in_place {
            plan.direct.push((addr.0 * block_bytes + in_block, range));
            continue;
        }
        let old = state.lookup(record.root, record.height, NodeKind::VolumeData, index)?;
        let new_block = state.space_map_mut().reserve()?;
        if piece as u64 == block_bytes {
            plan.direct.push((new_block.0 * block_bytes, range.clone()));
        }
        plan.allocations.push(Allocation {
            index,
            old,
            new_block,
            offset_in_block: in_block as usize,
            range,
        });
    }
    Ok(())
}

/// Step 2: the data I/O, without the state lock; the caller holds the I/O
/// gate, so that no block read or written here is reused meanwhile.
pub(crate) fn run(
    device: &dyn BlockDevice,
    block_bytes: u64,
    buf: &[u8],
    plan: &WritePlan,
) -> Result<()> {
    let write_error = |e| Error::io(format!("cannot write data to {}", device.describe()), e);
    for allocation in plan.allocations.iter() {
        if allocation.range.len() as u64 == block_bytes {
            continue;
        }
        // A partial block: the rest comes from the block it replaces.
        let merged = merge_partial_block(
            block_bytes as usize,
            allocation.old,
            allocation.offset_in_block,
            &buf[allocation.range.clone()],
            |old, merged| {
                device
                    .read_written_at(merged, old.0 * block_bytes)
                    .map_err(|e| Error::io(format!("cannot read data of {}", device.describe()), e))
            },
        )?;
        device
            .write_at(&merged, allocation.new_block.0 * block_bytes)
            .map_err(write_error)?;
    }
    // The runs are distinct blocks: they may land in any order.
    let runs: Vec<(u64, &[u8])> = coalesce(&plan.direct, device.write_run_bytes_max())
        .into_iter()
        .map(|(device_offset, range)| (device_offset, &buf[range]))
        .collect();
    match runs.as_slice() {
        [] => Ok(()),
        [(device_offset, bytes)] => device.write_at(bytes, *device_offset).map_err(write_error),
        _ => device
            .write_each_at(&runs)
            .into_iter()
            .collect::<std::io::Result<()>>()
            .map_err(write_error),
    }
}

/// Merges writes that are neighbours both on the device and in the
/// buffer, so that a sequential write is a few device writes: a run is at
/// most `run_max` bytes and never crosses a multiple of it on the device
/// (see `BlockDevice::write_run_bytes_max`).
fn coalesce(direct: &[(u64, Range<usize>)], run_max: usize) -> Vec<(u64, Range<usize>)> {
    let run_max = run_max.max(1) as u64;
    let mut merged: Vec<(u64, Range<usize>)> = Vec::with_capacity(direct.len());
    for (offset, range) in direct {
        if let Some((last_offset, last_range)) = merged.last_mut() {
            let device_end = *last_offset + last_range.len() as u64;
            let new_end = device_end + range.len() as u64;
            let fits = (new_end - 1) / run_max == *last_offset / run_max;
            if device_end == *offset && last_range.end == range.start && fits {
                last_range.end = range.end;
                continue;
            }
        }
        merged.push((*offset, range.clone()));
    }
    merged
}

/// Step 3: maps the new blocks whose data landed. A block whose entry
/// changed since the plan is freed and written again under the lock. On
/// an error, the blocks not yet mapped are freed.
pub(crate) fn install(
    state: &mut State,
    id: VolumeId,
    buf: &[u8],
    allocations: &[Allocation],
) -> Result<()> {
    for (i, allocation) in allocations.iter().enumerate() {
        let installed =
            state.install_written_block(id, allocation.index, allocation.old, allocation.new_block);
        let result = match installed {
            Ok(true) => {
                state.space_map_mut().confirm(allocation.new_block);
                Ok(())
            }
            Ok(false) => {
                state.space_map_mut().unreserve(allocation.new_block);
                state.write_block(
                    id,
                    allocation.index,
                    allocation.offset_in_block,
                    &buf[allocation.range.clone()],
                )
            }
            Err(e) => {
                state.space_map_mut().unreserve(allocation.new_block);
                Err(e)
            }
        };
        if let Err(e) = result {
            for rest in &allocations[i + 1..] {
                state.space_map_mut().unreserve(rest.new_block);
            }
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::coalesce;

    /// Neighbours merge up to the device's run length, and a run stops at
    /// each multiple of it, so each of a device's pieces gets its own.
    #[test]
    fn runs_merge_up_to_the_run_length_and_stop_at_its_multiples() {
        let block = 4096usize;
        // Eight neighbouring blocks from device byte 2 blocks in.
        let direct: Vec<(u64, std::ops::Range<usize>)> = (0..8)
            .map(|i| (((2 + i) * block) as u64, i * block..(i + 1) * block))
            .collect();
        let runs = coalesce(&direct, 4 * block);
        assert_eq!(
            runs,
            [
                ((2 * block) as u64, 0..2 * block),
                ((4 * block) as u64, 2 * block..6 * block),
                ((8 * block) as u64, 6 * block..8 * block),
            ]
        );
        // A gap on the device, or in the buffer, ends a run too.
        let apart = [(0u64, 0..block), ((2 * block) as u64, block..2 * block)];
        assert_eq!(coalesce(&apart, 16 * block).len(), 2);
        assert_eq!(coalesce(&direct, 1 << 20).len(), 1);
    }
}
