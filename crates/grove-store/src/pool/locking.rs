//! The pool's locks and the commits that run between them. Lock order is
//! always the state lock, then the I/O gate. A commit lets the state lock
//! go during its I/O (`commit`), and so does the checkpoint that follows
//! when the journal is half full; anything that commits or checkpoints
//! with the lock held first settles the I/O in flight (`settle_io`).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::punching::punch_freed;
use super::state_lock::lock_state;
use super::{ensure_changes_allowed, Inner};
use crate::commit::{CommitIo, CommitIoOutcome, DataFlush, PreparedCommit};
use crate::error::{Error, ErrorKind, Result};
use crate::state::State;
use crate::types::BlockAddr;

/// How long work done in slices under the state lock (listings) pauses
/// between slices while clients have requests running.
pub(super) const HANDOFF_PAUSE: Duration = Duration::from_micros(50);

/// Between two slices of long work under the state lock, with the lock
/// let go: lets a client's request that waits for the lock take it. The
/// mutex is not fair, so a slicer that takes it straight back wins before
/// the woken waiter runs (a test counted no read inside most of its
/// listings, sliced or not); a short pause while requests run gives the
/// waiter its turn. It costs a summary listing of 100,000 volumes about
/// 5 ms, and `grove list` (16 volumes a slice) about 0.7 s of its 2.5 s.
pub(super) fn let_clients_in(inner: &Inner) {
    if inner.foreground.in_flight() > 0 {
        std::thread::sleep(HANDOFF_PAUSE);
    } else {
        std::thread::yield_now();
    }
}

pub(super) fn write_gate(inner: &Inner) -> std::sync::RwLockWriteGuard<'_, ()> {
    inner.io_gate.write().unwrap_or_else(|e| e.into_inner())
}

/// Commits with the state lock let go during the commit's I/O (the data
/// flush, the journal write and flush, the write-back), so that other
/// clients' reads and writes go on meanwhile: this is what every flush,
/// and so every NBD FLUSH and fsync, does.
pub(super) fn commit(inner: &Inner) -> Result<()> {
    commit_with(inner, DataFlush::All)
}

/// `commit` for background work beside clients (removal and reclaim
/// batches): it flushes their data only when the transaction maps some
/// not yet flushed, and leaves writes in place to their next flush (see
/// `DataFlush::IfMapped`). Under random overwrites a data flush was most of
/// a commit's time, and the journal's own flush came after it.
pub(super) fn commit_background(inner: &Inner) -> Result<()> {
    commit_with(inner, DataFlush::IfMapped)
}

fn commit_with(inner: &Inner, flush: DataFlush) -> Result<()> {
    let mut state = wait_for_io(inner, lock_state(inner));
    settle_io(inner, &mut state)?;
    ensure_changes_allowed(&state)?;
    let io = match state.prepare_commit_with(flush) {
        Ok(PreparedCommit::Done(frees)) => {
            release_frees(inner, &mut state, frees);
            drop(state);
            punch_freed(inner);
            return Ok(());
        }
        Ok(PreparedCommit::Io(io)) => io,
        Err(e) => {
            state.mark_failed(e.to_string());
            return Err(e);
        }
    };
    let mut state = run_off_lock(inner, state, || IoOutcome::Commit(io.run()));
    settle_io(inner, &mut state)?;
    // Another committer may have finished it: its failure is the pool's.
    ensure_changes_allowed(&state)?;
    if state.wants_checkpoint() {
        state = checkpoint_off_lock(inner, state);
    }
    drop(state);
    punch_freed(inner);
    Ok(())
}

/// Checkpoints with the state lock let go during the checkpoint's I/O, as
/// a commit does: each of its steps flushes the whole store, which writes
/// back every client's unflushed writes (half a second under a client
/// writing at full speed), and clients' requests must not wait for that.
fn checkpoint_off_lock<'a>(
    inner: &'a Inner,
    mut state: MutexGuard<'a, State>,
) -> MutexGuard<'a, State> {
    let io = state.prepare_checkpoint();
    let mut state = run_off_lock(inner, state, || IoOutcome::Checkpoint(io.run()));
    // Settles this checkpoint, unless another thread did first and has
    // since started a commit: a failure of that commit is in
    // `state.failed` for its committer and every later one to report.
    let _ = settle_io(inner, &mut state);
    state
}

