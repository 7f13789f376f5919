//! Removing many snapshots at once, for pruning (issue 25): the request
//! is checked whole first, then the snapshots are removed in batches of
//! at most REMOVE_BATCH_SNAPSHOTS, each batch one lock hold, so clients go
//! on between batches. Batches share commits: one when the metadata
//! waiting for a commit nears what one journal transaction holds, and one
//! at the end, each with its I/O run without the lock. A commit is the
//! costly part while clients write: its flush carries every write they
//! have not flushed, so 10,000 snapshots are a few commits, not ten.
//! A removal is O(1) (its record is marked removed; the reclaimer gives
//! the tree back later), so a batch writes the records it touches and
//! nothing more: no tree is walked, and no space figure is computed (that
//! walks every removed tree; `Pool::pending_free_bytes` and the
//! reclaimer's own figures tell it when wanted).
//!
//! A caller that shares the pool with clients (the daemons' prune) goes a
//! batch at a time instead: `begin_snapshot_removal` checks the request,
//! `remove_next_batch` removes and commits one batch, and between two the
//! caller may give way to the clients, as the reclaimer does.

use std::collections::BTreeSet;

use super::locking::commit_background;
use super::{ensure_changes_allowed, Pool, RemoveOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::format::record::VolumeKind;
use crate::state::State;
use crate::types::VolumeId;

/// Most snapshots one batch removes: bounds how long the state lock is
/// held (3 to 12 µs each beside clients writing at full speed on the
/// 2-core test machine, so a batch of 1,024 held their requests up to
/// 12 ms). A batch that nears what one journal transaction holds ends
/// early, and is committed.
pub const REMOVE_BATCH_SNAPSHOTS: usize = 256;

/// What `Pool::remove_snapshots` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemovalSummary {
    /// Names of the volumes removed, in the order removed: each snapshot
    /// asked for, and with `recursive` its descendants just before it.
    pub removed: Vec<String>,
    /// Names that were gone when their batch came: removed by another
    /// client after the request was checked.
    pub vanished: Vec<String>,
    /// Batches, each one lock hold.
    pub batches: u64,
    /// Commits the batches shared (one at least, at the end).
    #[serde(default)]
    pub commits: u64,
}

/// A checked request to remove snapshots, removed a batch at a time by
/// [`Pool::remove_next_batch`] (see `removal.rs`).
#[derive(Debug)]
pub struct SnapshotRemoval {
    /// What the request removes, in order: (id, name).
    doomed: Vec<(VolumeId, String)>,
    /// How many of `doomed` the batches so far went through.
    done: usize,
    force: bool,
    summary: RemovalSummary,
}

impl SnapshotRemoval {
    /// Every batch has run.
    pub fn is_done(&self) -> bool {
        self.done == self.doomed.len()
    }

    /// What the batches so far did.
    pub fn summary(&self) -> &RemovalSummary {
        &self.summary
    }

    pub fn into_summary(self) -> RemovalSummary {
        debug_assert!(self.is_done(), "a removal's summary taken before its end");
        self.summary
    }
}

impl Pool {
    /// Removes the named read-only snapshots (with their descendants if
    /// `options.recursive`), in batches: see `removal.rs`. The request is
    /// checked whole before anything is removed: every name must be a
    /// live snapshot, and none (descendants included) may be claimed
    /// unless `options.force`; a name given twice is removed once. All are
    /// durable when it returns; an error in a batch leaves the earlier
    /// batches removed (durable at the next commit).
    /// The space comes back as the reclaimer runs.
    pub fn remove_snapshots(
        &self,
        names: &[String],
        options: RemoveOptions,
    ) -> Result<RemovalSummary> {
        let mut removal = self.begin_snapshot_removal(names, options)?;
        self.remove_all_batches(&mut removal)?;
        Ok(removal.into_summary())
    }

    /// `remove_snapshots` by volume id (as `VolumeSummary::id` gives it).
    pub fn remove_snapshots_by_id(
        &self,
        ids: &[u64],
        options: RemoveOptions,
    ) -> Result<RemovalSummary> {
        let mut removal = {
            let state = self.state();
            let ids = ids
                .iter()
                .map(|&id| Ok(state.volume_by_id(VolumeId(id))?.id))
                .collect::<Result<Vec<_>>>()?;
            self.checked_removal(&state, &ids, options)?
        };
        self.remove_all_batches(&mut removal)?;
        Ok(removal.into_summary())
    }

    /// Checks a request as `remove_snapshots` does, removing nothing yet:
    /// [`Pool::remove_next_batch`] removes it a batch at a time.
    pub fn begin_snapshot_removal(
        &self,
        names: &[String],
        options: RemoveOptions,
    ) -> Result<SnapshotRemoval> {
        let state = self.state();
        let ids = names
            .iter()
            .map(|name| Ok(state.volume_by_name(name)?.id))
            .collect::<Result<Vec<_>>>()?;
        self.checked_removal(&state, &ids, options)
    }

