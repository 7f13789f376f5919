//! The public engine API: create or open a pool, manage volumes, and do I/O
//! through `Volume` handles. `Pool` and `Volume` are cheap to clone and safe
//! to share between threads.

mod capacity;
mod foreground;
mod locking;
mod off_lock;
mod punching;
mod removal;
mod replication;
mod resize;
mod retention;
mod state_lock;
mod volume;

pub use foreground::{ForegroundLoad, ForegroundRequest};
pub use off_lock::WALK_ROUNDS_MAX;
pub use removal::{RemovalSummary, SnapshotRemoval, REMOVE_BATCH_SNAPSHOTS};

pub use replication::{guid_hex, CursorInfo, DiffFrom, PartialReceive, SnapshotIdentity};
pub use resize::Shrink;
pub use retention::HoldInfo;

use off_lock::walk_off_lock;
use state_lock::lock_state;

use locking::{
    commit, commit_background, commit_if_large, commit_locked, let_clients_in, release_frees,
    settle_io, write_gate, IoOutcome,
};

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::alloc::Allocator;
use crate::check::CheckReport;
use crate::config::{PoolConfig, CONFIG_FILE_NAME};
use crate::device::{BlockDevice, FileDevice};
use crate::diff::DiffExtent;
use crate::error::{Error, ErrorKind, Result};
use crate::format::group;
use crate::format::record::{VolumeKind, VolumeRecord};
use crate::format::superblock::{
    choose_slot, SlotProblem, Superblock, SUPERBLOCK_LEN, SUPERBLOCK_SLOTS,
};
use crate::format::FORMAT_VERSION;
use crate::node_reads::NodeReads;
use crate::reclaim::ReclaimBatch;
use crate::space_levels::SpaceStatus;
use crate::space_settings::SpaceSettings;
use crate::state::State;
use crate::types::*;

/// Size of the journal region made at init, unless PoolOptions says.
pub const JOURNAL_REGION_BYTES: u64 = 16 * 1024 * 1024;
/// Smallest journal region; the format owns it (a superblock naming a
/// smaller one is damage), re-exported here for `PoolOptions`' users.
pub use crate::format::superblock::JOURNAL_REGION_BLOCKS_MIN;

/// Settings for a new pool.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub block_size_bytes: u32,
    /// Largest the store may grow to; None = while the host file system has room.
    pub capacity_bytes: Option<u64>,
    /// Size of the journal region; None = JOURNAL_REGION_BYTES. Tests use a
    /// tiny journal so that checkpoints and wrap-around happen often.
    pub journal_bytes: Option<u64>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            block_size_bytes: BLOCK_SIZE_DEFAULT_BYTES,
            capacity_bytes: None,
            journal_bytes: None,
        }
    }
}

/// A volume as listed: its summary and its space accounting. In JSON the
/// summary's fields stand beside the others.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeInfo {
    #[serde(flatten)]
    pub summary: VolumeSummary,
    /// Bytes only this volume reaches: exactly what removing it alone frees.
    pub unique_bytes: u64,
    /// Bytes of data written since its last snapshot (for a snapshot: what
    /// its source wrote between the previous snapshot and this one; for a
    /// clone: since it was made).
    pub written_bytes: u64,
    /// The pool's birth generation when it was made: data born later is newer.
    pub created_generation: u64,
    /// Random and unique across pools, as 32 hex digits.
    pub guid: String,
}

/// What a volume is, without the space accounting (`VolumeInfo`), which
/// costs a walk of what the volume owns alone: for paths that ask often,
/// such as a FUSE getattr or an NBD handshake.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeSummary {
    pub id: u64,
    pub name: String,
    pub kind: VolumeKind,
    pub read_only: bool,
    /// Name of the nearest live volume this one was snapshotted or cloned
    /// from (through removed ones).
    pub parent: Option<String>,
    pub size_bytes: u64,
    /// Bytes of data this volume maps (kept as it changes, so cheap).
    pub referenced_bytes: u64,
    pub created_unix_secs: u64,
    /// A snapshot's retention rank; 0 for none (left out of JSON).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rank: u8,
}

fn is_zero(rank: &u8) -> bool {
    *rank == 0
}

/// Space and shape of a pool.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolInfo {
    pub path: String,
    pub format_version: u32,
    pub block_size_bytes: u32,
    pub volume_count: u64,
    /// Bytes the store spans (its allocation groups).
    pub store_bytes: u64,
    /// Bytes in use: data, metadata and allocation maps.
    pub used_bytes: u64,
    /// Of the used bytes, those holding metadata.
    pub metadata_bytes: u64,
    /// Bytes that can still be allocated: free blocks in the store plus
    /// what it can grow into (limited by the capacity or the host file system).
    pub free_bytes: u64,
    /// Bytes that removed volumes still hold and the reclaimer will give
    /// back (`grove gc --wait` finishes it now).
    pub pending_free_bytes: u64,
    /// Bytes of data the live volumes reference, counting shared data once.
    pub referenced_bytes: u64,
    /// The capacity limit, if the pool has one.
    pub capacity_bytes: Option<u64>,
    /// Bytes the store file takes on the host file system (st_blocks ×
    /// 512): follows `used_bytes`, since freed blocks are punched out of
    /// it. None for a store without a file (in memory).
    #[serde(default)]
    pub store_allocated_bytes: Option<u64>,
    /// Where the pool stands against its space levels (`grove space`).
    #[serde(default)]
    pub space: Option<SpaceStatus>,
}

struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
    /// Readers hold this shared while they read data blocks outside the
    /// state lock; commit takes it exclusively before it lets freed blocks
    /// be reused, so no read can see a block that was reallocated under it.
    io_gate: RwLock<()>,
    /// Held by the one commit or checkpoint whose I/O runs without the
    /// state lock, from before it lets the state go until its outcome is
    /// in `io_outcome`: whoever finishes it waits here for it.
    commit_io: Mutex<()>,
    io_outcome: Mutex<Option<IoOutcome>>,
    /// Holds the pool's exclusive lock for as long as the pool is open.
    _lock_file: Option<File>,
    /// Claims per volume (NBD clients, open FUSE files): a volume in use
    /// is not removed unless forced.
    handles: Mutex<HashMap<VolumeId, usize>>,
    /// The space settings (`capacity.rs`); locked after the state, never
    /// before it.
    space: Mutex<capacity::SpaceControl>,
    /// Client requests begun and running (`foreground.rs`).
    foreground: foreground::ForegroundCounters,
    /// A daemon punches freed blocks at its own pace (`punching.rs`).
    punch_deferred: std::sync::atomic::AtomicBool,
}

