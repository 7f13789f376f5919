//! The pool API that `grove send` and `grove receive` stand on: snapshot
//! identities (GUIDs and generations), what changed since a base named by
//! name, GUID or cursor, partial receives and replication cursors. The
//! stream itself is the replication crate's business; nothing here knows
//! its format.

use super::locking::{commit, commit_locked};
use super::{
    ensure_changes_allowed, ensure_name_free, now_unix_secs, validate_volume_name,
    validate_volume_size, DiffReport, Pool, Volume,
};
use crate::diff::DiffExtent;
use crate::error::{Error, ErrorKind, Result};
use crate::format::record::{VolumeKind, VolumeRecord};
use crate::state::State;

/// Snapshots an error message suggests as other bases, at most.
const BASE_HINTS_MAX: usize = 16;

/// A snapshot (or a bookmark or cursor of one) as streams name it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotIdentity {
    pub name: String,
    pub guid: [u8; 16],
    pub kind: VolumeKind,
    pub created_generation: u64,
    pub created_unix_secs: u64,
    pub size_bytes: u64,
    /// Its data can still be read (a live volume, not a bookmark or cursor).
    pub live: bool,
}

/// The base of a diff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiffFrom {
    /// A live volume or snapshot, or else the newest bookmark of that name.
    Name(String),
    /// The snapshot with this GUID: live, or a bookmark or cursor of it.
    Guid([u8; 16]),
    /// Where replication target TARGET's cursor points.
    Cursor(String),
}

/// A receive in progress, as its record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartialReceive {
    pub name: String,
    /// GUID of the snapshot being received.
    pub target_guid: [u8; 16],
    /// GUID of the snapshot it started from, for an incremental stream.
    pub base_guid: Option<[u8; 16]>,
    /// Bytes of the target applied and durable.
    pub progress_bytes: u64,
    pub size_bytes: u64,
}

/// A replication target's cursor.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CursorInfo {
    pub target: String,
    /// The snapshot last sent there, as 32 hex digits.
    pub snapshot_guid: String,
    /// Its name, if it still lives in this pool.
    pub snapshot: Option<String>,
    pub created_generation: u64,
}

pub fn guid_hex(guid: &[u8; 16]) -> String {
    hex::encode(guid)
}

fn identity(record: &VolumeRecord, live: bool) -> SnapshotIdentity {
    SnapshotIdentity {
        name: record.name.clone(),
        guid: record.guid,
        kind: record.kind,
        created_generation: record.created_generation,
        created_unix_secs: record.created_unix_secs,
        size_bytes: record.size_bytes,
        live,
    }
}

impl State {
    /// The record a diff starts from, and whether it is live.
    fn diff_from_record(&self, from: &DiffFrom) -> Result<(VolumeRecord, bool)> {
        match from {
            DiffFrom::Name(name) => self.diff_base(name),
            DiffFrom::Guid(guid) => {
                if let Some(live) = self.snapshot_by_guid(guid) {
                    return Ok((live.clone(), true));
                }
                self.volume_table()
                    .removed_records()
                    .filter(|r| &r.guid == guid && r.kind == VolumeKind::Snapshot)
                    .max_by_key(|r| r.created_generation)
                    .map(|r| (r.clone(), false))
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::NotFound,
                            format!(
                                "no snapshot, bookmark or cursor with GUID {} in this pool",
                                guid_hex(guid)
                            ),
                        )
                    })
            }
            DiffFrom::Cursor(target) => {
                let cursor = self.cursor(target).ok_or_else(|| {
                    Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "replication target {target:?} has no cursor in this pool: send a full stream (or --from a snapshot) with --cursor {target} once to start one"
                        ),
                    )
                })?;
                // Reading the snapshot itself, while it lives, also lets a
                // sender read the old contents of what changed.
                match self.snapshot_by_guid(&cursor.guid) {
                    Some(live) => Ok((live.clone(), true)),
                    None => Ok((cursor.clone(), false)),
                }
            }
        }
    }
}

impl Pool {
    /// The identity of a visible volume or snapshot.
    pub fn identity(&self, name: &str) -> Result<SnapshotIdentity> {
        let state = self.state();
        Ok(identity(state.volume_by_name(name)?, true))
    }

    /// The identity of a diff's base: a live snapshot, or a bookmark or
    /// cursor of one (not live: its data is gone).
    pub fn base_identity(&self, from: &DiffFrom) -> Result<SnapshotIdentity> {
        let state = self.state();
        let (record, live) = state.diff_from_record(from)?;
        let mut found = identity(&record, live);
        if record.cursor {
            // A cursor is named after its target; show the snapshot's GUID.
            found.name = format!("cursor {}", record.name);
        }
        Ok(found)
    }

