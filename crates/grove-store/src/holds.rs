//! What retention needs of the volume table: snapshot ranks and holds.
//!
//! A rank is a byte of a snapshot's record (0 = none), set when the
//! snapshot is taken or later; grove-retention gives the levels meaning.
//!
//! A hold is a removed snapshot record with no tree, flagged as a hold and
//! named after its tag, carrying the held snapshot's GUID, parent and
//! creation generation (as a cursor carries its snapshot's), and the Unix
//! time its lease ends (0: until released). Being a record, a hold is
//! durable with the commit that places it, in the journal like every other
//! change, and the crash simulator and model tests cover it.

use crate::format::record::{VolumeKind, VolumeRecord};
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};

impl State {
    /// Every hold in the pool.
    pub(crate) fn holds(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.volume_table().removed_records().filter(|r| r.hold)
    }

    /// The holds on the snapshot whose GUID is `guid`.
    pub(crate) fn holds_on(&self, guid: [u8; 16]) -> impl Iterator<Item = &VolumeRecord> {
        self.holds().filter(move |r| r.guid == guid)
    }

    /// Places hold `tag` on live snapshot `snapshot`, replacing a hold of
    /// the same tag there (a new lease).
    pub(crate) fn place_hold(&mut self, snapshot: VolumeId, tag: &str, until_unix_secs: u64) {
        let snapshot = self.live_record(snapshot).clone();
        assert_eq!(
            snapshot.kind,
            VolumeKind::Snapshot,
            "a hold is on a snapshot"
        );
        self.release_hold(snapshot.guid, tag);
        let id = self.next_volume_id();
        self.volume_table_mut().insert(VolumeRecord {
            id,
            root: BlockAddr::NONE,
            name: tag.to_string(),
            removed: true,
            referenced_blocks: 0,
            receive_progress: None,
            cursor: false,
            rank: 0,
            hold: true,
            hold_until_unix_secs: until_unix_secs,
            ..snapshot
        });
        debug_assert_eq!(
            self.holds_on(snapshot.guid)
                .filter(|h| h.name == tag)
                .count(),
            1
        );
    }

    /// Drops hold `tag` on the snapshot whose GUID is `guid`; true if there
    /// was one.
    pub(crate) fn release_hold(&mut self, guid: [u8; 16], tag: &str) -> bool {
        let Some((id, parent)) = self
            .holds_on(guid)
            .find(|r| r.name == tag)
            .map(|r| (r.id, r.parent))
        else {
            return false;
        };
        self.volume_table_mut().drop_removed(id);
        if self.volume_table().removed(parent).is_some() {
            self.prune_removed(parent);
        }
        debug_assert!(self.holds_on(guid).all(|h| h.name != tag));
        true
    }

    /// Sets snapshot `id`'s rank (0: none).
    pub(crate) fn set_rank(&mut self, id: VolumeId, rank: u8) {
        assert_eq!(
            self.live_record(id).kind,
            VolumeKind::Snapshot,
            "only snapshots are ranked"
        );
        self.volume_table_mut()
            .update(id, |record| record.rank = rank);
        debug_assert_eq!(self.live_record(id).rank, rank);
    }
}