/// How `Pool::remove` treats a volume's family and its users.
#[derive(Clone, Copy, Debug, Default)]
pub struct RemoveOptions {
    /// Remove every volume descended from it too.
    pub recursive: bool,
    /// Remove it even while it is claimed (an NBD client, an open FUSE
    /// file); the claimant's next call fails with NotFound.
    pub force: bool,
}

/// The extents where one volume differs from another.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiffReport {
    pub base: String,
    pub newer: String,
    /// The base is a removed snapshot, compared through birth generations.
    pub base_removed: bool,
    pub base_size_bytes: u64,
    pub newer_size_bytes: u64,
    pub extents: Vec<DiffExtent>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Best effort: an explicit close() or flush() reports errors. A pool
        // whose commit failed writes nothing more.
        if let Ok(state) = self.state.get_mut() {
            // A commit or checkpoint in flight here lost its runner to a
            // panic.
            if state.failed().is_some() || state.has_io_in_flight() {
                return;
            }
            if let Ok(frees) = state.commit() {
                state.make_reusable(frees);
                if state.needs_checkpoint() {
                    let _ = state.checkpoint();
                }
            }
        }
    }
}

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

/// A handle on one volume. It stays valid while the volume exists; after
/// the volume is removed every call fails with NotFound.
#[derive(Clone)]
pub struct Volume {
    inner: Arc<Inner>,
    id: VolumeId,
}

/// Marks a volume as in use by someone outside the pool (an NBD client's
/// connection, an open FUSE file) for as long as it lives: removing the
/// volume is then refused unless forced.
pub struct VolumeClaim {
    inner: Arc<Inner>,
    id: VolumeId,
}

impl Volume {
    /// Claims the volume until the claim is dropped.
    pub fn claim(&self) -> VolumeClaim {
        *lock_handles(&self.inner).entry(self.id).or_default() += 1;
        VolumeClaim {
            inner: self.inner.clone(),
            id: self.id,
        }
    }
}

impl Drop for VolumeClaim {
    fn drop(&mut self) {
        let mut handles = lock_handles(&self.inner);
        if let Some(count) = handles.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                handles.remove(&self.id);
            }
        }
    }
}

fn lock_handles(inner: &Inner) -> MutexGuard<'_, HashMap<VolumeId, usize>> {
    inner.handles.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Checks a volume name: it becomes a file name under `grove mount` and an
/// NBD export name, so it must be short, printable and free of '/'.
pub fn validate_volume_name(name: &str) -> Result<()> {
    let bad = |why: &str| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("invalid volume name {name:?}: {why}"),
        )
    };
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.len() > VOLUME_NAME_MAX_BYTES {
        return Err(bad(&format!(
            "it is longer than {VOLUME_NAME_MAX_BYTES} bytes"
        )));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(bad("it may not start with '.' or '-'"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-+:@".contains(*c)))
    {
        return Err(bad(&format!(
            "{c:?} is not allowed (use letters, digits and . _ - + : @)"
        )));
    }
    Ok(())
}

/// Checks a volume size: positive, whole sectors, within the limit.
pub fn validate_volume_size(size_bytes: u64) -> Result<()> {
    if size_bytes == 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "invalid volume size 0: a volume needs at least 512 bytes",
        ));
    }
    if !size_bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "invalid volume size {size_bytes} bytes: it must be a multiple of {SECTOR_BYTES}"
            ),
        ));
    }
    if size_bytes > VOLUME_SIZE_MAX_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("invalid volume size {size_bytes} bytes: the largest is {VOLUME_SIZE_MAX_BYTES} (64 PiB)"),
        ));
    }
    Ok(())
}

impl Pool {
    /// Creates a pool in `dir` (made if missing). Fails if one is there.
    pub fn create(dir: &Path, options: &PoolOptions) -> Result<Pool> {
        Pool::create_with_space(dir, options, &SpaceSettings::default())
    }

