//! The threads `grove serve` and `grove mount` both run beside their
//! clients: the reclaimer, the retention scheduler and the space watcher,
//! started together and stopped together in one order, with the control
//! socket and the branch watcher after them.

use std::time::Instant;

use anyhow::{Context, Result};
use grove_store::Pool;

use crate::branch_pool::BranchWatcher;
use crate::control::ControlServer;
use crate::reclaimer::Reclaimer;
use crate::scheduler::Scheduler;
use crate::space_watch::SpaceWatcher;

pub struct BackgroundWork {
    reclaimer: Reclaimer,
    scheduler: Scheduler,
    space: SpaceWatcher,
}

impl BackgroundWork {
    pub fn start(pool: &Pool) -> Result<BackgroundWork> {
        let reclaimer = Reclaimer::start(pool.clone()).context("cannot start the reclaimer")?;
        let scheduler = Scheduler::start(pool.clone()).context("cannot start the scheduler")?;
        let space = SpaceWatcher::start(pool.clone()).context("cannot start the space watcher")?;
        Ok(BackgroundWork {
            reclaimer,
            scheduler,
            space,
        })
    }

    /// The daemon's last steps before the pool closes: this work, then the
    /// control socket (its requests in flight have until `deadline`), then
    /// the branch watcher.
    pub fn stop_with(
        self,
        control: ControlServer,
        deadline: Instant,
        watcher: Option<BranchWatcher>,
    ) {
        self.stop();
        control.stop(deadline);
        if let Some(watcher) = watcher {
            watcher.stop();
        }
    }

    /// The scheduler and the space watcher first: both may hand the
    /// reclaimer work, which it then still takes before it stops.
    fn stop(self) {
        self.scheduler.stop();
        self.space.stop();
        self.reclaimer.stop();
    }
}
