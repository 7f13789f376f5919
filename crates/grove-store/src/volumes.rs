//! Volumes: creating, snapshotting, removing, renaming, resizing and
//! rolling back, and the family bookkeeping (children, removed records and
//! bookmarks). Everything here is O(1) in the volume's size: removal hands
//! the tree to the reclaimer (`reclaim.rs`) instead of walking it.

use std::collections::{BTreeSet, HashMap};

use crate::error::{Error, ErrorKind, Result};
use crate::format::node::{Entry, Node, NodeKind, BIRTH_GENERATION_MAX};
use crate::format::record::{VolumeKind, VolumeRecord};
use crate::state::State;
use crate::types::{BlockAddr, VolumeId};

/// Removed snapshots kept per parent as bookmarks, newest first, so that
/// `diff` still works from a snapshot that was removed after a later one
/// was taken (incremental replication from a deleted base).
pub const BOOKMARKS_PER_PARENT_MAX: usize = 16;

impl State {
    /// Live volumes as listed, in id order: not partial receives.
    pub(crate) fn visible_records(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.volume_table()
            .live_records()
            .filter(|r| r.is_visible())
    }

    /// A visible live volume: a partial receive holds its name, but is
    /// not a volume yet.
    pub fn volume_by_name(&self, name: &str) -> Result<&VolumeRecord> {
        match self.volume_table().by_name(name) {
            Some(record) if record.receive_progress.is_none() => Ok(record),
            Some(_) => Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "{name:?} is a partial receive, not a volume yet: resume it with `grove send --resume TOKEN` (`grove receive --status {name}` shows the token) or drop it with `grove receive --abort {name}`"
                ),
            )),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("no volume named {name:?} in this pool"),
            )),
        }
    }

    pub fn volume_by_id(&self, id: VolumeId) -> Result<&VolumeRecord> {
        self.volume_table().live(id).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("{id} no longer exists (it was removed)"),
            )
        })
    }

    /// Every tree's root and height: live volumes', and removed ones' the
    /// reclaimer has not given back yet. What rebuilding counts or maps
    /// from the trees starts from.
    pub(crate) fn tree_roots(&self) -> Vec<(BlockAddr, u8)> {
        self.volume_table()
            .all_records()
            .filter(|r| !r.root.is_none())
            .map(|r| (r.root, r.height))
            .collect()
    }

    /// A live record the caller knows exists.
    pub(crate) fn live_record(&self, id: VolumeId) -> &VolumeRecord {
        self.volume_table().live(id).expect("volume exists")
    }

    /// A live or removed record.
    pub(crate) fn any_record(&self, id: VolumeId) -> Option<&VolumeRecord> {
        self.volume_table().any(id)
    }

    /// The nearest live ancestor of a volume: its parent, or the parent's
    /// parent if the parent was removed, and so on.
    pub fn live_ancestor(&self, record: &VolumeRecord) -> Option<&VolumeRecord> {
        let mut parent = record.parent;
        // Ids only grow down a family, so the walk ends; the bound guards
        // against a damaged table all the same.
        for _ in 0..=self.volume_table().record_count() {
            let ancestor = self.any_record(parent)?;
            if !ancestor.removed {
                return Some(ancestor);
            }
            parent = ancestor.parent;
        }
        None
    }

    /// Live descendants of `id`, children before grandchildren.
    pub fn live_descendants(&self, id: VolumeId) -> Vec<VolumeId> {
        let mut out = Vec::new();
        let mut queue = vec![id];
        let mut seen = BTreeSet::new();
        while let Some(next) = queue.pop() {
            for child in self.volume_table().children_of(next) {
                if !seen.insert(child) {
                    continue;
                }
                if self.volume_table().live(child).is_some() {
                    out.push(child);
                }
                queue.push(child);
            }
        }
        out
    }

    /// The live volumes whose nearest live ancestor is `id` (as summaries
    /// show their parent): its live children, and through removed ones
    /// theirs. In creation order.
    pub fn children_shown_under(&self, id: VolumeId) -> Vec<VolumeId> {
        let mut out = Vec::new();
        let mut removed = vec![id];
        // A removed record is kept while it has children, so every line
        // down from `id` ends at a live volume; ids only grow down a
        // family, so there is no cycle to guard against.
        while let Some(next) = removed.pop() {
            for child in self.volume_table().children_of(next) {
                match self.volume_table().live(child) {
                    Some(_) => out.push(child),
                    None => removed.push(child),
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// The generation a snapshot, clone or rollback takes; the pool moves
    /// on to the next one so that every later write is born after it.
    pub(crate) fn take_generation(&mut self) -> Result<u64> {
        let generation = self.superblock().birth_generation;
        if generation >= BIRTH_GENERATION_MAX {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "this pool has used all {BIRTH_GENERATION_MAX} snapshot generations its format allows"
                ),
            ));
        }
        self.advance_birth_generation(generation + 1);
        Ok(generation)
    }

    /// A new empty volume: just an empty root node.
    pub fn create_volume(
        &mut self,
        name: &str,
        size_bytes: u64,
        now_unix_secs: u64,
    ) -> Result<VolumeId> {
        let height = self
            .geometry()
            .height_for(self.geometry().blocks_for(size_bytes));
        let root = self.insert_new_node(Node::empty(
            NodeKind::VolumeData,
            height - 1,
            self.geometry().entries_per_node,
        ))?;
        let id = self.next_volume_id();
        let generation = self.superblock().birth_generation;
        self.volume_table_mut().insert(VolumeRecord {
            size_bytes,
            root,
            height,
            created_generation: generation,
            ..fresh_record(id, name, VolumeKind::Volume, now_unix_secs)
        });
        Ok(id)
    }

    /// A new root that points at everything `source_root` points at: one
    /// block written and one reference taken per child, whatever the size.
    fn copy_root(&mut self, source_root: BlockAddr, height: u8) -> Result<BlockAddr> {
        let copy = self
            .load_node(source_root, NodeKind::VolumeData, height - 1)?
            .clone();
        self.reference_children(&copy)?;
        self.insert_new_node(copy)
    }

    /// A snapshot or clone of `source`. O(1) whatever the volume's size.
    pub fn snapshot(
        &mut self,
        source: VolumeId,
        name: &str,
        kind: VolumeKind,
        now_unix_secs: u64,
    ) -> Result<VolumeId> {
        assert_ne!(kind, VolumeKind::Volume);
        let source_record = self.live_record(source).clone();
        let new_root = self.copy_root(source_record.root, source_record.height)?;
        let generation = self.take_generation()?;
        // ZFS's `written`: a snapshot of a writable volume counts what the
        // volume wrote since its previous snapshot, and the volume starts
        // counting anew. A clone counts from now, and so does a snapshot of
        // a snapshot (nothing was written between them).
        let restarts_written = kind == VolumeKind::Snapshot && source_record.kind.is_writable();
        let written_base_generation = self.volume_table_mut().update(source, |source_mut| {
            source_mut.share_floor_generation = generation;
            if restarts_written {
                std::mem::replace(&mut source_mut.written_base_generation, generation)
            } else {
                generation
            }
        });
        let id = self.next_volume_id();
        self.volume_table_mut().insert(VolumeRecord {
            parent: source,
            size_bytes: source_record.size_bytes,
            root: new_root,
            height: source_record.height,
            referenced_blocks: source_record.referenced_blocks,
            created_generation: generation,
            share_floor_generation: generation,
            written_base_generation,
            ..fresh_record(id, name, kind, now_unix_secs)
        });
        Ok(id)
    }

    /// Removes a volume in O(1): its record is marked removed and its tree
    /// is left for the reclaimer, which gives back every block no other
    /// volume reaches. Its children keep their parent link to the removed
    /// record, which stays while they need it.
    pub fn remove_volume(&mut self, id: VolumeId) {
        self.volume_table_mut().mark_removed(id);
    }

    /// What `grove rollback SNAPSHOT [VOLUME]` reads from and resets:
    /// (source, target). Named alone, `snapshot` must be a read-only
    /// snapshot, and the target is the writable volume it was taken from,
    /// its parent, never a volume further up: a clone named alone once
    /// rolled its grandparent back to the clone's contents. Resetting a
    /// volume to a writable volume's contents needs both names written
    /// out. Errors name what the caller named, and say where a snapshot
    /// was taken from only as that.
    pub fn rollback_records(
        &self,
        snapshot: &str,
        volume: Option<&str>,
    ) -> Result<(VolumeRecord, VolumeRecord)> {
        let source = self.volume_by_name(snapshot)?.clone();
        let target = match volume {
            Some(name) => {
                let target = self.volume_by_name(name)?;
                if !target.kind.is_writable() {
                    return Err(Error::new(
                        ErrorKind::ReadOnly,
                        format!(
                            "cannot roll {name:?} back to {snapshot:?}: {name:?} is a read-only snapshot; name a writable volume to reset"
                        ),
                    ));
                }
                target.clone()
            }
            None => self.rollback_parent(&source)?.clone(),
        };
        if target.id == source.id {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("cannot roll {snapshot:?} back to itself"),
            ));
        }
        Ok((source, target))
    }

    /// The volume a snapshot named alone rolls back: its parent, if that
    /// is live and writable.
    fn rollback_parent(&self, source: &VolumeRecord) -> Result<&VolumeRecord> {
        let name = &source.name;
        let refuse = |why: String| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("cannot roll back to {name:?} alone: {why}; name the volume to reset: grove rollback {name} VOLUME"),
            )
        };
        if source.kind != VolumeKind::Snapshot {
            return Err(refuse(format!(
                "it is a writable {}, not a snapshot",
                source.kind.as_str()
            )));
        }
        match self.any_record(source.parent) {
            None => Err(refuse(
                "the volume it was taken from no longer exists".to_string(),
            )),
            Some(parent) if parent.removed => Err(refuse(format!(
                "it was taken from {:?}, which was removed",
                parent.name
            ))),
            Some(parent) if !parent.kind.is_writable() => Err(refuse(format!(
                "it was taken from {:?}, a read-only snapshot",
                parent.name
            ))),
            Some(parent) => Ok(parent),
        }
    }

    /// Resets writable volume `target` to the contents of `source` in O(1):
    /// `target` gets a copy of `source`'s root, and its old tree goes to the
    /// reclaimer under a hidden removed record.
    pub fn rollback(
        &mut self,
        source: VolumeId,
        target: VolumeId,
        now_unix_secs: u64,
    ) -> Result<()> {
        let source_record = self.live_record(source).clone();
        let old = self.live_record(target).clone();
        let new_root = self.copy_root(source_record.root, source_record.height)?;
        let generation = self.take_generation()?;
        let hidden = self.next_volume_id();
        self.volume_table_mut().insert(VolumeRecord {
            size_bytes: old.size_bytes,
            root: old.root,
            height: old.height,
            removed: true,
            referenced_blocks: old.referenced_blocks,
            created_generation: generation,
            share_floor_generation: generation,
            written_base_generation: generation,
            ..fresh_record(hidden, &old.name, VolumeKind::Volume, now_unix_secs)
        });
        self.volume_table_mut().update(target, |target_mut| {
            target_mut.root = new_root;
            target_mut.height = source_record.height;
            target_mut.size_bytes = source_record.size_bytes;
            target_mut.referenced_blocks = source_record.referenced_blocks;
            target_mut.share_floor_generation = generation;
            target_mut.written_base_generation = generation;
        });
        self.volume_table_mut().update(source, |source_mut| {
            source_mut.share_floor_generation = generation;
        });
        Ok(())
    }

    pub fn rename_volume(&mut self, id: VolumeId, new_name: &str) {
        self.volume_table_mut().rename(id, new_name);
    }

    /// Grows or shrinks a volume. Shrinking unmaps the blocks past the new
    /// end. Growing first zeroes the bytes past the old end in its last
    /// block (a shrink leaves them as they were: until a grow they are past
    /// the end, where nothing can read them, so a crash during the shrink
    /// cannot show them zeroed), then adds levels above the root when the
    /// tree cannot address the new size.
    pub fn resize_volume(&mut self, id: VolumeId, new_size_bytes: u64) -> Result<()> {
        let record = self.live_record(id).clone();
        let block_bytes = self.geometry().block_bytes();
        if new_size_bytes < record.size_bytes {
            let keep_blocks = self.geometry().blocks_for(new_size_bytes);
            self.unmap(
                id,
                keep_blocks,
                self.geometry().blocks_for(record.size_bytes),
            )?;
        } else {
            let tail = record.size_bytes % block_bytes;
            if tail != 0 {
                let last = record.size_bytes / block_bytes;
                let entry = self.lookup(record.root, record.height, NodeKind::VolumeData, last)?;
                if !entry.is_empty() {
                    let zeros = vec![0u8; (block_bytes - tail) as usize];
                    self.write_block(id, last, tail as usize, &zeros)?;
                }
            }
            let wanted = self
                .geometry()
                .height_for(self.geometry().blocks_for(new_size_bytes));
            let now = self.superblock().birth_generation;
            let mut root = self.live_record(id).root;
            for level in record.height..wanted {
                let mut node = Node::empty(
                    NodeKind::VolumeData,
                    level,
                    self.geometry().entries_per_node,
                );
                node.entries[0] = Entry::new(root, now);
                root = self.insert_new_node(node)?;
            }
            self.volume_table_mut().update(id, |record| {
                record.root = root;
                record.height = record.height.max(wanted);
            });
        }
        self.volume_table_mut()
            .update(id, |record| record.size_bytes = new_size_bytes);
        Ok(())
    }

    /// Drops removed records nobody needs any more, starting from `id` and
    /// its removed children, and then up the family as parents empty out.
    /// A removed record stays while its tree is being given back, while it
    /// has children (their lineage goes through it), or as one of its
    /// parent's newest BOOKMARKS_PER_PARENT_MAX removed snapshots while the
    /// parent's line lives on.
    pub(crate) fn prune_removed(&mut self, id: VolumeId) {
        self.prune_removed_all(&[id]);
    }

    /// `prune_removed` for every record of `ids` at once (a reclaim batch's):
    /// each parent's children are looked at once (`Family`), not once per
    /// record, so giving back 10,000 snapshots of a volume with 100,000
    /// costs a pass over its children per batch, not per snapshot.
    pub(crate) fn prune_removed_all(&mut self, ids: &[VolumeId]) {
        let mut families: HashMap<VolumeId, Family> = HashMap::new();
        let mut todo: Vec<VolumeId> = Vec::new();
        for &id in ids {
            todo.push(id);
            todo.extend(self.volume_table().children_of(id));
            // `id` may have just become a bookmark, which pushes its
            // parent's oldest one past BOOKMARKS_PER_PARENT_MAX: look at
            // its sibling bookmarks too (other siblings are kept for
            // reasons a new bookmark does not change).
            if let Some(parent) = self.volume_table().removed(id).map(|r| r.parent) {
                if !families.contains_key(&parent) {
                    let family = self.family(&mut families, parent);
                    todo.extend(family.bookmarks.iter().map(|&(_, sibling)| sibling));
                }
            }
        }
        // Every record is dropped at most once, and each drop queues at
        // most its parent and its sibling bookmarks: the loop is bounded.
        let bound =
            (BOOKMARKS_PER_PARENT_MAX + 4) * (self.volume_table().record_count() + 1) + todo.len();
        for _ in 0..bound {
            let Some(next) = todo.pop() else { break };
            if self.volume_table().removed(next).is_none()
                || self.removed_record_is_needed(next, &mut families)
            {
                continue;
            }
            let record = self.volume_table_mut().drop_removed(next);
            debug_assert!(self.volume_table().any(next).is_none());
            let family = self.family(&mut families, record.parent);
            family.forget(&record);
            // Of its siblings, only bookmarks may be judged anew: the
            // others are kept for reasons a drop does not change.
            todo.extend(family.bookmarks.iter().map(|&(_, sibling)| sibling));
            todo.push(record.parent);
        }
    }

    /// The family summary of `parent`'s children, made on first use.
    fn family<'a>(
        &self,
        families: &'a mut HashMap<VolumeId, Family>,
        parent: VolumeId,
    ) -> &'a mut Family {
        families
            .entry(parent)
            .or_insert_with(|| Family::of(self, parent))
    }

    fn removed_record_is_needed(
        &self,
        id: VolumeId,
        families: &mut HashMap<VolumeId, Family>,
    ) -> bool {
        let Some(record) = self.volume_table().removed(id) else {
            return true;
        };
        if !record.root.is_none() {
            return true;
        }
        if self.volume_table().has_children(id) || record.cursor || record.hold {
            return true;
        }
        record.kind == VolumeKind::Snapshot
            && self.family(families, record.parent).keeps_bookmark(record)
    }

    /// The newest removed snapshot (a bookmark) named `name`, if any.
    pub(crate) fn bookmark_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volume_table()
            .removed_records()
            .filter(|r| r.name == name && r.kind == VolumeKind::Snapshot && !r.cursor && !r.hold)
            .max_by_key(|r| r.created_generation)
    }
}

