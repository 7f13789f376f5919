//! Where a pool stands against its space levels (ESnap's thresholds), as
//! pure functions of a few figures, so that the daemon can evaluate them
//! often and tests can drive every case.
//!
//! The ceiling is the most the pool may grow to: its capacity, raised by
//! auto-extension up to `max_capacity`, or up to what the host file
//! system can still back less the reserve. The warning and pruning levels
//! are shares of the ceiling; the hard limit is the ceiling itself, less
//! `FULL_ROOM_MIN_BLOCKS`, where writes get ENOSPC and snapshots are
//! refused.

use serde::{Deserialize, Serialize};

use crate::space_settings::{percent_of, Amount, SpaceSettings, EXTEND_STEP_MIN_BYTES};

/// With less room than this left under the ceiling the pool is full: a
/// snapshot taken then could not keep a single overwrite of its source.
pub const FULL_ROOM_MIN_BLOCKS: u64 = 32;

/// The host file system under the store, as statvfs says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSpace {
    pub available_bytes: u64,
    pub total_bytes: u64,
}

/// What the levels are computed from.
#[derive(Clone, Copy, Debug)]
pub struct SpaceFigures {
    pub block_bytes: u64,
    pub used_bytes: u64,
    /// None: a pool without a capacity, which grows while the host has room.
    pub capacity_bytes: Option<u64>,
    /// None: unknown (a store in memory).
    pub host: Option<HostSpace>,
}

/// The levels in order: each one is past the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpaceLevel {
    Normal,
    Warn,
    Prune,
    Full,
}

impl SpaceLevel {
    pub fn name(self) -> &'static str {
        match self {
            SpaceLevel::Normal => "normal",
            SpaceLevel::Warn => "warn",
            SpaceLevel::Prune => "prune",
            SpaceLevel::Full => "full",
        }
    }
}

/// Where the pool stands, in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceStatus {
    pub level: SpaceLevel,
    pub used_bytes: u64,
    pub capacity_bytes: Option<u64>,
    /// The most the pool may grow to; None when nothing bounds it that
    /// grove can see (no capacity, and the host unknown).
    pub ceiling_bytes: Option<u64>,
    pub warn_bytes: Option<u64>,
    pub prune_bytes: Option<u64>,
    pub auto_extend: bool,
    pub max_capacity_bytes: Option<u64>,
    /// Use at which the capacity is extended by a step.
    pub extend_at_bytes: Option<u64>,
    /// The capacity the next step would reach, if it can grow.
    pub next_capacity_bytes: Option<u64>,
    pub host_available_bytes: Option<u64>,
    pub host_reserve_bytes: u64,
}

impl SpaceStatus {
    /// Bytes over the pruning level (0 when under it).
    pub fn over_prune_bytes(&self) -> u64 {
        self.prune_bytes
            .map_or(0, |prune| self.used_bytes.saturating_sub(prune))
    }
}

/// The host free space the capacity never grows into.
pub fn host_reserve_bytes(settings: &SpaceSettings, host: Option<HostSpace>) -> u64 {
    match (settings.host_reserve, host) {
        (Amount::Bytes(bytes), _) => bytes,
        (Amount::Percent(p), Some(host)) => percent_of(host.total_bytes, p),
        (Amount::Percent(_), None) => 0,
    }
}

/// The most the pool may grow to (see the module's comment).
pub fn ceiling_bytes(figures: &SpaceFigures, settings: &SpaceSettings) -> Option<u64> {
    let host_bound = figures.host.map(|host| {
        figures.used_bytes
            + host
                .available_bytes
                .saturating_sub(host_reserve_bytes(settings, figures.host))
    });
    let Some(capacity) = figures.capacity_bytes else {
        // No capacity: the store grows until the host is full.
        return figures
            .host
            .map(|host| figures.used_bytes + host.available_bytes);
    };
    if !settings.auto_extend {
        return Some(capacity);
    }
    let bound = match (settings.max_capacity_bytes, host_bound) {
        (Some(max), Some(host)) => max.min(host),
        (Some(max), None) => max,
        (None, Some(host)) => host,
        (None, None) => capacity,
    };
    Some(capacity.max(round_down(bound, figures.block_bytes)))
}

/// The capacity one extension step reaches, if the pool may grow at all.
pub fn next_capacity_bytes(figures: &SpaceFigures, settings: &SpaceSettings) -> Option<u64> {
    let capacity = figures.capacity_bytes?;
    if !settings.auto_extend {
        return None;
    }
    let step = match settings.extend_step {
        Amount::Percent(p) => percent_of(capacity, p).max(EXTEND_STEP_MIN_BYTES),
        Amount::Bytes(bytes) => bytes,
    };
    let ceiling = ceiling_bytes(figures, settings)?;
    let target = round_down(
        capacity.saturating_add(step).min(ceiling),
        figures.block_bytes,
    );
    (target > capacity).then_some(target)
}

/// Whether use has passed the point where the capacity is extended.
pub fn wants_extension(figures: &SpaceFigures, settings: &SpaceSettings) -> bool {
    figures.capacity_bytes.is_some_and(|capacity| {
        figures.used_bytes >= percent_of(capacity, settings.extend_at_percent)
    })
}