    /// Creates a pool whose grove.toml holds these space settings.
    pub fn create_with_space(
        dir: &Path,
        options: &PoolOptions,
        space: &SpaceSettings,
    ) -> Result<Pool> {
        prepare_pool_dir(dir, options, space)?;
        let mut config = PoolConfig::new();
        config.set_space_settings(space);
        let store_path = dir.join(&config.store);
        let device = FileDevice::create_new(&store_path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "{} already exists; remove it or choose another directory",
                        store_path.display()
                    ),
                )
            } else {
                Error::io(format!("cannot create {}", store_path.display()), e)
            }
        })?;
        let lock = lock_store(&store_path)?;
        let pool = Pool::format(Arc::new(device), options, dir, Some(lock))?;
        *locking::lock(&pool.inner.space) =
            capacity::SpaceControl::new(space.clone(), Some(dir.to_path_buf()));
        // grove.toml is written last and atomically: a directory with it is a
        // complete pool, one without it never half-looks like one.
        config.save(dir)?;
        Ok(pool)
    }

    /// Creates a pool in `dir` whose store is a device the caller built
    /// (a store over branch directories): `config` becomes its grove.toml,
    /// with these space settings. The device's owner locks it.
    pub fn create_on_device(
        dir: &Path,
        device: Arc<dyn BlockDevice>,
        options: &PoolOptions,
        space: &SpaceSettings,
        mut config: PoolConfig,
    ) -> Result<Pool> {
        prepare_pool_dir(dir, options, space)?;
        config.set_space_settings(space);
        let pool = Pool::format(device, options, dir, None)?;
        *locking::lock(&pool.inner.space) =
            capacity::SpaceControl::new(space.clone(), Some(dir.to_path_buf()));
        config.save(dir)?;
        Ok(pool)
    }

    /// Formats a store on any device: both superblocks, the (empty)
    /// journal region and the first allocation group.
    pub fn format(
        device: Arc<dyn BlockDevice>,
        options: &PoolOptions,
        dir: &Path,
        lock: Option<File>,
    ) -> Result<Pool> {
        check_options(options)?;
        let block_size = options.block_size_bytes;
        let block_bytes = u64::from(block_size);
        let journal_blocks = options.journal_bytes.unwrap_or(JOURNAL_REGION_BYTES) / block_bytes;
        let group_blocks = group::group_blocks(block_size);
        // The capacity counts whole blocks of the data area; at least the
        // first group's own blocks and one more.
        let capacity_blocks = match options.capacity_bytes {
            None => 0,
            Some(bytes) => (bytes / block_bytes).max(group::GROUP_HEADER_BLOCKS + 1),
        };
        let superblock = Superblock {
            generation: 0,
            block_size_bytes: block_size,
            journal_start: BlockAddr(SUPERBLOCK_SLOTS),
            journal_blocks,
            data_start: BlockAddr(SUPERBLOCK_SLOTS + journal_blocks),
            group_blocks,
            group_count: 0,
            capacity_blocks,
            volume_table_root: BlockAddr::NONE,
            volume_table_height: 0,
            next_volume_id: VolumeId(1),
            journal_sequence: 0,
            journal_head: 0,
            created_unix_secs: now_unix_secs(),
            pool_uuid: random_uuid(),
            // Generation 0 is older than anything: every volume's share
            // floor starts there, so the first writes are born after it.
            birth_generation: 1,
        };
        let mut alloc = Allocator::new(
            superblock.data_start,
            group_blocks,
            capacity_blocks,
            Vec::new(),
        );
        alloc.add_group()?;
        alloc.seal();
        let superblock = Superblock {
            group_count: alloc.group_count(),
            ..superblock
        };
        let store_len = superblock.device_blocks() * block_bytes;
        let mut state = State::new(device, superblock, alloc);
        state
            .device()
            .set_len_bytes(store_len)
            .map_err(|e| Error::io("cannot size the store", e))?;
        // Two checkpoints: the first writes the group map and superblock
        // slot 1, the second slot 0, so both slots are valid from the start.
        state.checkpoint()?;
        state.checkpoint()?;
        Ok(Pool::from_state(state, dir, lock))
    }

    /// Opens the pool in `dir`.
    pub fn open(dir: &Path) -> Result<Pool> {
        let config = PoolConfig::load(dir)?;
        if let Some(location) = &config.rados {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "pool {} keeps its store in RADOS ({location}): open it with the grove command",
                    dir.display()
                ),
            ));
        }
        if config.branches.is_some() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "pool {} is laid out over branch directories: open it with the grove command, which assembles its branches",
                    dir.display()
                ),
            ));
        }
        let store_path = dir.join(&config.store);
        let device = FileDevice::open(&store_path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::new(
                    ErrorKind::NotAPool,
                    format!(
                        "pool {} is incomplete: its store {} is missing",
                        dir.display(),
                        store_path.display()
                    ),
                )
            } else {
                Error::io(format!("cannot open {}", store_path.display()), e)
            }
        })?;
        let lock = lock_store(&store_path)?;
        let pool = Pool::open_device(Arc::new(device), dir, Some(lock))?;
        pool.apply_config(dir, &config);
        Ok(pool)
    }

    /// Opens the pool in `dir` on a device the caller assembled from its
    /// grove.toml (`config`, already loaded): a store over branches.
    pub fn open_on_device(
        dir: &Path,
        device: Arc<dyn BlockDevice>,
        config: &PoolConfig,
    ) -> Result<Pool> {
        let pool = Pool::open_device(device, dir, None)?;
        pool.apply_config(dir, config);
        Ok(pool)
    }

    /// The settings grove.toml gives an opened pool.
    fn apply_config(&self, dir: &Path, config: &PoolConfig) {
        if let Some(bytes) = config.cache_size_bytes() {
            self.set_cache_size(bytes);
        }
        *locking::lock(&self.inner.space) =
            capacity::SpaceControl::new(config.space_settings(), Some(dir.to_path_buf()));
    }

    /// Opens a store on any device (tests, the crash simulator).
    pub fn open_device(
        device: Arc<dyn BlockDevice>,
        dir: &Path,
        lock: Option<File>,
    ) -> Result<Pool> {
        let what = device.describe();
        let (superblock, superblock_problems) = read_superblock(device.as_ref(), &what)?;
        let block_bytes = u64::from(superblock.block_size_bytes);
        let device_len = device
            .len_bytes()
            .map_err(|e| Error::io(format!("cannot stat {what}"), e))?;
        let expected_len = superblock.device_blocks() * block_bytes;
        if device_len < expected_len {
            return Err(Error::corrupt(format!(
                "store {what} is truncated: it is {device_len} bytes, but its superblock needs {expected_len}"
            )));
        }
        let mut group_maps = Vec::with_capacity(superblock.group_count as usize);
        let mut maps_damaged = Vec::new();
        let mut block = vec![0u8; superblock.block_size_bytes as usize];
        for index in 0..superblock.group_count {
            let addr = superblock.data_start.0 + index * superblock.group_blocks;
            device
                .read_at(&mut block, addr * block_bytes)
                .map_err(|e| {
                    Error::io(
                        format!("cannot read the allocation map of group {index} in {what}"),
                        e,
                    )
                })?;
            match group::decode(index, &block) {
                Ok(map) => group_maps.push(map),
                // Maps are rewritten in place at checkpoint, so a crash can
                // tear one: it is rebuilt from the trees once they are known.
                Err(e) => {
                    group_maps.push(group::DecodedMap::placeholder(superblock.group_blocks));
                    maps_damaged.push((index, e.to_string()));
                }
            }
        }
        let alloc = Allocator::new(
            superblock.data_start,
            superblock.group_blocks,
            superblock.capacity_blocks,
            group_maps,
        );
        alloc
            .check_capacity()
            .map_err(|why| Error::corrupt(format!("{what}: {why}; refusing to open it")))?;
        let mut state = State::new(device, superblock, alloc);
        state.note_open_damage(superblock_problems, maps_damaged);
        state.load_share_counts()?;
        let replayed = state.replay_journal()?;
        state.load_volume_table()?;
        let rebuilt = state.rebuild_from_trees_if_damaged()?;
        if replayed > 0 || rebuilt {
            state.checkpoint()?;
        }
        Ok(Pool::from_state(state, dir, lock))
    }

    fn from_state(state: State, dir: &Path, lock: Option<File>) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                state: Mutex::new(state),
                io_gate: RwLock::new(()),
                commit_io: Mutex::new(()),
                io_outcome: Mutex::new(None),
                _lock_file: lock,
                handles: Mutex::new(HashMap::new()),
                space: Mutex::new(capacity::SpaceControl::new(SpaceSettings::default(), None)),
                foreground: foreground::ForegroundCounters::default(),
                punch_deferred: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock_state(&self.inner)
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Requests worth running against the pool's device at once
    /// (`BlockDevice::queue_depth`).
    pub fn queue_depth(&self) -> usize {
        self.state().device().queue_depth()
    }

    pub fn block_size_bytes(&self) -> u32 {
        self.state().geometry().block_size_bytes
    }

    /// Every volume, in creation order, with its space accounting (which
    /// costs a walk of what each volume owns alone). Computed
    /// LIST_SLICE_VOLUMES volumes per lock hold, with the nodes read
    /// without the lock (`off_lock.rs`): other clients wait for one slice
    /// at most, never for the whole listing. Each volume's figures come
    /// from one moment; a volume made or removed while the listing runs
    /// may or may not be in it.
    pub fn volumes(&self) -> Result<Vec<VolumeInfo>> {
        let mut infos: Vec<VolumeInfo> = Vec::new();
        loop {
            let after = infos
                .last()
                .map_or(VolumeId::NONE, |i| VolumeId(i.summary.id));
            let (state, slice) = walk_off_lock(&self.inner, self.state(), |state, reads| {
                volume_infos_after(state, after, reads)
            })?;
            drop(state);
            let done = slice.len() < LIST_SLICE_VOLUMES;
            infos.extend(slice);
            if done {
                return Ok(infos);
            }
            let_clients_in(&self.inner);
        }
    }

    /// Names of every volume, in creation order, without the accounting.
    pub fn volume_names(&self) -> Vec<String> {
        self.visible_in_slices(|_, record| record.name.clone())
    }

    /// Every volume, in creation order, without the accounting (the
    /// reclaimer and the retention scheduler ask for them).
    pub fn volume_summaries(&self) -> Vec<VolumeSummary> {
        self.visible_in_slices(volume_summary)
    }

    /// `name`'s summary, then those of the volumes shown under it (its
    /// children, and through removed ones theirs), in creation order: what
    /// `grove prune VOLUME` and `grove rm` need of a family, without
    /// listing the whole pool. The children come SUMMARY_SLICE_VOLUMES per
    /// lock hold; one removed meanwhile is left out.
    pub fn family_summaries(&self, name: &str) -> Result<Vec<VolumeSummary>> {
        let (head, children) = {
            let state = self.state();
            let record = state.volume_by_name(name)?;
            let children = state.children_shown_under(record.id);
            (volume_summary(&state, record), children)
        };
        let mut out = Vec::with_capacity(1 + children.len());
        out.push(head);
        for (i, slice) in children.chunks(SUMMARY_SLICE_VOLUMES).enumerate() {
            if i > 0 {
                let_clients_in(&self.inner);
            }
            let state = self.state();
            out.extend(
                slice
                    .iter()
                    .filter_map(|id| state.volume_table().live(*id))
                    .filter(|record| record.is_visible())
                    .map(|record| volume_summary(&state, record)),
            );
        }
        Ok(out)
    }

    /// `f` of every visible volume, in creation order, SUMMARY_SLICE_VOLUMES
    /// per lock hold: 100,000 summaries in one hold kept every client
    /// waiting about 20 ms. As with `volumes`, a volume made or removed
    /// meanwhile may or may not be in it.
    fn visible_in_slices<T>(&self, f: impl Fn(&State, &VolumeRecord) -> T) -> Vec<T> {
        let mut out = Vec::new();
        let mut after = VolumeId::NONE;
        loop {
            let state = self.state();
            let slice: Vec<(VolumeId, T)> = state
                .volume_table()
                .live_records_after(after)
                .filter(|r| r.is_visible())
                .take(SUMMARY_SLICE_VOLUMES)
                .map(|r| (r.id, f(&state, r)))
                .collect();
            drop(state);
            let done = slice.len() < SUMMARY_SLICE_VOLUMES;
            if let Some(&(last, _)) = slice.last() {
                assert!(last > after, "slices go forward in creation order");
                after = last;
            }
            out.extend(slice.into_iter().map(|(_, item)| item));
            if done {
                return out;
            }
            let_clients_in(&self.inner);
        }
    }

    pub fn volume_summary(&self, name: &str) -> Result<VolumeSummary> {
        let state = self.state();
        Ok(volume_summary(&state, state.volume_by_name(name)?))
    }

    pub fn volume_info(&self, name: &str) -> Result<VolumeInfo> {
        let state = self.state();
        let id = state.volume_by_name(name)?.id;
        volume_info_off_lock(&self.inner, state, id)
    }

    /// A handle for I/O on the named volume.
    pub fn volume(&self, name: &str) -> Result<Volume> {
        let id = self.state().volume_by_name(name)?.id;
        Ok(Volume {
            inner: self.inner.clone(),
            id,
        })
    }

    /// Creates an empty thin volume. Durable when it returns.
    pub fn create_volume(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo> {
        validate_volume_name(name)?;
        validate_volume_size(size_bytes)?;
        self.change(|state| {
            ensure_changes_allowed(state)?;
            ensure_name_free(state, name)?;
            state.create_volume(name, size_bytes, now_unix_secs())
        })
    }

    /// Read-only snapshot of any volume or snapshot. O(1); durable when it returns.
    pub fn snapshot(&self, source: &str, name: &str) -> Result<VolumeInfo> {
        self.snapshot_as(source, name, VolumeKind::Snapshot, 0, now_unix_secs())
    }

    /// Writable snapshot (clone) of any volume or snapshot.
    pub fn clone_volume(&self, source: &str, name: &str) -> Result<VolumeInfo> {
        self.snapshot_as(source, name, VolumeKind::Clone, 0, now_unix_secs())
    }

    /// A snapshot or clone of `source`, ranked `rank` (0: none; retention's)
    /// and created at `created_unix_secs`, in one commit.
    fn snapshot_as(
        &self,
        source: &str,
        name: &str,
        kind: VolumeKind,
        rank: u8,
        created_unix_secs: u64,
    ) -> Result<VolumeInfo> {
        validate_volume_name(name)?;
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        capacity::ensure_room_for_snapshot(&self.inner, &mut state, name)?;
        // Writes in flight to blocks the source owns must land before those
        // blocks become shared, or the new snapshot would change under them.
        let gate = write_gate(&self.inner);
        let id = {
            let source_id = state.volume_by_name(source)?.id;
            ensure_name_free(&state, name)?;
            state.snapshot(source_id, name, kind, created_unix_secs)?
        };
        drop(gate);
        if rank != 0 {
            state.set_rank(id, rank);
        }
        commit_locked(&self.inner, &mut state)?;
        volume_info_off_lock(&self.inner, state, id)
    }

    /// Removes any volume in O(1); its snapshots and clones keep every
    /// byte. Returns the bytes that removing it gives back, which the
    /// reclaimer frees (`reclaim_all`, or `grove serve`'s background
    /// reclaimer). Refused while a handle is open on it.
    pub fn remove_volume(&self, name: &str) -> Result<u64> {
        self.remove(name, RemoveOptions::default())
    }

    /// Removes a volume, with its descendants if `recursive`. Returns the
    /// bytes of data the reclaimer will give back (its unique bytes; the
    /// tree's own nodes come back too).
    pub fn remove(&self, name: &str, options: RemoveOptions) -> Result<u64> {
        // What the removal gives back is found by one walk of the removed
        // trees and the doomed ones, with its reads made without the lock;
        // the round that finds every node also checks the request, and the
        // removal follows in the same lock hold, so nothing changes between.
        let (mut state, (doomed, freed_blocks)) =
            walk_off_lock(&self.inner, self.state(), |state, reads| {
                ensure_changes_allowed(state)?;
                let record = state.volume_by_name(name)?.clone();
                let mut doomed = vec![record.id];
                if options.recursive {
                    doomed.extend(state.live_descendants(record.id));
                }
                if !options.force {
                    self.ensure_unclaimed(state, &doomed, "remove it")?;
                }
                if !options.force {
                    retention::ensure_not_held(state, &doomed)?;
                }
                let tally = state.dying_only_blocks_via(&doomed, reads)?;
                Ok(tally.map(|(with, without)| (doomed, with.0 - without.0)))
            })?;
        if options.force {
            retention::drop_holds_of(&mut state, &doomed);
        }
        // Deepest first. Any volume may be removed alone, so every prefix
        // of the removals is a consistent pool: a large family commits in
        // parts, each within one journal transaction, and a crash between
        // parts leaves the volumes not yet removed whole.
        for id in doomed.iter().rev() {
            state.remove_volume(*id);
            commit_if_large(&self.inner, &mut state)?;
        }
        commit_locked(&self.inner, &mut state)?;
        Ok(freed_blocks * state.geometry().block_bytes())
    }

    /// Refuses when any of `ids` is claimed (an NBD client, an open FUSE
    /// file), naming it and what would help.
    fn ensure_unclaimed(&self, state: &State, ids: &[VolumeId], what: &str) -> Result<()> {
        let handles = lock_handles(&self.inner);
        for id in ids {
            if let Some(&count) = handles.get(id) {
                let name = &state.live_record(*id).name;
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!(
                        "volume {name:?} is in use ({count} NBD client{} or open FUSE file{0}); disconnect or close it first, or {what} with --force",
                        if count == 1 { "" } else { "s" }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Resets writable volume `volume` to the contents of `snapshot`, in
    /// O(1). Without `volume`, `snapshot` must be a read-only snapshot and
    /// the volume it was taken from (live and writable) is reset; any other
    /// source needs both names (see `State::rollback_records`). Its old
    /// contents go to the reclaimer.
    /// A volume in use (claimed by an NBD client or an open FUSE file) is
    /// refused unless `force`: its contents would change under the client.
    pub fn rollback(
        &self,
        snapshot: &str,
        volume: Option<&str>,
        force: bool,
    ) -> Result<VolumeInfo> {
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let (source, target) = state.rollback_records(snapshot, volume)?;
        if !force {
            self.ensure_unclaimed(&state, &[target.id], "roll it back")?;
        }
        let gate = write_gate(&self.inner);
        state.rollback(source.id, target.id, now_unix_secs())?;
        drop(gate);
        commit_locked(&self.inner, &mut state)?;
        volume_info_off_lock(&self.inner, state, target.id)
    }

    /// The extents where `newer` differs from `base`. `base` may be a
    /// removed snapshot of `newer`'s line (a bookmark). Costs what differs,
    /// not what the volumes map.
    pub fn diff(&self, base: &str, newer: &str) -> Result<DiffReport> {
        self.diff_from(&DiffFrom::Name(base.to_string()), newer)
    }

    /// What opening the pool found wrong and worked around (a damaged
    /// superblock slot, share counts or allocation maps rebuilt from the
    /// trees). A rebuild is written back at once, so only the command that
    /// opened the pool hears of it: it should tell the user.
    pub fn open_warnings(&self) -> Vec<String> {
        self.state().open_warnings().to_vec()
    }

    /// Why the pool takes no more changes, if a commit failed: it must be
    /// opened again (after fixing the cause) to go on.
    pub fn failure(&self) -> Option<String> {
        self.state().failed().map(str::to_string)
    }

    /// Bytes removed volumes still hold; the reclaimer frees them.
    pub fn pending_free_bytes(&self) -> Result<u64> {
        let (state, (data, nodes)) = walk_off_lock(&self.inner, self.state(), dying_only_blocks)?;
        Ok((data + nodes) * state.geometry().block_bytes())
    }

    /// Reclaims one bounded batch of removed trees and commits it. Other
    /// work on the pool goes on between batches. Returns the bytes freed
    /// and whether anything is left.
    pub fn reclaim_batch(&self) -> Result<(u64, bool)> {
        self.reclaim_batch_of(None, false)
    }

    /// One reclaim batch as `reclaim_batch`, but committed only when the
    /// metadata waiting for a commit nears what one journal transaction
    /// holds, or once nothing is left: for the daemons' reclaimer, beside
    /// clients whose unflushed writes every commit flushes (a batch gives
    /// back a few removed snapshots, so ten thousand of them were over a
    /// thousand commits). What a batch frees is reusable after the commit
    /// that makes it durable, which a client's flush may also be.
    pub fn reclaim_batch_sharing_commits(&self) -> Result<(u64, bool)> {
        self.reclaim_batch_of(None, true)
    }

    /// One reclaim batch of at most `budget_entries` entries, so tests can
    /// leave removed trees half given back (interrupted reclaim).
    #[doc(hidden)]
    pub fn reclaim_batch_for_tests(&self, budget_entries: usize) -> Result<(u64, bool)> {
        self.reclaim_batch_of(Some(budget_entries), false)
    }

    /// The same as `reclaim_batch_for_tests`, sharing commits.
    #[doc(hidden)]
    pub fn reclaim_batch_sharing_commits_for_tests(
        &self,
        budget_entries: usize,
    ) -> Result<(u64, bool)> {
        self.reclaim_batch_of(Some(budget_entries), true)
    }

    fn reclaim_batch_of(
        &self,
        budget_entries: Option<usize>,
        share_commits: bool,
    ) -> Result<(u64, bool)> {
        let mut state = self.state();
        if !state.has_pending_reclaim() {
            return Ok((0, true));
        }
        ensure_changes_allowed(&state)?;
        let budget = state
            .reclaim_budget()
            .min(budget_entries.unwrap_or(usize::MAX));
        let batch: ReclaimBatch = state.reclaim_batch(budget)?;
        let freed_bytes = batch.freed_blocks * state.geometry().block_bytes();
        let commit_due = !share_commits
            || batch.done
            || state.pending_commit_blocks() > state.auto_commit_blocks();
        drop(state);
        if !commit_due {
            return Ok((freed_bytes, false));
        }
        // The commit's I/O runs without the lock: its flush may take long,
        // and clients' requests go on meanwhile. It flushes their data
        // only if the transaction maps some (their writes in place are
        // left to their own flush). It punches what it frees.
        commit_background(&self.inner)?;
        Ok((freed_bytes, batch.done))
    }

    /// Reclaims everything pending, batch by batch, calling `progress` with
    /// the bytes freed so far. Returns the bytes freed.
    pub fn reclaim_all(&self, mut progress: impl FnMut(u64)) -> Result<u64> {
        let mut freed = 0;
        loop {
            let (bytes, done) = self.reclaim_batch()?;
            freed += bytes;
            progress(freed);
            if done {
                return Ok(freed);
            }
        }
    }

    pub fn rename_volume(&self, name: &str, new_name: &str) -> Result<VolumeInfo> {
        validate_volume_name(new_name)?;
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let id = state.volume_by_name(name)?.id;
        ensure_name_free(&state, new_name)?;
        state.rename_volume(id, new_name);
        commit_locked(&self.inner, &mut state)?;
        volume_info_off_lock(&self.inner, state, id)
    }

    /// Runs a change that creates a volume, then commits it.
    fn change(&self, f: impl FnOnce(&mut State) -> Result<VolumeId>) -> Result<VolumeInfo> {
        let mut state = self.state();
        let id = f(&mut state)?;
        commit_locked(&self.inner, &mut state)?;
        volume_info_off_lock(&self.inner, state, id)
    }

    pub fn info(&self) -> Result<PoolInfo> {
        // One walk of the removed trees gives both what they will free and
        // how much of the allocated data only they hold; the rest comes
        // from the same lock hold as its last round.
        let (state, (dying_data, dying_nodes)) =
            walk_off_lock(&self.inner, self.state(), dying_only_blocks)?;
        let pending_free_bytes = (dying_data + dying_nodes) * state.geometry().block_bytes();
        let space = state.space();
        let block_bytes = state.geometry().block_bytes();
        let grow_bytes = match space.capacity_blocks {
            None => match state.device().host_space() {
                Some(host) => host.available_bytes,
                None => host_available_bytes(&self.inner.dir),
            },
            Some(capacity) => capacity.saturating_sub(space.store_blocks) * block_bytes,
        };
        Ok(PoolInfo {
            path: self.inner.dir.display().to_string(),
            format_version: FORMAT_VERSION,
            block_size_bytes: state.geometry().block_size_bytes,
            volume_count: state.visible_records().count() as u64,
            store_bytes: space.store_blocks * block_bytes,
            used_bytes: space.used_blocks * block_bytes,
            metadata_bytes: space.meta_blocks * block_bytes,
            free_bytes: space.free_blocks * block_bytes + grow_bytes,
            pending_free_bytes,
            referenced_bytes: space.data_blocks.saturating_sub(dying_data) * block_bytes,
            capacity_bytes: space.capacity_blocks.map(|capacity| capacity * block_bytes),
            // What the host says is informative: a failed stat leaves it out
            // rather than failing `info`.
            store_allocated_bytes: state.device().allocated_bytes().ok().flatten(),
            space: Some(capacity::status_locked(&self.inner, &state)),
        })
    }

    /// What punching freed blocks out of the store did since it was opened.
    pub fn punch_stats(&self) -> crate::PunchStats {
        self.state().punch_stats()
    }

    /// Makes every completed write and change durable.
    pub fn flush(&self) -> Result<()> {
        commit(&self.inner)
    }

    /// Flushes and checkpoints, so the next open has no journal to replay.
    /// Other handles keep the pool open until they are dropped.
    pub fn close(self) -> Result<()> {
        let mut state = self.state();
        if state.failed().is_some() {
            return ensure_changes_allowed(&state);
        }
        commit_locked(&self.inner, &mut state)?;
        drop(state);
        punching::punch_backlog_within(&self.inner);
        let mut state = self.state();
        settle_io(&self.inner, &mut state)?;
        if state.needs_checkpoint() {
            state.checkpoint()?;
        }
        Ok(())
    }

    /// Verifies all metadata (see `check.rs`). With `repair`, fixes leaks,
    /// allocation-map disagreements and space accounting, and commits.
    pub fn check(&self, repair: bool) -> Result<CheckReport> {
        self.check_cancellable(repair, &std::sync::atomic::AtomicBool::new(false))
    }

    /// [`Pool::check`] that stops early, with an error and nothing
    /// repaired, once `cancel` is set from another thread (a daemon
    /// shutting down within its grace).
    pub fn check_cancellable(
        &self,
        repair: bool,
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<CheckReport> {
        let mut state = self.state();
        // The journal must read back every transaction it has reserved.
        settle_io(&self.inner, &mut state)?;
        if repair {
            ensure_changes_allowed(&state)?;
        }
        let report = state.check(repair, cancel);
        let deferred = state.take_deferred_frees();
        release_frees(&self.inner, &mut state, deferred);
        let report = report?;
        if repair && !report.repaired.is_empty() {
            commit_locked(&self.inner, &mut state)?;
            // Two checkpoints write both slots, so a damaged one is replaced.
            state.checkpoint()?;
            state.checkpoint()?;
            state.clear_open_warnings();
        }
        if repair {
            // A store written by a grove that did not punch holes gets the
            // host space of its free blocks back here, once.
            let _gate = write_gate(&self.inner);
            let punched = state.punch_free_space();
            if punched > 0 {
                tracing::info!("punched {punched} free blocks out of the store");
            }
        }
        Ok(report)
    }

    /// Sets how many bytes of decoded metadata nodes the cache keeps (at
    /// least `CACHE_NODES_MIN` nodes). Dirty nodes stay until committed.
    pub fn set_cache_size(&self, size_bytes: u64) {
        self.state().set_cache_size(size_bytes);
    }

    /// `check`, counting references `window_blocks` blocks of the store at
    /// a time, as a pool past `CHECK_WINDOW_BLOCKS` is checked: for tests
    /// that compare it with the one-pass check.
    #[doc(hidden)]
    pub fn check_in_windows_for_tests(
        &self,
        repair: bool,
        window_blocks: u64,
    ) -> Result<CheckReport> {
        let mut state = self.state();
        settle_io(&self.inner, &mut state)?;
        let never = std::sync::atomic::AtomicBool::new(false);
        state.check_in_windows(repair, window_blocks, &never)
    }

    /// Sets a volume's recorded referenced bytes outright and commits: a
    /// crafted store with valid checksums, for tests of `check --repair`.
    #[doc(hidden)]
    pub fn damage_accounting_for_tests(&self, name: &str, referenced_blocks: u64) -> Result<()> {
        let mut state = self.state();
        let id = state.volume_by_name(name)?.id;
        state.set_accounting(id, referenced_blocks);
        commit_locked(&self.inner, &mut state)
    }

    /// Panics with the state lock held, as a bug in the middle of a change
    /// would: for tests that a front end survives it and that the pool
    /// then takes no more changes (see `lock_state`).
    #[doc(hidden)]
    pub fn panic_holding_state_lock_for_tests(&self) {
        let _state = self.state();
        panic!("a test asked the pool to panic with its state lock held");
    }

    /// Radix nodes visited by lookups since the pool was opened.
    pub fn node_visits(&self) -> u64 {
        self.state().node_visits()
    }
}

fn check_range(record: &VolumeRecord, what: &str, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= record.size_bytes => Ok(()),
        _ => Err(Error::new(
            ErrorKind::OutOfRange,
            format!(
                "{what} of {len} bytes at offset {offset} runs past the end of volume {:?} ({} bytes)",
                record.name, record.size_bytes
            ),
        )),
    }
}

fn read_only_error(record: &VolumeRecord) -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        format!(
            "volume {:?} is a read-only snapshot; make a writable clone of it with `grove clone {} NEW_NAME`",
            record.name, record.name
        ),
    )
}

fn ensure_name_free(state: &State, name: &str) -> Result<()> {
    if state.volume_table().by_name(name).is_some() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("a volume named {name:?} already exists"),
        ));
    }
    Ok(())
}

