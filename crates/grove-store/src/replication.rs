//! What replication needs of the volume table: partial receives, replication
//! cursors and lookups by GUID.
//!
//! A partial receive is a live writable record flagged as receiving: the
//! stream's blocks are written into its tree like any volume's, and its
//! progress (bytes of the target applied) lives in its record, so both are
//! durable in the same commit. It is hidden from listings and from lookups
//! by name, and its name is reserved for the snapshot it becomes: finishing
//! turns the record itself into that snapshot in one commit, so a receive
//! is either a whole visible snapshot or nothing visible.
//!
//! A cursor is a removed snapshot record with no tree, flagged as a cursor
//! and named after its target: it carries the GUID, parent and creation
//! generation of the snapshot last sent there, so the next incremental can
//! diff from it even once that snapshot is gone, and pruning keeps it.

use crate::error::{Error, ErrorKind, Result};
use crate::format::record::{VolumeKind, VolumeRecord};
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};

impl State {
    /// The visible snapshot whose GUID is `guid`.
    pub(crate) fn snapshot_by_guid(&self, guid: &[u8; 16]) -> Option<&VolumeRecord> {
        self.visible_records()
            .find(|r| &r.guid == guid && r.kind == VolumeKind::Snapshot)
    }

    /// A live record of any kind (partial receives too) whose GUID is `guid`.
    pub(crate) fn live_record_by_guid(&self, guid: &[u8; 16]) -> Option<&VolumeRecord> {
        self.volume_table().live_records().find(|r| &r.guid == guid)
    }

    /// The partial receive named `name`.
    pub(crate) fn partial_receive(&self, name: &str) -> Result<&VolumeRecord> {
        match self.volume_table().by_name(name) {
            Some(record) if record.receive_progress.is_some() => Ok(record),
            _ => Err(Error::new(
                ErrorKind::NotFound,
                format!("no partial receive named {name:?} in this pool"),
            )),
        }
    }

    /// Starts a partial receive named `name`: an empty volume of
    /// `size_bytes` for a full stream, or a writable copy of `base` resized
    /// to `size_bytes` for an incremental one. Its GUID is the target's.
    pub(crate) fn begin_receive(
        &mut self,
        name: &str,
        base: Option<VolumeId>,
        target_guid: [u8; 16],
        size_bytes: u64,
        now_unix_secs: u64,
    ) -> Result<VolumeId> {
        if let Some(existing) = self.live_record_by_guid(&target_guid) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "this pool already holds the stream's snapshot (same GUID) as {:?}",
                    existing.name
                ),
            ));
        }
        let id = match base {
            None => self.create_volume(name, size_bytes, now_unix_secs)?,
            Some(base) => {
                let id = self.snapshot(base, name, VolumeKind::Clone, now_unix_secs)?;
                if self.live_record(id).size_bytes != size_bytes {
                    self.resize_volume(id, size_bytes)?;
                }
                id
            }
        };
        self.volume_table_mut().update(id, |record| {
            record.guid = target_guid;
            record.receive_progress = Some(0);
        });
        Ok(id)
    }

    /// Records that a partial receive holds the target's first
    /// `progress_bytes`: durable with the next commit, as the data is.
    pub(crate) fn set_receive_progress(&mut self, id: VolumeId, progress_bytes: u64) {
        self.volume_table_mut().update(id, |record| {
            assert!(record.receive_progress.is_some(), "not a partial receive");
            record.receive_progress = Some(progress_bytes);
        });
    }

    /// Turns a partial receive into the read-only snapshot it was for: the
    /// same record, visible from the commit that writes it.
    pub(crate) fn finish_receive(&mut self, id: VolumeId, created_unix_secs: u64) -> Result<()> {
        let generation = self.take_generation()?;
        self.volume_table_mut().update(id, |record| {
            assert!(record.receive_progress.is_some(), "not a partial receive");
            record.receive_progress = None;
            record.kind = VolumeKind::Snapshot;
            record.created_generation = generation;
            record.share_floor_generation = generation;
            record.created_unix_secs = created_unix_secs;
        });
        Ok(())
    }

    /// Drops a partial receive: an ordinary removed volume from then on,
    /// whose tree the reclaimer gives back.
    pub(crate) fn abort_receive(&mut self, id: VolumeId) {
        self.volume_table_mut().update(id, |record| {
            assert!(record.receive_progress.is_some(), "not a partial receive");
            record.receive_progress = None;
        });
        self.remove_volume(id);
    }

    /// The cursor of replication target `target`.
    pub(crate) fn cursor(&self, target: &str) -> Option<&VolumeRecord> {
        self.volume_table()
            .removed_records()
            .find(|r| r.cursor && r.name == target)
    }

    pub(crate) fn cursors(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.volume_table().removed_records().filter(|r| r.cursor)
    }

    /// Points target `target`'s cursor at snapshot `snapshot`, replacing
    /// the cursor it had.
    pub(crate) fn set_cursor(&mut self, target: &str, snapshot: VolumeId) {
        let snapshot = self.live_record(snapshot).clone();
        assert_eq!(
            snapshot.kind,
            VolumeKind::Snapshot,
            "a cursor marks a snapshot"
        );
        self.remove_cursor(target);
        let id = self.next_volume_id();
        self.volume_table_mut().insert(VolumeRecord {
            id,
            parent: snapshot.parent,
            root: BlockAddr::NONE,
            name: target.to_string(),
            removed: true,
            referenced_blocks: 0,
            receive_progress: None,
            cursor: true,
            rank: 0,
            ..snapshot
        });
    }

    /// Drops target `target`'s cursor, if it has one; true if it had.
    pub(crate) fn remove_cursor(&mut self, target: &str) -> bool {
        let Some(old) = self.cursor(target).map(|r| (r.id, r.parent)) else {
            return false;
        };
        self.volume_table_mut().drop_removed(old.0);
        if self.volume_table().removed(old.1).is_some() {
            self.prune_removed(old.1);
        }
        true
    }
}