    /// A removal of `ids` (and, recursive, their descendants), checked
    /// whole, with nothing removed yet.
    fn checked_removal(
        &self,
        state: &State,
        ids: &[VolumeId],
        options: RemoveOptions,
    ) -> Result<SnapshotRemoval> {
        Ok(SnapshotRemoval {
            doomed: self.doomed_snapshots(state, ids, options)?,
            done: 0,
            force: options.force,
            summary: RemovalSummary::default(),
        })
    }

    /// Removes the next batch of `removal` (at most REMOVE_BATCH_SNAPSHOTS,
    /// one lock hold), and commits with the lock let go during the I/O if
    /// the batch neared what one journal transaction holds or was the
    /// last: every batch is durable once the removal is done. Returns
    /// whether it is done (a done removal is left as it is). An error
    /// leaves the earlier batches removed.
    pub fn remove_next_batch(&self, removal: &mut SnapshotRemoval) -> Result<bool> {
        if removal.is_done() {
            return Ok(true);
        }
        let rest = &removal.doomed[removal.done..];
        let batch = &rest[..rest.len().min(REMOVE_BATCH_SNAPSHOTS)];
        let (taken, commit_due) = self.remove_batch(batch, removal.force, &mut removal.summary)?;
        assert!(
            (1..=batch.len()).contains(&taken),
            "a batch goes through part of its snapshots"
        );
        removal.summary.batches += 1;
        removal.done += taken;
        if commit_due || removal.is_done() {
            // Never under the lock: the commit's flush may take long, and
            // clients go on meanwhile. It leaves their writes in place to
            // their own flush; the removals are durable when it returns.
            commit_background(&self.inner)?;
            removal.summary.commits += 1;
        }
        let summary = &removal.summary;
        debug_assert_eq!(summary.removed.len() + summary.vanished.len(), removal.done);
        Ok(removal.is_done())
    }

    /// Checks a request and lists what it removes, in order: (id, name).
    fn doomed_snapshots(
        &self,
        state: &State,
        ids: &[VolumeId],
        options: RemoveOptions,
    ) -> Result<Vec<(VolumeId, String)>> {
        ensure_changes_allowed(state)?;
        let mut seen = BTreeSet::new();
        let mut doomed = Vec::new();
        for &id in ids {
            let record = state.live_record(id);
            if record.kind != VolumeKind::Snapshot {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "volume {:?} is a writable {}, not a snapshot: remove it on its own with `grove rm {}`",
                        record.name,
                        record.kind.as_str(),
                        record.name
                    ),
                ));
            }
            let mut family = Vec::new();
            if options.recursive {
                family.extend(state.live_descendants(id));
            }
            // Deepest first, the snapshot itself last (see `Pool::remove`).
            family.reverse();
            family.push(id);
            for member in family {
                if seen.insert(member) {
                    doomed.push((member, state.live_record(member).name.clone()));
                }
            }
        }
        if !options.force {
            let ids: Vec<VolumeId> = doomed.iter().map(|(id, _)| *id).collect();
            self.ensure_unclaimed(state, &ids, "remove it")?;
            super::retention::ensure_not_held(state, &ids)?;
        }
        Ok(doomed)
    }

    /// Every batch of `removal`, one after another. Forced, each batch
    /// takes its snapshots' holds with them (a hold placed after the check
    /// refuses an unforced batch).
    fn remove_all_batches(&self, removal: &mut SnapshotRemoval) -> Result<()> {
        while !self.remove_next_batch(removal)? {}
        Ok(())
    }

    /// One batch under one lock hold: removes `batch` in order, and stops
    /// after a removal that brings the metadata waiting for a commit near
    /// what one journal transaction holds, for the caller to commit it
    /// without the lock. Returns how many of `batch` it went through, and
    /// whether a commit is due before the next batch.
    fn remove_batch(
        &self,
        batch: &[(VolumeId, String)],
        force: bool,
        summary: &mut RemovalSummary,
    ) -> Result<(usize, bool)> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let live: Vec<VolumeId> = batch
            .iter()
            .map(|(id, _)| *id)
            .filter(|&id| state.volume_table().live(id).is_some())
            .collect();
        super::retention::settle_holds(&mut state, &live, force)?;
        for (done, (id, name)) in batch.iter().enumerate() {
            // Another client may have removed (and even reused the name
            // of) a volume since the request was checked: the id decides.
            if state.volume_table().live(*id).is_none() {
                summary.vanished.push(name.clone());
                continue;
            }
            state.remove_volume(*id);
            debug_assert!(state.volume_table().live(*id).is_none());
            summary.removed.push(name.clone());
            if commit_due(&state) {
                return Ok((done + 1, true));
            }
        }
        Ok((batch.len(), commit_due(&state)))
    }
}

/// The metadata waiting for a commit nears what one journal transaction
/// holds (the write path's own threshold).
fn commit_due(state: &State) -> bool {
    state.pending_commit_blocks() > state.auto_commit_blocks()
}
