//! Walks that only read (accounting, what removed trees will free) with
//! their device reads made outside the state lock, so that `grove list`,
//! `info`, `rm`, `rename` and `resize` never stall other clients for the
//! time of their reads (issue 25: a list of 100,000 volumes held the lock
//! for 1.8 s). A walk runs under the lock in rounds: each round uses the
//! nodes at hand and names those it lacks, which are read with the lock
//! let go before the next round (`node_reads.rs`). The round that finds
//! every node gives the result, under the lock, so it is exactly what one
//! walk under the lock gives.

use std::sync::MutexGuard;

use super::state_lock::lock_state;
use super::Inner;
use crate::error::Result;
use crate::node_reads::NodeReads;
use crate::state::State;
use crate::types::BlockAddr;

/// Rounds a walk may take reading ahead; past them (the metadata kept
/// moving under its reads, say under a stream of commits) the rest is read
/// under the lock, so the walk always ends.
pub const WALK_ROUNDS_MAX: usize = 8;

/// Runs `walk` under the state lock, in rounds, until it returns Some;
/// the nodes it lacks are read between rounds without the lock. Returns
/// the lock still held after the round that found everything, so that the
/// caller may act on the result before anything changes.
///
/// `walk` must look up again whatever it needs from the state each round:
/// the lock is let go between rounds.
pub(super) fn walk_off_lock<'a, T>(
    inner: &'a Inner,
    mut state: MutexGuard<'a, State>,
    mut walk: impl FnMut(&mut State, &mut NodeReads) -> Result<Option<T>>,
) -> Result<(MutexGuard<'a, State>, T)> {
    let block_bytes = state.geometry().block_bytes();
    let mut reads = NodeReads::new(state.metadata_epoch(), block_bytes);
    for round in 0.. {
        if round == WALK_ROUNDS_MAX {
            reads.read_directly();
        }
        reads.revalidate(state.metadata_epoch());
        if let Some(out) = walk(&mut state, &mut reads)? {
            return Ok((state, out));
        }
        assert!(!reads.is_direct(), "a direct walk finds every node");
        let wanted = reads.take_wanted();
        assert!(!wanted.is_empty(), "a walk that lacks nodes names them");
        if reads.would_overflow(wanted.len()) {
            // Too much to keep in memory: read it under the lock, as a
            // walk without rounds does.
            reads.read_directly();
            continue;
        }
        let epoch = state.metadata_epoch();
        let device = state.device().clone();
        drop(state);
        let blocks = read_blocks(device.as_ref(), &wanted, block_bytes);
        state = lock_state(inner);
        match blocks {
            Some(blocks) => reads.keep(blocks, epoch, state.metadata_epoch()),
            // A failed read is reported by the read under the lock, with
            // the context a walk gives it.
            None => reads.read_directly(),
        }
    }
    unreachable!("the rounds end by reading directly")
}

/// Reads blocks without the lock, all handed to the device at once (a
/// device whose reads each wait for a round trip runs them side by side);
/// None if any read fails.
fn read_blocks(
    device: &dyn crate::device::BlockDevice,
    addrs: &[BlockAddr],
    block_bytes: u64,
) -> Option<Vec<(BlockAddr, Vec<u8>)>> {
    let mut blocks: Vec<(BlockAddr, Vec<u8>)> = addrs
        .iter()
        .map(|&addr| (addr, vec![0u8; block_bytes as usize]))
        .collect();
    let mut reads: Vec<(u64, &mut [u8])> = blocks
        .iter_mut()
        .map(|(addr, block)| (addr.0 * block_bytes, block.as_mut_slice()))
        .collect();
    device.read_each_at(&mut reads).ok()?;
    Some(blocks)
}