    /// The GUID of every record the pool still knows: live volumes and
    /// snapshots (partial receives too), bookmarks and cursors. What is
    /// kept by GUID beside the pool (the digest cache) can go for any
    /// other.
    pub fn known_guids(&self) -> std::collections::HashSet<[u8; 16]> {
        let state = self.state();
        state.volume_table().all_records().map(|r| r.guid).collect()
    }

    /// The visible snapshot with GUID `guid`.
    pub fn snapshot_by_guid(&self, guid: &[u8; 16]) -> Option<SnapshotIdentity> {
        self.state()
            .snapshot_by_guid(guid)
            .map(|record| identity(record, true))
    }

    /// The extents where `newer` differs from the base, like `diff`, with
    /// the base named by name, GUID or cursor.
    pub fn diff_from(&self, from: &DiffFrom, newer: &str) -> Result<DiffReport> {
        let mut state = self.state();
        let (base, base_live) = state.diff_from_record(from)?;
        let newer = state.volume_by_name(newer)?.clone();
        let runs = state.diff_runs_from(&base, base_live, &newer, 0, u64::MAX)?;
        let block_bytes = state.geometry().block_bytes();
        let size = base.size_bytes.max(newer.size_bytes);
        let extents = runs
            .into_iter()
            .map(|(first, count, data)| {
                let offset_bytes = first * block_bytes;
                DiffExtent {
                    offset_bytes,
                    length_bytes: (count * block_bytes).min(size - offset_bytes),
                    data,
                }
            })
            .collect();
        Ok(DiffReport {
            base: base.name.clone(),
            newer: newer.name.clone(),
            base_removed: !base_live,
            base_size_bytes: base.size_bytes,
            newer_size_bytes: newer.size_bytes,
            extents,
        })
    }

    /// Visible snapshots of `name`'s line older than it, newest first, at
    /// most `BASE_HINTS_MAX`: its older siblings (snapshots of the same
    /// volume) and its snapshot ancestors (a received line, where each
    /// snapshot is made from the one before).
    pub fn earlier_snapshots(&self, name: &str) -> Result<Vec<SnapshotIdentity>> {
        let mut found = self.earlier_snapshots_unbounded(name)?;
        found.sort_by_key(|s| std::cmp::Reverse(s.created_generation));
        found.truncate(BASE_HINTS_MAX);
        Ok(found)
    }

    /// Visible snapshots strictly between `base` and `target` in
    /// `target`'s line, oldest first: what a range stream (`-I`) carries
    /// before `target` itself.
    pub fn snapshots_between(
        &self,
        base: &SnapshotIdentity,
        target: &str,
    ) -> Result<Vec<SnapshotIdentity>> {
        let mut between: Vec<SnapshotIdentity> = self
            .earlier_snapshots_unbounded(target)?
            .into_iter()
            .filter(|s| s.created_generation > base.created_generation && s.guid != base.guid)
            .collect();
        between.sort_by_key(|s| s.created_generation);
        between.dedup_by_key(|s| s.guid);
        Ok(between)
    }

    fn earlier_snapshots_unbounded(&self, name: &str) -> Result<Vec<SnapshotIdentity>> {
        let state = self.state();
        let record = state.volume_by_name(name)?.clone();
        let mut found: Vec<SnapshotIdentity> = state
            .volume_table()
            .children_of(record.parent)
            .filter_map(|id| state.volume_table().live(id))
            .filter(|r| {
                r.is_visible()
                    && r.kind == VolumeKind::Snapshot
                    && r.created_generation < record.created_generation
            })
            .map(|r| identity(r, true))
            .collect();
        let mut parent = record.parent;
        for _ in 0..=state.volume_table().record_count() {
            match state.volume_table().live(parent) {
                Some(p) if p.is_visible() && p.kind == VolumeKind::Snapshot => {
                    found.push(identity(p, true));
                    parent = p.parent;
                }
                _ => break,
            }
        }
        Ok(found)
    }

    // ----- receiving -----

