//! The pool's space settings, levels and auto-extension: where the engine
//! applies `space_settings.rs` and `space_levels.rs`. The capacity grows
//! by a step when use passes `extend_at` (the daemon's watcher asks), and
//! at once when a write or a snapshot would otherwise fail for want of
//! room, so that a one-shot command never fails while the pool may grow.

use std::path::PathBuf;
use std::sync::MutexGuard;

use super::locking::{lock, settle_io};
use super::{ensure_changes_allowed, Inner, Pool};
use crate::config::PoolConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::space_levels::{self, HostSpace, SpaceFigures, SpaceLevel, SpaceStatus};
use crate::space_settings::{size_text, SpaceSettings};
use crate::state::State;

/// The pool's space settings, and what tests put in place of the host.
pub(super) struct SpaceControl {
    settings: SpaceSettings,
    /// The pool directory whose grove.toml holds the settings; None for a
    /// store opened on a device alone (tests, the crash simulator).
    config_dir: Option<PathBuf>,
    /// Tests: the host's space as given instead of statvfs (None inside:
    /// unknown).
    host_for_tests: Option<Option<HostSpace>>,
}

impl SpaceControl {
    pub(super) fn new(settings: SpaceSettings, config_dir: Option<PathBuf>) -> SpaceControl {
        SpaceControl {
            settings,
            config_dir,
            host_for_tests: None,
        }
    }
}

fn lock_space(inner: &Inner) -> MutexGuard<'_, SpaceControl> {
    lock(&inner.space)
}

/// The figures the levels are computed from, read under the state lock
/// (the space control's lock is taken after it, never before).
fn figures(inner: &Inner, state: &State) -> (SpaceFigures, SpaceSettings) {
    let control = lock_space(inner);
    let host = match control.host_for_tests {
        Some(host) => host,
        None => state
            .device()
            .host_space()
            .or_else(|| host_space(&inner.dir)),
    };
    let space = state.space();
    let block_bytes = state.geometry().block_bytes();
    let figures = SpaceFigures {
        block_bytes,
        used_bytes: space.used_blocks * block_bytes,
        capacity_bytes: space.capacity_blocks.map(|c| c * block_bytes),
        host,
    };
    (figures, control.settings.clone())
}

/// The host file system under `dir`; None if statvfs fails (no such
/// directory: a store in memory).
fn host_space(dir: &std::path::Path) -> Option<HostSpace> {
    rustix::fs::statvfs(dir).ok().map(|s| HostSpace {
        available_bytes: s.f_bavail.saturating_mul(s.f_frsize),
        total_bytes: s.f_blocks.saturating_mul(s.f_frsize),
    })
}

/// Where the pool stands, under the state lock.
pub(super) fn status_locked(inner: &Inner, state: &State) -> SpaceStatus {
    let (figures, settings) = figures(inner, state);
    space_levels::evaluate(&figures, &settings)
}

/// Extends the capacity by one step if the settings and the host allow.
/// Returns whether it did. Costs a checkpoint when it does, so it is
/// called only past `extend_at` or when an allocation failed.
pub(super) fn extend_locked(inner: &Inner, state: &mut State) -> Result<bool> {
    let (figures, settings) = figures(inner, state);
    let Some(target_bytes) = space_levels::next_capacity_bytes(&figures, &settings) else {
        return Ok(false);
    };
    let block_bytes = figures.block_bytes;
    let old_blocks = state.space().capacity_blocks.unwrap_or(0);
    let target_blocks = (target_bytes / block_bytes).min(state.capacity_max_blocks());
    if target_blocks <= old_blocks {
        return Ok(false);
    }
    settle_io(inner, state)?;
    ensure_changes_allowed(state)?;
    state.raise_capacity(target_blocks)?;
    tracing::info!(
        "pool {}: capacity extended from {} to {} ({} used)",
        inner.dir.display(),
        size_text(old_blocks * block_bytes),
        size_text(target_blocks * block_bytes),
        size_text(figures.used_bytes),
    );
    Ok(true)
}

