//! The pool API that retention stands on: snapshots taken with a rank (at
//! a time the caller's clock gives), ranks given later, and holds with
//! optional leases. What the ranks mean and which snapshots a policy keeps
//! is grove-retention's business; the engine only refuses to remove a held
//! snapshot without `force`.

use super::locking::commit_locked;
use super::{ensure_changes_allowed, guid_hex, validate_volume_name, Pool, VolumeInfo};
use crate::error::{Error, ErrorKind, Result};
use crate::format::record::{VolumeKind, VolumeRecord};
use crate::state::State;
use crate::types::VolumeId;
use std::collections::{HashMap, HashSet};

/// One hold, as `grove holds` lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HoldInfo {
    /// The held snapshot's name.
    pub snapshot: String,
    pub snapshot_guid: String,
    pub tag: String,
    /// When the lease ends by itself; None: held until released.
    pub until_unix_secs: Option<u64>,
}

impl Pool {
    /// A read-only snapshot of `source` ranked `rank` (0: none), created at
    /// `created_unix_secs`, in one commit: a crash never leaves it unranked.
    pub fn snapshot_ranked(
        &self,
        source: &str,
        name: &str,
        rank: u8,
        created_unix_secs: u64,
    ) -> Result<VolumeInfo> {
        self.snapshot_as(source, name, VolumeKind::Snapshot, rank, created_unix_secs)
    }

    /// Ranks snapshot `name` (0 takes its rank away).
    pub fn set_rank(&self, name: &str, rank: u8) -> Result<()> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let id = live_snapshot(&state, name, "ranked")?.id;
        state.set_rank(id, rank);
        commit_locked(&self.inner, &mut state)
    }

    /// Places hold `tag` on snapshot `snapshot`, until `until_unix_secs` if
    /// given; holding it again under the same tag sets a new lease.
    pub fn hold(&self, snapshot: &str, tag: &str, until_unix_secs: Option<u64>) -> Result<()> {
        validate_hold_tag(tag)?;
        if until_unix_secs == Some(0) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "a hold's lease must end after 1970",
            ));
        }
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let id = live_snapshot(&state, snapshot, "held")?.id;
        state.place_hold(id, tag, until_unix_secs.unwrap_or(0));
        commit_locked(&self.inner, &mut state)
    }

    /// Releases hold `tag` on snapshot `snapshot`; NotFound if there is none.
    pub fn release(&self, snapshot: &str, tag: &str) -> Result<()> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let guid = live_snapshot(&state, snapshot, "released")?.guid;
        if let Some(target) = tag.strip_prefix(CURSOR_HOLD_PREFIX) {
            // A cursor's hold goes with the cursor: the target's next send
            // is then full, or from a base named by hand.
            if state.cursor(target).is_some_and(|c| c.guid == guid) {
                let removed = state.remove_cursor(target);
                assert!(removed, "the cursor found a moment ago");
                return commit_locked(&self.inner, &mut state);
            }
        }
        if !state.release_hold(guid, tag) {
            let tags = hold_tags(&state, guid);
            let has = if tags.is_empty() {
                "it has no holds".to_string()
            } else {
                format!("its holds are {}", tags.join(", "))
            };
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("snapshot {snapshot:?} has no hold {tag:?}; {has}"),
            ));
        }
        commit_locked(&self.inner, &mut state)
    }

    /// Releases every hold whose lease ended at `now_unix_secs` or before,
    /// in one commit; returns them.
    pub fn release_expired_holds(&self, now_unix_secs: u64) -> Result<Vec<HoldInfo>> {
        let mut state = self.state();
        let expired: Vec<([u8; 16], HoldInfo)> = state
            .holds()
            .filter(|h| h.hold_until_unix_secs != 0 && h.hold_until_unix_secs <= now_unix_secs)
            .map(|h| (h.guid, hold_info(&state, h)))
            .collect();
        if expired.is_empty() {
            return Ok(Vec::new());
        }
        ensure_changes_allowed(&state)?;
        for (guid, hold) in &expired {
            let released = state.release_hold(*guid, &hold.tag);
            assert!(released, "an expired hold found a moment ago");
        }
        commit_locked(&self.inner, &mut state)?;
        Ok(expired.into_iter().map(|(_, hold)| hold).collect())
    }

    /// Every hold, by snapshot name then tag; a replication cursor holds
    /// the live snapshot it marks as `cursor:TARGET`.
    pub fn holds(&self) -> Vec<HoldInfo> {
        let state = self.state();
        let mut holds: Vec<HoldInfo> = state.holds().map(|h| hold_info(&state, h)).collect();
        holds.extend(cursor_holds(&state).map(|(snapshot, tag)| HoldInfo {
            snapshot: snapshot.name.clone(),
            snapshot_guid: guid_hex(&snapshot.guid),
            tag,
            until_unix_secs: None,
        }));
        holds.sort_by(|a, b| (&a.snapshot, &a.tag).cmp(&(&b.snapshot, &b.tag)));
        holds
    }
}