/// Refuses changes once a commit has failed (see `State::failed`).
fn ensure_changes_allowed(state: &State) -> Result<()> {
    match state.failed() {
        None => Ok(()),
        Some(cause) => Err(Error::new(
            ErrorKind::ReadOnly,
            format!(
                "the pool is read-only since a commit failed ({cause}); fix the cause and open the pool again"
            ),
        )),
    }
}

fn volume_summary(state: &State, record: &VolumeRecord) -> VolumeSummary {
    VolumeSummary {
        id: record.id.0,
        name: record.name.clone(),
        kind: record.kind,
        read_only: !record.kind.is_writable(),
        parent: state.live_ancestor(record).map(|p| p.name.clone()),
        size_bytes: record.size_bytes,
        referenced_bytes: record.referenced_blocks * state.geometry().block_bytes(),
        created_unix_secs: record.created_unix_secs,
        rank: record.rank,
    }
}

/// Volumes a listing computes per lock hold: how long other clients may
/// wait for it (each volume's walk uses nodes read without the lock).
pub const LIST_SLICE_VOLUMES: usize = 16;

/// Volumes a listing without accounting (names, summaries) takes per lock
/// hold: a summary copies a record's fields and looks up its parent's
/// name, under 1 ms for a slice in a release build.
pub const SUMMARY_SLICE_VOLUMES: usize = 2048;