/// A new live record named `name`: a fresh guid, no parent, no tree or
/// blocks yet, generations at 0, and none of the marks (removed, partial
/// receive, cursor, rank, hold) that later operations put on records. Its
/// maker fills in what it brings.
fn fresh_record(id: VolumeId, name: &str, kind: VolumeKind, now_unix_secs: u64) -> VolumeRecord {
    VolumeRecord {
        id,
        parent: VolumeId::NONE,
        size_bytes: 0,
        root: BlockAddr::NONE,
        height: 0,
        kind,
        name: name.to_string(),
        removed: false,
        created_unix_secs: now_unix_secs,
        referenced_blocks: 0,
        created_generation: 0,
        share_floor_generation: 0,
        written_base_generation: 0,
        guid: crate::pool::random_uuid(),
        receive_progress: None,
        cursor: false,
        rank: 0,
        hold: false,
        hold_until_unix_secs: 0,
    }
}

/// What decides which of one parent's removed snapshots are worth keeping
/// as bookmarks, gathered in one pass and kept up to date as records are
/// dropped. The pass goes over the parent's children or over the removed
/// records, whichever is cheaper: a volume with 100,000 snapshots, 10,000
/// of them being given back, costs a pass over the removed ones.
struct Family {
    /// Bookmarks among the parent's children (removed snapshots given
    /// back, not cursors), by creation generation.
    bookmarks: BTreeSet<(u64, VolumeId)>,
    parent_lives: bool,
    /// The newest live child's creation generation: looked for only when
    /// the parent is removed (otherwise its line lives anyway).
    newest_live_generation: Option<u64>,
}

