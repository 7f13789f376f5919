//! The background reclaimer of `grove serve`: gives back the space of
//! removed volumes and rollbacks, one bounded batch at a time, yielding to
//! foreground I/O between batches (each batch holds the pool lock briefly
//! and commits on its own, so a crash resumes where it left off).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use grove_store::Pool;

/// Pause between batches while work remains: leaves the lock to I/O.
const BATCH_PAUSE_MS: u64 = 2;
/// Pause when nothing is left to reclaim, before looking again.
const IDLE_POLL_MS: u64 = 200;
/// Pause after a failed batch (a damaged removed tree, a failed commit),
/// so a persistent error is logged now and then, not in a loop.
const ERROR_PAUSE_MS: u64 = 30_000;

pub struct Reclaimer {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reclaimer {
    pub fn start(pool: Pool) -> std::io::Result<Reclaimer> {
        let stopping = Arc::new(AtomicBool::new(false));
        let flag = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("grove-reclaimer".into())
            .spawn(move || run(&pool, &flag))?;
        Ok(Reclaimer {
            stopping,
            thread: Some(thread),
        })
    }

    /// Stops after the batch in progress; what is left resumes next time.
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(pool: &Pool, stopping: &AtomicBool) {
    while !stopping.load(Ordering::Acquire) {
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

/// Sleeps in short steps so that stopping is never held up for long.
fn sleep_unless_stopping(ms: u64, stopping: &AtomicBool) {
    const STEP_MS: u64 = 50;
    let mut left = ms;
    while left > 0 && !stopping.load(Ordering::Acquire) {
        let step = left.min(STEP_MS);
        std::thread::sleep(Duration::from_millis(step));
        left -= step;
    }
}