/// The next LIST_SLICE_VOLUMES visible volumes after `after`, with their
/// accounting; None if some nodes must be read first.
fn volume_infos_after(
    state: &mut State,
    after: VolumeId,
    reads: &mut NodeReads,
) -> Result<Option<Vec<VolumeInfo>>> {
    let records: Vec<VolumeRecord> = state
        .volume_table()
        .live_records_after(after)
        .filter(|r| r.is_visible())
        .take(LIST_SLICE_VOLUMES)
        .cloned()
        .collect();
    let mut infos = Some(Vec::with_capacity(records.len()));
    // Past the first volume that lacks nodes, the others are still walked,
    // so that one read between rounds serves them all.
    for record in &records {
        let info = volume_info_via(state, record, reads)?;
        infos = infos.zip(info).map(|(mut infos, info)| {
            infos.push(info);
            infos
        });
    }
    Ok(infos)
}

/// A volume's summary and accounting, computed with its device reads made
/// without the lock (`off_lock.rs`).
fn volume_info_off_lock(
    inner: &Inner,
    state: MutexGuard<'_, State>,
    id: VolumeId,
) -> Result<VolumeInfo> {
    let (_state, info) = walk_off_lock(inner, state, |state, reads| {
        let record = state.volume_by_id(id)?.clone();
        volume_info_via(state, &record, reads)
    })?;
    Ok(info)
}

