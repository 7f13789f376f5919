//! The retention scheduler of `grove serve` and `grove mount`: every tick
//! it takes the snapshots the policies have due (each through the pool, so
//! it holds every write acknowledged before it, as a snapshot through the
//! control socket does), releases holds whose lease ended, and prunes what
//! the policies no longer keep. Policies are read from grove.toml at each
//! tick, so `grove policy set` takes effect without a restart.
//!
//! Its clock is the system's, unless `GROVE_CLOCK_FILE` names a file that
//! holds the time as Unix seconds (read at every tick): tests drive a year
//! of schedule through a daemon that way. `GROVE_SCHEDULER_TICK_MS`
//! shortens the tick for them too.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use grove_store::Pool;

use crate::worker::{is_stopping, sleep_unless_stopping, Worker};

/// How often the scheduler looks: the frequent level's shortest period is
/// a minute, and a snapshot due is taken within one tick of it.
const TICK_DEFAULT_MS: u64 = 20_000;
const CLOCK_FILE_VAR: &str = "GROVE_CLOCK_FILE";
const TICK_VAR: &str = "GROVE_SCHEDULER_TICK_MS";

/// Where the scheduler's time comes from.
enum Clock {
    System,
    /// A file holding Unix seconds (tests).
    File(PathBuf),
}

impl Clock {
    fn from_env() -> Clock {
        match std::env::var_os(CLOCK_FILE_VAR) {
            Some(path) => Clock::File(path.into()),
            None => Clock::System,
        }
    }

    fn now(&self) -> anyhow::Result<u64> {
        match self {
            Clock::System => crate::retention_settings::now(None),
            Clock::File(path) => {
                let text = std::fs::read_to_string(path)?;
                text.trim().parse().map_err(|_| {
                    anyhow::anyhow!("{CLOCK_FILE_VAR} {}: not Unix seconds", path.display())
                })
            }
        }
    }
}

pub struct Scheduler(Worker);

impl Scheduler {
    pub fn start(pool: Pool) -> std::io::Result<Scheduler> {
        let tick_ms = std::env::var(TICK_VAR)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(TICK_DEFAULT_MS);
        Worker::start("grove-scheduler", move |stopping| {
            run(&pool, stopping, Clock::from_env(), tick_ms)
        })
        .map(Scheduler)
    }

    /// Stops after the tick in progress.
    pub fn stop(self) {
        self.0.stop();
    }
}

fn run(pool: &Pool, stopping: &AtomicBool, clock: Clock, tick_ms: u64) {
    // The last time acted at: a clock that has not moved is not acted on
    // twice (a test's clock file, or a tick shorter than a second).
    let mut last = None;
    while !is_stopping(stopping) {
        match clock.now() {
            Ok(now) if last != Some(now) => {
                last = Some(now);
                run_once(pool, now);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("scheduler: cannot read the clock: {e:#}"),
        }
        sleep_unless_stopping(tick_ms, stopping);
    }
}

fn run_once(pool: &Pool, now: u64) {
    let archive_round = |config: &grove_retention::RetentionConfig,
                         report: &mut crate::retention::TickReport| {
        let round = crate::archiving::scheduled_round(pool, config, now);
        report.archived.extend(round.archived);
        report.archive_expired.extend(round.expired);
        report.failed.extend(round.failed);
    };
    match crate::retention::tick(pool, now, archive_round) {
        Ok(report) => {
            for (name, level) in &report.taken {
                tracing::info!("scheduler: took snapshot {name} ({level})");
            }
            for hold in &report.released {
                tracing::info!("scheduler: released hold {hold} (its lease ended)");
            }
            for name in &report.archived {
                tracing::info!("scheduler: archived snapshot {name}");
            }
            for name in &report.archive_expired {
                tracing::info!("scheduler: expired archived snapshot {name}");
            }
            for name in &report.pruned {
                tracing::info!("scheduler: pruned snapshot {name}");
            }
            for name in &report.kept_for_archive {
                tracing::info!(
                    "scheduler: kept snapshot {name}: the archive's policy wants it, and it is not pushed yet"
                );
            }
            for failure in &report.failed {
                tracing::warn!("scheduler: {failure}");
            }
        }
        Err(e) => tracing::warn!("scheduler: {e:#}"),
    }
}