/// Where the pool stands against every level.
pub fn evaluate(figures: &SpaceFigures, settings: &SpaceSettings) -> SpaceStatus {
    let ceiling = ceiling_bytes(figures, settings);
    let warn = ceiling.map(|c| percent_of(c, settings.warn_percent));
    let prune = ceiling.map(|c| percent_of(c, settings.prune_percent));
    let full_room_bytes = FULL_ROOM_MIN_BLOCKS * figures.block_bytes;
    let used = figures.used_bytes;
    let level = match ceiling {
        Some(c) if used.saturating_add(full_room_bytes) > c => SpaceLevel::Full,
        _ if prune.is_some_and(|p| used >= p) => SpaceLevel::Prune,
        _ if warn.is_some_and(|w| used >= w) => SpaceLevel::Warn,
        _ => SpaceLevel::Normal,
    };
    SpaceStatus {
        level,
        used_bytes: used,
        capacity_bytes: figures.capacity_bytes,
        ceiling_bytes: ceiling,
        warn_bytes: warn,
        prune_bytes: prune,
        auto_extend: settings.auto_extend,
        max_capacity_bytes: settings.max_capacity_bytes,
        extend_at_bytes: figures
            .capacity_bytes
            .filter(|_| settings.auto_extend)
            .map(|c| percent_of(c, settings.extend_at_percent)),
        next_capacity_bytes: next_capacity_bytes(figures, settings),
        host_available_bytes: figures.host.map(|h| h.available_bytes),
        host_reserve_bytes: host_reserve_bytes(settings, figures.host),
    }
}

fn round_down(bytes: u64, block_bytes: u64) -> u64 {
    bytes - bytes % block_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn figures(used: u64, capacity: Option<u64>, host_available: Option<u64>) -> SpaceFigures {
        SpaceFigures {
            block_bytes: 4096,
            used_bytes: used,
            capacity_bytes: capacity,
            host: host_available.map(|available_bytes| HostSpace {
                available_bytes,
                total_bytes: 1000 * MIB,
            }),
        }
    }

    fn settings(max: Option<u64>, reserve: u64, step: u64) -> SpaceSettings {
        SpaceSettings {
            max_capacity_bytes: max,
            host_reserve: Amount::Bytes(reserve),
            extend_step: Amount::Bytes(step),
            ..SpaceSettings::default()
        }
    }

    #[test]
    fn steps_stop_at_the_maximum() {
        let s = settings(Some(100 * MIB), 0, 30 * MIB);
        let f = |capacity| figures(0, Some(capacity), Some(10_000 * MIB));
        assert_eq!(next_capacity_bytes(&f(40 * MIB), &s), Some(70 * MIB));
        assert_eq!(next_capacity_bytes(&f(80 * MIB), &s), Some(100 * MIB));
        assert_eq!(next_capacity_bytes(&f(100 * MIB), &s), None);
        assert_eq!(ceiling_bytes(&f(40 * MIB), &s), Some(100 * MIB));
        // A maximum set below the capacity leaves the capacity as it is.
        assert_eq!(ceiling_bytes(&f(120 * MIB), &s), Some(120 * MIB));
    }

    #[test]
    fn the_host_less_its_reserve_bounds_growth() {
        let s = settings(None, 20 * MIB, 50 * MIB);
        // 10 MiB used, 45 MiB free on the host: the pool may reach 35 MiB.
        let f = figures(10 * MIB, Some(16 * MIB), Some(45 * MIB));
        assert_eq!(ceiling_bytes(&f, &s), Some(35 * MIB));
        assert_eq!(next_capacity_bytes(&f, &s), Some(35 * MIB));
        // A host with less than the reserve free gives no more room.
        let f = figures(10 * MIB, Some(16 * MIB), Some(5 * MIB));
        assert_eq!(next_capacity_bytes(&f, &s), None);
        assert_eq!(ceiling_bytes(&f, &s), Some(16 * MIB));
        // A reserve as a share of the host's size.
        let s = SpaceSettings {
            host_reserve: Amount::Percent(10),
            ..s
        };
        assert_eq!(host_reserve_bytes(&s, f.host), 100 * MIB);
    }

    #[test]
    fn percentage_steps_have_a_floor_and_off_means_off() {
        let s = SpaceSettings::default();
        let f = figures(0, Some(100 * MIB), Some(100_000 * MIB));
        assert_eq!(
            next_capacity_bytes(&f, &s),
            Some(100 * MIB + EXTEND_STEP_MIN_BYTES)
        );
        let off = SpaceSettings {
            auto_extend: false,
            ..s.clone()
        };
        assert_eq!(next_capacity_bytes(&f, &off), None);
        assert_eq!(ceiling_bytes(&f, &off), Some(100 * MIB));
        assert!(!wants_extension(
            &figures(79 * MIB, Some(100 * MIB), None),
            &s
        ));
        assert!(wants_extension(
            &figures(80 * MIB, Some(100 * MIB), None),
            &s
        ));
    }

    #[test]
    fn levels_in_both_directions() {
        let s = SpaceSettings {
            auto_extend: false,
            ..SpaceSettings::default()
        };
        let level = |used| evaluate(&figures(used, Some(100 * MIB), None), &s).level;
        assert_eq!(level(79 * MIB), SpaceLevel::Normal);
        assert_eq!(level(80 * MIB), SpaceLevel::Warn);
        assert_eq!(level(90 * MIB), SpaceLevel::Prune);
        assert_eq!(level(100 * MIB - 4096 * 32), SpaceLevel::Prune);
        assert_eq!(level(100 * MIB - 4096 * 31), SpaceLevel::Full);
        assert_eq!(level(60 * MIB), SpaceLevel::Normal);
        let status = evaluate(&figures(95 * MIB, Some(100 * MIB), None), &s);
        assert_eq!(status.over_prune_bytes(), 5 * MIB);
        // Nothing known bounds a pool without a capacity in memory.
        let unbounded = evaluate(&figures(95 * MIB, None, None), &s);
        assert_eq!(
            (unbounded.level, unbounded.ceiling_bytes),
            (SpaceLevel::Normal, None)
        );
    }
}