/// The summary plus the accounting, which walks what the volume owns
/// alone; None if some nodes must be read first.
fn volume_info_via(
    state: &mut State,
    record: &VolumeRecord,
    reads: &mut NodeReads,
) -> Result<Option<VolumeInfo>> {
    let block_bytes = state.geometry().block_bytes();
    let Some(usage) = state.usage_via(record, reads)? else {
        return Ok(None);
    };
    Ok(Some(VolumeInfo {
        summary: volume_summary(state, record),
        unique_bytes: usage.unique_blocks * block_bytes,
        written_bytes: usage.written_blocks * block_bytes,
        created_generation: record.created_generation,
        guid: record.guid.iter().map(|b| format!("{b:02x}")).collect(),
    }))
}

/// What only removed trees reach, (data, nodes), for `walk_off_lock`.
fn dying_only_blocks(state: &mut State, reads: &mut NodeReads) -> Result<Option<(u64, u64)>> {
    Ok(state.dying_only_blocks_via(&[], reads)?.map(|(all, _)| all))
}

/// Reads both superblock slots. Slot 1 sits one block in, and the block size
/// is only known from a valid slot, so if slot 0 is unreadable every
/// possible block size is tried for slot 1.
fn read_superblock(device: &dyn BlockDevice, what: &str) -> Result<(Superblock, Vec<String>)> {
    let mut buf = [0u8; SUPERBLOCK_LEN];
    let read = |buf: &mut [u8], offset: u64| {
        device
            .read_at(buf, offset)
            .map_err(|e| Error::io(format!("cannot read the superblock of {what}"), e))
    };
    read(&mut buf, 0)?;
    let slot0 = Superblock::decode(&buf);
    let candidates: Vec<u32> = match &slot0 {
        Ok(sb) => vec![sb.block_size_bytes],
        Err(_) => (10..=16).map(|shift| 1u32 << shift).collect(),
    };
    let mut slot1 = Err(SlotProblem::NoMagic);
    for block_size in candidates {
        read(&mut buf, u64::from(block_size))?;
        match Superblock::decode(&buf) {
            Ok(sb) if sb.block_size_bytes == block_size => {
                slot1 = Ok(sb);
                break;
            }
            Ok(_) => {
                slot1 = Err(SlotProblem::Damaged(
                    "block size disagrees with its position".into(),
                ))
            }
            Err(SlotProblem::NoMagic) => {}
            Err(problem) => slot1 = Err(problem),
        }
    }
    // A slot that cannot be used is worth reporting even when the other one
    // carries the pool: after init both are always valid.
    let problems = [&slot0, &slot1]
        .iter()
        .enumerate()
        .filter_map(|(slot, decoded)| match decoded {
            Ok(_) => None,
            Err(problem) => Some(format!(
                "superblock slot {slot} was unusable at open ({problem:?}); the pool opened from the other slot"
            )),
        })
        .collect();
    Ok((choose_slot([slot0, slot1], what)?, problems))
}

