//! The room a RADOS pool has to grow into, for grove's space levels and
//! auto-extension: what `ceph df` says of the pool (its `max_avail`, after
//! replication), not the local file system under the pool's directory.
//! The engine asks under its state lock, so the answer is kept for a while
//! and a monitor round trip happens at most once per interval.

use crate::cluster::{self, describe};
use crate::target::RadosTarget;
use grove_store::HostSpace;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a `ceph df` answer is used before asking again.
const REFRESH: Duration = Duration::from_secs(5);

/// The last answer and when it came.
#[derive(Default)]
pub(crate) struct SpaceCache {
    last: Mutex<Option<(Instant, HostSpace)>>,
}

impl SpaceCache {
    /// The room of `target`'s pool, from the cache or the monitor; None if
    /// the monitor cannot say (the engine then asks the local file system).
    pub(crate) fn pool_space(&self, target: &RadosTarget) -> Option<HostSpace> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, space)) = *last {
            if at.elapsed() < REFRESH {
                return Some(space);
            }
        }
        match ask_monitor(target) {
            Ok(space) => {
                *last = Some((Instant::now(), space));
                Some(space)
            }
            Err(e) => {
                tracing::warn!("{e}");
                last.map(|(_, space)| space)
            }
        }
    }
}

/// `ceph df` for the target's pool: available is its max_avail, total what
/// it stores plus that.
fn ask_monitor(target: &RadosTarget) -> Result<HostSpace, String> {
    let rados = cluster::connection(target).map_err(|e| e.to_string())?;
    let command = serde_json::json!({"prefix": "df", "format": "json"});
    let (out, _) = rados.ceph_mon_command_without_data(&command).map_err(|e| {
        format!(
            "cannot ask the monitor for the room of RADOS pool {}: {}",
            target.pool,
            describe(&e)
        )
    })?;
    let df: serde_json::Value = serde_json::from_slice(&out)
        .map_err(|e| format!("the monitor's df answer is not JSON: {e}"))?;
    let stats = df["pools"]
        .as_array()
        .and_then(|pools| pools.iter().find(|p| p["name"] == target.pool.as_str()))
        .map(|p| &p["stats"])
        .ok_or_else(|| format!("the monitor's df answer has no pool {}", target.pool))?;
    let figure = |key: &str| {
        stats[key].as_u64().ok_or_else(|| {
            format!(
                "the monitor's df answer has no {key} for pool {}",
                target.pool
            )
        })
    };
    let available_bytes = figure("max_avail")?;
    Ok(HostSpace {
        available_bytes,
        total_bytes: figure("stored")?.saturating_add(available_bytes),
    })
}
