//! Removing many snapshots at once, for pruning (issue 25): the request
//! is checked whole first, then the snapshots are removed in batches of
//! at most REMOVE_BATCH_SNAPSHOTS, each batch one lock hold and one commit
//! whose I/O runs without the lock, so clients go on between batches.
//! A removal is O(1) (its record is marked removed; the reclaimer gives
//! the tree back later), so a batch writes the records it touches and
//! nothing more: no tree is walked, and no space figure is computed (that
//! walks every removed tree; `Pool::pending_free_bytes` and the
//! reclaimer's own figures tell it when wanted).

use std::collections::BTreeSet;

use super::locking::commit;
use super::{ensure_changes_allowed, Pool, RemoveOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::format::record::VolumeKind;
use crate::state::State;
use crate::types::VolumeId;

/// Most snapshots one batch removes: bounds how long the state lock is
/// held (about a microsecond each) and makes 10,000 snapshots ten commits.
/// A batch that nears what one journal transaction holds ends early.
pub const REMOVE_BATCH_SNAPSHOTS: usize = 1024;

/// What `Pool::remove_snapshots` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemovalSummary {
    /// Names of the volumes removed, in the order removed: each snapshot
    /// asked for, and with `recursive` its descendants just before it.
    pub removed: Vec<String>,
    /// Names that were gone when their batch came: removed by another
    /// client after the request was checked.
    pub vanished: Vec<String>,
    /// Batches, each one lock hold and one commit.
    pub batches: u64,
}

impl Pool {
    /// Removes the named read-only snapshots (with their descendants if
    /// `options.recursive`), in batches: see `removal.rs`. The request is
    /// checked whole before anything is removed: every name must be a
    /// live snapshot, and none (descendants included) may be claimed
    /// unless `options.force`; a name given twice is removed once. Each
    /// batch is durable when the next begins, and all are when it
    /// returns; an error in a batch leaves the earlier batches removed.
    /// The space comes back as the reclaimer runs.
    pub fn remove_snapshots(
        &self,
        names: &[String],
        options: RemoveOptions,
    ) -> Result<RemovalSummary> {
        let doomed = {
            let state = self.state();
            let ids = names
                .iter()
                .map(|name| Ok(state.volume_by_name(name)?.id))
                .collect::<Result<Vec<_>>>()?;
            self.doomed_snapshots(&state, &ids, options)?
        };
        self.remove_in_batches(&doomed, options.force)
    }

    /// `remove_snapshots` by volume id (as `VolumeSummary::id` gives it).
    pub fn remove_snapshots_by_id(
        &self,
        ids: &[u64],
        options: RemoveOptions,
    ) -> Result<RemovalSummary> {
        let doomed = {
            let state = self.state();
            let ids = ids
                .iter()
                .map(|&id| Ok(state.volume_by_id(VolumeId(id))?.id))
                .collect::<Result<Vec<_>>>()?;
            self.doomed_snapshots(&state, &ids, options)?
        };
        self.remove_in_batches(&doomed, options.force)
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

    /// Removes `doomed` REMOVE_BATCH_SNAPSHOTS at a time, each batch
    /// committed with the lock let go during its I/O. Forced, each batch
    /// takes its snapshots' holds with them (a hold placed after the check
    /// refuses an unforced batch).
    fn remove_in_batches(
        &self,
        doomed: &[(VolumeId, String)],
        force: bool,
    ) -> Result<RemovalSummary> {
        let mut summary = RemovalSummary::default();
        let mut rest = doomed;
        while !rest.is_empty() {
            let batch = &rest[..rest.len().min(REMOVE_BATCH_SNAPSHOTS)];
            let taken = self.remove_batch(batch, force, &mut summary)?;
            assert!(
                (1..=batch.len()).contains(&taken),
                "a batch goes through part of its snapshots"
            );
            // Never under the lock: the commit's data flush may take long
            // (every client's unflushed writes), and clients go on meanwhile.
            commit(&self.inner)?;
            summary.batches += 1;
            rest = &rest[taken..];
        }
        debug_assert_eq!(summary.removed.len() + summary.vanished.len(), doomed.len());
        Ok(summary)
    }

    /// One batch under one lock hold: removes `batch` in order, and stops
    /// after a removal that brings the metadata waiting for a commit near
    /// what one journal transaction holds, for the caller to commit it
    /// without the lock. Returns how many of `batch` it went through.
    fn remove_batch(
        &self,
        batch: &[(VolumeId, String)],
        force: bool,
        summary: &mut RemovalSummary,
    ) -> Result<usize> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let live: Vec<VolumeId> = batch
            .iter()
            .map(|(id, _)| *id)
            .filter(|&id| state.volume_table.live(id).is_some())
            .collect();
        super::retention::settle_holds(&mut state, &live, force)?;
        for (done, (id, name)) in batch.iter().enumerate() {
            // Another client may have removed (and even reused the name
            // of) a volume since the request was checked: the id decides.
            if state.volume_table.live(*id).is_none() {
                summary.vanished.push(name.clone());
                continue;
            }
            state.remove_volume(*id);
            debug_assert!(state.volume_table.live(*id).is_none());
            summary.removed.push(name.clone());
            if state.pending_commit_blocks() > state.auto_commit_blocks() {
                return Ok(done + 1);
            }
        }
        Ok(batch.len())
    }
}
