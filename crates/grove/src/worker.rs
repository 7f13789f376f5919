//! The background threads of `grove serve` and `grove mount` (the
//! reclaimer, the space watcher, the retention scheduler): each runs a loop
//! until asked to stop, pausing between rounds. One way to start, stop
//! and pause them, so that none holds up a shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Pauses are cut into steps this long, so that stopping is prompt.
const STOP_POLL_MS: u64 = 50;

pub struct Worker {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts thread `name` running `body`, which must return soon after
    /// the flag it is given is set.
    pub fn start(
        name: &str,
        body: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> std::io::Result<Worker> {
        let stopping = Arc::new(AtomicBool::new(false));
        let flag = stopping.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&flag))?;
        Ok(Worker {
            stopping,
            thread: Some(thread),
        })
    }

    /// Asks the thread to stop and waits for it to finish its round.
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// True once the worker has been asked to stop.
pub fn is_stopping(stopping: &AtomicBool) -> bool {
    stopping.load(Ordering::Acquire)
}

/// Sleeps `ms` in short steps, returning early once stopping.
pub fn sleep_unless_stopping(ms: u64, stopping: &AtomicBool) {
    let mut left = ms;
    while left > 0 && !is_stopping(stopping) {
        let step = left.min(STOP_POLL_MS);
        std::thread::sleep(Duration::from_millis(step));
        left -= step;
    }
}