/// Checks the settings of a new pool.
fn check_options(options: &PoolOptions) -> Result<()> {
    let block_size = options.block_size_bytes;
    if !is_valid_block_size(block_size) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("invalid block size {block_size}: choose a power of two from 1K to 64K"),
        ));
    }
    let journal_blocks =
        options.journal_bytes.unwrap_or(JOURNAL_REGION_BYTES) / u64::from(block_size);
    if journal_blocks < JOURNAL_REGION_BLOCKS_MIN {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("the journal needs at least {JOURNAL_REGION_BLOCKS_MIN} blocks"),
        ));
    }
    Ok(())
}

/// Checks a new pool's settings and makes its directory: refused if a
/// pool is there. Everything is checked before anything is created, since
/// a store left behind by a refused attempt would make the corrected retry
/// fail with AlreadyExists.
fn prepare_pool_dir(dir: &Path, options: &PoolOptions, space: &SpaceSettings) -> Result<()> {
    space
        .check()
        .map_err(|why| Error::new(ErrorKind::InvalidArgument, why))?;
    check_options(options)?;
    if dir.join(CONFIG_FILE_NAME).exists() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("a grove pool already exists in {}", dir.display()),
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create pool directory {}", dir.display()), e))
}

fn lock_store(path: &Path) -> Result<File> {
    let file =
        File::open(path).map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::new(
            ErrorKind::Busy,
            format!(
                "pool store {} is in use by another grove process",
                path.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::io(format!("cannot lock {}", path.display()), e))
        }
    }
}

fn host_available_bytes(dir: &Path) -> u64 {
    rustix::fs::statvfs(dir)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .unwrap_or(0)
}

/// 16 random bytes without a dependency: std's hasher is randomly keyed
/// per process (and per call).
pub(crate) fn random_uuid() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(now_unix_secs() ^ (i as u64) ^ u64::from(std::process::id()));
        chunk.copy_from_slice(&hasher.finish().to_le_bytes());
    }
    out
}