/// Refuses to remove held snapshots among `ids` unless forced; forced, their
/// holds go with them. Called by the removals under the state lock, before
/// anything changes; one pass over the holds, whatever the number of ids.
pub(super) fn settle_holds(state: &mut State, ids: &[VolumeId], force: bool) -> Result<()> {
    if force {
        drop_holds_of(state, ids);
        Ok(())
    } else {
        ensure_not_held(state, ids)
    }
}

/// Refuses, naming the first held snapshot among `ids` and its tags.
pub(super) fn ensure_not_held(state: &State, ids: &[VolumeId]) -> Result<()> {
    let mut held: HashMap<[u8; 16], Vec<String>> = HashMap::new();
    for hold in state.holds() {
        held.entry(hold.guid).or_default().push(hold.name.clone());
    }
    for (snapshot, tag) in cursor_holds(state) {
        held.entry(snapshot.guid).or_default().push(tag);
    }
    if held.is_empty() {
        return Ok(());
    }
    for &id in ids {
        let record = state.live_record(id);
        if let Some(tags) = held.get_mut(&record.guid) {
            tags.sort();
            let name = &record.name;
            let release = tags
                .iter()
                .map(|tag| format!("`grove release {name} {tag}`"))
                .collect::<Vec<_>>()
                .join(" and ");
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "snapshot {name:?} is held ({}); release it with {release}, or remove it with --force",
                    tags.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Releases every hold on the snapshots `ids` (a forced removal's).
pub(super) fn drop_holds_of(state: &mut State, ids: &[VolumeId]) {
    let guids: HashSet<[u8; 16]> = ids.iter().map(|&id| state.live_record(id).guid).collect();
    let doomed: Vec<([u8; 16], String)> = state
        .holds()
        .filter(|h| guids.contains(&h.guid))
        .map(|h| (h.guid, h.name.clone()))
        .collect();
    for (guid, tag) in doomed {
        let released = state.release_hold(guid, &tag);
        assert!(released, "a hold found a moment ago");
    }
}

/// The tag of the hold a replication cursor places on its snapshot.
pub const CURSOR_HOLD_PREFIX: &str = "cursor:";

/// The live snapshots replication cursors mark, each with its hold's tag
/// (`cursor:TARGET`). A forced removal keeps the cursor, as a bookmark:
/// the target's next incremental still has its base.
fn cursor_holds(state: &State) -> impl Iterator<Item = (&VolumeRecord, String)> {
    state.cursors().filter_map(|cursor| {
        let snapshot = state.snapshot_by_guid(&cursor.guid)?;
        Some((snapshot, format!("{CURSOR_HOLD_PREFIX}{}", cursor.name)))
    })
}

fn hold_tags(state: &State, guid: [u8; 16]) -> Vec<String> {
    let mut tags: Vec<String> = state.holds_on(guid).map(|h| h.name.clone()).collect();
    tags.sort();
    tags
}

fn hold_info(state: &State, hold: &VolumeRecord) -> HoldInfo {
    let snapshot = state
        .snapshot_by_guid(&hold.guid)
        .map(|s| s.name.clone())
        .unwrap_or_else(|| hold.name.clone());
    HoldInfo {
        snapshot,
        snapshot_guid: guid_hex(&hold.guid),
        tag: hold.name.clone(),
        until_unix_secs: (hold.hold_until_unix_secs != 0).then_some(hold.hold_until_unix_secs),
    }
}

fn live_snapshot<'a>(state: &'a State, name: &str, what: &str) -> Result<&'a VolumeRecord> {
    let record = state.volume_by_name(name)?;
    if record.kind != VolumeKind::Snapshot {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "only read-only snapshots are {what}, and {name:?} is a {}",
                record.kind.as_str()
            ),
        ));
    }
    Ok(record)
}

/// A hold's tag follows the rules of a volume name (it is stored as one).
fn validate_hold_tag(tag: &str) -> Result<()> {
    validate_volume_name(tag).map_err(|e| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("bad hold tag: {}", e.message()),
        )
    })
}