/// Runs the I/O of the commit or checkpoint `state` has in flight with the
/// state lock let go, leaves its outcome for `settle_io`, and returns the
/// lock once no I/O runs. The I/O slot is taken before the state is let
/// go, so that whoever settles it (the caller, or another committer
/// first) waits for the I/O.
fn run_off_lock<'a>(
    inner: &'a Inner,
    state: MutexGuard<'a, State>,
    io: impl FnOnce() -> IoOutcome,
) -> MutexGuard<'a, State> {
    assert!(
        state.has_io_in_flight(),
        "I/O run off the lock is in flight"
    );
    let io_running = lock(&inner.commit_io);
    drop(state);
    let outcome = io();
    *lock(&inner.io_outcome) = Some(outcome);
    drop(io_running);
    wait_for_io(inner, lock_state(inner))
}

/// How I/O run without the state lock went, for whoever settles it.
pub(super) enum IoOutcome {
    Commit(CommitIoOutcome),
    Checkpoint(Result<()>),
}

/// Waits with the state lock let go while another commit's or
/// checkpoint's I/O runs, and returns the lock once none does: settling it
/// under the lock would hold every client's request for the rest of its
/// I/O (a data flush of every client's unflushed writes may take hundreds
/// of ms).
fn wait_for_io<'a>(inner: &'a Inner, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    while state.has_io_in_flight() && io_running(inner) {
        drop(state);
        drop(lock(&inner.commit_io));
        state = lock_state(inner);
    }
    state
}

/// True while a commit's or checkpoint's I/O holds `commit_io` (taken
/// before the state is let go, given back once its outcome is stored).
fn io_running(inner: &Inner) -> bool {
    matches!(
        inner.commit_io.try_lock(),
        Err(std::sync::TryLockError::WouldBlock)
    )
}

/// Finishes the commit or checkpoint whose I/O runs (or ran) without the
/// state lock, if there is one: waits for the I/O, then the bookkeeping
/// under the lock. Everything that commits or checkpoints under the lock
/// does this first. A failed commit fails the pool; a failed checkpoint
/// leaves its writes to the next one (as an inline one that fails after a
/// commit does).
pub(super) fn settle_io(inner: &Inner, state: &mut State) -> Result<()> {
    if !state.has_io_in_flight() {
        return Ok(());
    }
    let outcome = {
        let _io_done = lock(&inner.commit_io);
        lock(&inner.io_outcome).take()
    };
    let lost = || {
        Error::new(
            ErrorKind::Io,
            "I/O run without the state lock ended without an outcome (it panicked)",
        )
    };
    if state.checkpoint_in_flight() {
        let result = match outcome {
            Some(IoOutcome::Checkpoint(result)) => result,
            _ => Err(lost()),
        };
        if let Err(e) = state.finish_checkpoint(result) {
            tracing::warn!("a checkpoint failed; the next one writes it again: {e}");
        }
        return Ok(());
    }
    let outcome = match outcome {
        Some(IoOutcome::Commit(outcome)) => outcome,
        _ => CommitIo::failed(lost()),
    };
    match state.finish_commit(outcome) {
        Ok(frees) => {
            release_frees(inner, state, frees);
            Ok(())
        }
        Err(e) => {
            state.mark_failed(e.to_string());
            Err(e)
        }
    }
}

/// Makes blocks freed by a durable commit reusable, once no reader that
/// translated its addresses before the commit can still be reading them.
pub(super) fn release_frees(inner: &Inner, state: &mut State, frees: Vec<BlockAddr>) {
    if !frees.is_empty() {
        let _gate = write_gate(inner);
        state.make_reusable(frees);
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Commits, then makes the freed blocks reusable. Lock order is always
/// state, then gate: a reader takes the gate while it holds the state lock
/// and lets the state go before its I/O, so the committer (holding the
/// state) waits only for reads already in flight, never for a reader that
/// waits for it.
pub(super) fn commit_locked(inner: &Inner, state: &mut State) -> Result<()> {
    settle_io(inner, state)?;
    ensure_changes_allowed(state)?;
    let frees = match state.commit() {
        Ok(frees) => frees,
        Err(e) => {
            // What is in memory may now match nothing durable: take no
            // more changes rather than retry with half-changed state.
            state.mark_failed(e.to_string());
            return Err(e);
        }
    };
    release_frees(inner, state, frees);
    Ok(())
}

/// Commits when the metadata waiting for a commit nears what one journal
/// transaction may hold.
pub(super) fn commit_if_large(inner: &Inner, state: &mut State) -> Result<()> {
    if state.pending_commit_blocks() > state.auto_commit_blocks() {
        commit_locked(inner, state)?;
    }
    Ok(())
}
