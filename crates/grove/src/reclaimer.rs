//! The background reclaimer of `grove serve`: gives back the space of
//! removed volumes and rollbacks, one bounded batch at a time, yielding to
//! foreground I/O between batches (each batch holds the pool lock briefly
//! and commits on its own, so a crash resumes where it left off).

use std::sync::atomic::AtomicBool;

use grove_store::Pool;

use crate::worker::{is_stopping, sleep_unless_stopping, Worker};

/// Pause between batches while work remains: leaves the lock to I/O.
const BATCH_PAUSE_MS: u64 = 2;
/// Pause when nothing is left to reclaim, before looking again.
const IDLE_POLL_MS: u64 = 200;
/// Pause after a failed batch (a damaged removed tree, a failed commit),
/// so a persistent error is logged now and then, not in a loop.
const ERROR_PAUSE_MS: u64 = 30_000;

pub struct Reclaimer(Worker);

impl Reclaimer {
    pub fn start(pool: Pool) -> std::io::Result<Reclaimer> {
        Worker::start("grove-reclaimer", move |stopping| run(&pool, stopping)).map(Reclaimer)
    }

    /// Stops after the batch in progress; what is left resumes next time.
    pub fn stop(self) {
        self.0.stop();
    }
}

fn run(pool: &Pool, stopping: &AtomicBool) {
    while !is_stopping(stopping) {
        let pause_ms = match pool.reclaim_batch() {
            Ok((_, false)) => BATCH_PAUSE_MS + crate::control_limits::reclaim_delay_for_tests_ms(),
            Ok((freed, true)) => {
                if freed > 0 {
                    tracing::info!("reclaimer: removed volumes' space is all given back");
                }
                IDLE_POLL_MS
            }
            Err(e) => {
                tracing::error!("reclaimer: {e}");
                ERROR_PAUSE_MS
            }
        };
        sleep_unless_stopping(pause_ms, stopping);
    }
}
