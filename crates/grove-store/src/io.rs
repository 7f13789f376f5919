//! The pool's I/O under one owner ([`PoolIo`], which `State` holds): the
//! prepared commit or checkpoint whose I/O may be running without the state
//! lock, and the puncher's backlog and counts; with the block writes and
//! flushes that commits, checkpoints and replay share. It imports nothing
//! from the engine parts that build on it (`state.rs`, `commit.rs`,
//! `checkpoint.rs`, `punch.rs`), so none of them needs another to name
//! what is in flight.

use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::journal::{AllocExtent, Roots};
use crate::format::superblock::Superblock;
use crate::types::BlockAddr;

/// Most blocks the punch backlog holds (8 bytes each): frees past it are
/// not punched (they keep their host space until reused, or until `check
/// --repair`). Flushes and reclaim batches empty it long before.
pub(crate) const PUNCH_BACKLOG_BLOCKS_MAX: usize = 1 << 20;

/// Writes `buf` at block `addr` of `device`; an error names `what` and
/// where. For I/O run with or without the state lock alike.
pub(crate) fn write_block(
    device: &dyn BlockDevice,
    block_bytes: u64,
    addr: BlockAddr,
    buf: &[u8],
    what: &str,
) -> Result<()> {
    device.write_at(buf, addr.0 * block_bytes).map_err(|e| {
        Error::io(
            format!("cannot write {what} at {addr} of {}", device.describe()),
            e,
        )
    })
}

/// Flushes `device`; an error names `what` was being made durable.
pub(crate) fn flush(device: &dyn BlockDevice, what: &str) -> Result<()> {
    device
        .flush()
        .map_err(|e| Error::io(format!("cannot flush {what} to {}", device.describe()), e))
}

/// What a prepared commit still needs once its I/O is done (`commit.rs`
/// fills and reads it).
#[derive(Default)]
pub(crate) struct InFlightCommit {
    /// Homes of the transaction's images, in order.
    pub(crate) homes: Vec<BlockAddr>,
    pub(crate) roots: Roots,
    /// Free extents that did not fit in the transaction.
    pub(crate) trailing_frees: Vec<AllocExtent>,
    /// Blocks to make reusable once the transaction is durable.
    pub(crate) frees: Vec<BlockAddr>,
}

/// What a prepared checkpoint records once its I/O is durable
/// (`checkpoint.rs`).
pub(crate) struct InFlightCheckpoint {
    /// The superblock it writes, with the generation it takes.
    pub(crate) superblock: Superblock,
}

/// What hole punching did on the pool's device since the pool was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PunchStats {
    /// Extents punched: one device call each.
    pub extents: u64,
    /// Blocks in those extents.
    pub blocks: u64,
    /// Punches that failed for another reason than "cannot punch"; their
    /// blocks keep their host space until they are written and freed again
    /// (or `check --repair` punches every free extent).
    pub errors: u64,
    /// Freed blocks left unpunched because the backlog was full.
    pub dropped_blocks: u64,
    /// The device cannot punch holes: punching is off.
    pub unsupported: bool,
    /// Time spent in punch calls (without the state lock, except for
    /// `check --repair`'s).
    pub elapsed_us: u64,
}

/// Punching's own state: what it did, and the blocks made reusable since
/// they were last punched (`punch.rs` decides which go on and come off).
#[derive(Default)]
pub(crate) struct Puncher {
    stats: PunchStats,
    backlog: Vec<BlockAddr>,
}

impl Puncher {
    /// What punching did so far.
    pub(crate) fn stats(&self) -> PunchStats {
        self.stats
    }

    /// The device cannot punch: punching is off for good.
    pub(crate) fn is_off(&self) -> bool {
        self.stats.unsupported
    }

    pub(crate) fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// Queues a block made reusable, or counts it dropped when the backlog
    /// is full.
    pub(crate) fn queue(&mut self, addr: BlockAddr) {
        let before = self.backlog.len() as u64 + self.stats.dropped_blocks;
        if self.backlog.len() < PUNCH_BACKLOG_BLOCKS_MAX {
            self.backlog.push(addr);
        } else {
            self.stats.dropped_blocks += 1;
        }
        debug_assert_eq!(
            self.backlog.len() as u64 + self.stats.dropped_blocks,
            before + 1
        );
    }

    /// Takes up to `max_blocks` of the newest queued blocks off the backlog.
    pub(crate) fn take(&mut self, max_blocks: usize) -> Vec<BlockAddr> {
        let start = self.backlog.len() - self.backlog.len().min(max_blocks);
        self.backlog.drain(start..).collect()
    }

    /// Forgets every queued block: punched another way, or never to be.
    pub(crate) fn clear_backlog(&mut self) {
        self.backlog.clear();
    }

    /// Gives up on every queued block, counted dropped (a close out of
    /// time); returns how many.
    pub(crate) fn drop_backlog(&mut self) -> usize {
        let dropped = self.backlog.len();
        self.stats.dropped_blocks += dropped as u64;
        self.backlog.clear();
        debug_assert!(self.backlog.is_empty());
        dropped
    }

    /// Counts what a run of punch calls did.
    pub(crate) fn count(&mut self, extents: u64, blocks: u64, failures: u64, elapsed_us: u64) {
        self.stats.extents += extents;
        self.stats.blocks += blocks;
        self.stats.errors += failures;
        self.stats.elapsed_us += elapsed_us;
    }

    /// The device cannot punch: punching is off and the backlog emptied.
    /// True if it was on until now.
    pub(crate) fn turn_off(&mut self) -> bool {
        let was_on = !self.stats.unsupported;
        self.stats.unsupported = true;
        self.backlog.clear();
        was_on
    }
}

/// The pool's I/O: at most one prepared commit or checkpoint in flight, and
/// the puncher.
#[derive(Default)]
pub(crate) struct PoolIo {
    /// A prepared commit whose I/O may be running without the state lock.
    commit: Option<InFlightCommit>,
    /// A prepared checkpoint whose I/O may be running without the state
    /// lock (never at the same time as a commit in flight).
    checkpoint: Option<InFlightCheckpoint>,
    puncher: Puncher,
}

impl PoolIo {
    /// A commit's or a checkpoint's I/O may be running without the lock.
    pub(crate) fn in_flight(&self) -> bool {
        self.commit.is_some() || self.checkpoint.is_some()
    }

    pub(crate) fn start_commit(&mut self, in_flight: InFlightCommit) {
        assert!(!self.in_flight(), "one commit or checkpoint at a time");
        self.commit = Some(in_flight);
        debug_assert!(self.in_flight());
    }

    pub(crate) fn take_commit(&mut self) -> Option<InFlightCommit> {
        let taken = self.commit.take();
        debug_assert!(!self.in_flight());
        taken
    }

    pub(crate) fn start_checkpoint(&mut self, in_flight: InFlightCheckpoint) {
        assert!(!self.in_flight(), "one commit or checkpoint at a time");
        self.checkpoint = Some(in_flight);
        debug_assert!(self.in_flight());
    }

    pub(crate) fn take_checkpoint(&mut self) -> Option<InFlightCheckpoint> {
        let taken = self.checkpoint.take();
        debug_assert!(!self.in_flight());
        taken
    }

    pub(crate) fn checkpoint_in_flight(&self) -> bool {
        self.checkpoint.is_some()
    }

    pub(crate) fn puncher(&self) -> &Puncher {
        &self.puncher
    }

    pub(crate) fn puncher_mut(&mut self) -> &mut Puncher {
        &mut self.puncher
    }
}