    /// Starts a partial receive named `name` of the snapshot `target_guid`:
    /// empty for a full stream, a writable copy of the snapshot
    /// `base_guid` for an incremental one. Durable with the first progress
    /// recorded (`record_receive_progress`) or the finish, whichever comes
    /// first, or with any other commit: a receive of a few records costs
    /// one commit in all.
    pub fn begin_receive(
        &self,
        name: &str,
        base_guid: Option<[u8; 16]>,
        target_guid: [u8; 16],
        size_bytes: u64,
    ) -> Result<Volume> {
        validate_volume_name(name)?;
        validate_volume_size(size_bytes)?;
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        ensure_name_free(&state, name)?;
        let base = match base_guid {
            None => None,
            Some(guid) => Some(
                state
                    .snapshot_by_guid(&guid)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::NotFound,
                            format!("no snapshot with GUID {} in this pool", guid_hex(&guid)),
                        )
                    })?
                    .id,
            ),
        };
        let id = state.begin_receive(name, base, target_guid, size_bytes, now_unix_secs())?;
        Ok(Volume {
            inner: self.inner.clone(),
            id,
        })
    }

    /// The partial receive named `name`, if there is one.
    pub fn partial_receive(&self, name: &str) -> Option<PartialReceive> {
        let state = self.state();
        let record = state.partial_receive(name).ok()?;
        Some(partial(&state, record))
    }

    /// Every partial receive, in id order.
    pub fn partial_receives(&self) -> Vec<PartialReceive> {
        let state = self.state();
        state
            .volume_table()
            .live_records()
            .filter(|r| r.receive_progress.is_some())
            .map(|r| partial(&state, r))
            .collect()
    }

    /// A handle for writing into the partial receive named `name`.
    pub fn receive_volume(&self, name: &str) -> Result<Volume> {
        let id = self.state().partial_receive(name)?.id;
        Ok(Volume {
            inner: self.inner.clone(),
            id,
        })
    }

    /// Makes what was written into partial receive `name` durable,
    /// together with its progress: after a crash, receiving resumes from
    /// `progress_bytes`. The commit's I/O runs without the state lock, so
    /// the receiver can go on writing meanwhile: what it writes past
    /// `progress_bytes` may or may not be in this commit, and either is
    /// right.
    pub fn record_receive_progress(&self, name: &str, progress_bytes: u64) -> Result<()> {
        {
            let mut state = self.state();
            ensure_changes_allowed(&state)?;
            let id = state.partial_receive(name)?.id;
            state.set_receive_progress(id, progress_bytes);
        }
        commit(&self.inner)
    }

    /// Turns partial receive `name` into a visible read-only snapshot,
    /// made at `created_unix_secs` (the sender's time). Durable when it
    /// returns if `durable`; otherwise with the next commit (a range
    /// stream's earlier snapshots commit with the later ones).
    pub fn finish_receive(&self, name: &str, created_unix_secs: u64, durable: bool) -> Result<()> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let id = state.partial_receive(name)?.id;
        state.finish_receive(id, created_unix_secs)?;
        if durable {
            commit_locked(&self.inner, &mut state)?;
        }
        Ok(())
    }

    /// Drops partial receive `name`: the reclaimer gives back what it
    /// wrote. Returns those bytes.
    pub fn abort_receive(&self, name: &str) -> Result<u64> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let id = state.partial_receive(name)?.id;
        let before = state.pending_free_blocks(false)?;
        state.abort_receive(id);
        let after = state.pending_free_blocks(false)?;
        commit_locked(&self.inner, &mut state)?;
        Ok(after.saturating_sub(before) * state.geometry().block_bytes())
    }

    // ----- cursors -----

    /// Points replication target `target`'s cursor at snapshot `snapshot`.
    /// Durable when it returns.
    pub fn set_cursor(&self, target: &str, snapshot: &str) -> Result<()> {
        validate_volume_name(target).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("invalid replication target name {target:?}: use letters, digits and . _ - + : @"),
            )
        })?;
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let record = state.volume_by_name(snapshot)?.clone();
        if record.kind != VolumeKind::Snapshot {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "a cursor marks a snapshot, and {snapshot:?} is a writable {}",
                    record.kind.as_str()
                ),
            ));
        }
        state.set_cursor(target, record.id);
        commit_locked(&self.inner, &mut state)
    }

    /// Drops target `target`'s cursor; NotFound if it has none.
    pub fn remove_cursor(&self, target: &str) -> Result<()> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        if !state.remove_cursor(target) {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("replication target {target:?} has no cursor in this pool"),
            ));
        }
        commit_locked(&self.inner, &mut state)
    }

    /// Every replication cursor, by target name.
    pub fn cursors(&self) -> Vec<CursorInfo> {
        let state = self.state();
        let mut cursors: Vec<CursorInfo> = state
            .cursors()
            .map(|cursor| CursorInfo {
                target: cursor.name.clone(),
                snapshot_guid: guid_hex(&cursor.guid),
                snapshot: state.snapshot_by_guid(&cursor.guid).map(|s| s.name.clone()),
                created_generation: cursor.created_generation,
            })
            .collect();
        cursors.sort_by(|a, b| a.target.cmp(&b.target));
        cursors
    }
}

fn partial(state: &State, record: &VolumeRecord) -> PartialReceive {
    let base_guid = state
        .any_record(record.parent)
        .filter(|_| record.kind == VolumeKind::Clone)
        .map(|base| base.guid);
    PartialReceive {
        name: record.name.clone(),
        target_guid: record.guid,
        base_guid,
        progress_bytes: record.receive_progress.unwrap_or(0),
        size_bytes: record.size_bytes,
    }
}
