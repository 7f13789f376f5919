//! The space watcher of `grove serve` and `grove mount`: evaluates the
//! pool's space levels every `WATCH_INTERVAL_MS` (a few counters and one
//! statvfs under the state lock), extends the capacity past `extend_at`,
//! logs every level change and hands it to the hook, and past the pruning
//! level asks `retention::free_space` for the bytes over it.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use grove_store::{Pool, SpaceLevel, SpaceStatus};

use crate::output::format_size;
use crate::space_hook::{HookRun, HookRunner};
use crate::worker::{is_stopping, sleep_unless_stopping, Worker};

/// How often the levels are evaluated: soon after any commit that moves
/// them, and cheap enough to do this often.
const WATCH_INTERVAL_MS: u64 = 250;
/// Least time between two calls to free space while past the pruning
/// level: each may remove snapshots whose space the reclaimer gives back
/// over a while.
const PRUNE_INTERVAL_MS: u64 = 10_000;
/// Pause after a failed evaluation, so a lasting error is logged now and
/// then rather than four times a second.
const ERROR_PAUSE_MS: u64 = 30_000;

pub struct SpaceWatcher(Worker);

impl SpaceWatcher {
    pub fn start(pool: Pool) -> std::io::Result<SpaceWatcher> {
        let hooks = HookRunner::start()?;
        Worker::start("grove-space", move |stopping| run(&pool, &hooks, stopping)).map(SpaceWatcher)
    }

    /// Stops the watcher; a hook in progress finishes on its own thread.
    pub fn stop(self) {
        self.0.stop();
    }
}

fn run(pool: &Pool, hooks: &HookRunner, stopping: &AtomicBool) {
    // Starting past a level reports it as a change from normal.
    let mut level = SpaceLevel::Normal;
    let mut last_prune: Option<Instant> = None;
    while !is_stopping(stopping) {
        let pause_ms = match pool.watch_space() {
            Ok(status) => {
                if status.level != level {
                    report_change(pool, hooks, level, &status);
                    level = status.level;
                }
                if level >= SpaceLevel::Prune
                    && last_prune
                        .is_none_or(|at| at.elapsed().as_millis() as u64 >= PRUNE_INTERVAL_MS)
                {
                    last_prune = Some(Instant::now());
                    prune(pool, &status);
                }
                WATCH_INTERVAL_MS
            }
            Err(e) => {
                tracing::error!("space watcher: {e}");
                ERROR_PAUSE_MS
            }
        };
        sleep_unless_stopping(pause_ms, stopping);
    }
}

fn prune(pool: &Pool, status: &SpaceStatus) {
    let over = status.over_prune_bytes();
    if over == 0 {
        return;
    }
    let pruned =
        crate::retention::now(None).and_then(|now| crate::retention::free_space(pool, now, over));
    match pruned {
        Ok(freed) if freed > 0 => tracing::info!(
            "pool {}: pruning gives back {}",
            pool.dir().display(),
            format_size(freed)
        ),
        Ok(_) => tracing::warn!(
            "pool {}: past the pruning level by {}, and no snapshot is left that the policies let go (held, unranked, or a volume's newest)",
            pool.dir().display(),
            format_size(over)
        ),
        Err(e) => tracing::error!("pool {}: pruning failed: {e:#}", pool.dir().display()),
    }
}

/// Logs a level change (a warning going up, a note coming down) and
/// queues the hook, if there is one.
fn report_change(pool: &Pool, hooks: &HookRunner, previous: SpaceLevel, status: &SpaceStatus) {
    let line = format!(
        "pool {}: space level {} (was {}): {} used of a ceiling of {}",
        pool.dir().display(),
        status.level.name(),
        previous.name(),
        format_size(status.used_bytes),
        status.ceiling_bytes.map_or("none".into(), format_size),
    );
    match status.level {
        SpaceLevel::Full => tracing::error!("{line}; writes get ENOSPC and snapshots are refused"),
        level if level > previous => tracing::warn!("{line}"),
        _ => tracing::info!("{line}"),
    }
    let settings = pool.space_settings();
    if let Some(command) = &settings.hook {
        hooks.submit(HookRun::for_change(
            command,
            settings.hook_timeout_secs,
            pool.dir(),
            previous,
            status,
        ));
    }
}