/// Refuses a new snapshot or clone at the hard limit (after trying to
/// extend): it could not keep a single overwrite of its source.
pub(super) fn ensure_room_for_snapshot(inner: &Inner, state: &mut State, name: &str) -> Result<()> {
    // Past extend_at, a step now, as the daemons' watcher would take: a
    // snapshot allocates (its record, its table node), and without a
    // watcher (the CLI, an in-process pool, a burst of snapshots between
    // two of its looks) the capacity filled up and the snapshot failed
    // with "the pool is full" while the host had room to grow into.
    let (figures, settings) = figures(inner, state);
    let mut status =
        if space_levels::wants_extension(&figures, &settings) && extend_locked(inner, state)? {
            status_locked(inner, state)
        } else {
            space_levels::evaluate(&figures, &settings)
        };
    while status.level == SpaceLevel::Full && extend_locked(inner, state)? {
        status = status_locked(inner, state);
    }
    if status.level < SpaceLevel::Full {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::NoSpace,
        format!(
            "cannot make {name:?}: the pool is at its hard limit ({} used of {}); free space (`grove rm`, then `grove gc`) or raise the limit (`grove space set --max-capacity SIZE`)",
            size_text(status.used_bytes),
            size_text(status.ceiling_bytes.unwrap_or(status.used_bytes)),
        ),
    ))
}

impl Pool {
    /// The pool's space settings (grove.toml's `[space]`).
    pub fn space_settings(&self) -> SpaceSettings {
        lock_space(&self.inner).settings.clone()
    }

    /// Checks and applies new space settings, and writes them into
    /// grove.toml when the pool has one.
    pub fn set_space_settings(&self, settings: &SpaceSettings) -> Result<()> {
        settings
            .check()
            .map_err(|why| Error::new(ErrorKind::InvalidArgument, why))?;
        let mut control = lock_space(&self.inner);
        if let Some(dir) = &control.config_dir {
            let mut config = PoolConfig::load(dir)?;
            config.set_space_settings(settings);
            config.save(dir)?;
        }
        control.settings = settings.clone();
        Ok(())
    }

    /// Where the pool stands against its levels. Cheap: counters and one
    /// statvfs, with the state lock held only to read the counters.
    pub fn space_status(&self) -> SpaceStatus {
        let state = self.state();
        status_locked(&self.inner, &state)
    }

    /// What the daemon's watcher calls: extends the capacity by a step if
    /// use has passed `extend_at`, then says where the pool stands.
    pub fn watch_space(&self) -> Result<SpaceStatus> {
        let mut state = self.state();
        let (figures, settings) = figures(&self.inner, &state);
        if settings.auto_extend && space_levels::wants_extension(&figures, &settings) {
            extend_locked(&self.inner, &mut state)?;
        }
        Ok(status_locked(&self.inner, &state))
    }

    /// Raises the capacity to `capacity_bytes` (rounded down to a block),
    /// at most to `max_capacity`; returns the new capacity in bytes.
    pub fn raise_capacity(&self, capacity_bytes: u64) -> Result<u64> {
        let mut state = self.state();
        let (figures, settings) = figures(&self.inner, &state);
        let block_bytes = figures.block_bytes;
        let refuse = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
        let Some(current) = figures.capacity_bytes else {
            return refuse("this pool has no capacity limit (it grows while the host has room), so there is none to raise".into());
        };
        let blocks = capacity_bytes / block_bytes;
        if blocks * block_bytes <= current {
            return refuse(format!(
                "the capacity can only grow: it is {} and {} is not more",
                size_text(current),
                size_text(capacity_bytes)
            ));
        }
        if let Some(max) = settings
            .max_capacity_bytes
            .filter(|&max| capacity_bytes > max)
        {
            return refuse(format!(
                "capacity {} is above max_capacity {}; raise --max-capacity too",
                size_text(capacity_bytes),
                size_text(max)
            ));
        }
        if let Some(host) = figures.host {
            let backable = figures.used_bytes.saturating_add(host.available_bytes);
            if capacity_bytes > backable {
                return refuse(format!(
                    "capacity {} cannot be backed: {} are used and the host has {} free",
                    size_text(capacity_bytes),
                    size_text(figures.used_bytes),
                    size_text(host.available_bytes)
                ));
            }
        }
        settle_io(&self.inner, &mut state)?;
        ensure_changes_allowed(&state)?;
        state.raise_capacity(blocks)?;
        Ok(blocks * block_bytes)
    }

    /// Tests: the host's space as given instead of statvfs (None: unknown).
    #[doc(hidden)]
    pub fn set_host_space_for_tests(&self, host: Option<HostSpace>) {
        lock_space(&self.inner).host_for_tests = Some(host);
    }
}