/// A look at a child through the children index costs a record lookup;
/// a look at a removed record through the removed records costs about
/// this many times less.
const CHILD_LOOKUP_COST: usize = 16;

impl Family {
    fn of(state: &State, parent: VolumeId) -> Family {
        let table = &state.volume_table();
        let parent_lives = table.live(parent).is_some();
        let mut family = Family {
            bookmarks: BTreeSet::new(),
            parent_lives,
            newest_live_generation: None,
        };
        if parent_lives && table.removed_count() < table.child_count(parent) * CHILD_LOOKUP_COST {
            for record in table.removed_records().filter(|r| r.parent == parent) {
                family.note(record);
            }
            return family;
        }
        for record in table.children_of(parent).filter_map(|c| table.any(c)) {
            family.note(record);
        }
        family
    }

    fn note(&mut self, record: &VolumeRecord) {
        if !record.removed {
            self.newest_live_generation = self
                .newest_live_generation
                .max(Some(record.created_generation));
        } else if Family::is_bookmark(record) {
            self.bookmarks
                .insert((record.created_generation, record.id));
        }
    }

    fn is_bookmark(record: &VolumeRecord) -> bool {
        record.removed
            && !record.cursor
            && !record.hold
            && record.root.is_none()
            && record.kind == VolumeKind::Snapshot
    }

    /// A removed snapshot is worth keeping to diff from while a later
    /// volume of its line lives (its parent, or a later sibling), and
    /// fewer than BOOKMARKS_PER_PARENT_MAX newer bookmarks exist.
    fn keeps_bookmark(&self, record: &VolumeRecord) -> bool {
        let newer_bookmarks = self
            .bookmarks
            .range((record.created_generation + 1, VolumeId::NONE)..)
            .take(BOOKMARKS_PER_PARENT_MAX)
            .count();
        if newer_bookmarks >= BOOKMARKS_PER_PARENT_MAX {
            return false;
        }
        self.parent_lives
            || self
                .newest_live_generation
                .is_some_and(|newest| newest > record.created_generation)
    }

    /// A removed child was dropped.
    fn forget(&mut self, record: &VolumeRecord) {
        self.bookmarks
            .remove(&(record.created_generation, record.id));
    }
}
